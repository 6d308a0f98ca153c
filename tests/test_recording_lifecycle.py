"""One recording lifecycle (polyprof.runtime.recording).

The gate, matched session hooks, exporter shutdown, fork.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import polyprof
import polyprof.hooks.registry
import polyprof.legacy
from polyprof import ProfilerActivity, hookimpl
from polyprof.runtime.recording import RecordingGate, RecordingInProgressError, recording_gate
from polyprof.testing import ComponentPlugin, FakeTracer, InMemoryExporter, make_plugin_manager_for_tests

torch = pytest.importorskip("torch")

CPU = [ProfilerActivity.CPU]


def work() -> None:
    torch.add(torch.ones(4), torch.ones(4))


class SessionHookCounter:
    """Counts polyprof_session_start / polyprof_session_finish, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @hookimpl
    def polyprof_session_start(self, session: object) -> None:
        self.calls.append("start")

    @hookimpl
    def polyprof_session_finish(self, session: object) -> None:
        self.calls.append("finish")


@pytest.fixture
def owned_plugin_manager(monkeypatch):
    """Profiles make their own plugin manager (as without plugin_manager=), holding these test plugins."""
    counter = SessionHookCounter()
    exporters: list[InMemoryExporter] = []

    def make(*args, **kwargs):
        exporter = InMemoryExporter()
        exporters.append(exporter)
        return make_plugin_manager_for_tests(
            ("counter", counter), ComponentPlugin(exporters=[exporter]), builtins=True
        )

    monkeypatch.setattr(polyprof.hooks.registry, "make_plugin_manager", make)
    return counter, exporters


# ------------------------------------------------------------------ the gate


def test_gate_acquire_release_current_and_listeners() -> None:
    gate = RecordingGate()
    heard: list[object] = []
    first, second = object(), object()
    remove = gate.add_listener(heard.append)
    gate.acquire(first)
    assert gate.current() is first and heard == [first]
    with pytest.raises(RecordingInProgressError, match="already recording"):
        gate.acquire(second)
    assert gate.current() is first  # a refused holder changes nothing
    gate.release(second)  # not the holder: nothing happens
    assert gate.current() is first
    gate.release(first)
    assert gate.current() is None
    remove()
    gate.acquire(second)
    assert heard == [first, second]  # the listener heard of the refused one too, not after removal
    gate.release(second)


def test_a_listener_can_make_the_holder_step_aside() -> None:
    gate = RecordingGate()
    whole, script = object(), object()
    gate.acquire(whole)
    remove = gate.add_listener(lambda holder: gate.release(whole) if holder is not whole else None)
    gate.acquire(script)  # the listener released the whole-script holder first
    assert gate.current() is script
    remove()


def test_every_frontend_passes_the_one_gate() -> None:
    with polyprof.profile(activities=CPU) as prof:
        assert recording_gate.current() is prof
        with pytest.raises(RuntimeError, match="already recording"):
            polyprof.legacy.profile().__enter__()
        with pytest.raises(RecordingInProgressError):
            polyprof.profile(activities=CPU).start()
    assert recording_gate.current() is None
    with polyprof.legacy.profile() as legacy:
        assert recording_gate.current() is legacy
    assert recording_gate.current() is None


def test_no_frontend_monkeypatches_the_gate() -> None:
    # polyprof run used to replace polyprof.frontends.profiler._enter_active at run time.
    import polyprof.frontends.profiler

    assert not hasattr(polyprof.frontends.profiler, "_enter_active")


# ------------------------------------------------------------------ session hooks and exporters


def test_session_hooks_fire_as_a_matched_pair_when_a_profile_is_reused(owned_plugin_manager) -> None:
    counter, _ = owned_plugin_manager
    prof = polyprof.profile(activities=CPU)
    with prof:
        work()
    assert counter.calls == ["start", "finish"]
    with prof:  # torch lets a profile run again
        work()
    assert counter.calls == ["start", "finish", "start", "finish"]
    assert "aten::add" in {e.key for e in prof.key_averages()}


def test_legacy_profile_fires_one_pair(owned_plugin_manager) -> None:
    counter, _ = owned_plugin_manager
    with polyprof.legacy.profile():
        work()
    assert counter.calls == ["start", "finish"]


def test_a_profile_that_ends_shuts_its_exporters_down(owned_plugin_manager, tmp_path: Path) -> None:
    _, exporters = owned_plugin_manager
    with polyprof.profile(
        activities=CPU, on_trace_ready=lambda p: p.export(tmp_path / "cycle.memory", format="memory")
    ):
        work()
    [exporter] = exporters
    assert len(exporter.exported) == 1
    assert exporter.shut_down, "the exporter used during the profile was never shut down"


def test_an_export_after_the_end_shuts_its_exporter_down(owned_plugin_manager, tmp_path: Path) -> None:
    _, exporters = owned_plugin_manager
    with polyprof.profile(activities=CPU) as prof:
        work()
    [exporter] = exporters
    assert not exporter.exported
    prof.export(tmp_path / "after.memory", format="memory")
    assert len(exporter.exported) == 1 and exporter.shut_down
    exporter.shut_down = False
    prof.export(tmp_path / "again.memory", format="memory")
    assert len(exporter.exported) == 2 and exporter.shut_down


def test_a_caller_s_plugin_manager_stays_the_caller_s(tmp_path: Path) -> None:
    exporter = InMemoryExporter()
    counter = SessionHookCounter()
    pm = make_plugin_manager_for_tests(
        ("counter", counter), ComponentPlugin(exporters=[exporter]), builtins=True
    )
    with polyprof.profile(activities=CPU, plugin_manager=pm) as prof:
        work()
    prof.export(tmp_path / "t.memory", format="memory")
    made = len(pm._exporters_made)
    prof.export(tmp_path / "u.memory", format="memory")
    assert len(pm._exporters_made) == made  # later exports reuse the exporter, nothing piles up
    assert counter.calls == ["start", "finish"]
    assert not exporter.shut_down  # the caller closes its own manager
    pm.close()
    assert exporter.shut_down


# ------------------------------------------------------------------ fork


def _wait_for_child(pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child did not finish within {timeout_s} s: leaving the profile there hangs")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("frontend", ["profile", "legacy"])
def test_a_child_forked_inside_a_recording_leaves_it_without_hanging(frontend: str, tmp_path: Path) -> None:
    delivered: list[int] = []
    if frontend == "profile":
        prof = polyprof.profile(activities=CPU, on_trace_ready=lambda p: delivered.append(os.getpid()))
    else:
        prof = polyprof.legacy.profile()
    prof.__enter__()
    work()
    pid = os.fork()
    if pid == 0:  # the child: leave the with-block as a script's child would, then report
        code = 70
        try:
            prof.__exit__(None, None, None)
            code = 71 if delivered else 72 if recording_gate.current() is not None else 73
            try:
                prof.key_averages()
            except RuntimeError as exc:  # the data is the parent's, and the message says so
                if "forked" in str(exc):
                    code = 0
        finally:
            os._exit(code)
    code = _wait_for_child(pid, timeout_s=60)
    work()
    prof.__exit__(None, None, None)
    assert code == 0, {
        70: "leaving the profile in the child raised",
        71: "the child ran on_trace_ready",
        72: "the gate stayed taken in the child",
        73: "the child's results did not say they are the parent's",
    }.get(code, code)
    assert "aten::add" in {e.key for e in prof.key_averages()}
    if frontend == "profile":
        assert delivered == [os.getpid()]


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_polyprof_run_of_a_script_whose_forked_child_exits_normally(tmp_path: Path) -> None:
    script = tmp_path / "forks.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, torch
            torch.add(torch.ones(4), torch.ones(4))
            pid = os.fork()
            if pid == 0:
                torch.mul(torch.ones(4), 2)
                sys.exit(0)  # leaves through the script's end, not os._exit
            os.waitpid(pid, 0)
            print("parent done")
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore::DeprecationWarning",
            "-m",
            "polyprof",
            "run",
            "--output-dir",
            str(tmp_path / "out"),
            str(script),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "parent done\n"
    # One table and one trace: the parent's; the child said nothing of its own.
    assert result.stderr.count("trace written to") == 1, result.stderr
    assert len(list((tmp_path / "out").iterdir())) == 1


# ------------------------------------------------------------------ interrupts


class InterruptedTracer(FakeTracer):
    """A device tracer whose stop() is cut off by Ctrl-C."""

    def stop(self) -> None:
        raise KeyboardInterrupt


def test_an_interrupt_while_stopping_leaves_no_collector_running() -> None:
    interrupted = InterruptedTracer(name="interrupted", activities=[ProfilerActivity.MTIA])
    plugin = ComponentPlugin(tracers=[interrupted])
    pm = make_plugin_manager_for_tests(("interrupting", plugin), builtins=True)
    prof = polyprof.profile(activities=[ProfilerActivity.MTIA, ProfilerActivity.CPU], plugin_manager=pm)
    with pytest.raises(KeyboardInterrupt), prof:
        work()
    # The interrupted tracer stops before torch's collector: the collector must still be stopped.
    assert prof._lifecycle.session.tracers[0].name == "interrupted"
    assert not torch.autograd.profiler._is_profiler_enabled
    assert recording_gate.current() is None
    with polyprof.profile(activities=CPU) as again:  # the next profile starts as usual
        work()
    assert "aten::add" in {e.key for e in again.key_averages()}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_schedules_step_in_a_forked_child_changes_nothing() -> None:
    delivered: list[int] = []
    prof = polyprof.profile(
        activities=CPU,
        schedule=polyprof.schedule(wait=0, warmup=0, active=1, repeat=2),
        on_trace_ready=lambda p: delivered.append(os.getpid()),
    )
    prof.start()
    work()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            prof.step()  # would end the parent's cycle: stop the collector, run on_trace_ready
            code = 71 if delivered else 72 if not torch.autograd.profiler._is_profiler_enabled else 0
        finally:
            os._exit(code)
    code = _wait_for_child(pid, timeout_s=60)
    outcomes = {70: "step raised", 71: "on_trace_ready ran in the child", 72: "collector stopped"}
    assert code == 0, outcomes.get(code, code)
    prof.step()
    prof.stop()
    assert delivered == [os.getpid(), os.getpid()]
