"""``--engine ray``: the many-rank analysis on a local Ray cluster gives the DuckDB engine's rows.

The cluster is started once for the module (``ray.init`` with two CPUs: a head node and its workers
on this machine, as ``ray start --head`` makes them); each rank is a Ray Data task.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from polyprof.cli import main as cli_main  # noqa: E402
from polyprof.ranks import analyse_run  # noqa: E402
from polyprof.ranks.rank_analysis import duckdb_rank_rows  # noqa: E402
from polyprof.ranks.rank_ray import ray_rank_rows  # noqa: E402
from polyprof.ranks.rank_set import collect_rank_set  # noqa: E402
from test_rank_report import overlapping_rank, real_traces, synthetic_rank, write_json, write_ranks  # noqa: E402, F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def test_both_engines_give_the_same_rows(cluster, real_traces, tmp_path: Path) -> None:  # noqa: F811
    # two GPU ranks too (kernels and overlap), at the real ones' time: else they are another run's
    first = real_traces[0]
    start_ns = first["baseTimeNanoseconds"] + round(
        min(e["ts"] for e in first["traceEvents"] if e.get("ph") == "X") * 1000
    )
    gpu_ranks = []
    for overlap_us in (50.0, 150.0):
        doc = {k: v for k, v in overlapping_rank(0, overlap_us).items() if k != "distributedInfo"}
        gpu_ranks.append({**doc, "baseTimeNanoseconds": start_ns})
    write_ranks(tmp_path / "run", [*real_traces, *gpu_ranks], as_parquet=(1,))
    rank_set = collect_rank_set([str(tmp_path / "run")], str(tmp_path / "pq"))
    assert [r.rank for r in rank_set.ranks] == [0, 1, 2, 3, 4, 5]
    by_duckdb = duckdb_rank_rows(rank_set)
    by_ray = ray_rank_rows(rank_set)
    assert by_ray == by_duckdb
    assert by_ray.ops and by_ray.steps and by_ray.kernels and len(by_ray.overlap) == 2


def test_the_report_from_python_and_the_command_line_on_ray(cluster, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    for rank, steps in {0: [100.0, 100.0], 1: [100.0, 101.0], 2: [150.0, 151.0]}.items():
        write_json(run / f"r{rank}.json", synthetic_rank(rank, 3, steps))
    on_ray, on_duckdb = analyse_run([run], engine="ray"), analyse_run([run])
    assert on_ray.stragglers == on_duckdb.stragglers == (2,)
    assert (on_ray.ops, on_ray.steps) == (on_duckdb.ops, on_duckdb.steps)
    assert cli_main(["report", str(run), "--engine", "ray", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["stragglers"] == [2]
