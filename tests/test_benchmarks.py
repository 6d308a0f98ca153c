"""The post-processing benchmark's own arithmetic (fit, targets, JSON shape) on synthetic numbers.

The benchmark measures nothing here: these check that the harness reads its children's numbers right.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_postprocessing.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    # As when run as a script: the benchmarks' folder is on sys.path (for child_workloads).
    sys.path.insert(0, str(BENCH_PATH.parent))
    spec = importlib.util.spec_from_file_location("bench_postprocessing", BENCH_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child_run(
    n: int,
    *,
    disable_per_event: float,
    own_per_event: float,
    export_per_event: float,
    rss_mb: float,
    overhead: float = 1.3,
    warm: bool = True,
) -> dict[str, float]:
    """What one benchmark child prints, for ``n`` events at the given per-event costs."""
    disable = disable_per_event * n
    run = {
        "unprofiled_s": 1e-6 * n,
        "profiled_loop_s": overhead * 1e-6 * n,
        "disable_s": disable,
        "exit_s": disable + own_per_event * n / 2,
        "table_s": own_per_event * n / 2,
        "exit_to_table_s": disable + own_per_event * n,
        "export_fresh_s": export_per_event * n,
        "trace_bytes": 250.0 * n,
        "peak_rss_after_table_mb": rss_mb,
        "peak_rss_mb": rss_mb,
    }
    if warm:
        run["export_warm_s"] = export_per_event * n / 2
    return run


def synthetic_summaries(bench: ModuleType, sizes: list[int]) -> dict[str, dict[Any, dict[str, float]]]:
    # polyprof: own part 20% of torch's disable, export 1.5x torch's fresh and 0.75x warm, RSS 45%.
    torch_runs = {
        n: [
            child_run(
                n,
                disable_per_event=4e-6,
                own_per_event=5e-5,
                export_per_event=2e-6,
                rss_mb=1e-3 * n + 300,
                warm=False,
            )
        ]
        for n in sizes
    }
    poly_runs = {
        n: [
            child_run(
                n,
                disable_per_event=4e-6,
                own_per_event=0.8e-6,
                export_per_event=3e-6,
                rss_mb=0.45 * (1e-3 * n + 300),
            )
        ]
        for n in sizes
    }
    return {
        "torch": {n: bench.summarise(r) for n, r in torch_runs.items()},
        "polyprof": {n: bench.summarise(r) for n, r in poly_runs.items()},
    }


def test_fit_linear_recovers_a_line_with_zero_residuals(bench: ModuleType) -> None:
    sizes = [10_000, 50_000, 200_000, 1_000_000]
    fit = bench.fit_linear(sizes, [0.05 + 3e-6 * n for n in sizes])
    assert fit["slope_s_per_million"] == pytest.approx(3.0)
    assert fit["intercept_s"] == pytest.approx(0.05)
    assert all(abs(r) < 1e-9 for r in fit["relative_residuals"])
    assert 0.5 < fit["log_log_slope"] < 1.0  # the fixed cost bends the small sizes


def test_fit_linear_log_slope_shows_quadratic_growth(bench: ModuleType) -> None:
    sizes = [10_000, 50_000, 200_000, 1_000_000]
    fit = bench.fit_linear(sizes, [1e-11 * n * n for n in sizes])
    assert fit["log_log_slope"] == pytest.approx(2.0)
    assert max(abs(r) for r in fit["relative_residuals"]) > 0.2


def test_fit_linear_rejects_too_few_sizes(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="two distinct sizes"):
        bench.fit_linear([10, 10], [1.0, 2.0])
    with pytest.raises(ValueError, match="2 sizes but 1 times"):
        bench.fit_linear([10, 20], [1.0])


def test_summarise_takes_medians_and_derives_own_part(bench: ModuleType) -> None:
    runs = [
        child_run(1000, disable_per_event=1e-6, own_per_event=k * 1e-6, export_per_event=1e-6, rss_mb=k)
        for k in (1, 5, 3)
    ]
    summary = bench.summarise(runs)
    assert summary["after_disable_s"] == pytest.approx(3e-3)
    assert summary["peak_rss_mb"] == 3
    assert summary["loop_overhead"] == pytest.approx(1.3)
    torch_summary = bench.summarise(
        [
            child_run(
                1000, disable_per_event=1e-6, own_per_event=1e-6, export_per_event=1e-6, rss_mb=1, warm=False
            )
        ]
    )
    assert "export_warm_s" not in torch_summary


def test_targets_read_the_ratios_issue_12_names(bench: ModuleType) -> None:
    sizes = [10_000, 200_000, 1_000_000]
    summaries = synthetic_summaries(bench, sizes)
    targets = bench.evaluate_targets(summaries, bench.fit_series(summaries))
    by_key = {(t["target"], t["size"]): t for t in targets}

    own = by_key[("polyprof's own exit-to-table <= 30% of torch's _disable_profiler()", 200_000)]
    assert own["ratio"] == pytest.approx(0.2)
    assert own["met"] is True
    fresh = by_key[("export (fresh) <= torch", 1_000_000)]
    assert fresh["ratio"] == pytest.approx(1.5)
    assert fresh["met"] is False
    assert by_key[("export (warm) <= torch", 1_000_000)]["ratio"] == pytest.approx(0.75)
    assert by_key[("peak RSS <= 50% of torch's", 200_000)]["met"] is True
    assert by_key[("peak RSS <= 40% of torch's", 1_000_000)]["met"] is False
    assert not any(t["target"].startswith("peak RSS") and t["size"] == 10_000 for t in targets)
    assert by_key[("loop overhead <= torch's (5% noise band)", 10_000)]["ratio"] == pytest.approx(1.0)
    linear = by_key[("polyprof export (fresh) linear in events (log-log slope <= 1.1)", "10000-1000000")]
    assert linear["ratio"] == pytest.approx(1.0)
    assert linear["met"] is True
    # torch's own exit is not a polyprof target.
    assert not any(t["target"].startswith("torch") for t in targets)


def test_sizes_torch_skipped_get_no_ratio_targets(bench: ModuleType) -> None:
    summaries = synthetic_summaries(bench, [10_000, 200_000])
    summaries["polyprof"][10_000_000] = summaries["polyprof"][200_000]
    targets = bench.evaluate_targets(summaries, {})
    assert {t["size"] for t in targets} == {10_000, 200_000}


def test_result_is_json_with_string_sizes_and_pass_fail_lines(bench: ModuleType) -> None:
    sizes = [10_000, 200_000]
    summaries = synthetic_summaries(bench, sizes)
    fits = bench.fit_series(summaries)
    targets = bench.evaluate_targets(summaries, fits)
    runs = {"torch": {"convnet": [{"export_fresh_s": 0.1}]}, "polyprof": {}}
    result = json.loads(json.dumps(bench.build_result({"commit": "abc"}, runs, summaries, fits, targets)))
    assert result["schema"] == bench.RESULT_SCHEMA
    assert set(result) == {"schema", "meta", "runs", "medians", "fits", "targets", "where_the_time_goes"}
    assert set(result["medians"]["polyprof"]) == {"10000", "200000"}
    assert result["runs"]["torch"]["convnet"] == [{"export_fresh_s": 0.1}]
    for target in result["targets"]:
        assert set(target) == {"target", "size", "ratio", "limit", "met", "detail"}
        assert isinstance(target["met"], bool) and math.isfinite(target["ratio"])
    lines = bench.format_targets(targets)
    assert len(lines) == len(targets)
    assert all(line.startswith(("PASS  ", "FAIL  ")) for line in lines)
    assert any(line.startswith("FAIL  export (fresh) <= torch at 200000: 1.500") for line in lines)


def test_parse_sizes_accepts_suffixes_and_names_bad_input(bench: ModuleType) -> None:
    assert bench.parse_sizes("1M, 10k,50000,10k") == [10_000, 50_000, 1_000_000]
    with pytest.raises(argparse.ArgumentTypeError, match=r"'ten' is not a number of events \(valid"):
        bench.parse_sizes("10k,ten")
    with pytest.raises(argparse.ArgumentTypeError, match="must be positive"):
        bench.parse_sizes("0")


def test_where_groups_cprofile_rows_by_thread_and_phase(bench: ModuleType) -> None:
    rows = [
        {"profile": p, "function": f, "calls": 1, "tottime_s": c, "cumtime_s": c}
        for p, f, c in (
            ("thread polyprof-bus", "decode", 0.4),
            ("thread polyprof-bus", "_pull", 0.5),
            ("main thread, exit_to_table", "table", 0.1),
        )
    ]
    grouped = bench.summarise_where(rows, per_profile=1)
    assert grouped == {"thread polyprof-bus": [rows[1]], "main thread, exit_to_table": [rows[2]]}


def test_snapshot_source_extracts_a_commit_and_names_a_bad_one(bench: ModuleType, tmp_path: Path) -> None:
    if not (BENCH_PATH.parent.parent / ".git").exists():
        pytest.skip("not a git checkout")
    full = bench.snapshot_source("HEAD", str(tmp_path))
    assert len(full) == 40
    assert (tmp_path / "core" / "polyprof" / "__init__.py").is_file()
    assert (tmp_path / "plugins" / "polyprof_builtins" / "key_averages.py").is_file()
    with pytest.raises(SystemExit, match="'no-such-commit' is not a commit of this repository"):
        bench.snapshot_source("no-such-commit", str(tmp_path / "other"))


def test_fit_residuals_stay_relative_at_small_sizes(bench: ModuleType) -> None:
    # A run's medians (polyprof warm export, 10k to 1M): an unweighted line would miss 10k by 27x.
    fit = bench.fit_linear([10_000, 50_000, 200_000, 1_000_000], [0.015, 0.072, 0.293, 1.666])
    assert max(abs(r) for r in fit["relative_residuals"]) < 0.15
    with pytest.raises(ValueError, match="must be positive"):
        bench.fit_linear([10, 20], [0.0, 1.0])


def test_from_json_reads_back_what_build_result_wrote(bench: ModuleType, tmp_path: Path) -> None:
    runs = {
        "torch": {10_000: [{"export_fresh_s": 0.1}], "convnet": [{"export_fresh_s": 0.2}]},
        "polyprof": {10_000: [{"export_fresh_s": 0.3}]},
    }
    path = tmp_path / "result.json"
    path.write_text(json.dumps(bench.build_result({"commit": "abc"}, runs, {}, {}, [], {"size": 1})))
    assert bench.read_result(str(path)) == ({"commit": "abc"}, runs, {"size": 1})
    path.write_text(json.dumps({"schema": "something else"}))
    with pytest.raises(SystemExit, match="is not a polyprof-bench-postprocessing/2 result"):
        bench.read_result(str(path))
