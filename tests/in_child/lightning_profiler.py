"""PyTorch Lightning's PyTorchProfiler inside a polyprof profile (run in its own process by
tests/test_outside_stop.py: importing Lightning changes ``warnings.formatwarning`` for the process)."""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polyprof
from polyprof.base.user_warnings import ProfilerStoppedOutsideWarning
from test_outside_stop import NOTE_RE, TORCH_NO_SESSION

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lightning_fit import fit  # noqa: E402


def test_lightning_stops_polyprofs_recording_and_polyprof_keeps_what_came_before(
    capfd: Any, tmp_path: Path
) -> None:
    import re

    from polyprof.runtime.torch_cpu import NestedProfilerWarning

    x = torch.ones(4)
    with structlog.testing.capture_logs() as logs, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with polyprof.profile() as prof:
            for _ in range(3):
                x.add(1)
            trainer = fit(str(tmp_path))
            x.mul(2)
    ops = Counter(e.name for e in prof.events())
    # Before Lightning stopped torch's profiler: polyprof's. After it: Lightning's profiler's, then no one's.
    assert ops["aten::add"] == 3
    assert ops["aten::mul"] == 0 and not [name for name in ops if name.startswith("[pl]")]
    notes = [w.message for w in caught if isinstance(w.message, ProfilerStoppedOutsideWarning)]
    assert len(notes) == 1, [str(w.message) for w in caught]
    match = re.fullmatch(f"polyprof: {NOTE_RE}", str(notes[0]))
    assert match, str(notes[0])
    assert (match["who"], match["function"]) == (
        "lightning.pytorch.profilers.pytorch",
        "PyTorchProfiler.start",
    )
    assert any("lightning.pytorch.profilers.pytorch" in note for note in prof.trace.notes)
    # polyprof did not pause for Lightning's profiler (its recording had ended), nor fail to decode.
    assert not [w for w in caught if issubclass(w.category, NestedProfilerWarning)]
    assert not [w for w in caught if "events are missing" in str(w.message)]
    assert not [e for e in logs if e["log_level"] in ("error", "critical")], logs
    assert [e["stopped_by"] for e in logs if e["event"] == "torch_profiler_stopped_outside"] == [
        notes[0].stopped_by
    ]
    assert TORCH_NO_SESSION not in capfd.readouterr().err
    # Lightning's own profile (torch's profiler, no shims here) is whole.
    lightning_ops = Counter(e.name for e in trainer.profiler.function_events)
    assert lightning_ops["[pl][profile]run_training_batch"] >= 1
    assert lightning_ops["aten::mse_loss"] >= 1
    assert list(tmp_path.glob("*.pt.trace.json")), "Lightning wrote its trace where it was told"


def test_under_the_shims_lightnings_profiler_takes_over_from_the_scripts_own(
    capfd: Any, tmp_path: Path
) -> None:
    """``with torch.profiler.profile(): trainer.fit()`` with polyprof behind torch's names (polyprof.shim,
    as ``polyprof run`` puts it): Lightning stops the script's profile, then records with its own, as
    with torch. The script's profile keeps what it had before (torch's would keep nothing)."""
    from polyprof import shim
    from polyprof.runtime.recording import recording_gate

    x = torch.ones(4)
    with (
        structlog.testing.capture_logs() as logs,
        warnings.catch_warnings(record=True) as caught,
        shim.shimmed(),
    ):
        warnings.simplefilter("always")
        with torch.profiler.profile() as outer:
            x.add(1)
            trainer = fit(str(tmp_path))
            x.mul(2)
    assert type(outer).__module__ == "polyprof.shim"
    ops = Counter(e.name for e in outer.events())
    assert ops["aten::add"] == 1 and ops["aten::mul"] == 0 and ops["aten::mse_loss"] == 0
    notes = [w.message for w in caught if isinstance(w.message, ProfilerStoppedOutsideWarning)]
    assert [n.stopped_by.split(" (")[0] for n in notes] == ["lightning.pytorch.profilers.pytorch"]
    # Lightning's profile was polyprof's too, and holds the training.
    lightning_ops = Counter(e.name for e in trainer.profiler.function_events)
    assert lightning_ops["[pl][profile]run_training_batch"] >= 1 and lightning_ops["aten::mse_loss"] >= 1
    assert list(tmp_path.glob("*.pt.trace.json")), "Lightning wrote its trace where it was told"
    assert not [e for e in logs if e["log_level"] in ("error", "critical")], logs
    err = capfd.readouterr().err
    for unwanted in ("RecordingInProgressError", "Traceback", "AssertionError", TORCH_NO_SESSION):
        assert unwanted not in err, err
    assert recording_gate.current() is None and not torch.autograd._profiler_enabled()
