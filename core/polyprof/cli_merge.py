"""``polyprof merge``: one Chrome trace of every rank of a run, for Perfetto.

    polyprof merge traces/ -o merged.json [--align {wall,step}] [--parquet-dir DIR]

Reads the run's traces as ``polyprof report DIR`` does (``polyprof.rank_set``: JSON or Parquet,
one trace per rank of one run, what is left out named on stderr) and writes them as one trace
(``polyprof.merge``), atomically. The written path goes to stdout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from polyprof.cli_report import terminal_safe
from polyprof.merge import ALIGNMENTS, merge_rank_set
from polyprof.rank_set import NoTracesError, collect_rank_set, temporary_parquet_dir


def add_merge_command(subparsers: Any) -> None:
    """Add ``polyprof merge`` to the ``polyprof`` command's subparsers."""
    parser = subparsers.add_parser(
        "merge",
        help="merge the traces of every rank of a run into one Chrome trace (for Perfetto)",
        description=(
            "Write one Chrome trace of every rank of a distributed run: one group of processes per "
            "rank, named by rank, clocks aligned (--align wall: the ranks' own clocks; step: the first "
            "ProfilerStep#N every rank recorded starts together). Traces: a directory or files, "
            ".json, .json.gz or .parquet, mixed."
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a directory of traces, or trace files")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the merged trace (.json or .json.gz)"
    )
    parser.add_argument(
        "--align", choices=ALIGNMENTS, default="wall", help="how clocks are aligned (default wall)"
    )
    parser.add_argument(
        "--parquet-dir", metavar="DIR", help="keep the Parquet traces made from JSON ones here"
    )
    parser.set_defaults(handler=run_merge_command)


def run_merge_command(args: argparse.Namespace) -> int:
    if not args.output.lower().endswith((".json", ".json.gz")):
        print(
            f"polyprof merge: error: {args.output!r}: name the merged trace .json or .json.gz",
            file=sys.stderr,
        )
        return 2
    if args.parquet_dir:
        return _merge(args, args.parquet_dir)
    with temporary_parquet_dir() as folder:
        return _merge(args, folder)


def _merge(args: argparse.Namespace, parquet_dir: str) -> int:
    try:
        rank_set = collect_rank_set(list(args.paths), parquet_dir)
    except NoTracesError as exc:
        print(f"polyprof merge: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return 2
    for skipped in rank_set.skipped:
        print(
            f"polyprof merge: skipped {terminal_safe(skipped.path)}: {terminal_safe(skipped.reason)}",
            file=sys.stderr,
        )
    summary = merge_rank_set(rank_set, args.output, align=args.align)
    shifted = [f"rank {rank} {ns / 1e6:+.3f} ms" for rank, ns in summary.shifts_ns if ns]
    done = f"{len(summary.ranks)} ranks, {summary.events:,} events, clocks aligned by {summary.align}"
    print(f"polyprof merge: {done}" + (f" ({', '.join(shifted)})" if shifted else ""), file=sys.stderr)
    print(summary.path)
    return 0


__all__ = ["add_merge_command", "run_merge_command"]
