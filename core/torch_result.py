"""torch's own collector result, shared by every tracer that decodes rows from it.

CUPTI and PTI are process-wide, and a GPU build of torch hands them to its
Kineto as soon as its collector is prepared, even for CPU-only recording
(DESIGN.md, "One owner of CUPTI and PTI per process"). So where torch's
Kineto serves a device, polyprof asks torch's collector for that activity
and takes the device rows from its raw result. The public contract:

* a device plugin names the torch activities it needs through the
  ``polyprof_torch_collector_activities`` hook; the session collects them
  into ``ProfileConfig.torch_activities``;
* the tracer that drives torch's collector (a ``TorchCollectorOwner``, the
  built-in ``torch_cpu``) prepares it for CPU (when asked) plus those
  activities, and hands every raw result it takes, wrapped in a
  ``CollectorResult``, to each ``TorchResultTracer`` of the session;
* a ``TorchResultTracer`` records nothing itself: its ``decode`` turns the
  rows it owns into event batches on its own bus task, concurrently with
  the CPU rows.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from typing import Any

from polyprof.components import Tracer

#: torch's ``ProfilerActivity`` members a device plugin may ask torch's collector for (CPU is the
#: collector owner's own).
TORCH_COLLECTOR_ACTIVITY_NAMES = ("CUDA", "XPU", "MTIA", "HPU", "PrivateUse1")
#: Kineto's activity types (``_KinetoEvent.activity_type()``) of the rows the CPU tracer owns:
#: everything else in a collector result belongs to a device plugin.
HOST_ACTIVITY_TYPES = frozenset({"cpu_op", "user_annotation", "python_function", "cpu_instant_event"})


class CollectorResult:
    """One raw ``torch._C._autograd._ProfilerResult`` and what several decoders read of it once.

    Thread-safe: the CPU tracer and device tracers decode on their own bus
    tasks. ``events()`` is torch's list (pybind builds a new wrapper list on
    every call, so it is fetched once); ``activity_types()`` is each event's
    Kineto activity type where the installed torch has the accessor (2.12+),
    else None.
    """

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._lock = threading.Lock()
        self._events: list[Any] | None = None
        self._activity_types: list[str] | None = None
        self._read_once: dict[str, Any] = {}

    def events(self) -> list[Any]:
        with self._lock:
            if self._events is None:
                self._events = self.raw.events()
            return self._events

    def activity_types(self) -> list[str] | None:
        events = self.events()
        with self._lock:
            if self._activity_types is None:
                if not events or not hasattr(events[0], "activity_type"):
                    return None if events else []
                self._activity_types = [ev.activity_type() for ev in events]
            return self._activity_types

    def read_once(self, key: str, read: Callable[[Any], Any]) -> Any:
        """``read(raw)`` the first time ``key`` is asked for, the same value after.

        For what torch gives only once, such as its own writer's file
        (``result.save``: a result is written once), shared by the decoders.
        """
        with self._lock:
            if key not in self._read_once:
                self._read_once[key] = read(self.raw)
            return self._read_once[key]

    def release(self) -> None:
        """Drop the event wrappers (~330 bytes each); the raw result lives while anyone holds it."""
        with self._lock:
            self._events = None


class TorchResultTracer(Tracer):
    """A tracer whose rows come from torch's own collector result.

    It records nothing itself, so it hands nothing over while recording. The
    session connects it to the session's ``TorchCollectorOwner``, which puts
    each ``CollectorResult`` into this tracer's outbox and closes the outbox
    once the recording's last result is in. ``stop`` runs before the owner
    stops the collector (tracers stop in order, the owner last): the place to
    synchronize devices in use, as torch does before ``_disable_profiler``.
    """

    hands_over_while_recording = False

    def start(self) -> None:
        self.outbox.reopen()

    def stop(self) -> None:  # noqa: B027 - the owner closes the outbox
        """Before the collector stops (user's thread). Default: nothing."""

    def receive(self, result: CollectorResult) -> None:
        """A result of the collector (owner's thread, at stop or at a nested profiler's start)."""
        self.outbox.put(result)

    def results_complete(self) -> None:
        """The recording's last result is in (owner's thread)."""
        self.outbox.close()

    @abc.abstractmethod
    def decode(self, item: CollectorResult) -> list[Any]:
        """The event batches of this tracer's rows of ``item`` (its own bus task)."""


class TorchCollectorOwner(abc.ABC):
    """The one tracer of a session that drives torch's collector."""

    @abc.abstractmethod
    def share_results_with(self, tracer: TorchResultTracer) -> None:
        """Hand every result of the collector to ``tracer`` too, and tell it when they are complete."""


__all__ = [
    "HOST_ACTIVITY_TYPES",
    "TORCH_COLLECTOR_ACTIVITY_NAMES",
    "CollectorResult",
    "TorchCollectorOwner",
    "TorchResultTracer",
]
