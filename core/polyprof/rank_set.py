"""The traces of one distributed run, one per rank: found, read, checked, and as Parquet.

``collect_rank_set(paths, parquet_dir)`` takes trace files and directories (``.json``,
``.json.gz``, ``.parquet``, mixed), converts each JSON trace to a Parquet trace in ``parquet_dir``
(one at a time, so memory stays that of one trace), reads each file's rank and run facts from its
metadata, and keeps one trace per rank of one run. What it leaves out is named, with the reason, in
``RankSet.skipped``:

* a file that cannot be read (corrupt, truncated, not a trace): skipped;
* a trace whose world size or backend differs from most traces' (another run): skipped;
* a trace that started more than ``SAME_RUN_WINDOW_NS`` away from the median start of the others
  (another run with the same world size): skipped;
* a second trace of a rank already kept (files in name order; a later profiling cycle of the same
  rank, or a copy): skipped;
* a trace without ``distributedInfo`` (a single-process profile): kept only when no trace has
  one, numbered 0, 1, ... in file name order.

Nothing is written but the Parquet files, each atomically.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections import Counter
from collections.abc import Iterable
from typing import Any

import attrs

from polyprof.chrome_reader import TraceFileError
from polyprof.cli_convert import sources_of, trace_suffix
from polyprof.columnar import (
    EVENTS_POSITION_KEY,
    FORMAT,
    FORMAT_KEY,
    is_parquet_path,
    json_trace_table,
    pyarrow_modules,
    top_level_of,
    write_parquet_table,
)
from polyprof.errors import PolyprofError

#: Ranks of one run start profiling within this of each other (the job's launch skew and the
#: schedule's wait steps); a trace farther from the others' median start is another run's.
SAME_RUN_WINDOW_NS = 30 * 60 * 10**9


class NoTracesError(PolyprofError, ValueError):
    """Nothing to analyse: no trace files, or none readable."""


@attrs.frozen
class RankTrace:
    """One rank's trace: where it came from, the Parquet file read, and its run facts."""

    source: str
    parquet: str
    rank: int
    world_size: int | None
    backend: str | None
    #: When the trace's first event started, in ns since the epoch (baseTimeNanoseconds + ts).
    start_ns: int | None
    events: int


@attrs.frozen
class Skipped:
    path: str
    reason: str


@attrs.frozen
class RankSet:
    ranks: tuple[RankTrace, ...]
    skipped: tuple[Skipped, ...]
    #: True when the ranks come from the traces' distributedInfo, False when numbered by file order.
    ranks_from_traces: bool

    @property
    def world_size(self) -> int | None:
        sizes = {r.world_size for r in self.ranks}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def backend(self) -> str | None:
        backends = {r.backend for r in self.ranks}
        return backends.pop() if len(backends) == 1 else None


def _top_level(parquet: str) -> tuple[dict[str, Any], int]:
    """The trace's top-level keys and its number of events, from the Parquet file's footer only."""
    _, pq = pyarrow_modules()
    try:
        meta = pq.ParquetFile(parquet).metadata
        kv = meta.metadata or {}
        if kv.get(FORMAT_KEY, b"").decode(errors="replace") != FORMAT or EVENTS_POSITION_KEY not in kv:
            raise ValueError(f"not a {FORMAT} Parquet trace")
        top = top_level_of(kv)
    except Exception as exc:  # pyarrow's own errors and bad metadata alike: this file is unusable
        raise TraceFileError(parquet, f"not a readable polyprof Parquet trace: {exc}") from exc
    return top, int(meta.num_rows)


def _start_ns(parquet: str, top: dict[str, Any]) -> int | None:
    _, pq = pyarrow_modules()
    column = pq.read_table(parquet, columns=["ts"]).column("ts")
    import pyarrow.compute as pc

    finite = pc.filter(column, pc.is_finite(column))
    first = pc.min(finite).as_py() if len(finite) else None
    base = top.get("baseTimeNanoseconds")
    if first is None:
        return None
    base_ns = base if isinstance(base, int) and not isinstance(base, bool) else 0
    return base_ns + round(first * 1000)


def _as_parquet(source: str, parquet_dir: str, taken: set[str]) -> str:
    if is_parquet_path(source):
        return source
    stem = os.path.basename(source)
    stem = stem[: len(stem) - len(trace_suffix(stem) or "")]
    # a.json and a.json.gz of this run get two names; a file of an earlier run is replaced
    target = os.path.join(parquet_dir, f"{stem}.parquet")
    n = 1
    while target in taken:
        n += 1
        target = os.path.join(parquet_dir, f"{stem}.{n}.parquet")
    taken.add(target)
    # as polyprof convert does: the compiled column builder where it is built (TraceFileError naming
    # the source where the file is not a Chrome trace)
    return write_parquet_table(json_trace_table(source), target)


def _read_one(source: str, parquet_dir: str, taken: set[str]) -> RankTrace:
    parquet = _as_parquet(source, parquet_dir, taken)
    top, events = _top_level(parquet)
    info = top.get("distributedInfo")
    rank = world_size = backend = None
    if isinstance(info, dict):
        rank = info.get("rank") if type(info.get("rank")) is int else None
        world_size = info.get("world_size") if type(info.get("world_size")) is int else None
        backend = str(info["backend"]) if info.get("backend") is not None else None
    return RankTrace(
        source=source,
        parquet=parquet,
        rank=-1 if rank is None else rank,
        world_size=world_size,
        backend=backend,
        start_ns=_start_ns(parquet, top),
        events=events,
    )


def _most_common(values: Iterable[Any]) -> Any:
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], str(v))) if counts else None


def collect_rank_set(paths: list[str], parquet_dir: str) -> RankSet:
    """Find, read and check the traces in ``paths``; see the module notes. Raises ``NoTracesError``."""
    sources = sources_of(paths)
    if not sources:
        raise NoTracesError(f"no traces (.json, .json.gz, .parquet) in {', '.join(paths)}")
    os.makedirs(parquet_dir, exist_ok=True)
    read: list[RankTrace] = []
    skipped: list[Skipped] = []
    taken: set[str] = set()
    for source in sources:
        if not os.path.exists(source):
            skipped.append(Skipped(source, "no such file"))
            continue
        try:
            read.append(_read_one(source, parquet_dir, taken))
        except (PolyprofError, OSError) as exc:
            skipped.append(Skipped(source, str(exc).removeprefix(f"{source}: ")))
        except Exception as exc:  # noqa: BLE001 - any other failure of one file: named, the others go on
            skipped.append(Skipped(source, f"could not be read: {type(exc).__name__}: {exc}"))
    if not read:
        raise NoTracesError(
            f"none of the {len(sources)} trace files in {', '.join(paths)} could be read: "
            + "; ".join(f"{s.path}: {s.reason}" for s in skipped)
        )
    with_rank = [r for r in read if r.rank >= 0]
    if not with_rank:  # single-process profiles: numbered in file order
        ranks = tuple(attrs.evolve(r, rank=i, world_size=len(read)) for i, r in enumerate(read))
        return RankSet(ranks=ranks, skipped=tuple(skipped), ranks_from_traces=False)
    for r in read:
        if r.rank < 0:
            skipped.append(Skipped(r.source, "no rank: the trace has no distributedInfo, the others do"))
    world_size = _most_common(r.world_size for r in with_rank)
    backend = _most_common(r.backend for r in with_rank)
    starts = [r.start_ns for r in with_rank if r.start_ns is not None]
    median_start = statistics.median(starts) if starts else None
    kept: dict[int, RankTrace] = {}
    for r in with_rank:
        if r.world_size != world_size or r.backend != backend:
            skipped.append(
                Skipped(
                    r.source,
                    f"from another run: world size {r.world_size}, backend {r.backend}; most traces "
                    f"have world size {world_size}, backend {backend}",
                )
            )
        elif world_size is not None and not 0 <= r.rank < world_size:
            skipped.append(Skipped(r.source, f"rank {r.rank} is outside world size {world_size}"))
        elif (
            median_start is not None
            and r.start_ns is not None
            and abs(r.start_ns - median_start) > SAME_RUN_WINDOW_NS
        ):
            minutes = abs(r.start_ns - median_start) / 60e9
            skipped.append(
                Skipped(r.source, f"from another run: it started {minutes:.0f} minutes from the others")
            )
        elif r.rank in kept:
            skipped.append(Skipped(r.source, f"rank {r.rank} again: {kept[r.rank].source} is kept"))
        else:
            kept[r.rank] = r
    ranks = tuple(sorted(kept.values(), key=lambda r: r.rank))
    return RankSet(ranks=ranks, skipped=tuple(skipped), ranks_from_traces=True)


def temporary_parquet_dir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="polyprof-report-")


__all__ = [
    "SAME_RUN_WINDOW_NS",
    "NoTracesError",
    "RankSet",
    "RankTrace",
    "Skipped",
    "collect_rank_set",
    "temporary_parquet_dir",
]
