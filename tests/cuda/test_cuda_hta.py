"""Holistic Trace Analysis reads polyprof's CUDA Chrome traces (skipped when HTA is not installed).

The trace comes from CUPTI records (cupti-python record objects shaped like a
small training step: a host-to-device copy, a memset, GEMM and elementwise
kernels on two streams, a device-to-host copy) decoded by polyprof-cuda,
linked to torch-style CPU ops by the core and written by polyprof's
chrome_trace exporter. HTA's temporal, kernel and idle-time breakdowns must
find the GPU work in it. These records are synthetic, not captured on a GPU.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from cupti_fakes import RUNTIME_LAUNCH, RUNTIME_MEMCPY_ASYNC, C, api_call, kernel, memcpy, memset

pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")

from hta.trace_analysis import TraceAnalysis
from polyprof.activity import ProfilerActivity
from polyprof.attribution import link_launches
from polyprof.config import ProfileConfig
from polyprof.events import EventBatch, EventKind, concat
from polyprof.plugins.chrome_trace import ChromeTraceExporter
from polyprof.testing import make_trace
from polyprof_cuda.cbids import ApiCallFilter
from polyprof_cuda.cupti_api import CuptiApi
from polyprof_cuda.decode import RecordDecoder

BASE = 1_700_000_000 * 10**9
US = 1_000
TID = 4321
RUNTIME_MEMSET_ASYNC = int(C.runtime_api_trace_cbid.cudaMemsetAsync_v3020)

#: (op name, op start µs, op end µs, [(api cbid, device record factory, kwargs)]) for two steps.
STEP = [
    ("aten::copy_", 0, 40, [(RUNTIME_MEMCPY_ASYNC, memcpy, {"bytes": 1 << 20})]),
    ("aten::zero_", 45, 60, [(RUNTIME_MEMSET_ASYNC, memset, {"bytes": 1 << 16})]),
    ("aten::mm", 70, 120, [(RUNTIME_LAUNCH, kernel, {"name": "ampere_sgemm_64x64_nn"})]),
    ("aten::relu", 125, 140, [(RUNTIME_LAUNCH, kernel, {"name": "void at::native::vectorized_elementwise_kernel<4>()"})]),
    ("aten::add", 145, 160, [(RUNTIME_LAUNCH, kernel, {"name": "void at::native::elementwise_kernel<128, 2>()", "stream_id": 13})]),
    ("aten::copy_", 165, 200, [(RUNTIME_MEMCPY_ASYNC, memcpy, {"bytes": 1 << 10, "copy_kind": 2, "src_kind": 3, "dst_kind": 2})]),
]  # fmt: skip


def build_trace():
    ops, records = [], []
    corr = 0
    gpu = BASE + 10 * US
    for step in range(2):
        offset = step * 400
        ops.append((f"ProfilerStep#{step}", offset, offset + 380, EventKind.USER_ANNOTATION))
        for name, s, e, launches in STEP:
            ops.append((name, offset + s, offset + e, EventKind.CPU_OP))
            for cbid, factory, extra in launches:
                corr += 1
                api_start = BASE + (offset + s + 2) * US
                records.append(
                    api_call(
                        cbid=cbid, start=api_start, end=api_start + 5 * US, thread_id=TID, correlation_id=corr
                    )
                )
                gpu = max(gpu, api_start + 8 * US)
                dur = 30 * US
                records.append(factory(start=gpu, end=gpu + dur, correlation_id=corr, **extra))
                gpu += dur + 20 * US
    n = len(ops)
    cpu = EventBatch.build(
        "torch_cpu",
        {
            "kind": np.array([int(k) for *_, k in ops], dtype=np.int8),
            "name": np.arange(n, dtype=np.int32),
            "start_ns": np.array([BASE + s * US for _, s, _, _ in ops], dtype=np.int64),
            "dur_ns": np.array([(e - s) * US for _, s, e, _ in ops], dtype=np.int64),
            "pid": np.full(n, 99, dtype=np.int64),
            "tid": np.full(n, TID, dtype=np.int64),
            "thread": np.ones(n, dtype=np.int64),
            "correlation_id": np.arange(1, n + 1, dtype=np.int64),
        },
        {"name": tuple(name for name, *_ in ops)},
    )
    api = CuptiApi()
    runtime, driver = api.runtime_cbids(), api.driver_cbids()
    decoder = RecordDecoder(
        kinds=api.kind_values(), runtime_names=runtime, driver_names=driver,
        api_filter=ApiCallFilter.build(runtime, driver, runtime_recorded=True, keep_all=False), pid=99,
    )  # fmt: skip
    cuda, stats = decoder.decode(records)
    assert stats.rows == len(records)
    events = concat(link_launches([cpu, cuda]))
    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA})
    return make_trace(events, config=config, pid=99)


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("hta")
    ChromeTraceExporter().export(build_trace(), str(trace_dir / "rank0.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TraceAnalysis(trace_dir=str(trace_dir))


def test_temporal_breakdown_sees_gpu_busy_time(analysis):
    df = analysis.get_temporal_breakdown(visualize=False)
    row = df.iloc[0]
    # Per step: 3 kernels (compute) and 3 memcpy/memset (non-compute) of 30 µs each. HTA analyses
    # whole ProfilerStep iterations (it leaves out the last one here), so one or two steps count.
    steps = row["compute_time(us)"] / 90
    assert steps in (1, 2)
    assert row["non_compute_time(us)"] == pytest.approx(90 * steps)
    assert row["idle_time(us)"] > 0


def test_kernel_breakdown_classifies_kernels_and_memory_activity(analysis):
    kernel_type_df, kernel_df = analysis.get_gpu_kernel_breakdown(visualize=False)
    types = set(kernel_type_df["kernel_type"])
    assert {"COMPUTATION", "MEMORY"} <= types
    assert dict(zip(kernel_type_df["kernel_type"], kernel_type_df["sum"]))["COMPUTATION"] > 0
    names = set(kernel_df["name"])
    assert "ampere_sgemm_64x64_nn" in names
    assert any(n.startswith("Memcpy HtoD") for n in names) and any(n.startswith("Memset") for n in names)


def test_idle_time_breakdown_covers_both_streams(analysis):
    result = analysis.get_idle_time_breakdown(visualize=False)
    idle = result[0] if isinstance(result, tuple) else result
    assert {7, 13} <= set(idle["stream"].astype(int))
