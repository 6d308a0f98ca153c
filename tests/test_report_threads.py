"""``polyprof report`` of one trace holding several threads nests host rows per thread, as torch does.

torch's ``_populate_cpu_children`` gives each thread a stack of its own, and leaves async rows
(c10d's collective ranges such as ``gloo:all_reduce``, which run on gloo's worker threads) out of
every stack, with no self time. The oracle is a real ``torchrun --nproc_per_node 2`` gloo job:
each rank writes its torch.profiler trace and torch's ``key_averages`` of that live profile, and
the report of each rank's trace (alone, and as ``--per-rank`` renders it) must give the same rows.
"""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from polyprof.cli import main as cli_main
from polyprof.cli.cli_report import ReportOptions, load_report_results, render_report

JOB = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = sys.argv[1]
    x = torch.randn(64, 64)
    dist.all_reduce(x.clone())  # gloo's connections are made before the profile

    def ready(prof):
        prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
        rows = {
            a.key: [a.count, a.self_cpu_time_total, a.cpu_time_total, a.is_async]
            for a in prof.key_averages()
        }
        with open(os.path.join(out, f"torch{rank}.rows"), "w") as f:
            json.dump(rows, f)

    steps = schedule(wait=1, warmup=1, active=2)
    with profile(activities=[ProfilerActivity.CPU], schedule=steps, on_trace_ready=ready) as prof:
        for _ in range(4):
            y = x @ x
            dist.all_reduce(y)
            y.sum()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()
    """
)


def _gloo_available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_gloo_available())


def _rows(averages: Any) -> dict[str, tuple[int, float, float, bool]]:
    return {a.key: (a.count, a.self_cpu_time_total, a.cpu_time_total, bool(a.is_async)) for a in averages}


def _approx(rows: dict[str, Any]) -> dict[str, Any]:
    return {
        key: (count, pytest.approx(self_us, abs=1e-6), pytest.approx(total_us, abs=1e-6), is_async)
        for key, (count, self_us, total_us, is_async) in rows.items()
    }


@pytest.mark.slow
@pytest.mark.skipif(not _gloo_available(), reason="torch.distributed with gloo is not available")
def test_report_of_each_gloo_rank_trace_is_torchs_table_of_that_rank(tmp_path: Path, capsys) -> None:
    from test_distributed_ranks import torchrun

    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "out"
    out.mkdir()
    torchrun(tmp_path, str(script), str(out))
    theirs = {}
    for rank in (0, 1):
        rows = {k: tuple(v) for k, v in json.loads((out / f"torch{rank}.rows").read_text()).items()}
        assert rows["gloo:all_reduce"][3] and rows["gloo:all_reduce"][2] > 0, rows
        ours = _rows(load_report_results(out / f"rank{rank}.json").key_averages())
        assert ours == _approx(rows), f"rank {rank}"
        theirs[rank] = rows

    if not all(importlib.util.find_spec(name) for name in ("duckdb", "pyarrow")):
        return  # the report across ranks below needs polyprof[analysis]; each rank's table is above

    # --per-rank renders each rank's table as the report of that trace alone
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1):
        (traces / f"rank{rank}.json").write_bytes((out / f"rank{rank}.json").read_bytes())
    assert cli_main(["report", str(traces), "--per-rank"]) == 0
    text = capsys.readouterr().out
    for rank in (0, 1):
        alone = render_report(load_report_results(traces / f"rank{rank}.json"), ReportOptions())
        assert f"Rank {rank} ({traces / f'rank{rank}.json'}):\n{alone}" in text
        assert not re.search(r"\s-\d", alone), alone

    # the many-rank summary nests the same way: per name, the least and most self time of a rank
    assert cli_main(["report", str(traces), "--format", "json"]) == 0
    summary = {op["name"]: op for op in json.loads(capsys.readouterr().out)["ops"]}
    for name in theirs[0].keys() & theirs[1].keys():
        self_us = sorted(theirs[rank][name][1] for rank in (0, 1))
        got = summary[name]["self_us"]
        assert [got["min"], got["max"]] == pytest.approx(self_us, abs=2e-3), name


def _trace(events: list[dict[str, Any]], tmp_path: Path) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _event(cat: str, name: str, tid: int, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_rows_of_another_thread_are_not_children_of_this_threads_rows(tmp_path: Path) -> None:
    """B runs on thread 2 while A is open on thread 1: torch gives each its own stack, so A keeps all
    its 100 µs as self time (nesting every thread in one stack would give it 80)."""
    path = _trace(
        [
            _event("cpu_op", "A", 1, 0.0, 100.0),
            _event("cpu_op", "B", 2, 10.0, 20.0),
            _event("cpu_op", "C", 1, 40.0, 10.0),
        ],
        tmp_path,
    )
    results = load_report_results(path)
    rows = _rows(results.key_averages())
    assert rows == {"A": (1, 90.0, 100.0, False), "B": (1, 20.0, 20.0, False), "C": (1, 10.0, 10.0, False)}
    threads = {e.name: e.thread for e in results.events()}
    assert threads["A"] == threads["C"] != threads["B"]


def test_a_c10d_collective_range_is_async_as_torch_records_it(tmp_path: Path) -> None:
    """c10d marks its ``<backend>:<collective>`` ranges async: no parent, no child, no self time,
    even on the thread of the step that launched it (torch's Self CPU of the step keeps it all)."""
    path = _trace(
        [
            _event("user_annotation", "ProfilerStep#1", 1, 0.0, 100.0),
            _event("user_annotation", "gloo:all_reduce", 1, 20.0, 50.0),
            _event("cpu_op", "aten::add", 1, 30.0, 10.0),
            _event("user_annotation", "nccl:send 0->1", 3, 25.0, 5.0),
            _event("user_annotation", "my:range", 3, 60.0, 5.0),
        ],
        tmp_path,
    )
    rows = _rows(load_report_results(path).key_averages())
    assert rows == {
        "ProfilerStep*": (1, 90.0, 100.0, False),
        "gloo:all_reduce": (1, 0.0, 50.0, True),
        "aten::add": (1, 10.0, 10.0, False),
        "nccl:send 0->1": (1, 0.0, 5.0, True),
        "my:range": (1, 5.0, 5.0, False),
    }
