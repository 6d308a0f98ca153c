"""The one-owner contract: device plugins take their rows from torch's own collector result.

A device plugin names the torch activities it needs (``polyprof_torch_collector_activities``);
the torch_cpu tracer requests them from torch's collector with CPU and hands every raw result to
the plugin's ``TorchResultTracer``, which decodes its rows on its own bus task. torch's CPU build
accepts ``ProfilerActivity.CUDA`` in ``_prepare_profiler`` and records no device rows, so these
tests drive the real collector; what a GPU build adds is fed through stand-ins.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import polyprof
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import PolyprofError
from polyprof.base.events import DeviceType, EventBatch, EventKind
from polyprof.hooks import activity_resolution
from polyprof.hooks.components import Capabilities
from polyprof.hooks.hookspecs import hookimpl
from polyprof.hooks.plugin_calls import PluginCallError
from polyprof.runtime.torch_result import (
    CollectorResult,
    DeviceRowClaims,
    TorchResultTracer,
    decode_device_rows,
)
from polyprof.testing import (
    KinetoEventStandIn,
    KinetoEventStandIn211,
    RawResultStandIn,
    make_plugin_manager_for_tests,
    run_pytest_in_child,
)

torch = pytest.importorskip("torch")
from polyprof.runtime import torch_cpu  # noqa: E402


class _KernelsFromCollector(TorchResultTracer):
    """A device tracer that turns each ``aten::add`` of the result into one kernel row, to show the path."""

    name = "fake_device"
    activities = frozenset({ProfilerActivity.CUDA})

    def __init__(self) -> None:
        super().__init__()
        self.received: list[CollectorResult] = []
        self.decoded_on: set[str] = set()
        self.stopped_before_results = False

    def stop(self) -> None:
        self.stopped_before_results = not self.received

    def receive(self, result: CollectorResult) -> None:
        self.received.append(result)
        super().receive(result)

    def decode(self, item: CollectorResult) -> list[EventBatch]:
        self.decoded_on.add(threading.current_thread().name)
        adds = [ev for ev in item.events() if ev.name() == "aten::add"]
        n = len(adds)
        batch = EventBatch.build(
            self.name,
            {
                "kind": np.full(n, EventKind.KERNEL, dtype=np.int8),
                "name": np.zeros(n, dtype=np.int32),
                "start_ns": np.array([ev.start_ns() for ev in adds], dtype=np.int64),
                "dur_ns": np.full(n, 1000, dtype=np.int64),
                "device_type": np.full(n, 1, dtype=np.int8),
            },
            {"name": ("fake_kernel",)},
        )
        return [batch]


class _DevicePlugin:
    def __init__(self, activities: Any = ("CUDA",)) -> None:
        self.tracer = _KernelsFromCollector()
        self.answer = activities
        self.asked_with: list[ProfileConfig] = []

    @hookimpl
    def polyprof_capabilities(self) -> Capabilities:
        return Capabilities(activities={ProfilerActivity.CUDA})

    @hookimpl
    def polyprof_torch_collector_activities(self, config: ProfileConfig) -> Any:
        self.asked_with.append(config)
        return self.answer if ProfilerActivity.CUDA in config.activities else None

    @hookimpl
    def polyprof_make_tracers(self, config: ProfileConfig) -> list[Any]:
        return [self.tracer] if ProfilerActivity.CUDA in config.activities else []


def _profile(plugin: _DevicePlugin, activities: list[ProfilerActivity]) -> Any:
    pm = make_plugin_manager_for_tests(("fake_device", plugin), builtins=True)
    with polyprof.profile(activities=activities, plugin_manager=pm) as prof:
        x = torch.ones(4)
        for _ in range(3):
            x = x.add(1)
    return prof


@pytest.mark.slow
def test_device_tracers_get_the_collector_result_in_a_real_session() -> None:
    """The sessions ask torch's CPU build for CUDA, which leaves Kineto device state behind for the
    rest of the process (other tests' torch traces would gain device lanes): own process."""
    summary = run_pytest_in_child(str(Path(__file__).parent / "in_child" / "torch_collector_sessions.py"))
    assert "2 passed" in summary, summary


def test_collector_activities_are_asked_of_torch() -> None:
    config = ProfileConfig(activities={ProfilerActivity.CPU}, torch_activities={"CUDA"})
    from torch._C._profiler import ProfilerActivity as TorchActivity

    assert torch_cpu._collector_activities(config) == {TorchActivity.CPU, TorchActivity.CUDA}
    only_device = ProfileConfig(activities={ProfilerActivity.CUDA}, torch_activities={"CUDA"})
    assert torch_cpu._collector_activities(only_device) == {TorchActivity.CUDA}


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("CUDA", "expected names of torch.profiler.ProfilerActivity members"),
        (["GPU"], "asked torch's collector for GPU; valid: CUDA, XPU"),
        ([2], "expected names"),
    ],
)
def test_a_bad_answer_names_the_plugin_and_the_valid_names(answer: Any, message: str) -> None:
    pm = make_plugin_manager_for_tests(("fake_device", _DevicePlugin(answer)), builtins=True)
    config = ProfileConfig(activities={ProfilerActivity.CUDA})
    with pytest.raises(PluginCallError, match=message) as info:
        activity_resolution.collector_activities(pm, config)
    assert "fake_device" in str(info.value)


def test_a_result_tracer_without_the_collector_owner_is_a_clear_error(monkeypatch: Any) -> None:
    plugin = _DevicePlugin()
    pm = make_plugin_manager_for_tests(("fake_device", plugin), builtins=False)
    with pytest.raises(PolyprofError, match=r"needs exactly one tracer driving it .* found 0: none"):
        polyprof.profile(activities=[ProfilerActivity.CUDA], plugin_manager=pm).start()


# ------------------------------------------------- host rows of a result with device rows


def _row(name: str, activity_type: str, on_device: int) -> KinetoEventStandIn:
    """A row of a CUDA run's result, for the host/device split."""
    device = DeviceType.CUDA if on_device else DeviceType.CPU
    return KinetoEventStandIn(name, activity_type, device, 0, 1, 2, 1, 0, 0)


def test_the_stand_in_has_every_accessor_of_the_installed_torchs_kineto_event() -> None:
    from torch._C._autograd import _KinetoEvent

    accessors = {name for name in dir(_KinetoEvent) if not name.startswith("_")}
    assert accessors <= set(dir(KinetoEventStandIn))
    older = accessors - {"activity_type", "external_id"}
    assert older <= set(dir(KinetoEventStandIn211("x", "cpu_op", DeviceType.CPU, 0, 1, 2, 1, 0, 0)))


RESULT_ROWS = [
    _row("aten::mm", "cpu_op", 0),
    _row("cudaLaunchKernel", "cuda_runtime", 0),
    _row("cuLaunchKernel", "cuda_driver", 0),
    _row("ampere_sgemm", "kernel", 1),
    _row("Memcpy HtoD", "gpu_memcpy", 1),
    _row("step", "user_annotation", 0),
    _row("cudaGraphs warm-up", "user_annotation", 0),  # a range may be named anything
    _row("train.py(3): <module>", "python_function", 0),
    _row("[memory]", "cpu_instant_event", 0),
    _row("Activity Buffer Request", "overhead", 0),
    _row("privateuse1Launch", "privateuse1_runtime", 0),  # no device tracer here claims this type
    _row("cuda range", "cuda_profiler_range", 1),
]
CUDA_TYPES = frozenset({"kernel", "gpu_memcpy", "cuda_runtime", "cuda_driver", "overhead"})


def _cuda_host_row_kind(name: str) -> EventKind | None:
    if name.startswith("cuda"):
        return EventKind.RUNTIME
    if name.startswith("cuL"):
        return EventKind.DRIVER
    return EventKind.OVERHEAD if name == "Activity Buffer Request" else None


def test_by_activity_type_the_cpu_tracer_keeps_host_rows_and_unclaimed_host_side_types() -> None:
    claims = DeviceRowClaims(CUDA_TYPES, (_cuda_host_row_kind,))
    kept = [ev.name() for ev in claims.host_rows(RESULT_ROWS, [ev.activity_type() for ev in RESULT_ROWS])]
    # torch lists a host-side row of any type; a device row no tracer decodes has no lane to go to
    assert kept == [
        "aten::mm",
        "step",
        "cudaGraphs warm-up",
        "train.py(3): <module>",
        "[memory]",
        "privateuse1Launch",
    ]
    every_device_type = DeviceRowClaims()  # what decode_result assumes when it is not told
    kept = [
        ev.name()
        for ev in every_device_type.host_rows(RESULT_ROWS, [ev.activity_type() for ev in RESULT_ROWS])
    ]
    assert "privateuse1Launch" not in kept and "aten::mm" in kept


def test_before_2_12_the_device_tracers_names_take_their_host_side_rows() -> None:
    claims = DeviceRowClaims(None, (_cuda_host_row_kind,))
    kept = [ev.name() for ev in claims.host_rows(RESULT_ROWS, None)]
    assert kept == [
        "aten::mm",
        "step",
        "cudaGraphs warm-up",
        "train.py(3): <module>",
        "[memory]",
        "privateuse1Launch",
    ]
    # without a device tracer that names them, they stay CPU rows (torch's table lists them so too)
    assert "cudaLaunchKernel" in [ev.name() for ev in DeviceRowClaims().host_rows(RESULT_ROWS, None)]


def test_claims_of_the_sessions_result_tracers() -> None:
    class Claiming(_RecordingResultTracer):
        claimed_activity_types = CUDA_TYPES

        def host_row_kind(self, name: str) -> EventKind | None:
            return _cuda_host_row_kind(name)

    claims = DeviceRowClaims.of([Claiming(), _RecordingResultTracer()])
    assert claims.activity_types == CUDA_TYPES
    assert claims.claims_type("kernel") and not claims.claims_type("cpu_op")
    assert not claims.claims_type("privateuse1_runtime")
    assert claims.claims_host_row(_row("cuLaunchKernel", "cuda_driver", 0))
    assert not claims.claims_host_row(_row("cudaGraphs warm-up", "user_annotation", 0))


def test_before_2_12_the_device_decoder_takes_the_rows_its_names_claim() -> None:
    as_211 = [
        KinetoEventStandIn211(ev.name(), ev.activity_type(), ev.device_type(), 0, 1, 2, 1, 0, 0)
        for ev in RESULT_ROWS
    ]
    batch = decode_device_rows(
        CollectorResult(RawResultStandIn(as_211)),
        source="cuda_test",
        device_type=DeviceType.CUDA,
        kind_by_activity_type={
            "kernel": EventKind.KERNEL,
            "cuda_runtime": EventKind.RUNTIME,
            "cuda_driver": EventKind.DRIVER,
            "overhead": EventKind.OVERHEAD,
        },
        pid=99,
        host_row_kind=_cuda_host_row_kind,
    )
    taken = dict(zip(batch.values("name"), batch.values("activity_type"), strict=True))
    # exactly the rows the CPU tracer leaves out under the same names (the test above)
    assert taken == {
        "cudaLaunchKernel": "cuda_runtime",
        "cuLaunchKernel": "cuda_driver",
        "ampere_sgemm": "kernel",
        "Memcpy HtoD": "gpu_memcpy",
        "Activity Buffer Request": "overhead",
        "cuda range": "kernel",
    }
    runtime = batch.values("name").index("cudaLaunchKernel")
    assert batch["pid"][runtime] == 99 and batch["device_type"][runtime] == DeviceType.CPU


def test_collector_result_reads_what_torch_gives_once_only_once() -> None:
    class Raw:
        saves = 0

        def events(self) -> list[Any]:
            return [_row("aten::add", "cpu_op", 0)]

        def save(self, path: str) -> None:
            Raw.saves += 1

    result = CollectorResult(Raw())
    results = [result.read_once("saved", lambda raw: raw.save("x") or Raw.saves) for _ in range(3)]
    assert results == [1, 1, 1] and Raw.saves == 1
    assert result.events() is result.events()
    assert result.activity_types() == ["cpu_op"]


# ------------------------------------------------- the owner, driven without a collector run


class _RecordingResultTracer(TorchResultTracer):
    name = "recording_device"
    activities = frozenset({ProfilerActivity.CUDA})

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def before_collector_stops(self) -> None:
        self.calls.append("before_collector_stops")

    def receive(self, result: CollectorResult) -> None:
        self.calls.append("receive")
        super().receive(result)

    def decode(self, item: CollectorResult) -> list[EventBatch]:
        return []


def _owner_with_client() -> tuple[Any, _RecordingResultTracer]:
    config = ProfileConfig(
        activities={ProfilerActivity.CPU, ProfilerActivity.CUDA}, torch_activities={"CUDA"}
    )
    owner = torch_cpu.TorchCpuTracer(config)
    client = _RecordingResultTracer()
    owner.share_results_with(client)
    client.fed_by(owner)
    owner._state = torch_cpu._CollectorState.RUNNING  # as after start(), without torch's collector for CUDA
    return owner, client


def test_device_activities_are_toggled_in_torchs_collector_through_the_owner(monkeypatch: Any) -> None:
    import torch._C._autograd as autograd
    from torch._C._profiler import ProfilerActivity as TorchActivity

    toggled: list[tuple[bool, set]] = []
    monkeypatch.setattr(
        autograd, "_toggle_collection_dynamic", lambda enable, acts: toggled.append((enable, acts))
    )
    owner, client = _owner_with_client()
    client.toggle_collection(False, frozenset({ProfilerActivity.CUDA}))
    owner.toggle_collection(False, frozenset({ProfilerActivity.CUDA}))  # CPU not asked: nothing
    client.toggle_collection(True, frozenset({ProfilerActivity.CPU, ProfilerActivity.CUDA}))
    owner.toggle_collection(True, frozenset({ProfilerActivity.CPU, ProfilerActivity.CUDA}))
    assert toggled == [
        (False, {TorchActivity.CUDA}),
        (True, {TorchActivity.CUDA}),
        (True, {TorchActivity.CPU}),
    ]


def test_a_nested_torch_profiler_pause_waits_for_the_devices_first(monkeypatch: Any) -> None:
    import torch._C._autograd as autograd

    monkeypatch.setattr(autograd, "_disable_profiler", lambda: "raw result")
    monkeypatch.setattr(autograd, "_profiler_enabled", lambda: True)  # the session is there to pause
    owner, client = _owner_with_client()
    with pytest.warns(torch_cpu.NestedProfilerWarning):
        owner._pause_for_inner_profiler()
    assert client.calls == ["before_collector_stops", "receive"]
    (item,) = client.outbox.drain()
    assert item.raw == "raw result"


def test_kineto_device_reason_asks_torch_as_supported_activities_does() -> None:
    from polyprof.runtime.torch_result import kineto_device_reason

    if not torch.cuda.is_available():  # no GPU here: torch lists no CUDA, and says why
        assert (
            kineto_device_reason("cuda", hint=" (hint)")
            == f"torch {torch.__version__} sees no CUDA device (hint)"
        )
    if not torch.xpu.is_available():
        assert kineto_device_reason("xpu") == f"torch {torch.__version__} sees no XPU device"
    assert kineto_device_reason("no_such_device").startswith(
        "torch's NO_SUCH_DEVICE check failed: AttributeError"
    )
