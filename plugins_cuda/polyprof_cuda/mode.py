"""Which way polyprof-cuda records CUDA in this process, and why: one owner of CUPTI.

* **kineto**: torch is a CUDA build. Its Kineto takes CUPTI as soon as
  torch's collector is prepared, even for CPU only, so polyprof-cuda never
  calls CUPTI: it asks torch's collector for ``ProfilerActivity.CUDA`` and
  decodes the CUDA rows of torch's result (``polyprof_cuda.kineto``).
* **direct**: torch is absent or a CPU build (its Kineto never touches
  CUPTI), cupti-python is installed and CUPTI can run: polyprof's own CUPTI
  tracer (``polyprof_cuda.tracer``).

Deciding never initialises CUDA in the user's process: torch's build is read
from its package files (``torch/version.py``) when torch is not imported, and
the direct-mode CUPTI probe runs in a child process (``polyprof_cuda.probe``).
Whether a device is visible in kineto mode is asked when CUDA is recorded,
through ``torch.cuda.is_available()``, as torch.profiler asks it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
from pathlib import Path
from typing import Literal

import attrs

from polyprof_cuda import probe

KINETO: Literal["kineto"] = "kineto"
DIRECT: Literal["direct"] = "direct"

#: ``cuda: Optional[str] = '13.0'`` (or ``= None``) in torch/version.py.
_CUDA_LINE = re.compile(r"^cuda\b[^=\n]*=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", re.MULTILINE)
#: ``__version__ = '2.11.0+cu130'``.
_VERSION_LINE = re.compile(r"^__version__\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


@attrs.frozen
class TorchBuild:
    """What the installed torch is, as its package says."""

    version: str
    #: CUDA version of a CUDA build ("13.0"); None for a CPU (or other device) build.
    cuda: str | None


@attrs.frozen
class CudaMode:
    """The mode, or None with the reason CUDA cannot be recorded here."""

    kind: Literal["kineto", "direct"] | None
    #: For a mode, what ``polyprof plugins`` shows; else why CUDA is unavailable.
    detail: str


def installed_torch() -> TorchBuild | None:
    """The installed torch's version and CUDA version, without importing torch; None when absent."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return TorchBuild(str(torch.__version__), getattr(torch.version, "cuda", None))
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        if path.is_file():
            return parse_version_file(path.read_text(errors="replace"))
    return None


def parse_version_file(text: str) -> TorchBuild:
    version = _VERSION_LINE.search(text)
    cuda = _CUDA_LINE.search(text)
    return TorchBuild(
        version.group(1) if version else "unknown",
        (cuda.group(1) or cuda.group(2)) if cuda and (cuda.group(1) or cuda.group(2)) else None,
    )


_lock = threading.Lock()
_cached: dict[str, CudaMode] = {}


def current_mode() -> CudaMode:
    """The mode of this process (cached: torch's build and the driver do not change mid-run)."""
    with _lock:
        if "mode" not in _cached:
            _cached["mode"] = choose_mode(installed_torch(), probe.unavailable_reason)
        return _cached["mode"]


def forget_cached_mode() -> None:
    with _lock:
        _cached.clear()


def choose_mode(torch_build: TorchBuild | None, direct_probe: object) -> CudaMode:
    """The mode for ``torch_build``; ``direct_probe()`` (None or a reason) is called only when needed."""
    if torch_build is not None and torch_build.cuda:
        return CudaMode(KINETO, f"via torch's Kineto (torch {torch_build.version}, CUDA {torch_build.cuda})")
    reason = direct_probe()  # type: ignore[operator]
    if reason is not None:
        return CudaMode(None, reason)
    why = "torch is not installed" if torch_build is None else f"torch {torch_build.version} is not a CUDA build"
    return CudaMode(DIRECT, f"direct CUPTI ({why})")
