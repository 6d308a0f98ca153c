"""``polyprof report``: torch's ``key_averages().table()`` from a saved Chrome trace, and the report
across the ranks of a distributed run from a directory of them (or several traces).

One trace
---------

The trace may be polyprof's own (``prof.export_chrome_trace``) or torch's
(Kineto's writer: ``torch.profiler.profile.export_chrome_trace`` and
``tensorboard_trace_handler``), plain ``.json`` or gzip-compressed
``.json.gz``. It is read with ``polyprof.formats.chrome_reader``, rebuilt into a
``Trace`` and summarised by the same ``ProfileResults.key_averages`` and
table code a live profile uses, so the command needs neither torch nor the
program that made the trace.

What the table of a torch-written trace shares with torch's own
``prof.key_averages().table()`` of the profile that wrote it:

* Names (``ProfilerStep#N`` folded to ``ProfilerStep*``), ``# of Calls``,
  Input Shapes (``--group-by-input-shape``; the trace's ``Input Dims``),
  the nesting that ``--top-level-only`` reads, and every time: Kineto writes
  ``ts``/``dur`` as µs with three decimals, that is to the nanosecond, and the
  reader converts them back exactly, so Self CPU, CPU total, averages and
  percentages print the same digits. ``polyprof report`` and torch's table
  agree byte for byte for CPU profiles with or without shapes, memory,
  backward passes, ``record_function`` ranges and schedules (the tests check
  this against torch 2.13).
* The memory columns, when the profile was recorded with
  ``profile_memory=True``: each allocation is a ``[memory]`` instant event in
  the trace, and the ``profile_memory`` flag at its top level turns the
  columns on. Without that flag there is nothing to rebuild them from, and
  they are left out, as torch leaves them out.
* Device columns (``Self CUDA``, ``XPU total``, ...): ``use_device`` is taken
  from the trace's device events (kernel, memcpy, memset and runtime
  categories, and device lanes named ``CUDA 0``/``XPU 0``), CUDA before XPU
  before the others, as torch chooses it from the activities.

What a trace cannot carry, so the report cannot show it:

* FLOPs: Kineto writes no FLOPs field (nor does polyprof's exporter, to match
  it), so there is no ``Total FLOPs`` column; the command says so on stderr
  when the trace was recorded with ``with_flops``.
* Source locations grouped like torch's ``group_by_stack_n``: torch gives
  backward ops the stack of their forward op by their ``RecordScope``, which
  the trace does not record, so this command offers no stack grouping.
* Overload names and RPC node ids, which Kineto does not write.
* With ``acc_events=True`` torch's table sums every recorded cycle; a trace
  file holds one cycle.

The default sort is what torch's tutorials print: ``cpu_time_total``, or
``device_time_total`` (torch's ``cuda_time_total``) when the trace has device
time. ``--sort-by none`` keeps torch's ``sort_by=None`` order (first seen).

Hostile files: the reader refuses what is not a regular file (``/dev/zero``, a
FIFO), more JSON than ``POLYPROF_REPORT_MAX_BYTES`` (default 4 GiB, read in
chunks, gzip decompressed as a stream), gzip data that inflates like a bomb,
and JSON nested too deeply to follow. Events whose ``ts``/``dur`` are NaN,
infinite, negative (``dur``) or beyond int64 nanoseconds are left out and
counted in a note. Names, notes and errors reach the terminal with control
characters escaped (``terminal_safe``).

Exit status: 0 with the table on stdout; 2, with one line on stderr and no
traceback, for a missing, unreadable, empty, truncated, corrupt or too large
file, a directory or device, JSON that is not a Chrome trace, a trace without
profiler events, a table torch could not print either, a trace ``polyprof merge``
wrote of several ranks (one table would mix them), or a bad option.

Many ranks
----------

With a directory, or more than one path, the command reads every trace there (``.json``,
``.json.gz``, ``.parquet``, mixed) and reports across the ranks of one run with
``polyprof.ranks.analyse_run``: one trace per rank of the run (``polyprof.ranks.rank_set``), per-rank
rows on DuckDB over Parquet files (``polyprof.ranks.rank_analysis``) or Ray (``--engine ray``), and the
statistics across ranks (``polyprof.ranks.rank_report``; ``polyprof.ranks.rank_report_html`` for
``--format html``). JSON traces are converted to Parquet first, one at a time, into
``--parquet-dir`` (kept there: report on that directory next time to skip the conversion) or a
temporary directory (removed, also when SIGTERM ends the command: exit code 143).

``-o FILE``, ``--parquet-dir``, ``--memory-limit`` and ``--ray-address`` are checked before any trace
is read; one that cannot be used, an ``-o FILE`` that is one of the traces (by any name), or a disk
that fills while the report is written, is one line on stderr (``OutputPathError``,
``ReportWriteError``) and exit code 2. Traces left out are named on stderr; a report written to a
file lists them too, the text report on stdout does not (they would be on the terminal twice).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
import orjson

from polyprof.analysis.results import ProfileResults
from polyprof.analysis.table import VALID_SORT_KEYS, VALID_TIME_UNITS, TimeShareError
from polyprof.analysis.tree import use_device_for
from polyprof.base.errors import EXIT_USAGE, PolyprofError
from polyprof.base.fileio import (
    OutputPathError,
    atomic_writer,
    check_writable_path,
    file_ids,
    prepare_output_directory,
)
from polyprof.base.kineto_format import MERGE_KEY
from polyprof.base.log import get_logger
from polyprof.base.terminal import terminal_safe
from polyprof.cli.cli_convert import print_skipped
from polyprof.formats.chrome_reader import (
    TraceFileError,
    max_bytes_from_env,
    read_chrome_trace,
    trace_from_chrome,
)
from polyprof.formats.columnar import is_parquet_path, read_trace_document, sources_of
from polyprof.ranks import ENGINES, analyse_run
from polyprof.ranks.rank_report import DEFAULT_STRAGGLER_THRESHOLD, RankReport, render_text, report_json
from polyprof.ranks.rank_report_html import render_html
from polyprof.ranks.rank_set import sigterm_exits, temporary_parquet_dir

log = get_logger(__name__)

__all__ = [
    "AUTO_SORT",
    "DEFAULT_ROW_LIMIT",
    "EXIT_BAD_INPUT",
    "FORMATS",
    "SORT_CHOICES",
    "UNSORTED",
    "ReportOptions",
    "ReportOutputError",
    "ReportWriteError",
    "add_report_command",
    "check_memory_limit",
    "default_sort_key",
    "is_many_rank_request",
    "load_report_results",
    "merged_rank_count",
    "merged_trace_problem",
    "render_report",
    "report_notes",
    "run_rank_report",
    "run_report_command",
]

#: ``--sort-by`` value that picks ``cpu_time_total`` or ``device_time_total`` (the default).
AUTO_SORT = "auto"
#: ``--sort-by`` value that keeps torch's ``sort_by=None`` order: keys as first seen.
UNSORTED = "none"
SORT_CHOICES: tuple[str, ...] = (AUTO_SORT, UNSORTED, *VALID_SORT_KEYS)
#: torch's ``table()`` default.
DEFAULT_ROW_LIMIT = 100
#: Exit status for input the command cannot use: a usage error's.
EXIT_BAD_INPUT = EXIT_USAGE
#: ``--format`` of the report across ranks.
FORMATS = ("text", "json", "html")

_PROG = "polyprof report"


def _check_sort_by(instance: Any, attribute: Any, value: str) -> None:
    if value not in SORT_CHOICES:
        raise ValueError(f"unknown sort key {value!r}; choose one of: {', '.join(SORT_CHOICES)}")


def _check_row_limit(instance: Any, attribute: Any, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"row_limit must be a count >= 0, or -1 for every row; got {value!r}")


def _check_time_unit(instance: Any, attribute: Any, value: str | None) -> None:
    if value is not None and value not in VALID_TIME_UNITS:
        raise ValueError(f"time_unit must be one of {', '.join(VALID_TIME_UNITS)} or None; got {value!r}")


@attrs.frozen
class ReportOptions:
    """How to summarise a trace: the ``polyprof report`` options."""

    #: A key of ``SORT_CHOICES``: torch's sort keys, ``"auto"`` or ``"none"``.
    sort_by: str = attrs.field(default=AUTO_SORT, validator=_check_sort_by)
    #: Rows to print; -1 prints every row (torch's convention).
    row_limit: int = attrs.field(default=DEFAULT_ROW_LIMIT, validator=_check_row_limit)
    group_by_input_shape: bool = False
    #: ``"s"``, ``"ms"`` or ``"us"`` for every time cell; None picks a unit per cell.
    time_unit: str | None = attrs.field(default=None, validator=_check_time_unit)
    #: Only ops without a CPU parent (torch's ``top_level_events_only``).
    top_level_only: bool = False


def load_report_results(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> ProfileResults:
    """Read a trace file (Chrome JSON or a Parquet trace) into ``ProfileResults``; ``use_device`` from
    its device events.

    :param max_bytes: the most JSON bytes to read (see ``polyprof.formats.chrome_reader.load_chrome_trace``).
    :raises TraceFileError: the file is missing, a directory, unreadable, too large, not a
        Chrome trace, or holds no profiler events (one-line message).
    """
    path = os.fspath(path)
    started = time.perf_counter()
    if is_parquet_path(path):
        trace = trace_from_chrome(read_trace_document(path))
    else:
        trace = read_chrome_trace(path, max_bytes=max_bytes)
    if len(trace.events) == 0:
        skipped = "".join(f"; {note}" for note in trace.notes)
        raise TraceFileError(
            path,
            "no profiler events to summarise (no cpu_op, user_annotation, kernel or other Kineto "
            f"events){skipped}",
        )
    use_device = use_device_for(trace.config)
    log.debug(
        "report_trace_read",
        path=path,
        events=len(trace.events),
        use_device=use_device,
        seconds=round(time.perf_counter() - started, 3),
    )
    return ProfileResults(traces=(trace,), use_device=use_device)


def merged_rank_count(results: ProfileResults) -> int | None:
    """How many ranks a trace ``polyprof merge`` wrote holds (its ``polyprofMerge`` key); None for
    any other trace, 0 when the key does not list them (edited, or another writer's)."""
    texts = [trace.metadata_json[MERGE_KEY] for trace in results.traces if MERGE_KEY in trace.metadata_json]
    if not texts:
        return None
    try:
        ranks = json.loads(texts[0])["ranks"]
    except (ValueError, TypeError, KeyError):
        return 0
    return len(ranks) if isinstance(ranks, list) else 0


def merged_trace_problem(path: str, results: ProfileResults) -> str | None:
    """Why ``results``, a merged trace of several ranks, gets no table; None for any other trace.

    The ranks ran at the same time, and one table of them nests one rank's ops inside another's:
    numbers of no rank, nor their sum. A merge of one rank is that rank's trace, with its table.
    """
    count = merged_rank_count(results)
    if count is None or count == 1:
        return None
    ranks = f"{count} ranks" if count else "several ranks"
    return (
        f"{path}: polyprof merge's trace of {ranks}, which one table would mix (ops of ranks that ran "
        "at the same time nest inside each other); run `polyprof report DIR` on the ranks' own traces "
        "(its polyprofMerge key lists them) for the report across ranks"
    )


def default_sort_key(averages: Sequence[Any]) -> str:
    """``device_time_total`` when some row has device time, else ``cpu_time_total``."""
    has_device_time = any(avg.self_device_time_total > 0 for avg in averages)
    return "device_time_total" if has_device_time else "cpu_time_total"


def render_report(results: ProfileResults, options: ReportOptions) -> str:
    """torch's ``key_averages(...).table(...)`` text for ``results`` under ``options``.

    Names are escaped with ``terminal_safe`` before the layout, so the columns line up.
    """
    averages = results.key_averages(group_by_input_shape=options.group_by_input_shape)
    for average in averages:  # fresh objects: key_averages() builds them for this call
        average.key = terminal_safe(average.key)
        if getattr(average, "overload_name", None):
            average.overload_name = terminal_safe(average.overload_name)
    if options.sort_by == AUTO_SORT:
        sort_by: str | None = default_sort_key(averages)
    elif options.sort_by == UNSORTED:
        sort_by = None
    else:
        sort_by = options.sort_by
    return averages.table(
        sort_by=sort_by,
        row_limit=options.row_limit,
        top_level_events_only=options.top_level_only,
        time_unit=options.time_unit,
    )


def report_notes(results: ProfileResults) -> list[str]:
    """What the user should know about the trace the table cannot show."""
    notes: list[str] = []
    for trace in results.traces:
        notes.extend(trace.notes)
        if trace.config.with_flops:
            notes.append(
                "the profile was recorded with with_flops=True, but Chrome traces do not store FLOPs: "
                "the table has no FLOPs column"
            )
    return notes


# ---------------------------------------------------------------- command line

#: A size as DuckDB's ``memory_limit`` reads one: a number (``2``, ``1.5``, ``.5``, ``1e3``), then a
#: unit or ``%``. What DuckDB reads otherwise (``-5GB``, ``none``) or refuses, this does not match.
_SIZE = re.compile(r"\s*(?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*(?P<unit>[a-z ]*|%)\s*", re.I)


def check_memory_limit(text: str) -> str:
    """``text`` when DuckDB's ``memory_limit`` takes it as a limit: ``2GB``, ``512MiB``, ``4G``,
    ``1gigabyte``, ``100000000 bytes``, ``50%`` (of this machine's memory, where the installed DuckDB
    takes a share), whatever DuckDB reads.

    Refused first, where DuckDB reads them as no limit at all (``-5GB``, any leading minus) or as
    one that fails every query (``0GB``): a size that is not above 0, or a share above 100%. The
    rest is DuckDB's to read: a throwaway connection with the limit is opened, so that what DuckDB
    refuses (``2``: no unit) is said before any trace is read; without DuckDB installed, the
    engine's error says it is missing.

    :raises ValueError: one line saying what is wrong, with an example.
    """
    problem = _misread_memory_limit(text) or _duckdb_refusal(text)
    if problem is not None:
        raise ValueError(f"{text!r}: {problem}")
    return text


def _misread_memory_limit(text: str) -> str | None:
    """What is wrong with ``text`` as a limit that DuckDB would take but read wrongly; None if nothing."""
    if not text.strip():
        return "no size given, e.g. 2GB"
    if text.strip().startswith("-"):
        return "a size must be positive, e.g. 2GB"
    match = _SIZE.fullmatch(text)
    if match is None:  # not a number and a unit: DuckDB says what it takes
        return None
    if float(match["number"]) == 0:
        return "a size must be positive, e.g. 2GB"
    if match["unit"] == "%" and float(match["number"]) > 100:
        return "a share of this machine's memory must be at most 100%, e.g. 50%"
    return None


def _duckdb_refusal(text: str) -> str | None:
    """DuckDB's reason for refusing ``text`` as its ``memory_limit``; None if it takes it, or is not
    installed."""
    try:
        import duckdb
    except ImportError:
        return None
    try:
        duckdb.connect(config={"memory_limit": text}).close()
    except duckdb.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"not a size DuckDB takes: {reason}; e.g. 2GB or 512MiB"
    return None


def parse_row_limit(text: str) -> int:
    """``--row-limit``: a whole number >= 0, or -1 for every row (``polyprof report`` and ``diff``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be >= 0, or -1 for every row; got {value}")
    return value


def add_report_command(subparsers: Any) -> None:
    """Add ``polyprof report`` to the ``polyprof`` command's subparsers."""
    parser = subparsers.add_parser(
        "report",
        help=(
            "print a trace's key_averages table, or with a directory / several traces the report across ranks"
        ),
        description=(
            "Print torch's key_averages().table() for a Chrome trace file (.json or .json.gz) written "
            "by polyprof or by torch.profiler (export_chrome_trace, tensorboard_trace_handler), or for "
            "a Parquet trace (polyprof convert, the parquet exporter). "
            "Needs no torch. Times, counts, shapes and memory match torch's table for the profile "
            "that wrote the trace; FLOPs are not stored in traces. With a directory, or several "
            "traces, it reports across the ranks of a distributed run: per-op statistics over the "
            "ranks, step times and stragglers (the options under 'many ranks')."
        ),
        epilog=f"Sort keys: {', '.join(VALID_SORT_KEYS)}.",
    )
    parser.add_argument(
        "trace",
        metavar="TRACE",
        nargs="+",
        help=(
            "the trace file (.json, .json.gz or .parquet); a directory or several traces: the report "
            "across the ranks of a distributed run"
        ),
    )
    parser.add_argument(
        "--sort-by",
        metavar="KEY",
        choices=SORT_CHOICES,
        default=AUTO_SORT,
        help=(
            "the column to sort by, descending (torch's sort_by). Default 'auto': cpu_time_total, or "
            "device_time_total when the trace has device time; 'none' keeps first-seen order"
        ),
    )
    parser.add_argument(
        "--row-limit",
        metavar="N",
        type=parse_row_limit,
        default=DEFAULT_ROW_LIMIT,
        help=f"print at most N rows; -1 prints every row (default {DEFAULT_ROW_LIMIT})",
    )
    parser.add_argument(
        "--group-by-input-shape",
        action="store_true",
        help="one row per (name, input shapes), with an Input Shapes column (needs record_shapes)",
    )
    parser.add_argument(
        "--time-unit",
        choices=VALID_TIME_UNITS,
        default=None,
        help="print every time in this unit (default: a unit per cell, as torch)",
    )
    parser.add_argument(
        "--top-level-only",
        action="store_true",
        help="only ops that have no CPU parent (torch's top_level_events_only)",
    )
    _add_rank_report_arguments(parser)
    parser.set_defaults(handler=run_report_command)


def _add_rank_report_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("many ranks (a directory, or several traces)")
    group.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (default), json, or html (one self-contained page with plots)",
    )
    group.add_argument(
        "-o", "--output", metavar="FILE", help="write the report to FILE (atomically) instead of stdout"
    )
    group.add_argument(
        "--per-rank", action="store_true", help="also print each rank's own table (its key_averages)"
    )
    group.add_argument(
        "--straggler-threshold",
        type=float,
        default=None,
        metavar="FRACTION",
        help="a rank whose step time is this much above the median rank's is a straggler (default 0.10)",
    )
    group.add_argument(
        "--engine",
        choices=ENGINES,
        default="duckdb",
        help="duckdb (default: this machine, bounded memory) or ray (a Ray cluster; pip install 'ray[data]')",
    )
    group.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="with --engine ray: the cluster to join, as ray.init takes it ('auto', 'ray://host:10001'); "
        "default: a local cluster for this command",
    )
    group.add_argument(
        "--memory-limit", metavar="SIZE", help="DuckDB's memory limit, e.g. 2GB (past it, it spills to disk)"
    )
    group.add_argument(
        "--parquet-dir",
        metavar="DIR",
        help="keep the Parquet traces made from JSON ones here (default: a temporary directory)",
    )


def _check_rank_report_options(args: argparse.Namespace) -> None:
    """What a report across ranks can refuse before it reads a trace: ``--memory-limit``, ``-o`` and
    an unreachable ``--ray-address``.

    :raises ValueError: a ``--memory-limit`` DuckDB would not take (or would read as no limit).
    :raises OutputPathError: ``-o`` names a file that cannot be written.
    :raises ClusterUnreachableError: nothing answers at ``--ray-address``.
    """
    if args.memory_limit is not None:
        try:
            check_memory_limit(args.memory_limit)
        except ValueError as exc:
            raise ValueError(f"argument --memory-limit: {exc}") from None
    if args.output is not None:
        check_writable_path(args.output)
    if args.engine == "ray" and args.ray_address is not None:
        from polyprof.ranks.rank_ray import check_reachable

        check_reachable(args.ray_address)  # before minutes of converting traces for a cluster not there


def run_report_command(args: argparse.Namespace) -> int:
    """Print the table of ``args.trace``, or with a directory or several traces the report across
    ranks; one line on stderr and exit 2 when an input or output is unusable."""
    options = ReportOptions(
        sort_by=args.sort_by,
        row_limit=args.row_limit,
        group_by_input_shape=args.group_by_input_shape,
        time_unit=args.time_unit,
        top_level_only=args.top_level_only,
    )
    try:
        max_bytes = max_bytes_from_env()
    except ValueError as exc:
        print(f"{_PROG}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if is_many_rank_request(args.trace):
        try:
            _check_rank_report_options(args)
            return run_rank_report(args, options)
        except (PolyprofError, ValueError) as exc:
            print(f"{_PROG}: error: {terminal_safe(str(exc))}", file=sys.stderr)
            return EXIT_BAD_INPUT
    many_rank_only = [
        flag
        for flag, given in (
            ("--format", args.format != "text"),
            ("-o", args.output is not None),
            ("--per-rank", args.per_rank),
            ("--straggler-threshold", args.straggler_threshold is not None),
            ("--engine", args.engine != "duckdb"),
            ("--ray-address", args.ray_address is not None),
            ("--memory-limit", args.memory_limit is not None),
            ("--parquet-dir", args.parquet_dir is not None),
        )
        if given
    ]
    if many_rank_only:
        print(
            f"{_PROG}: error: {', '.join(many_rank_only)}: for a report across ranks (a directory or "
            "several traces); one trace prints its table",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    (args.trace,) = args.trace
    try:
        results = load_report_results(args.trace, max_bytes=max_bytes)
    except TraceFileError as exc:
        # The message quotes the file (keys, categories): escaped, it stays one harmless line.
        print(f"{_PROG}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError:
        print(
            f"{_PROG}: error: {terminal_safe(args.trace)}: not enough memory to read this trace "
            f"(at most {max_bytes} bytes of JSON are read; parsing takes several times that)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    problem = merged_trace_problem(args.trace, results)
    if problem is not None:
        print(f"{_PROG}: error: {terminal_safe(problem)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        table = render_report(results, options)
    except TimeShareError as exc:  # e.g. GPU annotations without kernels: torch's table fails too
        print(f"{_PROG}: error: {terminal_safe(args.trace)}: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for note in report_notes(results):
        print(f"{_PROG}: note: {terminal_safe(note)}", file=sys.stderr)
    sys.stdout.write(table)
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------- many ranks


class ReportWriteError(PolyprofError, OSError):
    """The report could not be written (the disk is full, ...); nothing is left at its path."""


class ReportOutputError(OutputPathError):
    """The report would be written over one of the traces it is made of."""


def is_many_rank_request(paths: list[str]) -> bool:
    return len(paths) > 1 or (len(paths) == 1 and os.path.isdir(paths[0]))


def run_rank_report(args: argparse.Namespace, options: ReportOptions) -> int:
    """Print (or write to ``-o``) the report across the ranks of the traces in ``args.trace``."""
    threshold = DEFAULT_STRAGGLER_THRESHOLD if args.straggler_threshold is None else args.straggler_threshold
    with sigterm_exits():
        if args.output:  # before minutes of conversion and analysis
            _check_output(args.output, list(args.trace))
        if args.parquet_dir:
            prepare_output_directory(args.parquet_dir)
            return _rank_report(args, options, threshold, args.parquet_dir)
        # the command's own folder, not analyse_run's: --per-rank reads the Parquet copies after it
        with temporary_parquet_dir() as folder:
            return _rank_report(args, options, threshold, folder)


def _check_output(output: str, paths: list[str]) -> None:
    """Refuse an output that cannot be written or is one of the traces (by any name)."""
    check_writable_path(output)
    if file_ids([output]) & file_ids(sources_of(paths)):
        raise ReportOutputError(
            f"-o {output!r} is one of the traces to report on, which is never written over; "
            "name another file",
            output,
        )


def _rank_report(args: argparse.Namespace, options: ReportOptions, threshold: float, parquet_dir: str) -> int:
    report = analyse_run(
        list(args.trace),
        engine=args.engine,
        parquet_dir=parquet_dir,
        memory_limit=args.memory_limit,
        ray_address=args.ray_address,
        straggler_threshold=threshold,
    )
    for skipped in report.rank_set.skipped:  # the analysis may leave out more
        print_skipped(_PROG, skipped.path, skipped.reason)
    text = _rank_report_text(report, args, options)
    if args.output:
        _write_report(args.output, text)
        print(terminal_safe(args.output))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


def _rank_report_text(report: RankReport, args: argparse.Namespace, options: ReportOptions) -> str:
    if args.format == "json":
        data: dict[str, Any] = report_json(report)
        if args.per_rank:
            data["per_rank_tables"] = {
                str(r.rank): _rank_table(r.parquet, options) for r in report.rank_set.ranks
            }
        return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"
    if args.format == "html":
        return render_html(report, row_limit=options.row_limit)
    # the report's own list of the traces left out is for a file; on the terminal, stderr has it
    shown = (
        report if args.output else attrs.evolve(report, rank_set=attrs.evolve(report.rank_set, skipped=()))
    )
    text = render_text(shown, row_limit=options.row_limit)
    if args.per_rank:
        text += "".join(
            f"\nRank {r.rank} ({terminal_safe(r.source)}):\n{_rank_table(r.parquet, options)}"
            for r in report.rank_set.ranks
        )
    return text


def _write_report(path: str, text: str) -> None:
    try:
        with atomic_writer(path) as out:
            out.write(text)
    except OSError as exc:
        if isinstance(exc, PolyprofError):
            raise
        raise ReportWriteError(f"cannot write {path!r}: {exc.strerror or exc}") from exc


def _rank_table(parquet: str, options: ReportOptions) -> str:
    return render_report(load_report_results(parquet), options)
