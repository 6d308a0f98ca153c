"""``polyprof run``'s whole-script profile: a ``polyprof.profile`` around a script not profiling itself.

Each finished cycle's table goes to stderr and its trace into the output
directory. With ``--schedule`` every ``torch.optim`` optimizer step is a
profiler step, taken once that ``optimizer.step()`` has returned, outside torch's
``Optimizer.step#...`` range (``_StepsAfterTheRange``). When the script starts a
profiler of its own (any polyprof recording: the process's recording gate tells
a listener first), the whole-script profile steps aside: it stops there and writes nothing, since
torch's collector keeps one session per process. When code in the script stops
torch's profiler itself (PyTorch Lightning's ``PyTorchProfiler`` calls
``torch.autograd._disable_profiler()``), the note the cycle's trace carries
(``ProfilerStoppedOutsideNote``) becomes one of the notes at the end, in place
of the tracer's warning, and the whole-script profile ends with that cycle
(the recording gives torch's collector up to that code). Nothing it does raises
into the script; failures become notes, reported at the end.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from polyprof.base.activity import ProfilerActivity
from polyprof.base.distributed import default_worker_name, rank_of_trace
from polyprof.base.log import get_logger
from polyprof.base.user_warnings import ProfilerStoppedOutsideNote, ProfilerStoppedOutsideWarning
from polyprof.cli.run_options import RunOptions
from polyprof.cli.run_target import RunTarget
from polyprof.frontends.profiler import ACC_EVENTS_WARNING, profile
from polyprof.runtime.exporting import export_trace

log = get_logger(__name__)

__all__ = ["MESSAGE_PREFIX", "WholeScriptProfile", "flush_quietly", "stepping_aside_for_script_profilers"]

#: How ``polyprof run`` starts the lines it writes to stderr.
MESSAGE_PREFIX = "polyprof run"
#: File endings for exporters whose usual name differs from their first suffix (TensorBoard's for chrome).
_FILE_SUFFIX = {"chrome": ".pt.trace.json"}


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
        #: Code in the script stopped torch's profiler in a cycle that was not delivered (the profile
        #: stepped aside or failed); said at the end.
        self.stopped_outside_undelivered: ProfilerStoppedOutsideWarning | None = None
        #: Code in the script stopped torch's profiler: the profile ends after the cycle that says so.
        self._collector_lost = False
        #: Cycles delivered to ``on_trace_ready`` (written or not).
        self.cycles = 0
        self._active = False
        self._discard = False
        self._owner_thread = threading.get_ident()
        self._step_hooks: list[Any] = []
        #: Optimizer classes' ``step`` wrapped so each profiler step comes after torch's range closes.
        self._steps_after = _StepsAfterTheRange(self._advance)
        self._restore_destroy: Callable[[], None] | None = None
        experimental_config = None
        if options.with_stack:  # torch attaches Python stacks to ops only in verbose mode
            from torch._C._profiler import _ExperimentalConfig

            experimental_config = _ExperimentalConfig(verbose=True)
        self.profile = profile(
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
        self._watch_process_group_teardown()
        self._owner_thread = threading.get_ident()
        if self.options.schedule is not None:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._steps_after.install()
            # A class that escaped the wrapping at construction is wrapped at its first step
            # (that one step still advances inside torch's range, as a step always did before).
            self._step_hooks.append(register_optimizer_step_pre_hook(self._steps_after.wrap_step_of))
            self._step_hooks.append(register_optimizer_step_post_hook(self._on_optimizer_step))

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global optimizer post-hook: one profiler step, once the optimizer's ``step()`` returns.

        Torch calls it inside the step's ``Optimizer.step#...`` range; stopping or starting torch's
        collector while a range is open can crash the process, so the step waits for the wrapper
        around the class's ``step`` when there is one.
        """
        if not self._active:
            return
        if not self._steps_after.defer():
            self._advance()

    def _advance(self) -> None:
        """One optimizer step ended: the profile's ``step()``."""
        if not self._active:
            return
        self.optimizer_steps += 1
        try:
            with warnings.catch_warnings(), _stop_warnings_left_to_the_notes():
                # Each cycle is reported on its own, so torch's "events are cleared" warning is noise here.
                warnings.filterwarnings("ignore", message=re.escape(ACC_EVENTS_WARNING))
                self.profile.step()
        except Exception as exc:
            log.error("whole_script_step_failed", exc_info=True)
            self._fail(f"the whole-script profile failed at optimizer step {self.optimizer_steps}: {exc}")
            self._end(discard=True)
            return
        if self._collector_lost:  # later cycles would hold nothing from torch's collector
            self._end(discard=True)

    def step_aside(self, other: Any) -> None:
        """The script starts its own profiler: stop here and write nothing."""
        if not self._active:
            return
        self.stepped_aside_for = f"{type(other).__module__}.{type(other).__qualname__}"
        if threading.get_ident() != self._owner_thread:
            self.notes.append(
                f"the script started its profiler on thread {threading.current_thread().name!r}, not the one "
                "running the script; torch's collector is per thread, so the whole-script collector "
                "could not "
                "be released cleanly from there (torch may warn about it)"
            )
        self._end(discard=True)

    def finish(self) -> None:
        """The script ended: stop and deliver what is pending."""
        if self._active:
            self._end(discard=False)

    def _watch_process_group_teardown(self) -> None:
        """Note the process group's facts (``distributedInfo``) before the script destroys its group.

        The profile starts before the script makes its group and ends after the script, which
        usually destroys it first; ``torch.distributed.destroy_process_group`` is wrapped while the
        script runs, and put back at its end.
        """
        dist: Any = sys.modules.get("torch.distributed")  # ``import torch`` imports it
        destroy = getattr(dist, "destroy_process_group", None)
        if destroy is None:
            return

        @functools.wraps(destroy)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            # Any group: the default one is still up while a subgroup goes, and noting is idempotent.
            if self._active:
                try:
                    self.profile._note_distributed_info()
                except Exception:  # the script's teardown must go on
                    log.warning("whole_script_distributed_info_failed", exc_info=True)
            return destroy(*args, **kwargs)

        def restore() -> None:
            if dist.destroy_process_group is destroy_process_group:  # not if the script replaced it since
                dist.destroy_process_group = destroy

        dist.destroy_process_group = destroy_process_group
        self._restore_destroy = restore

    def _end(self, *, discard: bool) -> None:
        self._active = False
        if self._restore_destroy is not None:
            self._restore_destroy()
            self._restore_destroy = None
        for hook in self._step_hooks:
            hook.remove()
        self._step_hooks.clear()
        self._steps_after.remove()
        self._discard = discard
        try:
            with _stop_warnings_left_to_the_notes():
                self.profile.__exit__(None, None, None)
        except Exception as exc:
            log.error("whole_script_stop_failed", exc_info=True)
            self._fail(f"stopping the whole-script profile failed: {type(exc).__name__}: {exc}")

    def _note_outside_stop(self, prof: Any) -> None:
        """Keep the note of a cycle in which code in the script stopped torch's profiler, for the end."""
        try:
            notes = prof.trace.notes
        except Exception:  # noqa: BLE001 - no trace (trace_only, nothing recorded): no note either
            return
        for note in notes:
            if not isinstance(note, ProfilerStoppedOutsideNote):
                continue
            self._collector_lost = True
            if self._discard:
                self.stopped_outside_undelivered = note.warning
            else:
                which = f" (cycle {self.cycles})" if self.options.schedule is not None else ""
                self.notes.append(f"{note.warning.what}{which}; {note.warning.consequence}")

    def _fail(self, message: str) -> None:
        self.failed = True
        self.notes.append(message)

    def _deliver(self, prof: Any) -> None:
        """``on_trace_ready``: table to stderr, trace into the output directory.

        It may run inside the script's ``optimizer.step()``, so failures are noted, never raised.
        """
        if not self._discard:
            self.cycles += 1
        self._note_outside_stop(prof)
        if self._discard:
            return
        title = f"{MESSAGE_PREFIX}: profile of {self.target.display_name}"
        if self.options.schedule is not None:
            title += f", cycle {self.cycles} (after {self.optimizer_steps} optimizer steps)"
        flush_quietly(sys.stdout)
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
            self.stream.write(f"{MESSAGE_PREFIX}: trace written to {path}\n")
        self.stream.flush()

    def _write_trace(self, prof: Any) -> str:
        """Export one cycle's trace; return its path as the user named the directory."""
        # Made and checked before the script ran, but the script may have removed it.
        os.makedirs(self.output_dir, exist_ok=True)
        suffixes = tuple(getattr(self.exporter, "suffixes", ()) or ())
        suffix = _FILE_SUFFIX.get(self.options.format) or (
            suffixes[0] if suffixes else f".{self.options.format}"
        )
        # rank07_<host>_<pid> in a distributed job: the rank the trace noted (the group may be gone by
        # now, and a launcher such as srun sets no RANK), else the process's
        rank = rank_of_trace(dict(getattr(prof.trace, "metadata_json", {}) or {}))
        worker = f"{self.target.file_stem}.{default_worker_name(socket.gethostname(), os.getpid(), rank)}"
        path = os.path.join(self.output_dir, f"{worker}.{time.time_ns()}{suffix}")
        # bounded like a profile's own export: a hung exporter must not hang the whole run
        written = export_trace(self.exporter, prof.trace, path)
        if os.path.dirname(written) == self.output_dir:
            return os.path.join(self.options.output_dir, os.path.basename(written))
        return written

    def summary_notes(self) -> list[str]:
        """What to say at the end beyond the tables."""
        notes = list(self.notes)
        outside = self.stopped_outside_undelivered
        if self.stepped_aside_for is not None:
            started = f"the script started its own profiler ({self.stepped_aside_for})"
            if outside is not None:
                started = f"{outside.what}, then {started}"
            notes.append(
                f"{started}; the whole-script profile stopped there and was not written (the script's "
                "profilers ran through polyprof)"
            )
        elif outside is not None:
            notes.append(f"{outside.what} (that cycle was not written)")
        elif self.cycles == 0 and not self.failed:
            notes.append(
                f"nothing was recorded: the schedule never reached an active step "
                f"({self.optimizer_steps} optimizer steps seen; a step is one optimizer.step())"
            )
        return notes


class _StepsAfterTheRange:
    """Wraps optimizer classes' ``step`` so profiler steps come after torch's ``Optimizer.step`` range.

    Torch wraps each optimizer class's ``step`` once (``Optimizer._patch_step_function``, at
    construction) in a ``record_function("Optimizer.step#Class.step")`` range and calls the global
    step post-hooks inside it. Stopping and restarting torch's collector there, with that range
    open, can make torch's collector crash the process later (a range ending in a collector other
    than the one it started in). So each class's torch-wrapped ``step`` is wrapped once more,
    outside torch's wrapper, when torch wraps it; the post-hook only counts the step
    (``defer``), and ``advance`` runs once per counted step when the outermost wrapped call on
    that thread returns. The steps are the same, one per post-hook call, and end where the
    optimizer's ``step()`` returns. Classes are put back by ``remove``; a wrapper kept elsewhere
    (an LR scheduler's) calls through without effect after that.
    """

    _MARK = "_polyprof_steps_after_the_range"

    def __init__(self, advance: Callable[[], None]) -> None:
        self._advance = advance
        self._local = threading.local()
        self._wrapped: list[tuple[type, Any, Any]] = []
        self._patched: tuple[type, Any, Any] | None = None
        #: Classes whose ``step`` could not be wrapped (logged once each).
        self._unwrappable: weakref.WeakSet[type] = weakref.WeakSet()

    def install(self) -> None:
        """Wrap the classes torch wraps from now on, and those it already wrapped."""
        from torch.optim.optimizer import Optimizer

        original = Optimizer.__dict__.get("_patch_step_function")
        # torch 2.6 to 2.13 at least; without it, a class is wrapped at its first step (``wrap_step_of``)
        if callable(original):

            @functools.wraps(original)
            def _patch_step_function(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(optimizer, *args, **kwargs)
                self.wrap_step_of(optimizer)
                return result

            Optimizer._patch_step_function = _patch_step_function  # type: ignore[method-assign,assignment]
            self._patched = (Optimizer, original, _patch_step_function)
        pending = list(Optimizer.__subclasses__())
        while pending:  # classes already constructed before the script ran
            cls = pending.pop()
            pending.extend(cls.__subclasses__())
            self._wrap_step_of_class(cls)

    def wrap_step_of(self, optimizer: Any, *_: Any) -> None:
        """Wrap the ``step`` of ``optimizer``'s class (also a global step pre-hook: returns None)."""
        self._wrap_step_of_class(type(optimizer))

    def _wrap_step_of_class(self, cls: type) -> None:
        if getattr(getattr(cls, "step", None), self._MARK, False):  # every step: the usual case, first
            return
        if cls in self._unwrappable:
            return
        try:
            self._wrap_class(cls)
        except Exception:  # the step then advances inside torch's range, as before
            self._unwrappable.add(cls)  # said once per class, not at every step
            log.warning("whole_script_step_wrap_failed", optimizer=cls.__qualname__, exc_info=True)

    def _wrap_class(self, cls: type) -> None:
        owner = next((klass for klass in cls.__mro__ if "step" in vars(klass)), None)
        if owner is None:
            return
        step = vars(owner)["step"]
        # only torch's wrapper (``hooked``), once; a staticmethod or other descriptor is left alone
        if not callable(step) or not getattr(step, "hooked", False) or getattr(step, self._MARK, False):
            return
        import torch

        local = self._local
        advance = self._advance
        is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)

        # Its own name, so that own_frames keeps what it calls (the user's step) under with_stack.
        @functools.wraps(step)  # copies ``hooked``, so torch does not wrap it again
        def optimizer_step_after_the_range(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():  # transparent to torch.compile: its post-hook steps where it runs
                return step(*args, **kwargs)
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            try:
                return step(*args, **kwargs)
            finally:
                local.depth = depth
                if depth == 0:
                    counted, local.pending = getattr(local, "pending", 0), 0
                    for _ in range(counted):
                        advance()

        wrapper = optimizer_step_after_the_range
        # What torch's own wrapper wraps, as before: code that calls ``step.__wrapped__`` skips hooks.
        wrapper.__wrapped__ = getattr(step, "__wrapped__", step)
        setattr(wrapper, self._MARK, True)
        owner.step = wrapper  # type: ignore[attr-defined]
        self._wrapped.append((owner, step, wrapper))

    def defer(self) -> bool:
        """Count a step for the wrapper around the call in progress; False when there is none."""
        local = self._local
        if getattr(local, "depth", 0) == 0:
            return False
        local.pending = getattr(local, "pending", 0) + 1
        return True

    def remove(self) -> None:
        """Put back what ``install`` and ``wrap_step_of`` replaced (not what the script replaced since)."""
        if self._patched is not None:
            cls, original, patched = self._patched
            if vars(cls).get("_patch_step_function") is patched:
                cls._patch_step_function = original  # type: ignore[attr-defined]
            self._patched = None
        for owner, step, wrapper in reversed(self._wrapped):
            if vars(owner).get("step") is wrapper:
                owner.step = step
        self._wrapped.clear()


@contextlib.contextmanager
def _stop_warnings_left_to_the_notes() -> Iterator[None]:
    """Keep the tracer's ``ProfilerStoppedOutsideWarning`` off stderr while the profile steps or stops.

    It would point at polyprof's own command line; the note at the end says the same
    (``WholeScriptProfile._note_outside_stop`` reads it from the trace). Every other warning
    goes to the ``warnings.showwarning`` in place, untouched, and no filter changes.
    """
    shown = warnings.showwarning

    def showwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not issubclass(category, ProfilerStoppedOutsideWarning):
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    try:
        yield
    finally:
        if warnings.showwarning is showwarning:  # not if something replaced it meanwhile
            warnings.showwarning = shown


def flush_quietly(stream: Any) -> None:
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
    from polyprof.runtime.recording import recording_gate

    def step_aside_unless_own(holder: object) -> None:
        if holder is not whole.profile:
            whole.step_aside(holder)

    remove = recording_gate.add_listener(step_aside_unless_own)
    try:
        yield
    finally:
        remove()
