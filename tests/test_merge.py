"""``polyprof merge``: one Chrome trace of every rank, a process group per rank, clocks aligned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")

from polyprof.cli import main as cli_main
from polyprof.formats.chrome_reader import read_chrome_trace

BASE_NS = 1_700_000_000_123_456_789


def rank_trace(rank: int, world_size: int, *, base_ns: int, step_at_us: float) -> dict[str, Any]:
    """A Kineto-shaped rank: process metadata, a step with an op, a flow from the op to a kernel."""
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "ts": 0.0, "args": {"name": "python"}},
            {
                "ph": "M",
                "name": "process_labels",
                "pid": 4242,
                "tid": 0,
                "ts": 0.0,
                "args": {"labels": "CPU"},
            },
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": 4242,
                "tid": 0,
                "ts": 0.0,
                "args": {"sort_index": 4242},
            },
            {
                "ph": "M",
                "name": "thread_name",
                "pid": 4242,
                "tid": 7,
                "ts": 0.0,
                "args": {"name": "thread 7 (python)"},
            },
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0.0, "args": {"name": "CUDA 0"}},
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#5",
                "pid": 4242,
                "tid": 7,
                "ts": step_at_us,
                "dur": 100.0,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 4242,
                "tid": 7,
                "ts": step_at_us + 1.5,
                "dur": 50.25,
            },
            {
                "ph": "s",
                "cat": "ac2g",
                "name": "ac2g",
                "id": 77,
                "pid": 4242,
                "tid": 7,
                "ts": step_at_us + 2.0,
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "gemm",
                "pid": 0,
                "tid": 7,
                "ts": step_at_us + 10.0,
                "dur": 30.0,
            },
            {
                "ph": "f",
                "cat": "ac2g",
                "name": "ac2g",
                "id": 77,
                "bp": "e",
                "pid": 0,
                "tid": 7,
                "ts": step_at_us + 10.0,
            },
            {
                "ph": "X",
                "cat": "Trace",
                "name": "PyTorch Profiler (0)",
                "pid": "Spans",
                "tid": "PyTorch Profiler",
                "ts": 0.0,
                "dur": 500.0,
            },
        ],
        "baseTimeNanoseconds": base_ns,
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    # rank 1's clock is 2 ms and 123 ns ahead, and it reached step 5 40 µs later in its own time
    for rank, base, step_at in ((0, BASE_NS, 1000.0), (1, BASE_NS + 2_000_123, 1040.0), (2, BASE_NS, 1000.5)):
        (folder / f"rank{rank}.json").write_text(
            json.dumps(rank_trace(rank, 3, base_ns=base, step_at_us=step_at))
        )
    return folder


def merged(tmp_path: Path, run: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "merged.json"
    assert cli_main(["merge", str(run), "-o", str(out), *args]) == 0
    return json.loads(out.read_text())


def absolute_ns(doc: dict[str, Any], event: dict[str, Any]) -> int:
    return doc["baseTimeNanoseconds"] + round(event["ts"] * 1000)


def test_each_rank_is_a_process_group_named_by_rank(tmp_path: Path, run: Path) -> None:
    doc = merged(tmp_path, run)
    events = doc["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "process_name"}
    assert {(1, "rank 0: python"), (2, "rank 0: CUDA 0"), (3, "rank 0: Spans")} <= names
    assert {(101, "rank 1: python"), (201, "rank 2: python"), (202, "rank 2: CUDA 0")} <= names
    labels = {e["pid"]: e["args"]["labels"] for e in events if e.get("name") == "process_labels"}
    assert labels == {1: "rank 0, CPU", 101: "rank 1, CPU", 201: "rank 2, CPU"}
    sort_index = {e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"}
    assert all(sort_index[pid] == pid for pid in sort_index) and {1, 2, 3, 101, 201} <= set(sort_index)
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert threads == {f"rank {r}: thread 7 (python)" for r in range(3)}
    mm = [e for e in events if e.get("name") == "aten::mm"]
    assert sorted(e["pid"] // 100 for e in mm) == [0, 1, 2]
    # flows stay within their rank: ids made unique per rank, start and end still paired
    flows = [(e["pid"] // 100, e["ph"], e["id"]) for e in events if e.get("cat") == "ac2g"]
    assert sorted(flows) == [
        (0, "f", 231),
        (0, "s", 231),
        (1, "f", 232),
        (1, "s", 232),
        (2, "f", 233),
        (2, "s", 233),
    ]
    assert doc["polyprofMerge"]["world_size"] == 3 and doc["polyprofMerge"]["align"] == "wall"
    assert read_chrome_trace(tmp_path / "merged.json").events  # polyprof's own reader takes it


def test_wall_alignment_keeps_every_events_own_clock_to_the_nanosecond(tmp_path: Path, run: Path) -> None:
    doc = merged(tmp_path, run)
    steps = {
        e["pid"] // 100: absolute_ns(doc, e) for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#5"
    }
    assert steps == {0: BASE_NS + 1_000_000, 1: BASE_NS + 2_000_123 + 1_040_000, 2: BASE_NS + 1_000_500}
    assert min(e["ts"] for e in doc["traceEvents"] if "ts" in e) == 0.0


def test_step_alignment_starts_the_first_common_step_together(tmp_path: Path, run: Path, capsys) -> None:
    doc = merged(tmp_path, run, "--align", "step")
    steps = {
        e["pid"] // 100: absolute_ns(doc, e) for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#5"
    }
    assert len(set(steps.values())) == 1 and steps[0] == BASE_NS + 1_000_000
    mm = {
        e["pid"] // 100: absolute_ns(doc, e) - steps[0]
        for e in doc["traceEvents"]
        if e.get("name") == "aten::mm"
    }
    assert mm == {0: 1500, 1: 1500, 2: 1500}  # each rank's own spacing is kept
    shifts = {r["rank"]: r["shift_ns"] for r in doc["polyprofMerge"]["ranks"]}
    assert shifts == {0: 0, 1: -(2_000_123 + 40_000), 2: -500}
    assert "clocks aligned by step (rank 1 -2.040 ms, rank 2 -0.001 ms)" in capsys.readouterr().err


def test_step_alignment_without_a_common_step_is_an_error_and_writes_nothing(
    tmp_path: Path, run: Path, capsys
) -> None:
    doc = json.loads((run / "rank2.json").read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "ProfilerStep#5"]
    (run / "rank2.json").write_text(json.dumps(doc))
    out = tmp_path / "merged.json"
    assert cli_main(["merge", str(run), "-o", str(out), "--align", "step"]) == 1
    assert "needs a ProfilerStep#N that every rank recorded" in capsys.readouterr().err
    assert not out.exists()


def test_bad_traces_are_named_and_the_rest_merged(tmp_path: Path, run: Path, capsys) -> None:
    (run / "rank9.json").write_text("{")
    (run / "rank0-copy.json").write_text((run / "rank0.json").read_text())
    doc = merged(tmp_path, run)
    err = capsys.readouterr().err
    assert f"skipped {run / 'rank9.json'}: " in err and f"skipped {run / 'rank0.json'}: rank 0 again" in err
    assert {r["rank"] for r in doc["polyprofMerge"]["ranks"]} == {0, 1, 2}
    assert cli_main(["merge", str(run), "-o", str(tmp_path / "merged.txt")]) == 2
    assert "name the merged trace .json or .json.gz" in capsys.readouterr().err


def test_flow_ids_stay_apart_when_a_rank_is_left_out(tmp_path: Path) -> None:
    """Ranks 0, 1 and 3 of 4 (rank 2's file is corrupt): rank 0's id 1 and rank 3's id 0 must differ."""
    folder = tmp_path / "run"
    folder.mkdir()
    for rank, flow_id in ((0, 1), (1, 5), (3, 0)):
        doc = rank_trace(rank, 4, base_ns=BASE_NS, step_at_us=1000.0)
        for event in doc["traceEvents"]:
            if "id" in event:
                event["id"] = flow_id
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    (folder / "rank2.json").write_text("{")
    doc = merged(tmp_path, folder)
    ids = {(e["pid"] // 100, e["id"]) for e in doc["traceEvents"] if "id" in e}
    assert len({i for _, i in ids}) == 3 and len(ids) == 3
