"""``polyprof run``'s whole-script profile: a ``polyprof.profile`` around a script not profiling itself.

Each finished cycle's table goes to stderr and its trace into the output
directory. With ``--schedule`` every ``torch.optim`` optimizer step is a
profiler step. When the script starts a profiler of its own (any polyprof
recording: the process's recording gate tells a listener first), the
whole-script profile steps aside: it stops there and writes nothing, since
torch's collector keeps one session per process. Nothing it does raises into
the script; failures become notes, reported at the end.
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
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity
from polyprof.distributed import default_worker_name, rank_of_trace
from polyprof.exporting import export_trace
from polyprof.profiler import ACC_EVENTS_WARNING
from polyprof.run_options import RunOptions
from polyprof.run_target import RunTarget

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
        self._restore_destroy: Callable[[], None] | None = None
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
        self._watch_process_group_teardown()
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
    from polyprof.recording import recording_gate

    def step_aside_unless_own(holder: object) -> None:
        if holder is not whole.profile:
            whole.step_aside(holder)

    remove = recording_gate.add_listener(step_aside_unless_own)
    try:
        yield
    finally:
        remove()
