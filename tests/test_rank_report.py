"""``polyprof report DIR``: the report across ranks, on DuckDB over Parquet traces.

The oracle for every (rank, op) is ``polyprof report`` of that rank's trace alone (the
``key_averages`` that matches torch's table); the ranks are real torch and polyprof traces with a
``distributedInfo`` added, as a distributed run's traces carry it. Steps, stragglers and bad input
use small synthetic Kineto traces whose numbers are known.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from polyprof.cli import main as cli_main
from polyprof.cli.cli_report import load_report_results
from polyprof.formats.columnar import write_parquet_trace
from polyprof.ranks.rank_analysis import duckdb_rank_rows
from polyprof.ranks.rank_report import build_rank_report
from polyprof.ranks.rank_set import collect_rank_set

BASE_NS = 1_700_000_000_000_000_000


def with_rank(doc: dict[str, Any], rank: int, world_size: int, backend: str = "gloo") -> dict[str, Any]:
    return {"distributedInfo": {"backend": backend, "rank": rank, "world_size": world_size}, **doc}


def record_real_traces(folder: Path) -> None:
    """Write t0.json to t3.json: a training step with a schedule, recorded by torch (with Python
    frames, with memory) and by polyprof (with shapes, plain)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    import polyprof

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)

    def step() -> None:
        with record_function("forward"):
            loss = model(x).sum()
        with record_function("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad()

    makers = [
        (profile, {"with_stack": True}),
        (polyprof.profile, {"record_shapes": True}),
        (profile, {"profile_memory": True}),
        (polyprof.profile, {}),
    ]
    for i, (make, options) in enumerate(makers):
        path = folder / f"t{i}.json"
        with make(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=3),
            on_trace_ready=lambda p, path=path: p.export_chrome_trace(str(path)),
            **options,
        ) as prof:
            for _ in range(4):
                step()
                prof.step()


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory) -> list[dict[str, Any]]:
    """The four traces of ``record_real_traces``, recorded in a fresh process.

    ``with_stack=True`` records every thread's Python frames, and the threads earlier tests left
    blocked (which differ with the run's order and dependency versions) reach the trace from their
    untracked-thread lane, where the two readers compared here nest differently (docs/cli.md).
    """
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("real")
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from test_rank_report import record_real_traces; record_real_traces(Path(sys.argv[2]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent), str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((folder / f"t{i}.json").read_text()) for i in range(4)]


def write_ranks(folder: Path, docs: list[dict[str, Any]], *, as_parquet: tuple[int, ...] = ()) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, doc in enumerate(docs):
        doc = with_rank(doc, rank, len(docs))
        if rank in as_parquet:
            path = Path(write_parquet_trace(doc, folder / f"rank{rank}.parquet"))
        elif rank % 2:
            path = folder / f"rank{rank}.json.gz"
            path.write_bytes(gzip.compress(json.dumps(doc).encode()))
        else:
            path = folder / f"rank{rank}.json"
            path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def test_every_ranks_ops_are_what_its_own_report_says(real_traces, tmp_path: Path) -> None:
    paths = write_ranks(tmp_path / "run", real_traces, as_parquet=(3,))
    rank_set = collect_rank_set([str(tmp_path / "run")], str(tmp_path / "pq"))
    assert [r.rank for r in rank_set.ranks] == [0, 1, 2, 3] and rank_set.skipped == ()
    rows = duckdb_rank_rows(rank_set)
    for rank, path in enumerate(paths):
        expected = {a.key: a for a in load_report_results(path).key_averages()}
        got = {op.name: op for op in rows.ops if op.rank == rank}
        assert got.keys() == expected.keys()
        for name, op in got.items():
            want = expected[name]
            assert op.calls == want.count, name
            assert op.self_us == pytest.approx(want.self_cpu_time_total, abs=1e-3), name
            assert op.total_us == pytest.approx(want.cpu_time_total, abs=1e-3), name
    assert sorted({s.rank for s in rows.steps}) == [0, 1, 2, 3]
    assert all(len([s for s in rows.steps if s.rank == r]) == 3 for r in range(4))


def test_the_statistics_across_ranks_come_from_the_ranks_rows(real_traces, tmp_path: Path) -> None:
    write_ranks(tmp_path / "run", real_traces)
    rank_set = collect_rank_set([str(tmp_path / "run")], str(tmp_path / "pq"))
    rows = duckdb_rank_rows(rank_set)
    report = build_rank_report(rank_set, rows)
    addmm = next(op for op in report.ops if op.name == "aten::addmm")
    per_rank = {op.rank: op for op in rows.ops if op.name == "aten::addmm"}
    totals = [per_rank[r].total_us for r in range(4)]
    assert addmm.ranks == 4 and addmm.calls == sum(op.calls for op in per_rank.values())
    assert addmm.total_us.mean == pytest.approx(sum(totals) / 4)
    assert (addmm.total_us.min, addmm.total_us.max) == (min(totals), max(totals))
    assert addmm.slowest_rank == totals.index(max(totals))
    python_frames = [op for op in report.ops if op.name.startswith("<built-in")]
    assert python_frames and all(op.ranks == 1 and op.self_us.min == 0.0 for op in python_frames)


# -------------------------------------------------------------- synthetic runs


def synthetic_rank(
    rank: int, world_size: int, step_us: list[float], *, start_ns: int = BASE_NS
) -> dict[str, Any]:
    """A rank's Kineto trace: ProfilerStep#N annotations, each holding one aten::add of half its time."""
    events: list[dict[str, Any]] = []
    ts = 0.0
    for n, duration in enumerate(step_us, start=1):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{n}",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": duration,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::add",
                "pid": 1,
                "tid": 1,
                "ts": ts + 1,
                "dur": duration / 2,
            }
        )
        ts += duration + 10
    return with_rank({"baseTimeNanoseconds": start_ns, "traceEvents": events}, rank, world_size)


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_a_rank_slower_step_by_step_is_a_straggler(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    times = {
        0: [100.0, 100.0, 100.0],
        1: [102.0, 98.0, 100.0],
        2: [130.0, 125.0, 128.0],
        3: [100.0, 101.0, 99.0],
    }
    for rank, steps in times.items():
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 4, steps))
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stragglers"] == [2] and data["straggler_threshold"] == 0.10
    ratios = {s["rank"]: s["ratio"] for s in data["steps"]}
    # step medians over ranks: 101, 100.5, 100 -> rank 2: median(130/101, 125/100.5, 128/100)
    assert ratios[2] == pytest.approx(sorted([130 / 101, 125 / 100.5, 128 / 100])[1])
    assert ratios[0] == pytest.approx(sorted([100 / 101, 100 / 100.5, 100 / 100])[1])
    add = next(op for op in data["ops"] if op["name"] == "aten::add")
    assert add["calls"] == 12 and add["slowest_rank"] == 2
    assert add["self_us"]["max"] == pytest.approx((130 + 125 + 128) / 2)
    step = next(op for op in data["ops"] if op["name"] == "ProfilerStep*")
    assert step["self_us"]["min"] == pytest.approx(150.0)  # rank 0: 300 - 150 of aten::add
    assert data["step_percentiles_us"]["p50"] == pytest.approx(100.0)  # the 6th and 7th of 12 steps
    assert cli_main(["report", str(run), "--straggler-threshold", "0.3"]) == 0
    assert "Stragglers (ratio >= 1.30): none" in capsys.readouterr().out


def test_bad_traces_are_named_and_the_rest_analysed(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for rank in range(3):
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 3, [100.0, 100.0]))
    write_json(run / "r1-copy.json", synthetic_rank(1, 3, [100.0, 100.0]))  # a duplicate rank
    write_json(run / "other-size.json", synthetic_rank(0, 8, [100.0]))  # another run's world size
    write_json(run / "yesterday.json", synthetic_rank(2, 3, [100.0], start_ns=BASE_NS - 86_400 * 10**9))
    good = (run / "r0.json").read_text()
    (run / "truncated.json").write_text(good[: len(good) // 2])
    (run / "corrupt.parquet").write_bytes(b"PAR1 nothing")
    assert cli_main(["report", str(run)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("3 ranks (world size 3, backend gloo), ")
    err = captured.err
    assert f"skipped {run / 'r1.json'}: rank 1 again: {run / 'r1-copy.json'} is kept" in err
    assert f"skipped {run / 'other-size.json'}: from another run: world size 8" in err
    assert (
        f"skipped {run / 'yesterday.json'}: from another run: it started 1440 minutes from the others" in err
    )
    assert re.search(rf"skipped {re.escape(str(run / 'truncated.json'))}: (truncated|invalid) JSON", err)
    assert f"skipped {run / 'corrupt.parquet'}: not a readable polyprof Parquet trace" in err


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "no traces (.json, .json.gz, .parquet) in"),
        (lambda d: (d / "a.json").write_text("{"), "none of the 1 trace files"),
    ],
)
def test_nothing_to_analyse_is_an_error_naming_the_directory(tmp_path: Path, capsys, setup, message) -> None:
    run = tmp_path / "run"
    run.mkdir()
    setup(run)
    assert cli_main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(run) in err


def test_per_rank_tables_and_a_memory_limit(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for rank in range(2):
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 2, [100.0, 200.0]))
    keep = tmp_path / "parquet"
    assert (
        cli_main(["report", str(run), "--per-rank", "--memory-limit", "256MB", "--parquet-dir", str(keep)])
        == 0
    )
    out = capsys.readouterr().out
    assert f"Rank 1 ({run / 'r1.json'}):" in out and "ProfilerStep*" in out
    assert sorted(p.name for p in keep.iterdir()) == ["r0.parquet", "r1.parquet"]
    # the kept Parquet traces are a run of their own, read without converting again
    assert cli_main(["report", str(keep), "--format", "json"]) == 0
    assert [r["rank"] for r in json.loads(capsys.readouterr().out)["ranks"]] == [0, 1]


def overlapping_rank(rank: int, overlap_us: float) -> dict[str, Any]:
    """Three steps, each a 300 µs GEMM on stream 7 and a 200 µs all-reduce on stream 20 that starts
    ``overlap_us`` before the GEMM ends, launched from ops as Kineto records them."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "ts": 0.0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0.0, "args": {"name": "CUDA 0"}},
    ]
    correlation = 0
    for step in range(3):
        t = 1000.0 + step * 1000
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 7,
                "tid": 8,
                "ts": t,
                "dur": 900.0,
                "args": {"External id": 1000 + step},
            }
        )
        kernels = (
            ("gemm", 7, 100.0, 300.0),
            ("ncclDevKernel_AllReduce_Sum_f32", 20, 400.0 - overlap_us, 200.0),
        )
        for name, stream, start, dur in kernels:
            correlation += 1
            ids = {"External id": correlation}
            events.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::op",
                    "pid": 7,
                    "tid": 8,
                    "ts": t + 10 + correlation,
                    "dur": 5.0,
                    "args": ids,
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 7,
                    "tid": 8,
                    "ts": t + 11 + correlation,
                    "dur": 2.0,
                    "args": {**ids, "correlation": correlation},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": name,
                    "pid": 0,
                    "tid": stream,
                    "ts": t + start,
                    "dur": dur,
                    "args": {**ids, "correlation": correlation, "device": 0, "stream": stream},
                }
            )
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}], "traceEvents": events,
           "baseTimeNanoseconds": BASE_NS}  # fmt: skip
    return with_rank(doc, rank, 2, backend="nccl")


def test_compute_communication_overlap_is_htas(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for rank, overlap_us in ((0, 50.0), (1, 150.0)):
        write_json(run / f"rank{rank}.json", overlapping_rank(rank, overlap_us))
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    overlap = {o["rank"]: o for o in json.loads(capsys.readouterr().out)["overlap"]}
    assert overlap[0]["communication_us"] == 600.0 and overlap[0]["compute_us"] == 900.0
    assert (overlap[0]["overlapped_us"], overlap[1]["overlapped_us"]) == (150.0, 450.0)
    hta = pytest.importorskip("hta.trace_analysis")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hta.TraceAnalysis(trace_dir=str(run)).get_comm_comp_overlap(visualize=False)
    for row in theirs.itertuples():
        assert overlap[row.rank]["overlap"] * 100 == pytest.approx(row.comp_comm_overlap_pctg)


def test_host_rows_nest_per_thread_as_torch_records_them(tmp_path: Path, capsys) -> None:
    """A on thread 1 over 0-100 µs, B on thread 2 inside that time: B is not A's child, as in torch's
    own tree of the recording (one stack per thread), and as ``polyprof report`` of the trace alone
    nests them (tests/test_report_threads.py); one stack for both would give A 80 µs."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "A", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "cat": "cpu_op", "name": "B", "pid": 1, "tid": 2, "ts": 10.0, "dur": 20.0},
    ]
    write_json(tmp_path / "run" / "r0.json", with_rank({"traceEvents": events}, 0, 1))
    assert cli_main(["report", str(tmp_path / "run"), "--format", "json"]) == 0
    ops = {op["name"]: op for op in json.loads(capsys.readouterr().out)["ops"]}
    assert (ops["A"]["self_us"]["mean"], ops["B"]["self_us"]["mean"]) == (100.0, 20.0)


def test_a_rank_whose_analysis_fails_is_named_and_the_others_reported(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for rank in range(3):
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 3, [100.0, 100.0]))
    # a Parquet trace whose footer and ts are sound but whose dur column is text: DuckDB's query fails
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = Path(write_parquet_trace(synthetic_rank(2, 3, [100.0, 100.0]), tmp_path / "good.parquet"))
    table = pq.read_table(good)
    broken = table.set_column(
        table.column_names.index("dur"), "dur", pa.array(["long"] * table.num_rows, pa.string())
    )
    (run / "r2.json").unlink()
    pq.write_table(broken, run / "r2.parquet")
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert f"skipped {run / 'r2.parquet'}: its analysis failed" in captured.err


def test_a_rank_without_steps_leaves_the_others_straggler_ratios(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for rank, steps in {0: [100.0, 100.0], 1: [100.0, 100.0], 2: [150.0, 150.0]}.items():
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 4, steps))
    no_steps = synthetic_rank(3, 4, [100.0])
    no_steps["traceEvents"] = [e for e in no_steps["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    write_json(run / "r3.json", no_steps)
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stragglers"] == [2] and [s["rank"] for s in data["steps"]] == [0, 1, 2]


def test_a_trace_with_an_infinite_time_is_still_read(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    write_json(run / "r0.json", synthetic_rank(0, 2, [100.0]))
    odd = synthetic_rank(1, 2, [100.0])
    odd["traceEvents"].append({"ph": "i", "name": "odd", "pid": 1, "tid": 1, "ts": float("-inf")})
    (run / "r1.json").write_text(json.dumps(odd))  # Python writes -Infinity, which its parser reads back
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    assert [r["rank"] for r in json.loads(capsys.readouterr().out)["ranks"]] == [0, 1]


@pytest.mark.parametrize("flag", [["--format", "json"], ["--per-rank"], ["--engine", "ray"], ["-o", "x.txt"]])
def test_options_of_a_report_across_ranks_are_refused_for_one_trace(tmp_path: Path, capsys, flag) -> None:
    path = write_json(tmp_path / "r0.json", synthetic_rank(0, 1, [100.0]))
    assert cli_main(["report", str(path), *flag]) == 2
    assert f"{flag[0]}: for a report across ranks" in capsys.readouterr().err
