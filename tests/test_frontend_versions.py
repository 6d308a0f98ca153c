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
import types
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
from polyprof import shim  # noqa: E402
from polyprof.base import torch_support  # noqa: E402
from polyprof.base.activity import CPU_GROUP_ACTIVITY_TYPES  # noqa: E402
from polyprof.frontends.profiler import activity_rules  # noqa: E402

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
from polyprof.frontends.profiler import activity_rules, parse_activities
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


# ------------------------------------------------------------------ deprecated settings (2.14+)

#: Settings some torch release deprecates (torch_support.DEPRECATABLE_SETTINGS), each as the
#: arguments that turn it on; the experimental ones only where this torch's _ExperimentalConfig
#: has the option (2.15 dropped profiler_metrics and profiler_measure_per_kernel).
DEPRECATED_CASES: dict[str, dict[str, Any]] = {"none": {}, "with_modules": {"with_modules": True}}
for _option, _value in (
    ("adjust_profiler_step", True),
    ("profiler_metrics", ["m1", "m2"]),
    ("profiler_measure_per_kernel", True),
):
    if _option in torch_support.installed().experimental_fields:
        DEPRECATED_CASES[_option] = {
            "experimental_config": torch._C._profiler._ExperimentalConfig(**{_option: _value})
        }
if "profiler_metrics" in DEPRECATED_CASES and "adjust_profiler_step" in DEPRECATED_CASES:
    DEPRECATED_CASES["everything"] = {
        "with_modules": True,
        "experimental_config": torch._C._profiler._ExperimentalConfig(
            adjust_profiler_step=True, profiler_metrics=["m"], profiler_measure_per_kernel=True
        ),
    }
_DEPRECATIONS = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)


def _deprecations(run: Any) -> list[tuple[str, str, str, str]]:
    """(phase, category, message, file name) of each deprecation warning while ``run`` runs.

    ``run`` is a generator function: each ``yield`` names the phase the next part runs in.
    """
    seen: list[tuple[str, str, str, str]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for phase in run():
            seen.extend(
                (phase, w.category.__name__, str(w.message), Path(w.filename).name)
                for w in caught
                if issubclass(w.category, _DEPRECATIONS)
            )
            caught.clear()
    return seen


def _profile_run(cls: Any, kwargs: dict[str, Any], **more: Any) -> Any:
    def run() -> Any:
        prof = cls(activities=[PA.CPU], **kwargs, **more)
        yield "construct"
        if more.get("schedule") is None:
            with prof:
                workload()
        else:
            with prof:
                for _ in range(4):
                    workload()
                    prof.step()
        yield "record"

    return run


@pytest.mark.parametrize("case", list(DEPRECATED_CASES))
@pytest.mark.parametrize("frontend", ["polyprof.profile", "shim.TorchProfile"])
def test_deprecated_settings_warn_as_torch_profile_warns(case: str, frontend: str) -> None:
    """The same FutureWarnings as torch.profiler.profile: words, category, when (a cycle's
    preparation, not construction) and where (the profiler's own file, not the caller's line)."""
    kwargs = DEPRECATED_CASES[case]
    profile_cls = polyprof.profile if frontend == "polyprof.profile" else shim.TorchProfile
    theirs = _deprecations(_profile_run(tp.profile, kwargs))
    ours = _deprecations(_profile_run(profile_cls, kwargs))
    assert [w[:3] for w in ours] == [w[:3] for w in theirs]
    assert {w[3] for w in theirs} <= {"profiler.py"} and {w[3] for w in ours} <= {"profiler.py"}
    if case == "with_modules" and torch_support.installed().at_least(2, 15):
        assert theirs, "torch 2.15 deprecates with_modules"
    if case == "adjust_profiler_step" and torch_support.installed().at_least(2, 15):
        assert theirs, "torch 2.15 deprecates adjust_profiler_step"


@pytest.mark.parametrize("acc_events", [False, True])
def test_deprecation_warnings_come_with_each_prepared_cycle_as_in_torch(acc_events: bool) -> None:
    """torch makes its autograd profile, which warns, for every cycle; with acc_events only once."""
    kwargs = DEPRECATED_CASES.get("everything", DEPRECATED_CASES["with_modules"])
    schedule = {"schedule": tp.schedule(wait=0, warmup=1, active=1, repeat=2), "acc_events": acc_events}
    theirs = _deprecations(_profile_run(tp.profile, kwargs, **schedule))
    ours = _deprecations(_profile_run(polyprof.profile, kwargs, **schedule))
    assert [w[:3] for w in ours] == [w[:3] for w in theirs]


@pytest.mark.parametrize("case", list(DEPRECATED_CASES))
@pytest.mark.parametrize("enabled", [True, False])
def test_autograd_shim_warns_when_made_as_torch_autograd_profile_does(case: str, enabled: bool) -> None:
    """torch.autograd.profiler.profile warns in __init__ (when enabled), naming the caller's line."""
    kwargs = DEPRECATED_CASES[case]

    def run(cls: Any) -> Any:
        def steps() -> Any:
            prof = cls(enabled, **kwargs)
            yield "construct"
            with prof:
                workload()
            yield "record"

        return steps

    theirs = _deprecations(run(autograd_profiler.profile))
    ours = _deprecations(run(shim.AutogradProfile))
    assert ours == theirs  # the file too: both name this test's line
    assert {w[3] for w in ours} <= {Path(__file__).name}


# ------------------------------------------------------------------ activity_configs (2.15+)


@pytest.mark.parametrize("case", [*ACTIVITY_CASES, "default"])
@pytest.mark.parametrize("frontend", ["polyprof.profile", "shim.TorchProfile"])
def test_activity_configs_attribute_as_in_torch(case: str, frontend: str) -> None:
    """torch 2.15 keeps ``activity_configs``: each dict item's key, as given, and its
    ProfilerActivityConfig (the one given, or one made of the list); older torch has none."""
    kwargs = {} if case == "default" else {"activities": ACTIVITY_CASES[case]}
    profile_cls = polyprof.profile if frontend == "polyprof.profile" else shim.TorchProfile
    if isinstance(torch_outcome(kwargs, run=True), type):  # test_activities_read_as_the_installed_...
        pytest.skip("torch refuses these activities (when made, or when it starts)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = tp.profile(**kwargs)
        ours = profile_cls(**kwargs)
    assert hasattr(ours, "activity_configs") == hasattr(theirs, "activity_configs")
    if hasattr(theirs, "activity_configs"):
        assert ours.activity_configs == theirs.activity_configs
        assert [type(k) for k in ours.activity_configs] == [type(k) for k in theirs.activity_configs]
        assert [type(v) for v in ours.activity_configs.values()] == [
            type(v) for v in theirs.activity_configs.values()
        ]


@pytest.mark.skipif(not activity_rules().activity_configs, reason="torch < 2.15 has no activity_configs")
def test_activity_configs_keep_the_config_given() -> None:
    config = tp.profiler.ProfilerActivityConfig(activity_types=["CPU_OP"])
    ours = polyprof.profile(activities=iter([{PA.CPU: config}]))  # an iterator is read once
    assert ours.activity_configs[PA.CPU] is config
    assert ours.activity_filters == {polyprof.ProfilerActivity.CPU: frozenset({"CPU_OP"})}


# ------------------------------------------------------------------ names in the Chrome trace


def _named_function(filename: str, name: str) -> Any:
    """A function whose code object has these file and function names (as generated code has).

    It calls nothing: a call from it would carry its file name in the callee's ``CallFrom`` arg,
    which torch writes raw (quotes included) on every release.
    """

    def template() -> None:
        return None

    return types.FunctionType(template.__code__.replace(co_filename=filename, co_name=name), {})


#: Names whose characters torch's trace writer changes: backslashes and newlines (every release),
#: double quotes (2.14+; before, torch writes them raw and its file is not JSON).
PLAIN_NAMES = (("pp_q_dir\\file.py", "pp_q\\back"), ("pp_q_nl.py", "pp_q_new\nline"))
QUOTED_NAMES = (('pp_q"file.py', 'pp_q"name'),)


def _warm_up_stack_tracing() -> None:
    """One torch profile with stacks first, which nothing reads.

    The first one in a process imports ``torch.profiler.python_tracer`` while its Python tracer
    still runs; torch 2.13 keeps that module frame's name as a pointer into its code object,
    which is freed when the import ends, so reading that profile's ``events()`` can fail with a
    UnicodeDecodeError (pytorch/pytorch#186359). A test that compares names must not read it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tp.profile(activities=[PA.CPU], with_stack=True):
            torch.ones(1)


def _names_run(profile_cls: Any, names: tuple[tuple[str, str], ...], tmp_path: Path, label: str) -> Any:
    _warm_up_stack_tracing()
    functions = [_named_function(*pair) for pair in names]
    with profile_cls(activities=[PA.CPU], with_stack=True) as prof:
        for function, (_, name) in zip(functions, names, strict=True):
            function()
            with tp.record_function(f"pp_q_range {name}"):
                torch.ones(1)
    path = tmp_path / f"{label}.json"
    prof.export_chrome_trace(str(path))
    text = path.read_text(encoding="utf-8")
    events = collections.Counter(e.name for e in prof.events() if "pp_q" in e.name)
    averages = collections.Counter(e.key for e in prof.key_averages() if "pp_q" in e.key)
    try:
        trace = json.loads(text)
    except ValueError:
        return None, events, averages
    spans = collections.Counter(
        (e.get("cat"), e["name"]) for e in trace["traceEvents"] if e.get("ph") == "X" and "pp_q" in e["name"]
    )
    return spans, events, averages


@pytest.mark.parametrize("names", [PLAIN_NAMES, QUOTED_NAMES], ids=["backslash-newline", "quotes"])
def test_names_in_the_trace_written_as_torch_writes_them(names: Any, tmp_path: Path) -> None:
    """Python functions and ranges: the trace's names as torch's writer words them; events() and
    key_averages() keep the names as recorded, as torch's do."""
    their_spans, their_events, their_averages = _names_run(tp.profile, names, tmp_path, "torch")
    our_spans, our_events, our_averages = _names_run(polyprof.profile, names, tmp_path, "polyprof")
    assert our_events == their_events
    assert our_averages == their_averages
    assert our_spans is not None, "polyprof's trace must be JSON"
    if their_spans is None:
        # torch 2.6 to 2.13 write double quotes raw (not JSON): polyprof escapes them, and writes
        # everything else as torch does
        assert not torch_support.installed().at_least(2, 14)
        assert our_spans == collections.Counter(
            {(cat, name.replace("\\", "/").replace("\n", "")): n for (cat, name), n in our_spans.items()}
        )
        assert any('"' in name for _, name in our_spans)
        if not torch_support.installed().has_accessor("is_python_function"):
            # 2.6 to 2.11: polyprof takes the Python frames from torch's own trace of the result,
            # which these quotes make unreadable (docs/torch-versions.md, known gaps)
            assert not any(cat == "python_function" for cat, _ in our_spans)
            pytest.xfail("torch 2.6-2.11: a double quote in a Python frame's name loses the frames")
    else:
        assert our_spans == their_spans
    assert any(cat == "user_annotation" for cat, _ in our_spans)
    assert any(cat == "python_function" for cat, _ in our_spans)


#: Names with characters outside printable ASCII (a tab, non-ASCII letters), which torch 2.7+ writes
#: as "unknown" (Kineto 7ae1ce85) and torch 2.6 raw (a raw tab is not JSON).
UNPRINTABLE_NAMES = (("pp_q_tab.py", "pp_q\ttab"), ("pp_q_u.py", "pp_q_é_中"))


def test_names_torch_writes_as_unknown_are_kept(tmp_path: Path) -> None:
    """A deliberate difference (docs/torch-versions.md): polyprof's trace keeps these names, JSON-escaped;
    events() and key_averages() keep them as torch's do."""
    names = UNPRINTABLE_NAMES
    their_spans, their_events, their_averages = _names_run(tp.profile, names, tmp_path, "torch")
    our_spans, our_events, our_averages = _names_run(polyprof.profile, names, tmp_path, "polyprof")
    assert our_events == their_events
    assert our_averages == their_averages
    assert our_spans is not None, "polyprof's trace must be JSON"
    if their_spans:  # a torch that writes these names: as it writes them
        assert our_spans == their_spans
        return
    # torch 2.7+: every one of them is "unknown" (2.6: its file is not JSON)
    assert their_spans is None or torch_support.installed().at_least(2, 7)
    ranges = {name for cat, name in our_spans if cat == "user_annotation"}
    assert ranges == {f"pp_q_range {name}" for _, name in names}
    if torch_support.installed().has_accessor("is_python_function"):
        # 2.12+: the frames come from events(), with their names (before, from torch's own trace)
        frames = {name for cat, name in our_spans if cat == "python_function"}
        assert all(any(name in frame for frame in frames) for _, name in names), frames
