"""Collapsed stacks for flame graphs, as torch's ``EventList.export_stacks`` writes them.

One line per event that has a Python stack and a metric value of at least
1 µs: the frames outermost first, joined by ``;``, with each space,
semicolon, tab and newline inside a frame replaced by ``_``, then a space and
the value truncated to an int. Feed the file to ``flamegraph.pl`` or
speedscope.

Metrics: ``self_cpu_time_total``, ``self_cuda_time_total``,
``self_xpu_time_total``, ``self_privateuse1_time_total`` (the last three all
read the device time of the tree's ``use_device``). ``EventList.export_stacks``
and the built-in ``stacks`` exporter (``polyprof_builtins.stacks``, an adapter
over these functions) write the same lines.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from polyprof.analysis.tree import EventTree
from polyprof.base.fileio import atomic_writer

__all__ = [
    "SUPPORTED_METRICS",
    "collapsed_stack_lines",
    "collapsed_stack_lines_of_objects",
    "metric_attribute",
    "write_lines",
]

SUPPORTED_METRICS: tuple[str, ...] = (
    "self_cpu_time_total",
    "self_cuda_time_total",
    "self_xpu_time_total",
    "self_privateuse1_time_total",
)
_FRAME_TRANSLATION = str.maketrans(" ;\t\n", "____")


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
    """The lines (each ending in ``\\n``) for ``tree``'s rows (all, or ``rows`` in that order).

    :raises ValueError: ``metric`` is not one of ``SUPPORTED_METRICS``.
    """
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
    """The lines for any objects with ``stack`` and the metric's attribute (torch's loop).

    :raises ValueError: ``metric`` is not one of ``SUPPORTED_METRICS``.
    """
    attribute = metric_attribute(metric)
    lines = []
    for evt in events:
        if evt.stack:
            value = int(getattr(evt, attribute))
            if value > 0:
                lines.append(f"{_collapsed(evt.stack)} {value}\n")
    return lines


def write_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> str:
    """Write ``lines`` to ``path`` atomically (``.gz``: compressed); returns the path."""
    with atomic_writer(path) as f:
        f.write("".join(lines))
    return os.fspath(path)
