"""``polyprof merge``: one Chrome trace of every rank of a run, for Perfetto.

    polyprof merge traces/ -o merged.json [--align {wall,step}] [--parquet-dir DIR]

Reads the run's traces as ``polyprof report DIR`` does (``polyprof.ranks.rank_set``: JSON or Parquet,
one trace per rank of one run, what is left out named on stderr) and writes them as one trace
(``polyprof.ranks.merge``), atomically. The written path goes to stdout.

Before any trace is read, the output is checked: it may not be one of the traces read (by any name:
a link, or a file in a directory given), and it and ``--parquet-dir`` must be writable; otherwise
one line on stderr and exit code 2. SIGTERM ends the command with exit code 143 after its temporary
files are removed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from polyprof.base.errors import EXIT_USAGE, PolyprofError
from polyprof.base.fileio import OutputPathError, check_writable_path, file_ids, prepare_output_directory
from polyprof.base.terminal import terminal_safe
from polyprof.cli.cli_convert import print_skipped
from polyprof.formats.columnar import sources_of
from polyprof.ranks.merge import ALIGNMENTS, AlignmentError, merge_rank_set
from polyprof.ranks.rank_set import collect_rank_set, sigterm_exits, temporary_parquet_dir

_PROG = "polyprof merge"


class MergeOutputError(OutputPathError):
    """The merged trace would be written over one of the traces it is made of."""


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
        print(f"{_PROG}: error: {args.output!r}: name the merged trace .json or .json.gz", file=sys.stderr)
        return EXIT_USAGE
    try:
        with sigterm_exits():
            _check_output(args)
            if args.parquet_dir:
                return _merge(args, args.parquet_dir)
            with temporary_parquet_dir() as folder:
                return _merge(args, folder)
    except AlignmentError as exc:  # the traces are fine, but cannot be aligned as asked
        print(f"{_PROG}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return 1
    except PolyprofError as exc:  # no traces, an unlistable directory, an unusable output, a full disk
        print(f"{_PROG}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE


def _check_output(args: argparse.Namespace) -> None:
    """Refuse an output that is one of the inputs or cannot be written, before any work."""
    check_writable_path(args.output)
    if file_ids([args.output]) & file_ids(sources_of(list(args.paths))):
        raise MergeOutputError(
            f"-o {args.output!r} is one of the traces to merge, which is never written over; "
            "name another file",
            args.output,
        )
    if args.parquet_dir:
        prepare_output_directory(args.parquet_dir)


def _merge(args: argparse.Namespace, parquet_dir: str) -> int:
    rank_set = collect_rank_set(list(args.paths), parquet_dir)
    for skipped in rank_set.skipped:
        print_skipped(_PROG, skipped.path, skipped.reason)
    summary = merge_rank_set(rank_set, args.output, align=args.align)
    shifted = [f"rank {rank} {ns / 1e6:+.3f} ms" for rank, ns in summary.shifts_ns if ns]
    ranks = f"{len(summary.ranks)} rank{'' if len(summary.ranks) == 1 else 's'}"
    done = f"{ranks}, {summary.events:,} events, clocks aligned by {summary.align}"
    print(f"{_PROG}: {done}" + (f" ({', '.join(shifted)})" if shifted else ""), file=sys.stderr)
    print(terminal_safe(summary.path))
    return 0


__all__ = ["add_merge_command", "run_merge_command"]
