"""polyprof-cuda against torch.profiler on a real NVIDIA GPU (skipped without one).

polyprof-cuda records CUDA through torch's own collector (Kineto mode,
docs/cuda.md), so on the same workload the two must agree. For each
workload (gpu_child.py: eager forward and backward with an optimizer step;
``.item()`` syncs with host-to-device copies; a CUDA graph replay; a
torch.compile'd function with Triton kernels; two streams) one child process
runs torch.profiler, another polyprof, and a third torch.profiler again
(no overhead loops; ``POLYPROF_GPU_TORCH_AGAIN=0`` leaves it out), each with
``activities=[CPU, CUDA]``, and the tests check:

* the device rows (kernels, copies, fills: ``events()`` and ``key_averages()``
  rows with device type CUDA) have the same names and counts, in every
  recording, and the Chrome traces the same rows per stream;
* the same recording read both ways: in the torch.profiler child, polyprof
  reads torch's own raw result of each recording (``gpu_compare.polyprof_reading``);
  its device rows, counts and the Self CUDA of every key, the GPU spans of
  ``record_function`` ranges included, must equal torch's reading of it (float
  summation order aside), and its Chrome trace must have exactly the ``ac2g``
  flow events torch's trace of it has. A difference here is attribution,
  never timing;
* per-key Self CUDA of polyprof's own recordings (the median of 3) against
  torch's, for the ops, the device rows and the range spans alike, within
  2 x torch's own spread of that quantity, measured from its two children
  (process to process) and its recordings (``gpu_compare.self_device_report``;
  never tighter than 2%, or 10% for keys under 0.5% of the device time, and
  never looser than 25% for the others);
* every launch has its ``ac2g`` arrow in polyprof's trace as in torch's (per
  call and device row names);
* the aten ops' counts match (the CPU side of the same collector);
* Holistic Trace Analysis loads polyprof's trace, and its kernel, temporal
  and idle-time breakdowns see the GPU work (skipped without ``hta``);
* overhead: the time each profiler adds to a loop of steps (profiled loop
  minus the unprofiled loop of the same repetition, in the same child; the
  median over the repetitions): polyprof's at most 1.1 x torch's, plus the
  noise of that comparison, taken from torch's own repetitions (two standard
  errors of the difference of the two medians, the spread of a repetition
  estimated from torch's median absolute deviation:
  ``gpu_compare.added_time_limit``); each profiler's start() and stop()
  after the first in its process are recorded beside it;
* torch.profiler and polyprof one after the other in one process record the
  same rows (they no longer compete for CUPTI).

The numbers go to the results file as JSON lines (conftest.py). Run it on a
GPU machine with scripts/gpu_check.sh; test_gpu_helpers.py checks its
plumbing on the CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_child import WORKLOADS  # noqa: E402
from gpu_compare import (  # noqa: E402
    ADDED_TIME_FACTOR,
    NOISE_STANDARD_ERRORS,
    PROFILERS,
    SPREAD_CEILING,
    SPREAD_FACTOR,
    TORCH_AGAIN,
    child_size_args,
    counter_mismatches,
    env_float,
    env_int,
    profiler_warnings,
    stream_signature,
    summarize_comparison,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU that torch can use (CUDA)"),
]


def child_timeout() -> float:
    return env_float("POLYPROF_GPU_CHILD_TIMEOUT_S", 600.0)


def child_order(workload: str, again: bool) -> list[str]:
    """The children of a workload, in order: polyprof between torch.profiler's two when there are
    two (drift over the run then counts in torch's own spread), the first alternating by workload."""
    if not again:
        return list(PROFILERS if WORKLOADS.index(workload) % 2 == 0 else PROFILERS[::-1])
    return (
        ["torch", "polyprof", TORCH_AGAIN]
        if WORKLOADS.index(workload) % 2 == 0
        else [TORCH_AGAIN, "polyprof", "torch"]
    )


@pytest.fixture(scope="module", params=WORKLOADS)
def compared(request: pytest.FixtureRequest, child, trace_root, record_result) -> dict[str, Any]:
    """The profilers on one workload, each in its own child (``child_order``)."""
    workload = request.param
    out = trace_root / workload
    runs: dict[str, dict[str, Any]] = {}
    for which in child_order(workload, again=env_int("POLYPROF_GPU_TORCH_AGAIN", 1) != 0):
        profiler, extra = which, []
        if which == TORCH_AGAIN:
            # torch's spread from one process to the next: its recordings only, traces apart
            profiler, extra = "torch", ["--no-overhead", "--no-reading"]
        where = out / "again" if which == TORCH_AGAIN else out
        args = [
            "run",
            "--profiler",
            profiler,
            "--workload",
            workload,
            "--out",
            str(where),
            *child_size_args(),
        ]
        result = child([*args, *extra], timeout=child_timeout())
        if "skip" in result:
            record_result({"record": "workload", "workload": workload, "skipped": result["skip"]})
            pytest.skip(f"{workload}: {result['skip']}")
        runs[which] = result
    summary = summarize_comparison(workload, runs)
    record_result(summary)
    return {"workload": workload, "runs": runs, "summary": summary, "out": out}


def test_the_workload_does_what_it_should_under_torch(compared):
    """The workload exercises what it is there for (checked on torch.profiler's side)."""
    runs, workload = compared["runs"], compared["workload"]
    rows = runs["torch"]["summaries"][-1]["device_rows"]
    assert rows, f"torch.profiler recorded no CUDA rows for {workload}"
    names = list(rows)
    if workload == "compiled" and not any("triton" in n for n in names):
        pytest.skip(f"Inductor emitted no Triton kernel here (torch's CUDA rows: {names[:10]})")
    if workload == "item_sync":
        assert any(n.startswith("Memcpy DtoH") for n in names), names
        assert any(n.startswith("Memcpy HtoD") for n in names), names
    if workload == "two_streams":
        assert len(runs["torch"]["trace_rows"]["by_stream"]) >= 2, runs["torch"]["trace_rows"]
    if workload == "cuda_graph" and sum(rows.values()) < 3 * runs["torch"]["steps"]:
        # per step: the eager copy_ and add_, and the replayed graph's kernels (the MLP's forward)
        pytest.skip(
            "torch.profiler itself recorded no kernels of the replayed CUDA graph here (graph_preinit="
            f"{runs['torch'].get('graph_preinit')}; CUPTI and graphs, pytorch/kineto#1165): {rows}"
        )


def test_polyprof_records_cuda_without_warnings(compared):
    ours = compared["runs"]["polyprof"]
    assert sum(ours["summaries"][-1]["device_rows"].values()) > 0, "polyprof recorded no CUDA rows"
    assert profiler_warnings(ours["warnings"]) == [], ours["warnings"]


def test_device_row_names_and_counts_match_torch(compared):
    ours, theirs = compared["runs"]["polyprof"], compared["runs"]["torch"]
    for rep, (o, t) in enumerate(zip(ours["summaries"], theirs["summaries"])):
        assert counter_mismatches(o["device_rows"], t["device_rows"]) == {}, f"events(), recording {rep}"
        assert counter_mismatches(o["device_averages"], t["device_averages"]) == {}, (
            f"key_averages(), rec. {rep}"
        )


def test_trace_device_rows_per_stream_match_torch(compared):
    ours, theirs = compared["runs"]["polyprof"]["trace_rows"], compared["runs"]["torch"]["trace_rows"]
    assert ours["kernels"] > 0, "polyprof's Chrome trace has no kernel, memcpy or memset rows"
    assert stream_signature(ours["by_stream"]) == stream_signature(theirs["by_stream"])
    assert ours["profiler_steps"] == theirs["profiler_steps"], "ProfilerStep# ranges in the traces"


def test_the_same_recording_read_by_polyprof_gives_torchs_numbers(compared):
    """Attribution, free of timing: polyprof's reading of torch's own raw result of each recording
    against torch's reading of it: rows, counts, and the Self CUDA of every key, ranges included."""
    same = compared["summary"]["same_recording"]
    assert same is not None, "the torch.profiler child did not read its recordings both ways"
    assert all(not m for m in same["device_row_mismatches"]), same["device_row_mismatches"]
    assert all(not m for m in same["device_average_mismatches"]), same["device_average_mismatches"]
    assert all(not m for m in same["op_count_mismatches"]), same["op_count_mismatches"]
    assert not same["time_differences"], (
        "one recording, Self CUDA per key read by polyprof and by torch (recording, key, polyprof µs, "
        f"torch µs, deviation %): {same['time_differences'][:20]}"
    )


def test_self_cuda_per_key_within_torchs_own_spread(compared):
    """polyprof's own recordings against torch's: ops, device rows and the GPU spans of ranges
    (``ProfilerStep*``, ``Optimizer.step#...``), each within torch's own spread of it."""
    summary = compared["summary"]
    report = summary["self_cuda_report"]
    assert not report["missing"], (
        f"keys with Self CUDA under torch.profiler, none under polyprof: {report['missing']}"
    )
    assert not report["extra"], (
        f"keys with Self CUDA under polyprof, none under torch.profiler: {report['extra']}"
    )
    attribution = "equal" if (summary["same_recording"] or {}).get("agrees") else "NOT equal"
    assert not report["failures"], (
        f"Self CUDA off torch's by more than {SPREAD_FACTOR} x torch's own spread (key, polyprof µs, "
        f"torch µs, deviation %, limit %): {report['failures']}; torch's own spread: work "
        f"{report['noise_pct']:.2f}%, ranges {report['range_noise_pct']:.2f}% over "
        f"{summary['torch_children']} torch child(ren)"
        + (
            f" (limits held at {100 * SPREAD_CEILING:.0f}% where twice torch's spread asked for more: "
            f"{report['capped']})"
            if report.get("capped")
            else ""
        )
        + (
            f" (judged by the same recording read both ways, where torch's own spread is past "
            f"{100 * SPREAD_CEILING:.0f}%: {report['judged_by_same_recording']})"
            if report.get("judged_by_same_recording")
            else ""
        )
        + f"; polyprof's reading of torch's own recording is {attribution} to torch's, so this is "
        + ("run-to-run timing, not attribution" if attribution == "equal" else "attribution")
    )


def test_ac2g_flows_as_torch_draws_them(compared):
    """Every flow event of one recording as torch's trace has it (count, id, lane and time: the
    dangling ends on calls that launch nothing included), and every launch's arrow in polyprof's own
    trace as in torch's."""
    summary = compared["summary"]
    same = summary["same_recording_flows"]
    assert same is not None, "the torch.profiler child did not read its recordings both ways"
    assert not same["only_ours"] and not same["only_theirs"], (
        "flow events of one recording, polyprof's trace against torch's (first 20 each way; "
        f"[ph, id, pid, tid, ns]): {same}"
    )
    assert summary["flow_arrow_mismatches"] == {}, (
        f"launch arrows (call -> device row: polyprof, torch): {summary['flow_arrow_mismatches']}"
    )
    # every flow event sits on its own row's start, as Kineto writes it
    assert compared["runs"]["polyprof"]["flows"]["unbound"] == 0, compared["runs"]["polyprof"]["flows"]


def test_aten_op_counts_match_torch(compared):
    ours, theirs = compared["runs"]["polyprof"], compared["runs"]["torch"]
    assert counter_mismatches(ours["summaries"][-1]["op_counts"], theirs["summaries"][-1]["op_counts"]) == {}


def test_overhead_no_worse_than_torch(compared):
    summary = compared["summary"]
    added, limit = summary["added_ms"], summary["added_limit_ms"]
    assert added["polyprof"] <= limit, (
        f"time added to {summary['overhead_steps']} steps (median of profiled minus unprofiled loop): "
        f"polyprof {added['polyprof']:.3f} ms, torch.profiler {added['torch']:.3f} ms (limit "
        f"{ADDED_TIME_FACTOR} x torch + {NOISE_STANDARD_ERRORS} standard errors "
        f"{summary['added_noise_ms']:.3f} ms = {limit:.3f} ms); per repetition: "
        f"{summary['added_ms_reps']}; loop medians in ms: {summary['loop_ms_median']}; "
        f"start() ms {summary['start_ms']} (first {summary['first_start_ms']}), stop() ms "
        f"{summary['stop_ms']}"
    )


def test_start_and_stop_are_timed_for_both_profilers(compared):
    """Recorded beside the overhead (the results file and scripts/gpu_check.sh's digest show them)."""
    summary = compared["summary"]
    for key in ("start_ms", "stop_ms", "first_start_ms"):
        assert set(summary[key]) == set(PROFILERS), (key, summary[key])
        assert all(v > 0 for v in summary[key].values()), (key, summary[key])


def test_hta_reads_polyprof_trace(compared, record_result):
    """Holistic Trace Analysis on polyprof's trace of its own recording, and on torch's recording as
    torch wrote it and as polyprof writes it: the same events, so HTA must see the same thing in both
    writings (kernels, types, times, streams, and its own failures alike)."""
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis (hta) is not importable here")
    from gpu_compare import hta_summary_of_file

    runs = compared["runs"]
    found = {which: hta_summary_of_file(runs[which]["trace"]) for which in PROFILERS}
    reading = runs["torch"].get("reading")
    if reading:
        found["torch recording written by polyprof"] = hta_summary_of_file(reading["trace"])
    record_result({"record": "hta", "workload": compared["workload"], **found})
    ours, theirs = found["polyprof"], found["torch"]
    if reading:
        both = found["torch recording written by polyprof"]
        assert both == theirs, (
            f"HTA on torch's recording as polyprof writes it: {both}; as torch writes it: {theirs}"
        )
    if "error" in ours and "error" in theirs:
        pytest.skip(
            f"HTA fails on torch.profiler's own trace too: {theirs['error']} (on polyprof's: {ours['error']})"
        )
    assert "error" not in ours, f"HTA on polyprof's trace: {ours['error']} (on torch's it ran: {theirs})"
    assert (
        ours["kernel_types_us"].get("COMPUTATION", 0) > 0 or ours["kernel_types_us"].get("MEMORY", 0) > 0
    ), ours
    trace_names = {n for rows in runs["polyprof"]["trace_rows"]["by_stream"].values() for n in rows}
    assert set(ours["kernel_names"]) & trace_names, (ours["kernel_names"], sorted(trace_names)[:10])
    # HTA's temporal breakdown fails its own check on torch's traces too (hta_summary): only where it ran
    if ours["temporal_error"] is None:
        assert ours["compute_time_us"] + ours["non_compute_time_us"] > 0, ours
    streams = {int(s) for s in runs["polyprof"]["trace_rows"]["by_stream"]}
    assert set(ours["idle_streams"]) >= streams, (ours["idle_streams"], streams)


def test_torch_profiler_and_polyprof_take_turns_in_one_process(child, trace_root, record_result):
    args = ["coexist", "--out", str(trace_root / "coexist"), "--steps", "10"]
    result = child(args, timeout=child_timeout())
    runs = result["runs"]
    record_result(
        {
            "record": "coexist",
            "order": [r["profiler"] for r in runs],
            "device_rows": [sum(r["device_rows"].values()) for r in runs],
            "warnings": result["warnings"],
        }
    )
    first = runs[0]
    assert sum(first["device_rows"].values()) > 0, "torch.profiler recorded no CUDA rows"
    for run in runs[1:]:
        assert counter_mismatches(run["device_rows"], first["device_rows"]) == {}, run["profiler"]
        assert counter_mismatches(run["op_counts"], first["op_counts"]) == {}, run["profiler"]
    assert profiler_warnings(result["warnings"]) == [], result["warnings"]
