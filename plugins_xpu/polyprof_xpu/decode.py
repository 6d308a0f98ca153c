"""PTI record buffers -> columnar ``EventBatch``: walk once, gather per kind, vectorize.

The only per-record Python work is the ``ptiViewGetNextRecord`` call that
finds each record (record sizes differ between PTI versions, so nothing else
may step through a buffer). Records of one kind are then copied in one numpy
gather into a structured array laid out as the C struct, and every column
is computed from that array.
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
from polyprof.events import DeviceType, EventBatch, EventKind

from polyprof_xpu import records as R

#: Streams of Level Zero queues without a SYCL queue id start here (SYCL ids are small integers).
L0_QUEUE_STREAM_BASE = 1 << 32


@attrs.frozen
class WalkResult:
    """Where the records of one buffer are."""

    offsets: np.ndarray
    kinds: np.ndarray
    #: The PTI result that ended the walk: END_OF_BUFFER when the whole buffer was read.
    end_code: int
    #: Bytes after the last record that was read (0 when the walk ended cleanly).
    unread_bytes: int


def walk(next_record: Callable[..., int], address: int, valid_bytes: int) -> WalkResult:
    """Byte offsets and kinds of every record, found only by ``ptiViewGetNextRecord``."""
    record = ctypes.c_void_p(None)
    ref = ctypes.byref(record)
    offsets: list[int] = []
    append = offsets.append
    code = R.PtiResult.SUCCESS
    # ctypes objects, built once: correct whether or not the caller typed the function.
    buffer_arg, size_arg = ctypes.c_void_p(address), ctypes.c_size_t(valid_bytes)
    while True:
        code = next_record(buffer_arg, size_arg, ref)
        if code != R.PtiResult.SUCCESS:
            break
        append(record.value - address)
    offs = np.asarray(offsets, dtype=np.int64)
    buf = np.ctypeslib.as_array((ctypes.c_uint8 * valid_bytes).from_address(address)) if valid_bytes else None
    kinds = (
        buf[offs[:, None] + np.arange(4)].copy().view("<u4").reshape(len(offs))
        if len(offs)
        else np.zeros(0, dtype=np.uint32)
    )
    unread = 0
    if code != R.PtiResult.STATUS_END_OF_BUFFER:
        last_end = int(offs[-1]) + 4 if len(offs) else 0
        unread = max(valid_bytes - last_end, 0)
    return WalkResult(offs, kinds, int(code), unread)


class DeviceTable:
    """Device UUID -> ordinal, from the probe's Level Zero enumeration, plus queues seen.

    A UUID Level Zero did not list gets the next free ordinal (first seen
    first) and is reported in the trace notes.
    """

    def __init__(self, devices: Sequence[dict[str, Any]] = ()) -> None:
        self.devices = [dict(d) for d in devices]
        self._index = {bytes.fromhex(d["uuid"]): int(d["index"]) for d in devices}
        #: UUIDs (hex) of unlisted devices seen in the current recording (``new_recording`` clears it).
        self.unknown: list[str] = []
        self._unlisted: set[bytes] = set()
        #: Level Zero queue handle -> (device index, stream), for records that carry only the queue.
        self.queues: dict[int, tuple[int, int]] = {}
        self._l0_streams: dict[int, int] = {}

    def new_recording(self) -> None:
        """Forget which unlisted devices were seen; their ordinals (and queues' streams) stay."""
        self.unknown = []

    def index_of(self, uuid: bytes) -> int:
        idx = self._index.get(uuid)
        if idx is None:
            idx = self._index[uuid] = max(self._index.values(), default=-1) + 1
            self._unlisted.add(uuid)
        if uuid in self._unlisted and uuid.hex() not in self.unknown:
            self.unknown.append(uuid.hex())
        return idx

    def l0_stream(self, handle: int) -> int:
        stream = self._l0_streams.get(handle)
        if stream is None:
            stream = self._l0_streams[handle] = L0_QUEUE_STREAM_BASE + len(self._l0_streams)
        return stream


@attrs.define
class Clock:
    """PTI time -> Unix-epoch ns: ``pti_ns + offset_ns``."""

    offset_ns: int = 0


class _Names:
    """One interned name table for a batch."""

    def __init__(self) -> None:
        self.table: list[str] = []
        self._ids: dict[str, int] = {}

    def add(self, name: str) -> int:
        idx = self._ids.get(name)
        if idx is None:
            idx = self._ids[name] = len(self.table)
            self.table.append(name)
        return idx

    def by_key(self, keys: np.ndarray, name_of: Callable[[Any], str]) -> np.ndarray:
        """Name index per row, calling ``name_of`` once per distinct key."""
        if not len(keys):
            return np.zeros(0, dtype=np.int32)
        unique, inverse = np.unique(keys, return_inverse=True, axis=0 if keys.ndim > 1 else None)
        ids = np.array([self.add(name_of(k)) for k in unique], dtype=np.int32)
        return ids[inverse.reshape(-1)]


def _c_string(ptr: int, fallback: str) -> str:
    if not ptr:
        return fallback
    return ctypes.string_at(ptr).decode("utf-8", "replace")


def _i64(values: np.ndarray) -> np.ndarray:
    return values.astype(np.uint64, copy=False).view(np.int64)


@attrs.define
class _Part:
    """Columns of one record kind, before concatenation."""

    columns: dict[str, np.ndarray]
    args: Callable[[], list[str | None]]


class Decoder:
    """Decodes buffers of one recording. Bus thread only."""

    def __init__(
        self,
        api_name: Callable[[int, int], str],
        devices: DeviceTable,
        clock: Clock,
        pid: int | None = None,
        source: str = "xpu_pti",
    ) -> None:
        self.api_name = api_name
        self.devices = devices
        self.clock = clock
        self.pid = os.getpid() if pid is None else pid
        self.source = source
        #: Records read, by PTI view kind value.
        self.records_walked: Counter[int] = Counter()
        #: Rows emitted, by PTI view kind value.
        self.rows_emitted: Counter[int] = Counter()
        self.walk_problems: list[str] = []
        #: Records left out because PTI gave 0 (not determined) as their start or end, by kind value.
        self.missing_timestamps: Counter[int] = Counter()

    # ------------------------------------------------------------------ buffer

    def decode_buffer(
        self, next_record: Callable[..., int], address: int, valid_bytes: int
    ) -> EventBatch | None:
        """Walk and decode one completed buffer; None when it holds no events."""
        result = walk(next_record, address, valid_bytes)
        if result.unread_bytes or result.end_code != R.PtiResult.STATUS_END_OF_BUFFER:
            self.walk_problems.append(
                f"ptiViewGetNextRecord stopped with {R.result_name(result.end_code)} after {len(result.offsets)} "
                f"records; {result.unread_bytes} of {valid_bytes} bytes were not read"
            )
        if not len(result.offsets):
            return None
        buf = np.ctypeslib.as_array((ctypes.c_uint8 * valid_bytes).from_address(address))
        return self.decode_records(buf, result.offsets, result.kinds)

    def decode_records(self, buf: np.ndarray, offsets: np.ndarray, kinds: np.ndarray) -> EventBatch | None:
        names = _Names()
        parts: list[_Part] = []
        for kind_value, count in zip(*np.unique(kinds, return_counts=True), strict=True):
            self.records_walked[int(kind_value)] += int(count)
        # Device kinds first: synchronization records find their device through the queues these saw.
        order = (
            R.ViewKind.DEVICE_GPU_KERNEL,
            R.ViewKind.DEVICE_GPU_MEM_COPY,
            R.ViewKind.DEVICE_GPU_MEM_COPY_P2P,
            R.ViewKind.DEVICE_GPU_MEM_FILL,
            R.ViewKind.DEVICE_SYNCHRONIZATION,
            R.ViewKind.RUNTIME_API,
            R.ViewKind.DRIVER_API,
            R.ViewKind.COLLECTION_OVERHEAD,
        )
        for kind in order:
            rows = offsets[kinds == kind]
            if not len(rows):
                continue
            recs = R.gather(buf, rows, R.DTYPES[kind])
            # pti_view.h: a timestamp PTI could not determine is 0; such a row would sit at 1970
            # or last ~56 years. Leave it out (counted for the trace notes).
            timed = (recs["start_timestamp"] != 0) & (recs["end_timestamp"] != 0)
            if not timed.all():
                self.missing_timestamps[int(kind)] += int((~timed).sum())
                recs = recs[timed]
                if not len(recs):
                    continue
            part = self._decode_kind(kind, recs, names)
            self.rows_emitted[int(kind)] += len(recs)
            parts.append(part)
        if not parts:
            return None
        return _build(self.source, parts, names.table)

    # ------------------------------------------------------------------ kinds

    def _decode_kind(self, kind: R.ViewKind, recs: np.ndarray, names: _Names) -> _Part:
        if kind == R.ViewKind.DEVICE_GPU_KERNEL:
            return self._device_part(
                recs, names, EventKind.KERNEL, lambda p: _c_string(int(p), "<unnamed kernel>"), "name"
            )
        if kind in (R.ViewKind.DEVICE_GPU_MEM_COPY, R.ViewKind.DEVICE_GPU_MEM_COPY_P2P):
            keys = np.stack([recs["memcpy_type"], recs["mem_src"], recs["mem_dst"]], axis=1)
            part = self._device_part(recs, names, EventKind.GPU_MEMCPY, _memcpy_name, keys)
            part.columns["nbytes"] = _i64(recs["bytes"])
            return part
        if kind == R.ViewKind.DEVICE_GPU_MEM_FILL:
            part = self._device_part(recs, names, EventKind.GPU_MEMSET, _memset_name, "mem_type")
            part.columns["nbytes"] = _i64(recs["bytes"])
            return part
        if kind == R.ViewKind.DEVICE_SYNCHRONIZATION:
            return self._sync_part(recs, names)
        if kind in (R.ViewKind.RUNTIME_API, R.ViewKind.DRIVER_API):
            return self._api_part(
                recs, names, EventKind.RUNTIME if kind == R.ViewKind.RUNTIME_API else EventKind.DRIVER
            )
        return self._overhead_part(recs, names)

    def _times(self, recs: np.ndarray, start: str = "start_timestamp", end: str = "end_timestamp") -> tuple:
        s = _i64(recs[start]) + self.clock.offset_ns
        e = _i64(recs[end]) + self.clock.offset_ns
        return s, np.maximum(e - s, 0)

    def _device_part(
        self, recs: np.ndarray, names: _Names, kind: EventKind, name_of: Callable[[Any], str], key: Any
    ) -> _Part:
        n = len(recs)
        uuids, uuid_inverse = np.unique(recs["device_uuid"], return_inverse=True)
        uuid_index = np.array([self.devices.index_of(bytes(u)) for u in uuids], dtype=np.int32)
        device_index = uuid_index[uuid_inverse.reshape(-1)]
        stream = self._streams(recs)
        # Remember each queue's device and stream for synchronization records.
        handles, first = np.unique(recs["queue_handle"], return_index=True)
        for h, i in zip(handles.tolist(), first.tolist(), strict=True):
            self.devices.queues[h] = (int(device_index[i]), int(stream[i]))
        start, dur = self._times(recs)
        name = names.by_key(recs[key] if isinstance(key, str) else key, name_of)
        columns = {
            "kind": np.full(n, kind, dtype=np.int8),
            "name": name,
            "start_ns": start,
            "dur_ns": dur,
            "pid": device_index.astype(np.int64),
            "tid": stream,
            "stream": stream,
            "device_type": np.full(n, DeviceType.XPU, dtype=np.int8),
            "device_index": device_index,
            "correlation_id": recs["correlation_id"].astype(np.int64),
        }
        l0_calls: list[str] = []
        if kind != EventKind.KERNEL:
            # The API name strings belong to PTI: read them now, not when args are first asked for.
            pointers, inverse = np.unique(recs["name"], return_inverse=True)
            strings = [_c_string(int(p), "") for p in pointers.tolist()]
            l0_calls = [strings[i] for i in inverse.reshape(-1).tolist()]
        return _Part(columns, lambda: _device_args(kind, recs, l0_calls))

    def _streams(self, recs: np.ndarray) -> np.ndarray:
        """SYCL queue id where PTI has one; else a number per Level Zero queue handle."""
        sycl = recs["sycl_queue_id"]
        stream = _i64(sycl).copy()
        missing = sycl == np.uint64(R.INVALID_SYCL_QUEUE_ID)
        if missing.any():
            handles, inverse = np.unique(recs["queue_handle"][missing], return_inverse=True)
            ids = np.array([self.devices.l0_stream(int(h)) for h in handles], dtype=np.int64)
            stream[missing] = ids[inverse.reshape(-1)]
        return stream

    def _api_part(self, recs: np.ndarray, names: _Names, kind: EventKind) -> _Part:
        n = len(recs)
        start, dur = self._times(recs)
        keys = np.stack([recs["api_group"], recs["api_id"]], axis=1)
        name = names.by_key(keys, lambda k: self.api_name(int(k[0]), int(k[1])))
        pid = recs["process_id"].astype(np.int64)
        pid[pid == 0] = self.pid
        tid = recs["thread_id"].astype(np.int64)
        columns = {
            "kind": np.full(n, kind, dtype=np.int8),
            "name": name,
            "start_ns": start,
            "dur_ns": dur,
            "pid": pid,
            "tid": tid,
            "thread": tid,
            "device_type": np.full(n, DeviceType.XPU, dtype=np.int8),
            "correlation_id": recs["correlation_id"].astype(np.int64),
        }
        return _Part(columns, lambda: [None] * n)

    def _sync_part(self, recs: np.ndarray, names: _Names) -> _Part:
        """GPU barriers are device rows on their queue; host waits sit at device -1 on the waiting thread (as Kineto)."""
        n = len(recs)
        start, dur = self._times(recs)
        keys = np.stack([recs["api_group"], recs["api_id"]], axis=1)
        name = names.by_key(keys, lambda k: self.api_name(int(k[0]), int(k[1])))
        on_gpu = np.isin(recs["synch_type"], R.GPU_SYNC_TYPES)
        device_index = np.full(n, -1, dtype=np.int32)
        stream = np.full(n, -1, dtype=np.int64)
        for i in np.flatnonzero(on_gpu).tolist():
            handle = int(recs["queue_handle"][i])
            known = self.devices.queues.get(handle)
            device_index[i], stream[i] = known if known else (0, self.devices.l0_stream(handle))
        tid = recs["thread_id"].astype(np.int64)
        corr = recs["correlation_id"].astype(np.int64)
        columns = {
            "kind": np.full(n, EventKind.SYNC, dtype=np.int8),
            "name": name,
            "start_ns": start,
            "dur_ns": dur,
            "pid": np.where(on_gpu, device_index.astype(np.int64), self.pid),
            "tid": np.where(on_gpu, stream, tid),
            "stream": stream,
            "device_type": np.full(n, DeviceType.XPU, dtype=np.int8),
            "device_index": device_index,
            # A host wait is not device work of the op that waited: only GPU barriers carry the link.
            "correlation_id": np.where(on_gpu, corr, 0),
        }

        def args() -> list[str | None]:
            types = recs["synch_type"].tolist()
            waits = recs["number_wait_events"].tolist()
            return [
                f'"sync type": "{R.SYNC_TYPE_NAMES[t] if t < len(R.SYNC_TYPE_NAMES) else t}", '
                f'"wait events": {w}, "correlation": {c}'
                for t, w, c in zip(types, waits, corr.tolist(), strict=True)
            ]

        return _Part(columns, args)

    def _overhead_part(self, recs: np.ndarray, names: _Names) -> _Part:
        n = len(recs)
        start, dur = self._times(recs)
        name = names.by_key(
            recs["overhead_kind"],
            lambda k: R.OVERHEAD_EVENT_NAMES[int(k)] if int(k) < len(R.OVERHEAD_EVENT_NAMES) else "Overhead",
        )
        columns = {
            "kind": np.full(n, EventKind.OVERHEAD, dtype=np.int8),
            "name": name,
            "start_ns": start,
            "dur_ns": dur,
            "pid": np.full(n, self.pid, dtype=np.int64),
            "tid": recs["thread_id"].astype(np.int64),
            "device_type": np.full(n, DeviceType.XPU, dtype=np.int8),
        }

        def args() -> list[str | None]:
            return [
                f'"overhead count": {c}, "overhead duration ns": {d}'
                for c, d in zip(
                    recs["overhead_count"].tolist(), recs["overhead_duration_ns"].tolist(), strict=True
                )
            ]

        return _Part(columns, args)


def _memcpy_name(key: np.ndarray) -> str:
    kind, src, dst = (int(v) for v in key)
    return f"Memcpy {_table(R.MEMCPY_TYPE_NAMES, kind)} ({_table(R.MEMORY_TYPE_NAMES, src)} -> {_table(R.MEMORY_TYPE_NAMES, dst)})"


def _memset_name(mem_type: Any) -> str:
    return f"Memset ({_table(R.MEMORY_TYPE_NAMES, int(mem_type))})"


def _table(names: tuple[str, ...], value: int) -> str:
    return names[value] if 0 <= value < len(names) else f"<{value}>"


def _device_args(kind: EventKind, recs: np.ndarray, l0_calls: list[str]) -> list[str | None]:
    """Kineto's extra args for XPU device activity (device/stream/correlation come from the core)."""
    sycl = recs["sycl_queue_id"].tolist()
    l0q = recs["queue_handle"].tolist()
    ctx = recs["context_handle"].tolist()
    base = [
        f'"context": {c}, "sycl queue": {s if s != R.INVALID_SYCL_QUEUE_ID else -1}, "l0 queue": {q}'
        for c, s, q in zip(ctx, sycl, l0q, strict=True)
    ]
    if kind == EventKind.KERNEL:
        return [
            f'{b}, "kernel_id": {k}, "sycl_node_id": {node}, "sycl_invocation_id": {inv}'
            for b, k, node, inv in zip(
                base,
                recs["kernel_id"].tolist(),
                recs["sycl_node_id"].tolist(),
                recs["sycl_invocation_id"].tolist(),
                strict=True,
            )
        ]
    nbytes = recs["bytes"].astype(np.float64)
    dur = (recs["end_timestamp"].astype(np.int64) - recs["start_timestamp"].astype(np.int64)).astype(
        np.float64
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        bandwidth = np.where(dur > 0, nbytes / dur, 0.0)  # bytes per ns = GB/s
    return [
        f'{b}, "bytes": {int(nb)}, "memory bandwidth (GB/s)": {bw:.6g}, "l0 call": "{call}"'
        for b, nb, bw, call in zip(base, nbytes.tolist(), bandwidth.tolist(), l0_calls, strict=True)
    ]


def _build(source: str, parts: list[_Part], names: list[str]) -> EventBatch:
    fields = sorted({f for p in parts for f in p.columns})
    n_total = sum(len(p.columns["kind"]) for p in parts)
    from polyprof.events import FIELDS

    columns: dict[str, np.ndarray] = {}
    for field in fields:
        spec = FIELDS[field]
        chunks = [
            p.columns[field]
            if field in p.columns
            else np.full(len(p.columns["kind"]), spec.default, dtype=spec.dtype)
            for p in parts
        ]
        columns[field] = np.concatenate(chunks).astype(spec.dtype, copy=False)
    assert len(columns["kind"]) == n_total

    def args_provider() -> tuple[np.ndarray, tuple]:
        from polyprof.events import intern_column

        values: list[str | None] = []
        for p in parts:
            values.extend(p.args())
        return intern_column(values)

    return EventBatch.build(source, columns, {"name": tuple(names)}, {"args": args_provider})
