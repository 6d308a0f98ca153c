"""polyprof.profile: torch.profiler.profile's semantics, and our clear errors."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples

torch = pytest.importorskip("torch")
import torch.profiler as tp  # noqa: E402

import polyprof  # noqa: E402
from polyprof import ProfilerActivity  # noqa: E402
from polyprof.base.errors import ActivityUnavailableError  # noqa: E402


def tiny_step() -> None:
    a = torch.ones(4)
    (a + a).sum()


def run_schedule(profile_cls, schedule_fn, steps: int, acc_events: bool = False):
    """Run ``steps`` steps; return [(step_num at callback, ProfilerStep names seen)]."""
    calls = []

    def handler(prof) -> None:
        names = sorted({e.trace_name for e in prof.events() if e.name.startswith("ProfilerStep")})
        calls.append((prof.step_num, names))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {
            "activities": [tp.ProfilerActivity.CPU],
            "on_trace_ready": handler,
            "acc_events": acc_events,
        }
        if schedule_fn is not None:
            kwargs["schedule"] = schedule_fn
        with profile_cls(**kwargs) as prof:
            for _ in range(steps):
                tiny_step()
                prof.step()
    return calls


# FunctionEvent.name is wildcarded ("ProfilerStep*"); trace_name keeps "ProfilerStep#N".
schedules = st.fixed_dictionaries(
    {
        "wait": st.integers(0, 2),
        "warmup": st.integers(0, 2),
        "active": st.integers(1, 3),
        "repeat": st.integers(0, 2),
        "skip_first": st.integers(0, 2),
    }
)


@settings(max_examples=examples(12), deadline=None)
@given(args=schedules, steps=st.integers(0, 9), acc=st.booleans())
def test_on_trace_ready_fires_as_torch(args: dict, steps: int, acc: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = run_schedule(tp.profile, tp.schedule(**args), steps, acc)
        ours = run_schedule(polyprof.profile, polyprof.schedule(**args), steps, acc)
    assert ours == theirs


def test_no_schedule_delivers_at_exit() -> None:
    assert run_schedule(polyprof.profile, None, 3) == run_schedule(tp.profile, None, 3) == [(3, [])]


def test_partial_cycle_delivered_at_exit_and_warmup_not() -> None:
    sched = dict(wait=1, warmup=1, active=3)
    assert run_schedule(polyprof.profile, polyprof.schedule(**sched), 3) == [
        (3, ["ProfilerStep#2", "ProfilerStep#3"])
    ]
    assert run_schedule(polyprof.profile, polyprof.schedule(**sched), 1) == []


def test_step_ranges_are_wildcarded_in_tables() -> None:
    with polyprof.profile(
        activities=[ProfilerActivity.CPU], schedule=polyprof.schedule(wait=0, warmup=1, active=2)
    ) as prof:
        for _ in range(2):
            tiny_step()
            prof.step()
    keys = {e.key for e in prof.key_averages()}
    assert "ProfilerStep*" in keys


def test_activities_as_dict_and_torch_enums() -> None:
    with polyprof.profile(activities={tp.ProfilerActivity.CPU: []}) as prof:
        tiny_step()
    assert prof.activities == {ProfilerActivity.CPU}
    assert any(e.key == "aten::add" for e in prof.key_averages())


def test_unknown_activity_lists_valid_choices() -> None:
    # torch 2.6 to 2.13 raise AssertionError (no activity left), 2.14+ TypeError (wrong item type):
    # tests/test_frontend_versions.py checks the type against the installed torch.
    with pytest.raises((TypeError, AssertionError), match=r"valid activities are: ProfilerActivity.CPU"):
        polyprof.profile(activities=["gpu"])


def test_activity_without_plugin_names_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a machine without polyprof-cuda (CI installs it: third-party autoload off hides it).
    monkeypatch.setenv("POLYPROF_DISABLE_PLUGIN_AUTOLOAD", "1")
    prof = polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    with pytest.raises(ActivityUnavailableError, match="polyprof-cuda"):
        prof.start()
    # Nothing left running: a new profile starts fine.
    with polyprof.profile(activities=[ProfilerActivity.CPU]):
        tiny_step()


def test_nested_profile_is_a_clear_error_and_outer_keeps_events() -> None:
    with polyprof.profile(activities=[ProfilerActivity.CPU]) as outer:
        tiny_step()
        with pytest.raises(RuntimeError, match="already recording"):
            with polyprof.profile(activities=[ProfilerActivity.CPU]):
                pass
        tiny_step()
    assert sum(e.count for e in outer.key_averages() if e.key == "aten::add") == 2


def test_torch_profiler_running_is_detected() -> None:
    with tp.profile(activities=[tp.ProfilerActivity.CPU]):
        with pytest.raises(RuntimeError, match="already running"):
            with polyprof.profile(activities=[ProfilerActivity.CPU]):
                pass


def test_exception_inside_block_stops_cleanly() -> None:
    prof = polyprof.profile(activities=[ProfilerActivity.CPU])
    with pytest.raises(KeyError, match="boom"):
        with prof:
            tiny_step()
            raise KeyError("boom")
    assert any(e.key == "aten::add" for e in prof.key_averages())
    assert not torch.autograd._profiler_enabled()


def test_results_before_recording_are_a_clear_error() -> None:
    prof = polyprof.profile(activities=[ProfilerActivity.CPU])
    with pytest.raises(RuntimeError, match="no profiling data"):
        prof.key_averages()


def test_bus_counters_show_nothing_dropped() -> None:
    with polyprof.profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(100):
            tiny_step()
    stats = prof.bus_statistics
    assert stats.events_received_total > 300
    assert stats.events_dropped_total == 0
    assert all(v == stats.events_received_total for v in stats.events_delivered.values())


def test_works_inside_asyncio_run() -> None:
    async def main():
        loop = asyncio.get_running_loop()
        with polyprof.profile(activities=[ProfilerActivity.CPU]) as prof:
            tiny_step()
            await asyncio.sleep(0)
        assert asyncio.get_running_loop() is loop
        return prof

    prof = asyncio.run(main())
    assert any(e.key == "aten::add" for e in prof.key_averages())


def test_export_chrome_trace_json_and_gz(tmp_path) -> None:
    with polyprof.profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with polyprof.record_function("block"):
            tiny_step()
        prof.add_metadata("run", "unit-test")
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    assert doc["run"] == "unit-test" and doc["record_shapes"] == 1
    names = {e.get("name") for e in doc["traceEvents"]}
    assert {"block", "aten::add"} <= names
    gz = tmp_path / "t.json.gz"
    prof.export_chrome_trace(str(gz))
    assert json.loads(gzip.decompress(gz.read_bytes()))["traceEvents"]


def test_export_to_missing_directory_leaves_nothing(tmp_path) -> None:
    with polyprof.profile(activities=[ProfilerActivity.CPU]) as prof:
        tiny_step()
    target = tmp_path / "missing" / "t.json"
    with pytest.raises(OSError, match="does not exist"):
        prof.export_chrome_trace(str(target))
    assert not (tmp_path / "missing").exists()


def test_tensorboard_trace_handler_naming(tmp_path) -> None:
    handler = polyprof.tensorboard_trace_handler(str(tmp_path / "tb"), worker_name="w0", use_gzip=True)
    with polyprof.profile(
        activities=[ProfilerActivity.CPU],
        schedule=polyprof.schedule(wait=0, warmup=1, active=1),
        on_trace_ready=handler,
    ) as prof:
        for _ in range(4):
            tiny_step()
            prof.step()
    files = sorted(os.listdir(tmp_path / "tb"))
    assert len(files) == 2
    for name in files:
        worker, ns, rest = name.split(".", 2)
        assert worker == "w0" and ns.isdigit() and rest == "pt.trace.json.gz"


def test_acc_events_warning_like_torch() -> None:
    with pytest.warns(UserWarning, match="Profiler clears events at the end of each cycle"):
        run = polyprof.profile(
            activities=[ProfilerActivity.CPU], schedule=polyprof.schedule(wait=0, warmup=1, active=1)
        )
        with run as prof:
            for _ in range(4):
                tiny_step()
                prof.step()


def test_metadata_must_be_json() -> None:
    prof = polyprof.profile(activities=[ProfilerActivity.CPU])
    with pytest.raises(ValueError, match="not valid JSON"):
        prof.preset_metadata_json("k", "{not json")


def test_export_stacks_through_the_frontend(tmp_path) -> None:
    from torch._C._profiler import _ExperimentalConfig

    def work():
        x = torch.randn(64, 64)
        return (x @ x).relu()

    with polyprof.profile(
        activities=[ProfilerActivity.CPU],
        with_stack=True,
        experimental_config=_ExperimentalConfig(verbose=True),
    ) as prof:
        work()
    path = tmp_path / "stacks.txt"
    prof.export_stacks(str(path))
    lines = path.read_text().splitlines()
    assert lines, "no stacks written"
    for line in lines:
        frames, value = line.rsplit(" ", 1)
        assert int(value) > 0 and frames
    assert any(";" in line for line in lines)
    assert any("work" in line for line in lines)
    with pytest.raises(ValueError, match="self_cpu_time_total"):
        prof.export_stacks(str(tmp_path / "bad.txt"), metric="wall_time")


def test_export_stacks_needs_with_stack(tmp_path) -> None:
    with polyprof.profile(activities=[ProfilerActivity.CPU]) as prof:
        tiny_step()
    with pytest.raises(RuntimeError, match="requires with_stack=True"):
        prof.export_stacks(str(tmp_path / "s.txt"))


def test_with_stack_leaves_out_polyprofs_own_threads() -> None:
    with polyprof.profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        tiny_step()
    names = [e.name for e in prof.events()]
    assert "aten::add" in names
    # The user's thread calls into the bus (stop, statistics), as it calls into torch.profiler;
    # those frames stay. The bus threads' own frames (the portal, the closer) must not appear.
    own = [n for n in names if "anyio" in n or "asyncio" in n or n.endswith(": _shut_down")]
    assert own == [], own[:5]


def test_a_tracer_that_fails_to_decode_is_a_warning_not_silence() -> None:
    from polyprof.testing import ComponentPlugin, FakeTracer, make_event_batch, make_plugin_manager_for_tests

    class BrokenTracer(FakeTracer):
        def decode(self, item):
            raise ValueError("corrupt buffer")

    batch = make_event_batch([{"kind": 0, "name": "x", "start_ns": 1, "dur_ns": 1}])
    plugin = ComponentPlugin(
        tracers=[BrokenTracer([batch], name="broken", activities=[ProfilerActivity.XPU])]
    )
    pm = make_plugin_manager_for_tests(("fake_xpu", plugin), builtins=True)
    prof = polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU], plugin_manager=pm)
    with pytest.warns(RuntimeWarning, match="tracer 'broken' failed to decode"):
        with prof:
            tiny_step()
    assert any(e.key == "aten::add" for e in prof.key_averages())  # the CPU tracer's events are intact
    assert any("broken" in note for note in prof.trace.notes)


def test_toggle_collection_dynamic_pauses_cpu_ops() -> None:
    def count(prof, key):
        return sum(e.count for e in prof.key_averages() if e.key == key)

    for prof_cls in (tp.profile, polyprof.profile):
        with prof_cls(activities=[tp.ProfilerActivity.CPU]) as prof:
            torch.ones(2).mul(2)
            prof.toggle_collection_dynamic(False, [tp.ProfilerActivity.CPU])
            torch.ones(2).mul(3)
            prof.toggle_collection_dynamic(True, [tp.ProfilerActivity.CPU])
            torch.ones(2).mul(4)
        if prof_cls is tp.profile:
            expected = count(prof, "aten::mul")
        else:
            assert count(prof, "aten::mul") == expected == 2


def test_unavailable_activity_warning_points_at_the_users_line() -> None:
    from polyprof.base.user_warnings import ActivityUnavailableWarning
    from polyprof.frontends import legacy
    from polyprof.hooks.components import Capabilities
    from polyprof.hooks.hookspecs import hookimpl
    from polyprof.testing import make_plugin_manager_for_tests

    class NoDevicePlugin:
        @hookimpl
        def polyprof_capabilities(self) -> Capabilities:
            return Capabilities(activities=[ProfilerActivity.XPU], unavailable_reason="no device here")

    # Each entry point reaches the session at its own depth; the warning must name this file.
    CPU_AND_XPU = [ProfilerActivity.CPU, ProfilerActivity.XPU]  # noqa: N806
    profiles = {
        "with profile": lambda pm: polyprof.profile(activities=CPU_AND_XPU, plugin_manager=pm),
        "profile.start": lambda pm: polyprof.profile(activities=CPU_AND_XPU, plugin_manager=pm),
        "legacy": lambda pm: legacy.profile(use_xpu=True, plugin_manager=pm),
    }
    for how, make in profiles.items():
        pm = make_plugin_manager_for_tests(("nodevice", NoDevicePlugin()), builtins=True)
        prof = make(pm)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if how == "profile.start":
                    prof.start()
                else:
                    prof.__enter__()
            found = [w for w in caught if issubclass(w.category, ActivityUnavailableWarning)]
            assert len(found) == 1, how
            assert found[0].filename == __file__, (how, found[0].filename)
            assert "no device here" in str(found[0].message)
        finally:
            if how == "profile.start":
                prof.stop()
            else:
                prof.__exit__(None, None, None)
            pm.close()
