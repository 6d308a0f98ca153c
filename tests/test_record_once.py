"""torch's ``enabled`` and record-once rule, written once (``polyprof.runtime.recording.RecordOnce``).

``polyprof.legacy.profile`` and the autograd shim (``polyprof.shim.AutogradProfile``) both compose
it; tests/test_shim.py holds both frontends, and torch, to the same rule. Here: the policy itself,
and the two parts of ``polyprof.profile`` that a composing frontend uses (recording on behalf of
the frontend, export with extra metadata).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import polyprof
from polyprof import ProfilerActivity
from polyprof.base.errors import ProfilerDisabledError
from polyprof.runtime.recording import RecordOnce, recording_gate

torch = pytest.importorskip("torch")

CPU = [ProfilerActivity.CPU]


def work() -> None:
    torch.add(torch.ones(4), torch.ones(4))


# ------------------------------------------------------------------ the policy


def test_record_once_enters_once_and_leaves_once() -> None:
    once = RecordOnce(enabled=True, frontend="example.profile")
    started: list[int] = []
    assert not once.entered
    assert once.enter(lambda: started.append(1)) is True
    assert started == [1] and once.entered and once.recording and not once.finished
    with pytest.raises(RuntimeError, match="not reentrant: this profile is already recording"):
        once.enter(lambda: started.append(2))
    assert once.leave() is True
    assert once.finished and not once.recording and once.entered
    assert once.leave() is False  # one recording, one end
    with pytest.raises(
        RuntimeError,
        match=r"not reentrant: this example.profile has already recorded once; create a new "
        r"example.profile\(\.\.\.\) to profile again",
    ):
        once.enter(lambda: started.append(3))
    assert started == [1]
    once.check_enabled("table()")  # enabled: no error


def test_record_once_an_entry_that_failed_may_be_retried() -> None:
    once = RecordOnce(enabled=True, frontend="example.profile")

    def fail() -> None:
        raise OSError("no device")

    with pytest.raises(OSError, match="no device"):
        once.enter(fail)
    assert not once.entered and not once.recording
    assert once.leave() is False  # nothing to end
    assert once.enter(lambda: None) is True


def test_record_once_disabled_records_nothing_and_names_the_frontend() -> None:
    once = RecordOnce(enabled=False, frontend="example.profile")
    called: list[int] = []
    for _ in range(2):  # as torch: a disabled profile may be entered any number of times
        assert once.enter(lambda: called.append(1)) is False
        assert once.leave() is False
    assert called == [] and not once.entered
    with pytest.raises(
        ProfilerDisabledError,
        match=r"table\(\): the profiler was disabled \(enabled=False\), so it recorded nothing. Create it "
        r"with example.profile\(enabled=True, \.\.\.\) to get results",
    ):
        once.check_enabled("table()")


# ------------------------------------------------------------------ what a composing frontend uses


def test_a_profile_recording_on_behalf_of_a_frontend_names_it_at_the_gate() -> None:
    frontend = object()
    prof = polyprof.profile.on_behalf_of(frontend, activities=CPU)
    assert type(prof) is polyprof.profile
    with prof:
        assert recording_gate.current() is frontend
        with pytest.raises(RuntimeError, match=r"already recording \(<object object"):
            polyprof.profile(activities=CPU).start()
        work()
    assert recording_gate.current() is None
    assert "aten::add" in {e.key for e in prof.key_averages()}


def test_export_adds_metadata_to_the_file_it_writes(tmp_path: Path) -> None:
    with polyprof.profile(activities=CPU) as prof:
        work()
    path = prof.export(tmp_path / "a.json", metadata_json={"run": '"nightly"', "epoch": "3"})
    written = json.loads(Path(path).read_text())
    assert written["run"] == "nightly" and written["epoch"] == 3
    assert "run" not in prof.trace.metadata_json  # the profile's own trace is unchanged
    assert "run" not in json.loads(Path(prof.export(tmp_path / "b.json")).read_text())
    with pytest.raises(ValueError, match="metadata value for 'bad' is not valid JSON"):
        prof.export(tmp_path / "c.json", metadata_json={"bad": "not json"})
    assert not (tmp_path / "c.json").exists()
