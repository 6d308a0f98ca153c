"""The many-rank report's analysis on a Ray cluster: ``polyprof report DIR --engine ray``.

The unit of work is the DuckDB engine's: one rank's Parquet trace analysed by
``rank_analysis.rows_of_rank`` with a DuckDB connection of its own. Ray Data schedules the units:
one row per rank file in a ``ray.data`` dataset, ``map`` runs the unit on whichever worker Ray
picks, and the small per-rank rows come back to be combined. Nothing here schedules or pools
anything itself. The files must be readable at the same path from every node (a shared file
system); each worker needs polyprof with ``polyprof[analysis]`` installed.

``ray_rank_rows(rank_set, address=...)`` joins the cluster at ``address`` (``"auto"``: the one
``ray start`` made on this machine; ``None``: a local cluster for this process), as ``ray.init``
takes it, and leaves a cluster it did not start running.
"""

from __future__ import annotations

from typing import Any

from polyprof.rank_analysis import EngineUnavailableError, RankRows, combine, connect, rows_or_failure
from polyprof.rank_set import RankSet


def ray_module() -> Any:
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise EngineUnavailableError(
            f"--engine ray needs Ray Data, which is not installed: pip install 'ray[data]' ({exc})"
        ) from exc
    return ray


def _analyse_rank(row: dict[str, Any]) -> dict[str, Any]:
    """One Ray Data row: a rank's file in, its rows out (as one object, which Ray pickles)."""
    with connect() as connection:
        return {"rows": rows_or_failure(connection, row["path"], int(row["rank"]))}


def ray_rank_rows(rank_set: RankSet, *, address: str | None = None) -> RankRows:
    """The per-rank rows of ``rank_set``, each rank analysed as a Ray Data task."""
    ray = ray_module()
    connect(memory_limit=None).close()  # DuckDB is there, before the cluster starts
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        items = [{"rank": r.rank, "path": r.parquet} for r in rank_set.ranks]
        dataset = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
        results = dataset.map(_analyse_rank).take_all()
    finally:
        if started_here:
            ray.shutdown()
    return combine([result["rows"] for result in results])


__all__ = ["ray_module", "ray_rank_rows"]
