"""CUPTI activity records -> one columnar ``EventBatch`` per completed buffer.

Records are read by attribute name (duck typing), never by ``isinstance``
against a record class: cupti-python renames the classes between releases
(``ActivityKernel9`` in 12.8, ``ActivityKernel10`` in 13.0, ``ActivityKernel13``
in 13.4; ``ActivityMemcpy5/6/7``; ``ActivityMemset4/5``) but keeps the
attribute names. Each record is read once, by ``operator.attrgetter`` (a C
loop), falling back to ``getattr`` with defaults for records that lack a
field; everything after that is numpy.

Column contract (polyprof's core links device work to CPU ops from these):

* runtime / driver API calls: pid = this process, tid = OS thread id
  (``gettid()``, CUPTI's ``ActivityThreadIdType.SYSTEM``), correlation_id =
  CUPTI correlation id, device_type = CUDA.
* kernels, memcpys, memsets, synchronisation: pid = device index, tid = stream,
  correlation_id = the launching API call's correlation id, device_type = CUDA.
* overhead: CUPTI's own cost (Chrome trace lane "Overhead"), device_type =
  CPU as in Kineto: host time, never device work of an op.

Extra Chrome-trace args (grid, block, registers, shared memory, bytes,
bandwidth, cbid, ...) go into the interned ``args`` column as JSON object-body
fragments with Kineto's keys; the exporter adds device, stream, correlation
and External id itself.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import attrs
import numpy as np
from polyprof.events import FIELDS, DeviceType, EventBatch, EventKind

#: CUPTI's "no value" for 32-bit ids (CUPTI_SYNCHRONIZATION_INVALID_VALUE and friends).
INVALID_U32 = 0xFFFFFFFF

#: ``ActivityMemcpyKind`` -> Kineto's spelling (libkineto ``memcpyKindString``).
MEMCPY_KINDS = ("Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP")
#: ``ActivityMemoryKind`` -> Kineto's spelling (``memoryKindString``).
MEMORY_KINDS = (
    "Unknown",
    "Pageable",
    "Pinned",
    "Device",
    "Array",
    "Managed",
    "Device Static",
    "Managed Static",
)
#: ``ActivitySynchronizationType`` -> Kineto's spelling (``syncTypeString``).
SYNC_TYPES = ("Unknown", "Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync")
#: ``ActivityOverheadKind`` -> Kineto's spelling (``overheadKindString``).
OVERHEAD_KINDS = {
    0: "Unknown",
    1: "Driver Compiler",
    0x10000: "Buffer Flush",
    0x20000: "Instrumentation",
    0x30000: "Resource",
    0x40000: "Runtime Triggered Module Loading",
    0x50000: "Lazy Function Loading",
    0x60000: "Command Buffer Full",
    0x70000: "Activity Buffer Request",
    0x80000: "UVM Activity Init",
}

# Fields read per record family: (attribute, default when a record lacks it).
KERNEL_FIELDS = (
    ("start", 0),
    ("end", 0),
    ("device_id", 0),
    ("context_id", 0),
    ("stream_id", 0),
    ("correlation_id", 0),
    ("grid_x", 0),
    ("grid_y", 0),
    ("grid_z", 0),
    ("block_x", 0),
    ("block_y", 0),
    ("block_z", 0),
    ("registers_per_thread", 0),
    ("static_shared_memory", 0),
    ("dynamic_shared_memory", 0),
    ("name", ""),
    # CUPTI_TIMESTAMP_UNKNOWN (0) unless latency timestamps are enabled, which the tracer does not do.
    ("queued", 0),
)
MEMCPY_FIELDS = (
    ("start", 0),
    ("end", 0),
    ("device_id", 0),
    ("context_id", 0),
    ("stream_id", 0),
    ("correlation_id", 0),
    ("bytes", 0),
    ("copy_kind", 0),
    ("src_kind", 0),
    ("dst_kind", 0),
    # Peer-to-peer copies (MEMCPY2 records) only.
    ("src_device_id", -1),
    ("dst_device_id", -1),
    ("src_context_id", -1),
    ("dst_context_id", -1),
)
MEMSET_FIELDS = (
    ("start", 0),
    ("end", 0),
    ("device_id", 0),
    ("context_id", 0),
    ("stream_id", 0),
    ("correlation_id", 0),
    ("bytes", 0),
    ("value", 0),
    ("memory_kind", 0),
)
API_FIELDS = (("start", 0), ("end", 0), ("cbid", 0), ("thread_id", 0), ("correlation_id", 0))
SYNC_FIELDS = (
    ("start", 0),
    ("end", 0),
    ("context_id", 0),
    ("stream_id", INVALID_U32),
    ("correlation_id", 0),
    ("type", 0),
    ("cuda_event_id", 0),
)
OVERHEAD_FIELDS = (("start", 0), ("end", 0), ("overhead_kind", 0), ("correlation_id", 0))


@attrs.frozen
class DecodeStats:
    """What became of the records of one buffer (the tracer sums these)."""

    #: Records in the buffer.
    records: int = 0
    #: Rows in the batch.
    rows: int = 0
    #: Runtime/driver calls dropped by the Kineto-style cbid filter.
    filtered_api_calls: int = 0
    #: Records without usable timestamps (start 0, or end before start: still running at a forced flush).
    untimed: int = 0
    #: Records of kinds this decoder does not turn into events (by kind name).
    ignored: Mapping[str, int] = attrs.field(factory=dict)

    @property
    def accounted(self) -> int:
        return self.rows + self.filtered_api_calls + self.untimed + sum(self.ignored.values())


def read_fields(records: Sequence[Any], fields: Sequence[tuple[str, Any]]) -> list[tuple]:
    """One tuple of field values per record; missing attributes read as their default."""
    names = [name for name, _ in fields]
    try:
        getter = attrgetter(*names)
        return [getter(r) for r in records]
    except AttributeError:
        return [tuple(getattr(r, name, default) for name, default in fields) for r in records]


def _int_column(values: Sequence[Any]) -> np.ndarray:
    """int64 column; unsigned 64-bit values above int64's range keep their bits."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        return np.asarray(values, dtype=np.uint64).view(np.int64)


def _demangler() -> Callable[[str], str]:
    torch = sys.modules.get("torch")
    demangle = getattr(getattr(torch, "_C", None), "_demangle", None) if torch is not None else None
    return demangle if demangle is not None else (lambda name: name)


def _json_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _fmt_float(value: float) -> str:
    return repr(round(float(value), 6)) if np.isfinite(value) else "0"


class _Rows:
    """Column pieces of one batch, gathered per record family, then concatenated."""

    def __init__(self) -> None:
        self.parts: list[dict[str, np.ndarray]] = []
        self.names: dict[str, int] = {}
        self.args: dict[str, int] = {}

    def intern_names(self, values: Sequence[str]) -> np.ndarray:
        lookup = self.names
        return np.fromiter(
            (lookup.setdefault(v, len(lookup)) for v in values), dtype=np.int32, count=len(values)
        )

    def intern_args(self, values: Sequence[str | None]) -> np.ndarray:
        lookup = self.args
        return np.fromiter(
            (-1 if v is None else lookup.setdefault(v, len(lookup)) for v in values),
            dtype=np.int32,
            count=len(values),
        )

    def add(self, **columns: np.ndarray) -> None:
        self.parts.append(columns)

    def batch(self, source: str) -> EventBatch:
        fields = sorted({f for part in self.parts for f in part})
        n_parts = [len(next(iter(p.values()))) for p in self.parts]
        columns: dict[str, np.ndarray] = {}
        for field in fields:
            spec = FIELDS[field]
            columns[field] = np.concatenate(
                [
                    p[field].astype(spec.dtype, copy=False)
                    if field in p
                    else np.full(n, spec.default, spec.dtype)
                    for p, n in zip(self.parts, n_parts, strict=True)
                ]
            )
        tables = {"name": tuple(self.names), "args": tuple(self.args)}
        if not columns:
            return EventBatch.empty(source)
        return EventBatch.build(source, columns, tables)


class RecordDecoder:
    """Turns lists of CUPTI records into ``EventBatch`` objects (runs on the bus thread).

    Keeps what later buffers need: the context -> device map learned from
    device records (synchronisation records carry only a context id).
    """

    def __init__(
        self,
        *,
        kinds: Mapping[str, int],
        runtime_names: Mapping[int, str],
        driver_names: Mapping[int, str],
        api_filter: Any,
        offset_ns: int = 0,
        thread_map: Mapping[int, int] | None = None,
        sm_count: Callable[[int], int | None] = lambda device: None,
        warp_size: Callable[[int], int] = lambda device: 32,
        pid: int | None = None,
        source: str = "cupti",
    ) -> None:
        self.kinds = dict(kinds)
        self.runtime_names = runtime_names
        self.driver_names = driver_names
        self.api_filter = api_filter
        self.offset_ns = int(offset_ns)
        #: CUPTI thread id -> OS thread id, when CUPTI records pthread ids instead of gettid().
        self.thread_map = dict(thread_map) if thread_map else None
        self.sm_count = sm_count
        self.warp_size = warp_size
        self.pid = os.getpid() if pid is None else pid
        self.source = source
        self.context_device: dict[int, int] = {}
        self._by_value = {v: k for k, v in self.kinds.items()}

    # ------------------------------------------------------------ dispatch

    def decode(self, records: Sequence[Any]) -> tuple[EventBatch, DecodeStats]:
        """One batch for one buffer of records, and what became of them."""
        n = len(records)
        if not n:
            return EventBatch.empty(self.source), DecodeStats()
        kind_of = np.fromiter(map(attrgetter("kind"), records), dtype=np.int64, count=n)
        rows = _Rows()
        untimed = filtered = 0
        ignored: dict[str, int] = {}
        handlers = {
            "CONCURRENT_KERNEL": self._kernels,
            "KERNEL": self._kernels,
            "MEMCPY": self._memcpys,
            "MEMCPY2": self._memcpys,
            "MEMSET": self._memsets,
            "RUNTIME": self._api_calls,
            "DRIVER": self._api_calls,
            "SYNCHRONIZATION": self._syncs,
            "OVERHEAD": self._overheads,
        }
        # Device records first: they teach the context -> device map that sync records use.
        order = ("CONCURRENT_KERNEL", "KERNEL", "MEMCPY", "MEMCPY2", "MEMSET", "RUNTIME", "DRIVER")
        order += ("SYNCHRONIZATION", "OVERHEAD")
        handled: set[int] = set()
        for name in order:
            value = self.kinds.get(name)
            if value is None or value in handled:
                continue
            handled.add(value)
            idx = np.flatnonzero(kind_of == value)
            if not len(idx):
                continue
            group = [records[i] for i in idx.tolist()]
            u, f = handlers[name](rows, group, name)
            untimed += u
            filtered += f
        for value, count in zip(*np.unique(kind_of[~np.isin(kind_of, list(handled))], return_counts=True)):
            label = self._by_value.get(int(value), f"kind {int(value)}")
            ignored[label] = ignored.get(label, 0) + int(count)
        batch = rows.batch(self.source)
        stats = DecodeStats(
            records=n, rows=len(batch), filtered_api_calls=filtered, untimed=untimed, ignored=ignored
        )
        return batch, stats

    # ------------------------------------------------------------- helpers

    def _times(self, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mask of usable rows, start on polyprof's clock, duration)."""
        timed = (start > 0) & (end >= start)
        return timed, start + self.offset_ns, end - start

    def _learn_contexts(self, context: np.ndarray, device: np.ndarray) -> None:
        if not len(context):
            return
        pairs = np.unique(np.stack([context, device]), axis=1)
        for c, d in pairs.T.tolist():
            self.context_device[int(c)] = int(d)

    @staticmethod
    def _columns(raw: list[tuple], fields: Sequence[tuple[str, Any]]) -> dict[str, Any]:
        cols = list(zip(*raw, strict=True))
        return {name: cols[i] for i, (name, _) in enumerate(fields)}

    # ------------------------------------------------------------- kernels

    def _kernels(self, rows: _Rows, group: list[Any], _name: str) -> tuple[int, int]:
        c = self._columns(read_fields(group, KERNEL_FIELDS), KERNEL_FIELDS)
        start, end = _int_column(c["start"]), _int_column(c["end"])
        timed, ts, dur = self._times(start, end)
        device = _int_column(c["device_id"])
        context = _int_column(c["context_id"])
        self._learn_contexts(context, device)
        keep = np.flatnonzero(timed)
        demangle = _demangler()
        names = [demangle(n) if n else "<unnamed kernel>" for n in (c["name"][i] for i in keep.tolist())]
        # Kineto's "queued": the raw value, 0 when unknown; a known one is put on polyprof's clock like start.
        raw_queued = _int_column(c["queued"])
        queued = np.where(raw_queued > 0, raw_queued + self.offset_ns, 0).tolist()
        key_columns = [c[f] for f in ("context_id", "device_id", "grid_x", "grid_y", "grid_z")]
        key_columns += [c[f] for f in ("block_x", "block_y", "block_z", "registers_per_thread")]
        smem = (_int_column(c["static_shared_memory"]) + _int_column(c["dynamic_shared_memory"])).tolist()
        keys = [(queued[i],) + tuple(col[i] for col in key_columns) + (smem[i],) for i in keep.tolist()]
        fragments: dict[tuple, str] = {}
        args = []
        for key in keys:
            text = fragments.get(key)
            if text is None:
                text = fragments[key] = self._kernel_args(*key)
            args.append(text)
        rows.add(
            kind=np.full(len(keep), int(EventKind.KERNEL), dtype=np.int8),
            name=rows.intern_names(names),
            start_ns=ts[keep],
            dur_ns=dur[keep],
            **self._device_lane(device[keep], _int_column(c["stream_id"])[keep]),
            correlation_id=_int_column(c["correlation_id"])[keep],
            args=rows.intern_args(args),
        )
        return len(group) - len(keep), 0

    def _kernel_args(
        self,
        queued: int,
        context: int,
        device: int,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        regs: int,
        smem: int,
    ) -> str:
        # Kineto's keys in Kineto's order (the exporter adds device, stream and correlation itself);
        # ends with a number, like Kineto's (whose last key is "est. achieved occupancy %").
        parts = [f'"queued": {queued}', f'"context": {context}']
        parts += [f'"grid": [{gx}, {gy}, {gz}]', f'"block": [{bx}, {by}, {bz}]']
        parts += [f'"registers per thread": {regs}', f'"shared memory": {smem}']
        sms = self.sm_count(device)
        if sms:
            blocks_per_sm = gx * gy * gz / sms
            warps_per_sm = blocks_per_sm * (bx * by * bz) / max(self.warp_size(device), 1)
            parts.append(f'"blocks per SM": {_fmt_float(blocks_per_sm)}')
            parts.append(f'"warps per SM": {_fmt_float(warps_per_sm)}')
        return ", ".join(parts)

    @staticmethod
    def _device_lane(device: np.ndarray, stream: np.ndarray) -> dict[str, np.ndarray]:
        stream = np.where(stream == INVALID_U32, -1, stream)
        return {
            "pid": device,
            "tid": stream,
            "device_type": np.full(len(device), int(DeviceType.CUDA), dtype=np.int8),
            "device_index": device,
            "stream": stream,
        }

    # ----------------------------------------------------- memcpy / memset

    def _memcpys(self, rows: _Rows, group: list[Any], _name: str) -> tuple[int, int]:
        c = self._columns(read_fields(group, MEMCPY_FIELDS), MEMCPY_FIELDS)
        start, end = _int_column(c["start"]), _int_column(c["end"])
        timed, ts, dur = self._times(start, end)
        device, context = _int_column(c["device_id"]), _int_column(c["context_id"])
        self._learn_contexts(context, device)
        keep = np.flatnonzero(timed)
        nbytes = _int_column(c["bytes"])
        copy_kind, src, dst = (_int_column(c[f]) for f in ("copy_kind", "src_kind", "dst_kind"))
        names = [
            f"Memcpy {_label(MEMCPY_KINDS, k)} ({_label(MEMORY_KINDS, s)} -> {_label(MEMORY_KINDS, d)})"
            for k, s, d in zip(copy_kind[keep].tolist(), src[keep].tolist(), dst[keep].tolist(), strict=True)
        ]
        bandwidth = _bandwidth(nbytes[keep], dur[keep])
        peer_src, peer_dst = _int_column(c["src_device_id"])[keep], _int_column(c["dst_device_id"])[keep]
        peer_src_ctx = _int_column(c["src_context_id"])[keep]
        peer_dst_ctx = _int_column(c["dst_context_id"])[keep]
        # Peer copies use Kineto's CUpti_ActivityMemcpy2 keys (fromDevice/inDevice/toDevice, ...Context).
        args = [
            (
                f'"fromDevice": {ps}, "inDevice": {dev}, "toDevice": {pd}, '
                f'"fromContext": {psc}, "inContext": {ctx}, "toContext": {pdc}'
                if ps >= 0
                else f'"context": {ctx}'
            )
            + f', "bytes": {b}, "memory bandwidth (GB/s)": {_fmt_float(bw)}'
            for dev, ctx, b, bw, ps, pd, psc, pdc in zip(
                device[keep].tolist(),
                context[keep].tolist(),
                nbytes[keep].tolist(),
                bandwidth.tolist(),
                peer_src.tolist(),
                peer_dst.tolist(),
                peer_src_ctx.tolist(),
                peer_dst_ctx.tolist(),
                strict=True,
            )
        ]
        rows.add(
            kind=np.full(len(keep), int(EventKind.GPU_MEMCPY), dtype=np.int8),
            name=rows.intern_names(names),
            start_ns=ts[keep],
            dur_ns=dur[keep],
            **self._device_lane(device[keep], _int_column(c["stream_id"])[keep]),
            correlation_id=_int_column(c["correlation_id"])[keep],
            nbytes=nbytes[keep],
            args=rows.intern_args(args),
        )
        return len(group) - len(keep), 0

    def _memsets(self, rows: _Rows, group: list[Any], _name: str) -> tuple[int, int]:
        c = self._columns(read_fields(group, MEMSET_FIELDS), MEMSET_FIELDS)
        start, end = _int_column(c["start"]), _int_column(c["end"])
        timed, ts, dur = self._times(start, end)
        device, context = _int_column(c["device_id"]), _int_column(c["context_id"])
        self._learn_contexts(context, device)
        keep = np.flatnonzero(timed)
        nbytes = _int_column(c["bytes"])
        memory_kind = _int_column(c["memory_kind"])
        names = [f"Memset ({_label(MEMORY_KINDS, k)})" for k in memory_kind[keep].tolist()]
        bandwidth = _bandwidth(nbytes[keep], dur[keep])
        args = [
            f'"context": {ctx}, "bytes": {b}, "memory bandwidth (GB/s)": {_fmt_float(bw)}, "value": {v}'
            for ctx, b, bw, v in zip(
                context[keep].tolist(),
                nbytes[keep].tolist(),
                bandwidth.tolist(),
                _int_column(c["value"])[keep].tolist(),
                strict=True,
            )
        ]
        rows.add(
            kind=np.full(len(keep), int(EventKind.GPU_MEMSET), dtype=np.int8),
            name=rows.intern_names(names),
            start_ns=ts[keep],
            dur_ns=dur[keep],
            **self._device_lane(device[keep], _int_column(c["stream_id"])[keep]),
            correlation_id=_int_column(c["correlation_id"])[keep],
            nbytes=nbytes[keep],
            args=rows.intern_args(args),
        )
        return len(group) - len(keep), 0

    # ----------------------------------------------------------- API calls

    def _api_calls(self, rows: _Rows, group: list[Any], name: str) -> tuple[int, int]:
        c = self._columns(read_fields(group, API_FIELDS), API_FIELDS)
        start, end = _int_column(c["start"]), _int_column(c["end"])
        timed, ts, dur = self._times(start, end)
        cbid = _int_column(c["cbid"])
        is_runtime = name == "RUNTIME"
        flags = np.full(len(group), is_runtime), np.full(len(group), not is_runtime)
        wanted = (
            self.api_filter.keep(*flags, cbid) if self.api_filter is not None else np.ones(len(group), bool)
        )
        keep = np.flatnonzero(timed & wanted)
        table = self.runtime_names if is_runtime else self.driver_names
        cbids = cbid[keep].tolist()
        names = [table.get(k) or f"{'cuda' if is_runtime else 'cu'}Api(cbid={k})" for k in cbids]
        tid = _int_column(c["thread_id"])[keep]
        if self.thread_map:
            tid = np.array([self.thread_map.get(t, t) for t in tid.tolist()], dtype=np.int64)
        rows.add(
            kind=np.full(
                len(keep), int(EventKind.RUNTIME if is_runtime else EventKind.DRIVER), dtype=np.int8
            ),
            name=rows.intern_names(names),
            start_ns=ts[keep],
            dur_ns=dur[keep],
            pid=np.full(len(keep), self.pid, dtype=np.int64),
            tid=tid,
            device_type=np.full(len(keep), int(DeviceType.CUDA), dtype=np.int8),
            correlation_id=_int_column(c["correlation_id"])[keep],
            args=rows.intern_args([f'"cbid": {k}' for k in cbids]),
        )
        untimed = int((~timed).sum())
        return untimed, int((timed & ~wanted).sum())

    # ------------------------------------------------- sync and overhead

    def _syncs(self, rows: _Rows, group: list[Any], _name: str) -> tuple[int, int]:
        c = self._columns(read_fields(group, SYNC_FIELDS), SYNC_FIELDS)
        start, end = _int_column(c["start"]), _int_column(c["end"])
        timed, ts, dur = self._times(start, end)
        keep = np.flatnonzero(timed)
        context = _int_column(c["context_id"])[keep]
        device = np.array([self.context_device.get(int(x), 0) for x in context.tolist()], dtype=np.int64)
        sync_type = _int_column(c["type"])[keep].tolist()
        event_id = _int_column(c["cuda_event_id"])[keep].tolist()
        names = [_label(SYNC_TYPES, t) for t in sync_type]
        args = [
            f'"cuda_sync_kind": {_json_str(_label(SYNC_TYPES, t))}, "context": {ctx}'
            + (f', "cuda_event_id": {e}' if t in (1, 2) else "")
            for t, ctx, e in zip(sync_type, context.tolist(), event_id, strict=True)
        ]
        rows.add(
            kind=np.full(len(keep), int(EventKind.SYNC), dtype=np.int8),
            name=rows.intern_names(names),
            start_ns=ts[keep],
            dur_ns=dur[keep],
            **self._device_lane(device, _int_column(c["stream_id"])[keep]),
            correlation_id=_int_column(c["correlation_id"])[keep],
            args=rows.intern_args(args),
        )
        return len(group) - len(keep), 0

    def _overheads(self, rows: _Rows, group: list[Any], _name: str) -> tuple[int, int]:
        c = self._columns(read_fields(group, OVERHEAD_FIELDS), OVERHEAD_FIELDS)
        start, end = _int_column(c["start"]), _int_column(c["end"])
        timed, ts, dur = self._times(start, end)
        keep = np.flatnonzero(timed)
        names = [
            OVERHEAD_KINDS.get(k, f"Overhead {k}") for k in _int_column(c["overhead_kind"])[keep].tolist()
        ]
        rows.add(
            kind=np.full(len(keep), int(EventKind.OVERHEAD), dtype=np.int8),
            name=rows.intern_names(names),
            start_ns=ts[keep],
            dur_ns=dur[keep],
            pid=np.full(len(keep), -1, dtype=np.int64),
            device_type=np.full(len(keep), int(DeviceType.CPU), dtype=np.int8),
            correlation_id=_int_column(c["correlation_id"])[keep],
        )
        return len(group) - len(keep), 0


def _label(table: Sequence[str], value: int) -> str:
    return table[value] if 0 <= value < len(table) else table[0]


def _bandwidth(nbytes: np.ndarray, dur_ns: np.ndarray) -> np.ndarray:
    """GB/s (bytes per ns), 0 for zero-length activities."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bw = np.where(dur_ns > 0, nbytes / np.maximum(dur_ns, 1), 0.0)
    return bw
