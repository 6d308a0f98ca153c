"""Cross-rank analysis of Parquet traces on DuckDB: ops, kernels and steps of every rank.

The queries run inside DuckDB over the ranks' Parquet files (``polyprof.formats.columnar``); DuckDB
streams them and spills to disk past its memory limit, so a run larger than memory is analysed
with bounded memory. What comes out is small: one row per (rank, op), (rank, kernel), (rank, step).

**Ops** are a rank's host events (``ph`` ``X``; categories ``cpu_op``, ``user_annotation``,
``python_function``, ``overhead`` and ``*_runtime`` / ``*_driver``), without the names torch's
``_filter_name`` drops, named as torch's ``key_averages`` names them (``ProfilerStep#N`` is
``ProfilerStep*``). Per rank and name: calls, CPU total (sum of durations) and self CPU (each
event's duration less its children's), as torch's ``EventList`` computes them:

* DuckDB filters and sorts one rank's host rows at a time into torch's order per thread (process
  and thread, start, longer first, file order); an event's parent is then what torch's stack walk
  (``_populate_cpu_children``) gives, ranges that overlap without nesting included
  (``polyprof.analysis.tree.nesting_parents``, the function polyprof's own tree uses); c10d's async
  collective ranges (``gloo:all_reduce``, ...: ``chrome_reader.is_async_work_name``) are in no
  stack and have no self time, as in torch;
* torch's ``_remove_dup_nodes`` folds an event into its parent when the parent has the same name
  and no other child: such events do not count as calls nor in CPU total, and since they share the
  name their self time stays in the name's self total.

Times are converted to integer nanoseconds as polyprof's trace reader converts them
(``kineto_format.us_to_ns``: exact for the three decimals Kineto writes). DuckDB sorts by the
doubles, whose order is the nanoseconds' order. The differential tests compare every (rank, op)
with polyprof's ``key_averages`` of that rank's trace, which matches torch's table.

**Kernels** are device events (categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``): per rank and
name, count and total duration. **Steps** are ``ProfilerStep#N`` annotations: per rank and step,
the duration. **Overlap**, per rank with kernels: communication kernels are those whose name holds
``nccl`` or ``rccl`` (any case; HTA's measure, whose kernel classes differ in details between its
versions), computation kernels the others (memcpy and memset are
neither); the time covered by each (the union of their intervals over all streams) and by both at
once, exactly, in nanoseconds. Overlap is the share of communication time that computation covered,
as HTA's ``get_comm_comp_overlap`` reports it.

**Files and failures.** DuckDB reads a file name holding ``*``, ``?`` or ``[`` as a glob; each
rank's file reaches it under a name it reads literally (``literal_path``). A rank whose analysis
raises is left out, named by the user's trace with a one-line reason (``failure_reason``: out of
memory names the memory limit), never for Ctrl-C: DuckDB turns SIGINT into an error, raised here
as ``KeyboardInterrupt``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np

from polyprof.analysis.tree import FILTERED_NAMES, nesting_parents, post_processing_rules
from polyprof.base.errors import PolyprofError
from polyprof.base.kineto_format import us_to_ns
from polyprof.base.log import get_logger
from polyprof.formats.chrome_reader import is_async_work_name
from polyprof.ranks.rank_set import RankSet, Skipped, temporary_parquet_dir

log = get_logger(__name__)

_Result = TypeVar("_Result")

_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
#: Communication kernels, by HTA's rule: NCCL's and RCCL's.
_COMMUNICATION = re.compile(r"nccl|rccl", re.IGNORECASE)


class EngineUnavailableError(PolyprofError, ImportError):
    """The analysis engine asked for is not installed."""


def duckdb_module() -> Any:
    try:
        import duckdb
    except ImportError as exc:
        raise EngineUnavailableError(
            "the many-rank report needs DuckDB, which is not installed: pip install 'polyprof[analysis]' "
            f"({exc})"
        ) from exc
    return duckdb


@attrs.frozen
class RankOp:
    """One op name on one rank."""

    rank: int
    name: str
    calls: int
    self_us: float
    total_us: float


@attrs.frozen
class RankKernel:
    rank: int
    name: str
    category: str
    calls: int
    total_us: float


@attrs.frozen
class RankStep:
    rank: int
    step: int
    duration_us: float


@attrs.frozen
class RankOverlap:
    """One rank's GPU kernels: time computing, time communicating, and both at once (µs)."""

    rank: int
    compute_us: float
    communication_us: float
    overlapped_us: float

    @property
    def overlap(self) -> float | None:
        """The share of communication time that computation overlapped (HTA's comm/comp overlap)."""
        return self.overlapped_us / self.communication_us if self.communication_us else None


@attrs.frozen
class RankRows:
    """What the engine computes: the per-rank rows everything else is derived from."""

    ops: tuple[RankOp, ...]
    kernels: tuple[RankKernel, ...]
    steps: tuple[RankStep, ...]
    overlap: tuple[RankOverlap, ...] = ()
    #: Ranks whose analysis failed (a file damaged past what its footer showed, out of memory):
    #: named by the user's trace, left out.
    failed: tuple[tuple[int, Skipped], ...] = ()


_HOST_CATEGORIES = ("cpu_op", "operator", "user_annotation", "python_function", "overhead")
_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


#: What makes DuckDB read a file name as a glob (its ``FileSystem::HasGlob``; ``{`` is literal to it).
#: A name without them is read as it is, backslashes included: a separator on Windows, a character
#: elsewhere (DuckDB 2.0.1). Only a glob splits at a backslash on every system.
_GLOB_CHARACTERS = frozenset("*?[")


def _glob_escaped(path: str) -> str:
    """``path`` as a DuckDB glob matching only itself: each glob character in brackets (``[[]``)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def _link(target: str, link: str) -> None:
    """A symbolic link (one a SIGKILL leaves behind keeps no trace's bytes alive), else a hard link."""
    try:
        os.symlink(target, link)
    except OSError:  # a system where symbolic links need a privilege
        os.link(target, link)


@contextlib.contextmanager
def literal_path(path: str) -> Iterator[str]:
    """A name under which DuckDB reads the file ``path`` and nothing else.

    DuckDB reads a file name holding ``*``, ``?`` or ``[`` as a glob (``rank[01].parquet`` is
    rank0 and rank1) and has no switch to turn that off; escaping in brackets needs the folder
    listed and fails past a backslash. So such a name is read through a link with a plain name in a
    private temporary folder, removed afterwards; any other name, a Windows path's backslashes
    included, is given as it is (a link there may need a privilege, or cross drives). The path is
    made absolute, as DuckDB would take a leading ``~`` for the home folder and look a relative name
    up on its ``file_search_path``.
    """
    absolute = os.path.abspath(path)
    if _GLOB_CHARACTERS.isdisjoint(absolute):
        yield absolute
        return
    # a folder a killed command left is removed by the next, as the Parquet copies' folder is
    with temporary_parquet_dir() as folder:
        link = os.path.join(folder, "rank.parquet")
        _link(absolute, link)
        yield _glob_escaped(link)  # the temporary folder's own name is the system's


def _events_sql(path: str) -> str:
    """One rank's events, each with its row number in the file (torch's order breaks ties by it).
    ``path`` is taken as a glob: give it a ``literal_path``."""
    quoted = "'" + path.replace("'", "''") + "'"
    return f"select *, file_row_number as rid from read_parquet({quoted}, file_row_number = true)"


def _host_rows_sql(events: str) -> str:
    """One rank's host rows, per thread in torch's order: start, longer first, file order."""
    host = (
        f"cat in ({_sql_list(_HOST_CATEGORIES)}) "
        "or cat like '%\\_runtime' escape '\\' or cat like '%\\_driver' escape '\\'"
    )
    return f"""
    with events as ({events})
    select name, coalesce(pid, 0) as pid, coalesce(tid, 0) as tid, ts, dur,
           cat = 'python_function' as python, cat = 'user_annotation' as annotation
    from events
    where ph = 'X' and ({host}) and name is not null
      and ts is not null and dur is not null and isfinite(ts) and isfinite(dur) and dur >= 0
      and name not in ({_sql_list(sorted(FILTERED_NAMES))})
    order by pid, tid, ts, dur desc, rid
    """


def _sums(codes: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Exact integer sums of ``values`` per code (float64 holds every sum of ns below 2**53: 104 days)."""
    return np.rint(np.bincount(codes, weights=values, minlength=size)).astype(np.int64)


def _encoded(column: Any) -> tuple[np.ndarray, list[str]]:
    """A string column as (codes, table of distinct strings): Arrow's dictionary encoding, in C++."""
    encoded = column.combine_chunks().dictionary_encode() if column.num_chunks else column
    if not hasattr(encoded, "indices"):
        return np.zeros(0, np.int64), []
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def _ops_of_rank(
    rank: int,
    codes: np.ndarray,
    table: list[str],
    pid: np.ndarray,
    tid: np.ndarray,
    start: np.ndarray,
    duration: np.ndarray,
    counted: np.ndarray,
    asynchronous: np.ndarray,
) -> list[RankOp]:
    """Calls, CPU total and self CPU per name of one rank's sorted host rows (see the module notes)."""
    n = len(codes)
    if n == 0:
        return []
    # rows come sorted by process and thread: a lane is a run of equal (pid, tid)
    lane = np.cumsum(np.r_[False, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])])
    nested = np.flatnonzero(~asynchronous)  # torch's stacks leave async rows out
    found = nesting_parents(start[nested], start[nested] + duration[nested], lane[nested])
    parent = np.full(n, -1, dtype=np.int64)
    parent[nested[found >= 0]] = nested[found[found >= 0]]
    has = parent >= 0
    children_ns = _sums(parent[has], duration[has], n)
    child_count = np.bincount(parent[has], minlength=n)
    # torch's _remove_dup_nodes: the only child of a same-named parent folds into it
    folded = np.zeros(n, bool)
    folded[has] = (child_count[parent[has]] == 1) & (codes[parent[has]] == codes[has])
    kept = ~folded & counted
    calls = np.bincount(codes[kept], minlength=len(table))
    total_ns = _sums(codes[kept], duration[kept], len(table))
    own_ns = np.where(asynchronous, 0, duration - children_ns)  # async rows have no self time
    self_by_name = _sums(codes[counted], own_ns[counted], len(table))
    by_key: dict[str, list[int]] = {}
    for code, name in enumerate(table):
        entry = by_key.setdefault(_STEP_NAME.sub("ProfilerStep*", name), [0, 0, 0])
        entry[0] += int(calls[code])
        entry[1] += int(self_by_name[code])
        entry[2] += int(total_ns[code])
    return [
        RankOp(rank=rank, name=key, calls=c, self_us=self_ns / 1000.0, total_us=total / 1000.0)
        for key, (c, self_ns, total) in sorted(by_key.items())
        if c > 0
    ]


def _steps_of_rank(rank: int, codes: np.ndarray, table: list[str], duration: np.ndarray) -> list[RankStep]:
    """Each ``ProfilerStep#N``'s duration (summed if a step appears twice) from the rank's host rows."""
    numbers = np.array(
        [int(m[1]) if (m := _STEP_NAME.match(name)) else -1 for name in table] + [-1], np.int64
    )
    step_of_row = numbers[codes] if len(codes) else np.zeros(0, np.int64)
    is_step = step_of_row >= 0
    if not is_step.any():
        return []
    steps, inverse = np.unique(step_of_row[is_step], return_inverse=True)
    totals = _sums(inverse, duration[is_step], len(steps))
    return [
        RankStep(rank, int(step), total / 1000.0)
        for step, total in zip(steps.tolist(), totals.tolist(), strict=True)
    ]


def _device_rows_sql(events: str) -> str:
    return f"""
    with events as ({events})
    select name, cat, ts, dur
    from events
    where ph = 'X' and cat in ({_sql_list(_DEVICE_CATEGORIES)}) and name is not null
      and ts is not null and dur is not null and isfinite(ts) and isfinite(dur) and dur >= 0
    """


def _kernels_of_rank(rank: int, device: Any) -> list[RankKernel]:
    name_codes, names = _encoded(device.column("name"))
    cat_codes, cats = _encoded(device.column("cat"))
    if not len(name_codes):
        return []
    pair = name_codes * len(cats) + cat_codes
    pairs, inverse = np.unique(pair, return_inverse=True)
    duration = us_to_ns(device.column("dur").to_numpy())
    counts = np.bincount(inverse, minlength=len(pairs))
    totals = _sums(inverse, duration, len(pairs))
    rows = [
        RankKernel(rank, names[p // len(cats)], cats[p % len(cats)], int(c), t / 1000.0)
        for p, c, t in zip(pairs.tolist(), counts.tolist(), totals.tolist(), strict=True)
    ]
    return sorted(rows, key=lambda k: (k.name, k.category))


def _covered(starts: np.ndarray, ends: np.ndarray, a: np.ndarray) -> tuple[int, int, int]:
    """(time covered by the ``a`` intervals, by the others, by both at once), in the unit given."""
    times = np.concatenate([starts, ends])
    in_a = np.concatenate([np.where(a, 1, 0), np.where(a, -1, 0)])
    in_b = np.concatenate([np.where(a, 0, 1), np.where(a, 0, -1)])
    order = np.argsort(times, kind="stable")
    times, count_a, count_b = times[order], np.cumsum(in_a[order]), np.cumsum(in_b[order])
    length = np.diff(times)
    a_on, b_on = count_a[:-1] > 0, count_b[:-1] > 0
    return int(length[a_on].sum()), int(length[b_on].sum()), int(length[a_on & b_on].sum())


def _overlap_of_rank(rank: int, device: Any) -> RankOverlap | None:
    """Kernels only (memcpy and memset are neither computation nor communication), of some length."""
    codes, names = _encoded(device.column("name"))
    cat_codes, cats = _encoded(device.column("cat"))
    duration = us_to_ns(device.column("dur").to_numpy())
    kernel = (
        np.array([c == "kernel" for c in cats] + [False], bool)[cat_codes]
        if len(cat_codes)
        else np.zeros(0, bool)
    )
    kernel &= duration > 0
    if not kernel.any():
        return None
    communication_names = np.array([_COMMUNICATION.search(n) is not None for n in names] + [False], bool)
    starts = us_to_ns(device.column("ts").to_numpy())[kernel]
    comm_ns, compute_ns, both_ns = _covered(
        starts, starts + duration[kernel], communication_names[codes[kernel]]
    )
    return RankOverlap(
        rank=rank,
        compute_us=compute_ns / 1000.0,
        communication_us=comm_ns / 1000.0,
        overlapped_us=both_ns / 1000.0,
    )


def rows_of_rank(connection: Any, path: str, rank: int) -> RankRows:
    """The rows of one rank's Parquet trace, computed with ``connection`` (DuckDB): the unit of work
    both engines run, one rank's rows in memory at a time. Two scans of the file: host rows, sorted
    into torch's order by DuckDB, and device rows."""
    with literal_path(path) as literal:
        events = _events_sql(literal)
        host = connection.sql(_host_rows_sql(events)).to_arrow_table()
        device = connection.sql(_device_rows_sql(events)).to_arrow_table()
    codes, table = _encoded(host.column("name"))
    pid, tid = host.column("pid").to_numpy(), host.column("tid").to_numpy()
    start, duration = us_to_ns(host.column("ts").to_numpy()), us_to_ns(host.column("dur").to_numpy())
    # Python frames nest with the ops; from torch 2.14 key_averages leaves their rows out
    python = host.column("python").to_numpy(zero_copy_only=False).astype(bool)
    skip_python = post_processing_rules().key_averages_skips_python_functions
    counted = ~python if skip_python else np.ones(len(python), bool)
    async_name = np.array([is_async_work_name(name) for name in table] + [False], bool)
    asynchronous = host.column("annotation").to_numpy(zero_copy_only=False).astype(bool) & async_name[codes]
    overlap = _overlap_of_rank(rank, device)
    return RankRows(
        ops=tuple(_ops_of_rank(rank, codes, table, pid, tid, start, duration, counted, asynchronous)),
        kernels=tuple(_kernels_of_rank(rank, device)),
        steps=tuple(_steps_of_rank(rank, codes, table, duration)),
        overlap=() if overlap is None else (overlap,),
    )


def combine(parts: Sequence[RankRows]) -> RankRows:
    """The rows of several ranks as one ``RankRows``, in rank order."""

    def joined(field: str) -> tuple[Any, ...]:
        return tuple(sorted((row for part in parts for row in getattr(part, field)), key=_row_key))

    return RankRows(
        ops=joined("ops"),
        kernels=joined("kernels"),
        steps=joined("steps"),
        overlap=joined("overlap"),
        failed=tuple(sorted((f for part in parts for f in part.failed), key=lambda f: f[0])),
    )


def _duckdb_error(exc: Exception, name: str) -> bool:
    """Whether ``exc`` is the DuckDB exception class ``name`` (where this DuckDB has it)."""
    cls = getattr(sys.modules.get("duckdb"), name, None)
    return isinstance(cls, type) and isinstance(exc, cls)


def is_interrupt(exc: Exception) -> bool:
    """Whether ``exc`` is how DuckDB answers Ctrl-C: it stops the query on SIGINT and raises
    ``RuntimeError: Query interrupted`` (``duckdb.InterruptException`` in other versions) where
    Python would have raised ``KeyboardInterrupt``."""
    if _duckdb_error(exc, "InterruptException"):
        return True
    return isinstance(exc, RuntimeError) and str(exc).strip().lower().startswith("query interrupted")


def out_of_memory_reason(memory_limit: str | None) -> str:
    if memory_limit is None:
        return (
            "DuckDB ran out of memory under its default limit (80% of this machine's memory): "
            "free memory, or analyse the run where there is more"
        )
    return f"DuckDB ran out of memory under --memory-limit {memory_limit}: raise the limit"


def failure_reason(exc: Exception, memory_limit: str | None = None) -> str:
    """Why a rank's analysis failed, in one line."""
    if _duckdb_error(exc, "OutOfMemoryException") or isinstance(exc, MemoryError):
        return out_of_memory_reason(memory_limit)
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"its analysis failed: {type(exc).__name__}: {first_line}"


def failed_rank(rank: int, source: str, reason: str) -> RankRows:
    """The rows of a rank whose analysis failed: none, and why, naming the trace ``source``."""
    return RankRows(ops=(), kernels=(), steps=(), failed=((rank, Skipped(source, reason)),))


def rows_or_failure(
    connection: Any, path: str, rank: int, *, source: str | None = None, memory_limit: str | None = None
) -> RankRows:
    """``rows_of_rank``, or, when it raises, the rank named as failed: one rank never stops the run.

    :param source: the user's trace that ``path`` (its Parquet file) was made from, named in the
        failure (default: ``path``).
    :param memory_limit: the connection's, named when DuckDB runs out of memory.
    :raises KeyboardInterrupt: on Ctrl-C, which DuckDB turns into an error: it stops the run, it is
        no rank's failure.
    """
    try:
        return rows_of_rank(connection, path, rank)
    except Exception as exc:  # DuckDB's, pyarrow's and numpy's errors alike: this rank is unusable
        if is_interrupt(exc):
            raise KeyboardInterrupt from exc
        source = path if source is None else source
        # the reason reaches the user as the rank's "skipped" line; the traceback only at -vv
        log.debug("rank_analysis_failed", rank=rank, trace=source, parquet=path, exc_info=True)
        return failed_rank(rank, source, failure_reason(exc, memory_limit))


def _row_key(row: Any) -> tuple[Any, ...]:
    return (row.rank, getattr(row, "name", ""), getattr(row, "category", ""), getattr(row, "step", 0))


def _duckdb_config(memory_limit: str | None, temp_dir: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if memory_limit is not None:
        config["memory_limit"] = memory_limit
    if temp_dir is not None:
        config["temp_directory"] = temp_dir
    return config


def duckdb_rank_rows(
    rank_set: RankSet, *, memory_limit: str | None = None, temp_dir: str | None = None
) -> RankRows:
    """The per-rank rows of ``rank_set``, computed by DuckDB in this process, one rank after another.

    :param memory_limit: DuckDB's ``memory_limit`` (e.g. ``"2GB"``); past it DuckDB spills to
        ``temp_dir``. Default: DuckDB's (80% of the machine's memory).
    """
    with connect(memory_limit=memory_limit, temp_dir=temp_dir) as connection:

        def each_rank(stop: threading.Event) -> RankRows:
            parts = []
            for r in rank_set.ranks:
                if stop.is_set():
                    raise KeyboardInterrupt
                parts.append(
                    rows_or_failure(connection, r.parquet, r.rank, source=r.source, memory_limit=memory_limit)
                )
            return combine(parts)

        return interruptible(connection, each_rank)


#: How often the waiting thread wakes (Windows delivers no Ctrl-C into a lock wait) and, once
#: interrupted, asks DuckDB again to stop, until the worker has stopped.
_INTERRUPT_POLL_S = 0.1


def interruptible(connection: Any, work: Callable[[threading.Event], _Result]) -> _Result:
    """``work(stop)``, which queries ``connection``, on a worker thread while this thread waits in
    Python, where every Ctrl-C (or SIGTERM's exit) lands: it then sets ``stop`` (``work`` checks it
    between its steps), interrupts the connection until the worker has stopped, and is raised here.

    DuckDB stops a query on SIGINT itself only when the signal comes while the query runs; one that
    lands as a query starts is lost, and the query runs on (1 in 10 tries here, DuckDB 2.0.1). It
    drops ``interrupt()`` too when no query runs, hence the repeats.
    """
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="polyprof-duckdb") as worker:
        future = worker.submit(work, stop)
        try:
            while not concurrent.futures.wait([future], timeout=_INTERRUPT_POLL_S).done:
                pass
            return future.result()
        except BaseException:
            stop.set()
            _stop_worker(connection, future)
            raise


def _stop_worker(connection: Any, future: concurrent.futures.Future[Any]) -> None:
    """Interrupt ``connection`` until ``future``'s worker has stopped. A second Ctrl-C meanwhile
    changes nothing: the first is raised once the worker is out of DuckDB and the connection free
    to close (closing it under a running query, or leaving the worker at exit, could crash)."""
    while not future.done():
        try:
            connection.interrupt()
            concurrent.futures.wait([future], timeout=_INTERRUPT_POLL_S)
        except BaseException:  # noqa: BLE001 - a repeated Ctrl-C: the worker is being stopped
            continue


def connect(*, memory_limit: str | None = None, temp_dir: str | None = None) -> Any:
    """A DuckDB connection; a bad ``memory_limit`` is a ``ValueError`` saying so, before any work."""
    duckdb = duckdb_module()
    try:
        return duckdb.connect(config=_duckdb_config(memory_limit, temp_dir))
    except duckdb.Error as exc:
        raise ValueError(f"DuckDB refused its settings (memory limit {memory_limit!r}?): {exc}") from exc


__all__ = [
    "EngineUnavailableError",
    "RankKernel",
    "RankOp",
    "RankOverlap",
    "RankRows",
    "RankStep",
    "combine",
    "connect",
    "duckdb_module",
    "duckdb_rank_rows",
    "failed_rank",
    "failure_reason",
    "is_interrupt",
    "literal_path",
    "out_of_memory_reason",
    "rows_of_rank",
    "rows_or_failure",
]
