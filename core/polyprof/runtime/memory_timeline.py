"""``profile.export_memory_timeline``: torch's memory timeline, built from the same recording.

torch builds it from its raw collector result: ``MemoryProfile(kineto_results)``
walks ``experimental_event_tree()`` (allocations, tensor versions, Python
frames of modules and optimizers) and sorts each tensor into a category
(parameter, gradient, activation, optimizer state, ...). polyprof hands
torch's own ``MemoryProfile`` the raw result of the same recording, so the
categories and sizes are torch's. The result is kept only when torch could
build the profile (``record_shapes``, ``profile_memory`` and ``with_stack``
all on): it holds the recording's event tree, about as much memory as the
recording itself, so it is dropped when the next cycle is prepared, as torch's
``prepare_trace`` drops its profiler (kept with ``acc_events``, as torch's).

The outputs, by ``path``'s suffix, as torch writes them: ``.html`` (a plot,
needs matplotlib; without it torch prints a line and writes nothing),
``raw.json.gz`` (raw events), other ``.gz`` (the timeline, gzipped), anything
else the timeline as JSON (``[times_us, sizes by category]``). Files are
written atomically.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from polyprof.base.errors import PolyprofError
from polyprof.base.fileio import atomic_writer
from polyprof.base.log import get_logger

log = get_logger(__name__)

#: The flags torch's memory profile needs, in the order its error lists them.
MEMORY_PROFILE_FLAGS = ("record_shapes", "profile_memory", "with_stack")


class NoMemoryProfileError(PolyprofError, AssertionError):
    """The memory timeline was asked for before any recording ended (torch asserts there)."""


class MemoryTimelineNeedsTorchError(PolyprofError, ImportError):
    """The memory timeline was asked for, but torch (which builds it) cannot be imported."""


def require_torch() -> None:
    """Raise ``MemoryTimelineNeedsTorchError`` when torch cannot be imported."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise MemoryTimelineNeedsTorchError(
            f"export_memory_timeline needs torch, which builds the timeline, and torch cannot be imported "
            f"here ({exc}); install torch (pip install torch)"
        ) from exc


def keeps_memory_profile(config: Any) -> bool:
    """Whether a recording with ``config`` keeps torch's raw result for the memory timeline."""
    return all(getattr(config, flag) for flag in MEMORY_PROFILE_FLAGS)


def torch_deprecation_message() -> str | None:
    """The installed torch's deprecation of ``export_memory_timeline`` (2.13+), or None.

    torch marks it with ``typing_extensions.deprecated``, which keeps the text in
    ``__deprecated__`` and warns with it as a ``FutureWarning``.
    """
    from torch.profiler.profiler import _KinetoProfile

    return getattr(_KinetoProfile.export_memory_timeline, "__deprecated__", None)


def warn_if_torch_deprecates(stacklevel: int) -> None:
    """The ``FutureWarning`` the installed torch gives at the call, if it gives one."""
    message = torch_deprecation_message()
    if message is not None:
        warnings.warn(message, FutureWarning, stacklevel=stacklevel + 1)


def default_device(use_device: str | None) -> str:
    """torch's default: device 0 of the profile's accelerator, CUDA's if available, else the CPU."""
    import torch

    if use_device and use_device != "cuda":
        return f"{use_device}:0"
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def check_flags(profile: Any) -> None:
    """torch's ``ValueError`` when a flag the memory profile needs is off, in its words."""
    missing = [f"{flag}=True" for flag in MEMORY_PROFILE_FLAGS if not getattr(profile, flag)]
    if missing:
        raise ValueError(f"{', '.join(missing)} required for memory profiling.")


def build_timeline(raw_results: Sequence[Any] | None) -> Any:
    """torch's ``MemoryProfileTimeline`` of the last recording's raw result."""
    from torch.profiler._memory_profiler import MemoryProfile, MemoryProfileTimeline

    if not raw_results:
        raise NoMemoryProfileError(
            "no recording to build the memory timeline from: call export_memory_timeline after the "
            "profile stopped (after the with-block, stop(), or in on_trace_ready)"
        )
    if len(raw_results) > 1:
        raise RuntimeError(
            "the memory timeline needs one uninterrupted recording; a torch profiler ran inside this one "
            "and split it in pieces"
        )
    return MemoryProfileTimeline(MemoryProfile(raw_results[0]))


def _torch_writer(timeline: Any, path: str) -> tuple[Callable[[str, str], None], str]:
    """torch's writer for ``path``'s suffix, and the suffix of the file it writes."""
    if path.endswith(".html"):
        return timeline.export_memory_timeline_html, ".html"
    if path.endswith("raw.json.gz"):
        return timeline.export_memory_timeline_raw, ".json"
    return timeline.export_memory_timeline, ".json"


def export(timeline: Any, path: str, device: str) -> None:
    """Write ``timeline`` for ``device`` to ``path`` in the format its suffix names, as torch does."""
    write, suffix = _torch_writer(timeline, path)
    with tempfile.TemporaryDirectory(prefix="polyprof-memory-") as scratch:
        # torch's writers open their path themselves: they write here, then the file is moved into
        # place whole (gzipped for .gz, as torch's profile does)
        written = os.path.join(scratch, "timeline" + suffix)
        write(written, device)
        if not os.path.exists(written):  # .html without matplotlib: torch printed why and wrote nothing
            log.info("memory_timeline_not_written", path=path)
            return
        with open(written, encoding="utf-8") as source, atomic_writer(path) as target:
            for chunk in iter(lambda: source.read(1 << 20), ""):
                target.write(chunk)
    log.info("memory_timeline_written", path=path, device=device)
