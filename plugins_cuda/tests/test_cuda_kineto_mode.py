"""CUDA rows from torch's own collector result (polyprof_cuda.kineto), through stand-ins.

No GPU here: the raw result is a stand-in whose events have exactly the accessors of torch's
``_KinetoEvent`` (2.15's set, and 2.11's, which has no ``activity_type`` or ``external_id``),
filled as Kineto fills them for a CUDA run: an op launches a kernel through
``cudaLaunchKernel`` (its external correlation links both to the op), a ``.item()`` copies the
result back and synchronizes, and CUPTI reports an overhead row.
"""

from __future__ import annotations

import numpy as np
import pytest

from polyprof.analysis.tree import EventTree
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import DeviceType, EventKind, concat
from polyprof.runtime.torch_result import CollectorResult, DeviceRowClaims
from polyprof.testing import KinetoEventStandIn, KinetoEventStandIn211, RawResultStandIn, make_trace

pytest.importorskip("torch")
from polyprof.runtime import torch_cpu
from polyprof_cuda import kineto

PID = 4242
OS_TID = 777
#: (name, activity type, device type, start ns, end ns, correlation id, linked id, stream/OS thread)
ROWS = [
    ("aten::mm", "cpu_op", 0, 1_000, 9_000, 1, 0, OS_TID),
    ("cudaLaunchKernel", "cuda_runtime", 0, 2_000, 3_000, 101, 1, OS_TID),
    ("ampere_sgemm_64x64", "kernel", 1, 4_000, 54_000, 101, 1, 7),
    ("aten::_local_scalar_dense", "cpu_op", 0, 60_000, 900_000, 2, 0, OS_TID),
    ("cudaMemcpyAsync", "cuda_runtime", 0, 61_000, 62_000, 102, 2, OS_TID),
    ("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 1, 63_000, 64_000, 102, 2, 7),
    ("cudaStreamSynchronize", "cuda_runtime", 0, 62_500, 890_000, 103, 2, OS_TID),
    ("Stream Sync", "cuda_sync", 1, 64_000, 864_000, 103, 2, 7),
    ("Activity Buffer Request", "overhead", 0, 65_000, 67_000, 0, 0, 0),
]


class KinetoEvent(KinetoEventStandIn):
    """A CUDA run's ``_KinetoEvent`` (torch 2.15's accessors) from a ``ROWS`` row."""

    def __init__(self, row: tuple) -> None:
        name, activity_type, on_device, start, end, corr, linked, resource = row
        super().__init__(
            name,
            activity_type,
            DeviceType.CUDA if on_device else DeviceType.CPU,
            0 if on_device else PID,
            start,
            end,
            corr,
            linked,
            resource,
            start_thread_id=0 if activity_type == "overhead" else 1,
        )


class KinetoEvent211(KinetoEventStandIn211, KinetoEvent):
    """The same row as torch 2.11 gives it: no activity_type, no external_id."""


class Raw(RawResultStandIn):
    def __init__(self, event_type: type = KinetoEvent) -> None:
        super().__init__([event_type(row) for row in ROWS])


def test_the_cuda_rows_of_a_result_with_torchs_links() -> None:
    batch = kineto.decode_cuda_rows(CollectorResult(Raw()), pid=PID)
    names = batch.values("name")
    assert names == [r[0] for r in ROWS if r[1] not in ("cpu_op",)]
    kinds = dict(zip(names, batch["kind"].tolist(), strict=True))
    assert kinds["ampere_sgemm_64x64"] == EventKind.KERNEL
    assert kinds["cudaLaunchKernel"] == EventKind.RUNTIME
    assert kinds["Stream Sync"] == EventKind.SYNC
    assert kinds["Activity Buffer Request"] == EventKind.OVERHEAD
    kernel = names.index("ampere_sgemm_64x64")
    assert (batch["pid"][kernel], batch["tid"][kernel], batch["stream"][kernel]) == (0, 7, 7)
    assert batch["device_type"][kernel] == DeviceType.CUDA
    assert batch["linked_correlation_id"][kernel] == 1 and batch["correlation_id"][kernel] == 101
    # each row is marked as one torch's collector recorded (the tree follows torch's rules for those)
    assert batch.values("activity_type") == [r[1] for r in ROWS if r[1] != "cpu_op"]
    sync = names.index("Stream Sync")  # on its stream's lane, as Kineto draws it
    assert (batch["pid"][sync], batch["tid"][sync], batch["device_type"][sync]) == (0, 7, DeviceType.CUDA)
    launch = names.index("cudaLaunchKernel")
    assert (batch["pid"][launch], batch["tid"][launch]) == (PID, OS_TID)
    assert batch["device_type"][launch] == DeviceType.CPU


def test_before_2_12_the_device_rows_by_device_type() -> None:
    batch = kineto.decode_cuda_rows(CollectorResult(Raw(KinetoEvent211)), pid=PID)
    got = dict(zip(batch.values("name"), batch["kind"].tolist(), strict=True))
    # Runtime calls and the overhead row are CPU-tagged there, told by Kineto's names. A device
    # row has no other type to tell by: a sync row (only with enable_cuda_sync_events) counts as
    # device time there, as torch < 2.12 counts it.
    assert got == {
        "cudaLaunchKernel": EventKind.RUNTIME,
        "ampere_sgemm_64x64": EventKind.KERNEL,
        "cudaMemcpyAsync": EventKind.RUNTIME,
        "Memcpy DtoH (Device -> Pageable)": EventKind.GPU_MEMCPY,
        "cudaStreamSynchronize": EventKind.RUNTIME,
        "Stream Sync": EventKind.KERNEL,
        "Activity Buffer Request": EventKind.OVERHEAD,
    }
    assert (batch["external_id"] == batch["linked_correlation_id"]).all()
    assert batch.values("activity_type") == [
        "cuda_runtime",
        "kernel",
        "cuda_runtime",
        "gpu_memcpy",
        "cuda_runtime",
        "kernel",
        "overhead",
    ]
    launch = batch.values("name").index("cudaLaunchKernel")  # on its OS thread, in the trace as cuda_runtime
    assert (batch["pid"][launch], batch["tid"][launch], batch["device_type"][launch]) == (PID, OS_TID, 0)


@pytest.mark.parametrize("event_type", [KinetoEvent, KinetoEvent211], ids=["2.15", "2.11"])
def test_the_cpu_and_cuda_tracers_take_each_row_of_a_result_once(event_type: type) -> None:
    events = Raw(event_type).events()
    types = [ev.activity_type() for ev in events] if event_type is KinetoEvent else None
    claims = DeviceRowClaims.of([kineto.KinetoCudaTracer()])
    host = [ev.name() for ev in claims.host_rows(events, types)]
    device = kineto.decode_cuda_rows(CollectorResult(Raw(event_type)), pid=PID).values("name")
    assert host == ["aten::mm", "aten::_local_scalar_dense"]
    assert sorted(host + device) == sorted(r[0] for r in ROWS)


def test_cpu_and_cuda_decoders_split_one_result_and_the_op_gets_its_kernel_time_only() -> None:
    if not torch_cpu.torch_support.installed().has_accessor("activity_type"):
        pytest.skip("the host/device split by activity type needs torch 2.12+")
    result = CollectorResult(Raw())
    config = ProfileConfig(
        activities={ProfilerActivity.CPU, ProfilerActivity.CUDA}, torch_activities={"CUDA"}
    )
    cpu_batch, _ = torch_cpu.decode_result(result.raw, config, pid=PID)
    assert cpu_batch.values("name") == ["aten::mm", "aten::_local_scalar_dense"]
    cuda_batch = kineto.decode_cuda_rows(result, pid=PID)
    trace = make_trace(concat([cpu_batch, cuda_batch]), config=config, start_ns=500)
    tree = EventTree.from_trace(trace, use_device="cuda")
    keys = np.array(tree.keys, dtype=object)[tree.key].tolist()
    self_cuda = dict(zip(keys, tree.self_device_time_total.tolist(), strict=True))
    assert self_cuda["aten::mm"] == pytest.approx(50.0)  # its 50 µs kernel
    # the copy is device time; the 800 µs stream sync and the overhead row are not
    assert self_cuda["aten::_local_scalar_dense"] == pytest.approx(1.0)


# ------------------------------------------------------------- the plugin in Kineto mode


@pytest.fixture
def cuda_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA build of torch with a device, as the plugin sees it (no GPU here, no CUPTI wheel read)."""
    from polyprof.base import torch_support
    from polyprof_cuda import mode

    build = torch_support.TorchBuild("2.11.0+cu130", cuda="13.0")
    monkeypatch.setattr(torch_support, "installed_build", lambda: build)
    monkeypatch.setattr(mode, "installed_cupti_version", lambda cuda: None)
    monkeypatch.setattr(kineto, "kineto_mode_reason", lambda: None)


def test_with_a_cuda_build_of_torch_the_plugin_records_cuda_through_torchs_collector(
    cuda_build: None,
) -> None:
    from polyprof_cuda import plugin

    caps = plugin.polyprof_capabilities()
    assert caps.unavailable_reason is None
    assert caps.mode == "via torch's Kineto (torch 2.11.0+cu130, CUDA 13.0)"
    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA})
    assert plugin.polyprof_torch_collector_activities(config) == ["CUDA"]
    assert [type(t) for t in plugin.polyprof_make_tracers(config)] == [kineto.KinetoCudaTracer]
    assert (
        plugin.polyprof_torch_collector_activities(ProfileConfig(activities={ProfilerActivity.CPU})) is None
    )


@pytest.mark.slow
def test_a_session_in_kineto_mode_asks_torchs_collector_for_cuda() -> None:
    """In its own process: asking torch's CPU build for CUDA leaves Kineto device state behind."""
    from pathlib import Path

    from polyprof.testing import run_pytest_in_child

    path = Path(__file__).resolve().parent / "in_child" / "cuda_sessions.py"
    assert "1 passed" in run_pytest_in_child(str(path))


def test_without_a_device_cuda_is_unavailable_as_torch_says(
    cuda_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.profiler lists CUDA only with a device: the default activities and the warning match."""
    import torch

    import polyprof
    from polyprof.base.user_warnings import ActivityUnavailableWarning
    from polyprof.testing import make_plugin_manager_for_tests
    from polyprof_cuda import plugin

    monkeypatch.setattr(kineto, "kineto_mode_reason", lambda: "torch 2.11.0+cu130 sees no CUDA device")
    caps = plugin.polyprof_capabilities()
    assert caps.unavailable_reason == "torch 2.11.0+cu130 sees no CUDA device"
    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA})
    assert plugin.polyprof_torch_collector_activities(config) is None
    assert plugin.polyprof_make_tracers(config) == []
    pm = make_plugin_manager_for_tests(("cuda", plugin), builtins=True)
    with polyprof.profile(plugin_manager=pm) as prof:  # default activities: no CUDA, no warning
        torch.ones(2).add(1)
    assert prof.trace.config.activities == frozenset({ProfilerActivity.CPU})
    pm = make_plugin_manager_for_tests(("cuda", plugin), builtins=True)
    with (
        pytest.warns(ActivityUnavailableWarning, match="sees no CUDA device"),
        polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], plugin_manager=pm) as prof,
    ):
        torch.ones(2).add(1)
    assert prof.trace.config.torch_activities == frozenset()


def test_the_trace_gets_kinetos_device_properties_read_at_stop() -> None:
    class Devices:
        def all_properties(self) -> list[dict]:
            return [{"id": 0, "name": "NVIDIA H200", "numSms": 132}]

    tracer = kineto.KinetoCudaTracer(device_info=Devices())
    tracer.start()
    tracer.stop()
    assert tracer.trace_metadata()["device_properties"] == [{"id": 0, "name": "NVIDIA H200", "numSms": 132}]
