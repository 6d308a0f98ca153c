"""Which CPU op launched each device activity: time containment on the launching thread.

Device tracers (CUPTI, PTI) record two halves of every launch: the API call
on the host (a ``RUNTIME`` or ``DRIVER`` row, on the calling OS thread) and
the activity on the device (``KERNEL``, ``GPU_MEMCPY``, ``GPU_MEMSET``, ...),
tied together by the tracer's own correlation id. torch's profiler adds the
third link, API call -> CPU op, by pushing the op's id as a CUPTI/PTI
"external correlation id" from its RecordFunction callback. polyprof's CPU
ops come from torch's C++ collector, whose op hooks a plugin cannot extend,
so the link is made after the fact instead:

    the op that launched an API call is the innermost torch op (``CPU_OP``;
    record_function ranges are user annotations, as in Kineto) on the same
    OS thread whose interval contains the call.

That is the op whose external id would have been on top of the thread's
stack when the call was made, so ``linked_correlation_id`` means what it
means in torch. Both clocks must agree (every tracer converts to Unix-epoch
ns); an API call that straddles an op boundary, or a launch from a thread
with no op open, stays unattributed and is still in the trace.

Overhead rows (the tracer's own cost) are never linked: torch's Kineto links
none, and linked overhead would count as the op's work. Rows copied from
torch's collector result (they carry Kineto's ``activity_type``) already have
torch's links, and the calls torch left unlinked stay so, as in torch.

Vectorized: ops are sorted per thread by start; for each API call the
candidates are the ops that started at or before it, and a sparse table of
running maxima over their end times finds the latest-started candidate that
ends at or after the call ends (binary lifting: O((n + m) log n)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polyprof.base.events import API_CALL_KINDS, HOST_KINDS, DeviceType, EventBatch, EventKind, kind_codes
from polyprof.base.log import get_logger

log = get_logger(__name__)

_LAUNCH_CODES = kind_codes(API_CALL_KINDS)
#: Rows never linked through their correlation id: host rows, and the tracer's own overhead.
_NOT_LAUNCHED_CODES = kind_codes({*HOST_KINDS, EventKind.OVERHEAD})


def _unlinked_launches(batch: EventBatch) -> np.ndarray:
    if batch.has("activity_type"):  # torch's collector linked these rows itself
        return np.zeros(0, dtype=np.int64)
    kind = batch["kind"]
    rows = np.isin(kind, _LAUNCH_CODES)
    if not rows.any():
        return np.zeros(0, dtype=np.int64)
    rows &= (batch["correlation_id"] != 0) & (batch["linked_correlation_id"] == 0)
    return np.flatnonzero(rows)


def link_launches(batches: Sequence[EventBatch]) -> list[EventBatch]:
    """Fill ``linked_correlation_id`` of API calls and the device rows they launched.

    Rows that already carry a link (a tracer that knows its ops) are left
    alone. Device rows are matched to API calls of the same tracer (same
    ``source``) by ``correlation_id``. Batches without unlinked API calls
    come back unchanged, and when no batch has any, no column of the CPU
    batches is read (their deferred columns stay deferred).
    """
    batches = list(batches)
    launches = {i: rows for i, b in enumerate(batches) if len(rows := _unlinked_launches(b))}
    if not launches:
        return batches
    ops = _OpIndex.of([b for i, b in enumerate(batches) if i not in launches])
    # Per tracer: its correlation id -> the launching op's id (0 when none contains the call).
    op_of_correlation: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    linked_launch_rows: dict[int, np.ndarray] = {}
    for i, rows in launches.items():
        b = batches[i]
        start = b["start_ns"][rows]
        op_id = ops.innermost_containing(b["tid"][rows], start, start + b["dur_ns"][rows])
        linked_launch_rows[i] = op_id
        corr = b["correlation_id"][rows]
        known = op_of_correlation.get(b.source)
        if known is not None:
            corr, op_id = np.concatenate([known[0], corr]), np.concatenate([known[1], op_id])
        op_of_correlation[b.source] = (corr, op_id)
    for source, (corr, op_id) in op_of_correlation.items():
        # One op per correlation id: the first API call that has an op wins (a runtime call and
        # the driver call it makes share the id on some backends).
        order = np.lexsort((op_id == 0, corr))
        corr, op_id = corr[order], op_id[order]
        first = np.r_[True, corr[1:] != corr[:-1]]
        op_of_correlation[source] = (corr[first], op_id[first])
    out = []
    unattributed = 0
    for i, b in enumerate(batches):
        table = op_of_correlation.get(b.source)
        if table is None:
            out.append(b)
            continue
        linked = b["linked_correlation_id"].copy()
        if i in launches:
            linked[launches[i]] = linked_launch_rows[i]
            unattributed += int((linked_launch_rows[i] == 0).sum())
        device_rows = np.flatnonzero(
            ~np.isin(b["kind"], _NOT_LAUNCHED_CODES) & (linked == 0) & (b["correlation_id"] != 0)
        )
        if len(device_rows):
            corr = b["correlation_id"][device_rows]
            pos = np.minimum(np.searchsorted(table[0], corr), len(table[0]) - 1)
            hit = table[0][pos] == corr
            linked[device_rows[hit]] = table[1][pos[hit]]
        out.append(_with_column(b, "linked_correlation_id", linked))
    if unattributed:
        log.debug("launches_unattributed", count=unattributed)
    return out


def _with_column(batch: EventBatch, name: str, values: np.ndarray) -> EventBatch:
    columns = {**batch.columns, name: values}
    deferred = {k: v for k, v in batch.deferred.items() if k != name}
    return EventBatch.build(batch.source, columns, batch.tables, deferred)


class _OpIndex:
    """torch ops of every thread, sorted by (thread, start, -end), with a range-max table of ends."""

    def __init__(self, tid: np.ndarray, start: np.ndarray, end: np.ndarray, op_id: np.ndarray) -> None:
        order = np.lexsort((-end, start, tid))
        self.tid, self.start, self.end, self.op_id = tid[order], start[order], end[order], op_id[order]
        # max_end[k][i] = max(end[i - 2**k + 1 .. i]); windows reaching before 0 are never read.
        self.max_end = [self.end]
        span = 1
        while span * 2 <= len(self.end):
            prev = self.max_end[-1]
            level = prev.copy()
            level[span:] = np.maximum(prev[span:], prev[:-span])
            self.max_end.append(level)
            span *= 2

    @classmethod
    def of(cls, batches: Sequence[EventBatch]) -> _OpIndex:
        parts: list[tuple[np.ndarray, ...]] = []
        for b in batches:
            ops = np.flatnonzero(
                (b["kind"] == int(EventKind.CPU_OP))
                & (b["device_type"] == int(DeviceType.CPU))
                & ~b["is_async"]
                & (b["correlation_id"] > 0)
            )
            if len(ops):
                start = b["start_ns"][ops]
                parts.append((b["tid"][ops], start, start + b["dur_ns"][ops], b["correlation_id"][ops]))
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty, empty)
        return cls(*(np.concatenate(cols).astype(np.int64, copy=False) for cols in zip(*parts, strict=True)))

    def innermost_containing(self, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Id of the latest-started op on ``tid`` starting by the call and ending after it (else 0)."""
        tid = np.asarray(tid, dtype=np.int64)
        start = np.asarray(start, dtype=np.int64)
        end = np.asarray(end, dtype=np.int64)
        found = np.zeros(len(tid), dtype=np.int64)
        if not len(self.tid) or not len(tid):
            return found
        group_lo = np.searchsorted(self.tid, tid, side="left")
        group_hi = np.searchsorted(self.tid, tid, side="right")
        # j: the last op of the thread that started at or before the call (starts are sorted per
        # thread). One searchsorted per thread, not per call.
        j = np.empty(len(tid), dtype=np.int64)
        for thread in np.unique(tid).tolist():
            mine = np.flatnonzero(tid == thread)
            lo, hi = int(group_lo[mine[0]]), int(group_hi[mine[0]])
            j[mine] = lo + np.searchsorted(self.start[lo:hi], start[mine], side="right") - 1
        # Step back over windows whose every op ends before the call does.
        for k in range(len(self.max_end) - 1, -1, -1):
            width = 1 << k
            can = (j - width + 1 >= group_lo) & (j >= 0)
            idx = np.flatnonzero(can)
            fails = self.max_end[k][j[idx]] < end[idx]
            j[idx[fails]] -= width
        ok = (j >= group_lo) & (j >= 0)
        ok[ok] &= self.end[j[ok]] >= end[ok]
        found[ok] = self.op_id[j[ok]]
        return found
