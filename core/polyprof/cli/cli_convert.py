"""``polyprof convert``: Chrome trace JSON (``.json``, ``.json.gz``) to Parquet traces and back.

    polyprof convert trace.json trace.parquet          # one file; formats from the suffixes
    polyprof convert trace.parquet trace.json.gz
    polyprof convert traces/ -o parquet/ --to parquet  # every trace in a directory, or several files

Any Chrome trace converts: polyprof's, torch's (Kineto's writer) or another tool's; the Parquet
file holds the same document as columns (``polyprof.formats.columnar``), so converting back gives it again.
In the many-file form each trace is converted on its own: one that cannot be read (corrupt,
truncated, not a trace), or whose destination is one of the traces being converted (``convert DIR
-o DIR``), is named on stderr with the reason and skipped, the others are written, and the exit
code is 1. Every file is written atomically, so none is ever left half-written, and no source is
ever written over. Written paths go to stdout, one per line.

An output that cannot be used (a destination or ``-o`` directory that cannot be written, a full
disk) is one line on stderr and exit code 2, found before any conversion where it can be. Names
from the command line and from the files are printed with ``terminal_safe``'s escapes.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import Any

from polyprof.base.errors import EXIT_USAGE, PolyprofError
from polyprof.base.fileio import OutputPathError, check_writable_path, file_ids, prepare_output_directory
from polyprof.base.log import get_logger
from polyprof.base.terminal import terminal_safe
from polyprof.formats.chrome_reader import TraceFileError
from polyprof.formats.columnar import (
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    TRACE_SUFFIXES,
    is_parquet_path,
    json_trace_table,
    pyarrow_modules,
    read_trace_document,
    sources_of,
    trace_suffix,
    write_json_trace,
    write_parquet_table,
    write_parquet_trace,
)

log = get_logger(__name__)

_PROG = "polyprof convert"
#: Write errors that no other file in the same place would escape: the run stops at the first.
_OUT_OF_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})

#: Target formats of the many-file form and the suffix each writes.
TARGET_SUFFIXES = {"parquet": ".parquet", "json": ".json", "json.gz": ".json.gz"}


class ConvertUsageError(PolyprofError, ValueError):
    """The command line names no valid conversion."""


class OutOfSpaceError(PolyprofError, OSError):
    """A converted trace could not be written: the disk (or the user's quota) is full."""


def print_skipped(prog: str, path: str, reason: str) -> None:
    """The line every trace command prints on stderr for a trace it leaves out, and why."""
    print(f"{prog}: skipped {terminal_safe(path)}: {terminal_safe(reason)}", file=sys.stderr)


def target_format_of(path: str) -> str:
    suffix = trace_suffix(path)
    if suffix is None:
        raise ConvertUsageError(
            f"cannot tell the format to write from {path!r}: name it .parquet, .json or .json.gz "
            "(or give a directory with -o and --to)"
        )
    return suffix.lstrip(".")


def convert_file(source: str, destination: str, *, compression: str = DEFAULT_COMPRESSION) -> str:
    """Convert one trace file; the format of each side comes from its suffix. Returns the path written."""
    if trace_suffix(source) is None:
        raise TraceFileError(source, f"not a trace file name: it must end in {', '.join(TRACE_SUFFIXES)}")
    if os.path.abspath(source) == os.path.abspath(destination) or file_ids([source]) & file_ids(
        [destination]
    ):
        raise ConvertUsageError(f"{source!r} would be converted onto itself; give another destination")
    target = target_format_of(destination)
    check_writable_path(destination)  # before reading gigabytes of JSON
    try:
        return _convert(source, destination, target, compression)
    except OSError as exc:
        if exc.errno in _OUT_OF_SPACE and not isinstance(exc, PolyprofError):
            raise OutOfSpaceError(f"cannot write {destination!r}: {exc.strerror or exc}") from exc
        raise


def _convert(source: str, destination: str, target: str, compression: str) -> str:
    if target == "parquet" and not is_parquet_path(source):
        # JSON to Parquet: the columns straight from the file's bytes where the compiled builder can
        return write_parquet_table(json_trace_table(source), destination, compression=compression)
    if target == "parquet":
        pyarrow_modules()  # before reading gigabytes of JSON
    doc = read_trace_document(source)
    try:
        if target != "parquet":
            return write_json_trace(doc, destination)
        return write_parquet_trace(doc, destination, compression=compression)
    except (ValueError, TypeError) as exc:  # traceEvents not a list, an event not an object, ...
        raise TraceFileError(source, f"not a Chrome trace: {exc}") from exc


def destination_in(directory: str, source: str, target: str) -> str:
    stem = os.path.basename(source)
    suffix = trace_suffix(stem) or ""
    return os.path.join(directory, stem[: len(stem) - len(suffix)] + TARGET_SUFFIXES[target])


def add_convert_command(subparsers: Any) -> None:
    """Add ``polyprof convert`` to the ``polyprof`` command's subparsers."""
    parser = subparsers.add_parser(
        "convert",
        help="convert Chrome trace JSON (.json, .json.gz) to Parquet traces and back",
        description=(
            "Convert traces between Chrome trace JSON (.json, .json.gz: polyprof's, torch's or any "
            "Kineto trace) and Parquet traces (.parquet: the events as typed columns, the top-level "
            "keys in the file's metadata). SOURCE DESTINATION converts one file, the formats taken "
            "from the suffixes; SOURCE... -o DIR --to FORMAT converts every trace named or in the "
            "directories named. Needs pyarrow for Parquet (pip install 'polyprof[analysis]')."
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="SOURCE DESTINATION, or SOURCE... with -o")
    parser.add_argument("-o", "--output-dir", metavar="DIR", help="write each converted trace into DIR")
    parser.add_argument(
        "--to", choices=tuple(TARGET_SUFFIXES), help="with -o: the format to write (default parquet)"
    )
    parser.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default=DEFAULT_COMPRESSION,
        help=f"Parquet compression (default {DEFAULT_COMPRESSION})",
    )
    parser.set_defaults(handler=run_convert_command)


def run_convert_command(args: argparse.Namespace) -> int:
    try:
        if args.output_dir is None:
            return _convert_one(args)
        return _convert_many(args)
    except (OutputPathError, OutOfSpaceError) as exc:
        print(f"{_PROG}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE  # an output that cannot be used, as report's unusable input
    except PolyprofError as exc:
        print(f"{_PROG}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return 1


def _convert_one(args: argparse.Namespace) -> int:
    if args.to is not None:
        raise ConvertUsageError("--to goes with -o DIR; for one file, name the destination's suffix")
    if len(args.paths) != 2:
        raise ConvertUsageError(
            f"give SOURCE DESTINATION ({len(args.paths)} paths given), or SOURCE... -o DIR --to FORMAT"
        )
    source, destination = args.paths
    if os.path.isdir(source):
        raise ConvertUsageError(f"{source!r} is a directory: convert it with -o DIR --to FORMAT")
    print(terminal_safe(convert_file(source, destination, compression=args.compression)))
    return 0


def _convert_many(args: argparse.Namespace) -> int:
    target = args.to or "parquet"
    sources = sources_of(args.paths)
    if not sources:
        raise ConvertUsageError(f"no trace files ({', '.join(TRACE_SUFFIXES)}) in {', '.join(args.paths)}")
    if target == "parquet":
        pyarrow_modules()
    prepare_output_directory(args.output_dir)
    inputs = file_ids(sources)
    failed = 0
    first_source_of: dict[str, str] = {}
    for source in sources:
        destination = destination_in(args.output_dir, source, target)
        # a.json and a.json.gz would both become a.parquet: the first keeps the name
        earlier = first_source_of.setdefault(os.path.abspath(destination), source)
        try:
            if earlier != source:
                raise ConvertUsageError(f"its destination {destination} is {earlier}'s; rename one of them")
            if file_ids([destination]) & inputs and not file_ids([source]) & file_ids([destination]):
                raise ConvertUsageError(
                    f"its destination {destination} is one of the traces converted, which is never "
                    "written over; convert into another directory"
                )
            written = convert_file(source, destination, compression=args.compression)
        except OutOfSpaceError:
            raise  # no other trace could be written either
        except Exception as exc:  # one bad trace is reported and the others converted
            failed += 1
            if not isinstance(exc, (PolyprofError, OSError)):
                log.error("convert_failed", source=source, exc_info=True)
            reason = str(exc).removeprefix(f"{source}: ")
            print_skipped(_PROG, source, reason)
            continue
        print(terminal_safe(written), flush=True)
    written_to = terminal_safe(args.output_dir)
    print(
        f"{_PROG}: {len(sources) - failed} of {len(sources)} traces written to {written_to}"
        + (f"; {failed} skipped (above)" if failed else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


__all__ = ["add_convert_command", "convert_file", "print_skipped", "run_convert_command"]
