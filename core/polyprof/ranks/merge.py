"""One Chrome trace of every rank of a run: ``polyprof merge``.

``merge_rank_set(rank_set, path, align=...)`` writes one Chrome trace JSON (``.json`` or
``.json.gz``) that Perfetto and ``chrome://tracing`` open as one timeline:

* **One process group per rank.** Each rank's processes (its host process, its GPU lanes, Kineto's
  ``Spans``/``Traces`` lanes) get new process ids ``rank * stride + n`` (n from 1), numbered in the order they
  first appear in the rank's trace; ``stride`` is the smallest power of 10 above any rank's number of
  processes (at least 100). Process names and labels carry the rank (``rank 3: python``, labels
  ``rank 3``), and the sort index is the new process id, so the viewer lists rank 0's processes,
  then rank 1's, and so on. Thread names carry the rank too. Event names are left as they are, so
  tools that group by name still do.
* **Flows stay within their rank.** Flow ids (``id``, ``bind_id``) become ``id * N + rank``, N the world
  size or the largest rank plus one (a string id gets ``@rank N``), so one rank's launch arrows never
  point into another rank, whichever ranks were left out.
* **Clocks aligned.** Each rank's times are made absolute (its ``baseTimeNanoseconds`` plus ``ts``,
  to the nanosecond), then shifted by the alignment:

  - ``wall`` (the default): no shift. Exact when the ranks' clocks agree: ranks on one host share
    a clock; across hosts it is as good as their clock synchronisation (NTP: usually within a
    millisecond; PTP: microseconds).
  - ``step``: each rank is shifted so that the first ``ProfilerStep#N`` that every rank recorded
    starts at the same time as on the rank that started it first. For hosts whose clocks are not
    synchronised; it hides how late a rank really started that step.

  The merged trace's ``baseTimeNanoseconds`` is the earliest shifted event, and every ``ts`` is
  relative to it with three decimals, as Kineto writes them. Each rank's shift is in the trace's
  ``polyprofMerge`` key, with the ranks and their source files.

One rank's trace is in memory at a time, and the file is written atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np
import orjson

from polyprof.base.errors import PolyprofError
from polyprof.base.fileio import atomic_writer, check_writable_path
from polyprof.base.kineto_format import (
    MERGE_KEY,
    PROCESS_LABELS,
    PROCESS_NAME,
    PROCESS_SORT_INDEX,
    THREAD_NAME,
    us_to_ns,
)
from polyprof.formats.chrome_reader import StdlibParsedDocument
from polyprof.formats.columnar import chrome_from_table, read_parquet_table, top_level_of
from polyprof.ranks.rank_set import RankSet

ALIGNMENTS = ("wall", "step")
_STEP_PREFIX = "ProfilerStep#"


class AlignmentError(PolyprofError, ValueError):
    """The alignment asked for cannot be done with these traces."""


class MergeWriteError(PolyprofError, OSError):
    """The merged trace could not be written (the disk is full, ...); nothing is left at its path."""


@attrs.frozen
class MergeSummary:
    path: str
    ranks: tuple[int, ...]
    events: int
    align: str
    shifts_ns: tuple[tuple[int, int], ...]


def _base_ns(top: dict[str, Any]) -> int:
    base = top.get("baseTimeNanoseconds")
    return base if type(base) is int else 0


def _rank_times(parquet: str) -> tuple[int, dict[int, int] | None, int | None]:
    """(base ns, absolute start ns of each ProfilerStep#N, absolute ns of the earliest event)."""
    table = read_parquet_table(parquet, columns=["ph", "name", "ts"])
    top = top_level_of(table.schema.metadata or {})
    base = _base_ns(top)
    ts = table.column("ts").to_numpy(zero_copy_only=False)
    finite = np.isfinite(ts)
    earliest = base + int(us_to_ns(ts[finite]).min()) if finite.any() else None
    steps: dict[int, int] = {}
    names = table.column("name").to_pylist()
    phases = table.column("ph").to_pylist()
    for name, ph, t, ok in zip(names, phases, ts.tolist(), finite.tolist(), strict=True):
        if ok and ph == "X" and isinstance(name, str) and name.startswith(_STEP_PREFIX):
            number = name[len(_STEP_PREFIX) :]
            if number.isdigit():
                start = base + int(us_to_ns([t])[0])
                steps[int(number)] = min(start, steps.get(int(number), start))
    return base, steps, earliest


def _shifts(
    rank_set: RankSet, align: str, times: dict[int, tuple[int, dict[int, int] | None, int | None]]
) -> dict[int, int]:
    if align == "wall":
        return {r.rank: 0 for r in rank_set.ranks}
    step_sets = [set(times[r.rank][1] or ()) for r in rank_set.ranks]
    common = set.intersection(*step_sets) if step_sets else set()
    if not common:
        raise AlignmentError(
            "--align step needs a ProfilerStep#N that every rank recorded, and there is none "
            "(profile with a schedule and call step(), or use --align wall)"
        )
    first = min(common)
    starts = {r.rank: (times[r.rank][1] or {})[first] for r in rank_set.ranks}
    target = min(starts.values())
    return {rank: target - start for rank, start in starts.items()}


def _stride(process_counts: list[int]) -> int:
    stride = 100
    while stride <= max(process_counts, default=0) + 1:
        stride *= 10
    return stride


def _is_time(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == value
        and abs(value) != float("inf")
    )


def _flow_id(value: Any, rank: int, ranks: int) -> Any:
    if type(value) is int:
        return value * ranks + rank
    return f"{value}@rank {rank}"


def _rank_events(
    events: list[dict[str, Any]], rank: int, ranks: int, stride: int, base: int, shift: int, merged_base: int
) -> Iterator[dict[str, Any]]:
    """One rank's events, renumbered into its process group and put on the merged clock."""
    new_pid: dict[Any, int] = {}
    named: set[int] = set()
    sorted_: set[int] = set()

    def pid_of(old: Any) -> int:
        pid = new_pid.get(old)
        if pid is None:
            pid = new_pid[old] = rank * stride + len(new_pid) + 1  # never 0, which some viewers take as idle
        return pid

    offset = base + shift - merged_base
    timed = [i for i, e in enumerate(events) if _is_time(e.get("ts"))]
    new_ts = ((us_to_ns([events[i]["ts"] for i in timed]) + offset) / 1000.0).tolist() if timed else []
    for i, value in zip(timed, new_ts, strict=True):
        events[i]["ts"] = value  # the nearest double to the 3-decimal µs: orjson writes those digits
    for event in events:
        if "pid" in event:
            event["pid"] = pid_of(event["pid"])
        for key in ("id", "bind_id"):
            if key in event:
                event[key] = _flow_id(event[key], rank, ranks)
        if event.get("ph") == "M":
            args = event.get("args")
            if not isinstance(args, dict):
                args = {}
            name = event.get("name")
            if name == PROCESS_NAME:
                args["name"] = f"rank {rank}: {args.get('name', '')}"
                named.add(event.get("pid", -1))
            elif name == PROCESS_LABELS:
                labels = args.get("labels")
                args["labels"] = f"rank {rank}" + (f", {labels}" if labels else "")
            elif name == PROCESS_SORT_INDEX:
                args["sort_index"] = event.get("pid", 0)
                sorted_.add(event.get("pid", -1))
            elif name == THREAD_NAME:
                args["name"] = f"rank {rank}: {args.get('name', '')}"
            event["args"] = args
        yield event
    first_ts = max(offset, 0) / 1000.0
    for old, pid in new_pid.items():
        if pid not in named:  # lanes Kineto names by their pid ("Spans", "Traces")
            yield _metadata(PROCESS_NAME, pid, first_ts, "name", f"rank {rank}: {_lane_name(old)}")
        if pid not in sorted_:  # ranks in order, each rank's processes in their first-seen order
            yield _metadata(PROCESS_SORT_INDEX, pid, first_ts, "sort_index", pid)


def _lane_name(pid: Any) -> str:
    """The name of a process the trace does not name: Kineto's lanes are named by their pid; its
    global instant events (``pid ""``, as on every rank's trace) are the rank's own."""
    if isinstance(pid, str):
        return pid if pid.strip() else "global"
    return f"process {pid}"


def _metadata(name: str, pid: int, ts: float, key: str, value: Any) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": 0, "ts": ts, "args": {key: value}}


def merge_rank_set(rank_set: RankSet, path: str | os.PathLike[str], *, align: str = "wall") -> MergeSummary:
    """Write the merged trace of ``rank_set`` at ``path``; see the module notes."""
    if align not in ALIGNMENTS:
        raise ValueError(f"align {align!r} is not one of {', '.join(ALIGNMENTS)}")
    path = check_writable_path(path)
    times = {r.rank: _rank_times(r.parquet) for r in rank_set.ranks}
    shifts = _shifts(rank_set, align, times)
    earliest = [first + shifts[rank] for rank, (_, _, first) in times.items() if first is not None]
    merged_base = min(earliest) if earliest else 0
    # flow ids are spread by the run's size, not the ranks kept: with ranks 0, 1 and 3 kept, rank 0's
    # id 1 and rank 3's id 0 would otherwise meet
    ranks = max([rank_set.world_size or 0, *(r.rank + 1 for r in rank_set.ranks)])
    process_counts = []
    for r in rank_set.ranks:
        table = read_parquet_table(r.parquet, columns=["pid", "pid_label"])
        pids = set(table.column("pid").to_pylist()) | set(table.column("pid_label").to_pylist())
        process_counts.append(len(pids - {None}) + 2)  # room for lanes without a pid of their own
    stride = _stride(process_counts)
    header = {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": merged_base,
        MERGE_KEY: {
            "align": align,
            "ranks": [
                {"rank": r.rank, "source": r.source, "shift_ns": shifts[r.rank], "pid_base": r.rank * stride}
                for r in rank_set.ranks
            ],
            "world_size": rank_set.world_size,
            "backend": rank_set.backend,
        },
    }
    try:
        count = _write_merged(rank_set, path, header, (ranks, stride, shifts, merged_base))
    except OSError as exc:
        if isinstance(exc, PolyprofError):
            raise
        raise MergeWriteError(f"cannot write {path!r}: {exc.strerror or exc}") from exc
    return MergeSummary(
        path=path,
        ranks=tuple(r.rank for r in rank_set.ranks),
        events=count,
        align=align,
        shifts_ns=tuple(sorted(shifts.items())),
    )


def _write_merged(
    rank_set: RankSet, path: str, header: dict[str, Any], layout: tuple[int, int, dict[int, int], int]
) -> int:
    """Write the merged trace, one rank at a time, atomically; returns the number of events."""
    ranks, stride, shifts, merged_base = layout
    count = 0
    with atomic_writer(path, binary=True) as out:
        text = _stdlib_json(header)  # file names may hold what orjson refuses (undecodable bytes)
        out.write(text[:-1] + b',"traceEvents":[\n')
        separator = b""
        for r in rank_set.ranks:
            doc = chrome_from_table(read_parquet_table(r.parquet), where=r.parquet)
            events = doc.get("traceEvents", [])
            dumps = _encoder_for(doc)
            lines = [
                dumps(event)
                for event in _rank_events(
                    events, r.rank, ranks, stride, _base_ns(doc), shifts[r.rank], merged_base
                )
            ]
            if lines:
                out.write(separator + b",\n".join(lines))
                separator = b",\n"
            count += len(lines)
            del doc, events, lines
        out.write(b'\n],"traceName":' + _stdlib_json(path) + b"}\n")
    return count


def _stdlib_json(value: Any) -> bytes:
    # ASCII escapes keep lone surrogates valid JSON; NaN and Infinity as Python (and Kineto) write them
    return json.dumps(value, allow_nan=True, separators=(",", ":")).encode()


def _encoder_for(doc: dict[str, Any]) -> Callable[[Any], bytes]:
    """orjson, unless the rank's trace holds what only Python's parser read (lone surrogates, NaN,
    integers past 64 bits): then Python's encoder, which writes those back as they were."""
    return _stdlib_json if isinstance(doc, StdlibParsedDocument) else orjson.dumps


__all__ = ["ALIGNMENTS", "AlignmentError", "MergeSummary", "MergeWriteError", "merge_rank_set"]
