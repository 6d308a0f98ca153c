"""``polyprof report DIR`` (or several traces): the report across the ranks of a distributed run.

``polyprof report`` with one trace file prints that trace's table (``polyprof.cli_report``); with a
directory, or more than one path, it reads every trace there (``.json``, ``.json.gz``,
``.parquet``, mixed), keeps one per rank of one run (``polyprof.rank_set``), computes per-rank rows
on DuckDB over Parquet files (``polyprof.rank_analysis``) and prints the statistics across ranks
(``polyprof.rank_report``). JSON traces are converted to Parquet first, one at a time, into
``--parquet-dir`` (kept there: report on that directory next time to skip the conversion) or a
temporary directory (removed, also when SIGTERM ends the command: exit code 143).

``-o FILE`` and ``--parquet-dir`` are checked before any trace is read; one that cannot be used,
an ``-o FILE`` that is one of the traces (by any name), or a disk that fills while the report is
written, is one line on stderr (``OutputPathError``, ``ReportWriteError``). Traces left out are
named on stderr; a report written to a file lists them too, the text report on stdout does not
(they would be on the terminal twice).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import attrs
import orjson

from polyprof.cli_convert import print_skipped
from polyprof.cli_report import ReportOptions, load_report_results, render_report, terminal_safe
from polyprof.errors import PolyprofError
from polyprof.fileio import (
    OutputPathError,
    atomic_writer,
    check_writable_path,
    file_ids,
    prepare_output_directory,
)
from polyprof.rank_report import build_rank_report, render_text, report_json
from polyprof.rank_report_html import render_html
from polyprof.rank_set import collect_rank_set, sigterm_exits, sources_of, temporary_parquet_dir
from polyprof.ranks import ENGINES, rank_rows

FORMATS = ("text", "json", "html")


class ReportWriteError(PolyprofError, OSError):
    """The report could not be written (the disk is full, ...); nothing is left at its path."""


class ReportOutputError(OutputPathError):
    """The report would be written over one of the traces it is made of."""


def is_many_rank_request(paths: list[str]) -> bool:
    return len(paths) > 1 or (len(paths) == 1 and os.path.isdir(paths[0]))


def add_rank_report_arguments(parser: argparse.ArgumentParser) -> None:
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


def run_rank_report(args: argparse.Namespace, options: ReportOptions) -> int:
    from polyprof.rank_report import DEFAULT_STRAGGLER_THRESHOLD

    threshold = DEFAULT_STRAGGLER_THRESHOLD if args.straggler_threshold is None else args.straggler_threshold
    with sigterm_exits():
        if args.output:  # before minutes of conversion and analysis
            _check_output(args.output, list(args.trace))
        if args.parquet_dir:
            prepare_output_directory(args.parquet_dir)
            return _report(args, options, threshold, args.parquet_dir)
        with temporary_parquet_dir() as folder:
            return _report(args, options, threshold, folder)


def _check_output(output: str, paths: list[str]) -> None:
    """Refuse an output that cannot be written or is one of the traces (by any name)."""
    check_writable_path(output)
    if file_ids([output]) & file_ids(sources_of(paths)):
        raise ReportOutputError(
            f"-o {output!r} is one of the traces to report on, which is never written over; "
            "name another file",
            output,
        )


def _report(args: argparse.Namespace, options: ReportOptions, threshold: float, parquet_dir: str) -> int:
    rank_set = collect_rank_set(list(args.trace), parquet_dir)
    rows = rank_rows(
        rank_set, engine=args.engine, memory_limit=args.memory_limit, ray_address=args.ray_address
    )
    report = build_rank_report(rank_set, rows, straggler_threshold=threshold)
    for skipped in report.rank_set.skipped:  # the analysis may leave out more
        print_skipped("polyprof report", skipped.path, skipped.reason)
    if args.format == "json":
        data: dict[str, Any] = report_json(report)
        if args.per_rank:
            data["per_rank_tables"] = {
                str(r.rank): _rank_table(r.parquet, options) for r in report.rank_set.ranks
            }
        text = orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"
    elif args.format == "html":
        text = render_html(report, row_limit=options.row_limit)
    else:
        # the report's own list of the traces left out is for a file; on the terminal, stderr has it
        shown = (
            report
            if args.output
            else attrs.evolve(report, rank_set=attrs.evolve(report.rank_set, skipped=()))
        )
        text = render_text(shown, row_limit=options.row_limit)
        if args.per_rank:
            text += "".join(
                f"\nRank {r.rank} ({terminal_safe(r.source)}):\n{_rank_table(r.parquet, options)}"
                for r in report.rank_set.ranks
            )
    if args.output:
        _write_report(args.output, text)
        print(terminal_safe(args.output))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


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


__all__ = ["add_rank_report_arguments", "is_many_rank_request", "run_rank_report"]
