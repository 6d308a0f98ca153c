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

``ray.init`` waits for an address where no cluster answers for as long as it is left to (minutes,
retrying). So an address given as ``HOST:PORT`` or ``ray://HOST:PORT`` (``[::1]:6379`` too) is
tried first, before Ray is imported (seconds): a TCP connection and the HTTP/2 greeting that Ray's
gRPC servers (the GCS, the Ray Client server) answer at once, within ``CONNECT_TIMEOUT_S`` each.
Nothing answering is ``ClusterUnreachableError``, one line naming the address. (With
``RAY_USE_TLS`` set only the TCP connection is tried.) Every other address (``auto``, ``local``,
``ray://HOST`` with gRPC's default port, another scheme's ``module://...``) goes to ``ray.init``
unchanged.

Ctrl-C stops the analysis: on this machine it is a ``KeyboardInterrupt``; where it reaches a worker,
Ray reports the task cancelled, and that is a ``KeyboardInterrupt`` here too.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from typing import Any

from polyprof.base.errors import PolyprofError
from polyprof.ranks.rank_analysis import EngineUnavailableError, RankRows, combine, connect, rows_or_failure
from polyprof.ranks.rank_set import RankSet

#: How long the check of ``--ray-address`` waits for the connection, then for the cluster's answer.
CONNECT_TIMEOUT_S = 5.0
#: The start of an HTTP/2 connection (RFC 9113 §3.4) and an empty SETTINGS frame: a gRPC server
#: answers with its own SETTINGS frame (frame type 4 in the 9-byte frame header).
_HTTP2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS_FRAME = 4
#: ``HOST:PORT``, ``[IPV6]:PORT``, each maybe after ``ray://``: the addresses whose server is known.
_HOST_AND_PORT = re.compile(r"(?:ray://)?(?:\[(?P<ipv6>[^\]]+)\]|(?P<host>[^:/\[\]]+)):(?P<port>[0-9]+)")
_LARGEST_PORT = 65535


class ClusterUnreachableError(PolyprofError, ConnectionError):
    """No Ray cluster answers at the address given."""


def ray_module() -> Any:
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise EngineUnavailableError(
            f"--engine ray needs Ray Data, which is not installed: pip install 'ray[data]' ({exc})"
        ) from exc
    return ray


def _host_and_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT`` (``[::1]:6379`` too); else None."""
    match = _HOST_AND_PORT.fullmatch(address)
    if match is None:
        return None
    return match["ipv6"] or match["host"], int(match["port"])


def _unreachable(address: str, why: str) -> ClusterUnreachableError:
    client = address.startswith("ray://")
    expected = "the Ray Client server (port 10001 by default)" if client else "its GCS (port 6379 by default)"
    return ClusterUnreachableError(
        f"no Ray cluster answers at --ray-address {address} ({why}): check that the cluster runs "
        f"('ray status' on its head node), that the address is {expected}, and that a firewall "
        "lets this machine reach it"
    )


def check_reachable(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ``ClusterUnreachableError`` unless a gRPC server answers at ``address`` within
    ``timeout_s`` (twice at most: to connect, then to answer). An address with no port (``auto``,
    ``ray://HOST``) or none at all is left to ``ray.init``."""
    if address is None:
        return
    where = _host_and_port(address)
    if where is None:
        return
    if not 0 < where[1] <= _LARGEST_PORT:
        raise ClusterUnreachableError(
            f"--ray-address {address}: port {where[1]} is not a port (1 to {_LARGEST_PORT})"
        )
    try:
        with socket.create_connection(where, timeout=timeout_s) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            conn.sendall(_HTTP2_GREETING)
            header = conn.recv(9)
    except TimeoutError:
        raise _unreachable(address, f"no answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise _unreachable(address, exc.strerror or str(exc)) from None
    if len(header) < 4 or header[3] != _SETTINGS_FRAME:
        raise _unreachable(address, "something answers there, but not a Ray cluster")


def _analyse_rank(row: dict[str, Any]) -> dict[str, Any]:
    """One Ray Data row: a rank's file in, its rows out (as one object, which Ray pickles)."""
    memory_limit = row["memory_limit"] or None
    with connect(memory_limit=memory_limit) as connection:
        rows = rows_or_failure(
            connection, row["path"], int(row["rank"]), source=row["source"], memory_limit=memory_limit
        )
        return {"rows": rows}


def _in_a_cluster() -> bool:
    """Whether this process has joined a Ray cluster already (without importing Ray)."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _join(ray: Any, address: str | None) -> None:
    try:
        ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        if "ray[client]" in first_line:
            raise EngineUnavailableError(
                f"--ray-address {address} needs Ray Client: pip install 'ray[client]'"
            ) from exc
        raise ClusterUnreachableError(f"could not join the Ray cluster at {address!r}: {first_line}") from exc


def ray_rank_rows(
    rank_set: RankSet, *, address: str | None = None, memory_limit: str | None = None
) -> RankRows:
    """The per-rank rows of ``rank_set``, each rank analysed as a Ray Data task.

    :param memory_limit: each task's DuckDB memory limit, as ``duckdb_rank_rows`` takes it.
    :raises ClusterUnreachableError: when nothing answers at ``address`` (see the module notes).
    :raises KeyboardInterrupt: on Ctrl-C, here or on a worker.
    """
    if not _in_a_cluster():  # before Ray's import (seconds): a dead address fails within the check's bound
        check_reachable(address)
    ray = ray_module()
    connect(memory_limit=memory_limit).close()  # DuckDB is there and takes the limit, before the cluster
    started_here = not ray.is_initialized()
    if started_here:
        _join(ray, address)
    try:
        items = [
            {"rank": r.rank, "path": r.parquet, "source": r.source, "memory_limit": memory_limit or ""}
            for r in rank_set.ranks
        ]
        dataset = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
        results = dataset.map(_analyse_rank).take_all()
    except ray.exceptions.TaskCancelledError as exc:  # a worker's KeyboardInterrupt, as Ray reports it
        raise KeyboardInterrupt from exc
    finally:
        if started_here:
            ray.shutdown()
    return combine([result["rows"] for result in results])


__all__ = ["CONNECT_TIMEOUT_S", "ClusterUnreachableError", "check_reachable", "ray_module", "ray_rank_rows"]
