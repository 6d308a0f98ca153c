"""Holistic Trace Analysis reads polyprof's CUDA Chrome traces (skipped when HTA is not installed).

The trace comes from torch's collector result as polyprof-cuda reads it in Kineto mode: a raw
result of ``_KinetoEvent`` stand-ins (torch 2.15's accessors, test_cuda_kineto_mode.py) for two
steps of a small training step: a host-to-device copy, a memset, GEMM and elementwise kernels on
two streams, a device-to-host copy and a stream sync, each launched by a runtime call that torch's
external correlation links to its op. The CPU decoder (``torch_cpu.decode_result``) and
polyprof-cuda's (``kineto.decode_cuda_rows``) split it as in a session, and polyprof's
chrome_trace exporter writes it. HTA's temporal, kernel and idle-time breakdowns must find the GPU
work in it. These rows are synthetic, not captured on a GPU.
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
pytest.importorskip("torch")

from hta.trace_analysis import TraceAnalysis
from test_cuda_kineto_mode import OS_TID, PID, KinetoEvent

from polyprof.base.activity import ProfilerActivity
from polyprof.base.attribution import link_launches
from polyprof.base.config import ProfileConfig
from polyprof.base.events import concat
from polyprof.runtime import torch_cpu
from polyprof.runtime.chrome_trace import ChromeTraceExporter
from polyprof.runtime.torch_result import CollectorResult
from polyprof.testing import make_trace
from polyprof_cuda import kineto

BASE = 1_700_000_000 * 10**9
US = 1_000
GPU_US = 30  # every device activity below lasts 30 µs
GAP_US = 20  # between one device activity and the next

#: (op, op start µs, op end µs, runtime call, device row's name, its activity type, stream) per step.
STEP = [
    ("aten::copy_", 0, 40, "cudaMemcpyAsync", "Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 7),
    ("aten::zero_", 45, 60, "cudaMemsetAsync", "Memset (Device)", "gpu_memset", 7),
    ("aten::mm", 70, 120, "cudaLaunchKernel", "ampere_sgemm_64x64_nn", "kernel", 7),
    ("aten::relu", 125, 140, "cudaLaunchKernel", "void at::native::vectorized_elementwise_kernel<4>()", "kernel", 7),  # noqa: E501
    ("aten::add", 145, 160, "cudaLaunchKernel", "void at::native::elementwise_kernel<128, 2>()", "kernel", 13),  # noqa: E501
    ("aten::copy_", 165, 380, "cudaMemcpyAsync", "Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 7),
]  # fmt: skip


def step_rows() -> list[tuple]:
    """Two steps' rows, as ``KinetoEvent`` takes them: (name, activity type, on device, start ns,
    end ns, correlation id, linked op id, stream or OS thread)."""
    rows: list[tuple] = []
    op_id, cupti_id = 0, 100
    gpu = BASE + 10 * US

    def op(name: str, kind: str, start_us: int, end_us: int) -> int:
        nonlocal op_id
        op_id += 1
        rows.append((name, kind, 0, BASE + start_us * US, BASE + end_us * US, op_id, 0, OS_TID))
        return op_id

    for step in range(2):
        at = step * 400
        op(f"ProfilerStep#{step}", "user_annotation", at, at + 390)
        for name, start, end, call, device_name, device_kind, stream in STEP:
            launcher = op(name, "cpu_op", at + start, at + end)
            cupti_id += 1
            call_start = BASE + (at + start + 2) * US
            rows.append(
                (call, "cuda_runtime", 0, call_start, call_start + 5 * US, cupti_id, launcher, OS_TID)
            )
            gpu = max(gpu, call_start + 8 * US)
            rows.append((device_name, device_kind, 1, gpu, gpu + GPU_US * US, cupti_id, launcher, stream))
            done = gpu + GPU_US * US
            gpu = done + GAP_US * US
        # .item() in the D2H copy's op: the host waits on stream 7 until the copy is done
        cupti_id += 1
        sync_start = BASE + (at + 175) * US
        rows.append(
            ("cudaStreamSynchronize", "cuda_runtime", 0, sync_start, done + US, cupti_id, launcher, OS_TID)
        )
        rows.append(("Stream Sync", "cuda_sync", 1, sync_start + US, done, cupti_id, launcher, 7))
    return rows


class Raw:
    """A ``_ProfilerResult`` stand-in holding the rows above."""

    def __init__(self) -> None:
        self._events = [KinetoEvent(row) for row in step_rows()]

    def events(self) -> list[KinetoEvent]:
        return self._events

    def trace_start_ns(self) -> int:
        return BASE


def build_trace():
    """The trace a session makes of ``Raw``: both decoders, the core's linking, one trace."""
    if not torch_cpu.torch_support.installed().has_accessor("activity_type"):
        pytest.skip("the host/device split by activity type needs torch 2.12+")
    config = ProfileConfig(
        activities={ProfilerActivity.CPU, ProfilerActivity.CUDA}, torch_activities={"CUDA"}
    )
    result = CollectorResult(Raw())
    cpu, _ = torch_cpu.decode_result(result.raw, config, pid=PID)
    cuda = kineto.decode_cuda_rows(result, pid=PID)
    events = concat(link_launches([cpu, cuda]))  # torch linked these rows: the core leaves them
    return make_trace(events, config=config, start_ns=BASE, pid=PID)


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
    steps = row["compute_time(us)"] / (3 * GPU_US)
    assert steps in (1, 2)
    # HTA counts the Stream Sync row (cuda_sync) as non-compute GPU time too: here it adds the two
    # gaps it spans where no other device work runs (the relu kernel's end to the copy's end).
    assert row["non_compute_time(us)"] == pytest.approx((3 * GPU_US + 2 * GAP_US) * steps)
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
