"""``polyprof run``'s options: parsing them, and what they ask of the whole-script profile.

``add_run_options`` puts them on the ``run`` subparser, with the script (or
``-m module``) and its arguments, and makes an unknown option before the
script an error that lists the valid ones. ``RunOptions`` is what they ask of
the whole-script profile; ``parse_schedule`` and ``parse_activities`` read
``--schedule`` and ``--activities``.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from polyprof.base.activity import ProfilerActivity, coerce_activity

__all__ = [
    "DEFAULT_FORMAT",
    "DEFAULT_OUTPUT_DIR",
    "DEFAULT_ROW_LIMIT",
    "RunOptions",
    "ScheduleSpec",
    "add_run_options",
    "parse_activities",
    "parse_schedule",
]

#: The table's default length on stderr.
DEFAULT_ROW_LIMIT = 20
DEFAULT_OUTPUT_DIR = "polyprof-out"
DEFAULT_FORMAT = "chrome"


@attrs.frozen
class ScheduleSpec:
    """``--schedule wait,warmup,active[,repeat]``."""

    wait: int
    warmup: int
    active: int
    repeat: int = 0

    def build(self) -> Callable[[int], Any]:
        from polyprof.frontends.schedule import schedule

        return schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat)


def parse_schedule(text: str) -> ScheduleSpec:
    """Parse ``wait,warmup,active[,repeat]`` (argparse ``type``)."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give wait,warmup,active or wait,warmup,active,repeat (e.g. 1,1,3 or 1,1,3,2)"
        )
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: wait, warmup, active and repeat must be integers"
        ) from None
    spec = ScheduleSpec(*numbers)
    from polyprof.frontends.schedule import InvalidScheduleError

    try:
        with warnings.catch_warnings():  # the no-warmup warning comes once, when the profile is built
            warnings.simplefilter("ignore")
            spec.build()
    except InvalidScheduleError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    return spec


def parse_activities(text: str) -> frozenset[ProfilerActivity]:
    """Parse ``cpu,cuda,xpu`` (argparse ``type``)."""
    valid = ", ".join(a.name.lower() for a in ProfilerActivity)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no activity given; valid activities: {valid}")
    chosen = set()
    for name in names:
        try:
            chosen.add(coerce_activity(name))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"unknown activity {name!r}; valid activities: {valid}"
            ) from None
    return frozenset(chosen)


@attrs.frozen
class RunOptions:
    """How the whole-script profile records and reports."""

    activities: frozenset[ProfilerActivity] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    schedule: ScheduleSpec | None = None
    sort_by: str | None = None
    row_limit: int = DEFAULT_ROW_LIMIT
    output_dir: str = DEFAULT_OUTPUT_DIR
    format: str = DEFAULT_FORMAT

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        return cls(
            activities=args.activities,
            record_shapes=args.record_shapes,
            profile_memory=args.profile_memory,
            with_stack=args.with_stack,
            with_flops=args.with_flops,
            schedule=args.schedule,
            sort_by=args.sort_by,
            row_limit=args.row_limit,
            output_dir=args.output_dir,
            format=args.format,
        )


def _strict_unknown_options(parser: argparse.ArgumentParser, valid: Sequence[str]) -> None:
    """Unknown options before the script are an error that lists the valid ones.

    ``parser``'s parse becomes argparse's own (``argparse.ArgumentParser.parse_known_args``, which
    hands unknown arguments back) and then this check. Its own class may refuse them first with a
    message that does not list them (``polyprof.cli.SubcommandParser``), or leave them to the
    top-level parser, whose message shows only the top-level usage (plain argparse).
    """

    def parse_known_args(args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = argparse.ArgumentParser.parse_known_args(parser, args, namespace)
        if extras:
            parser.error(
                f"unrecognized option{'s' if len(extras) > 1 else ''}: {' '.join(extras)}; "
                f"valid options: {', '.join(valid)} (options go before the script; what follows "
                "the script or -m module is passed to it)"
            )
        return parsed, extras

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign, assignment]


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Add the options, the script (or ``-m module``) and its arguments to ``polyprof run``'s parser."""
    from polyprof.analysis.table import VALID_SORT_KEYS

    valid: list[str] = ["-h", "--help"]

    def option(*names: str, **kwargs: Any) -> None:
        parser.add_argument(*names, **kwargs)
        valid.extend(names)

    option(
        "--activities",
        type=parse_activities,
        metavar="LIST",
        help="comma-separated activities to record: cpu, cuda, xpu, ... (default: all available here)",
    )
    option(
        "--record-shapes",
        action="store_true",
        help="record operator input shapes (the table groups rows by them)",
    )
    option("--profile-memory", action="store_true", help="record tensor memory allocations")
    option("--with-stack", action="store_true", help="record Python stacks of operators")
    option("--with-flops", action="store_true", help="estimate FLOPs of matmul and convolution operators")
    option(
        "--schedule",
        type=parse_schedule,
        metavar="W,WU,A[,R]",
        help="wait,warmup,active[,repeat] optimizer steps per cycle (default: record the whole run)",
    )
    option(
        "--sort-by",
        choices=VALID_SORT_KEYS,
        metavar="KEY",
        help="table sort key, one of torch's: self_cpu_time_total, cpu_time_total, self_device_time_total, "
        "count, ... (default: self_cpu_time_total, or self_device_time_total when a device is recorded)",
    )
    option(
        "--row-limit",
        type=int,
        default=DEFAULT_ROW_LIMIT,
        metavar="N",
        help="table rows; -1 for all (default: %(default)s)",
    )
    option(
        "--output-dir",
        default=DEFAULT_OUTPUT_DIR,
        metavar="DIR",
        help="directory for the trace files, created if missing; checked before the script runs "
        "(default: %(default)s)",
    )
    option(
        "--format",
        default=DEFAULT_FORMAT,
        metavar="NAME",
        help="exporter for the trace: chrome, stacks, or any installed plugin's (default: %(default)s)",
    )
    option(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="module",
        help="run a library module as a script, like python -m; what follows is its arguments",
    )
    parser.add_argument("script", nargs="?", help="the script to run (a .py file, directory or zip)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    _strict_unknown_options(parser, valid)
