"""torch's legacy Python trace export: the ``EventList.export_chrome_trace`` JSON array.

Not the Kineto trace (``polyprof.runtime.chrome_trace`` writes that): torch's
``EventList.export_chrome_trace`` writes a bare JSON array of ``"ph": "X"``
events on a ``"CPU functions"`` lane, plus one ``"ph": "s"`` flow start per
kernel an op launched, its text built exactly as torch builds it, so the bytes
are the same. Events without a ``trace_name`` (memory rows) are left out, as
in torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from polyprof.base.fileio import atomic_writer

__all__ = ["write_legacy_chrome_trace"]


def write_legacy_chrome_trace(
    events: Iterable[Any], path: str | os.PathLike[str], *, device_name: str = "cuda"
) -> str:
    """Write ``events`` (``FunctionEvent``-like) to ``path`` atomically; returns the path.

    :param device_name: the device in the flows' category, ``cpu_to_<device_name>``.
    """
    parts = []
    next_id = 0
    for evt in events:
        if evt.trace_name is None:
            continue
        thread = evt.thread if not evt.is_remote else f'" node_id:{evt.node_id}, thread_id:{evt.thread} "'
        parts.append(
            f'{{"name": "{evt.trace_name}", "ph": "X", "ts": {evt.time_range.start}, '
            f'"dur": {evt.time_range.elapsed_us()}, "tid": {thread}, "pid": "CPU functions", '
            '"args": {}}'
        )
        for _ in evt.kernels:
            parts.append(
                f'{{"name": "{evt.trace_name}", "ph": "s", "ts": {evt.time_range.start}, '
                f'"tid": {evt.thread}, '
                f'"pid": "CPU functions", "id": {next_id}, "cat": "cpu_to_{device_name}", "args": {{}}}}'
            )
            next_id += 1
    with atomic_writer(path) as f:
        f.write("[" + ", ".join(parts) + "]")
    return os.fspath(path)
