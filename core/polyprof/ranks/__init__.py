"""Layer 9, the ranks: the report across a distributed run's ranks; here its Python entry, ``analyse_run``.

What lives in this folder: finding and checking a run's traces (``rank_set``), the per-rank rows
by DuckDB (``rank_analysis``) or Ray (``rank_ray``), the statistics across ranks and their text,
JSON (``rank_report``) and HTML (``rank_report_html``) forms, merging ranks' traces into one
(``merge``), and two runs compared from the same per-rank rows, with a gate for CI (``diff``).
May import: ``polyprof.base``, ``polyprof.formats``, ``polyprof.analysis`` and this folder.

    from polyprof.ranks import analyse_run
    report = analyse_run(["traces/"])                      # DuckDB, on this machine
    report = analyse_run(["/shared/run7"], engine="ray", ray_address="auto")
    print(render_text(report))                               # polyprof.ranks.rank_report

The same as ``polyprof report DIR``: the run's traces are found and checked
(``polyprof.ranks.rank_set``), the per-rank rows computed by the engine chosen
(``polyprof.ranks.rank_analysis`` for DuckDB, ``polyprof.ranks.rank_ray`` for Ray; both run the same unit of
work per rank, so they give the same rows) and the statistics across ranks built
(``polyprof.ranks.rank_report``).
"""

from __future__ import annotations

import os

from polyprof.ranks.rank_analysis import RankRows, duckdb_rank_rows
from polyprof.ranks.rank_report import DEFAULT_STRAGGLER_THRESHOLD, RankReport, build_rank_report
from polyprof.ranks.rank_set import RankSet, collect_rank_set, temporary_parquet_dir

ENGINES = ("duckdb", "ray")


def rank_rows(
    rank_set: RankSet,
    *,
    engine: str = "duckdb",
    memory_limit: str | None = None,
    ray_address: str | None = None,
) -> RankRows:
    """The per-rank rows of ``rank_set`` from ``engine``."""
    if engine == "duckdb":
        return duckdb_rank_rows(rank_set, memory_limit=memory_limit)
    if engine == "ray":
        from polyprof.ranks.rank_ray import ray_rank_rows

        return ray_rank_rows(rank_set, address=ray_address, memory_limit=memory_limit)
    raise ValueError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")


def analyse_run(
    paths: list[str | os.PathLike[str]],
    *,
    engine: str = "duckdb",
    parquet_dir: str | os.PathLike[str] | None = None,
    memory_limit: str | None = None,
    ray_address: str | None = None,
    straggler_threshold: float = DEFAULT_STRAGGLER_THRESHOLD,
) -> RankReport:
    """The report across ranks of the traces in ``paths`` (directories or files).

    :param parquet_dir: where Parquet traces made from JSON ones are kept (default: a temporary
        directory, removed; the report then reads no file after it returns).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    names = [os.fspath(p) for p in paths]
    if parquet_dir is not None:
        rank_set = collect_rank_set(names, os.fspath(parquet_dir))
        rows = rank_rows(rank_set, engine=engine, memory_limit=memory_limit, ray_address=ray_address)
        return build_rank_report(rank_set, rows, straggler_threshold=straggler_threshold)
    with temporary_parquet_dir() as folder:
        rank_set = collect_rank_set(names, folder)
        rows = rank_rows(rank_set, engine=engine, memory_limit=memory_limit, ray_address=ray_address)
        return build_rank_report(rank_set, rows, straggler_threshold=straggler_threshold)


__all__ = ["ENGINES", "analyse_run", "rank_rows"]
