"""XPU rows from torch's own collector result (polyprof_xpu.kineto): hooks, session, decoding.

No Intel GPU exists here: an XPU build of torch is stood in for by its build record
(``torch_support.installed_build``) and ``kineto.device_reason``; torch's CPU build accepts
``ProfilerActivity.XPU`` in its collector and records no device rows, so the session path is
real, and the decoding, tables and traces are fed ``_KinetoEvent`` stand-ins shaped like
torch's (``kineto_standins.py``).
"""

from __future__ import annotations

import json

import pytest
from kineto_standins import PID, QUEUE, ROWS, KinetoEvent, KinetoEvent211, Raw

from polyprof.base import torch_support
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import DeviceType, EventKind, concat
from polyprof.runtime.torch_result import CollectorResult
from polyprof.testing import make_trace

torch = pytest.importorskip("torch")
from polyprof_xpu import kineto  # noqa: E402
from polyprof_xpu import plugin as xpu_plugin  # noqa: E402

XPU_BUILD = torch_support.TorchBuild("2.15.0+xpu", xpu="20250301")
XPU_AND_CPU = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.XPU})


@pytest.fixture
def xpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """An XPU build of torch, as the plugin sees it; whether it sees a device is up to the test."""
    monkeypatch.setattr(torch_support, "installed_build", lambda: XPU_BUILD)
    monkeypatch.delenv("IPEX_ZE_TRACING", raising=False)


# ------------------------------------------------------------- the plugin in Kineto mode


def test_with_an_xpu_build_xpu_comes_from_torchs_collector(
    xpu_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto, "device_reason", lambda: None)
    caps = xpu_plugin.polyprof_capabilities()
    assert caps.unavailable_reason is None
    assert caps.mode == "via torch's Kineto (torch 2.15.0+xpu, XPU 20250301)"
    assert xpu_plugin.polyprof_torch_collector_activities(XPU_AND_CPU) == ["XPU"]
    assert [type(t) for t in xpu_plugin.polyprof_make_tracers(XPU_AND_CPU)] == [kineto.KinetoXpuTracer]
    cpu_only = ProfileConfig(activities={ProfilerActivity.CPU})
    assert xpu_plugin.polyprof_torch_collector_activities(cpu_only) is None
    assert xpu_plugin.polyprof_make_tracers(cpu_only) == []


@pytest.mark.slow
def test_the_session_asks_torchs_collector_for_xpu() -> None:
    """In its own process: asking torch's CPU build for XPU leaves Kineto device state behind."""
    from pathlib import Path

    from polyprof.testing import run_pytest_in_child

    path = Path(__file__).resolve().parent / "in_child" / "xpu_sessions.py"
    assert "2 passed" in run_pytest_in_child(str(path))


def _profile_cpu_and_xpu(match: str) -> object:
    import polyprof
    from polyprof.base.user_warnings import ActivityUnavailableWarning
    from polyprof.testing import make_plugin_manager_for_tests

    pm = make_plugin_manager_for_tests(("xpu", xpu_plugin), builtins=True)
    with (
        pytest.warns(ActivityUnavailableWarning, match=match),
        polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU], plugin_manager=pm) as prof,
    ):
        torch.ones(2).add(1)
    assert prof.trace.config.torch_activities == frozenset()
    assert "aten::add" in prof.trace.events.values("name")
    return prof


def test_without_a_device_xpu_is_unavailable_as_torch_says(
    xpu_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto, "device_reason", lambda: "torch 2.15.0+xpu sees no XPU device")
    caps = xpu_plugin.polyprof_capabilities()
    assert caps.unavailable_reason == "torch 2.15.0+xpu sees no XPU device"
    assert xpu_plugin.polyprof_torch_collector_activities(XPU_AND_CPU) is None
    assert xpu_plugin.polyprof_make_tracers(XPU_AND_CPU) == []
    _profile_cpu_and_xpu("sees no XPU device")


def test_ipex_ze_tracing_0_profiles_cpu_only_with_a_warning(
    xpu_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto, "device_reason", lambda: None)
    monkeypatch.setenv("IPEX_ZE_TRACING", "0")
    _profile_cpu_and_xpu("IPEX_ZE_TRACING=0")


def test_xpu_is_synchronized_before_torchs_collector_stops_only_when_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As torch.profiler does, so the last kernels are in the result; polyprof never starts the device."""
    synced: list[bool] = []
    monkeypatch.setattr(torch.xpu, "synchronize", lambda *a: synced.append(True))
    monkeypatch.setattr(torch.xpu, "is_initialized", lambda: False)
    kineto.KinetoXpuTracer().before_collector_stops()
    assert synced == []
    monkeypatch.setattr(torch.xpu, "is_initialized", lambda: True)
    kineto.KinetoXpuTracer().before_collector_stops()
    assert synced == [True]


# ------------------------------------------------------------- decoding torch's rows


def test_the_xpu_rows_of_a_result_with_torchs_links() -> None:
    batch = kineto.decode_xpu_rows(CollectorResult(Raw()), pid=PID)
    names = batch.values("name")
    assert names == [r[0] for r in ROWS if r[1] != "cpu_op"]
    kinds = dict(zip(names, batch["kind"].tolist(), strict=True))
    assert kinds["urEnqueueKernelLaunch"] == EventKind.RUNTIME
    assert kinds["zeCommandListAppendLaunchKernel"] == EventKind.DRIVER
    assert kinds["gemm_kernel"] == EventKind.KERNEL
    assert kinds["Memcpy M2D (Host (User Allocated) -> Device)"] == EventKind.GPU_MEMCPY
    assert kinds["Memset (0 -> Device)"] == EventKind.GPU_MEMSET
    assert kinds["zeEventHostSynchronize"] == EventKind.SYNC
    assert kinds["Buffer Flush"] == EventKind.OVERHEAD
    kernel = names.index("gemm_kernel")  # on (device, queue)
    assert (batch["pid"][kernel], batch["tid"][kernel], batch["stream"][kernel]) == (0, QUEUE, QUEUE)
    assert batch["device_type"][kernel] == DeviceType.XPU
    assert batch["linked_correlation_id"][kernel] == 1 and batch["correlation_id"][kernel] == 101
    fill = names.index("Memset (0 -> Device)")
    assert (batch["pid"][fill], batch["device_index"][fill]) == (1, 1)
    launch = names.index("urEnqueueKernelLaunch")  # on (process, OS thread)
    assert (batch["pid"][launch], batch["tid"][launch]) == (PID, 777)
    assert batch["device_type"][launch] == DeviceType.CPU
    assert batch.values("activity_type") == [r[1] for r in ROWS if r[1] != "cpu_op"]


def test_before_2_12_the_device_rows_by_device_type_and_the_calls_by_name() -> None:
    """No activity type there: SYCL and Level Zero calls are CPU-tagged rows, told by their names."""
    batch = kineto.decode_xpu_rows(CollectorResult(Raw(event_type=KinetoEvent211)), pid=PID)
    got = dict(zip(batch.values("name"), batch.values("activity_type"), strict=True))
    assert got == {
        "urEnqueueKernelLaunch": "xpu_runtime",
        "zeCommandListAppendLaunchKernel": "xpu_driver",
        "gemm_kernel": "kernel",
        "urEnqueueUSMMemcpy": "xpu_runtime",
        "Memcpy M2D (Host (User Allocated) -> Device)": "gpu_memcpy",
        "zeEventHostSynchronize": "xpu_driver",  # a Level Zero call by its name
        "urEnqueueUSMFill": "xpu_runtime",
        "Memset (0 -> Device)": "gpu_memset",
        "relu_kernel": "kernel",
    }
    assert (batch["external_id"] == batch["linked_correlation_id"]).all()


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("urEnqueueKernelLaunch", EventKind.RUNTIME),
        ("piEnqueueKernelLaunch", EventKind.RUNTIME),
        ("zeCommandListAppendLaunchKernel", EventKind.DRIVER),
        ("aten::zeros", None),
        ("zeros", None),
        ("urllib.py(3): open", None),
        ("Buffer Flush", None),  # overhead has no API name: it stays a CPU row before 2.12
    ],
)
def test_before_2_12_only_api_names_are_claimed(name: str, kind: EventKind | None) -> None:
    assert kineto.host_row_kind(name) == kind


def test_the_cpu_tracer_leaves_the_xpu_rows_to_the_xpu_tracer() -> None:
    """Each row of one result is decoded exactly once, by the CPU or the XPU tracer."""
    from polyprof.runtime import torch_cpu
    from polyprof.runtime.torch_result import DeviceRowClaims

    claims = DeviceRowClaims.of([kineto.KinetoXpuTracer()])
    ops = [r[0] for r in ROWS if r[1] == "cpu_op"]
    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.XPU}, torch_activities={"XPU"})
    if torch_support.installed().has_accessor("activity_type"):
        cpu_batch, _ = torch_cpu.decode_result(Raw(), config, pid=PID, claims=claims)
        assert cpu_batch.values("name") == ops
    # before 2.12 (by names): PTI's overhead row has none the XPU tracer claims; torch lists it as a CPU row
    events = Raw(event_type=KinetoEvent211).events()
    kept = [ev.name() for ev in claims.host_rows(events, None)]
    assert kept == [*ops, "Buffer Flush"]
    taken = kineto.decode_xpu_rows(CollectorResult(Raw(event_type=KinetoEvent211)), pid=PID).values("name")
    assert sorted(kept + taken) == sorted(r[0] for r in ROWS)


def test_xpu_rows_torch_tags_cuda_are_still_xpu_rows() -> None:
    """Releases before Kineto's XPU branch of deviceTypeFromActivity tag XPU kernels CUDA."""
    from torch._C._autograd import DeviceType as TorchDeviceType

    kernel = KinetoEvent(("gemm_kernel", "kernel", 0, 400, 1400, 11, 1, QUEUE))
    kernel._device = TorchDeviceType.CUDA
    raw = Raw([])
    raw._events = [kernel]
    batch = kineto.decode_xpu_rows(CollectorResult(raw), pid=PID)
    assert batch.values("name") == ["gemm_kernel"]
    assert batch["device_type"].tolist() == [int(DeviceType.XPU)]


def test_another_devices_rows_are_not_xpu_rows() -> None:
    rows = [
        ("host_kernel", "kernel", None, 500, 600, 13, 1, 555),  # a CPU-tagged "kernel": no XPU row
        ("cudaLaunchKernel", "cuda_runtime", None, 600, 700, 13, 1, 777),
        ("gemm_kernel", "kernel", 0, 400, 1400, 11, 1, QUEUE),
    ]
    batch = kineto.decode_xpu_rows(CollectorResult(Raw(rows)), pid=PID)
    assert batch.values("name") == ["gemm_kernel"]


# ------------------------------------------------------------- tables and traces from those rows


def _trace():
    """The stand-in result decoded as a session decodes it: the CPU tracer's rows and the XPU tracer's."""
    from polyprof.runtime import torch_cpu
    from polyprof.runtime.torch_result import DeviceRowClaims

    result = CollectorResult(Raw())
    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.XPU}, torch_activities={"XPU"})
    claims = DeviceRowClaims.of([kineto.KinetoXpuTracer()])
    cpu_batch, _ = torch_cpu.decode_result(result.raw, config, pid=PID, claims=claims)
    xpu_batch = kineto.decode_xpu_rows(result, pid=PID)
    return make_trace(concat([cpu_batch, xpu_batch]), config=config, start_ns=500, pid=PID)


def test_each_op_gets_the_xpu_time_of_the_work_it_launched_only() -> None:
    from polyprof.analysis.results import ProfileResults

    averages = ProfileResults(traces=(_trace(),), use_device="xpu").key_averages()
    self_xpu = {row.key: row.self_device_time_total for row in averages}
    assert self_xpu["aten::mm"] == pytest.approx(50.0)  # its kernel
    # its copy: not the host wait, nor the unlinked kernel whose PTI id is the op's id (2)
    assert self_xpu["aten::copy_"] == pytest.approx(2.0)
    assert self_xpu["aten::fill_"] == pytest.approx(0.5)  # its fill, on the other device
    assert {row.key: row.device_time_total for row in averages}["relu_kernel"] == pytest.approx(2.0)
    table = averages.table(sort_by="self_xpu_time_total", row_limit=20)
    for column in ("Self XPU", "Self XPU %", "XPU total", "XPU time avg", "Self XPU time total:"):
        assert column in table


def test_the_chrome_trace_is_kineto_shaped_for_xpu(tmp_path) -> None:
    from polyprof.runtime.chrome_trace import ChromeTraceExporter

    path = tmp_path / "trace.json"
    ChromeTraceExporter().export(_trace(), str(path))
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert {"kernel", "gpu_memcpy", "gpu_memset", "xpu_runtime", "xpu_driver"} <= {e["cat"] for e in events}
    device_rows = [e for e in events if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    # one process per device, a thread per queue, the launching op's id
    assert {(e["pid"], e["tid"], e["args"]["stream"]) for e in device_rows} == {
        (0, QUEUE, QUEUE),
        (1, QUEUE, QUEUE),
    }
    gemm = next(e for e in device_rows if e["name"] == "gemm_kernel")
    assert gemm["args"]["External id"] == 1
    flows = [e for e in trace["traceEvents"] if e.get("cat") == "ac2g"]
    assert flows, "runtime -> device flows"
