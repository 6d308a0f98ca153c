"""What ``polyprof run`` runs: a script or a module, in ``__main__``, as python would run it.

``RunTarget`` names it (from the command line) and says why it cannot run, in
python's words; ``script_environment`` sets ``sys.argv`` and ``sys.path[0]`` as
python sets them for it, and puts them back; ``run_target`` runs it and turns
how it ended (a return, ``sys.exit``, an exception) into a ``ScriptOutcome``
with the exit status python would give.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import runpy
import sys
import types
import zipfile
from collections.abc import Iterator

import attrs

from polyprof.base.errors import EXIT_INTERRUPTED, PolyprofError

__all__ = [
    "RunTarget",
    "RunUsageError",
    "ScriptOutcome",
    "outcome_of_exit",
    "run_target",
    "script_environment",
]


class RunUsageError(PolyprofError):
    """The command line or its target is unusable; the message says why (exit status 2)."""


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
