"""Layer 10, the command line: ``polyprof`` (also ``python -m polyprof``), and this module its entry.

What lives in this folder: the parser and subcommand table (here), ``polyprof run``
(``cli_run``, ``run_options``, ``run_target`` and ``whole_script``, which profiles a whole script),
``polyprof report`` (``cli_report``), ``polyprof diff`` (``cli_diff``), ``polyprof convert``
(``cli_convert``) and ``polyprof merge`` (``cli_merge``). May import: every layer below, never
``polyprof`` itself (the package imports no command, and a command imports the frontends it runs).

Each subcommand is a function that adds its parser to the subparsers and sets
``handler`` (``args -> exit code``) as a default; ``SUBCOMMANDS`` lists them.
A new subcommand (``run``, ``report``) lives in its own module with an
``add_parser(subparsers)`` function and is appended to ``SUBCOMMANDS``.

This is the only place in polyprof that configures logging: diagnostics go to
stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from polyprof._version import __version__
from polyprof.base import torch_support
from polyprof.base.errors import EXIT_INTERRUPTED, EXIT_USAGE, PolyprofError
from polyprof.base.fileio import OutputPathError
from polyprof.base.log import get_logger
from polyprof.base.terminal import terminal_safe
from polyprof.cli.cli_convert import add_convert_command
from polyprof.cli.cli_diff import add_diff_command
from polyprof.cli.cli_merge import add_merge_command
from polyprof.cli.cli_report import add_report_command
from polyprof.cli.cli_run import add_run_command
from polyprof.hooks.plugin_discovery import ALLOW_LIST_ENV, DISABLE_AUTOLOAD_ENV, env_flag
from polyprof.hooks.plugin_info import PLUGIN_STATUSES, PluginInfo
from polyprof.hooks.registry import TRACE_ENV, make_plugin_manager

log = get_logger(__name__)

Handler = Callable[[argparse.Namespace], int]

#: Widest a wrapped table cell gets before it wraps onto more lines.
_MAX_CELL_WIDTH = {"STATUS": 56, "PROVIDES": 44}


# ---------------------------------------------------------------- logging


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (test capture swaps it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # the base class assigns it; we always follow sys.stderr
        pass


def configure_logging(verbosity: int = 0) -> None:
    """Send polyprof's log records to stderr: warnings, ``-v`` info, ``-vv`` debug.

    Library modules log through ``polyprof.base.log`` into the stdlib logger tree
    under ``polyprof``; only this entry point attaches a handler. Calling it
    again replaces the handler instead of adding a second one.
    """
    if verbosity >= 2:
        level = logging.DEBUG
    elif verbosity == 1 or env_flag(TRACE_ENV):
        level = logging.INFO
    else:
        level = logging.WARNING
    logger = logging.getLogger("polyprof")
    for old in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(old)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("polyprof %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)


# ---------------------------------------------------------------- plugins


def add_plugins_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list installed plugins, their status and what they provide",
        description=(
            "List every polyprof plugin: built-ins and those installed through the 'polyprof' "
            f"entry-point group. {DISABLE_AUTOLOAD_ENV}=1 and {ALLOW_LIST_ENV}=a,b apply as in a "
            "profiling session; plugins they leave out show as blocked."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of plugin records")
    parser.add_argument(
        "--tracebacks", action="store_true", help="after the table, print the traceback of each failed plugin"
    )
    parser.add_argument(
        "--import-torch",
        action="store_true",
        help=(
            "import torch first, so that plugins answer from torch itself (whether it sees a GPU, whether "
            "its profiler can be driven) instead of provisionally from its package files; takes seconds"
        ),
    )
    parser.set_defaults(handler=run_plugins_command)


def _provides(info: PluginInfo) -> str:
    caps = info.capabilities
    if caps is None:
        return "-"
    parts = []
    if caps.activities:
        parts.append("activities: " + ", ".join(sorted(a.name for a in caps.activities)))
    if caps.exporters:
        parts.append("exporters: " + ", ".join(caps.exporters))
    if caps.aggregators:
        parts.append("aggregators: " + ", ".join(caps.aggregators))
    return "; ".join(parts) or "-"


def format_plugin_table(infos: Sequence[PluginInfo]) -> str:
    """A plain-text table: name, distribution, version, status, provides (long cells wrap)."""
    header = ("NAME", "DISTRIBUTION", "VERSION", "STATUS", "PROVIDES")
    rows = [
        (
            info.name,
            info.distribution or "(in code)",
            info.version or "-",
            info.display_status,
            _provides(info),
        )
        for info in infos
    ]
    widths = []
    for col, title in enumerate(header):
        natural = max([len(title), *(len(row[col]) for row in rows)])
        widths.append(min(natural, _MAX_CELL_WIDTH.get(title, natural)))
    lines = ["  ".join(title.ljust(w) for title, w in zip(header, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [
            textwrap.wrap(text, width=w, break_on_hyphens=False) or [""]
            for text, w in zip(row, widths, strict=True)
        ]
        for i in range(max(len(c) for c in cells)):
            parts = [(c[i] if i < len(c) else "").ljust(w) for c, w in zip(cells, widths, strict=True)]
            lines.append("  ".join(parts).rstrip())
    counts: Counter[str] = Counter(info.status for info in infos)
    shown = [s for s in PLUGIN_STATUSES if counts[s] or s in ("loaded", "failed")]
    lines.append("")
    lines.append(f"{len(infos)} plugins: " + ", ".join(f"{counts[s]} {s}" for s in shown))
    return "\n".join(lines) + "\n"


def format_provisional_notes(infos: Sequence[PluginInfo]) -> str:
    """Under the table: which answers were given without torch, and what would confirm each."""
    provisional = [info for info in infos if info.provisional]
    if not provisional:
        return ""
    lines = [
        "",
        *textwrap.wrap(
            "Provisional: torch is not imported (that takes seconds), so these plugins answered from "
            "its package files and the machine; a profile imports torch and asks it "
            "(`polyprof plugins --import-torch` asks it now):",
            width=100,
        ),
    ]
    lines += [f"  {info.name}: {info.provisional}" for info in provisional]
    return "\n".join(lines) + "\n"


def run_plugins_command(args: argparse.Namespace) -> int:
    logger = logging.getLogger("polyprof")
    quiet = args.verbose == 0 and not env_flag(TRACE_ENV)
    level = logger.level
    if quiet:  # load failures are this command's output; do not repeat them as log lines
        logger.setLevel(logging.ERROR)
    if args.import_torch:
        torch_support.import_installed()
    try:
        with make_plugin_manager() as pm:
            infos = pm.plugin_infos()
    finally:
        logger.setLevel(level)
    out = sys.stdout
    if args.json:
        json.dump([info.to_dict() for info in infos], out, indent=2)
        out.write("\n")
        return 0
    out.write(format_plugin_table(infos))
    out.write(format_provisional_notes(infos))
    failed = [info for info in infos if info.traceback]
    if args.tracebacks:
        for info in failed:
            out.write(f"\n--- {info.name} ({info.module}) ---\n{info.traceback}")
    elif failed:
        out.write("Run `polyprof plugins --tracebacks` to see why plugins failed.\n")
    return 0


# --------------------------------------------------------------- kineto-reader


def add_kineto_reader_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "kineto-reader",
        help="show or build polyprof's compiled reader of torch's profiler result",
        description=(
            "polyprof reads torch's raw profiler result with a small C++ module built against the "
            "installed torch (15-30 s of CPU time, once per torch build, into a cache folder); without "
            "it, in pure Python, with identical results. POLYPROF_KINETO_READER=auto (default) builds it "
            "in the background at the lowest CPU priority after the first profile, and says so once; "
            "native builds it before the first profile; python never builds it. 'polyprof kineto-reader "
            "build' builds it now: run it once when installing on a cluster or into a container image. "
            "See docs/performance.md."
        ),
    )
    parser.add_argument("action", nargs="?", choices=("status", "build"), default="status")
    parser.add_argument("--force", action="store_true", help="with build: build again even when it is built")
    parser.set_defaults(handler=run_kineto_reader_command)


def run_kineto_reader_command(args: argparse.Namespace) -> int:
    from polyprof.native import native_reader

    reason = torch_support.unsupported_reason()
    if reason is not None:
        sys.stderr.write(f"polyprof kineto-reader: {reason}\n")
        return EXIT_USAGE
    if args.action == "build":
        state = native_reader.build(force=args.force)
        sys.stdout.write(f"compiled reader: {state.describe()}\n")
        return 0 if state.built else 1
    info = native_reader.describe_installed()
    sys.stdout.write(
        f"{native_reader.MODE_VARIABLE}={info['mode']}\n"
        f"torch {info['torch']}: compiled reader {info['state']}\n"
    )
    return 0


# --------------------------------------------------------------- the command

#: Functions that add one subcommand each (``add_parser(subparsers)``).
SUBCOMMANDS: list[Callable[[Any], None]] = [
    add_plugins_command,
    add_report_command,
    add_diff_command,
    add_convert_command,
    add_merge_command,
    add_run_command,
    add_kineto_reader_command,
]


#: What argparse reads as a value, not an option, after an option that takes one: a leading '-' then a
#: digit or '.digit' (``-5GB``, ``-1,1,2``, ``-.5``), as the newest argparse reads it. No polyprof
#: option starts so.
NEGATIVE_VALUE = re.compile(r"-\.?\d")


def read_negative_looking_values_as_values(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` read an argument that starts like a negative number (``NEGATIVE_VALUE``) as a
    value, not as an option.

    argparse has no public setting for this: it decides with its private ``_negative_number_matcher``,
    which in the Pythons polyprof supports matches plain numbers only (``-5``, ``-1.5``; the newest
    match ``NEGATIVE_VALUE``), so that ``--memory-limit -5GB`` is "expected one argument". This is
    the one place polyprof touches argparse's internals; tests/test_cli_usage.py fails if argparse
    drops or renames the attribute.
    """
    parser._negative_number_matcher = NEGATIVE_VALUE


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, reading a value that starts like a negative number as a value.

    ``--memory-limit -5GB`` and ``--schedule -1,1,2`` then reach the option's own check, which
    says what is wrong (``read_negative_looking_values_as_values``). Its subcommands' parsers are of
    ``SubcommandParser``, kept by name in ``commands``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        read_negative_looking_values_as_values(self)
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", SubcommandParser)
        subparsers = super().add_subparsers(**kwargs)
        self.commands = subparsers.choices
        return subparsers


class SubcommandParser(CommandParser):
    """A subcommand's parser: what it does not know is its own usage error.

    argparse hands a subcommand's unknown arguments back to the top-level parser, whose error
    shows polyprof's usage and ``polyprof: error:``; this one shows the command's usage and
    ``polyprof COMMAND: error:``, as for any other usage error of the command.
    """

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed, unknown


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="polyprof",
        description="polyprof: torch.profiler's API and output, faster, with any accelerator by plugin.",
    )
    parser.add_argument("--version", action="version", version=f"polyprof {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more to stderr (-v info, -vv debug)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``polyprof`` command; returns the exit code, ``EXIT_INTERRUPTED`` after Ctrl-C.

    For a caller in this process (tests, a program that runs the command); the ``polyprof``
    command itself is ``console_main``.
    """
    try:
        return _run_command(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def console_main() -> int:
    """The ``polyprof`` command and ``python -m polyprof``: ``main`` on ``sys.argv``, but Ctrl-C
    ends the process as it ends python: by SIGINT, so that a shell loop stops too.

    A shell that gets Ctrl-C while it waits for a command stops its loop or script only when the
    command died of SIGINT; a command that exits with status 130 is taken to have handled it, and
    ``for f in *; do polyprof convert ...; done`` would go on with the next file. So the interrupt
    is raised on out of the program, as python's own: its exit handlers run (a Ray cluster the
    command started is shut down), then python ends by SIGINT (status 130 in the shell; Windows has
    its own Ctrl-C status). The command already said "interrupted": no traceback is printed.
    """
    try:
        return _run_command(None)
    except KeyboardInterrupt:
        sys.excepthook = _quiet_about_interrupts(sys.excepthook)
        raise


def _quiet_about_interrupts(hook: Callable[..., Any]) -> Callable[..., Any]:
    def excepthook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            hook(kind, value, traceback)

    return excepthook


def _run_command(argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run its command; after Ctrl-C, says so and raises ``KeyboardInterrupt``."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse already printed
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    configure_logging(args.verbose)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = parser.commands[args.command].prog  # "polyprof report": errors carry the command's name
    try:
        return handler(args)
    except OutputPathError as exc:  # an output that cannot be written is refused, as a usage error
        print(f"{prog}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except PolyprofError as exc:
        print(f"{prog}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C stops the command: nothing more (the caller ends with 130)
        with contextlib.suppress(OSError, ValueError):  # stderr closed: the interrupt still ends it
            print(f"{prog}: interrupted", file=sys.stderr)
        raise
    except BrokenPipeError:  # `polyprof plugins | head`: the reader left; exit quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 0
    except OSError as exc:  # the machine refused (disk full, I/O error): one line, not a traceback
        log.debug("command_failed", command=args.command, exc_info=True)
        print(f"{prog}: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE


__all__ = [
    "SUBCOMMANDS",
    "CommandParser",
    "SubcommandParser",
    "build_parser",
    "configure_logging",
    "console_main",
    "format_plugin_table",
    "main",
    "read_negative_looking_values_as_values",
]
