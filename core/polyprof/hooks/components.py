"""The small interfaces that plugins implement.

Hooks (``polyprof.hooks.hookspecs``) build these objects once per session; after that
polyprof calls their methods directly, never a hook per event.

Threads: ``Tracer.configure/prepare/start/stop/toggle_collection`` run on the profiled (user's) thread,
because torch's profiler state is per thread. ``Tracer.decode`` runs on the bus thread;
``Subscriber.consume`` and ``Subscriber.finish`` run on a bus worker thread,
one call at a time per subscriber, never on the user's thread (so a slow
subscriber cannot stall the bus or the others).
``Exporter.export`` runs on whichever thread asks for the file (usually the user's).

``Aggregator`` lives next to what it returns, in ``polyprof.analysis.averages``.
"""

from __future__ import annotations

import abc
import queue
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import attrs

from polyprof.base.activity import ProfilerActivity
from polyprof.base.trace import JsonValue

if TYPE_CHECKING:
    from polyprof.base.config import ProfileConfig
    from polyprof.base.events import EventBatch
    from polyprof.base.trace import Trace


class TraceMetadata(TypedDict, total=False):
    """What ``Tracer.trace_metadata`` returns: facts for the trace; any key may be left out.

    The session takes the earliest ``start_ns`` and the latest ``end_ns`` of its tracers (0 or
    missing: not known; then the events' span), and gathers the others into the ``Trace``.
    """

    #: When this tracer's recording started, ns since the epoch (``Trace.start_ns``).
    start_ns: int
    #: When it ended, ns since the epoch (``Trace.end_ns``).
    end_ns: int
    #: Kineto's ``deviceProperties``: one JSON object per device (``Trace.device_properties``).
    device_properties: Sequence[Mapping[str, JsonValue]]
    #: Notes for the user, e.g. "cuda: 12 records dropped by CUPTI" (``Trace.notes``).
    notes: Sequence[str]
    #: Trace header entries: key -> JSON text (``Trace.metadata_json``).
    metadata_json: Mapping[str, str]


# Typed converters: mypy's attrs plugin cannot bind frozenset's or tuple's type variable when
# the converter is the class itself.
def _activity_set(values: Iterable[ProfilerActivity]) -> frozenset[ProfilerActivity]:
    return frozenset(values)


def _name_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class Capabilities:
    """What one plugin provides; shown by ``polyprof plugins``."""

    activities: frozenset[ProfilerActivity] = attrs.field(default=frozenset(), converter=_activity_set)
    exporters: tuple[str, ...] = attrs.field(default=(), converter=_name_tuple)
    aggregators: tuple[str, ...] = attrs.field(default=(), converter=_name_tuple)
    #: None when usable here, else the reason it is not ("no CUDA driver").
    unavailable_reason: str | None = None
    #: How it records here, when that can differ (``polyprof plugins`` shows it next to the status),
    #: e.g. "via torch's Kineto (CUDA 13.0)".
    mode: str | None = None
    #: Set when the answer was given without asking torch, which is not imported (listing plugins
    #: never imports it: that takes seconds): what a profile asks when it starts, which confirms or
    #: overturns it, e.g. "whether torch sees a GPU". A profile imports torch and asks such plugins
    #: again (``PolyprofPluginManager.confirm_provisional``), so it goes by torch's answers.
    provisional: str | None = None


class Outbox:
    """Thread-safe hand-over from a tracer to the bus.

    ``put`` never blocks, so native callbacks on foreign threads can call it.
    The bus's pull task drains it. ``close`` says no more items will come.
    """

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = threading.Event()

    def put(self, item: Any) -> None:
        self._items.put(item)

    def drain(self) -> list[Any]:
        items = []
        while True:
            try:
                items.append(self._items.get_nowait())
            except queue.Empty:
                return items

    def close(self) -> None:
        self._closed.set()

    def reopen(self) -> None:
        self._closed.clear()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def empty(self) -> bool:
        return self._items.empty()


class Tracer(abc.ABC):
    """Records one or more activities and hands raw data to ``outbox``.

    Life cycle per recording: ``configure`` (when the session's configuration
    changed), ``prepare`` (optional warm-up), ``start``, ``stop``. ``stop``
    must leave everything recorded in the outbox and then close it. ``decode``
    turns an outbox item into event batches on the bus thread; the default
    treats items as ready ``EventBatch`` objects. ``toggle_collection`` pauses
    and resumes a running recording, for tracers that can.
    """

    #: Short name, unique per session ("torch_cpu", "cupti").
    name: str = "tracer"
    #: The activities this tracer records.
    activities: frozenset[ProfilerActivity] = frozenset()
    #: False for a tracer that puts nothing in its outbox between ``start`` and ``stop`` (or a
    #: ``flush``): the bus then drains it only when woken, instead of every poll interval, and
    #: its thread stays asleep while recording (torch's Python tracer records every thread's
    #: frames; a polling loop would add thousands of them and slow ``with_stack`` profiles).
    hands_over_while_recording: bool = True
    #: The session's configuration as last handed over by ``configure``; a tracer that takes it in
    #: its constructor (``polyprof_make_tracers(config)``) sets it there.
    config: ProfileConfig

    def __init__(self) -> None:
        self.outbox = Outbox()

    def configure(self, config: ProfileConfig) -> None:
        """Take the session's new configuration before a recording's ``prepare`` (user's thread).

        Called when the configuration changed since the tracer was made: each
        cycle of ``polyprof.profile`` has its own ``trace_id``. Default: keep it
        as ``self.config``. An override that keeps its own state should call
        ``super().configure(config)``.
        """
        self.config = config

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Warm up before ``start`` (user's thread). Default: nothing."""

    @abc.abstractmethod
    def start(self) -> None:
        """Begin recording (user's thread). Must not block for long."""

    @abc.abstractmethod
    def stop(self) -> None:
        """End recording (user's thread); put what was recorded in the outbox and close it."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Hand over native buffers that are complete (any thread). Default: nothing."""

    def toggle_collection(self, enable: bool, activities: frozenset[ProfilerActivity]) -> None:
        """Pause (``enable=False``) or resume collection of ``activities`` while recording (user's thread).

        torch's ``toggle_collection_dynamic``: the session asks each tracer
        that records one of ``activities`` (which may name others' too).
        Default: refuse with ``NotImplementedError`` naming this tracer and the
        activities, as torch refuses what its collector cannot pause.
        """
        names = ", ".join(sorted(activity.name for activity in self.activities & activities))
        raise NotImplementedError(f"tracer {self.name!r} cannot pause collection of {names or 'anything'}")

    def decode(self, item: Any) -> Iterable[EventBatch]:
        """Turn an outbox item into event batches (bus thread)."""
        return (item,)

    def trace_metadata(self) -> TraceMetadata:
        """Facts for the trace once stopped (``TraceMetadata``): ``start_ns``, ``end_ns``,
        ``device_properties``, ``notes``, ``metadata_json`` (key -> JSON text). Missing keys are fine."""
        return {}


class Subscriber(abc.ABC):
    """Receives every batch on the bus from its own bounded stream.

    Called on a bus worker thread, one call at a time for this subscriber.
    """

    name: str = "subscriber"

    @abc.abstractmethod
    def consume(self, batch: EventBatch) -> None:
        """Take one batch. Exceptions are caught, counted and logged by the bus."""

    def finish(self) -> None:  # noqa: B027 - optional hook
        """All batches of the recording have been consumed."""


class Exporter(abc.ABC):
    """Writes a finished trace to a file, atomically (no partial file on failure)."""

    #: Name used to select it (``export(..., format="chrome")``).
    name: str = "exporter"
    #: File name endings it writes, used to pick an exporter from a path.
    suffixes: tuple[str, ...] = ()

    @abc.abstractmethod
    def export(self, trace: Trace, path: str, **options: Any) -> str:
        """Write ``trace`` to ``path``; return the path written."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called when the session's plugin manager closes."""


def check_component(obj: Any, kind: type, plugin: str) -> Any:
    """Fail clearly when a plugin returns something that is not a ``kind``."""
    if not isinstance(obj, kind):
        raise TypeError(f"plugin {plugin!r} returned {obj!r}, which is not a {kind.__name__}")
    return obj


__all__ = [
    "Capabilities",
    "Exporter",
    "Outbox",
    "Subscriber",
    "TraceMetadata",
    "Tracer",
    "check_component",
]
