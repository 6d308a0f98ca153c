"""``profile.export_memory_timeline`` against torch.profiler's on the same CPU training step.

What two torch runs of one workload share, measured: the raw events (action,
bytes, category, in order) are equal; the timestamps and how many of them
there are differ (events that fall in one microsecond merge), so the JSON
timeline is compared state by state: every size-by-category vector polyprof
writes is one that torch's raw events pass through, in order, and the first
and last are torch's.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import polyprof
from polyprof.runtime import memory_timeline

torch = pytest.importorskip("torch")
from torch.profiler import ProfilerActivity  # noqa: E402

MEMORY_FLAGS = {"record_shapes": True, "profile_memory": True, "with_stack": True}
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _training_step(model: Any, optimizer: Any, x: Any) -> None:
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _record(profile_class: Callable[..., Any], **flags: Any) -> Any:
    """Two steps of a small MLP with Adam: parameters, activations, gradients, optimizer state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(32, 64)
    _training_step(model, optimizer, x)  # optimizer state exists before the recording, as in training
    with profile_class(activities=[ProfilerActivity.CPU], **flags) as prof:
        for _ in range(2):
            _training_step(model, optimizer, x)
    return prof


@pytest.fixture(scope="module")
def profiles() -> dict[str, Any]:
    return {
        "torch": _record(torch.profiler.profile, **MEMORY_FLAGS),
        "polyprof": _record(polyprof.profile, **MEMORY_FLAGS),
    }


def _export(prof: Any, path: Path, device: str | None = "cpu") -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof.export_memory_timeline(str(path), device)
    return caught


def _raw_events(path: Path) -> list[list[int]]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _states(raw: list[list[int]], categories: int) -> list[list[int]]:
    """Each size-by-category vector the raw events pass through (torch's JSON layout: slot 0 unused)."""
    state = [0] * (categories + 1)
    states = []
    for _time, _action, numbytes, category in raw:
        state[category + 1] += numbytes
        states.append(list(state))
    return states


def test_raw_events_equal_torchs(profiles: dict[str, Any], tmp_path: Path) -> None:
    raws = {}
    for name, prof in profiles.items():
        _export(prof, tmp_path / f"{name}.raw.json.gz")
        raws[name] = [event[1:] for event in _raw_events(tmp_path / f"{name}.raw.json.gz")]
    assert len(raws["torch"]) > 100
    categories = {event[2] for event in raws["torch"]}
    assert len(categories) >= 6  # parameters, optimizer state, inputs, activations, gradients, ...
    assert raws["polyprof"] == raws["torch"]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_timeline_states_are_torchs(profiles: dict[str, Any], tmp_path: Path, suffix: str) -> None:
    _export(profiles["torch"], tmp_path / "torch.raw.json.gz")
    torch_raw = _raw_events(tmp_path / "torch.raw.json.gz")
    path = tmp_path / f"polyprof{suffix}"
    _export(profiles["polyprof"], path)
    with gzip.open(path, "rt") if suffix.endswith(".gz") else open(path) as f:
        times, sizes = json.load(f)
    width = len(sizes[0]) - 1
    torch_states = _states(torch_raw, width)
    assert len(times) == len(sizes) > 50
    assert times == sorted(times) and all(isinstance(t, int) for t in times)
    # each state is one torch's events pass through, in torch's order (some merge within a microsecond)
    position = 0
    for state in sizes[1:]:
        position = torch_states.index(state, position)
    assert sizes[-1] == torch_states[-1]
    torch_times, torch_sizes = json.loads(_torch_json(profiles["torch"], tmp_path))
    assert sizes[0] == torch_sizes[0] and sizes[-1] == torch_sizes[-1]
    # timestamps in torch's unit and clock: microseconds since the epoch, like torch's
    assert abs(times[0] - torch_times[0]) < 600 * 1_000_000


def _torch_json(prof: Any, tmp_path: Path) -> str:
    _export(prof, tmp_path / "torch.json")
    return (tmp_path / "torch.json").read_text()


def test_default_device_and_cuda_device_as_torch(profiles: dict[str, Any], tmp_path: Path) -> None:
    prof = profiles["polyprof"]
    _export(prof, tmp_path / "default.json", device=None)
    _export(prof, tmp_path / "cpu.json", device="cpu")
    expected_default = "cpu.json" if not torch.cuda.is_available() else None
    if expected_default is not None:
        assert (tmp_path / "default.json").read_text() == (tmp_path / expected_default).read_text()
    # a device with no recorded memory: torch writes two empty lists
    for name, recorded in profiles.items():
        _export(recorded, tmp_path / f"{name}-cuda.json", device="cuda:0")
    assert (tmp_path / "polyprof-cuda.json").read_text() == (tmp_path / "torch-cuda.json").read_text()


def test_html_as_torch(profiles: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, prof in profiles.items():
        _export(prof, tmp_path / f"{name}.html")
    printed = capsys.readouterr().out
    if not HAS_MATPLOTLIB:
        # torch prints why and writes nothing; polyprof (calling torch's writer) the same
        assert printed.count("export_memory_timeline_html failed because matplotlib was not found.") == 2
        assert not list(tmp_path.iterdir())
        return
    for name in profiles:
        html = (tmp_path / f"{name}.html").read_text()
        assert html.startswith("<html>") and html.rstrip().endswith("</html>")
        assert "<img src='data:image/png;base64,iVBORw0KGgo" in html  # a PNG


def test_future_warning_as_installed_torch(profiles: dict[str, Any], tmp_path: Path) -> None:
    caught = {name: _export(prof, tmp_path / f"{name}.json") for name, prof in profiles.items()}
    seen = {name: [(w.category, str(w.message), w.filename) for w in ws] for name, ws in caught.items()}
    assert seen["polyprof"] == seen["torch"]
    message = memory_timeline.torch_deprecation_message()
    assert [m for _, m, _ in seen["polyprof"]] == ([message] if message else [])
    if message:
        assert seen["polyprof"][0][0] is FutureWarning and seen["polyprof"][0][2] == __file__


FLAG_SETS = [
    {},
    {"profile_memory": True},
    {"record_shapes": True, "with_stack": True},
    {"record_shapes": True, "profile_memory": True},
]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: "+".join(f) or "none")
def test_missing_flags_error_as_torch(flags: dict[str, bool], tmp_path: Path) -> None:
    outcomes = {}
    for name, profile_class in (("torch", torch.profiler.profile), ("polyprof", polyprof.profile)):
        prof = _record(profile_class, **flags)
        with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError) as raised:
            warnings.simplefilter("always")
            prof.export_memory_timeline(str(tmp_path / f"{name}.json"))
        outcomes[name] = (str(raised.value), [str(w.message) for w in caught])
        assert not (tmp_path / f"{name}.json").exists()
    assert outcomes["polyprof"] == outcomes["torch"]
    assert "required for memory profiling." in outcomes["torch"][0]


def test_before_recording_is_an_assertion_as_in_torch(tmp_path: Path) -> None:
    for profile_class in (torch.profiler.profile, polyprof.profile):
        prof = profile_class(activities=[ProfilerActivity.CPU], **MEMORY_FLAGS)
        with warnings.catch_warnings(), pytest.raises(AssertionError):
            warnings.simplefilter("ignore")
            prof.export_memory_timeline(str(tmp_path / "never.json"))
    assert not (tmp_path / "never.json").exists()


def test_raw_result_kept_only_for_the_memory_profile() -> None:
    kept = _record(polyprof.profile, **MEMORY_FLAGS)
    assert len(kept._memory_profile_results) == 1
    for flag in MEMORY_FLAGS:
        fewer = {**MEMORY_FLAGS, flag: False}
        assert _record(polyprof.profile, **fewer)._memory_profile_results == ()


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_last_cycle_of_a_schedule(tmp_path: Path) -> None:
    """With a schedule, the timeline is the last finished cycle's, as torch's ``kineto_results``."""
    exported: dict[str, list[list[list[int]]]] = {}

    def on_ready(name: str) -> Callable[[Any], None]:
        def handler(prof: Any) -> None:
            path = tmp_path / f"{name}-{prof.step_num}.raw.json.gz"
            _export(prof, path)
            exported.setdefault(name, []).append([event[1:] for event in _raw_events(path)])

        return handler

    for name, profile_class in (("torch", torch.profiler.profile), ("polyprof", polyprof.profile)):
        x = torch.randn(16, 16)
        with profile_class(
            activities=[ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=1, repeat=2),
            on_trace_ready=on_ready(name),
            **MEMORY_FLAGS,
        ) as prof:
            for size in itertools.islice(itertools.count(1), 2):
                torch.cat([x] * size)  # the second cycle's tensor is twice the first's
                prof.step()
    assert exported["polyprof"] == exported["torch"]
    first, second = exported["torch"]
    assert first != second


def _outcomes_between_cycles(profile_class: Callable[..., Any], path: Path, **options: Any) -> list[str]:
    """What export_memory_timeline does after each step of two cycles (wait, warmup, record each),
    and, for polyprof, whether the profile or its torch tracer still holds a raw result."""
    outcomes = []
    x = torch.randn(16, 16)
    with profile_class(
        activities=[ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=2),
        **MEMORY_FLAGS,
        **options,
    ) as prof:
        for _ in range(5):  # steps 1..5: warmup, record, wait (cycle 1 done), warmup (cycle 2), record
            torch.cat([x, x])
            prof.step()
            try:
                _export(prof, path)
                outcome = "written"
            except AssertionError:
                outcome = "AssertionError"
            if isinstance(prof, polyprof.profile):
                tracer_held = polyprof.frontends.profiler._memory_profile_results(prof._lifecycle.session)
                outcome += f" held={len(prof._memory_profile_results)},{len(tracer_held)}"
            outcomes.append(outcome)
    return outcomes


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
@pytest.mark.parametrize("acc_events", [False, True], ids=["cleared", "acc_events"])
def test_next_cycle_prepare_releases_the_raw_result_as_torch(tmp_path: Path, acc_events: bool) -> None:
    """torch's prepare_trace drops its profiler (unless acc_events): the last cycle's raw result is
    not held while the next one records, and an export then is torch's AssertionError."""
    options = {"acc_events": True} if acc_events else {}
    torchs = _outcomes_between_cycles(torch.profiler.profile, tmp_path / "torch.json", **options)
    ours = _outcomes_between_cycles(polyprof.profile, tmp_path / "polyprof.json", **options)
    assert [outcome.split(" held=")[0] for outcome in ours] == torchs
    kept_result = "1,0" if acc_events else "0,0"  # with acc_events torch keeps the last cycle's too
    assert [outcome.split(" held=")[1] for outcome in ours] == ["0,0", "0,0", "1,1", kept_result, kept_result]
    assert torchs[2] == "written"
    assert torchs[3] == ("written" if acc_events else "AssertionError")


def test_without_torch_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    prof = polyprof.profile(activities=[ProfilerActivity.CPU], **MEMORY_FLAGS)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as where it is not installed
    with pytest.raises(memory_timeline.MemoryTimelineNeedsTorchError, match="needs torch") as raised:
        prof.export_memory_timeline(str(tmp_path / "timeline.json"))
    assert isinstance(raised.value, ImportError)
    assert "\n" not in str(raised.value)
