"""``polyprof diff BASELINE CANDIDATE``: two runs compared per op, kernel, step and rank, and a CI gate.

Each side is a trace (``.json``, ``.json.gz``, ``.parquet``) or a directory of rank traces, as
``polyprof report`` takes them. The comparison, its noise rule and the gate are
``polyprof.ranks.diff``'s (its module notes say what is compared and how a change is judged).

Output: a text table (default) or ``--json``, ops and kernels sorted by ``--sort-by`` and cut to
``--row-limit`` rows, as ``polyprof report`` does. What could not be compared (ranks of one side
only, device activity on one side only, a side without steps) is said in the output; traces left
out of a side (empty, corrupt) are named on stderr, as ``polyprof report`` names them.

Exit status: 0; ``EXIT_SLOWER`` (3) when ``--fail-if-slower`` finds the candidate slower past the
limit and the noise, the reasons on stderr; ``EXIT_USAGE`` (2), one line on stderr and no traceback,
for a bad option, a side none of whose traces can be read, or a gate that cannot judge (no steps on
a side and no ``--only``, or an ``--only`` name on neither side; the comparison is printed first).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import Any

import attrs
import orjson

from polyprof.base.errors import EXIT_SLOWER, EXIT_USAGE, PolyprofError
from polyprof.base.terminal import terminal_safe
from polyprof.cli.cli_convert import print_skipped
from polyprof.cli.cli_report import DEFAULT_ROW_LIMIT, check_memory_limit, parse_row_limit
from polyprof.ranks.diff import (
    DEFAULT_MIN_TIME_US,
    DEFAULT_NOISE_FACTOR,
    DEFAULT_THRESHOLD,
    SORT_KEYS,
    DiffRule,
    GateError,
    GateResult,
    RunDiff,
    diff_json,
    diff_runs,
    gate,
    render_diff_text,
)

__all__ = ["add_diff_command", "parse_percent", "run_diff_command"]

_PROG = "polyprof diff"
_PERCENT = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*%\s*")


def parse_percent(text: str) -> float:
    """``"5%"`` as 0.05: the one form ``--threshold`` and ``--fail-if-slower`` take.

    :raises argparse.ArgumentTypeError: anything else (``0.05``, ``-5%``, ``5 percent``), naming the form.
    """
    match = _PERCENT.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a percentage: write a number and '%', e.g. 5% (a fraction such as 0.05 "
            "is not taken)"
        )
    return float(match["number"]) / 100


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0; got {text!r}")
    return value


def add_diff_command(subparsers: Any) -> None:
    """Add ``polyprof diff`` to the ``polyprof`` command's subparsers."""
    parser = subparsers.add_parser(
        "diff",
        help="compare two runs per op, kernel, step and rank; --fail-if-slower makes it a CI gate",
        description=(
            "Compare a candidate run with a baseline: each a trace (.json, .json.gz, .parquet) or a "
            "directory of rank traces. Per op (self CPU) and per kernel (total time): calls and times "
            "on each side, the change, and added, removed, faster, slower or unchanged; the median "
            "step time (ProfilerStep#N) of the run and of each rank. A change counts when it exceeds "
            "--threshold of the smaller time and the noise: --noise-factor times the standard error of "
            "the difference of the median step times; for ops and kernels, which have no per-step "
            "times, at least --min-time microseconds and the steps' relative noise. See docs/cli.md."
        ),
        epilog=(
            f"Exit status: 0; {EXIT_SLOWER} when --fail-if-slower finds the candidate slower; "
            f"{EXIT_USAGE} for a bad option or input, or a gate that cannot judge."
        ),
    )
    parser.add_argument("baseline", metavar="BASELINE", help="the baseline: a trace file or a directory")
    parser.add_argument("candidate", metavar="CANDIDATE", help="the candidate: a trace file or a directory")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON (times in µs)")
    parser.add_argument(
        "--sort-by",
        choices=SORT_KEYS,
        default="change",
        help="order of the op and kernel rows, largest first: change (by size, default), ratio, "
        "baseline, candidate; or name",
    )
    parser.add_argument(
        "--row-limit",
        metavar="N",
        type=parse_row_limit,
        default=DEFAULT_ROW_LIMIT,
        help=f"print at most N op rows and N kernel rows; -1 prints every row (default {DEFAULT_ROW_LIMIT})",
    )
    parser.add_argument(
        "--threshold",
        metavar="PCT",
        type=parse_percent,
        default=DEFAULT_THRESHOLD,
        help=f"a change below this share of the smaller time is none (default {DEFAULT_THRESHOLD * 100:g}%%)",
    )
    parser.add_argument(
        "--noise-factor",
        metavar="K",
        type=_non_negative,
        default=DEFAULT_NOISE_FACTOR,
        help=f"a change must exceed K standard errors of the difference of median step times (default "
        f"{DEFAULT_NOISE_FACTOR:g})",
    )
    parser.add_argument(
        "--min-time",
        metavar="US",
        type=_non_negative,
        default=DEFAULT_MIN_TIME_US,
        help=f"an op's or kernel's change must exceed US microseconds (default {DEFAULT_MIN_TIME_US:g})",
    )
    parser.add_argument(
        "--fail-if-slower",
        metavar="PCT",
        type=parse_percent,
        default=None,
        help=f"exit with status {EXIT_SLOWER} when the median step time (or, with --only, a named op or "
        "kernel) is slower by more than PCT (e.g. 5%%) and the noise",
    )
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        default=[],
        help="only this op or kernel (exact name; repeat for more): in the tables and for the gate",
    )
    parser.add_argument(
        "--memory-limit", metavar="SIZE", help="DuckDB's memory limit, e.g. 2GB (past it, it spills to disk)"
    )
    parser.set_defaults(handler=run_diff_command)


def run_diff_command(args: argparse.Namespace) -> int:
    """Print the comparison; exit ``EXIT_SLOWER`` when the gate fails, ``EXIT_USAGE`` on bad input or
    a gate that cannot judge (after the comparison is printed)."""
    try:
        if args.memory_limit is not None:
            try:
                check_memory_limit(args.memory_limit)
            except ValueError as exc:
                raise ValueError(f"argument --memory-limit: {exc}") from None
        rule = DiffRule(threshold=args.threshold, noise_factor=args.noise_factor, min_time_us=args.min_time)
        diff = diff_runs([args.baseline], [args.candidate], rule=rule, memory_limit=args.memory_limit)
    except (PolyprofError, ValueError) as exc:
        print(f"{_PROG}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    for side in (diff.baseline, diff.candidate):
        for skipped in side.skipped:
            print_skipped(f"{_PROG} ({side.label})", skipped.path, skipped.reason)
    verdict: GateResult | None = None
    problem: str | None = None
    if args.fail_if_slower is not None:
        try:
            verdict = gate(diff, args.fail_if_slower, args.only)
        except GateError as exc:
            problem = str(exc)
    elif args.only:
        unknown = sorted(set(args.only) - {r.name for r in diff.rows()})
        if unknown:
            diff = attrs.evolve(
                diff,
                notes=(*diff.notes, "--only names no op or kernel of either side: " + ", ".join(unknown)),
            )
    # The exit status is settled before anything is written: a reader that leaves early (`| head`)
    # must not turn a failed gate into a pass.
    status = EXIT_USAGE if problem is not None else EXIT_SLOWER if verdict and verdict.failed else 0
    try:
        _write(args, diff, verdict, problem)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                os.dup2(devnull, stream.fileno())  # so the interpreter's final flush does not fail again
    return status


def _write(args: argparse.Namespace, diff: RunDiff, verdict: GateResult | None, problem: str | None) -> None:
    """The comparison on stdout; the gate's verdict, or why it could not judge, on stderr."""
    shown = _only(diff, args.only)
    if args.json:
        data = diff_json(shown, sort_by=args.sort_by, row_limit=args.row_limit)
        if args.fail_if_slower is not None:
            data["gate"] = {
                "limit": args.fail_if_slower,
                "only": args.only,
                "failed": None if verdict is None else verdict.failed,
                "reasons": [problem] if verdict is None else list(verdict.reasons),
            }
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_diff_text(shown, sort_by=args.sort_by, row_limit=args.row_limit))
    sys.stdout.flush()
    if problem is not None:
        print(f"{_PROG}: error: {terminal_safe(problem)}", file=sys.stderr)
    elif verdict is not None:
        word = "FAILED" if verdict.failed else "passed"
        for reason in verdict.reasons:
            print(f"{_PROG}: gate {word}: {reason}", file=sys.stderr)
    sys.stderr.flush()


def _only(diff: RunDiff, names: list[str]) -> RunDiff:
    if not names:
        return diff
    wanted = set(names)
    return attrs.evolve(
        diff,
        ops=tuple(r for r in diff.ops if r.name in wanted),
        kernels=tuple(r for r in diff.kernels if r.name in wanted),
    )
