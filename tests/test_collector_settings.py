"""polyprof asks torch's collector for exactly what torch's own profilers ask, call for call.

Recording costs what torch's recording costs only if the collector is set up the
same way: the same ``_prepare_profiler`` / ``_enable_profiler`` calls with the
same ``ProfilerConfig`` (state, flags, ``_ExperimentalConfig``), the same
activities and activity filter, the same toggles, and the same profiler flag
(``_run_on_profiler_start`` / ``_stop``). Each test runs torch's profiler and
polyprof's equivalent on one workload with every such call recorded (and passed
on to torch, so both really record), and compares the two lists.

CUDA runs on torch's CPU build too (the ``gpu_present`` fixture of conftest.py):
torch's CPU collector accepts ``ProfilerActivity.CUDA`` and records the CPU side.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")

import torch.autograd.profiler as autograd_profiler  # noqa: E402
from torch._C import _autograd, _profiler  # noqa: E402

import polyprof  # noqa: E402
from polyprof.base import torch_support  # noqa: E402

TorchActivity = torch.profiler.ProfilerActivity

#: The collector's functions torch's profilers call, wherever a caller may find them.
COLLECTOR_FUNCTIONS = (
    "_prepare_profiler",
    "_enable_profiler",
    "_disable_profiler",
    "_toggle_collection_dynamic",
)
#: torch's profiler flag, which torch.compile's extra ranges read.
FLAG_FUNCTIONS = ("_run_on_profiler_start", "_run_on_profiler_stop")
_TRACE_ID = re.compile(r"[0-9A-F]{32}")


@attrs.frozen
class CollectorCall:
    """One call into torch's collector, in a form two profilers' calls compare by."""

    function: str
    #: ProfilerConfig's arguments: state, record_shapes, profile_memory, with_stack, with_flops,
    #: with_modules, the _ExperimentalConfig's state, and the trace id's place among the ids seen.
    config: tuple[Any, ...] | None = None
    activities: tuple[str, ...] | None = None
    keywords: tuple[tuple[str, Any], ...] = ()


class CollectorRecorder:
    """Wraps torch's collector functions and ``ProfilerConfig``; ``take()`` hands the calls over."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[CollectorCall] = []
        self._configs: dict[int, tuple[Any, tuple[Any, ...]]] = {}
        self._trace_ids: list[str] = []
        real_config = _profiler.ProfilerConfig

        def recording_config(*args: Any) -> Any:
            config = real_config(*args)
            self._configs[id(config)] = (config, args)  # held, so the id stays this config's
            return config

        for module in (_profiler, autograd_profiler):
            monkeypatch.setattr(module, "ProfilerConfig", recording_config)
        for name in COLLECTOR_FUNCTIONS:
            wrapped = self._wrap(name, getattr(_autograd, name))
            monkeypatch.setattr(_autograd, name, wrapped)
            if hasattr(autograd_profiler, name):
                monkeypatch.setattr(autograd_profiler, name, wrapped)
        for name in FLAG_FUNCTIONS:
            monkeypatch.setattr(
                autograd_profiler, name, self._wrap_flag(name, getattr(autograd_profiler, name))
            )

    def _describe_config(self, config: Any) -> tuple[Any, ...]:
        _, args = self._configs[id(config)]
        state, *flags, experimental = args[:7]
        trace_id = args[7] if len(args) > 7 else ""
        if _TRACE_ID.fullmatch(trace_id):
            if trace_id not in self._trace_ids:
                self._trace_ids.append(trace_id)
            trace_id = f"trace id #{self._trace_ids.index(trace_id) + 1}"
        return (str(state), *map(bool, flags), tuple(experimental.__getstate__()), trace_id)

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(real)  # torch_support reads the signature line of its docstring
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if name in ("_prepare_profiler", "_enable_profiler"):
                config, activities = args[:2]
                call = CollectorCall(
                    name,
                    self._describe_config(config),
                    tuple(sorted(str(a) for a in activities)),
                    tuple(sorted((key, _comparable(value)) for key, value in kwargs.items())),
                )
            elif name == "_toggle_collection_dynamic":
                enable, activities = args[:2]
                call = CollectorCall(name, (bool(enable),), tuple(sorted(str(a) for a in activities)))
            else:
                call = CollectorCall(name)
            self.calls.append(call)
            return real(*args, **kwargs)

        return recorded

    def _wrap_flag(self, name: str, real: Callable[[], None]) -> Callable[[], None]:
        def recorded() -> None:
            self.calls.append(CollectorCall(name))
            real()

        return recorded

    def take(self) -> list[CollectorCall]:
        calls, self.calls = self.calls, []
        self._trace_ids = []
        return calls


def _comparable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((str(k), tuple(sorted(v))) for k, v in value.items()))
    return value


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> CollectorRecorder:
    return CollectorRecorder(monkeypatch)


def _workload() -> None:
    a = torch.ones(8, 8, requires_grad=True)
    with torch.profiler.record_function("step"):
        (a @ a).relu().sum().backward()


def _run_kineto_style(factory: Callable[..., Any], steps: int, **kwargs: Any) -> None:
    with factory(**kwargs) as prof:
        for _ in range(steps):
            _workload()
            prof.step()


def _compare(
    recorder: CollectorRecorder, run_torch: Callable[[], None], run_polyprof: Callable[[], None]
) -> None:
    run_torch()
    theirs = recorder.take()
    run_polyprof()
    ours = recorder.take()
    assert theirs, "torch's profiler made no collector call: the recorder is not in its path"
    assert ours == theirs


def _experimental(**flags: bool) -> Any:
    fields = torch_support.installed().experimental_fields
    missing = set(flags) - fields
    if missing:
        pytest.skip(
            f"torch {torch.__version__} has no _ExperimentalConfig option {', '.join(sorted(missing))}"
        )
    return _profiler._ExperimentalConfig(**flags)


FLAG_CASES = {
    "defaults": {},
    "record_shapes": {"record_shapes": True},
    "profile_memory": {"profile_memory": True},
    "with_stack": {"with_stack": True},
    "with_flops": {"with_flops": True},
    "with_modules": {"with_modules": True},
    "all": {
        "record_shapes": True,
        "profile_memory": True,
        "with_stack": True,
        "with_flops": True,
        "with_modules": True,
    },
}


@pytest.mark.parametrize("flags", FLAG_CASES.values(), ids=FLAG_CASES.keys())
@pytest.mark.parametrize("device", ["cpu", "cpu+cuda", "cuda"])
def test_profile_asks_the_collector_what_torch_profiler_asks(
    recorder: CollectorRecorder, request: pytest.FixtureRequest, device: str, flags: dict[str, Any]
) -> None:
    pm = request.getfixturevalue("gpu_present") if "cuda" in device else None
    activities = {"cpu": ["CPU"], "cpu+cuda": ["CPU", "CUDA"], "cuda": ["CUDA"]}[device]
    _compare(
        recorder,
        lambda: _run_kineto_style(
            torch.profiler.profile, 1, activities=[getattr(TorchActivity, a) for a in activities], **flags
        ),
        lambda: _run_kineto_style(
            polyprof.profile,
            1,
            activities=[getattr(polyprof.ProfilerActivity, a) for a in activities],
            plugin_manager=pm,
            **flags,
        ),
    )


EXPERIMENTAL_CASES = {
    "verbose": {"verbose": True},
    "profile_all_threads": {"profile_all_threads": True},
    "capture_overload_names": {"capture_overload_names": True},
    "cuda_sync_events": {"enable_cuda_sync_events": True},
}


@pytest.mark.parametrize("experimental", EXPERIMENTAL_CASES.values(), ids=EXPERIMENTAL_CASES.keys())
def test_the_users_experimental_config_reaches_the_collector_as_torch_passes_it(
    recorder: CollectorRecorder, gpu_present: Any, experimental: dict[str, bool]
) -> None:
    config = _experimental(**experimental)
    cuda = [TorchActivity.CPU, TorchActivity.CUDA]
    _compare(
        recorder,
        lambda: _run_kineto_style(torch.profiler.profile, 1, activities=cuda, experimental_config=config),
        lambda: _run_kineto_style(
            polyprof.profile, 1, activities=cuda, experimental_config=config, plugin_manager=gpu_present
        ),
    )


def test_a_schedule_prepares_enables_and_disables_as_torch_does(
    recorder: CollectorRecorder, gpu_present: Any
) -> None:
    cuda = [TorchActivity.CPU, TorchActivity.CUDA]

    def run(factory: Callable[..., Any], **extra: Any) -> None:
        schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
        _run_kineto_style(
            factory, 9, activities=cuda, schedule=schedule, on_trace_ready=lambda p: None, **extra
        )

    _compare(
        recorder,
        lambda: run(torch.profiler.profile),
        lambda: run(polyprof.profile, plugin_manager=gpu_present),
    )


def test_start_and_stop_without_a_with_block_match_torch(recorder: CollectorRecorder) -> None:
    def run(factory: Callable[..., Any]) -> None:
        prof = factory(activities=[TorchActivity.CPU], record_shapes=True)
        prof.start()
        _workload()
        prof.stop()

    _compare(recorder, lambda: run(torch.profiler.profile), lambda: run(polyprof.profile))


def test_toggling_collection_calls_the_collector_as_torch_does(recorder: CollectorRecorder) -> None:
    def run(factory: Callable[..., Any]) -> None:
        with factory(activities=[TorchActivity.CPU]) as prof:
            _workload()
            prof.toggle_collection_dynamic(False, [TorchActivity.CPU])
            _workload()
            prof.toggle_collection_dynamic(True, [TorchActivity.CPU])
            _workload()

    _compare(recorder, lambda: run(torch.profiler.profile), lambda: run(polyprof.profile))


def test_an_activity_filter_reaches_the_collector_as_torch_passes_it(recorder: CollectorRecorder) -> None:
    if not torch_support.installed().prepare_takes_activity_filter:
        pytest.skip(f"torch {torch.__version__} has no activity filters (2.13+)")

    def run(factory: Callable[..., Any]) -> None:
        with factory(activities={TorchActivity.CPU: {"cpu_op"}}):  # torch's dict form
            _workload()

    _compare(recorder, lambda: run(torch.profiler.profile), lambda: run(polyprof.profile))


@pytest.mark.parametrize("use_cuda", [False, True], ids=["cpu", "cuda"])
def test_the_autograd_profiler_shim_asks_the_collector_what_torch_autograd_asks(
    recorder: CollectorRecorder, request: pytest.FixtureRequest, use_cuda: bool
) -> None:
    from polyprof.shim import AutogradProfile

    pm = request.getfixturevalue("gpu_present") if use_cuda else None
    flags = {"use_device": "cuda"} if use_cuda else {}

    def run(factory: Callable[..., Any], **extra: Any) -> None:
        with factory(use_kineto=True, record_shapes=True, **flags, **extra):
            _workload()

    _compare(
        recorder,
        lambda: run(autograd_profiler.profile),
        lambda: run(AutogradProfile, plugin_manager=pm),
    )


@pytest.mark.parametrize("cuda", ["12.4", "13.0"])
def test_with_inductor_cuda_graphs_cupti_stays_up_where_torch_keeps_it_up(
    monkeypatch: pytest.MonkeyPatch, cuda: str
) -> None:
    """Under CUDA graphs before CUDA 12.6 torch.profiler keeps CUPTI up after a profile; so does polyprof."""
    inductor_config = pytest.importorskip("torch._inductor.config")
    monkeypatch.setattr(torch.version, "cuda", cuda)
    switches = ("DISABLE_CUPTI_LAZY_REINIT", "TEARDOWN_CUPTI")
    seen: dict[str, Any] = {}
    marked = None
    with inductor_config.patch({"triton.cudagraphs": True}):
        for name, factory in (("torch", torch.profiler.profile), ("polyprof", polyprof.profile)):
            for switch in switches:
                monkeypatch.delenv(switch, raising=False)
            with factory(activities=[TorchActivity.CPU]) as prof:
                _workload()
            seen[name] = {switch: os.environ.get(switch) for switch in switches}
            if name == "polyprof":
                marked = prof.trace.metadata_json.get("DISABLE_CUPTI_LAZY_REINIT")
    from torch import _utils_internal

    # torch 2.6 keeps CUPTI up under CUDA graphs whatever the CUDA version; later torch before 12.6
    kept_up = cuda == "12.4" or not hasattr(
        _utils_internal, "profiler_allow_cudagraph_cupti_lazy_reinit_cuda12"
    )
    assert seen["polyprof"] == seen["torch"]
    unset = dict.fromkeys(switches)
    assert seen["torch"] == ({"DISABLE_CUPTI_LAZY_REINIT": "1", "TEARDOWN_CUPTI": "0"} if kept_up else unset)
    assert marked == ("1" if kept_up else None)
