"""The built-in ``stacks`` exporter: collapsed stacks for flame graphs, as torch writes them.

One line per event that has a Python stack and a metric value of at least
1 µs: the frames outermost first, joined by ``;``, with each space,
semicolon, tab and newline inside a frame replaced by ``_``, then a space and
the value truncated to an int (torch's ``EventList.export_stacks``).
Feed the file to ``flamegraph.pl`` or speedscope.

Metrics: ``self_cpu_time_total``, ``self_cuda_time_total``,
``self_xpu_time_total``, ``self_privateuse1_time_total`` (the last three all
read the device time of the trace's ``use_device``). Stacks need
``with_stack=True`` and, as in torch, ``_ExperimentalConfig(verbose=True)``;
without them the file is empty.

The file is written atomically; a path ending in ``.gz`` is gzip-compressed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from polyprof._log import get_logger
from polyprof.components import Capabilities, Exporter
from polyprof.fileio import atomic_writer
from polyprof.hookspecs import hookimpl
from polyprof.tree import EventTree, tree_for, use_device_for

if TYPE_CHECKING:
    from polyprof.config import ProfileConfig
    from polyprof.trace import Trace

log = get_logger(__name__)

__all__ = [
    "NAME",
    "SUPPORTED_METRICS",
    "StacksExporter",
    "collapsed_stack_lines",
    "collapsed_stack_lines_of_objects",
    "metric_attribute",
    "write_lines",
]

NAME = "stacks"
SUPPORTED_METRICS: tuple[str, ...] = (
    "self_cpu_time_total",
    "self_cuda_time_total",
    "self_xpu_time_total",
    "self_privateuse1_time_total",
)
_FRAME_TRANSLATION = str.maketrans(" ;\t\n", "____")
_DERIVE: Any = object()


def metric_attribute(metric: str) -> str:
    """The event attribute a metric reads (torch renames cuda/xpu/privateuse1 to device).

    :raises ValueError: ``metric`` is not one of ``SUPPORTED_METRICS``.
    """
    if metric not in SUPPORTED_METRICS:
        raise ValueError(f"metric should be one of: {list(SUPPORTED_METRICS)}, not {metric!r}")
    return metric.replace("cuda", "device").replace("xpu", "device").replace("privateuse1", "device")


def _collapsed(frames: Sequence[str]) -> str:
    return ";".join(frame.translate(_FRAME_TRANSLATION) for frame in reversed(frames))


def collapsed_stack_lines(tree: EventTree, metric: str, *, rows: np.ndarray | None = None) -> list[str]:
    """The export's lines (each ending in ``\\n``) for ``tree``'s rows (all, or ``rows`` in order)."""
    values = getattr(tree, metric_attribute(metric))
    stack = tree.stack if rows is None else tree.stack[rows]
    values = values if rows is None else values[rows]
    # torch: ``int(value) > 0``; int() truncates toward zero.
    ints = np.trunc(values).astype(np.int64)
    chosen = np.flatnonzero((stack >= 0) & (ints > 0))
    if not len(chosen):
        return []
    used = np.unique(stack[chosen])
    text = dict(zip(used.tolist(), (_collapsed(tree.stacks[i]) for i in used.tolist()), strict=True))
    return [f"{text[s]} {v}\n" for s, v in zip(stack[chosen].tolist(), ints[chosen].tolist(), strict=True)]


def collapsed_stack_lines_of_objects(events: Iterable[Any], metric: str) -> list[str]:
    """The export's lines for any objects with ``stack`` and the metric's attribute."""
    attribute = metric_attribute(metric)
    lines = []
    for evt in events:
        if evt.stack:
            value = int(getattr(evt, attribute))
            if value > 0:
                lines.append(f"{_collapsed(evt.stack)} {value}\n")
    return lines


def write_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> str:
    """Write ``lines`` to ``path`` atomically; returns the path."""
    with atomic_writer(path) as f:
        f.write("".join(lines))
    return os.fspath(path)


class StacksExporter(Exporter):
    """Writes torch's collapsed-stack text (``export_stacks``)."""

    name = NAME
    suffixes = (".stacks", ".txt")

    def export(
        self,
        trace: Trace,
        path: str,
        *,
        metric: str = "self_cpu_time_total",
        use_device: str | None = _DERIVE,
        **options: Any,
    ) -> str:
        """Write the trace's collapsed stacks to ``path``; returns the path.

        :param metric: one of ``SUPPORTED_METRICS``.
        :param use_device: torch's ``use_device`` for device metrics; by
            default derived from the trace's activities.
        :raises ValueError: unknown metric. :raises TypeError: unknown option.
        """
        if options:
            raise TypeError(
                f"unknown stacks export options {sorted(options)}; valid options: ['metric', 'use_device']"
            )
        metric_attribute(metric)  # fail before any work
        if use_device is _DERIVE:
            use_device = use_device_for(trace.config)
        lines = collapsed_stack_lines(tree_for(trace, use_device), metric)
        written = write_lines(path, lines)
        log.debug("stacks_exported", path=written, lines=len(lines), metric=metric)
        return written


@hookimpl(trylast=True)
def polyprof_make_exporter(config: ProfileConfig, name: str) -> Exporter | None:
    return StacksExporter() if name == NAME else None


@hookimpl(trylast=True)
def polyprof_capabilities() -> Capabilities:
    return Capabilities(exporters=(NAME,))
