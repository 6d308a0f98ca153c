"""``with_stack=True`` shows no more of the profiler than torch.profiler shows of itself.

torch's Python tracer records the profiler's own frames too: torch.profiler's
trace shows its ``__enter__`` / ``stop`` chain and what that calls. polyprof's
events, trace and op stacks must show none of polyprof's packages, and no more
profiler frames than torch's, while the user's frames stay.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import polyprof  # noqa: E402
from polyprof.runtime import own_frames  # noqa: E402

#: Files of polyprof's packages, as torch's tracer names them (site-packages cut off, or absolute).
POLYPROF_FILE = re.compile(r"(^|/)(polyprof|polyprof_builtins|polyprof_cuda|polyprof_xpu)/[^(]*\.py\(\d+\): ")
#: Files of torch's profiler.
TORCH_PROFILER_FILE = re.compile(r"(^|/)torch/(profiler/|autograd/profiler[^(]*\.py)")


def _profiler_file(frame: str) -> bool:
    return bool(POLYPROF_FILE.search(frame) or TORCH_PROFILER_FILE.search(frame))


def small_workload() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model(torch.randn(8, 32)).sum().backward()


def _profile(profiler: Any, tmp_path: Path, name: str) -> tuple[Any, list[dict]]:
    small_workload()  # warm: lazy imports and first-call setup stay out of both profiles
    with profiler(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        small_workload()
    path = tmp_path / f"{name}.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return prof, [ev for ev in events if ev.get("cat") == "python_function"]


def _parent_id(frame: dict) -> Any:
    return frame.get("args", {}).get("Python parent id")


def _profiler_subtree(frames: list[dict]) -> list[dict]:
    """Frames of the profiler's files, and every frame they call (by Python parent ids)."""
    by_id = {frame["args"]["Python id"]: frame for frame in frames}

    def under_profiler(frame: dict | None) -> bool:
        seen = set()
        while frame is not None and id(frame) not in seen:
            if _profiler_file(frame["name"]):
                return True
            seen.add(id(frame))
            frame = by_id.get(_parent_id(frame))
        return False

    return [frame for frame in frames if under_profiler(frame)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, list[dict]]]:
    tmp_path = tmp_path_factory.mktemp("own_frames")
    return {
        "torch": _profile(torch.profiler.profile, tmp_path, "torch"),
        "polyprof": _profile(polyprof.profile, tmp_path, "polyprof"),
    }


def test_trace_shows_no_more_profiler_frames_than_torchs(runs: dict) -> None:
    theirs = _profiler_subtree(runs["torch"][1])
    ours = _profiler_subtree(runs["polyprof"][1])
    assert not [f["name"] for f in ours if POLYPROF_FILE.search(f["name"])]
    assert len(ours) <= len(theirs), [f["name"] for f in ours]


def test_events_show_no_more_profiler_frames_than_torchs(runs: dict) -> None:
    def profiler_names(prof: Any) -> list[str]:
        events = prof.events()
        names = [e.name for e in events if getattr(e, "is_python_function", False) and _profiler_file(e.name)]
        return names + [frame for e in events for frame in (e.stack or []) if _profiler_file(frame)]

    ours = profiler_names(runs["polyprof"][0])
    assert not [name for name in ours if POLYPROF_FILE.search(name)]
    assert len(ours) <= len(profiler_names(runs["torch"][0]))


def test_the_users_frames_stay(runs: dict) -> None:
    for _, frames in runs.values():
        assert [f for f in frames if f["name"].endswith(": small_workload")]
    ours = runs["polyprof"][0].events()
    if any(getattr(e, "is_python_function", False) for e in runs["torch"][0].events()):  # 2.12+
        assert [
            e for e in ours if getattr(e, "is_python_function", False) and e.name.endswith(": small_workload")
        ]

    def in_workload(prof: Any) -> list[bool]:
        linear = [e for e in prof.events() if e.name == "aten::linear"]
        return [any(frame.endswith(": small_workload") for frame in e.stack or []) for e in linear]

    # op stacks (filled by torch only in some versions and modes) keep the user's frames as torch's do
    assert in_workload(runs["polyprof"][0]) == in_workload(runs["torch"][0])


def test_a_function_decorated_with_record_function_keeps_its_caller(tmp_path: Path) -> None:
    """polyprof's decorator calls the user's function: that frame stays, under the user's caller."""
    decorated = polyprof.record_function("decorated")(small_workload)

    def caller() -> None:
        decorated()

    caller()
    with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU], with_stack=True) as prof:
        caller()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    frames = [
        e
        for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
        if e.get("cat") == "python_function"
    ]
    by_id = {frame["args"]["Python id"]: frame for frame in frames}
    assert not [f["name"] for f in frames if POLYPROF_FILE.search(f["name"])]
    (workload,) = [f for f in frames if f["name"].endswith(": small_workload")]
    assert by_id[_parent_id(workload)]["name"].endswith(": caller")


def _chain_parents(depth: int) -> tuple[np.ndarray, np.ndarray]:
    """ids 1..depth, each the child of the one before, listed in a shuffled order."""
    ids = np.arange(1, depth + 1, dtype=np.int64)
    order = np.random.default_rng(0).permutation(depth)
    return ids[order], (ids - 1)[order] - (ids[order] == 1)  # id 1 is the root (-1)


def test_kept_parents_skip_any_depth_of_dropped_frames() -> None:
    """On a deep chain where every third frame is kept, each kept frame hangs on the kept one above."""
    depth = 3000
    py_id, py_parent = _chain_parents(depth)
    own = py_id % 3 != 1  # kept: ids 1, 4, 7, ...
    parents = own_frames.kept_parents(own, py_id, py_parent, np.zeros(depth, dtype=bool))
    kept = ~own
    assert parents[kept].tolist() == np.where(py_id[kept] == 1, -1, py_id[kept] - 3).tolist()


def test_profiler_frames_reach_every_depth_below_polyprofs_frame() -> None:
    """Below a polyprof frame at depth 10 of a deep chain, every frame is the profiler's."""
    depth = 2000
    py_id, py_parent = _chain_parents(depth)
    names = ("user.py(1): f", own_frames.own_code_prefixes()[0] + "session.py(2): stop")
    name_idx = np.where(py_id == 10, 1, 0)
    own = own_frames.profiler_frames(np.arange(depth), names, name_idx, py_id, py_parent)
    assert own.tolist() == (py_id >= 10).tolist()


def test_a_thread_chained_under_polyprofs_thread_becomes_a_root() -> None:
    """torch chains untracked threads' stacks: the main thread's frame 1, polyprof's bus thread
    (2, 3: dropped), a user thread (4, 5). The user thread must not hang on the main thread."""
    py_id = np.array([1, 2, 3, 4, 5, 6, 7, 8])
    py_parent = np.array([-1, 1, 2, 3, 4, 5, 6, 7])
    own = np.array([False, True, True, False, False, True, False, True])
    entry = np.array([False, True, False, True, False, False, False, False])
    tid = np.array([0, 0, 0, 0, 0, 0, 0, 9])
    parents = own_frames.kept_parents(own, py_id, py_parent, entry, tid)
    # 4: the thread's entry under a dropped frame: a root; 7: polyprof's frame 6 called it: it
    # hangs on the caller 5, on the same thread
    assert parents[~own].tolist() == [-1, -1, 4, 5]
    # a frame whose dropped parent runs on another tid is a root too
    tid_parents = own_frames.kept_parents(
        own, py_id, py_parent, np.zeros(8, dtype=bool), np.array([0] * 6 + [1, 1])
    )
    assert tid_parents[6] == -1


def test_a_users_schedule_is_in_the_trace_as_in_torchs(tmp_path: Path) -> None:
    """polyprof's ``step`` calls the user's schedule, as torch's does: that frame stays."""

    def names_of(profiler: Any, action: Any, name: str) -> set[str]:
        def users_schedule(step: int) -> Any:
            return action

        small_workload()
        with profiler(
            activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True, schedule=users_schedule
        ) as p:
            for _ in range(3):
                small_workload()
                p.step()
        p.export_chrome_trace(str(tmp_path / f"{name}.json"))
        events = json.loads((tmp_path / f"{name}.json").read_text())["traceEvents"]
        return {e["name"].rsplit(": ", 1)[-1] for e in events if e.get("cat") == "python_function"}

    ours = names_of(polyprof.profile, polyprof.ProfilerAction.RECORD, "polyprof")
    theirs = names_of(torch.profiler.profile, torch.profiler.ProfilerAction.RECORD, "torch")
    assert "users_schedule" in theirs
    assert "users_schedule" in ours
