"""Code outside polyprof stops torch's profiler while polyprof records (issue 24, item 8).

torch's collector keeps one session per thread's process, and torch's private
``torch.autograd._disable_profiler()`` ends it whoever started it. PyTorch
Lightning's ``PyTorchProfiler.start`` calls it whenever ``_profiler_enabled()``,
to close a profiler it takes for its own. polyprof keeps what torch recorded
until then, says so once (``ProfilerStoppedOutsideWarning``, a trace note, an
info event), logs no error and asks torch for nothing more: the recording gives
torch's collector, and the process's recording gate, up to the next profiler
that asks (the one a library such as Lightning starts next, polyprof's under
the shims), and its later cycles record nothing with it. A device plugin's
fault on the way never reaches the caller. The Lightning tests run the real
``Trainer`` with its ``PyTorchProfiler`` in child processes (Lightning changes
``warnings.formatwarning`` for the whole process at import); they skip where
Lightning is not installed (scripts/test.sh installs it for the whole suite,
the torch matrix runs do not).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import warnings
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import structlog

import polyprof
from polyprof import shim
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import EventBatch
from polyprof.base.user_warnings import ProfilerStoppedOutsideNote, ProfilerStoppedOutsideWarning
from polyprof.hooks.components import Capabilities
from polyprof.hooks.hookspecs import hookimpl
from polyprof.hooks.plugin_calls import PluginFailureWarning
from polyprof.runtime.recording import recording_gate
from polyprof.runtime.torch_result import CollectorResult, TorchResultTracer
from polyprof.testing import make_plugin_manager_for_tests, run_pytest_in_child

torch = pytest.importorskip("torch")
import torch.autograd.profiler as autograd_profiler  # noqa: E402

from polyprof.runtime import torch_cpu  # noqa: E402

HERE = Path(__file__).resolve().parent
#: torch's own functions that polyprof wraps while it records, as torch has them (no recording yet).
TORCH_FUNCTIONS = {
    (torch.autograd, "_disable_profiler"): torch.autograd._disable_profiler,
    (torch.autograd, "_disable_profiler_legacy"): torch.autograd._disable_profiler_legacy,
    (autograd_profiler, "_prepare_profiler"): autograd_profiler._prepare_profiler,
    (autograd_profiler, "_run_on_profiler_stop"): autograd_profiler._run_on_profiler_stop,
}
#: torch's original torch.profiler.profile (polyprof's shims may stand in for it).
TORCH_PROFILE = torch.profiler.profile
#: The note's text where polyprof saw the call (``what; consequence``), any caller, any time.
NOTE_RE = (
    r"(?P<who>.+) \((?P<function>.+), line (?P<line>\d+)\) stopped torch's profiler with "
    r"torch\.autograd\.(?P<call>_disable_profiler(_legacy)?)\(\) \d+\.\d{3} s into the recording; "
    r"the results hold what torch recorded until then, and nothing after it"
)
#: ``polyprof run``'s note when the script starts a profiler of its own (torch.profiler.profile).
STEPPED_ASIDE = (
    "the script started its own profiler (polyprof.shim.TorchProfile); the whole-script profile stopped "
    "there and was not written (the script's profilers ran through polyprof)"
)
#: What torch 2.13+ writes on stderr when it is asked to stop a session that is gone.
TORCH_NO_SESSION = "no active profiling session"
needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="needs PyTorch Lightning (pip install lightning; scripts/test.sh installs it for the whole suite)",
)


def _ops(prof: Any) -> Counter:
    return Counter(e.name for e in prof.events())


def _errors(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["log_level"] in ("error", "critical", "exception")]


def _stop_notes(caught: list[warnings.WarningMessage]) -> list[ProfilerStoppedOutsideWarning]:
    return [w.message for w in caught if isinstance(w.message, ProfilerStoppedOutsideWarning)]


def _torch_functions_are_back() -> bool:
    return all(getattr(module, name) is original for (module, name), original in TORCH_FUNCTIONS.items())


# ------------------------------------------------------------- torch's own private stop


def test_a_stop_from_outside_keeps_what_was_recorded_and_is_one_note(capfd: Any) -> None:
    x = torch.ones(4)
    with structlog.testing.capture_logs() as logs, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile() as prof:
            for _ in range(3):
                x.add(1)
            given = torch.autograd._disable_profiler()  # as Lightning's PyTorchProfiler.start does
            for _ in range(2):
                x.mul(2)
    # The caller gets torch's result, as without polyprof; polyprof keeps the same events.
    assert Counter(e.name() for e in given.events())["aten::add"] == 3
    assert _ops(prof)["aten::add"] == 3 and _ops(prof)["aten::mul"] == 0
    [note] = _stop_notes(caught)
    match = re.fullmatch(f"polyprof: {NOTE_RE}", str(note))
    assert match, str(note)
    assert match["who"] == __name__ and match["call"] == "_disable_profiler"
    assert match["function"].endswith("test_a_stop_from_outside_keeps_what_was_recorded_and_is_one_note")
    assert note.stopped_by == f"{match['who']} ({match['function']}, line {match['line']})"
    [warned] = [w for w in caught if w.message is note]
    assert warned.filename == __file__  # at the with-block that ends the recording
    # No "events are missing" (nothing is) and no other polyprof warning.
    assert not [w for w in caught if "polyprof" in str(w.message) and w.message is not note]
    assert f"{note.what}; {note.consequence}" in prof.trace.notes
    assert not _errors(logs), logs
    [event] = [e for e in logs if e["event"] == "torch_profiler_stopped_outside"]
    assert event["log_level"] == "info" and event["stopped_by"] == note.stopped_by
    assert event["call"] == "torch.autograd._disable_profiler()"
    # polyprof asked torch for nothing more: torch said nothing about a missing session.
    assert TORCH_NO_SESSION not in capfd.readouterr().err
    assert not torch.autograd._profiler_enabled()
    assert not torch.autograd.profiler._is_profiler_enabled  # torch's profiler flag is down
    assert _torch_functions_are_back()


def test_the_callers_copy_of_the_result_stays_whole(tmp_path: Path) -> None:
    """polyprof frees Kineto's copy of the events inside a result it alone holds; not this one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfilerStoppedOutsideWarning)
        with polyprof.profile() as prof:
            torch.ones(4).add(1)
            given = torch.autograd._disable_profiler()
    assert _ops(prof)["aten::add"] == 1  # decoded before the caller writes its copy
    given.save(str(tmp_path / "given.json"))
    written = json.loads((tmp_path / "given.json").read_text())
    assert "aten::add" in {e.get("name") for e in written["traceEvents"]}


def test_a_result_stopped_from_outside_is_kept_no_longer_than_polyprofs_own(monkeypatch: Any) -> None:
    """Once the caller drops it, torch's result lives as long as one polyprof stopped itself would
    (while the profile's events are read lazily, torch before 2.13; else not after the decode)."""
    own: list[weakref.ref] = []
    real_disable = torch._C._autograd._disable_profiler

    def disable_and_note() -> Any:
        result = real_disable()
        own.append(weakref.ref(result))
        return result

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfilerStoppedOutsideWarning)
        monkeypatch.setattr(torch._C._autograd, "_disable_profiler", disable_and_note)
        with polyprof.profile() as mine:
            torch.ones(4).add(1)
        with polyprof.profile() as theirs:
            torch.ones(4).add(1)
            given = weakref.ref(torch.autograd._disable_profiler())
    assert _ops(mine)["aten::add"] == _ops(theirs)["aten::add"] == 1
    gc.collect()
    assert (given() is None) == (own[0]() is None)


def test_a_second_stop_goes_to_torch_and_changes_nothing_here() -> None:
    x = torch.ones(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile() as prof:
            x.add(1)
            torch.autograd._disable_profiler()
            with contextlib.suppress(RuntimeError):  # torch 2.6 raises, 2.13+ gives an empty result
                torch.autograd._disable_profiler()
            x.mul(2)
    assert len(_stop_notes(caught)) == 1
    assert _ops(prof)["aten::add"] == 1 and _ops(prof)["aten::mul"] == 0


def test_the_legacy_stop_ends_torchs_session_too_and_polyprof_keeps_it() -> None:
    x = torch.ones(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile() as prof:
            x.add(1)
            # No legacy session to stop: it raises as it would without polyprof's session.
            with pytest.raises(RuntimeError):
                torch.autograd._disable_profiler_legacy()
            x.mul(2)
    [note] = _stop_notes(caught)
    assert re.fullmatch(f"polyprof: {NOTE_RE}", str(note))["call"] == "_disable_profiler_legacy"
    assert _ops(prof)["aten::add"] == 1 and _ops(prof)["aten::mul"] == 0
    assert _torch_functions_are_back()


def test_a_stop_polyprof_cannot_see_is_noted_and_torch_is_not_asked_again(capfd: Any) -> None:
    x = torch.ones(4)
    with structlog.testing.capture_logs() as logs, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile() as prof:
            x.add(1)
            torch._C._autograd._disable_profiler()  # not through torch.autograd: not seen
            x.mul(2)
    [note] = _stop_notes(caught)
    assert str(note) == (
        "polyprof: code outside polyprof stopped torch's profiler before this recording ended, not "
        "through torch.autograd._disable_profiler(), so polyprof cannot tell who or when; the events "
        "torch recorded since the recording started (or last resumed) went to that code and are "
        "missing from the results"
    )
    assert note.stopped_by is None
    assert len(prof.events()) == 0
    assert not _errors(logs), logs
    assert TORCH_NO_SESSION not in capfd.readouterr().err
    assert not [w for w in caught if "failed to decode" in str(w.message)]


def test_a_torch_profiler_after_a_stop_polyprof_cannot_see_records_on_its_own(capfd: Any) -> None:
    """Nothing is left to pause for it: polyprof neither asks torch to stop (2.6 raised into the
    script's profiler, 2.13 warned) nor resumes after it."""
    x = torch.ones(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile() as prof:
            x.add(1)
            torch._C._autograd._disable_profiler()
            with torch.profiler.profile() as inner:
                x.mul(2)
            x.sub(1)
    assert _ops(inner)["aten::mul"] == 1
    assert len(_stop_notes(caught)) == 1 and len(prof.events()) == 0
    assert not [w for w in caught if issubclass(w.category, torch_cpu.NestedProfilerWarning)]
    assert TORCH_NO_SESSION not in capfd.readouterr().err
    assert _torch_functions_are_back()


def test_a_stop_on_another_thread_leaves_this_threads_session_alone() -> None:
    """torch's session belongs to the thread that started it; another thread's stop finds none."""
    x = torch.ones(4)

    def stop_elsewhere() -> None:
        with contextlib.suppress(RuntimeError):  # torch 2.6: no session here
            torch.autograd._disable_profiler()

    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfilerStoppedOutsideWarning)
        with polyprof.profile() as prof:
            x.add(1)
            thread = threading.Thread(target=stop_elsewhere)
            thread.start()
            thread.join()
            x.mul(2)
    assert _ops(prof)["aten::add"] == 1 and _ops(prof)["aten::mul"] == 1


def test_without_a_stop_from_outside_nothing_is_noted() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfilerStoppedOutsideWarning)
        with polyprof.profile() as prof:
            torch.ones(2).add(1)
    assert not any("stopped torch's profiler" in note for note in prof.trace.notes)
    assert _torch_functions_are_back()


# ------------------------------------------------------------- the next profiler takes torch's collector

#: A profiler opened as a library or script opens one, polyprof's behind torch's names (shims in place).
NEXT_PROFILERS = {
    "torch.profiler.profile": lambda: torch.profiler.profile(),
    "torch.autograd.profiler.profile": lambda: torch.autograd.profiler.profile(),
    "torch.autograd.profiler_legacy.profile": lambda: torch.autograd.profiler_legacy.profile(),
}
#: How code outside polyprof ends torch's session: through the name polyprof wraps, or not.
STOPS = {
    "seen": lambda: torch.autograd._disable_profiler(),
    "unseen": lambda: torch._C._autograd._disable_profiler(),
}


@pytest.mark.parametrize("stop", list(STOPS))
@pytest.mark.parametrize("next_profiler", list(NEXT_PROFILERS))
def test_under_the_shims_a_profiler_started_after_a_stop_from_outside_records(
    next_profiler: str, stop: str, capfd: Any
) -> None:
    """As with torch's own profilers: the one started after the stop records on its own. The stopped
    one gives the process's recording gate up to it, and keeps what it had (torch's keeps nothing)."""
    x = torch.ones(4)
    with (
        structlog.testing.capture_logs() as logs,
        warnings.catch_warnings(record=True) as caught,
        shim.shimmed(),
    ):
        warnings.simplefilter("always")
        with torch.profiler.profile() as outer:
            x.add(1)
            STOPS[stop]()
            with NEXT_PROFILERS[next_profiler]() as inner:
                assert recording_gate.current() is inner
                x.mul(2)
            x.sub(1)
    assert type(outer).__module__ == type(inner).__module__ == "polyprof.shim"
    inner_ops = Counter(e.key for e in inner.key_averages())
    assert inner_ops["aten::mul"] == 1 and inner_ops["aten::add"] == inner_ops["aten::sub"] == 0
    assert _ops(outer)["aten::add"] == (
        1 if stop == "seen" else 0
    )  # unseen: the result went to torch's caller
    assert _ops(outer)["aten::mul"] == _ops(outer)["aten::sub"] == 0
    assert len(_stop_notes(caught)) == 1
    assert not [w for w in caught if issubclass(w.category, torch_cpu.NestedProfilerWarning)]
    [given] = [e for e in logs if e["event"] == "recording_gate_given_up"]
    assert given["log_level"] == "info"
    assert not _errors(logs), logs
    assert TORCH_NO_SESSION not in capfd.readouterr().err
    assert recording_gate.current() is None and not torch.autograd._profiler_enabled()
    assert _torch_functions_are_back()


def test_a_profile_stopped_from_outside_may_end_while_the_next_one_records() -> None:
    x = torch.ones(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfilerStoppedOutsideWarning)
        outer = polyprof.profile()
        outer.start()
        x.add(1)
        torch.autograd._disable_profiler()
        inner = polyprof.profile()
        inner.start()
        x.mul(2)
        outer.stop()  # must not end the next profile's session, nor take its place at the gate
        assert recording_gate.current() is inner and torch.autograd._profiler_enabled()
        x.sub(1)
        inner.stop()
    assert _ops(outer)["aten::add"] == 1 and _ops(outer)["aten::mul"] == 0
    assert _ops(inner)["aten::mul"] == _ops(inner)["aten::sub"] == 1 and _ops(inner)["aten::add"] == 0
    assert recording_gate.current() is None and not torch.autograd._profiler_enabled()
    assert _torch_functions_are_back()  # polyprof's wrappers, stopped out of order, are all gone


def test_a_profile_that_records_keeps_the_gate() -> None:
    with polyprof.profile() as prof:
        with pytest.raises(polyprof.runtime.recording.RecordingInProgressError):
            polyprof.profile().start()
        assert recording_gate.current() is prof


@pytest.mark.parametrize("next_kind", ["polyprof", "torch"])
def test_later_cycles_of_a_profile_stopped_from_outside_record_nothing_and_leave_the_next_alone(
    next_kind: str,
) -> None:
    """torch's own outer profile, once its session was disabled, starts fighting the next profiler for
    the session in its later cycles (2.13: each takes the other's events; 2.6 raises, then crashes).
    polyprof's records nothing more with torch's collector: each later cycle is delivered empty, with
    a note, and the next profiler records all it ran over, across the outer's cycles.

    The next profiler starts after the outer's step: torch's collector must not be stopped and
    started again inside a ``record_function`` range (here the outer's ``ProfilerStep#N``) that
    began under the first session, which corrupts torch's memory (2.6 and 2.13, torch's own
    profilers too); Lightning's own ranges are not open there."""
    cycles: list[tuple[Counter, tuple[str, ...]]] = []

    def ready(p: Any) -> None:
        cycles.append((Counter(e.name for e in p.events()), tuple(p.trace.notes)))

    make_next = polyprof.profile if next_kind == "polyprof" else TORCH_PROFILE
    x = torch.ones(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schedule = polyprof.schedule(wait=0, warmup=0, active=1)
        with polyprof.profile(schedule=schedule, on_trace_ready=ready) as prof:
            x.add(1)
            prof.step()  # cycle 1 delivered
            x.add(1)
            torch.autograd._disable_profiler()
            prof.step()  # cycle 2: what it had before the stop
            after = make_next()
            after.start()
            x.mul(2)
            prof.step()  # cycle 3: nothing, while the next profiler records
            x.mul(2)
            prof.step()  # cycle 4: nothing, while the next profiler records
            after.stop()
            x.sub(1)
    assert [c[0]["aten::add"] for c in cycles] == [1, 1, 0, 0, 0]
    assert not any(c[0]["aten::mul"] or c[0]["aten::sub"] for c in cycles)
    assert any(isinstance(note, ProfilerStoppedOutsideNote) for note in cycles[1][1])
    for _, notes in cycles[2:]:
        [later] = [n for n in notes if "holds nothing from torch's collector" in n]
        assert re.fullmatch(
            r"this cycle holds nothing from torch's collector: earlier in this profile, .+ stopped torch's "
            r"profiler with torch\.autograd\._disable_profiler\(\) \d+\.\d{3} s into the recording, and "
            r"polyprof leaves torch's collector to that code for the rest of the profile",
            later,
        ), later
    next_ops = Counter(e.name for e in after.events())
    assert next_ops["aten::mul"] == 2 and next_ops["aten::add"] == next_ops["aten::sub"] == 0
    assert len(_stop_notes(caught)) == 1
    assert not [w for w in caught if issubclass(w.category, torch_cpu.NestedProfilerWarning)]
    assert recording_gate.current() is None and not torch.autograd._profiler_enabled()
    assert _torch_functions_are_back()


class _StandInGpu(TorchResultTracer):
    """A GPU plugin's tracer fed by torch's collector: it notes each call, and fails in those named.

    Its plugin asks torch's collector for no device activity, so a CPU build records as usual (a
    CUDA request would leave Kineto device state behind for the rest of the process).
    """

    name = "gpu_standin"
    activities = frozenset({ProfilerActivity.CUDA})

    def __init__(self, fails_in: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.fails_in = fails_in
        self.calls: list[str] = []
        self.results: list[Any] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fails_in:
            raise RuntimeError(f"the stand-in GPU failed in {name}")

    def before_collector_stops(self) -> None:
        self._call("before_collector_stops")

    def receive(self, result: CollectorResult) -> None:
        self._call("receive")
        self.results.append(result.raw)
        super().receive(result)

    def results_complete(self) -> None:
        self._call("results_complete")
        super().results_complete()

    def decode(self, item: CollectorResult) -> list[EventBatch]:
        return []


class _StandInGpuPlugin:
    def __init__(self, tracer: _StandInGpu) -> None:
        self.tracer = tracer

    @hookimpl
    def polyprof_capabilities(self) -> Capabilities:
        return Capabilities(activities={ProfilerActivity.CUDA})

    @hookimpl
    def polyprof_make_tracers(self, config: ProfileConfig) -> list[Any]:
        return [self.tracer] if ProfilerActivity.CUDA in config.activities else []


def _with_gpu(gpu: _StandInGpu) -> dict[str, Any]:
    """``polyprof.profile`` arguments that record CPU and the stand-in GPU."""
    pm = make_plugin_manager_for_tests(("gpu_standin", _StandInGpuPlugin(gpu)), builtins=True)
    return {"activities": [ProfilerActivity.CPU, ProfilerActivity.CUDA], "plugin_manager": pm}


def test_device_tracers_get_the_result_of_a_stop_from_outside() -> None:
    """Their devices' queued work is waited for first, and they get the result the caller gets."""
    gpu = _StandInGpu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfilerStoppedOutsideWarning)
        with polyprof.profile(**_with_gpu(gpu)) as prof:
            torch.ones(4).add(1)
            given = torch.autograd._disable_profiler()
            assert gpu.calls == ["before_collector_stops", "receive"]
            torch.ones(4).mul(2)
    assert gpu.results == [given]  # one result: the caller's, not a second one at the end
    assert gpu.calls[2:] == ["before_collector_stops", "results_complete"]  # its stop, then the end
    assert _ops(prof)["aten::add"] == 1 and _ops(prof)["aten::mul"] == 0
    assert _torch_functions_are_back()


@pytest.mark.parametrize("fails_in", ["before_collector_stops", "receive"])
def test_a_device_tracer_failing_in_a_stop_from_outside_never_reaches_the_caller(fails_in: str) -> None:
    """style.md §9: the device plugin's error is logged once and noted; torch's caller gets its result."""
    gpu = _StandInGpu(frozenset({fails_in}))
    with structlog.testing.capture_logs() as logs, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile(**_with_gpu(gpu)) as prof:
            torch.ones(4).add(1)
            given = torch.autograd._disable_profiler()  # as Lightning calls it: must not raise
            torch.ones(4).mul(2)
    assert Counter(e.name() for e in given.events())["aten::add"] == 1
    assert _ops(prof)["aten::add"] == 1 and _ops(prof)["aten::mul"] == 0
    assert len(_stop_notes(caught)) == 1
    [failure] = [e for e in logs if e["event"] == f"tracer_{fails_in}_failed"]
    assert failure["tracer"] == "gpu_standin" and failure["log_level"] == "error"
    assert failure["error"] == f"RuntimeError: the stand-in GPU failed in {fails_in}"
    assert next(str(w.message) for w in caught if w.category is PluginFailureWarning).startswith(
        f"polyprof: tracer 'gpu_standin' failed in {fails_in}()"
    )
    assert (
        f"tracer 'gpu_standin' failed in {fails_in}() (RuntimeError: the stand-in GPU failed in {fails_in}); "
        "its events may be missing or incomplete" in prof.trace.notes
    )
    assert not torch.autograd._profiler_enabled()
    assert _torch_functions_are_back()


@pytest.mark.parametrize("fails_in", ["before_collector_stops", "receive"])
def test_a_device_tracer_failing_as_a_torch_profiler_starts_inside_never_reaches_it(fails_in: str) -> None:
    """The pause for a nested torch profiler runs inside torch's ``profile.__enter__``: isolated too."""
    gpu = _StandInGpu(frozenset({fails_in}))
    with structlog.testing.capture_logs() as logs, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile(**_with_gpu(gpu)) as prof:
            torch.ones(4).add(1)
            with TORCH_PROFILE() as inner:  # torch's own profiler: polyprof pauses for it
                torch.ones(4).mul(2)
            torch.ones(4).sub(1)
    assert Counter(e.name for e in inner.events())["aten::mul"] == 1
    assert _ops(prof)["aten::add"] == 1 and _ops(prof)["aten::sub"] == 1 and _ops(prof)["aten::mul"] == 0
    assert [w for w in caught if issubclass(w.category, torch_cpu.NestedProfilerWarning)]
    assert len([e for e in logs if e["event"] == f"tracer_{fails_in}_failed"]) == 1  # once, not per call
    assert _torch_functions_are_back()


def test_torchs_functions_keep_their_names_while_polyprof_records() -> None:
    with polyprof.profile():
        for (module, name), original in TORCH_FUNCTIONS.items():
            wrapper = getattr(module, name)
            assert wrapper is not original  # polyprof's, while it records
            assert (wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__) == (
                original.__name__,
                original.__doc__,
                original,
            )
    assert _torch_functions_are_back()


def test_a_wrapper_other_code_left_in_place_keeps_no_recording_alive() -> None:
    """Code that wraps ``torch.autograd._disable_profiler`` while polyprof records keeps its wrapper
    after the recording; polyprof's, inside it, is then a pass-through that holds no tracer."""
    tracers: list[weakref.ref] = []

    class SeeTracers:
        @hookimpl
        def polyprof_session_start(self, session: Any) -> None:
            tracers.extend(weakref.ref(t) for t in session.tracers if t.name == "torch_cpu")

    pm = make_plugin_manager_for_tests(("see_tracers", SeeTracers()), builtins=True)
    prof = polyprof.profile(plugin_manager=pm)
    try:
        with prof:
            polyprofs = torch.autograd._disable_profiler

            def theirs() -> Any:
                return polyprofs()

            torch.autograd._disable_profiler = theirs
        assert torch.autograd._disable_profiler is theirs  # left as that code left it
        del prof
        gc.collect()
        assert [ref() for ref in tracers] == [None]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with polyprof.profile() as later:
                torch.ones(4).add(1)
                result = theirs()  # through polyprof's spent wrapper, straight to torch's function
        assert Counter(e.name() for e in result.events())["aten::add"] == 1
        [note] = _stop_notes(caught)
        assert note.stopped_by is None and len(later.events()) == 0  # a stop no wrapper acted on
    finally:
        torch.autograd._disable_profiler = TORCH_FUNCTIONS[(torch.autograd, "_disable_profiler")]


# ------------------------------------------------------------- polyprof run


def _run(argv: list[str]) -> int:
    from polyprof.cli.cli_run import add_run_command

    parser = argparse.ArgumentParser(prog="polyprof")
    add_run_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["run", *argv])
    return int(args.handler(args))


def test_polyprof_run_notes_a_stop_from_outside_after_the_table(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stops.py").write_text(
        textwrap.dedent(
            """
            import torch
            x = torch.ones(4)
            x.add(1)
            if torch.autograd._profiler_enabled():
                torch.autograd._disable_profiler()
            x.mul(2)
            print("DONE")
            """
        )
    )
    assert _run(["--row-limit", "-1", "--output-dir", "out", "stops.py"]) == 0
    out, err = capsys.readouterr()
    assert out == "DONE\n"
    assert "aten::add" in err and "aten::mul" not in err
    assert len(re.findall(r"^polyprof run: trace written to ", err, flags=re.MULTILINE)) == 1
    last = err.rstrip().splitlines()[-1]
    match = re.fullmatch(f"polyprof run: {NOTE_RE}", last)
    assert match, err
    assert (match["who"], match["function"], match["line"]) == ("stops.py", "<module>", "6")
    assert "Warning" not in err and "events are missing" not in err


def test_polyprof_run_folds_the_stop_into_its_step_aside_note(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """Lightning's order without Lightning: stop torch's profiler, then start one's own."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "own.py").write_text(
        textwrap.dedent(
            """
            import torch
            torch.ones(4).add(1)
            torch.autograd._disable_profiler()
            with torch.profiler.profile() as prof:
                torch.ones(4).mul(2)
            print(sorted({e.name for e in prof.events()} & {"aten::add", "aten::mul"}))
            """
        )
    )
    assert _run(["--output-dir", "out", "own.py"]) == 0
    out, err = capsys.readouterr()
    assert out == "['aten::mul']\n"
    notes = [line for line in err.splitlines() if line.startswith("polyprof run: ")]
    assert len(notes) == 1, err
    assert re.fullmatch(
        r"polyprof run: own\.py \(<module>, line 4\) stopped torch's profiler with "
        r"torch\.autograd\._disable_profiler\(\) \d+\.\d{3} s into the recording, then the script started "
        r"its own profiler \(polyprof\.shim\.TorchProfile\); the whole-script profile stopped there and was "
        r"not written \(the script's profilers ran through polyprof\)",
        notes[0],
    ), notes[0]
    assert "Warning" not in err


def test_polyprof_run_of_a_script_whose_profile_is_stopped_and_followed_by_another(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """What Lightning's profiler does inside a script's own profile, without Lightning: both run
    through polyprof, as both would run with torch."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nested.py").write_text(
        textwrap.dedent(
            """
            import torch
            x = torch.ones(4)
            with torch.profiler.profile() as outer:
                x.add(1)
                if torch.autograd._profiler_enabled():
                    torch.autograd._disable_profiler()
                with torch.profiler.profile() as inner:
                    x.mul(2)
            names = lambda p: sorted({e.name for e in p.events()} & {"aten::add", "aten::mul"})
            print("OUTER", names(outer), "INNER", names(inner))
            """
        )
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _run(["--output-dir", "out", "nested.py"]) == 0
    out, err = capsys.readouterr()
    assert out == "OUTER ['aten::add'] INNER ['aten::mul']\n"
    # the script's own profile says what happened to it, at its own line, as it would outside polyprof run
    [note] = _stop_notes(caught)
    assert re.fullmatch(f"polyprof: {NOTE_RE}", str(note))["who"] == "nested.py"
    notes = [line for line in err.splitlines() if line.startswith("polyprof run: ")]
    assert notes == [f"polyprof run: {STEPPED_ASIDE}"], err
    assert "RecordingInProgressError" not in err and "Traceback" not in err


def _warn_from_this_module() -> None:
    warnings.warn("a warning of this test module's", UserWarning, stacklevel=1)


def test_polyprof_run_leaves_other_warnings_to_the_warnings_filters(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """A warning given while the whole-script profile stops is given as it came: a filter naming its
    module still matches it (polyprof does not catch and replay warnings to find its own note)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.py").write_text("import torch\ntorch.ones(4).add(1)\n")
    metadata = torch_cpu.TorchCpuTracer.trace_metadata

    def warn_then_metadata(self: Any) -> dict[str, Any]:
        _warn_from_this_module()
        return metadata(self)

    monkeypatch.setattr(torch_cpu.TorchCpuTracer, "trace_metadata", warn_then_metadata)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.filterwarnings("always", module=re.escape(__name__) + "$")
        assert _run(["--output-dir", "out", "plain.py"]) == 0
    [given] = [w for w in caught if str(w.message) == "a warning of this test module's"]
    assert given.filename == __file__ and given.category is UserWarning
    capsys.readouterr()


def test_polyprof_run_keeps_the_note_of_a_stop_when_a_later_step_fails(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """The cycle is not written (the whole-script profile failed), but who stopped torch's profiler
    is still said at the end."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """
            import torch
            model = torch.nn.Linear(4, 4)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(2):
                model(torch.ones(2, 4)).sum().backward()
                if step == 0:
                    torch.autograd._disable_profiler()
                optimizer.step()
            print("TRAINED")
            """
        )
    )

    def failing_step(self: Any) -> None:
        raise RuntimeError("step failed")

    monkeypatch.setattr(polyprof.profile, "step", failing_step)
    assert _run(["--schedule", "0,0,3", "--output-dir", "out", "train.py"]) == 1  # the profile failed
    out, err = capsys.readouterr()
    assert out == "TRAINED\n"
    notes = [line for line in err.splitlines() if line.startswith("polyprof run: ")]
    assert notes[0] == "polyprof run: the whole-script profile failed at optimizer step 1: step failed", err
    assert re.fullmatch(
        r"polyprof run: train\.py \(<module>, line 8\) stopped torch's profiler with "
        r"torch\.autograd\._disable_profiler\(\) \d+\.\d{3} s into the recording "
        r"\(that cycle was not written\)",
        notes[1],
    ), err
    assert len(notes) == 2 and "Warning" not in err


def test_polyprof_run_ends_the_whole_script_profile_with_the_cycle_that_was_stopped(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """Later cycles would hold nothing from torch's collector: none is written.

    The stop comes in the first cycle, before any cycle ends.
    """
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """
            import torch
            model = torch.nn.Linear(4, 4)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(6):
                model(torch.ones(2, 4)).sum().backward()
                if step == 1:
                    torch.autograd._disable_profiler()
                optimizer.step()
            print("TRAINED")
            """
        )
    )
    assert _run(["--schedule", "0,0,3", "--output-dir", "out", "train.py"]) == 0
    out, err = capsys.readouterr()
    assert out == "TRAINED\n"
    assert "aten::addmm" in err  # what came before the stop is in the one table
    assert len(re.findall(r"^polyprof run: trace written to ", err, flags=re.MULTILINE)) == 1, err
    last = err.rstrip().splitlines()[-1]
    assert re.fullmatch(
        r"polyprof run: train\.py \(<module>, line 8\) stopped torch's profiler with "
        r"torch\.autograd\._disable_profiler\(\) \d+\.\d{3} s into the recording \(cycle 1\); the results "
        r"hold what torch recorded until then, and nothing after it",
        last,
    ), err
    assert "Warning" not in err and "holds nothing from torch's collector" not in err


# ------------------------------------------------------------- PyTorch Lightning itself

#: A LightningModule on random CPU data, fitted with Lightning's PyTorchProfiler.
LIGHTNING_SCRIPT = HERE / "in_child" / "lightning_fit.py"


@needs_lightning
@pytest.mark.slow
def test_lightning_pytorch_profiler_under_polyprof_run(tmp_path: Path) -> None:
    """The whole-script profile: stopped by Lightning, then Lightning's profiler runs through polyprof."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    done = subprocess.run(
        [sys.executable, "-m", "polyprof", "run", "--output-dir", "out", str(LIGHTNING_SCRIPT)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    both = done.stdout + done.stderr
    assert done.returncode == 0, both
    assert "FITTED" in done.stdout
    # Lightning's own report, made by polyprof behind torch.profiler.profile, has its training steps.
    assert "FIT Profiler Report" in both and "[pl][profile]run_training_batch" in both
    notes = [line for line in done.stderr.splitlines() if line.startswith("polyprof run: ")]
    assert len(notes) == 1, done.stderr
    assert re.fullmatch(
        r"polyprof run: lightning\.pytorch\.profilers\.pytorch \(PyTorchProfiler\.start, line \d+\) stopped "
        r"torch's profiler with torch\.autograd\._disable_profiler\(\) \d+\.\d{3} s into the recording, then "
        r"the script started its own profiler \(polyprof\.shim\.TorchProfile\); the whole-script profile "
        r"stopped there and was not written \(the script's profilers ran through polyprof\)",
        notes[0],
    ), notes[0]
    for unwanted in (
        "ERROR",
        "Traceback",
        "bus_tracer_decode_failed",
        "events are missing",
        TORCH_NO_SESSION,
    ):
        assert unwanted not in both, both
    assert not (tmp_path / "out").exists()  # made for the trace, written into by nothing, removed
    # Lightning's own trace (its tensorboard_trace_handler, here polyprof's) is written where it writes it.
    assert list(tmp_path.glob("fit-*.pt.trace.json")), sorted(p.name for p in tmp_path.iterdir())


@needs_lightning
@pytest.mark.slow
def test_lightning_inside_the_scripts_own_profile_under_polyprof_run(tmp_path: Path) -> None:
    """``with torch.profiler.profile(): trainer.fit()``: torch runs it (Lightning's profiler records, the
    script's is left with what it had), and so does ``polyprof run``, with polyprof behind both."""
    (tmp_path / "fit_inside.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(HERE / "in_child")!r})
            import torch
            from lightning_fit import fit

            with torch.profiler.profile() as outer:
                torch.ones(4).add(1)
                trainer = fit()
            print("OUTER", sorted({{e.name for e in outer.events()}} & {{"aten::add", "aten::mse_loss"}}))
            print("LIGHTNING", sum(e.name == "aten::mse_loss" for e in trainer.profiler.function_events) > 0)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    done = subprocess.run(
        [sys.executable, "-m", "polyprof", "run", "--output-dir", "out", "fit_inside.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    both = done.stdout + done.stderr
    assert done.returncode == 0, both
    assert "OUTER ['aten::add']\nLIGHTNING True\n" in done.stdout, both
    assert "FIT Profiler Report" in both and "[pl][profile]run_training_batch" in both
    assert re.search(
        # Lightning's warnings.formatwarning leaves the category out
        r"fit_inside\.py:\d+: (ProfilerStoppedOutsideWarning: )?polyprof: "
        r"lightning\.pytorch\.profilers\.pytorch \(PyTorchProfiler\.start, line \d+\) stopped torch's "
        r"profiler",
        done.stderr,
    ), done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("polyprof run: ")]
    assert notes == [f"polyprof run: {STEPPED_ASIDE}"], done.stderr
    for unwanted in ("RecordingInProgressError", "Traceback", "AssertionError", "ERROR", TORCH_NO_SESSION):
        assert unwanted not in both, both
    assert list(tmp_path.glob("fit-*.pt.trace.json")), sorted(p.name for p in tmp_path.iterdir())


@needs_lightning
@pytest.mark.slow
def test_lightning_pytorch_profiler_inside_polyprof_profile() -> None:
    """In-process: polyprof.profile around trainer.fit, torch's own profiler for Lightning (no shims);
    and torch.profiler.profile around it with polyprof's shims in place, Lightning's then polyprof's."""
    summary = run_pytest_in_child(str(HERE / "in_child" / "lightning_profiler.py"))
    assert "2 passed" in summary, summary
