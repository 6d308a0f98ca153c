"""Which rank of a distributed job this process is: the trace's ``distributedInfo`` and file names.

``distributed_info()`` is what torch.profiler writes as the trace's ``distributedInfo``
(``torch.profiler.profile._get_distributed_info``): backend, rank, world size, process-group
count and configs, and the NCCL version under NCCL. HolisticTraceAnalysis reads each trace's
rank from it.

``rank_of_process()`` names files per rank: the process group's rank when one is up, else the
``RANK`` and ``WORLD_SIZE`` that launchers (``torchrun``, ``accelerate launch``) set before the
program can make its group, so a trace recorded before ``init_process_group`` is named by rank too.

Nothing here imports torch: when the program has not imported ``torch.distributed``, no process
group can exist.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import attrs

from polyprof.base.log import get_logger

log = get_logger(__name__)


@attrs.frozen
class RankOfProcess:
    """This process's place in a distributed job."""

    rank: int
    world_size: int

    @property
    def label(self) -> str:
        """``rank07`` in a job of 8 to 99 ranks: zero-padded so that file names sort by rank."""
        digits = len(str(max(self.world_size - 1, 0)))
        return f"rank{self.rank:0{digits}d}"


def _initialised_group() -> Any:
    """``torch.distributed`` when a default process group is up, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        return dist if dist.is_available() and dist.is_initialized() else None
    except Exception:  # noqa: BLE001 - a torn-down or half-built group counts as none
        return None


def distributed_info() -> dict[str, Any] | None:
    """The ``distributedInfo`` torch.profiler writes, or None when no process group is up."""
    dist = _initialised_group()
    if dist is None:
        return None
    try:
        backend = str(dist.get_backend())
        info: dict[str, Any] = {
            "backend": backend,
            "rank": int(dist.get_rank()),
            "world_size": int(dist.get_world_size()),
            "pg_count": int(dist.get_pg_count()),
            "pg_config": dist.distributed_c10d._get_all_pg_configs(),
        }
        if backend == "nccl":
            import torch  # imported already: torch.distributed is

            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception as exc:  # noqa: BLE001 - a half-torn-down process group must not lose the trace
        log.warning("distributed_info_failed", error=repr(exc))
        return None
    return info


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def rank_of_process() -> RankOfProcess | None:
    """This process's rank and world size, from its process group or its launcher; None outside a job."""
    dist = _initialised_group()
    if dist is not None:
        try:
            return RankOfProcess(rank=int(dist.get_rank()), world_size=int(dist.get_world_size()))
        except Exception:  # noqa: BLE001 - fall back to what the launcher said
            pass
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None or world_size is None or not 0 <= rank < world_size:
        return None
    return RankOfProcess(rank=rank, world_size=world_size)


def rank_of_trace(metadata_json: dict[str, str]) -> RankOfProcess | None:
    """The rank a trace's ``distributedInfo`` names (metadata as raw JSON text), or None."""
    try:
        info = json.loads(metadata_json.get("distributedInfo", "null"))
        rank, world_size = info["rank"], info["world_size"]
    except (ValueError, TypeError, KeyError):
        return None
    if type(rank) is not int or type(world_size) is not int or not 0 <= rank < world_size:
        return None
    return RankOfProcess(rank=rank, world_size=world_size)


def default_worker_name(hostname: str, pid: int, rank: RankOfProcess | None = None) -> str:
    """torch's ``<hostname>_<pid>``, led by the rank in a distributed job: ``rank03_<hostname>_<pid>``.

    :param rank: the rank when the caller knows it (a trace's ``distributedInfo``); else this
        process's, from its group or its launcher.
    """
    worker = f"{hostname}_{pid}"
    rank = rank or rank_of_process()
    return worker if rank is None else f"{rank.label}_{worker}"
