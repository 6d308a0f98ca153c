"""Child process of test_cuda_real_binding.py: a polyprof session through the REAL cupti-python.

Runs under ``LD_PRELOAD=<fake libcupti.so.13>`` and ``LD_LIBRARY_PATH=<dir of the stub
libcuda.so.1>`` (see native/*.c): cupti-python's own C trampolines register the plugin's
buffer callbacks with the test double, which hands them buffers laid out with cupti-python's
own numpy dtypes, on the flushing thread or on a native thread Python never saw. Nothing
in polyprof or polyprof-cuda is patched: the plugin is found through its entry point.

Usage: ``python real_binding_child.py SCENARIO OUT_JSON`` where SCENARIO is one of
``session`` (torch ops that "launch" kernels, copies and a filtered call), ``conflict``
(another tool holds the CUPTI subscriber) or ``probe`` (the availability answer only).
Writes one JSON object to OUT_JSON for the parent to check.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
from cupti import cupti as C

FAKE = ctypes.CDLL("libcupti.so.13")  # the preloaded test double (dlopen returns the same handle)
FAKE.fake_intern.restype = ctypes.c_void_p
FAKE.fake_intern.argtypes = [ctypes.c_char_p]
FAKE.fake_queue.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
FAKE.fake_call_log.restype = ctypes.c_char_p
FAKE.fake_delivery_tid.restype = ctypes.c_long
FAKE.fake_hold_subscriber.argtypes = [ctypes.c_char_p]

K = C.ActivityKind
CUDA_LAUNCH = int(C.runtime_api_trace_cbid.cudaLaunchKernel_v7000)
CUDA_MEMCPY_ASYNC = int(C.runtime_api_trace_cbid.cudaMemcpyAsync_v3020)
CUDA_GET_DEVICE = int(C.runtime_api_trace_cbid.cudaGetDevice_v3020)  # Kineto switches it off at the source
KERNEL_DTYPE = next(
    getattr(C, f"activity_kernel{i}_dtype")
    for i in range(20, 8, -1)
    if hasattr(C, f"activity_kernel{i}_dtype")
)
MEMCPY_DTYPE = next(
    getattr(C, f"activity_memcpy{i}_dtype")
    for i in range(12, 4, -1)
    if hasattr(C, f"activity_memcpy{i}_dtype")
)
STREAM = 7


class Gpu:
    """Queues the records CUPTI would write for launches made on the calling thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._corr = itertools.count(1)
        self._clock = time.time_ns()
        self.names: dict[str, int] = {}
        self.queued: dict[int, int] = {}  # correlation id -> kernel queued timestamp
        self.recorded = 0

    def _api(self, cbid: int, corr: int) -> tuple[int, int]:
        begin = time.time_ns()
        time.sleep(0.0002)  # the launch call takes a little host time
        end = max(time.time_ns(), begin + 1)
        rec = np.zeros(1, C.activity_api_dtype)
        rec["kind"], rec["cbid"], rec["start"], rec["end"] = int(K.RUNTIME), cbid, begin, end
        rec["correlation_id"] = corr
        rec["process_id"] = 1  # thread_id is stamped by the fake, as CUPTI does
        self._put(rec)
        return begin, end

    def _device_slot(self, end: int, dur_ns: int) -> int:
        with self._lock:
            start = self._clock = max(self._clock, end) + 5_000
            self._clock += dur_ns
        return start

    def _put(self, rec: np.ndarray) -> int:
        recorded = FAKE.fake_queue(rec.tobytes(), rec.itemsize)
        assert recorded >= 0, "fake_queue rejected a record"
        self.recorded += recorded
        return recorded

    def _name(self, text: str) -> int:
        if text not in self.names:
            self.names[text] = FAKE.fake_intern(text.encode())
        return self.names[text]

    def launch(self, kernel: str, dur_ns: int) -> None:
        corr = next(self._corr)
        _, end = self._api(CUDA_LAUNCH, corr)
        start = self._device_slot(end, dur_ns)
        rec = np.zeros(1, KERNEL_DTYPE)
        rec["kind"], rec["start"], rec["end"] = int(K.CONCURRENT_KERNEL), start, start + dur_ns
        rec["queued"] = end + 1_000
        rec["device_id"], rec["context_id"], rec["stream_id"], rec["correlation_id"] = 0, 1, STREAM, corr
        rec["grid_x"], rec["grid_y"], rec["grid_z"] = 128, 1, 1
        rec["block_x"], rec["block_y"], rec["block_z"] = 256, 1, 1
        rec["registers_per_thread"], rec["static_shared_memory"], rec["dynamic_shared_memory"] = (
            32,
            1024,
            4096,
        )
        rec["name"] = self._name(kernel)
        with self._lock:
            self.queued[corr] = end + 1_000
        self._put(rec)

    def copy(self, nbytes: int, dur_ns: int) -> None:
        corr = next(self._corr)
        _, end = self._api(CUDA_MEMCPY_ASYNC, corr)
        start = self._device_slot(end, dur_ns)
        rec = np.zeros(1, MEMCPY_DTYPE)
        rec["kind"], rec["start"], rec["end"] = int(K.MEMCPY), start, start + dur_ns
        rec["copy_kind"], rec["src_kind"] = int(C.ActivityMemcpyKind.HTOD), int(C.ActivityMemoryKind.PAGEABLE)
        rec["dst_kind"], rec["bytes"] = int(C.ActivityMemoryKind.DEVICE), nbytes
        rec["device_id"], rec["context_id"], rec["stream_id"], rec["correlation_id"] = 0, 1, STREAM, corr
        self._put(rec)

    def filtered_call(self) -> int:
        """A cudaGetDevice call: CUPTI records it only if the plugin forgot Kineto's source filter."""
        rec = np.zeros(1, C.activity_api_dtype)
        now = time.time_ns()
        rec["kind"], rec["cbid"], rec["start"], rec["end"] = int(K.RUNTIME), CUDA_GET_DEVICE, now, now + 100
        rec["correlation_id"] = next(self._corr)
        return self._put(rec)


def _plugin_info() -> dict:
    from polyprof.registry import make_plugin_manager

    with make_plugin_manager() as pm:
        (info,) = [i for i in pm.plugin_infos() if i.name == "cuda"]
        return {"status": info.status, "reason": info.reason, "distribution": info.distribution}


def session(out: dict) -> None:
    import polyprof
    import torch
    from polyprof import ProfilerActivity
    from polyprof.events import EventKind

    gpu = Gpu()
    lib = torch.library.Library("pfake", "DEF")
    lib.define("gemm(Tensor x, int dur_ns) -> Tensor")
    lib.define("outer(Tensor x, int dur_ns) -> Tensor")
    lib.define("upload(Tensor x, int nbytes) -> Tensor")

    def gemm(x, dur_ns):
        gpu.launch("gemm_kernel", dur_ns)
        return x + 1

    def outer(x, dur_ns):
        gpu.launch("outer_kernel", dur_ns)
        return torch.ops.pfake.gemm(x, 2 * dur_ns)

    def upload(x, nbytes):
        gpu.copy(nbytes, 3_000)
        return x.clone()

    lib.impl("gemm", gemm, "CPU")
    lib.impl("outer", outer, "CPU")
    lib.impl("upload", upload, "CPU")

    worker_tid: list[int] = []

    def worker(x):
        worker_tid.append(threading.get_native_id())
        for _ in range(2):
            torch.ops.pfake.gemm(x, 15_000)

    x = torch.ones(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                torch.ops.pfake.gemm(x, 10_000)
            torch.ops.pfake.upload(x, 4096)
            # CUPTI's worker thread hands a buffer over while the program runs.
            out["native_delivery_rc"] = FAKE.fake_deliver_from_native_thread()
            out["filtered_call_recorded"] = gpu.filtered_call()
            torch.ops.pfake.outer(x, 40_000)
            t = threading.Thread(target=worker, args=(x,), name="launcher")
            t.start()
            t.join()
            out["pending_before_stop"] = FAKE.fake_pending()
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    out["pending_after_stop"] = FAKE.fake_pending()
    out["records_queued"] = gpu.recorded
    out["main_tid"] = threading.get_native_id()
    out["worker_tid"] = worker_tid[0]
    out["python_tids"] = sorted({out["main_tid"], worker_tid[0]})
    out["deliveries"] = [FAKE.fake_delivery_tid(i) for i in range(FAKE.fake_delivery_count())]
    out["queued"] = {str(k): v for k, v in gpu.queued.items()}

    averages = prof.key_averages()
    out["table"] = averages.table(sort_by="self_cuda_time_total", row_limit=20)
    out["ops"] = {
        e.key: {
            "count": e.count,
            "self_device_us": e.self_device_time_total,
            "device_us": e.device_time_total,
        }
        for e in averages
    }
    events = prof.trace.events
    kinds = events["kind"].tolist()
    names = events.values("name")
    tids = events["tid"].tolist()
    out["device_rows"] = sorted(
        n for n, k in zip(names, kinds) if k in (EventKind.KERNEL, EventKind.GPU_MEMCPY)
    )
    out["runtime_rows"] = sorted(n for n, k in zip(names, kinds) if k == EventKind.RUNTIME)
    out["runtime_tids"] = sorted({t for k, t in zip(kinds, tids) if k == EventKind.RUNTIME})
    out["notes"] = list(prof.trace.notes)
    trace_path = Path(out["_dir"]) / "trace.json"
    prof.export_chrome_trace(str(trace_path))
    doc = json.loads(trace_path.read_text())
    out["chrome_kernels"] = [
        {"name": e["name"], "args": e["args"]} for e in doc["traceEvents"] if e.get("cat") == "kernel"
    ]
    out["chrome_flows"] = sorted(e["ph"] for e in doc["traceEvents"] if e.get("cat") == "ac2g")


def conflict(out: dict) -> None:
    import polyprof
    import torch
    from polyprof import ProfilerActivity

    FAKE.fake_hold_subscriber(b"Nsight Systems")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.ones(8).relu()
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    out["ops"] = sorted({e.key for e in prof.key_averages()})
    out["notes"] = list(prof.trace.notes)


def probe(out: dict) -> None:
    from polyprof_cuda.probe import unavailable_reason

    out["reason"] = unavailable_reason()


def main() -> None:
    scenario, target = sys.argv[1], Path(sys.argv[2])
    out: dict = {"_dir": str(target.parent)}
    out["fake_loaded"] = hasattr(FAKE, "fake_queue")
    {"session": session, "conflict": conflict, "probe": probe}[scenario](out)
    if scenario != "probe":
        out["plugin"] = _plugin_info()
        out["call_log"] = FAKE.fake_call_log().decode().splitlines()
    target.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
