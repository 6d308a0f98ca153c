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
  one, numbered 0, 1, ... in file name order;
* a trace whose ``distributedInfo.rank`` is not a rank (``"1"``, ``1.0``, ``-1``): skipped, saying so.

Nothing is written but the Parquet files, each atomically, and never over a file this run reads: a
JSON trace ``r.json`` becomes ``r.parquet`` in ``parquet_dir`` (replacing an earlier run's
conversion there), or ``r.2.parquet``, ``r.3.parquet``, ... when that name is taken by another trace
of this run or is itself one of the traces read. Reasons name the user's files, never the Parquet
copies.

``temporary_parquet_dir()`` is the folder for a command's Parquet copies when it keeps none:
``$TMPDIR/polyprof-report-<host tag>-<pid>-<random>``, removed at the command's end. It holds a lock
file that its command flocks while it runs, as ``polyprof.base.fileio``'s temporary files are: a command
killed by SIGKILL leaves its folder unlocked, and the next ``temporary_parquet_dir()`` on this host
removes it. ``sigterm_exits()`` makes SIGTERM end a command as an exception does, so that its
folder is removed. Python runs the handler between bytecodes of the main thread: during DuckDB's
analysis that thread waits in Python (``rank_analysis.interruptible``), so SIGTERM ends the command
at once; during the conversion of a JSON trace (one call into the compiled builder), once that
trace is converted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import stat
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from polyprof.base.errors import PolyprofError
from polyprof.base.fileio import OutputPathError, file_ids, host_tag, prepare_output_directory
from polyprof.base.kineto_format import MERGE_KEY
from polyprof.base.log import get_logger
from polyprof.formats.chrome_reader import TraceFileError
from polyprof.formats.columnar import (
    EVENTS_POSITION_KEY,
    FORMAT,
    FORMAT_KEY,
    check_column_types,
    is_parquet_path,
    json_trace_table,
    pyarrow_modules,
    sources_of,
    top_level_of,
    trace_suffix,
    write_parquet_table,
)

try:
    import fcntl
except ImportError:  # Windows: no lock tells a live command's folder apart, so none is removed
    fcntl = None  # type: ignore[assignment]

log = get_logger(__name__)

#: Ranks of one run start profiling within this of each other (the job's launch skew and the
#: schedule's wait steps); a trace farther from the others' median start is another run's.
SAME_RUN_WINDOW_NS = 30 * 60 * 10**9


class NoTracesError(PolyprofError, ValueError):
    """Nothing to analyse: no trace files, or none readable."""


class ParquetWriteError(PolyprofError, OSError):
    """A Parquet copy could not be written (the disk is full, ...): no trace could be, so the run stops."""


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
        # the start time is read here: a ts of text would fail every reader of the run
        ts_field = [field for field in meta.schema.to_arrow_schema() if field.name == "ts"]
        check_column_types(ts_field, parquet)
    except Exception as exc:  # pyarrow's own errors and bad metadata alike: this file is unusable
        message = str(exc).removeprefix(f"{parquet}: ")
        raise TraceFileError(parquet, f"not a readable polyprof Parquet trace: {message}") from exc
    return top, int(meta.num_rows)


def _start_ns(parquet: str, top: dict[str, Any]) -> int | None:
    pa, pq = pyarrow_modules()
    try:
        column = pq.read_table(parquet, columns=["ts"]).column("ts")
    except (pa.ArrowException, OSError, KeyError) as exc:  # no ts column, or a damaged one
        raise TraceFileError(parquet, f"not a readable polyprof Parquet trace: {exc}") from exc
    pc = pa.compute
    if pa.types.is_null(column.type):
        return None
    finite = pc.filter(column, pc.is_finite(column))
    first = pc.min(finite).as_py() if len(finite) else None
    base = top.get("baseTimeNanoseconds")
    if first is None:
        return None
    base_ns = base if isinstance(base, int) and not isinstance(base, bool) else 0
    return base_ns + round(first * 1000)


@attrs.define
class _Targets:
    """The Parquet names this run has written, and the files it reads (never written over)."""

    inputs: frozenset[tuple[int, int]]
    taken: set[str] = attrs.Factory(set)

    def free(self, target: str) -> bool:
        ids = file_ids([target])
        return target not in self.taken and not ids & self.inputs


def _as_parquet(source: str, parquet_dir: str, targets: _Targets) -> str:
    if is_parquet_path(source):
        return source
    stem = os.path.basename(source)
    stem = stem[: len(stem) - len(trace_suffix(stem) or "")]
    # a.json and a.json.gz of this run get two names, and so does a.json beside an a.parquet that
    # this run reads; any other a.parquet there (an earlier run's conversion) is replaced
    target = os.path.join(parquet_dir, f"{stem}.parquet")
    n = 1
    while not targets.free(target):
        n += 1
        target = os.path.join(parquet_dir, f"{stem}.{n}.parquet")
    targets.taken.add(target)
    # as polyprof convert does: the compiled column builder where it is built (TraceFileError naming
    # the source where the file is not a Chrome trace)
    table = json_trace_table(source)
    try:
        return write_parquet_table(table, target)
    except OutputPathError:
        raise
    except OSError as exc:  # the disk is full, ...: every other trace would fail the same way
        raise ParquetWriteError(
            f"cannot write the Parquet copy of {source!r} ({target!r}): {exc.strerror or exc}"
        ) from exc


def _rank_of(info: Any) -> int | None:
    """The rank ``distributedInfo`` gives; None without one; TraceFileError's problem when it is wrong."""
    if info is None:
        return None
    if not isinstance(info, dict):
        raise ValueError(f"distributedInfo is {type(info).__name__}, not an object")
    if "rank" not in info:
        raise ValueError("distributedInfo has no rank")
    rank = info["rank"]
    if type(rank) is not int:
        raise ValueError(f"distributedInfo.rank is {rank!r} (a {type(rank).__name__}), not an integer")
    if rank < 0:
        raise ValueError(f"distributedInfo.rank is {rank}, not a rank (0 or more)")
    return rank


def _read_one(source: str, parquet_dir: str, targets: _Targets) -> RankTrace:
    parquet = _as_parquet(source, parquet_dir, targets)
    try:
        top, events = _top_level(parquet)
        start_ns = _start_ns(parquet, top)
        if MERGE_KEY in top:
            raise ValueError(
                "a trace `polyprof merge` wrote, holding several ranks: report the ranks' own traces"
            )
        info = top.get("distributedInfo")
        rank = _rank_of(info)
    except TraceFileError as exc:  # named by the user's file, not by its Parquet copy
        raise TraceFileError(source, exc.problem.replace(parquet, source)) from exc
    except ValueError as exc:
        raise TraceFileError(source, str(exc)) from exc
    world_size = backend = None
    if isinstance(info, dict):
        world_size = info.get("world_size") if type(info.get("world_size")) is int else None
        backend = str(info["backend"]) if info.get("backend") is not None else None
    return RankTrace(
        source=source,
        parquet=parquet,
        rank=-1 if rank is None else rank,
        world_size=world_size,
        backend=backend,
        start_ns=start_ns,
        events=events,
    )


def _missing(source: str) -> str | None:
    """Why ``source`` cannot be opened (no such file, a symbolic link loop, ...), or None."""
    try:
        os.stat(source)
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(source) else "no such file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop (too many levels of symbolic links)"
        return f"cannot be read: {exc.strerror or exc}"
    return None


def _most_common(values: Iterable[Any]) -> Any:
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], str(v))) if counts else None


def collect_rank_set(paths: list[str], parquet_dir: str) -> RankSet:
    """Find, read and check the traces in ``paths``; see the module notes. Raises ``NoTracesError``."""
    sources = sources_of(paths)
    if not sources:
        raise NoTracesError(f"no traces (.json, .json.gz, .parquet) in {', '.join(paths)}")
    prepare_output_directory(parquet_dir)  # one line (OutputPathError) for a file or an uncreatable path
    read: list[RankTrace] = []
    skipped: list[Skipped] = []
    targets = _Targets(inputs=frozenset(file_ids(sources)))
    for source in sources:
        missing = _missing(source)
        if missing is not None:
            skipped.append(Skipped(source, missing))
            continue
        try:
            read.append(_read_one(source, parquet_dir, targets))
        except (ParquetWriteError, OutputPathError):
            raise
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


# ------------------------------------------------------- the temporary Parquet folder

_TEMP_PREFIX = "polyprof-report-"
#: Names of polyprof's temporary Parquet folders; nothing else is ever removed as a leftover.
_TEMP_DIR_NAME = re.compile(r"polyprof-report-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[A-Za-z0-9_]+")
_LOCK_NAME = ".polyprof-lock"
#: A folder of polyprof's name without its lock file is left this long (its command may be making it).
_LOCKLESS_AFTER_S = 3600.0


@contextlib.contextmanager
def temporary_parquet_dir() -> Iterator[str]:
    """A new folder for one command's Parquet traces, removed at the end; see the module notes.

    Folders that killed commands left in the same temporary directory are removed first.
    """
    parent = tempfile.gettempdir()
    _remove_abandoned_dirs(parent)
    folder = None
    lock_fd = None
    try:
        folder = tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{host_tag()}-{os.getpid()}-", dir=parent)
        lock_fd = _hold_lock(folder)
        yield folder
    finally:
        # closed first: Windows deletes no open file. A sweep that finds the lock free in between
        # removes the folder too; both removals ignore what the other got to first.
        if lock_fd is not None:
            os.close(lock_fd)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _hold_lock(folder: str) -> int | None:
    """Create ``folder``'s lock file, locked: made under another name and renamed once locked, so a
    sweep never finds it unlocked while this command lives. None where there are no locks (Windows,
    which renames no open file): no sweep runs there."""
    if fcntl is None:
        return None
    fresh = os.path.join(folder, f"{_LOCK_NAME}.new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with contextlib.suppress(OSError):  # no locks on this file system: no sweep can take it either
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(fresh, os.path.join(folder, _LOCK_NAME))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_abandoned_dirs(parent: str) -> None:
    """Remove the temporary Parquet folders of commands that were killed (their lock is not held).

    Only folders of polyprof's name, made on this host by another process, owned by this user and
    holding polyprof's lock file are considered. Never raises: a folder that cannot be judged stays.
    """
    if fcntl is None:
        return
    try:
        with os.scandir(parent) as scan:
            names = [entry.name for entry in scan if entry.name.startswith(_TEMP_PREFIX)]
    except OSError:
        return
    host, own_pid = host_tag(), os.getpid()
    for name in names:
        match = _TEMP_DIR_NAME.fullmatch(name)
        if match is not None and match["host"] == host and int(match["pid"]) != own_pid:
            _remove_if_abandoned(os.path.join(parent, name))


def _remove_if_abandoned(folder: str) -> None:
    try:
        seen = os.lstat(folder)
    except OSError:
        return
    if not stat.S_ISDIR(seen.st_mode) or (hasattr(os, "geteuid") and seen.st_uid != os.geteuid()):
        return
    try:
        fd = os.open(os.path.join(folder, _LOCK_NAME), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        # killed between making the folder and its lock file (microseconds): gone after an hour
        if time.time() - seen.st_mtime > _LOCKLESS_AFTER_S:
            shutil.rmtree(folder, ignore_errors=True)
        return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return  # its command is alive, or locks do not work here
    try:
        size = sum(entry.stat().st_size for entry in os.scandir(folder) if entry.is_file())
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed_leftover_parquet_dir", path=folder, size=size)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While in the block, SIGTERM raises ``SystemExit(143)`` (128 + SIGTERM, the shell's status of a
    process SIGTERM ended) in the main thread, so ``finally`` blocks run and temporary files and
    folders go. A second SIGTERM gets the handler that was there before. Elsewhere than the main
    thread, or where SIGTERM is ignored, nothing changes."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:  # a handler not set from Python: the default is the nearest we can restore
        previous = signal.SIG_DFL
    if previous == signal.SIG_IGN:
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, previous)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = [
    "SAME_RUN_WINDOW_NS",
    "NoTracesError",
    "ParquetWriteError",
    "RankSet",
    "RankTrace",
    "Skipped",
    "collect_rank_set",
    "sigterm_exits",
    "temporary_parquet_dir",
]
