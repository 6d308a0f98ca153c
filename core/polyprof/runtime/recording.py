"""The lifecycle of a polyprof recording: the process-wide gate and the recording object.

torch's collector keeps one profiling session per process, so at most one polyprof
recording may run at a time. ``recording_gate`` enforces that for every frontend
(``polyprof.profile``, ``polyprof.legacy.profile``, the shims built on them,
``polyprof.emit_itt`` and ``polyprof run``'s whole-script profile). Listeners hear
of a recording about to start; ``polyprof run`` uses one to make its whole-script
profile step aside for the script's own profilers. A recording whose torch
collector session was ended by code outside polyprof (a library calling torch's
private ``torch.autograd._disable_profiler()``) records nothing more with it and
gives the gate up to the next recording that asks; it still finishes with what
it kept (docs/user-guide.md, "A library that stops torch's profiler").

``Recording`` is what a frontend composes: it holds the gate while the frontend
is active and owns the ``Session`` from creation to close, so the plugin hooks
``polyprof_session_start`` and ``polyprof_session_finish`` fire as a matched pair,
and a recording that ends shuts down its exporters and its plugin manager.
``emit_itt`` is the one frontend that takes the gate alone: it has no session
(torch's collector annotates ITT ranges itself and polyprof collects nothing).

``RecordOnce`` is the rule of torch's autograd and legacy profilers, which
``polyprof.legacy.profile`` and the autograd shim compose: ``enabled=False``
records nothing, and an object records once.

``os.fork()`` inside a recording: the child inherits the frontend object but not
the event bus's thread, so a ``Recording`` in a forked child never waits on the
bus or calls its tracers: leaving the with-block there ends the child's copy
without collecting or writing anything, a schedule's ``step()`` there does
nothing, and anything that would drive the tracers raises a RuntimeError saying
the recording is the parent's. The parent's recording goes on.
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from polyprof.base.errors import PolyprofError, ProfilerDisabledError
from polyprof.base.log import get_logger
from polyprof.runtime.exporting import export_trace  # at import: the first export should not pay for it

log = get_logger(__name__)

__all__ = ["RecordOnce", "Recording", "RecordingGate", "RecordingInProgressError", "recording_gate"]


class RecordingInProgressError(PolyprofError, RuntimeError):
    """A recording was started while another polyprof recording runs in this process."""


class RecordingGate:
    """At most one polyprof recording per process; listeners hear of each one about to start.

    ``acquire(holder, gives_way=...)`` calls every listener with ``holder``
    first (outside the lock, so a listener may stop and release another
    recording), then takes the gate or raises ``RecordingInProgressError``
    naming the holder. Listeners hear of a start that is then refused too:
    ``polyprof run``'s whole-script profile steps aside for any recording the
    script tries to start. A holder whose ``gives_way()`` answers True when
    another asks (its torch collector session was ended from outside) loses the
    gate to that one instead; its own ``release`` then does nothing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: object | None = None
        self._gives_way: Callable[[], bool] | None = None
        self._listeners: list[Callable[[object], None]] = []

    def acquire(self, holder: object, *, gives_way: Callable[[], bool] | None = None) -> None:
        """Take the gate for ``holder``.

        :param gives_way: asked, on the thread of a later ``acquire``, while
            ``holder`` has the gate: True lets that one have it (it must not
            raise; a failure counts as False).
        """
        for listener in tuple(self._listeners):
            listener(holder)
        with self._lock:
            if self._holder is not None:
                if not self._holder_gives_way():
                    raise RecordingInProgressError(
                        f"a polyprof profile is already recording ({self._holder!r}); profiles cannot be "
                        "nested or run concurrently, because torch's collector keeps one session per process "
                        "and the outer profile would silently lose its events. Stop the first profile before "
                        "starting another."
                    )
                log.info("recording_gate_given_up", holder=repr(self._holder), to=repr(holder))
            self._holder = holder
            self._gives_way = gives_way

    def _holder_gives_way(self) -> bool:
        if self._gives_way is None:
            return False
        try:
            return bool(self._gives_way())
        except Exception:
            log.warning("recording_gate_gives_way_failed", holder=repr(self._holder), exc_info=True)
            return False

    def release(self, holder: object) -> None:
        """Free the gate if ``holder`` has it (releasing twice, or someone else's, does nothing)."""
        with self._lock:
            if self._holder is holder:
                self._holder = None
                self._gives_way = None

    def current(self) -> object | None:
        """The frontend object recording now, or None."""
        return self._holder

    def add_listener(self, listener: Callable[[object], None]) -> Callable[[], None]:
        """Call ``listener(holder)`` before each recording starts; returns a function that removes it."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def _after_fork_in_child(self) -> None:
        # The parent's recording stays the parent's: the child starts with a free gate (and a
        # fresh lock, in case another thread of the parent held it at the fork).
        self._lock = threading.Lock()
        self._holder = None
        self._gives_way = None


#: The gate of this process.
recording_gate = RecordingGate()
if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=recording_gate._after_fork_in_child)


class Recording:
    """One frontend's recording: the gate, and its ``Session`` from creation to close.

    ``open()`` takes the gate; ``prepare``/``start``/``stop``/``abort`` drive the
    session, which is created on first use (``polyprof_session_start`` fires);
    ``close()`` ends it (``polyprof_session_finish`` fires, exporters shut down,
    the plugin manager closes when the session made it) and frees the gate. A
    frontend used again after ``close()`` gets a new session, and a new matched
    pair of hooks.
    """

    def __init__(self, holder: object, make_session: Callable[[], Any]) -> None:
        self._holder = holder
        self._make_session = make_session
        self._session: Any = None
        self._session_closed = False
        #: The process that last opened this recording; a forked child sees its parent's pid here.
        self._owner_pid: int | None = None
        self._recording = False

    # ------------------------------------------------------------ state

    @property
    def recording(self) -> bool:
        """True between ``start()`` and ``stop()``/``abort()``."""
        return self._recording

    @property
    def in_forked_child(self) -> bool:
        """True in a process forked from the one that recorded; its recording and data are the parent's."""
        return self._owner_pid is not None and os.getpid() != self._owner_pid

    @property
    def session(self) -> Any:
        """The current session (also after ``close()``, for its config and aggregators), or None."""
        return self._session

    @property
    def live_session(self) -> Any:
        """The session while it is open (created and not yet closed), else None."""
        return None if self._session_closed else self._session

    def forked_child_message(self) -> str:
        return (
            f"this profile was started in process {self._owner_pid}; this is a child process "
            f"({os.getpid()}) forked while it recorded, which records nothing: the parent's profile has "
            "the data"
        )

    # ------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Take the process's recording gate (raises ``RecordingInProgressError`` if taken).

        The gate goes to a later recording that asks for it once code outside polyprof has
        ended this recording's torch collector session (``Session.collector_lost``).
        """
        recording_gate.acquire(self._holder, gives_way=self._collector_lost)
        self._owner_pid = os.getpid()

    def _collector_lost(self) -> bool:
        session = self.live_session
        return session is not None and not self.in_forked_child and bool(session.collector_lost())

    def ensure_session(self) -> Any:
        """The open session, created (``polyprof_session_start`` fires) if there is none."""
        if self._session is None or self._session_closed:
            self._session = self._make_session()
            self._session_closed = False
        return self._session

    def prepare(self, trace_id: str = "") -> None:
        self._refuse_in_forked_child("prepare")
        self.ensure_session().prepare(trace_id=trace_id)

    def start(self) -> None:
        self._refuse_in_forked_child("start")
        self.ensure_session().start()
        self._recording = True

    def stop(self, *, metadata_json: Mapping[str, str] | None = None, trace_id: str = "") -> Any:
        """Stop the tracers and return the cycle's ``Trace``.

        Whatever happens in the session's stop (an interrupt included), the recording is over
        afterwards: the session stops every tracer before letting an interrupt go.
        """
        self._refuse_in_forked_child("stop")
        if self._session is None:
            raise RuntimeError("stop() on a recording that never started: there is no session to stop")
        try:
            return self._session.stop(metadata_json=metadata_json, trace_id=trace_id)
        finally:
            self._recording = False

    def _refuse_in_forked_child(self, step: str) -> None:
        if self.in_forked_child:
            raise RuntimeError(f"cannot {step} the recording here: {self.forked_child_message()}")

    def abort(self) -> None:
        """Leave no tracer running after an error; what they recorded is discarded."""
        if not self._recording:
            return
        self._recording = False
        if self.in_forked_child:
            return
        try:
            self._session.abort()
        except Exception:  # already failing; keep the first error
            log.warning("session_abort_failed", exc_info=True)

    def trace_ready(self, trace: Any) -> None:
        """Tell plugins a trace is finished (``polyprof_trace_ready``)."""
        if self._session is not None:
            self._session.trace_ready(trace)

    def close(self) -> None:
        """End the session (hooks, exporters, plugin manager) and free the gate; safe to call twice.

        In a forked child nothing of the parent's recording is touched: the bus thread
        does not exist there, and the plugins belong to the parent.
        """
        try:
            if self.in_forked_child:
                log.debug("recording_left_in_forked_child", parent=self._owner_pid, child=os.getpid())
                self._recording = False
            elif self._session is not None and not self._session_closed:
                self._session_closed = True
                try:
                    self._session.shutdown()
                except Exception:  # cleanup; plugin errors are already isolated and warned
                    log.warning("session_shutdown_failed", exc_info=True)
        finally:
            recording_gate.release(self._holder)

    # ------------------------------------------------------------ output

    def export(self, name: str, trace: Any, path: str, **options: Any) -> str:
        """Write ``trace`` with the exporter called ``name``, within its deadline.

        After ``close()`` the exporter is made for this one export and shut down
        after it, since nothing else would.
        """
        session = self._session
        if session is None:
            raise RuntimeError("nothing to export: this profile has not recorded yet")
        exporter = session.exporter(name)
        try:
            return export_trace(exporter, trace, path, plugin_manager=session.plugin_manager, **options)
        finally:
            if self._session_closed:
                session.release_exporters()


class _Phase(enum.Enum):
    NEW = "new"
    RECORDING = "recording"
    FINISHED = "finished"


class RecordOnce:
    """``enabled`` and one recording per object: the rule of torch's autograd and legacy profilers.

    A frontend with that rule asks it at ``__enter__`` (``enter``), at
    ``__exit__`` (``leave``) and before each result (``check_enabled``):

    * ``enabled=False``: ``enter`` starts nothing and returns False, any number
      of times (torch's ``__enter__`` returns early too); ``leave`` returns
      False; results raise ``ProfilerDisabledError`` naming the result asked for.
    * Enabled: the first ``enter`` runs ``start``; entering again raises torch's
      ``RuntimeError("Profiler context manager is not reentrant")``, saying
      whether the profile is recording or has recorded. An ``enter`` whose
      ``start`` raised leaves the object as new: nothing was recorded, so it
      may be entered again.

    :param frontend: how messages name the frontend's class, as its users wrote
        it (``"polyprof.legacy.profile"``).
    """

    def __init__(self, *, enabled: bool, frontend: str) -> None:
        self.enabled = enabled
        self.frontend = frontend
        self._phase = _Phase.NEW

    @property
    def entered(self) -> bool:
        """torch's ``entered``: recording started (and perhaps ended); False while disabled."""
        return self._phase is not _Phase.NEW

    @property
    def recording(self) -> bool:
        """Entered and not yet left."""
        return self._phase is _Phase.RECORDING

    @property
    def finished(self) -> bool:
        """The one recording has ended (``leave`` returned True)."""
        return self._phase is _Phase.FINISHED

    def enter(self, start: Callable[[], None]) -> bool:
        """Run ``start`` for the one recording; False (and nothing run) when disabled."""
        if not self.enabled:
            return False
        if self._phase is _Phase.RECORDING:
            raise RuntimeError("Profiler context manager is not reentrant: this profile is already recording")
        if self._phase is _Phase.FINISHED:
            raise RuntimeError(
                f"Profiler context manager is not reentrant: this {self.frontend} has already recorded once; "
                f"create a new {self.frontend}(...) to profile again"
            )
        start()
        self._phase = _Phase.RECORDING
        return True

    def leave(self) -> bool:
        """At ``__exit__``: True when this ends the recording (stop it now), once; else False."""
        if not self.enabled or self._phase is not _Phase.RECORDING:
            return False
        self._phase = _Phase.FINISHED
        return True

    def check_enabled(self, what: str) -> None:
        """Raise ``ProfilerDisabledError`` naming ``what`` when the profile is disabled."""
        if not self.enabled:
            raise ProfilerDisabledError(
                f"{what}: the profiler was disabled (enabled=False), so it recorded nothing. "
                f"Create it with {self.frontend}(enabled=True, ...) to get results."
            )
