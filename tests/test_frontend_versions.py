"""The frontends against the installed torch's own, whatever its version (2.6 to 2.15).

torch is the oracle: each test runs torch's ``torch.profiler.profile`` (or
``torch.autograd.profiler.profile``, ``profiler_legacy.profile``) and
polyprof's frontend on the same input and compares what they do:
``KinetoStepTracker`` calls, how ``activities`` is read (and which exception
type refuses it), activity filters, constructor arguments, and
``post_processing_timeout_s``.
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.profiler as autograd_profiler  # noqa: E402
import torch.profiler as tp  # noqa: E402
from torch.autograd import profiler_legacy  # noqa: E402
from torch.autograd.profiler import KinetoStepTracker  # noqa: E402

import polyprof  # noqa: E402
from polyprof import shim, torch_support  # noqa: E402
from polyprof.activity import CPU_GROUP_ACTIVITY_TYPES  # noqa: E402
from polyprof.profiler import activity_rules  # noqa: E402

PA = tp.ProfilerActivity
REPO = Path(__file__).resolve().parents[1]
TORCH_PROFILE_PARAMS = inspect.signature(tp.profile).parameters
#: Every activity type name in Kineto's ActivityType (libkineto), plus names it does not have.
KINETO_TYPE_NAMES = (
    *CPU_GROUP_ACTIVITY_TYPES,
    "GPU_MEMCPY",
    "GPU_MEMSET",
    "GPU_USER_ANNOTATION",
    "CONCURRENT_KERNEL",
    "OVERHEAD",
    "CUDA_SYNC",
    "MTIA_RUNTIME",
    "MTIA_CCP_EVENTS",
    "HPU_OP",
    "COLLECTIVE_COMM",
    "cpu_op",
    "NOT_A_TYPE",
)


@pytest.fixture(autouse=True)
def _torch_classes_not_shimmed() -> None:
    assert not shim.installed(), "a test left polyprof's shims installed"


def workload() -> None:
    with tp.record_function("my_range"):
        torch.ones(4).add(1).sum()


# ------------------------------------------------------------------ 4.3 KinetoStepTracker


@pytest.fixture
def tracker_calls(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every KinetoStepTracker call (name, requester), calling through to torch's own."""
    calls: list[Any] = []
    saved = dict(KinetoStepTracker._step_dict), KinetoStepTracker._current_step
    for name in ("init_step_count", "erase_step_count", "increment_step"):
        original = getattr(KinetoStepTracker, name)

        def spy(cls: type, requester: str, _name: str = name, _original: Any = original) -> Any:
            calls.append((_name, requester))
            return _original(requester)

        monkeypatch.setattr(KinetoStepTracker, name, classmethod(spy))
    yield calls
    KinetoStepTracker._step_dict.clear()
    KinetoStepTracker._step_dict.update(saved[0])
    KinetoStepTracker._current_step = saved[1]


def drive_steps(profile_cls: Any, calls: list[Any]) -> list[Any]:
    calls.clear()
    KinetoStepTracker._step_dict.clear()  # the same start for both: the counts are process-wide
    KinetoStepTracker._current_step = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = profile_cls(activities=[PA.CPU], schedule=tp.schedule(wait=1, warmup=1, active=1))
        calls.append("constructed")
        with prof:
            calls.append("entered")
            for _ in range(4):
                workload()
                prof.step()
                calls.append(("stepped", dict(KinetoStepTracker._step_dict)))
        calls.append(("exited", dict(KinetoStepTracker._step_dict)))
    return list(calls)


@pytest.mark.parametrize("daemon", [False, True], ids=["plain", "KINETO_USE_DAEMON"])
def test_step_tracker_driven_as_torch_drives_it(
    tracker_calls: list[Any], monkeypatch: pytest.MonkeyPatch, daemon: bool
) -> None:
    # Kineto reads KINETO_USE_DAEMON when it initialises: do that before setting it, so that only
    # profile.step()'s Python check sees it (as it would in torch).
    with tp.profile(activities=[PA.CPU]):
        pass
    monkeypatch.delenv("KINETO_USE_DAEMON", raising=False)
    if daemon:
        monkeypatch.setenv("KINETO_USE_DAEMON", "1")
    theirs = drive_steps(tp.profile, tracker_calls)
    ours = drive_steps(polyprof.profile, tracker_calls)
    assert ours == theirs
    assert theirs[0] == ("init_step_count", "ProfilerStep")
    assert ("erase_step_count", "ProfilerStep") in theirs
    increments = theirs.count(("increment_step", "ProfilerStep"))
    # torch 2.6 counts every step for Kineto; 2.7+ only with a Kineto daemon.
    assert increments == (4 if daemon or not torch_support.installed().at_least(2, 7) else 0)


def test_constructs_and_steps_without_torch() -> None:
    code = """
import sys
sys.modules["torch"] = None  # import torch raises ImportError, as on a machine without it
import polyprof
from polyprof.profiler import activity_rules, parse_activities
CPU = polyprof.ProfilerActivity.CPU
prof = polyprof.profile(activities=[CPU], schedule=polyprof.schedule(wait=1, warmup=1, active=1))
assert prof._step_tracker is None and prof.step_num == 0
rules = activity_rules()
assert rules.dict_items and rules.scan_first and not rules.activity_configs, rules
assert parse_activities([{CPU: ["CPU_OP"]}]) == (frozenset({CPU}), {CPU: frozenset({"CPU_OP"})})
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# ------------------------------------------------------------------ 4.4 activities


def _effective(activities: Any) -> list[str]:
    return sorted(a.name for a in activities if hasattr(a, "name") and not isinstance(a, str))


def torch_outcome(kwargs: dict[str, Any], run: bool) -> Any:
    """What torch.profiler.profile does with ``kwargs``: the exception type, or what it records."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof = tp.profile(**kwargs)
            acts = _effective(prof.activities)
            if hasattr(prof, "activity_configs"):  # torch 2.15+
                filters = {
                    a.name: sorted(c.activity_types)
                    for a, c in prof.activity_configs.items()
                    if c.activity_types is not None
                }
            else:
                filters = {a.name: sorted(v) for a, v in getattr(prof, "activity_filters", {}).items()}
            if run and "CUDA" not in acts:
                with prof:
                    workload()
    except Exception as exc:  # noqa: BLE001 - the oracle's exception type is the result
        return type(exc)
    return acts, filters


def polyprof_outcome(profile_cls: Any, kwargs: dict[str, Any], run: bool) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof = profile_cls(**kwargs)
            requested = prof.activities_requested
            acts = _effective(requested) if requested is not None else _effective(tp.supported_activities())
            filters = {a.name: sorted(v) for a, v in prof.activity_filters.items()}
            if run and "CUDA" not in acts:
                with prof:
                    workload()
    except Exception as exc:  # noqa: BLE001
        return exc
    return acts, filters


ACTIVITY_CASES = {
    "cpu": [PA.CPU],
    "cpu twice": [PA.CPU, PA.CPU],
    "cpu filter": [{PA.CPU: ["CPU_OP"]}],
    "cpu filter and cuda": [{PA.CPU: ["CPU_OP", "USER_ANNOTATION"]}, PA.CUDA],
    "cuda filter": [PA.CPU, {PA.CUDA: ["CONCURRENT_KERNEL"]}],
    "empty filter": [{PA.CPU: []}],
    "cpu and its filter": [PA.CPU, {PA.CPU: ["CPU_OP"]}],
    "two filters for cpu": [{PA.CPU: ["CPU_OP"]}, {PA.CPU: ["USER_ANNOTATION"]}],
    "unknown type name": [{PA.CPU: ["NOT_A_TYPE"]}],
    "lower-case type name": [{PA.CPU: ["cpu_op"]}],
    "device type name in a cpu filter": [{PA.CPU: ["CONCURRENT_KERNEL"]}],
    "filter as a string": [{PA.CPU: "CPU_OP"}],
    "filter None": [{PA.CPU: None}],
    "filter not iterable": [{PA.CPU: 5}],
    "string": ["cpu"],
    "string and cpu": [PA.CPU, "cpu"],
    "int": [0],
    "nested list": [[PA.CPU]],
    "empty": [],
    "dict as activities": {PA.CPU: ["CPU_OP"]},
    "not iterable": PA.CPU,
    "a string as activities": "cpu",
}
if hasattr(tp.profiler, "ProfilerActivityConfig"):  # torch 2.15+
    _Config = tp.profiler.ProfilerActivityConfig
    ACTIVITY_CASES["activity config"] = [{PA.CPU: _Config(activity_types=["CPU_OP"])}]
    ACTIVITY_CASES["activity config, all types"] = [{PA.CPU: _Config()}]
    ACTIVITY_CASES["activity config, unknown type"] = [{PA.CPU: _Config(activity_types=["NOT_A_TYPE"])}]


@pytest.mark.parametrize("case", list(ACTIVITY_CASES))
@pytest.mark.parametrize("frontend", ["polyprof.profile", "shim.TorchProfile"])
def test_activities_read_as_the_installed_torch_reads_them(case: str, frontend: str) -> None:
    kwargs = {"activities": ACTIVITY_CASES[case]}
    theirs = torch_outcome(kwargs, run=True)
    profile_cls = polyprof.profile if frontend == "polyprof.profile" else shim.TorchProfile
    ours = polyprof_outcome(profile_cls, kwargs, True)
    if isinstance(theirs, type):
        assert isinstance(ours, theirs), (case, theirs, ours)
        assert "valid" in str(ours) or "give each activity once" in str(ours), str(ours)
    else:
        assert ours == theirs, case


@pytest.mark.skipif("use_cuda" not in TORCH_PROFILE_PARAMS, reason="torch 2.14+ has no use_cuda")
@pytest.mark.parametrize(
    "activities",
    [
        [PA.CUDA],
        [PA.CPU],
        None,
        [{PA.CUDA: ["CONCURRENT_KERNEL"]}] if activity_rules().dict_items else [PA.XPU],
    ],
)
@pytest.mark.parametrize("use_cuda", [False, True])
def test_use_cuda_counts_only_towards_the_empty_check_as_in_torch(activities: Any, use_cuda: bool) -> None:
    kwargs = {"activities": activities, "use_cuda": use_cuda}
    theirs = torch_outcome(kwargs, run=False)
    for cls in (polyprof.profile, shim.TorchProfile):
        ours = polyprof_outcome(cls, kwargs, run=False)
        if isinstance(theirs, type):
            assert isinstance(ours, theirs), (cls, ours)
        else:
            assert ours == theirs


@pytest.mark.skipif(not activity_rules().dict_items, reason="this torch takes no activity filters")
def test_cpu_activity_type_names_are_the_ones_torch_accepts() -> None:
    accepted = [
        name
        for name in KINETO_TYPE_NAMES
        if not isinstance(torch_outcome({"activities": [{PA.CPU: [name]}]}, run=True), type)
    ]
    assert sorted(accepted) == sorted(CPU_GROUP_ACTIVITY_TYPES)
    valid = r"valid names for ProfilerActivity.CPU \(case matters\): CPU_OP, CPU_INSTANT_EVENT"
    with pytest.raises(RuntimeError, match=valid):
        polyprof.profile(activities=[{PA.CPU: ["NOT_A_TYPE"]}])


def _recorded(prof: Any, tmp_path: Path, name: str) -> tuple[collections.Counter, collections.Counter]:
    path = tmp_path / f"{name}.json"
    prof.export_chrome_trace(str(path))
    with path.open(encoding="utf-8") as f:
        trace = json.load(f)
    spans = collections.Counter(
        (e.get("cat"), e.get("name"))
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") != "Trace"
    )
    events = collections.Counter((e.name, str(e.device_type)) for e in prof.events())
    return events, spans


@pytest.mark.skipif(not activity_rules().dict_items, reason="this torch takes no activity filters")
@pytest.mark.parametrize(
    "types", [["CPU_OP"], ["USER_ANNOTATION"], [], ["CPU_OP", "USER_ANNOTATION"], ["CPU_INSTANT_EVENT"]]
)
def test_activity_filter_records_what_torch_records(types: list[str], tmp_path: Path) -> None:
    """Same filter, same workload: the same events() and the same trace spans as torch.

    torch applies the filter to the trace its Kineto writes; its ``events()`` keep every op.
    """
    activities = [{PA.CPU: types}]
    with tp.profile(activities=activities) as theirs:
        workload()
    with polyprof.profile(activities=activities) as ours:
        workload()
    their_events, their_spans = _recorded(theirs, tmp_path, "torch")
    our_events, our_spans = _recorded(ours, tmp_path, "polyprof")
    assert our_events == their_events
    assert our_spans == their_spans


# ------------------------------------------------------------------ constructor arguments

#: Every argument some supported torch's class takes, each with a harmless value, and one none takes.
TORCH_PROFILE_ARGS = {
    "activities": [PA.CPU],
    "schedule": None,
    "on_trace_ready": None,
    "record_shapes": False,
    "profile_memory": False,
    "with_stack": False,
    "with_flops": False,
    "with_modules": False,
    "experimental_config": None,
    "execution_trace_observer": None,
    "acc_events": False,
    "use_cuda": None,
    "custom_trace_id_callback": None,
    "post_processing_timeout_s": 1.5,
    "activity_filters": None,
    "enabled": True,
    "not_an_argument": 1,
}
AUTOGRAD_PROFILE_ARGS = {
    "use_cuda": False,
    "use_device": None,
    "record_shapes": False,
    "with_flops": False,
    "profile_memory": False,
    "with_stack": False,
    "with_modules": False,
    "use_kineto": False,
    "use_cpu": True,
    "experimental_config": None,
    "acc_events": False,
    "custom_trace_id_callback": None,
    "post_processing_timeout_s": 1.5,
    "activity_filters": None,
    "_profiler_extensions": None,
    "activities": None,
    "not_an_argument": 1,
}
LEGACY_PROFILE_ARGS = {
    "use_cuda": False,
    "record_shapes": False,
    "with_flops": False,
    "profile_memory": False,
    "with_stack": False,
    "with_modules": False,
    "use_kineto": False,
    "not_an_argument": 1,
}


def _construct(cls: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return exc
    return "ok"


@pytest.mark.parametrize(
    ("torch_cls", "shim_name", "args"),
    [
        (tp.profile, "TorchProfile", TORCH_PROFILE_ARGS),
        (autograd_profiler.profile, "AutogradProfile", AUTOGRAD_PROFILE_ARGS),
        (profiler_legacy.profile, "LegacyProfile", LEGACY_PROFILE_ARGS),
    ],
)
def test_shims_take_the_arguments_the_installed_torch_takes(
    torch_cls: Any, shim_name: str, args: dict
) -> None:
    shim_cls = getattr(shim, shim_name)
    for name, value in args.items():
        theirs = _construct(torch_cls, **{name: value})
        ours = _construct(shim_cls, **{name: value})
        if theirs == "ok":
            assert ours == "ok", (name, ours)
        else:
            assert isinstance(ours, type(theirs)), (name, theirs, ours)
            assert name in str(ours) and "takes (" in str(ours), str(ours)
    # Positional arguments: torch.profiler.profile takes none; the other two take ``enabled`` only.
    assert isinstance(_construct(torch_cls, True, True), TypeError)
    assert isinstance(_construct(shim_cls, True, True), TypeError)
    assert (_construct(torch_cls, True) == "ok") == (_construct(shim_cls, True) == "ok")


def test_shim_argument_check_follows_torch_while_installed() -> None:
    with shim.shimmed():
        assert tp.profile is shim.TorchProfile
        for name, value in TORCH_PROFILE_ARGS.items():
            ok = _construct(tp.profile, **{name: value}) == "ok"
            assert ok == (name in TORCH_PROFILE_PARAMS), name


def test_subclasses_of_the_shims_take_their_own_arguments() -> None:
    for shim_cls in (shim.TorchProfile, shim.AutogradProfile, shim.LegacyProfile):

        class Custom(shim_cls):  # as a library subclassing torch's class while the shims are in place
            def __init__(self, label: str, **kwargs: Any) -> None:
                self.label = label
                super().__init__(**kwargs)

        assert Custom("mine").label == "mine"


def test_negative_post_processing_timeout_refused_as_torch_refuses_it() -> None:
    kwargs = {"activities": [PA.CPU], "post_processing_timeout_s": -1.0}
    theirs = torch_outcome(kwargs, run=True)
    assert isinstance(theirs, type)  # ValueError (2.11+), TypeError (no such argument before)
    assert isinstance(polyprof_outcome(shim.TorchProfile, kwargs, True), theirs)
    assert isinstance(_construct(polyprof.profile, **kwargs), ValueError)


# ------------------------------------------------------------------ 4.6 post_processing_timeout_s


@pytest.mark.skipif("post_processing_timeout_s" not in TORCH_PROFILE_PARAMS, reason="torch < 2.11")
def test_post_processing_timeout_is_a_documented_difference() -> None:
    """torch cuts its Python post-processing at the deadline; polyprof's is columnar and keeps every event.

    docs/user-guide.md says so; this pins both sides, so that a change in either is noticed.
    """
    kwargs = {"activities": [PA.CPU], "post_processing_timeout_s": 0.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tp.profile(**kwargs) as theirs:
            workload()
        with tp.profile(activities=[PA.CPU]) as full:
            workload()
        with polyprof.profile(**kwargs) as ours:
            workload()
    assert len(theirs.events()) == 0 < len(full.events())
    assert sorted(e.name for e in ours.events()) == sorted(e.name for e in full.events())
    guide = (REPO / "docs" / "user-guide.md").read_text(encoding="utf-8")
    assert "post_processing_timeout_s" in guide
