"""``polyprof diff``: two runs compared per op, kernel, step and rank; its noise rule, gate and bad input.

Real traces are recorded by torch.profiler on the CPU in a fresh process (``record``); the rest are
small Kineto documents written here. The classification is checked as a rule (hypothesis: a run
against itself is unchanged, swapping the sides swaps added/removed and faster/slower), and the
counts and summed durations against HTA's ``TraceDiff.compare_traces`` on the same traces.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyprof.base.errors import EXIT_SLOWER, EXIT_USAGE
from polyprof.cli import main as cli_main
from polyprof.cli.cli_diff import parse_percent
from polyprof.ranks.diff import (
    ADDED,
    FASTER,
    REMOVED,
    SLOWER,
    UNCHANGED,
    DiffRule,
    GateError,
    Side,
    classify,
    compare_sides,
    diff_runs,
    gate,
    robust_spread,
    step_diff,
)
from polyprof.ranks.rank_analysis import RankKernel, RankOp, RankRows, RankStep

BASE_NS = 1_700_000_000_000_000_000

# ------------------------------------------------------------------ real traces

RECORD = r"""
import sys, torch
from torch.profiler import ProfilerActivity, profile, schedule

def record(path, size, matmuls, extra, active=6):
    x = torch.randn(size, size)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=active),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    ) as prof:
        for _ in range(active + 1):
            for _ in range(matmuls):
                y = torch.mm(x, x).relu()
            if extra:
                torch.sigmoid(y)
            prof.step()

folder = sys.argv[1]
torch.set_num_threads(1)
record(folder + "/same1.json", 128, 8, False)
record(folder + "/long.json", 128, 8, False, active=12)
record(folder + "/slow.json", 256, 16, True)
"""


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    """``same1.json``: six steps of a workload; ``long.json``: twelve steps of it; ``slow.json``: six
    steps with larger matmuls, twice as many, and an extra ``aten::sigmoid`` per step."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("diff")
    done = subprocess.run(
        [sys.executable, "-c", RECORD, str(folder)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def run_json(capsys: Any, *argv: str) -> tuple[int, dict[str, Any], str]:
    code = cli_main(["diff", *argv, "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out else {}), captured.err


def alternate_steps(doc: dict[str, Any], keep: int) -> dict[str, Any]:
    """``doc`` without the events of every other step: the steps in places ``keep``, ``keep + 2``, ...
    kept, the others' events (those starting inside them) dropped."""
    spans = sorted(
        (
            e
            for e in doc["traceEvents"]
            if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")
        ),
        key=lambda e: int(e["name"].split("#")[1]),
    )
    dropped = [(e["ts"], e["ts"] + e["dur"]) for i, e in enumerate(spans) if i % 2 != keep]

    def kept(event: dict[str, Any]) -> bool:
        ts = event.get("ts")
        return event.get("ph") == "M" or ts is None or not any(a <= float(ts) < b for a, b in dropped)

    return {**doc, "traceEvents": [e for e in doc["traceEvents"] if kept(e)]}


def test_the_same_workload_twice_is_unchanged_and_passes_the_gate(real: Path, tmp_path: Path, capsys) -> None:
    """Two profiles of one workload, its odd and its even steps of one recording: they ran under the
    same load. (Two recordings one after the other on a shared machine shift as a whole when another
    job takes the CPU for a moment; the rule rightly cannot tell that from a change of the code.)"""
    doc = json.loads((real / "long.json").read_text())
    sides = [write(tmp_path / f"half{keep}.json", alternate_steps(doc, keep)) for keep in (0, 1)]
    code, data, err = run_json(capsys, *sides, "--fail-if-slower", "5%", "--row-limit", "-1")
    assert code == 0, err
    assert data["steps"]["status"] == UNCHANGED and data["steps"]["baseline_steps"] == 6
    assert "gate passed: median step time" in err and data["gate"]["failed"] is False
    assert data["notes"] == [] and data["kernels"] == []
    ops = {r["name"]: r for r in data["ops"]}
    assert {"aten::mm", "aten::relu", "ProfilerStep*"} <= set(ops)
    assert all(r["status"] not in (ADDED, REMOVED) for r in ops.values())
    assert all(r["baseline_calls"] == r["candidate_calls"] for r in ops.values())
    assert ops["aten::mm"]["baseline_calls"] == 6 * 8


def test_a_slower_candidate_fails_the_gate_and_the_swap_is_faster(real: Path, capsys) -> None:
    code, data, err = run_json(capsys, str(real / "same1.json"), str(real / "slow.json"), "--fail-if-slower",
                               "5%", "--row-limit", "-1")  # fmt: skip
    assert code == EXIT_SLOWER
    assert "gate FAILED: median step time" in err and "slower by more than 5%" in err
    assert data["steps"]["status"] == SLOWER and data["steps"]["ratio"] > 1.05
    ops = {r["name"]: r for r in data["ops"]}
    assert ops["aten::sigmoid"]["status"] == ADDED and ops["aten::sigmoid"]["baseline_calls"] is None
    assert ops["aten::mm"]["status"] == SLOWER
    assert (ops["aten::mm"]["baseline_calls"], ops["aten::mm"]["candidate_calls"]) == (48, 96)
    code, swapped, err = run_json(capsys, str(real / "slow.json"), str(real / "same1.json"),
                                  "--fail-if-slower", "5%", "--row-limit", "-1")  # fmt: skip
    assert code == 0, err
    assert swapped["steps"]["status"] == FASTER
    back = {r["name"]: r for r in swapped["ops"]}
    assert back["aten::sigmoid"]["status"] == REMOVED and back["aten::mm"]["status"] == FASTER


def test_the_gate_on_named_ops(real: Path, capsys) -> None:
    same = [str(real / "same1.json"), str(real / "slow.json")]
    assert cli_main(["diff", *same, "--fail-if-slower", "5%", "--only", "aten::mm"]) == EXIT_SLOWER
    captured = capsys.readouterr()
    assert "gate FAILED: op aten::mm:" in captured.err
    assert "aten::relu" not in captured.out  # --only limits the tables too
    assert cli_main(["diff", *same, "--fail-if-slower", "5%", "--only", "aten::sigmoid"]) == EXIT_SLOWER
    assert "new in the candidate" in capsys.readouterr().err
    swapped = same[::-1]
    assert cli_main(["diff", *swapped, "--fail-if-slower", "5%", "--only", "aten::mm"]) == 0
    capsys.readouterr()
    assert cli_main(["diff", *same, "--fail-if-slower", "5%", "--only", "aten::nope"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == "polyprof diff: error: --only names no op or kernel of either side: aten::nope\n"


def test_text_output_sorts_and_limits(real: Path, capsys) -> None:
    args = [str(real / "same1.json"), str(real / "slow.json")]
    assert cli_main(["diff", *args, "--sort-by", "name", "--row-limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "Median step time (ProfilerStep#N):" in out and "all ranks  slower" in out
    assert "Ops (CPU), self time per step (over 6 and 6 steps), by name (2 of 6):" in out
    table = out.split("by name (2 of 6)")[1].splitlines()
    names = [line.split()[0] for line in table[4:6]]
    assert names == sorted(names) == ["ProfilerStep*", "aten::clamp_min"]


def test_parquet_and_directories_are_sides_too(real: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "base").mkdir()
    assert cli_main(["convert", str(real / "same1.json"), str(tmp_path / "base" / "r0.parquet")]) == 0
    capsys.readouterr()
    code, data, err = run_json(capsys, str(tmp_path / "base"), str(real / "same1.json"))
    assert code == 0, err
    assert all(r["status"] == UNCHANGED and r["change_us"] == 0 for r in data["ops"])
    assert data["steps"]["change_us"] == 0 and data["steps"]["status"] == UNCHANGED


def test_counts_and_durations_are_htas(real: Path, tmp_path: Path, monkeypatch) -> None:
    trace_diff = pytest.importorskip("hta.trace_diff")
    # HTA rounds each event's start up and end down to whole microseconds unless told not to
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    sides = []
    for name in ("same1", "slow"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / f"{name}.json").write_bytes((real / f"{name}.json").read_bytes())
        sides.append(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        control = trace_diff.LabeledTrace(label="control", trace_dir=str(sides[0]))
        test = trace_diff.LabeledTrace(label="test", trace_dir=str(sides[1]))
        theirs = trace_diff.TraceDiff.compare_traces(
            control, test, control_iteration=control.iterations(), test_iteration=test.iterations()
        )
    ours = diff_runs([str(sides[0])], [str(sides[1])])
    rows = {r.name: r for r in ours.ops}
    # HTA keeps ProfilerStep#N apart; torch's table (and polyprof's) folds them into ProfilerStep*
    theirs = theirs.rename(index=lambda n: "ProfilerStep*" if n.startswith("ProfilerStep#") else n)
    theirs = theirs.groupby(level=0).sum()
    assert set(theirs.index) == set(rows)
    assert ours.per_step and ours.steps is not None  # times per step: the traces' totals over the steps
    steps = {"baseline": ours.steps.baseline_steps, "candidate": ours.steps.candidate_steps}
    for name, row in theirs.iterrows():
        mine = rows[name]
        for side, prefix in (("baseline", "control"), ("candidate", "test")):
            calls = getattr(mine, f"{side}_calls") or 0
            total = (getattr(mine, f"{side}_total_us") or 0.0) * steps[side]
            assert calls == row[f"{prefix}_counts"], (name, side)
            assert math.isclose(total, row[f"{prefix}_total_duration"], abs_tol=1e-6 * (calls + 1)), (
                name,
                side,
            )


# ------------------------------------------------------------------ small documents


def kineto(rank: int | None, world_size: int, step_us: list[float], *, kernels: bool = False,
           op: str = "aten::add") -> dict[str, Any]:  # fmt: skip
    """A trace of ProfilerStep#N annotations each holding one ``op`` of half its time (and a kernel)."""
    events: list[dict[str, Any]] = []
    ts = 0.0
    for n, duration in enumerate(step_us, start=1):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                       "ts": ts, "dur": duration})  # fmt: skip
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": ts + 1,
                       "dur": duration / 2})  # fmt: skip
        if kernels:
            events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts + 2,
                           "dur": duration / 4, "args": {"device": 0, "stream": 7}})  # fmt: skip
        ts += duration + 10
    doc: dict[str, Any] = {"baseTimeNanoseconds": BASE_NS, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": world_size}
    return doc


def write(path: Path, doc: dict[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return str(path)


def test_cpu_only_against_kernels_compares_the_ops_only(tmp_path: Path, capsys) -> None:
    base = write(tmp_path / "cpu.json", kineto(None, 1, [1000.0] * 4))
    cand = write(tmp_path / "gpu.json", kineto(None, 1, [1000.0] * 4, kernels=True))
    code, data, err = run_json(capsys, base, cand)
    assert (code, err) == (0, "")
    assert data["kernels"] == [] and [r["name"] for r in data["ops"]] == ["ProfilerStep*", "aten::add"]
    assert data["notes"] == [
        (
            "kernels: the candidate has device activity (GPU kernels, memcpy, memset), the baseline has "
            "none (a CPU-only profile?); only CPU ops are compared"
        )
    ]
    # a kernel named for the gate is in the candidate: the gate says why it cannot judge it
    assert cli_main(["diff", base, cand, "--fail-if-slower", "5%", "--only", "gemm"]) == EXIT_USAGE
    assert "kernels were not compared: the candidate has device activity" in capsys.readouterr().err
    code, data, _ = run_json(capsys, cand, cand)
    assert [(r["name"], r["category"], r["status"]) for r in data["kernels"]] == [
        ("gemm", "kernel", UNCHANGED)
    ]


def test_different_world_sizes_compare_the_common_ranks(tmp_path: Path, capsys) -> None:
    for rank in range(2):
        write(tmp_path / "two" / f"r{rank}.json", kineto(rank, 2, [1000.0, 1010.0, 990.0]))
    for rank in range(4):
        write(tmp_path / "four" / f"r{rank}.json", kineto(rank, 4, [1500.0 if rank == 1 else 1000.0] * 3))
    code, data, err = run_json(capsys, str(tmp_path / "two"), str(tmp_path / "four"))
    assert code == 0, err
    assert data["ranks_compared"] == [0, 1]
    assert data["notes"] == ["ranks 2, 3 of the candidate (4 ranks; the baseline has 2) not compared"]
    per_rank = {s["rank"]: s["status"] for s in data["rank_steps"]}
    assert per_rank == {0: UNCHANGED, 1: SLOWER}
    # a step of the run lasts as long as its slowest rank: rank 1's 1.5 ms
    assert (data["steps"]["status"], data["steps"]["candidate_median_us"]) == (SLOWER, 1500.0)
    assert (data["steps"]["baseline_median_us"], data["steps"]["baseline_steps"]) == (1000.0, 3)
    add = next(r for r in data["ops"] if r["name"] == "aten::add")
    assert (add["baseline_calls"], add["candidate_calls"]) == (6, 6)  # ranks 2 and 3 left out


def test_a_side_without_steps(tmp_path: Path, capsys) -> None:
    base = write(tmp_path / "b.json", kineto(None, 1, [1000.0] * 3))
    doc = kineto(None, 1, [1000.0] * 3)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    cand = write(tmp_path / "c.json", doc)
    code, data, _ = run_json(capsys, base, cand)
    assert code == 0 and data["steps"] is None
    assert data["notes"][0].startswith("the candidate has no steps (ProfilerStep#N): step times not compared")
    assert cli_main(["diff", base, cand, "--fail-if-slower", "5%"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "a side has no ProfilerStep#N steps: name ops or kernels to judge with --only NAME" in err
    assert "Traceback" not in err
    assert cli_main(["diff", base, cand, "--fail-if-slower", "5%", "--only", "aten::add"]) == 0


def test_a_corrupt_or_empty_file_among_good_ones_is_named_and_left_out(tmp_path: Path, capsys) -> None:
    for rank in range(2):
        write(tmp_path / "base" / f"r{rank}.json", kineto(rank, 2, [1000.0] * 3))
        write(tmp_path / "cand" / f"r{rank}.json", kineto(rank, 2, [1000.0] * 3))
    (tmp_path / "cand" / "r1.json").write_text('{"traceEvents": [')
    (tmp_path / "cand" / "r2.json").write_text("")
    code, data, err = run_json(capsys, str(tmp_path / "base"), str(tmp_path / "cand"))
    assert code == 0
    assert "polyprof diff (candidate): skipped " in err and "r1.json" in err and "r2.json" in err
    assert "Traceback" not in err
    assert [s["path"].rsplit("/", 1)[1] for s in data["candidate"]["skipped"]] == ["r1.json", "r2.json"]
    assert data["ranks_compared"] == [0] and "rank 1 of the baseline" in data["notes"][0]


@pytest.mark.parametrize("content", ["", "not json", '{"traceEvents": []}'])
def test_a_side_with_nothing_readable_is_one_line(tmp_path: Path, capsys, content: str) -> None:
    good = write(tmp_path / "good.json", kineto(None, 1, [1000.0] * 3))
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert cli_main(["diff", good, str(bad)]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("polyprof diff: error: ")
    assert captured.err.count("\n") == 1 and "bad.json" in captured.err


@pytest.mark.parametrize("value", ["0.05", "5", "-5%", "five%", "%"])
def test_a_bad_percentage_is_a_usage_error_naming_the_form(tmp_path: Path, capsys, value: str) -> None:
    good = write(tmp_path / "good.json", kineto(None, 1, [1000.0] * 3))
    assert cli_main(["diff", good, good, "--fail-if-slower", value]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "argument --fail-if-slower" in err and "e.g. 5%" in err


def test_help_names_the_options_and_exit_statuses(capsys) -> None:
    assert cli_main(["diff", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--fail-if-slower PCT" in out and "(default 5%)" in out and "e.g. 5%" in out
    assert f"{EXIT_SLOWER} when --fail-if-slower finds the candidate slower" in " ".join(out.split())


def test_percentages() -> None:
    assert parse_percent("5%") == 0.05 and parse_percent(" 2.5 % ") == 0.025 and parse_percent(".5%") == 0.005


# ------------------------------------------------------------------ the rule


def test_classify_by_threshold_and_noise() -> None:
    assert classify(None, 5.0, threshold=0.05, noise_us=0) == ADDED
    assert classify(5.0, None, threshold=0.05, noise_us=0) == REMOVED
    assert classify(100.0, 105.0, threshold=0.05, noise_us=0) == UNCHANGED  # exactly 5%: not past it
    assert classify(100.0, 106.0, threshold=0.05, noise_us=0) == SLOWER
    assert classify(106.0, 100.0, threshold=0.05, noise_us=0) == FASTER
    assert classify(100.0, 150.0, threshold=0.05, noise_us=50.0) == UNCHANGED  # within the noise
    assert classify(100.0, 150.1, threshold=0.05, noise_us=50.0) == SLOWER


def test_a_change_within_the_spread_of_steps_is_noise() -> None:
    rule = DiffRule()
    noisy_b = [100.0, 90.0, 110.0, 95.0, 105.0, 100.0]
    noisy_c = [v * 1.08 for v in noisy_b]  # 8% slower, but the steps spread over +-10%
    assert step_diff(None, noisy_b, noisy_c, rule).status == UNCHANGED
    steady_b = [100.0, 100.5, 99.5, 100.0, 100.2, 99.8]
    steady_c = [v * 1.08 for v in steady_b]
    assert step_diff(None, steady_b, steady_c, rule).status == SLOWER
    assert robust_spread([1.0]) == 0.0
    assert robust_spread([1.0, 2.0, 3.0]) == pytest.approx(1.4826)


def side(label: str, ops: dict[str, float], steps: list[float], kernels: dict[str, float]) -> Side:
    rows = RankRows(
        ops=tuple(RankOp(0, name, 3, us, us * 2) for name, us in sorted(ops.items())),
        kernels=tuple(RankKernel(0, name, "kernel", 2, us) for name, us in sorted(kernels.items())),
        steps=tuple(RankStep(0, n, us) for n, us in enumerate(steps, start=1)),
    )
    return Side(label=label, paths=(label,), ranks=(0,), events=1, skipped=(), rows=rows)


times = st.floats(min_value=0.0, max_value=1e7, allow_nan=False)
names = st.sampled_from(["aten::mm", "aten::add", "aten::relu", "aten::copy_", "sgemm"])
sides = st.tuples(
    st.dictionaries(names, times, max_size=5),
    st.lists(st.floats(min_value=1.0, max_value=1e6), max_size=8),
    st.dictionaries(names, times, max_size=3),
)
rules = st.builds(
    DiffRule, threshold=st.floats(0, 1), noise_factor=st.floats(0, 5), min_time_us=st.floats(0, 100)
)


@settings(max_examples=200, deadline=None)
@given(sides, rules)
def test_a_run_against_itself_is_unchanged(a: tuple[Any, ...], rule: DiffRule) -> None:
    diff = compare_sides(side("baseline", *a), side("candidate", *a), rule)
    assert all(r.status == UNCHANGED and r.change_us == 0 for r in diff.rows())
    assert diff.steps is None or diff.steps.status == UNCHANGED
    if diff.steps is not None:
        assert gate(diff, 0.0).failed is False


_SWAPPED = {ADDED: REMOVED, REMOVED: ADDED, SLOWER: FASTER, FASTER: SLOWER, UNCHANGED: UNCHANGED}


@settings(max_examples=200, deadline=None)
@given(sides, sides, rules)
def test_swapping_the_sides_swaps_the_verdicts(
    a: tuple[Any, ...], b: tuple[Any, ...], rule: DiffRule
) -> None:
    forward = compare_sides(side("baseline", *a), side("candidate", *b), rule)
    backward = compare_sides(side("baseline", *b), side("candidate", *a), rule)
    back = {(r.kind, r.name): r.status for r in backward.rows()}
    assert {(r.kind, r.name): _SWAPPED[r.status] for r in forward.rows()} == back
    assert (forward.steps is None) == (backward.steps is None)
    if forward.steps is not None and backward.steps is not None:
        assert _SWAPPED[forward.steps.status] == backward.steps.status


def test_the_gate_needs_steps_or_names() -> None:
    diff = compare_sides(
        side("baseline", {"a": 10.0}, [], {}), side("candidate", {"a": 10.0}, [], {}), DiffRule()
    )
    with pytest.raises(GateError, match="a side has no ProfilerStep#N steps"):
        gate(diff, 0.05)
    with pytest.raises(GateError, match="names no op or kernel of either side: b"):
        gate(diff, 0.05, ["b"])
    assert gate(diff, 0.05, ["a"]).failed is False


def test_the_gate_fails_past_the_limit_and_the_noise_only() -> None:
    steady = [1000.0, 1001.0, 999.0, 1000.0]
    for factor, limit, failed in ((1.04, 0.05, False), (1.06, 0.05, True), (1.06, 0.10, False)):
        slower = [v * factor for v in steady]
        diff = compare_sides(side("baseline", {}, steady, {}), side("candidate", {}, slower, {}), DiffRule())
        assert gate(diff, limit).failed is failed, (factor, limit)
    noisy = [1000.0, 800.0, 1200.0, 900.0, 1100.0]
    diff = compare_sides(side("baseline", {}, noisy, {}), side("candidate", {}, [v * 1.2 for v in noisy], {}),
                         DiffRule())  # fmt: skip
    assert gate(diff, 0.05).failed is False and "within 5% or the noise" in gate(diff, 0.05).reasons[0]


# ------------------------------------------------------------------ found in review


def test_a_reader_that_leaves_early_does_not_turn_a_failed_gate_into_a_pass(tmp_path: Path) -> None:
    """``polyprof diff ... --fail-if-slower 5% | head -1`` in CI: the status is the gate's."""
    base = write(tmp_path / "b.json", kineto(None, 1, [1000.0, 1001.0, 999.0, 1000.0]))
    cand = write(tmp_path / "c.json", kineto(None, 1, [1300.0, 1301.0, 1299.0, 1300.0]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "polyprof", "diff", base, cand, "--fail-if-slower", "5%", "--row-limit", "-1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line: every write to stdout fails
    proc.stderr.close()
    assert proc.wait(timeout=120) == EXIT_SLOWER


def test_op_times_are_per_step_so_a_longer_recording_is_no_change(tmp_path: Path, capsys) -> None:
    """The same code, 3 steps against 6: the traces' totals double, the times per step do not."""
    base = write(tmp_path / "short.json", kineto(None, 1, [1000.0] * 3))
    cand = write(tmp_path / "long.json", kineto(None, 1, [1000.0] * 6))
    code, data, err = run_json(capsys, base, cand, "--fail-if-slower", "5%", "--only", "aten::add")
    assert code == 0, err
    add = next(r for r in data["ops"] if r["name"] == "aten::add")
    assert (add["baseline_us"], add["candidate_us"], add["status"]) == (500.0, 500.0, UNCHANGED)
    assert (add["baseline_calls"], add["candidate_calls"]) == (3, 6)
    assert cli_main(["diff", base, cand]) == 0
    assert "Ops (CPU), self time per step (over 3 and 6 steps)" in capsys.readouterr().out


def test_a_regression_larger_than_the_noise_of_a_median_fails_the_gate() -> None:
    """Steps that jitter +-10% hide no 25% regression: the noise is the error of the medians' difference."""
    jitter = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.08, 0.92, 1.02, 0.98]
    base = [1000.0 * j for j in jitter]
    diff = compare_sides(
        side("baseline", {}, base, {}), side("candidate", {}, [v * 1.25 for v in base], {}), DiffRule()
    )
    assert diff.steps is not None and diff.steps.status == SLOWER
    assert gate(diff, 0.05).failed is True
    faster = compare_sides(
        side("baseline", {}, [v * 1.25 for v in base], {}), side("candidate", {}, base, {}), DiffRule()
    )
    assert gate(faster, 0.05).reasons[0].endswith(": not slower")


def test_an_added_op_fails_the_gate_only_past_the_time_floor() -> None:
    steps = [1000.0, 1000.0]
    tiny = compare_sides(
        side("baseline", {}, steps, {}), side("candidate", {"aten::tiny": 10.0}, steps, {}), DiffRule()
    )
    verdict = gate(tiny, 0.05, ["aten::tiny"])
    assert verdict.failed is False and "new in the candidate, within" in verdict.reasons[0]
    large = compare_sides(
        side("baseline", {}, steps, {}), side("candidate", {"aten::big": 500.0}, steps, {}), DiffRule()
    )
    assert gate(large, 0.05, ["aten::big"]).failed is True


def test_the_same_traces_on_both_sides_and_an_unknown_only_name_are_said(tmp_path: Path, capsys) -> None:
    trace = write(tmp_path / "t.json", kineto(None, 1, [1000.0] * 3))
    code, data, _ = run_json(capsys, trace, trace, "--only", "aten::nope")
    assert code == 0
    assert data["notes"] == [
        "the baseline and the candidate are the same traces: every row compares with itself",
        "--only names no op or kernel of either side: aten::nope",
    ]


def test_traces_without_ranks_in_a_directory_are_said_to_be_numbered_by_file(tmp_path: Path, capsys) -> None:
    """Two cycles of one recording (a repeating schedule) in one folder look like two ranks: say so."""
    for cycle in range(2):
        write(tmp_path / "base" / f"cycle{cycle}.json", kineto(None, 1, [1000.0] * 3))
    single = write(tmp_path / "one.json", kineto(None, 1, [1000.0] * 3))
    code, data, _ = run_json(capsys, str(tmp_path / "base"), single)
    assert code == 0
    assert data["notes"][0] == (
        "the baseline's 2 traces carry no rank (distributedInfo): read as ranks 0, 1 in file name "
        "order; if they are cycles of one recording (a repeating schedule), compare one trace a side"
    )
    code, data, _ = run_json(capsys, single, single)
    assert not any("carry no rank" in note for note in data["notes"])  # one trace: nothing to say
