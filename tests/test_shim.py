"""polyprof.shim: torch's profiler names give polyprof's profilers while installed, and torch's after.

In-process: every test leaves the shims uninstalled and torch's objects back
in place (the autouse fixture checks it).
"""

from __future__ import annotations

import inspect
import json
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples

torch = pytest.importorskip("torch")
import torch.autograd.profiler as autograd_profiler  # noqa: E402
import torch.profiler.profiler as torch_profiler_module  # noqa: E402
from torch.autograd import profiler_legacy  # noqa: E402

import polyprof  # noqa: E402
from polyprof import shim  # noqa: E402
from polyprof.runtime.recording import recording_gate  # noqa: E402

#: torch's own objects, captured before any test installs the shims. Held as attributes of an
#: object, which install() does not scan: a module global bound to them (like the next line) would
#: be rebound to polyprof's while the shims are installed.
ORIGINAL = types.SimpleNamespace(
    torch=torch_profiler_module.profile,
    autograd=autograd_profiler.profile,
    legacy=profiler_legacy.profile,
)
MODULE_GLOBAL_ALIAS = torch_profiler_module.profile

NAMED = (
    (torch.profiler, "profile", ORIGINAL.torch),
    (torch_profiler_module, "profile", ORIGINAL.torch),
    (autograd_profiler, "profile", ORIGINAL.autograd),
    (profiler_legacy, "profile", ORIGINAL.legacy),
)


def legacy_available() -> bool:
    try:
        import polyprof.legacy  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def assert_torch_restored() -> None:
    for module, name, original in NAMED:
        assert getattr(module, name) is original, f"{module.__name__}.{name}"
    assert torch_profiler_module.prof is autograd_profiler


@pytest.fixture(autouse=True)
def always_uninstalled():
    shim.uninstall()
    yield
    shim.uninstall()
    assert not shim.installed()
    assert_torch_restored()


@pytest.fixture
def fake_module(monkeypatch):
    """A user module in sys.modules, as ``import user_code`` leaves it."""
    module = types.ModuleType("pp_shim_user_code")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def small_workload() -> None:
    a = torch.ones(4, 4)
    torch.mm(a, a) + 1


# ------------------------------------------------------------------ identity


def test_install_replaces_torch_names_and_uninstall_restores_the_same_objects() -> None:
    shim.install()
    assert shim.installed()
    assert torch.profiler.profile is shim.TorchProfile
    assert torch_profiler_module.profile is shim.TorchProfile
    assert autograd_profiler.profile is shim.AutogradProfile
    assert issubclass(shim.TorchProfile, polyprof.profile)
    if legacy_available():
        from polyprof.frontends import legacy

        assert profiler_legacy.profile is shim.LegacyProfile
        assert issubclass(shim.LegacyProfile, legacy.profile)
    else:
        assert profiler_legacy.profile is ORIGINAL.legacy
    # The helpers stay torch's: polyprof's profile takes them as they are.
    assert torch.profiler.schedule.__module__.startswith("torch")
    assert torch.profiler.record_function.__module__.startswith("torch")
    bindings = shim.installed_bindings()
    assert "torch.profiler.profile" in bindings and "torch.autograd.profiler.profile" in bindings

    shim.uninstall()
    assert not shim.installed()
    assert shim.installed_bindings() == ()
    assert_torch_restored()


def test_install_twice_is_idempotent_and_uninstall_without_install_does_nothing() -> None:
    shim.uninstall()
    assert_torch_restored()
    shim.install()
    bindings = shim.installed_bindings()
    shim.install()
    assert shim.installed_bindings() == bindings
    assert torch.profiler.profile is shim.TorchProfile
    shim.uninstall()  # one uninstall undoes it all
    assert_torch_restored()
    shim.uninstall()
    assert_torch_restored()


def test_shimmed_installs_for_the_block_only() -> None:
    with shim.shimmed():
        assert shim.installed() and torch.profiler.profile is shim.TorchProfile
    assert_torch_restored()
    with pytest.raises(KeyError), shim.shimmed():
        raise KeyError("inside")
    assert not shim.installed()
    assert_torch_restored()


def test_shimmed_inside_install_leaves_the_shims_installed() -> None:
    shim.install()
    with shim.shimmed():
        with shim.shimmed():
            pass
        assert shim.installed()
    assert shim.installed() and torch.profiler.profile is shim.TorchProfile


OPS = st.lists(st.sampled_from(["install", "uninstall", "enter", "exit"]), max_size=12)


@settings(
    max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_any_sequence_of_calls_keeps_torch_names_consistent(ops) -> None:
    """torch's names are the shims' exactly while installed() says so, and torch's objects otherwise."""
    model, blocks = False, []
    try:
        for op in ops:
            if op == "install":
                shim.install()
                model = True
            elif op == "uninstall":
                shim.uninstall()
                model = False
            elif op == "enter":
                block = shim.shimmed()
                block.__enter__()
                blocks.append((block, model))
                model = True
            elif blocks:
                block, was = blocks.pop()
                block.__exit__(None, None, None)
                model = model if was else False
            assert shim.installed() is model
            if model:
                assert torch.profiler.profile is shim.TorchProfile
                assert autograd_profiler.profile is shim.AutogradProfile
            else:
                assert_torch_restored()
    finally:
        while blocks:
            blocks.pop()[0].__exit__(None, None, None)
        shim.uninstall()


# ------------------------------------------------------------------ names bound elsewhere


def test_globals_bound_before_install_are_rebound_then_restored(fake_module) -> None:
    fake_module.profile = ORIGINAL.torch  # from torch.profiler import profile
    fake_module.TorchProf = ORIGINAL.torch  # ... as TorchProf
    fake_module.autograd_profile = ORIGINAL.autograd
    fake_module.legacy_profile = ORIGINAL.legacy
    fake_module.ours = polyprof.profile  # chosen on purpose: never touched
    shim.install()
    assert fake_module.profile is shim.TorchProfile
    assert fake_module.TorchProf is shim.TorchProfile
    assert fake_module.autograd_profile is shim.AutogradProfile
    if legacy_available():
        assert fake_module.legacy_profile is shim.LegacyProfile
    assert fake_module.ours is polyprof.profile
    assert "pp_shim_user_code.TorchProf" in shim.installed_bindings()
    # polyprof's own modules keep their own names.
    assert polyprof.profile is polyprof.frontends.profiler.profile
    shim.uninstall()
    assert fake_module.profile is ORIGINAL.torch
    assert fake_module.TorchProf is ORIGINAL.torch
    assert fake_module.autograd_profile is ORIGINAL.autograd
    assert fake_module.legacy_profile is ORIGINAL.legacy
    assert fake_module.ours is polyprof.profile


def test_this_modules_own_global_alias_follows_the_shims() -> None:
    assert MODULE_GLOBAL_ALIAS is ORIGINAL.torch
    shim.install()
    assert MODULE_GLOBAL_ALIAS is shim.TorchProfile
    assert f"{__name__}.MODULE_GLOBAL_ALIAS" in shim.installed_bindings()
    shim.uninstall()
    assert MODULE_GLOBAL_ALIAS is ORIGINAL.torch


def test_names_imported_while_installed_go_back_to_torch(fake_module) -> None:
    shim.install()
    from torch.profiler import profile  # what a module imported now gets

    fake_module.profile = profile
    fake_module.TorchProfile = shim.TorchProfile  # from polyprof.shim import TorchProfile: asked for by name
    shim.uninstall()
    assert fake_module.profile is ORIGINAL.torch
    assert fake_module.TorchProfile is shim.TorchProfile


def test_names_rebound_by_someone_else_are_left_alone(fake_module, monkeypatch) -> None:
    fake_module.profile = ORIGINAL.torch
    shim.install()
    other = type("OtherProfiler", (), {})
    fake_module.profile = other
    torch.profiler.profile = other
    try:
        shim.uninstall()
        assert fake_module.profile is other
        assert torch.profiler.profile is other
        assert torch_profiler_module.profile is ORIGINAL.torch
    finally:
        torch.profiler.profile = ORIGINAL.torch


def test_lazy_modules_and_odd_sys_modules_entries_are_not_touched(monkeypatch) -> None:
    class LazyModule(types.ModuleType):
        def __getattribute__(self, name):
            raise AssertionError(f"the shims touched a lazy module's attribute {name!r}")

    class Odd:
        def __getattribute__(self, name):
            raise AssertionError(f"the shims touched a non-module's attribute {name!r}")

    lazy = LazyModule("pp_shim_lazy")
    types.ModuleType.__dict__["__dict__"].__get__(lazy)["profile"] = ORIGINAL.torch
    monkeypatch.setitem(sys.modules, "pp_shim_lazy", lazy)
    monkeypatch.setitem(sys.modules, "pp_shim_odd", Odd())
    shim.install()
    # Rebound through the module's dict, with no attribute access.
    assert "pp_shim_lazy.profile" in shim.installed_bindings()
    shim.uninstall()
    assert types.ModuleType.__dict__["__dict__"].__get__(lazy)["profile"] is ORIGINAL.torch


def test_install_without_torch_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees when torch is missing
    with pytest.raises(shim.TorchMissingError, match="need torch") as info:
        shim.install()
    assert isinstance(info.value, ImportError) and isinstance(info.value, polyprof.PolyprofError)
    assert not shim.installed()


def test_torch_classes_made_before_install_keep_recording_with_torch() -> None:
    early = ORIGINAL.torch(activities=[torch.profiler.ProfilerActivity.CPU])
    shim.install()
    with early:
        small_workload()
    assert type(early.profiler) is ORIGINAL.autograd  # torch's backend, not polyprof's
    assert "aten::mm" in {e.key for e in early.key_averages()}


# ------------------------------------------------------------------ torch.profiler.profile


def test_torch_schedule_trace_handler_and_record_function_drive_the_shimmed_profile(tmp_path) -> None:
    with shim.shimmed():
        from torch.profiler import (
            ProfilerActivity,
            profile,
            record_function,
            schedule,
            tensorboard_trace_handler,
        )

        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=tensorboard_trace_handler(str(tmp_path), worker_name="worker0"),
            record_shapes=True,
        ) as prof:
            for step in range(6):
                with record_function("step_body"):
                    torch.ones(4) + step
                prof.step()
    assert type(prof) is shim.TorchProfile and type(prof).__module__ == "polyprof.shim"
    files = list(tmp_path.glob("worker0.*.pt.trace.json"))
    assert len(files) == 1  # one cycle: steps 2 and 3 recorded, then repeat=1 ends it
    trace = json.loads(files[0].read_text())
    names = Counter(e.get("name") for e in trace["traceEvents"])
    assert names["ProfilerStep#2"] == 1 and names["ProfilerStep#3"] == 1
    assert "ProfilerStep#1" not in names and "ProfilerStep#4" not in names
    assert names["step_body"] == 2 and names["aten::add"] == 2
    assert trace["record_shapes"] == 1
    assert {e.key for e in prof.key_averages()} >= {"step_body", "aten::add"}


def test_shimmed_profile_sees_the_same_ops_as_torch() -> None:
    with ORIGINAL.torch(record_shapes=True) as theirs:
        small_workload()
    with shim.shimmed(), torch.profiler.profile(record_shapes=True) as ours:
        small_workload()

    def shapes(prof):
        return Counter((e.key, str(e.input_shapes)) for e in prof.key_averages(group_by_input_shape=True))

    assert shapes(ours) == shapes(theirs)


# ------------------------------------------------------------------ torch.autograd.profiler.profile


def test_autograd_profile_matches_torch_and_has_its_methods(tmp_path) -> None:
    with ORIGINAL.autograd(record_shapes=True) as theirs:
        small_workload()
    with shim.shimmed(), torch.autograd.profiler.profile(record_shapes=True) as ours:
        small_workload()
    assert isinstance(ours, shim.AutogradProfile)
    assert Counter(e.name for e in ours.function_events) == Counter(e.name for e in theirs.function_events)
    assert {(e.key, str(e.input_shapes)) for e in ours.key_averages(group_by_input_shape=True)} == {
        (e.key, str(e.input_shapes)) for e in theirs.key_averages(group_by_input_shape=True)
    }
    # table() is of the raw events (one row per call), as torch's is.
    table = ours.table(row_limit=-1)
    assert table.splitlines()[1] == theirs.table(row_limit=-1).splitlines()[1]
    assert table.count("aten::mm") == 1 and "Input Shapes" in table
    assert str(ours) == str(ours.function_events)
    assert ours.self_cpu_time_total > 0
    assert ours.total_average().key == "Total"
    path = ours.export_chrome_trace(str(tmp_path / "t.json"), metadata={"run": '"nightly"', "epoch": "3"})
    trace = json.loads(Path(path).read_text())
    assert trace["run"] == "nightly" and trace["epoch"] == 3
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    with pytest.raises(ValueError, match="raw JSON"):
        ours.export_chrome_trace(str(tmp_path / "u.json"), metadata={"bad": "not json"})
    with pytest.raises(RuntimeError, match="not reentrant"):
        ours.__enter__()


def _has(obj: object, name: str) -> bool:
    """Whether ``obj`` has ``name``, without running a property (torch's raise before the end)."""
    return hasattr(type(obj), name) or name in vars(obj)


def test_autograd_profile_has_torchs_autograd_api_not_the_schedule_api() -> None:
    """It composes polyprof.profile: no start()/stop()/step(), which torch's autograd profile lacks.

    As a subclass of polyprof.profile it had them, and ``AutogradProfile(enabled=False).start()``
    recorded although the profile was disabled.
    """
    theirs, ours = ORIGINAL.autograd(), shim.AutogradProfile()
    for name in ("start", "stop", "step", "schedule", "on_trace_ready", "step_num", "prepare_trace"):
        assert _has(ours, name) == _has(theirs, name) == False, name  # noqa: E712
    for name in (
        "enabled",
        "entered",
        "record_shapes",
        "with_flops",
        "profile_memory",
        "with_stack",
        "with_modules",
        "use_cpu",
        "acc_events",
        "custom_trace_id_callback",
        "function_events",
        "table",
        "key_averages",
        "total_average",
        "self_cpu_time_total",
        "export_chrome_trace",
        "export_stacks",
        "toggle_collection_dynamic",
    ):
        assert _has(theirs, name) and _has(ours, name), name
    assert not issubclass(shim.AutogradProfile, polyprof.profile)
    with shim.shimmed(), torch.autograd.profiler.profile() as prof:
        assert isinstance(prof, torch.autograd.profiler.profile)  # the shimmed class
        small_workload()
    assert "aten::mm" in {e.key for e in prof.key_averages()}


def test_autograd_profile_that_failed_to_start_may_be_entered_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYPROF_DISABLE_PLUGIN_AUTOLOAD", "1")  # keeps an installed polyprof-cuda out
    prof = shim.AutogradProfile(use_device="cuda")
    for _ in range(2):  # the second entry used to raise "not reentrant" though nothing was recorded
        with pytest.raises(polyprof.ActivityUnavailableError, match="polyprof-cuda"), prof:
            pass
    assert not prof.entered


def test_autograd_profile_arguments_map_as_documented() -> None:
    with pytest.warns(UserWarning, match="The bogus is not a valid device option"):
        prof = shim.AutogradProfile(use_device="bogus", use_kineto=True)
    assert prof.activities == {polyprof.ProfilerActivity.CPU}
    torch_params = inspect.signature(torch.autograd.profiler.profile).parameters
    if "use_cuda" in torch_params:  # removed in torch 2.14
        with pytest.warns(FutureWarning, match="use_cuda"):
            prof = shim.AutogradProfile(use_cuda=True)
        assert prof.activities == {polyprof.ProfilerActivity.CPU, polyprof.ProfilerActivity.CUDA}
    prof = shim.AutogradProfile(use_device="xpu", use_cpu=False, use_kineto=True)
    assert prof.activities == {polyprof.ProfilerActivity.XPU}
    # torch raises AssertionError here; polyprof's error is both.
    with pytest.raises(AssertionError, match="No activities specified"):
        shim.AutogradProfile(use_cpu=False, use_kineto=True)
    with pytest.raises(ValueError, match="No activities specified"):
        shim.AutogradProfile(use_cpu=False, use_kineto=True)
    # Device-only needs use_kineto=True, in torch and in the shim (tests/test_use_cuda.py).
    with pytest.raises(AssertionError, match="Device-only events supported only with Kineto"):
        shim.AutogradProfile(use_device="xpu", use_cpu=False)
    prof = shim.AutogradProfile(with_flops=True)
    assert prof.record_shapes and prof.with_flops
    if "activity_filters" in torch_params:  # torch 2.12+
        prof = shim.AutogradProfile(activity_filters={torch.profiler.ProfilerActivity.CPU: {"CPU_OP"}})
        assert prof.activity_filters == {polyprof.ProfilerActivity.CPU: frozenset({"CPU_OP"})}


def test_autograd_profile_for_a_device_without_its_plugin_names_the_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POLYPROF_DISABLE_PLUGIN_AUTOLOAD", "1")  # keeps an installed polyprof-cuda out
    prof = shim.AutogradProfile(use_device="cuda")
    with pytest.raises(polyprof.ActivityUnavailableError, match="polyprof-cuda"), prof:
        pass


def test_disabled_autograd_profile_records_nothing_and_says_so() -> None:
    with shim.AutogradProfile(enabled=False) as prof:
        small_workload()
    assert prof is not None and not prof.enabled
    for ask in (prof.key_averages, prof.table, prof.total_average, lambda: prof.function_events):
        with pytest.raises(shim.ProfilerDisabledError, match="enabled=False"):
            ask()
    assert "disabled" in repr(prof)


# ------------------------------------------------------------------ enabled and record-once, one rule


#: The two frontends with torch's enabled/record-once rule (polyprof.runtime.recording.RecordOnce).
RECORD_ONCE_FRONTENDS = ("legacy", "autograd")


def record_once_frontend(name: str, **kwargs: Any) -> Any:
    if name == "legacy":
        return pytest.importorskip("polyprof.legacy").profile(**kwargs)
    return shim.AutogradProfile(**kwargs)


@pytest.mark.parametrize("frontend", RECORD_ONCE_FRONTENDS)
def test_a_profile_records_once_with_the_same_words(frontend: str) -> None:
    prof = record_once_frontend(frontend)
    with prof:
        small_workload()
        assert recording_gate.current() is prof  # the frontend itself holds the gate
        with pytest.raises(RuntimeError, match="not reentrant: this profile is already recording"):
            prof.__enter__()
        small_workload()
    assert sum(a.count for a in prof.key_averages() if a.key == "aten::mm") == 2
    with pytest.raises(RuntimeError, match=r"not reentrant: .* has already recorded once; create a new"):
        prof.__enter__()
    assert recording_gate.current() is None
    assert not torch.autograd._profiler_enabled()


@pytest.mark.parametrize("frontend", RECORD_ONCE_FRONTENDS)
def test_a_disabled_profile_may_be_entered_again_as_in_torch(frontend: str) -> None:
    prof = record_once_frontend(frontend, enabled=False)
    for _ in range(2):
        with prof as entered:
            assert entered is prof  # torch returns None here (a documented difference)
            assert recording_gate.current() is None and not torch.autograd._profiler_enabled()
            small_workload()
    assert not prof.entered
    with pytest.raises(shim.ProfilerDisabledError, match=r"key_averages\(\): the profiler was disabled"):
        prof.key_averages()


@pytest.mark.parametrize("torch_cls", [ORIGINAL.autograd, ORIGINAL.legacy])
def test_torch_disabled_profiles_may_be_entered_again(torch_cls: Any) -> None:
    """The oracle for the test above."""
    prof = torch_cls(enabled=False)
    for _ in range(2):
        with prof as entered:
            assert entered is None
    assert not getattr(prof, "entered", False)  # torch's autograd profile sets none when disabled


# ------------------------------------------------------------------ the legacy profiler


def test_legacy_name_takes_ipex_use_xpu() -> None:
    legacy = pytest.importorskip("polyprof.legacy")
    with shim.shimmed(), torch.autograd.profiler_legacy.profile(use_xpu=False, record_shapes=True) as prof:
        small_workload()
    assert isinstance(prof, legacy.profile) and type(prof) is shim.LegacyProfile
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    with pytest.raises(TypeError, match="use_xpu"):
        ORIGINAL.legacy(use_xpu=False)  # torch's own legacy profiler has no use_xpu
