"""Helpers for polyprof-cuda tests: real cupti-python record objects and a fake CUPTI facade.

Test modules import this (``from cupti_fakes import ...``); importing it skips
the module when cupti-python is not installed.

No test here needs a GPU or a driver. Records are instances of cupti-python's
own record classes (they construct and take attribute writes without a
driver, cupti.md §5 tier 2); the ``FakeCupti`` facade stands in for the calls
that need a driver, and delivers queued buffers through the tracer's real
callbacks on the thread that flushes, as CUPTI does.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from typing import Any

import pytest

C = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install cupti-python)")

from polyprof_cuda.cupti_api import CuptiApi, SubscriberConflict

K = C.ActivityKind

#: Record classes of each family present in this cupti-python (names change between releases).
KERNEL_CLASSES = [n for n in (f"ActivityKernel{i}" for i in range(4, 20)) if hasattr(C, n)]
MEMCPY_CLASSES = [n for n in (f"ActivityMemcpy{i}" for i in range(3, 12)) if hasattr(C, n)]
MEMCPY_PTOP_CLASSES = [n for n in (f"ActivityMemcpyPtoP{i}" for i in range(2, 8)) if hasattr(C, n)]
MEMSET_CLASSES = [n for n in (f"ActivityMemset{i}" for i in range(2, 9)) if hasattr(C, n)]
SYNC_CLASSES = [
    n
    for n in ("ActivitySynchronization", "ActivitySynchronization2", "ActivitySynchronization3")
    if hasattr(C, n)
]
OVERHEAD_CLASSES = [n for n in (f"ActivityOverhead{i}" for i in range(1, 6)) if hasattr(C, n)]

RUNTIME_LAUNCH = int(C.runtime_api_trace_cbid.cudaLaunchKernel_v7000)
RUNTIME_MEMCPY_ASYNC = int(C.runtime_api_trace_cbid.cudaMemcpyAsync_v3020)
RUNTIME_GET_LAST_ERROR = int(C.runtime_api_trace_cbid.cudaGetLastError_v3020)
DRIVER_LAUNCH = int(C.driver_api_trace_cbid.cuLaunchKernel)
DRIVER_CTX_GET_DEVICE = int(C.driver_api_trace_cbid.cuCtxGetDevice)


def record(cls_name: str, kind: Any, **fields: Any) -> Any:
    """An instance of cupti-python's record class ``cls_name`` with ``fields`` set."""
    rec = getattr(C, cls_name)()
    rec.kind = int(kind)
    for name, value in fields.items():
        setattr(rec, name, value)
    return rec


def kernel(cls_name: str = "", **fields: Any) -> Any:
    defaults = {
        "start": 2_000,
        "end": 5_000,
        "device_id": 0,
        "context_id": 1,
        "stream_id": 7,
        "correlation_id": 11,
        "grid_x": 128,
        "grid_y": 1,
        "grid_z": 1,
        "block_x": 256,
        "block_y": 1,
        "block_z": 1,
        "registers_per_thread": 32,
        "static_shared_memory": 1024,
        "dynamic_shared_memory": 4096,
        "name": "void gemm_kernel<float>(int)",
    }
    return record(cls_name or KERNEL_CLASSES[-1], K.CONCURRENT_KERNEL, **{**defaults, **fields})


def memcpy(cls_name: str = "", **fields: Any) -> Any:
    defaults = {
        "start": 600, "end": 900, "device_id": 0, "context_id": 1, "stream_id": 7, "correlation_id": 6, "bytes": 4096,
        "copy_kind": int(C.ActivityMemcpyKind.HTOD), "src_kind": int(C.ActivityMemoryKind.PAGEABLE),
        "dst_kind": int(C.ActivityMemoryKind.DEVICE),
    }  # fmt: skip
    return record(cls_name or MEMCPY_CLASSES[-1], K.MEMCPY, **{**defaults, **fields})


def memset(cls_name: str = "", **fields: Any) -> Any:
    defaults = {
        "start": 1_000, "end": 1_200, "device_id": 0, "context_id": 1, "stream_id": 7, "correlation_id": 8, "bytes": 2048, "value": 0,
        "memory_kind": int(C.ActivityMemoryKind.DEVICE),
    }  # fmt: skip
    return record(cls_name or MEMSET_CLASSES[-1], K.MEMSET, **{**defaults, **fields})


def api_call(kind: Any = None, **fields: Any) -> Any:
    defaults = {
        "cbid": RUNTIME_LAUNCH, "start": 1_000, "end": 1_500, "process_id": 11, "thread_id": threading.get_native_id(),
        "correlation_id": 11,
    }  # fmt: skip
    return record("ActivityAPI", K.RUNTIME if kind is None else kind, **{**defaults, **fields})


def sync(cls_name: str = "", **fields: Any) -> Any:
    defaults = {
        "start": 6_000, "end": 7_000, "context_id": 1, "stream_id": 7, "correlation_id": 12,
        "type": int(C.ActivitySynchronizationType.STREAM_SYNCHRONIZE),
    }  # fmt: skip
    return record(cls_name or SYNC_CLASSES[-1], K.SYNCHRONIZATION, **{**defaults, **fields})


def overhead(cls_name: str = "", **fields: Any) -> Any:
    defaults = {
        "start": 100,
        "end": 400,
        "correlation_id": 0,
        "overhead_kind": int(C.ActivityOverheadKind.ACTIVITY_BUFFER_REQUEST),
    }
    return record(cls_name or OVERHEAD_CLASSES[-1], K.OVERHEAD, **{**defaults, **fields})


class FakeCupti(CuptiApi):
    """The CUPTI facade with every driver-dependent call replaced.

    ``queue(records)`` stages a buffer; ``flush_all`` delivers staged buffers
    through the registered callbacks on the flushing thread (or on a separate
    "CUPTI worker" thread when ``deliver_on_worker``), as CUPTI does.
    """

    def __init__(
        self,
        *,
        conflict: str | None | bool = False,
        reject_runtime: bool = False,
        clock_offset_ns: int = 0,
        system_thread_ids: bool = True,
        dropped: int = 0,
        deliver_on_worker: bool = False,
        fail_enable: BaseException | None = None,
    ) -> None:
        super().__init__()
        self.conflict = conflict
        self.reject_runtime = reject_runtime
        self.clock_offset_ns = clock_offset_ns
        self.system_thread_ids = system_thread_ids
        self.dropped = dropped
        self.deliver_on_worker = deliver_on_worker
        self.fail_enable = fail_enable
        self.calls: list[tuple] = []
        self.enabled: set[int] = set()
        self.callbacks: tuple | None = None
        self.subscribed = False
        self._pending: list[list] = []
        self._lock = threading.Lock()
        self.delivery_threads: list[str] = []
        self._corr = itertools.count(1000)

    # staged data
    def queue(self, records: Iterable[Any]) -> None:
        with self._lock:
            self._pending.append(list(records))

    def next_correlation(self) -> int:
        return next(self._corr)

    # driver-dependent calls
    def get_timestamp(self) -> int:
        return time.time_ns() - self.clock_offset_ns

    def device_count(self) -> int:
        return 1

    def subscribe(self, name: str) -> Any:
        self.calls.append(("subscribe", name))
        if self.conflict is not False:
            raise SubscriberConflict(
                self.conflict or None, "another CUPTI client already holds the subscriber"
            )
        self.subscribed = True
        return "subscriber-handle"

    def unsubscribe(self, handle: Any) -> None:
        self.calls.append(("unsubscribe", handle))
        self.subscribed = False

    def set_thread_id_type_system(self) -> None:
        self.calls.append(("set_thread_id_type_system",))
        if not self.system_thread_ids:
            raise C.cuptiError(int(C.Result.ERROR_NOT_SUPPORTED))

    def register_callbacks(self, request: Any, complete: Any) -> None:
        self.calls.append(("register_callbacks",))
        self.callbacks = (request, complete)

    def enable_kind(self, kind: int) -> None:
        if self.fail_enable is not None:
            raise self.fail_enable
        if self.reject_runtime and kind == int(K.RUNTIME):
            raise NotImplementedError("Activity Kind RUNTIME not supported")
        self.calls.append(("enable", kind))
        self.enabled.add(kind)

    def disable_kind(self, kind: int) -> None:
        self.calls.append(("disable", kind))
        self.enabled.discard(kind)

    def enable_runtime_cbid(self, cbid: int, enable: bool) -> None:
        self.calls.append(("runtime_cbid", cbid, enable))

    def enable_driver_cbid(self, cbid: int, enable: bool) -> None:
        self.calls.append(("driver_cbid", cbid, enable))

    def flush_all(self, forced: bool) -> None:
        self.calls.append(("flush", forced))
        with self._lock:
            buffers, self._pending = self._pending, []
        if not buffers or self.callbacks is None:
            return
        request, complete = self.callbacks

        def deliver() -> None:
            self.delivery_threads.append(threading.current_thread().name)
            for buf in buffers:
                size, _max_records = request()
                assert size > 0
                complete(buf)

        if self.deliver_on_worker:
            worker = threading.Thread(target=deliver, name="fake-cupti-worker")
            worker.start()
            worker.join()
        else:
            deliver()

    def dropped_records(self) -> int:
        dropped, self.dropped = self.dropped, 0
        return dropped
