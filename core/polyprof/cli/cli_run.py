"""``polyprof run``: run a Python script or module with polyprof in torch's profiler's place.

::

    polyprof run [options] script.py [args ...]
    polyprof run [options] -m module [args ...]

The script runs as ``python script.py`` would run it (``sys.argv[1:]``, a
``__main__`` module with an absolute ``__file__``, ``sys.path[0]`` = the
script's directory; for ``-m`` the current directory), in this process, with
the shims of ``polyprof.shim`` installed. One difference: ``sys.argv[0]`` is
the script's absolute path (runpy sets it from ``__file__``), where python
keeps the path as typed. So:

* A script that profiles itself (``torch.profiler.profile``,
  ``torch.autograd.profiler.profile``, ``torch.autograd.profiler_legacy.profile``,
  or polyprof's own ``profile`` / ``legacy.profile``) gets polyprof's profilers
  and prints and writes what it always did. The options below do not change
  those profilers' arguments.
* A script that does not is profiled as a whole: a ``polyprof.profile`` with
  the options below wraps the run; its table goes to stderr and its trace into
  ``--output-dir``. When the script starts a profiler of its own, the
  whole-script profile stops right there and is not written (torch records one
  session per process), and polyprof run says so at the end.

``--schedule wait,warmup,active[,repeat]`` gives the whole-script profile
torch's schedule, with a step being one ``optimizer.step()`` of any
``torch.optim`` optimizer (the script never calls ``prof.step()``; this is the
step Kineto's on-demand tracing counts). Each cycle's table and trace are
written when the cycle ends; a cycle cut short by the end of the script is
written too, as torch does. A script that makes no optimizer step stays at
step 0: with ``wait`` or ``warmup`` above 0 nothing is recorded (polyprof run
says so).

Output: the script's stdout is left to the script; polyprof run writes its
table, the trace's path and its notes to stderr. Exit status: the script's
(``sys.exit(n)`` gives n; ``sys.exit("text")`` prints the text and gives 1);
an exception in the script prints its traceback (after the profile is
written) and gives 1 (130 for ``KeyboardInterrupt``); a missing script or
module, or an ``--output-dir`` that cannot be created or written into, gives 2
before anything runs (the directory is created, as torch's
``tensorboard_trace_handler`` creates its own, and removed again if it was made
for nothing). When the script succeeds but the profile cannot be written, the
status is 1.

This module is the command (``run_command``) and its parser; the parts it
runs are ``polyprof.cli.run_target`` (what runs, and how it ended),
``polyprof.cli.run_options`` (the options) and ``polyprof.cli.whole_script`` (the
whole-script profile).
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import os
import sys
import textwrap
from typing import Any, NoReturn, TextIO

from polyprof.base.activity import ProfilerActivity
from polyprof.base.errors import EXIT_USAGE
from polyprof.cli.run_options import RunOptions, add_run_options
from polyprof.cli.run_target import RunTarget, RunUsageError, ScriptOutcome, run_target, script_environment
from polyprof.cli.whole_script import (
    MESSAGE_PREFIX,
    WholeScriptProfile,
    flush_quietly,
    stepping_aside_for_script_profilers,
)
from polyprof.runtime.exporting import export_timeout_s

__all__ = ["add_run_command", "run_command"]


# ------------------------------------------------------------------ the command


def _check_output_options(pm: Any, options: RunOptions) -> tuple[frozenset[ProfilerActivity], Any]:
    """Resolve the activities and the exporter before the script runs (errors name the choices)."""
    from polyprof.base.config import ProfileConfig
    from polyprof.hooks.activity_resolution import resolve_activities

    activities = resolve_activities(pm, options.activities)
    config = ProfileConfig(
        activities=activities,
        record_shapes=options.record_shapes,
        profile_memory=options.profile_memory,
        with_stack=options.with_stack,
        with_flops=options.with_flops,
    )
    export_timeout_s()  # a bad POLYPROF_EXPORT_TIMEOUT_S fails now, not after the script
    # A broken third-party exporter is skipped for the next one (the built-in), as in a profile.
    known = len(pm.hook_failures())
    exporter = pm.make_exporter(config, options.format, isolate_errors=True)
    for failure in pm.hook_failures()[known:]:
        print(f"polyprof run: warning: {failure.message}", file=sys.stderr)
    return activities, exporter


def run_command(args: argparse.Namespace) -> int:
    """``polyprof run``: returns the exit status."""
    stream = sys.stderr
    try:
        target = RunTarget.from_args(args)
    except RunUsageError as exc:
        stream.write(f"{MESSAGE_PREFIX}: error: {exc}\n")
        return EXIT_USAGE
    options = RunOptions.from_args(args)
    from polyprof.base.errors import ActivityUnavailableError
    from polyprof.base.fileio import OutputPathError, prepare_output_directory
    from polyprof.frontends import shim
    from polyprof.hooks.registry import UnknownExporterError, make_plugin_manager

    with script_environment(target):
        problem = target.problem()
        if problem is not None:
            stream.write(f"{MESSAGE_PREFIX}: error: {problem}\n")
            return EXIT_USAGE
        if importlib.util.find_spec("torch") is None:  # found without importing it (that takes seconds)
            raise shim.TorchMissingError(
                "polyprof run puts polyprof behind torch's profiler and profiles torch code, so it needs "
                "torch, which is not installed here (pip install torch)"
            )
        run_pid = os.getpid()
        with make_plugin_manager() as pm:
            try:
                activities, exporter = _check_output_options(pm, options)
            except (ActivityUnavailableError, UnknownExporterError) as exc:
                if isinstance(exc, UnknownExporterError):
                    where = "argument --format: "
                else:
                    where = "argument --activities: " if options.activities is not None else ""
                stream.write(f"{MESSAGE_PREFIX}: error: {where}{exc}\n")
                return EXIT_USAGE
            except ValueError as exc:  # POLYPROF_EXPORT_TIMEOUT_S is not a number of seconds
                stream.write(f"{MESSAGE_PREFIX}: error: {exc}\n")
                return EXIT_USAGE
            # Before the script runs: a run of hours must not end in a directory that cannot take its trace.
            try:
                created_dir = prepare_output_directory(options.output_dir)
            except OutputPathError as exc:
                stream.write(f"{MESSAGE_PREFIX}: error: argument --output-dir: {exc}\n")
                return EXIT_USAGE
            if created_dir is not None:
                created_dir = os.path.abspath(created_dir)
            with shim.shimmed():
                whole = WholeScriptProfile(
                    options,
                    target=target,
                    activities=activities,
                    plugin_manager=pm,
                    exporter=exporter,
                    stream=stream,
                )
                with stepping_aside_for_script_profilers(whole):
                    whole.start()
                    try:
                        outcome = run_target(target)
                    finally:
                        flush_quietly(sys.stdout)
                        whole.finish()
    if os.getpid() != run_pid:
        _leave_forked_child(outcome)
    if created_dir is not None and not whole.written:
        _remove_empty_directories(whole.output_dir, up_to=created_dir)
    return _report(outcome, whole, stream)


def _leave_forked_child(outcome: ScriptOutcome) -> NoReturn:
    """End a child the script forked that left the script (``sys.exit`` or its end), not ``os._exit``.

    The profile, its notes and its files are the parent's. The child runs its Python
    exit handlers and exits with ``os._exit``, as multiprocessing ends forked children:
    a normal exit runs Kineto's static destructors, and the one of its config loader
    waits forever in a child forked after torch's profiler ran (torch 2.6 to 2.15,
    with torch.profiler as with polyprof).
    """
    if outcome.exception is not None:
        exc = outcome.exception
        sys.excepthook(type(exc), exc, exc.__traceback__)
    elif outcome.exit_message is not None:
        sys.stderr.write(outcome.exit_message + "\n")
    try:
        atexit._run_exitfuncs()
    finally:
        flush_quietly(sys.stdout)
        flush_quietly(sys.stderr)
        os._exit(outcome.exit_code)


def _remove_empty_directories(directory: str, *, up_to: str) -> None:
    """Remove ``directory`` and its parents up to ``up_to`` while they are empty (made for nothing).

    Nothing outside ``up_to`` is touched, whatever ``..`` the directory was named with.
    """
    while os.path.commonpath([directory, up_to]) == up_to:
        try:
            os.rmdir(directory)
        except OSError:  # not empty (the script wrote there), or gone
            return
        directory = os.path.dirname(directory)


def _report(outcome: ScriptOutcome, whole: WholeScriptProfile, stream: TextIO) -> int:
    stream.writelines(f"{MESSAGE_PREFIX}: {note}\n" for note in whole.summary_notes())
    stream.flush()
    if outcome.exception is not None:
        exc = outcome.exception
        sys.excepthook(type(exc), exc, exc.__traceback__)
    elif outcome.exit_message is not None:
        sys.stderr.write(outcome.exit_message + "\n")
    if whole.failed and outcome.exit_code == 0:
        return 1
    return outcome.exit_code


# ------------------------------------------------------------------ the parser


_USAGE = "polyprof run [options] script.py [args ...]\n       polyprof run [options] -m module [args ...]"

_EPILOG = textwrap.dedent(
    """\
    A script that profiles itself (torch.profiler.profile, torch.autograd.profiler.profile,
    torch.autograd.profiler_legacy.profile, polyprof.profile) gets polyprof's profilers and
    keeps its own arguments; the options above apply to the whole-script profile, which
    records a script that does not profile itself and steps aside when it does.

    --schedule counts one optimizer.step() (any torch.optim optimizer) as one profiler step;
    each cycle's table and trace are written when it ends.

    The table, the trace's path and notes go to stderr; the script's stdout is its own.
    Exit status: the script's; 1 if it raised; 2 for a missing script or module, or an
    --output-dir that cannot be created or written into (checked before the script runs).
    """
)


def add_run_command(subparsers: Any) -> None:
    """Add ``polyprof run`` to the ``polyprof`` command's subparsers."""
    parser = subparsers.add_parser(
        "run",
        help="run a script or module with polyprof in torch's profiler's place",
        usage=_USAGE,
        description=(
            "Run a Python script (or -m module) with polyprof's shims installed: its own torch.profiler / "
            "autograd profilers become polyprof's, and a script that does not profile itself is profiled "
            "as a whole."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(parser)
    parser.set_defaults(handler=run_command)
