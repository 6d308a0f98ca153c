"""Every public attribute of the installed torch's events, with torch as the oracle.

Each workload runs once under torch.profiler with every flag the installed
torch offers. Its raw ``_ProfilerResult`` is decoded by polyprof's CPU tracer
*before* torch parses it; then every public name of torch's ``FunctionEvent``,
``FunctionEventAvg`` and ``EventList`` must exist on polyprof's (and no other),
and every attribute must hold the same value of the same type (floats
exactly, nested lists and dicts element by element), warning where torch's
warns. The names come from ``dir()`` of torch's own objects, so each torch
release is checked against itself: 2.6 has no ``overload_name``, 2.12 adds
``concrete_inputs``' siblings ``input_dtypes`` and ``structured_input_*``,
2.15 drops ``metadata_json``, ...
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from polyprof.analysis.event_list import EventList
from polyprof.analysis.function_events import FunctionEvent, FunctionEventAvg
from polyprof.analysis.results import ProfileResults
from polyprof.analysis.torch_event_surface import (
    TorchEventSurface,
    probe_torch_event_surface,
    torch_event_surface,
)
from polyprof.base.activity import ProfilerActivity as PA
from polyprof.base.config import ProfileConfig
from polyprof.base.trace import Trace
from polyprof.runtime.torch_cpu import decode_result

torch = pytest.importorskip("torch")
from torch._C._profiler import _ExperimentalConfig  # noqa: E402
from torch.autograd import profiler_util  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from polyprof.base.torch_support import installed  # noqa: E402

FEATURES = installed()


@pytest.fixture(scope="module", autouse=True)
def _warm_profiler() -> None:
    """torch's first verbose profile names some Python frames from freed memory; warm it up once."""
    torch.set_num_threads(1)
    _workload()  # imports what the workload needs before any profile names its frames
    with profile(
        activities=[ProfilerActivity.CPU],
        with_stack=True,
        experimental_config=_ExperimentalConfig(verbose=True),
    ) as prof:
        _workload()
    prof.events()


# ----------------------------------------------------------------- runs


class Run:
    """One workload profiled by torch, and the same raw result read by polyprof."""

    def __init__(self, prof: Any, results: ProfileResults) -> None:
        self.prof = prof
        self.results = results

    @property
    def theirs(self) -> Any:
        return self.prof.events()

    @property
    def ours(self) -> EventList:
        return self.results.events()


def _experimental(**wanted: bool) -> dict[str, bool]:
    """The experimental flags asked for that the installed torch's ``_ExperimentalConfig`` takes."""
    return {k: v for k, v in wanted.items() if k in FEATURES.experimental_fields}


def profile_run(workload: Callable[[], None], **flags: Any) -> Run:
    experimental = _experimental(
        **{k: flags.pop(k) for k in ("verbose", "capture_overload_names") if k in flags}
    )
    with profile(
        activities=[ProfilerActivity.CPU], experimental_config=_ExperimentalConfig(**experimental), **flags
    ) as prof:
        workload()
    config = ProfileConfig(activities={PA.CPU}, **flags, **experimental)
    batch, facts = decode_result(prof.profiler.kineto_results, config)  # before torch parses it
    trace = Trace(
        events=batch, config=config, start_ns=facts["start_ns"], end_ns=facts["start_ns"], pid=os.getpid()
    )
    return Run(prof, ProfileResults(traces=(trace,), use_device=None))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: Any) -> Any:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _workload() -> None:
    """Ops with scalar, list, TensorList, dtype and keyword inputs, in forward and backward."""
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 3, 8, 8)
    a = torch.ones(4, 4)
    with record_function("forward"):
        loss = net(x).sum()
    with record_function("inputs"):
        a.add(a, alpha=2)
        a.add(1.5)
        torch.cat([a, a], dim=1)
        a.to(torch.float64)
        a.view(2, 8).sum(dim=[0], keepdim=True)
        torch.stack([a, a, a])
    with record_function("backward"):
        loss.backward()


RUN_FLAGS = {
    "everything": {
        "record_shapes": True,
        "profile_memory": True,
        "with_flops": True,
        "capture_overload_names": True,
    },
    "stacks": {"record_shapes": True, "with_stack": True, "verbose": True, "with_modules": True},
    "bare": {},
    "memory_only": {"profile_memory": True},
}


@pytest.fixture(
    scope="module",
    # Comparing every attribute of every event with stacks takes seconds: the fast subset leaves it out.
    params=[pytest.param(name, marks=pytest.mark.slow) if name == "stacks" else name for name in RUN_FLAGS],
)
def run(request: pytest.FixtureRequest) -> Run:
    return profile_run(_workload, **RUN_FLAGS[request.param])


@pytest.fixture(scope="module")
def stack_run() -> Run:
    return profile_run(_workload, **RUN_FLAGS["stacks"])


# ------------------------------------------------------------ comparing


def public_names(obj: Any) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def _is_event(value: Any) -> bool:
    return isinstance(value, (FunctionEvent, profiler_util.FunctionEvent))


def assert_same(ours: Any, theirs: Any, where: str) -> None:
    """Equal values of the same types, all the way down (events compared by id and time)."""
    if _is_event(theirs):
        assert _is_event(ours), f"{where}: {ours!r} is no event"
        identity = (theirs.id, theirs.name, theirs.time_range.start)
        assert (ours.id, ours.name, ours.time_range.start) == identity, where
        return
    if isinstance(theirs, profiler_util.Interval):
        assert (ours.start, ours.end) == (theirs.start, theirs.end), where
        assert type(ours.start) is type(theirs.start) and type(ours.end) is type(theirs.end), where
        return
    if isinstance(theirs, tuple) and hasattr(theirs, "_fields"):  # Kernel, EventMetadata
        assert type(ours).__name__ == type(theirs).__name__, where
        assert ours._fields == theirs._fields, where
        for field in theirs._fields:
            assert_same(getattr(ours, field), getattr(theirs, field), f"{where}.{field}")
        return
    assert type(ours) is type(theirs), f"{where}: {ours!r} != {theirs!r} ({type(theirs).__name__})"
    if isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), f"{where}: {ours!r} != {theirs!r}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), where
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


def read(obj: Any, name: str) -> tuple[Any, list[tuple[type, str]]]:
    """``obj.name`` and the warnings reading it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(obj, name)
    return value, [(w.category, str(w.message)) for w in caught]


def assert_objects_match(ours: Any, theirs: Any, where: str) -> None:
    assert public_names(ours) == public_names(theirs), where
    for name in sorted(public_names(theirs)):
        their_value, their_warnings = read(theirs, name)
        our_value, our_warnings = read(ours, name)
        assert our_warnings == their_warnings, f"{where}.{name}: warnings"
        if callable(their_value):
            assert callable(our_value), f"{where}.{name} is not callable"
            continue
        assert_same(our_value, their_value, f"{where}.{name}")


# ------------------------------------------------------------ FunctionEvent


def test_every_event_attribute_matches_torch(run: Run) -> None:
    theirs, ours = run.theirs, run.ours
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_objects_match(a, b, f"row {i} {b.name!r}")
        assert repr(a) == repr(b), i


def test_recorded_inputs_are_not_all_empty(run: Run) -> None:
    """The comparison above is vacuous unless the flags recorded something (guards the workload)."""
    events = run.theirs
    if run.prof.record_shapes:
        assert any(e.concrete_inputs for e in events)
        if hasattr(events[0], "structured_input_shapes"):
            # a TensorList input (torch.cat) gives a list of shapes
            nested = lambda shapes: any(s and isinstance(s[0], list) for s in shapes)  # noqa: E731
            assert any(nested(e.structured_input_shapes) for e in events)
            assert any(e.input_dtypes for e in events)
    if run.prof.with_stack and hasattr(events[0], "python_module_id"):
        assert any(e.python_module_id != -1 for e in events)
        assert any(e.is_python_function for e in events)


def test_hasattr_agrees_for_every_name_any_release_has(run: Run) -> None:
    """Names that some supported torch has and the installed one may lack."""
    names = {
        "overload_name", "metadata_json", "activity_type", "event_metadata", "metadata", "external_id",
        "flow_id", "flow_type", "flow_start", "input_dtypes", "is_python_function", "linked_correlation_id",
        "python_id", "python_module_id", "python_parent_id", "structured_input_shapes",
        "structured_input_strides", "concrete_inputs", "kwinputs",
    }  # fmt: skip
    ours, theirs = run.ours[0], run.theirs[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(names):
            assert hasattr(ours, name) == hasattr(theirs, name), name
    for name in sorted(names - public_names(theirs)):
        with pytest.raises(AttributeError, match=name):
            getattr(ours, name)


def test_values_are_copies_as_each_torch_event_has_its_own(run: Run) -> None:
    event = next((e for e in run.ours if e.concrete_inputs), None)
    if event is None:
        pytest.skip("this run records no inputs")
    first = event.concrete_inputs
    first.append("changed")
    assert event.concrete_inputs != first


def test_append_methods_change_the_event_as_torchs_do(train_like: tuple[Any, Any]) -> None:
    ours, theirs = train_like
    pick = lambda events: next(e for e in events if e.name == "inputs")  # noqa: E731
    a, b = pick(ours), pick(theirs)
    child_a = next(e for e in ours if e.name == "forward")
    child_b = next(e for e in theirs if e.name == "forward")
    for x, child in ((a, child_a), (b, child_b)):
        x.append_kernel("k", 0, 2.5)
        x.append_cpu_child(child)
        child.set_cpu_parent(x)
    for name in ("kernels", "self_cpu_time_total", "device_time_total", "self_device_time_total",
                 "self_cpu_memory_usage", "self_device_memory_usage"):  # fmt: skip
        assert_same(getattr(a, name), getattr(b, name), name)
    assert [c.id for c in a.cpu_children] == [c.id for c in b.cpu_children]
    assert child_a.cpu_parent is a
    with pytest.raises(AssertionError):
        a.append_cpu_child(object())


@pytest.fixture
def train_like() -> tuple[Any, Any]:
    """A fresh run (the append methods change its events)."""
    run = profile_run(_workload, record_shapes=True, profile_memory=True)
    return run.ours, run.theirs


def test_device_totals_with_a_use_device_but_no_kernels_are_torchs_int_zeros() -> None:
    """torch sums kernels (``sum([])``) and children: an op with no kernel below it gets the int 0."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _workload()
    config = ProfileConfig(activities={PA.CPU}, record_shapes=True)
    batch, facts = decode_result(prof.profiler.kineto_results, config)
    trace = Trace(events=batch, config=config, start_ns=facts["start_ns"], end_ns=facts["start_ns"], pid=0)
    results = ProfileResults(traces=(trace,), use_device="cuda")
    prof.profiler.use_device = "cuda"  # before torch parses the result
    theirs, ours = prof.events(), results.events()
    names = ("device_time_total", "self_device_time_total")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for name in names:
            assert_same(getattr(a, name), getattr(b, name), f"row {i} {b.name!r}.{name}")
    for a, b in zip(results.key_averages(), prof.key_averages(), strict=True):
        for name in names:
            assert_same(getattr(a, name), getattr(b, name), f"average {b.key!r}.{name}")
    for name in names:
        assert_same(getattr(ours.total_average(), name), getattr(theirs.total_average(), name), name)


# ------------------------------------------------------------ FunctionEventAvg and EventList


def _key_averages_variants() -> list[dict[str, Any]]:
    params = set(FEATURES_KEY_AVERAGES)
    variants: list[dict[str, Any]] = [{}, {"group_by_input_shape": True}, {"group_by_stack_n": 3}]
    if "group_by_overload_name" in params:
        variants.append({"group_by_overload_name": True})
    if "include_python_functions" in params:
        variants.append({"include_python_functions": True})
    return variants


FEATURES_KEY_AVERAGES = frozenset(
    __import__("inspect").signature(profiler_util.EventList.key_averages).parameters
) - {"self"}


@pytest.mark.parametrize("variant", _key_averages_variants(), ids=str)
def test_every_average_attribute_matches_torch(run: Run, variant: dict[str, Any]) -> None:
    theirs = run.prof.key_averages(**variant)
    ours = run.results.key_averages(**variant)
    assert [e.key for e in ours] == [e.key for e in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert_objects_match(a, b, f"average {b.key!r}")
        assert repr(a) == repr(b)
    # EventList.key_averages (the view path) and of plain objects (after the list is edited)
    spelled = {("group_by_input_shapes" if k == "group_by_input_shape" else k): v for k, v in variant.items()}
    theirs_list = run.theirs.key_averages(**spelled)
    for ours_list in (run.ours.key_averages(**spelled), EventList(list(run.ours)).key_averages(**spelled)):
        assert [(e.key, e.count) for e in ours_list] == [(e.key, e.count) for e in theirs_list]


@pytest.mark.slow
def test_stack_run_key_averages_follow_torchs_python_function_rule(stack_run: Run) -> None:
    """torch 2.14 leaves python_function events out of key_averages unless asked; before, it keeps them."""
    theirs = stack_run.prof.key_averages()
    ours = stack_run.results.key_averages()
    assert [(e.key, e.count) for e in ours] == [(e.key, e.count) for e in theirs]
    # torch before 2.12 has no is_python_function: its Python tracer's events are known by their names
    python_keys = {
        e.key for e in stack_run.theirs if ".py(" in e.key or e.key.startswith(("nn.Module:", "<built-in"))
    }
    if not python_keys:  # torch 2.6 lists no Python tracer events in events()
        assert not any(".py(" in e.key for e in stack_run.ours)
        pytest.skip(f"torch {torch.__version__}'s events() has no python_function events")
    skips = "include_python_functions" in FEATURES_KEY_AVERAGES
    assert bool(python_keys & {e.key for e in ours}) is not skips


def test_fresh_average_has_torchs_attributes() -> None:
    ours, theirs = FunctionEventAvg(), profiler_util.FunctionEventAvg()
    assert public_names(ours) == public_names(theirs)
    assert hasattr(ours, "overload_name") == hasattr(theirs, "overload_name")
    assert not hasattr(ours, "is_user_annotation")  # torch sets it in add()


def test_total_average_matches_torch(run: Run) -> None:
    assert_objects_match(run.ours.total_average(), run.theirs.total_average(), "total_average")


def test_event_list_has_torchs_public_names(run: Run) -> None:
    assert public_names(run.ours) == public_names(run.theirs)
    assert_same(run.ours.self_cpu_time_total, run.theirs.self_cpu_time_total, "self_cpu_time_total")
    assert run.ours.supported_export_stacks_metrics() == run.theirs.supported_export_stacks_metrics()


def test_key_averages_refuses_arguments_the_installed_torch_lacks(run: Run) -> None:
    for name in ("group_by_overload_name", "include_python_functions"):
        if name in FEATURES_KEY_AVERAGES:
            run.ours.key_averages(**{name: True})
            continue
        with pytest.raises(TypeError):
            run.theirs.key_averages(**{name: True})
        with pytest.raises(TypeError, match=name):
            run.ours.key_averages(**{name: True})


# ------------------------------------------------------------ the surface itself


def test_surface_is_asked_of_the_installed_torch() -> None:
    surface = torch_event_surface()
    assert surface == probe_torch_event_surface()
    assert surface.torch_version == torch.__version__
    assert surface.event == frozenset(public_names(profiler_util.FunctionEvent(0, "x", 0, 0, 0)))
    assert ("overload_name" in surface.event) is FEATURES.has_accessor("overload_name")
    # torch's own deprecations, found by reading, include the cuda aliases on every release
    assert "cuda_time_total" in surface.deprecated


def test_without_torch_every_name_exists() -> None:
    every = TorchEventSurface(torch_version=None, event=None, average=None)
    assert every.event_has("metadata_json") and every.event_has("metadata")
    assert every.average_has("overload_name") and every.key_averages_takes("include_python_functions")


def test_profile_frontend_key_averages_follows_the_python_function_rule() -> None:
    import polyprof

    with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU], with_stack=True) as prof:
        _workload()
    is_python = lambda key: ".py(" in key or key.startswith(("nn.Module:", "<built-in"))  # noqa: E731
    recorded = any(is_python(e.key) for e in prof.events())
    averaged = any(is_python(e.key) for e in prof.key_averages())
    assert averaged == (recorded and "include_python_functions" not in FEATURES_KEY_AVERAGES)
    assert any(is_python(e.key) for e in prof.key_averages(include_python_functions=True)) == recorded
