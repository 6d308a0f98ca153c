"""The recording-overhead benchmark's own arithmetic (benchmarks/bench_overhead.py) on synthetic numbers,
and its children run once at a tiny size. Nothing here is a timing assertion."""

from __future__ import annotations

import datetime
import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_overhead.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    # As when run as a script: the benchmarks' folder is on sys.path (child_workloads, bench_postprocessing).
    sys.path.insert(0, str(BENCH_PATH.parent))
    spec = importlib.util.spec_from_file_location("bench_overhead", BENCH_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def repetition(none: float, torch: float, polyprof: float, start: tuple[float, float] = (1e-3, 2e-3)) -> dict:
    """One repetition as a child prints it: loop times, and each profiler's create/start/stop."""
    timed = {"create_s": 1e-4, "stop_s": 0.01}
    return {  # CPU time: half the wall time (a shared machine), the profilers' added CPU time alike
        "order": ["none", "torch", "polyprof"],
        "none": {"loop_s": none, "loop_cpu_s": none / 2},
        "torch": {"loop_s": torch, "loop_cpu_s": torch / 2, "start_s": start[0], **timed},
        "polyprof": {"loop_s": polyprof, "loop_cpu_s": polyprof / 2, "start_s": start[1], **timed},
    }


def child(reps: list[dict], n: int = 1000) -> dict[str, Any]:
    return {"workload": "tiny", "n": n, "reps": reps, "settle_timeouts": 0}


def test_orders_put_each_condition_before_and_after_each_other_alike(bench: ModuleType) -> None:
    assert len(bench.ORDERS) == 6 and len(set(bench.ORDERS)) == 6
    before = {pair: 0 for pair in itertools.permutations(bench.CONDITIONS, 2)}
    for order in bench.ORDERS:
        for i, first in enumerate(order):
            for second in order[i + 1 :]:
                before[(first, second)] += 1
    assert set(before.values()) == {3}  # over six repetitions, every condition precedes every other 3 times


def test_added_times_pair_each_loop_with_its_repetitions_unprofiled_loop(bench: ModuleType) -> None:
    reps = [repetition(1.0, 1.2, 1.1), repetition(2.0, 2.1, 2.3)]
    assert bench.added_times(reps, "torch") == pytest.approx([0.2, 0.1])
    assert bench.added_times(reps, "polyprof") == pytest.approx([0.1, 0.3])
    assert bench.added_times(reps, "polyprof", "loop_cpu_s") == pytest.approx([0.05, 0.15])


def test_interquartile_range(bench: ModuleType) -> None:
    assert bench.interquartile_range([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0)
    assert bench.interquartile_range([7.0]) == 0.0


def test_summarise_pools_children_and_takes_ratios_of_medians(bench: ModuleType) -> None:
    # torch adds 0.10 s every time; polyprof 0.08 s, with one outlier repetition that the median ignores
    first = child([repetition(1.0, 1.1, 1.08), repetition(1.0, 1.1, 1.08)])
    second = child([repetition(2.0, 2.1, 2.08), repetition(2.0, 2.1, 5.0), repetition(1.0, 1.1, 1.08)])
    s = bench.summarise([first, second])
    assert s["repetitions"] == 5 and s["children"] == 2 and s["n"] == 1000
    assert s["unprofiled_loop_s"] == pytest.approx(1.0)
    assert s["torch"]["added_s"] == pytest.approx(0.1) and s["polyprof"]["added_s"] == pytest.approx(0.08)
    assert s["polyprof"]["added_per_step_us"] == pytest.approx(80.0)
    assert s["ratios"]["added"] == pytest.approx(0.8) and s["ratios"]["added_cpu"] == pytest.approx(0.8)
    assert s["polyprof"]["added_cpu_s"] == pytest.approx(0.04)
    assert s["ratios"]["start"] == pytest.approx(2.0)
    assert s["ratios"]["create_and_start"] == pytest.approx(2.1e-3 / 1.1e-3)
    assert s["ratios"]["stop"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        bench.summarise([child([])])


def test_a_profiler_that_adds_nothing_gives_no_ratio(bench: ModuleType) -> None:
    s = bench.summarise([child([repetition(1.0, 1.0, 1.05)])])
    assert math.isnan(s["ratios"]["added"])


def test_summarise_first_takes_medians_per_profiler(bench: ModuleType) -> None:
    firsts = [
        {"profiler": which, "import_s": i, "create_s": 0.0, "start_s": 2.0 * i, "stop_s": 0.1}
        for i in (1.0, 3.0, 2.0)
        for which in ("torch", "polyprof")
    ]
    first = bench.summarise_first(firsts)
    assert first["torch"]["import_s"] == 2.0 and first["polyprof"]["start_s"] == 4.0
    assert bench.summarise_first([]) == {}


def test_the_printout_and_the_json(bench: ModuleType, tmp_path: Path) -> None:
    summaries = {
        "tiny": bench.summarise([child([repetition(1.0, 1.1, 1.08)])]),
        "mlp": bench.summarise([child([repetition(1.0, 1.2, 1.1)], n=2000)]),
    }
    firsts = [
        {"profiler": w, "import_s": 0.1, "create_s": 1e-3, "start_s": 0.5, "stop_s": 0.01}
        for w in ("torch", "polyprof")
    ]
    lines = bench.format_summaries(summaries, bench.summarise_first(firsts))
    assert lines[0].split() == ["workload", "metric", "torch", "polyprof", "polyprof/torch"]
    assert any(
        line.startswith("tiny") and "added per loop (ms)" in line and "0.800" in line for line in lines
    )
    assert any(line.startswith("fresh") and "first profile: start (ms)" in line for line in lines)
    assert "RATIO tiny: added time polyprof/torch 0.800 (CPU time 0.800)" in "\n".join(lines)
    assert "RATIO mlp: added time polyprof/torch 0.500" in "\n".join(lines)
    result = bench.build_result(
        {"date": "2026-11-27"}, {"ops": 1}, {"tiny": [], "mlp": []}, summaries, firsts
    )
    assert result["schema"] == bench.RESULT_SCHEMA and set(result["first_profile"]) == {"torch", "polyprof"}
    json.loads(json.dumps(result))
    path = bench.default_json_path(datetime.date(2026, 11, 27))
    assert Path(path) == BENCH_PATH.parent / "results" / "overhead-2026-11-27.json"


@pytest.mark.slow
def test_the_children_run_both_profilers_at_a_tiny_size(bench: ModuleType) -> None:
    pytest.importorskip("torch")
    for workload in ("tiny", "mlp"):
        result = bench.run_child(workload, 20, 2, None)
        assert len(result["reps"]) == 2 and result["reps"][1]["order"] == list(bench.ORDERS[1])
        assert all(
            rep[c]["loop_s"] > 0 < rep[c]["loop_cpu_s"] for rep in result["reps"] for c in bench.CONDITIONS
        )
        assert bench.summarise([result])["polyprof"]["start_s"] > 0
    first = bench.run_first_child("polyprof", None)
    assert first["profiler"] == "polyprof" and first["start_s"] > 0 and first["import_s"] > 0
