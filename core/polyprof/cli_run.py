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
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import os
import re
import runpy
import socket
import sys
import textwrap
import threading
import time
import types
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TextIO

import attrs

from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity, coerce_activity
from polyprof.errors import PolyprofError
from polyprof.exporting import export_timeout_s, export_trace
from polyprof.profiler import ACC_EVENTS_WARNING

log = get_logger(__name__)

#: The table's default length on stderr.
DEFAULT_ROW_LIMIT = 20
DEFAULT_OUTPUT_DIR = "polyprof-out"
DEFAULT_FORMAT = "chrome"
#: File endings for exporters whose usual name differs from their first suffix (TensorBoard's for chrome).
_FILE_SUFFIX = {"chrome": ".pt.trace.json"}
_PREFIX = "polyprof run"
#: Exit status for usage errors (argparse's) and a missing script or module (python's).
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class RunUsageError(PolyprofError):
    """The command line or its target is unusable; the message says why (exit status 2)."""


# ------------------------------------------------------------------ options


@attrs.frozen
class ScheduleSpec:
    """``--schedule wait,warmup,active[,repeat]``."""

    wait: int
    warmup: int
    active: int
    repeat: int = 0

    def build(self) -> Callable[[int], Any]:
        from polyprof.schedule import schedule

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
    from polyprof.schedule import InvalidScheduleError

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


@attrs.frozen
class RunTarget:
    """What to run: a script path or a module name, and its arguments (``sys.argv[1:]``)."""

    kind: str  # "script" or "module"
    name: str
    args: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunTarget:
        if args.module is not None:
            if not args.module:
                raise RunUsageError("argument -m: expected a module name (polyprof run -m module [args ...])")
            name, *rest = args.module
            return cls("module", name, tuple(rest))
        if args.script is None:
            raise RunUsageError(
                "nothing to run: give a script (polyprof run [options] script.py [args ...]) "
                "or a module (polyprof run [options] -m module [args ...])"
            )
        return cls("script", args.script, tuple(args.args))

    @property
    def display_name(self) -> str:
        return self.name if self.kind == "script" else f"-m {self.name}"

    @property
    def file_stem(self) -> str:
        """A file-name-safe stem for trace files."""
        if self.kind == "module":
            return self.name
        base = os.path.basename(os.path.normpath(self.name))
        return os.path.splitext(base)[0] or "script"

    def sys_path_entry(self) -> str:
        """What ``python`` puts in ``sys.path[0]`` for this target."""
        if self.kind == "module":
            return os.getcwd()
        if os.path.isfile(self.name) and not zipfile.is_zipfile(self.name):
            return os.path.dirname(os.path.realpath(self.name))
        return os.path.abspath(self.name)  # a directory or zip file runs its __main__.py from itself

    def problem(self) -> str | None:
        """Why this target cannot run (python's wording), or None. Call with sys.path set up."""
        if self.kind == "script":
            if os.path.isfile(self.name):
                return None
            if os.path.isdir(self.name):
                if os.path.isfile(os.path.join(self.name, "__main__.py")):
                    return None
                return f"can't find '__main__' module in {self.name!r}"
            return f"can't open file {os.path.abspath(self.name)!r}: [Errno 2] No such file or directory"
        return _module_problem(self.name)


def _module_problem(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        return f"Error while finding module specification for {name!r} ({type(exc).__name__}: {exc})"
    if spec is None:
        return f"No module named {name}"
    if spec.submodule_search_locations is not None:  # a package runs as its __main__
        try:
            main_spec = importlib.util.find_spec(f"{name}.__main__")
        except (ImportError, ValueError):
            main_spec = None
        if main_spec is None:
            return f"No module named {name}.__main__; {name!r} is a package and cannot be directly executed"
    return None


# ------------------------------------------------------------------ running the target


@attrs.frozen
class ScriptOutcome:
    """How the script ended: its exit status, and the exception to report if it raised."""

    exit_code: int
    exception: BaseException | None = None
    #: ``sys.exit("text")``: the text python would print.
    exit_message: str | None = None


#: Modules whose frames come before the script's in a traceback (runpy is frozen: no usable file name).
_INTERNAL_MODULES = frozenset({"runpy", __name__})


def _script_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without runpy's and polyprof run's own frames in front."""
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in _INTERNAL_MODULES:
        tb = tb.tb_next
    return tb


def outcome_of_exit(exc: SystemExit) -> ScriptOutcome:
    """Exit status for ``SystemExit(code)``, as the interpreter computes it."""
    code = exc.code
    if code is None:
        return ScriptOutcome(0)
    if isinstance(code, int):
        return ScriptOutcome(int(code))
    return ScriptOutcome(1, exit_message=str(code))


@contextlib.contextmanager
def script_environment(target: RunTarget) -> Iterator[None]:
    """``sys.argv`` and ``sys.path[0]`` as python sets them for the target; put back afterwards.

    Restores the original list objects (and ``sys.path``'s contents), whatever the script did to them.
    """
    saved_argv = sys.argv
    saved_path, saved_path_items = sys.path, sys.path[:]
    sys.argv = [target.name, *target.args]
    entry = target.sys_path_entry()
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.append(entry)
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path = saved_path
        saved_path[:] = saved_path_items


def run_target(target: RunTarget) -> ScriptOutcome:
    """Run the target as ``__main__``; never raises what the script raises."""
    try:
        if target.kind == "script":
            # Absolute, as python makes a script's __file__ (runpy also puts it in sys.argv[0]).
            runpy.run_path(os.path.abspath(target.name), run_name="__main__")
        else:
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return outcome_of_exit(exc)
    except KeyboardInterrupt as exc:
        return ScriptOutcome(EXIT_INTERRUPTED, exc.with_traceback(_script_frames(exc.__traceback__)))
    except BaseException as exc:  # noqa: BLE001 - the script's error is reported like python reports it
        return ScriptOutcome(1, exc.with_traceback(_script_frames(exc.__traceback__)))
    return ScriptOutcome(0)


# ------------------------------------------------------------------ the whole-script profile


class WholeScriptProfile:
    """A ``polyprof.profile`` around the whole run, reporting each finished cycle to stderr.

    With a schedule, every ``torch.optim`` optimizer step is a profiler step.
    It steps aside (stops, writes nothing) when the script starts a profiler
    of its own. Nothing it does raises into the script: failures are noted
    and reported at the end.
    """

    def __init__(
        self,
        options: RunOptions,
        *,
        target: RunTarget,
        activities: frozenset[ProfilerActivity],
        plugin_manager: Any,
        exporter: Any,
        stream: TextIO,
    ) -> None:
        import polyprof

        self.options = options
        self.target = target
        self.stream = stream
        self.exporter = exporter
        #: Where traces go, fixed before the script runs: a script that changes directory does not move it.
        self.output_dir = os.path.abspath(options.output_dir)
        #: Paths written, one per delivered cycle.
        self.written: list[str] = []
        #: Problems and remarks, printed at the end.
        self.notes: list[str] = []
        self.failed = False
        self.optimizer_steps = 0
        self.stepped_aside_for: str | None = None
        #: Cycles delivered to ``on_trace_ready`` (written or not).
        self.cycles = 0
        self._active = False
        self._discard = False
        self._owner_thread = threading.get_ident()
        self._step_hook: Any = None
        experimental_config = None
        if options.with_stack:  # torch attaches Python stacks to ops only in verbose mode
            from torch._C._profiler import _ExperimentalConfig

            experimental_config = _ExperimentalConfig(verbose=True)
        self.profile = polyprof.profile(
            activities=activities,
            schedule=options.schedule.build() if options.schedule else None,
            on_trace_ready=self._deliver,
            record_shapes=options.record_shapes,
            profile_memory=options.profile_memory,
            with_stack=options.with_stack,
            with_flops=options.with_flops,
            experimental_config=experimental_config,
            plugin_manager=plugin_manager,
        )

    def start(self) -> None:
        """Start recording (errors here are polyprof's and propagate: the script has not run yet)."""
        self.profile.__enter__()
        self._active = True
        self._owner_thread = threading.get_ident()
        if self.options.schedule is not None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._step_hook = register_optimizer_step_post_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._active:
            return
        self.optimizer_steps += 1
        try:
            with warnings.catch_warnings():
                # Each cycle is reported on its own, so torch's "events are cleared" warning is noise here.
                warnings.filterwarnings("ignore", message=re.escape(ACC_EVENTS_WARNING))
                self.profile.step()
        except Exception as exc:
            log.error("whole_script_step_failed", exc_info=True)
            self._fail(f"the whole-script profile failed at optimizer step {self.optimizer_steps}: {exc}")
            self._end(discard=True)

    def step_aside(self, other: Any) -> None:
        """The script starts its own profiler: stop here and write nothing."""
        if not self._active:
            return
        self.stepped_aside_for = f"{type(other).__module__}.{type(other).__qualname__}"
        if threading.get_ident() != self._owner_thread:
            self.notes.append(
                f"the script started its profiler on thread {threading.current_thread().name!r}, not the one "
                "running the script; torch's collector is per thread, so the whole-script collector could not "
                "be released cleanly from there (torch may warn about it)"
            )
        self._end(discard=True)

    def finish(self) -> None:
        """The script ended: stop and deliver what is pending."""
        if self._active:
            self._end(discard=False)

    def _end(self, *, discard: bool) -> None:
        self._active = False
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        self._discard = discard
        try:
            self.profile.__exit__(None, None, None)
        except Exception as exc:
            log.error("whole_script_stop_failed", exc_info=True)
            self._fail(f"stopping the whole-script profile failed: {type(exc).__name__}: {exc}")

    def _fail(self, message: str) -> None:
        self.failed = True
        self.notes.append(message)

    def _deliver(self, prof: Any) -> None:
        """``on_trace_ready``: table to stderr, trace into the output directory.

        It may run inside the script's ``optimizer.step()``, so failures are noted, never raised.
        """
        if self._discard:
            return
        self.cycles += 1
        title = f"{_PREFIX}: profile of {self.target.display_name}"
        if self.options.schedule is not None:
            title += f", cycle {self.cycles} (after {self.optimizer_steps} optimizer steps)"
        _flush_quietly(sys.stdout)
        try:
            sort_by = self.options.sort_by or (
                "self_device_time_total" if prof.use_device else "self_cpu_time_total"
            )
            # Shapes asked for are shown: grouped by them, the table gets torch's Input Shapes column.
            averages = prof.key_averages(group_by_input_shape=self.options.record_shapes)
            table = averages.table(sort_by=sort_by, row_limit=self.options.row_limit)
        except Exception as exc:
            log.error("whole_script_table_failed", exc_info=True)
            self._fail(f"could not build the table of cycle {self.cycles}: {type(exc).__name__}: {exc}")
        else:
            self.stream.write(f"{title}\n{table}" + ("" if table.endswith("\n") else "\n"))
        try:
            path = self._write_trace(prof)
        except Exception as exc:
            log.error("whole_script_trace_failed", exc_info=True)
            self._fail(f"could not write the trace of cycle {self.cycles}: {type(exc).__name__}: {exc}")
        else:
            self.written.append(path)
            self.stream.write(f"{_PREFIX}: trace written to {path}\n")
        self.stream.flush()

    def _write_trace(self, prof: Any) -> str:
        """Export one cycle's trace; return its path as the user named the directory."""
        # Made and checked before the script ran, but the script may have removed it.
        os.makedirs(self.output_dir, exist_ok=True)
        suffixes = tuple(getattr(self.exporter, "suffixes", ()) or ())
        suffix = _FILE_SUFFIX.get(self.options.format) or (
            suffixes[0] if suffixes else f".{self.options.format}"
        )
        worker = f"{self.target.file_stem}.{socket.gethostname()}_{os.getpid()}"
        path = os.path.join(self.output_dir, f"{worker}.{time.time_ns()}{suffix}")
        # bounded like a profile's own export: a hung exporter must not hang the whole run
        written = export_trace(self.exporter, prof.trace, path)
        if os.path.dirname(written) == self.output_dir:
            return os.path.join(self.options.output_dir, os.path.basename(written))
        return written

    def summary_notes(self) -> list[str]:
        """What to say at the end beyond the tables."""
        notes = list(self.notes)
        if self.stepped_aside_for is not None:
            notes.append(
                f"the script started its own profiler ({self.stepped_aside_for}); the whole-script profile "
                "stopped there and was not written (the script's profilers ran through polyprof)"
            )
        elif self.cycles == 0 and not self.failed:
            notes.append(
                f"nothing was recorded: the schedule never reached an active step "
                f"({self.optimizer_steps} optimizer steps seen; a step is one optimizer.step())"
            )
        return notes


def _flush_quietly(stream: Any) -> None:
    try:
        stream.flush()
    except Exception:  # noqa: BLE001 - a closed or odd stdout must not stop the report
        pass


@contextlib.contextmanager
def stepping_aside_for_script_profilers(whole: WholeScriptProfile) -> Iterator[None]:
    """Make the whole-script profile step aside when any other polyprof recording starts.

    Every polyprof recording (``polyprof.profile``, ``polyprof.legacy.profile``, the
    shims built on them, ``emit_itt``) takes the process's recording gate before
    touching torch's collector, which keeps one session per process; a gate listener
    hears of each one first.
    """
    from polyprof.recording import recording_gate

    def step_aside_unless_own(holder: object) -> None:
        if holder is not whole.profile:
            whole.step_aside(holder)

    remove = recording_gate.add_listener(step_aside_unless_own)
    try:
        yield
    finally:
        remove()


# ------------------------------------------------------------------ the command


def _check_output_options(pm: Any, options: RunOptions) -> tuple[frozenset[ProfilerActivity], Any]:
    """Resolve the activities and the exporter before the script runs (errors name the choices)."""
    from polyprof.activity_resolution import resolve_activities
    from polyprof.config import ProfileConfig

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
        stream.write(f"{_PREFIX}: error: {exc}\n")
        return EXIT_USAGE
    options = RunOptions.from_args(args)
    from polyprof import shim
    from polyprof.errors import ActivityUnavailableError
    from polyprof.fileio import OutputPathError, prepare_output_directory
    from polyprof.registry import UnknownExporterError, make_plugin_manager

    with script_environment(target):
        problem = target.problem()
        if problem is not None:
            stream.write(f"{_PREFIX}: error: {problem}\n")
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
                stream.write(f"{_PREFIX}: error: {where}{exc}\n")
                return EXIT_USAGE
            except ValueError as exc:  # POLYPROF_EXPORT_TIMEOUT_S is not a number of seconds
                stream.write(f"{_PREFIX}: error: {exc}\n")
                return EXIT_USAGE
            # Before the script runs: a run of hours must not end in a directory that cannot take its trace.
            try:
                created_dir = prepare_output_directory(options.output_dir)
            except OutputPathError as exc:
                stream.write(f"{_PREFIX}: error: argument --output-dir: {exc}\n")
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
                        _flush_quietly(sys.stdout)
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
        _flush_quietly(sys.stdout)
        _flush_quietly(sys.stderr)
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
    stream.writelines(f"{_PREFIX}: {note}\n" for note in whole.summary_notes())
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


def _strict_unknown_options(parser: argparse.ArgumentParser, valid: Sequence[str]) -> None:
    """Unknown options before the script are an error that lists the valid ones.

    argparse would hand them to the top-level parser, whose message shows only
    the top-level usage.
    """
    lenient = parser.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = lenient(args, namespace)
        if extras:
            parser.error(
                f"unrecognized option{'s' if len(extras) > 1 else ''}: {' '.join(extras)}; "
                f"valid options: {', '.join(valid)} (options go before the script; what follows "
                "the script or -m module is passed to it)"
            )
        return parsed, extras

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def add_run_command(subparsers: Any) -> None:
    """Add ``polyprof run`` to the ``polyprof`` command's subparsers."""
    from polyprof.table import VALID_SORT_KEYS

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
    parser.set_defaults(handler=run_command)


__all__ = [
    "DEFAULT_FORMAT",
    "DEFAULT_OUTPUT_DIR",
    "DEFAULT_ROW_LIMIT",
    "RunOptions",
    "RunTarget",
    "RunUsageError",
    "ScheduleSpec",
    "ScriptOutcome",
    "WholeScriptProfile",
    "add_run_command",
    "parse_activities",
    "parse_schedule",
    "run_command",
    "run_target",
    "script_environment",
]
