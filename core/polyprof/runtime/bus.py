"""The event bus: moves event batches from tracers to subscribers off the user's thread.

Topology::

    tracer thread / native callback --put--> Outbox (SimpleQueue, never blocks)
        bus loop: one pull task per tracer: drain -> tracer.decode(item) -> route
            route: every batch to every sink, inline (never dropped), then to every
                   streamed subscriber's own bounded memory stream
        bus loop: one feed task per streamed subscriber: receive -> consume() in a worker thread

The bus runs an anyio event loop (asyncio backend) on one daemon thread that it
starts lazily itself (``_run_bus_loop``), serving an ``anyio.from_thread.BlockingPortal``. The user's
thread only makes lifecycle calls (``start``, ``add_tracer``, ``subscribe``,
``flush``, ``finish_recording``, ``close``, ``statistics``); it never runs a
portal round trip per batch, and the bus never touches an event loop that the
user's program runs itself (profiling inside ``asyncio.run`` works).

Two kinds of subscriber:

* A ``Sink`` (polyprof's own ``TraceCollector``) is fed by the pull task itself,
  on the loop, before any streamed subscriber. It has no stream, so it never
  waits and never drops: every batch a ``decode`` yields reaches it, whatever the
  streamed subscribers do. Its ``consume`` must only keep the batch.
* Every other ``Subscriber`` (the plugins' ``polyprof_make_subscribers``) is
  *streamed*: ``consume`` and ``finish`` run on the bus's worker threads, one call
  at a time per subscriber (a per-subscriber ``CapacityLimiter(1)``), so a slow
  subscriber never stalls the loop, the tracers or the other subscribers. It is
  backpressure on the tracers' pull tasks while its stream is full, for at most
  ``overflow_wait_s`` per batch; after that the batch is dropped for that
  subscriber and counted (drop newest, never silently: a warning is logged).

Recordings: attach tracers and subscribers for a recording (``add_tracer``,
``subscribe``), let the tracers run and stop (``Tracer.stop`` closes the
outbox), then call ``finish_recording``: it decodes everything (the sinks get
all of it), calls each subscriber's ``finish()`` once and detaches all of them,
leaving the bus ready for the next recording (a profiler with a schedule records
several cycles on one bus). ``close`` ends the bus. A slow streamed subscriber
cannot hold up ``finish_recording`` for long: each gets ``subscriber_drain_s`` of
waiting in all (backpressure during the finish plus its backlog and ``finish()``);
past it, what it has not been handed is dropped and counted for it, and it is
detached (its ``finish()`` still runs, in the background, once its ``consume`` in
flight returns).

A forked child inherits a copy of the bus without its thread. There
``finish_recording`` and ``flush`` return False at once, ``statistics`` returns
the counts as they were at the fork, ``close`` only marks the copy closed, and
attaching raises ``RuntimeError``: nothing ever waits on the absent thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import os
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from polyprof.base.events import EventBatch
from polyprof.base.log import get_logger
from polyprof.hooks.components import Subscriber, Tracer

__all__ = ["BusStatistics", "EventBus", "Sink"]

#: How often a pull task looks at its outbox when nobody wakes it, while a streamed subscriber
#: is attached (``_BusEngine._poll_interval``).
DEFAULT_POLL_INTERVAL_S = 0.01
#: How long routing waits for room in a full subscriber stream before dropping.
DEFAULT_OVERFLOW_WAIT_S = 2.0
#: Default size of a subscriber's stream, in batches (batches hold thousands of events).
DEFAULT_CAPACITY = 64
#: How long, in all, ``finish_recording`` waits on one streamed subscriber before cutting it off.
DEFAULT_SUBSCRIBER_DRAIN_S = 5.0
#: Default limit for ``flush`` and ``finish_recording``.
DEFAULT_TIMEOUT_S = 60.0
#: How long ``close`` waits for the loop to wind down before abandoning its daemon thread.
DEFAULT_STOP_TIMEOUT_S = 10.0
#: Extra time the user's thread waits beyond a timeout that the loop enforces itself, so the
#: loop's own, tidier timeout normally wins; the user-side one only guards a blocked loop.
_USER_SIDE_GRACE_S = 1.0


def _log() -> Any:
    # Looked up when used, not at import: logging here is rare (errors, drops), and a
    # logger built at import would keep the processors of that moment and so miss a
    # later structlog configuration such as structlog.testing.capture_logs().
    return get_logger(__name__)


def _frozen_counts(value: Mapping[str, int]) -> Mapping[str, int]:
    return types.MappingProxyType(dict(value))


def _counts_field(doc: str) -> Any:
    return attrs.field(
        factory=dict, converter=_frozen_counts, repr=lambda counts: repr(dict(counts)), metadata={"doc": doc}
    )


class Sink(Subscriber):
    """A subscriber that the bus feeds itself, inline, before any streamed subscriber.

    For polyprof's own collection (``polyprof.runtime.session.TraceCollector``): a sink
    has no stream, so it never waits and never drops. Every batch a tracer's
    ``decode`` yields reaches it, whatever the streamed subscribers do, and
    ``finish()`` is called once the tracers have stopped, before the bus waits
    for any streamed subscriber. ``consume`` and ``finish`` run on the bus
    thread and hold up every tracer while they run: they must only keep the
    batch (no I/O, no waiting, no locks held by other threads for long).
    Plugins' subscribers are streamed: they subclass ``Subscriber``, not this.
    """


@attrs.frozen
class BusStatistics:
    """Counters of one bus: since it was created (``EventBus.statistics``) or for
    one recording (``EventBus.last_recording_statistics``).

    Tracer counters are keyed by ``Tracer.name``; subscriber counters by the
    key ``EventBus.subscribe`` returned (the subscriber's ``name``, with
    ``#2``, ``#3``... appended when several attached subscribers share a name).
    For every subscriber, ``batches_delivered + batches_dropped`` equals the
    batches routed while it was attached. A ``Sink`` is never dropped for, so
    its ``batches_delivered`` is every batch routed: what a trace assembled from
    it holds. Only streamed subscribers drop (stream full past
    ``overflow_wait_s``, or cut off at the finish's ``subscriber_drain_s``).
    """

    #: Outbox items handed to ``Tracer.decode``, per tracer.
    items_decoded: Mapping[str, int] = _counts_field("items per tracer")
    #: Batches produced by ``decode``, per tracer.
    batches_received: Mapping[str, int] = _counts_field("batches per tracer")
    #: Events in those batches, per tracer.
    events_received: Mapping[str, int] = _counts_field("events per tracer")
    #: ``decode`` calls that raised (or yielded something that is not an EventBatch), per tracer.
    tracer_errors: Mapping[str, int] = _counts_field("decode failures per tracer")
    #: Outbox items left undecoded because ``finish_recording`` timed out, per tracer.
    items_abandoned: Mapping[str, int] = _counts_field("abandoned items per tracer")
    #: Batches handed to ``consume``, per subscriber (whether or not it raised; counted as handed).
    batches_delivered: Mapping[str, int] = _counts_field("batches per subscriber")
    #: Events in those batches, per subscriber.
    events_delivered: Mapping[str, int] = _counts_field("events per subscriber")
    #: Batches never handed to the subscriber, per subscriber: its stream stayed full, or it was
    #: cut off at the end of a recording (drain deadline, timeout) with batches still queued.
    batches_dropped: Mapping[str, int] = _counts_field("dropped batches per subscriber")
    #: Events in the dropped batches, per subscriber.
    events_dropped: Mapping[str, int] = _counts_field("dropped events per subscriber")
    #: ``consume`` or ``finish`` calls that raised, per subscriber.
    subscriber_errors: Mapping[str, int] = _counts_field("failures per subscriber")

    @property
    def batches_received_total(self) -> int:
        return sum(self.batches_received.values())

    @property
    def events_received_total(self) -> int:
        return sum(self.events_received.values())

    @property
    def batches_dropped_total(self) -> int:
        return sum(self.batches_dropped.values())

    @property
    def events_dropped_total(self) -> int:
        return sum(self.events_dropped.values())

    @property
    def errors_total(self) -> int:
        return sum(self.tracer_errors.values()) + sum(self.subscriber_errors.values())

    @property
    def collection_complete(self) -> bool:
        """True when every item the tracers handed over was decoded and reached every sink.

        Streamed subscribers' drops do not count here: they never cost a sink anything.
        """
        return sum(self.items_abandoned.values()) == 0 and sum(self.tracer_errors.values()) == 0

    @property
    def lossless(self) -> bool:
        """True when nothing was dropped (for any subscriber), abandoned or lost to a failing ``decode``."""
        return self.batches_dropped_total == 0 and self.collection_complete


class _Counters:
    """The mutable counters behind ``BusStatistics``: since creation, and for the current recording.

    Written on the bus thread and its worker threads, read from the user's
    thread: a lock keeps a snapshot consistent. One lock round per batch, not
    per event.
    """

    _NAMES = tuple(f.name for f in attrs.fields(BusStatistics))

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = self._empty()
        self._recording: dict[str, dict[str, int]] = self._empty()
        self._last_recording = BusStatistics()

    @classmethod
    def _empty(cls) -> dict[str, dict[str, int]]:
        return {name: {} for name in cls._NAMES}

    def register(self, names: Iterable[str], key: str) -> None:
        with self._lock:
            for counts in (self._counts, self._recording):
                for name in names:
                    counts[name].setdefault(key, 0)

    def add(self, key: str, **increments: int) -> None:
        with self._lock:
            for counts in (self._counts, self._recording):
                for name, amount in increments.items():
                    table = counts[name]
                    table[key] = table.get(key, 0) + amount

    def end_recording(self) -> None:
        """Keep the current recording's counts as the last recording's; start afresh."""
        with self._lock:
            self._last_recording = self._frozen(self._recording)
            self._recording = self._empty()

    def snapshot(self, *, locked: bool = True) -> BusStatistics:
        """The counts since creation; ``locked=False`` in a forked child, where the lock may be
        held forever by a thread that no longer exists (the GIL keeps each dict copy whole)."""
        if not locked:
            return self._frozen(self._counts)
        with self._lock:
            return self._frozen(self._counts)

    def last_recording(self, *, locked: bool = True) -> BusStatistics:
        if not locked:
            return self._last_recording
        with self._lock:
            return self._last_recording

    @staticmethod
    def _frozen(counts: dict[str, dict[str, int]]) -> BusStatistics:
        return BusStatistics(**{name: dict(table) for name, table in counts.items()})


_TRACER_COUNTERS = (
    "items_decoded",
    "batches_received",
    "events_received",
    "tracer_errors",
    "items_abandoned",
)
_SUBSCRIBER_COUNTERS = (
    "batches_delivered",
    "events_delivered",
    "batches_dropped",
    "events_dropped",
    "subscriber_errors",
)


@attrs.define(eq=False)
class _FlushMarker:
    """Travels through a subscriber stream behind the batches a flush waits for."""

    reached: anyio.Event


@attrs.define(eq=False)
class _TracerLink:
    """Loop-side state of one attached tracer (touched only on the bus thread)."""

    tracer: Tracer
    name: str
    wake: anyio.Event
    scope: anyio.CancelScope
    stopped: anyio.Event
    flush_requests: list[anyio.Event] = attrs.Factory(list)
    #: Items drained from the outbox and not yet decoded.
    pending: collections.deque = attrs.Factory(collections.deque)
    #: Set by ``finish_recording``: drain once more, then end.
    stop_requested: bool = False


@attrs.define(eq=False)
class _SinkLink:
    """Loop-side state of one attached sink (touched only on the bus thread)."""

    sink: Sink
    key: str


@attrs.define(eq=False)
class _SubscriberLink:
    """Loop-side state of one attached streamed subscriber.

    Touched on the bus thread, except ``cut`` and ``handed``, which the worker
    thread running ``consume`` reads and writes under ``handoff_lock``, and
    ``finish_called``, which it sets.
    """

    subscriber: Subscriber
    key: str
    capacity: int
    send: MemoryObjectSendStream[EventBatch | _FlushMarker]
    receive: MemoryObjectReceiveStream[EventBatch | _FlushMarker]
    limiter: anyio.CapacityLimiter
    scope: anyio.CancelScope
    finished: anyio.Event
    #: Set by a router waiting for room; the feed task sets and clears it on every receive.
    space_freed: anyio.Event | None = None
    #: Items taken from the stream and not yet consumed (flush markers included).
    in_hand: collections.deque = attrs.Factory(collections.deque)
    #: Drops during the current recording, for the warning and the summary.
    dropped_batches: int = 0
    dropped_events: int = 0
    #: None while recording; from the start of ``finish_recording``, the time the finish may
    #: still wait on this subscriber (backpressure, backlog, ``finish()``), in seconds.
    drain_left_s: float | None = None
    #: Guards the hand-over of each batch to ``consume`` against a cut on the loop.
    handoff_lock: threading.Lock = attrs.Factory(threading.Lock)
    #: True once cut off (drain deadline, timeout): no further batch is handed to ``consume``.
    cut: bool = False
    #: Whether a cut subscriber still gets ``finish()`` (after a drain deadline, not a timeout).
    finish_after_cut: bool = False
    #: True while a ``consume`` call (of one or more batches) is with the worker thread.
    in_call: bool = False
    #: Batches of that call handed to ``consume`` so far (the first ``handed`` items in hand).
    handed: int = 0
    #: Set (on the worker thread) as ``finish()`` is called.
    finish_called: bool = False


class _CallbackState(threading.local):
    #: True while this thread runs a subscriber's ``consume``/``finish`` for the bus.
    active = False


_callback_state = _CallbackState()


def _run_consume(
    link: _SubscriberLink, batches: list[EventBatch], counters: _Counters, note_thread: Callable[[], None]
) -> list:
    """Worker-thread side of delivery: consume each batch, collect (not raise) failures.

    Each batch is counted as delivered as it is handed over, under the link's
    hand-off lock, so a cut on the loop knows exactly which batches of this
    call reached ``consume`` and which it must count as dropped.
    """
    note_thread()
    failures = []
    _callback_state.active = True
    try:
        for batch in batches:
            with link.handoff_lock:
                if link.cut:
                    break
                link.handed += 1
                counters.add(link.key, batches_delivered=1, events_delivered=len(batch))
            try:
                link.subscriber.consume(batch)
            except Exception as exc:  # noqa: BLE001 - isolation: the subscriber's failure stays in the bus
                failures.append(exc)
    finally:
        _callback_state.active = False
    return failures


def _run_finish(link: _SubscriberLink, note_thread: Callable[[], None]) -> Exception | None:
    note_thread()
    link.finish_called = True
    _callback_state.active = True
    try:
        link.subscriber.finish()
    except Exception as exc:  # noqa: BLE001 - isolation, as for consume
        return exc
    finally:
        _callback_state.active = False
    return None


def _check_timeout(timeout_s: float | None, what: str) -> None:
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"{what} must be a number of seconds > 0, or None for no limit; got {timeout_s!r}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(
            f"{what} must be a finite number of seconds > 0, or None for no limit; got {timeout_s!r}"
        )


def _check_seconds(value: Any, what: str, *, allow_zero: bool) -> None:
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a finite number of seconds {bound}, not {value!r}")
    if not (math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ValueError(f"{what} must be a finite number of seconds {bound}, not {value!r}")


def _check_capacity(capacity: Any) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(
            f"capacity must be a positive int (batches); got {capacity!r}. "
            "Unbounded streams (math.inf) are not allowed: overflow must be counted, not hidden."
        )
    if capacity < 1:
        raise ValueError(f"capacity must be a positive int (batches), not {capacity}")
    return capacity


def _run_bus_loop(ready: concurrent.futures.Future[Any]) -> None:
    """The bus thread's whole life: an anyio loop (asyncio backend) serving one blocking portal.

    polyprof starts this thread itself rather than through anyio's ``start_blocking_portal``:
    that ran the loop on a thread-pool worker before anyio 4.5 and on a daemon thread after, and
    named its root frame differently. Here the thread is a daemon on every anyio release, and its
    root frame is this function, by which the torch tracer tells polyprof's own Python frames
    from the user's (``polyprof.runtime.own_frames``).
    """

    async def serve() -> None:
        async with anyio.from_thread.BlockingPortal() as portal:
            if ready.set_running_or_notify_cancel():
                ready.set_result(portal)
                await portal.sleep_until_stopped()

    try:
        anyio.run(serve, backend="asyncio")
    except BaseException as exc:
        if ready.done():
            raise  # after the start: the thread's excepthook reports it
        ready.set_exception(exc)


def _stop_portal(portal: Any, thread: threading.Thread | None, timeout_s: float | None = None) -> None:
    """Stop the bus loop's portal (cancelling what it still runs) and join its thread."""
    try:
        portal.call(portal.stop, True)
    except RuntimeError:  # stopped already
        pass
    if thread is not None:
        thread.join(timeout=timeout_s)


class _BusEngine:
    """Everything that runs or lives on the bus thread, plus the thread's lifecycle.

    Kept apart from ``EventBus`` so that the loop's tasks never hold a reference
    to the ``EventBus`` object: a forgotten bus can then be collected and its
    ``weakref.finalize`` shuts the engine down (and does so at interpreter exit).
    """

    def __init__(
        self,
        *,
        thread_name: str,
        poll_interval_s: float,
        overflow_wait_s: float,
        subscriber_drain_s: float,
        stop_timeout_s: float,
    ) -> None:
        self.thread_name = thread_name
        self.poll_interval_s = poll_interval_s
        self.overflow_wait_s = overflow_wait_s
        self.subscriber_drain_s = subscriber_drain_s
        self.stop_timeout_s = stop_timeout_s
        self.counters = _Counters()
        #: The process that started the bus thread (None before the start).
        self.owner_pid: int | None = None
        # Lifecycle (user's threads).
        self._lifecycle_lock = threading.Lock()
        self._state = "new"  # new -> running -> closing -> closed
        self._portal: Any = None
        self._supervisor: concurrent.futures.Future | None = None
        self.loop_thread: threading.Thread | None = None
        self._worker_threads: set[threading.Thread] = set()
        self._worker_threads_lock = threading.Lock()
        # Loop-side state (bus thread only).
        self._task_group: Any = None
        self._tracers: tuple[_TracerLink, ...] = ()
        self._sinks: tuple[_SinkLink, ...] = ()
        self._subscribers: tuple[_SubscriberLink, ...] = ()
        #: Streamed subscribers' links whose feed task still runs, attached or not (a cut one may
        #: still be in ``consume`` or ``finish``): a re-attached subscriber shares its limiter.
        self._feeding: set[_SubscriberLink] = set()
        self._logged: set[tuple[str, str, type]] = set()

    # ------------------------------------------------------------------ lifecycle (user's thread)

    @property
    def state(self) -> str:
        return self._state

    def forked(self) -> bool:
        """True in a forked child of the process that started the bus: its thread does not exist here."""
        return self.owner_pid is not None and self.owner_pid != os.getpid()

    def forked_error(self, what: str) -> RuntimeError:
        return RuntimeError(
            f"EventBus.{what}() in process {os.getpid()}: this bus was started in process {self.owner_pid}, "
            "and its thread does not exist in a forked child; create a new EventBus in this process"
        )

    def _spawn_loop(self) -> tuple[threading.Thread, concurrent.futures.Future[Any]]:
        ready: concurrent.futures.Future[Any] = concurrent.futures.Future()
        thread = threading.Thread(target=_run_bus_loop, args=(ready,), name=self.thread_name, daemon=True)
        thread.start()
        return thread, ready

    def start(self) -> None:
        if self.forked():  # checked before the lock, which a thread of the parent may have held
            raise self.forked_error("start")
        with self._lifecycle_lock:
            if self._state == "running":
                return
            if self._state != "new":
                raise RuntimeError("this EventBus is closed; create a new EventBus")
            thread, ready = self._spawn_loop()
            portal = ready.result()
            try:
                self._supervisor, _ = portal.start_task(self._supervise, name="polyprof-bus supervisor")
            except BaseException:
                _stop_portal(portal, thread)
                raise
            self.loop_thread, self._portal = thread, portal
            self.owner_pid = os.getpid()
            self._state = "running"

    def on_bus_thread(self) -> bool:
        return _callback_state.active or (
            self.loop_thread is not None and threading.current_thread() is self.loop_thread
        )

    def call(self, func: Callable[..., Any], *args: Any, timeout_s: float | None = None, what: str) -> Any:
        """Run ``func`` on the loop and wait for its result from the user's thread.

        ``timeout_s`` bounds the wait even when the loop itself is blocked (a
        ``decode`` that never returns): the task is then cancelled and
        ``TimeoutError`` raised.
        """
        if self.on_bus_thread():
            raise RuntimeError(
                f"EventBus.{what}() was called from the bus itself (inside a tracer's decode or a "
                "subscriber's consume/finish); lifecycle calls must come from the profiling thread"
            )
        if self.forked():
            raise self.forked_error(what)
        if self._state != "running":
            raise RuntimeError(f"EventBus.{what}() needs a running bus, but the bus is {self._state}")
        try:
            future = self._portal.start_task_soon(func, *args)
        except RuntimeError as exc:  # the portal stopped between the check and the call
            raise RuntimeError(f"EventBus.{what}() needs a running bus, but the bus is closed") from exc
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"EventBus.{what}() did not complete within {timeout_s} s") from None
        except concurrent.futures.CancelledError:
            raise RuntimeError(f"EventBus.{what}() was interrupted because the bus closed") from None

    def close(self) -> None:
        """Cancel all tasks, stop the loop and join the threads; idempotent; bounded in time.

        In a forked child only this copy is marked closed: the loop, its thread
        and its portal belong to the parent (and the lock may be held forever).
        """
        if self.forked():
            if self._state != "closed":
                _log().debug("bus_closed_in_forked_child", pid=os.getpid(), owner_pid=self.owner_pid)
            self._state = "closed"
            return
        with self._lifecycle_lock:
            if self._state != "running":
                if self._state == "new":
                    self._state = "closed"
                return
            self._state = "closing"
        if self.on_bus_thread():
            # Joining the loop (or waiting for a consume) from inside it would deadlock.
            threading.Thread(target=self._shut_down, name=f"{self.thread_name}-closer", daemon=True).start()
            return
        self._shut_down()

    def _shut_down(self) -> None:
        # Bounded by stop_timeout_s: a loop thread still winding down past it is left to finish
        # on its own (a daemon thread), as is one blocked in a decode.
        deadline = time.monotonic() + self.stop_timeout_s
        portal, thread, supervisor = self._portal, self.loop_thread, self._supervisor
        # close() shuts down only a "running" bus, and start() set the supervisor before that state.
        assert supervisor is not None
        try:
            portal.start_task_soon(self._cancel_everything)
            supervisor.result(timeout=self.stop_timeout_s)
        except concurrent.futures.TimeoutError:
            _log().error(
                "bus_stop_timed_out",
                timeout_s=self.stop_timeout_s,
                detail="the bus loop is blocked (a decode or consume that does not return); "
                "its daemon thread is abandoned",
            )
            self._state = "closed"
            return
        except BaseException as exc:  # the supervisor died earlier; it was logged then
            if not isinstance(exc, Exception):
                raise
        # Cancels what a user thread may still await (a flush in flight), stops, joins the thread.
        _stop_portal(portal, thread, timeout_s=max(0.0, deadline - time.monotonic()))
        with self._worker_threads_lock:
            workers = list(self._worker_threads)
            self._worker_threads.clear()
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
        self._portal = self._supervisor = None
        self._state = "closed"

    def note_worker_thread(self) -> None:
        """Remember a worker thread that ran subscriber code, so ``close`` can join it."""
        thread = threading.current_thread()
        if thread not in self._worker_threads:
            with self._worker_threads_lock:
                self._worker_threads.add(thread)

    # ------------------------------------------------------------------ loop: supervision

    async def _supervise(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group = task_group
                task_status.started()
                await anyio.sleep_forever()
        except Exception:
            _log().error("bus_crashed", exc_info=True)
            raise
        finally:
            for link in self._subscribers:
                link.send.close()
                link.receive.close()

    def _cancel_everything(self) -> None:
        if self._tracers or self._sinks or self._subscribers:
            _log().warning(
                "bus_closed_during_recording",
                tracers=[t.name for t in self._tracers],
                subscribers=[s.key for s in self._sinks] + [s.key for s in self._subscribers],
                tracers_with_items_waiting=[t.name for t in self._tracers if not t.tracer.outbox.empty()],
                detail="call finish_recording() before close() to deliver everything",
            )
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()

    def _log_once(self, event: str, who: str, exc: BaseException, **fields: Any) -> None:
        key = (event, who, type(exc))
        if key in self._logged:
            return
        self._logged.add(key)
        _log().error(event, error_type=type(exc).__name__, exc_info=exc, **fields)

    # ------------------------------------------------------------------ loop: attaching

    async def attach_tracer(self, tracer: Tracer) -> None:
        for link in self._tracers:
            if link.tracer is tracer:
                raise ValueError(f"tracer {tracer.name!r} is already attached to this bus")
            if link.name == tracer.name:
                raise ValueError(
                    f"a tracer named {tracer.name!r} is already attached; tracer names must be unique "
                    f"(attached: {sorted(t.name for t in self._tracers)})"
                )
        link = _TracerLink(
            tracer=tracer,
            name=tracer.name,
            wake=anyio.Event(),
            scope=anyio.CancelScope(),
            stopped=anyio.Event(),
        )
        self.counters.register(_TRACER_COUNTERS, link.name)
        self._tracers = (*self._tracers, link)
        self._task_group.start_soon(self._pull, link, name=f"polyprof-bus pull {link.name}")

    async def attach_subscriber(self, subscriber: Subscriber, capacity: int | None) -> str:
        attached = [link.subscriber for link in self._subscribers] + [link.sink for link in self._sinks]
        if any(other is subscriber for other in attached):
            raise ValueError(f"subscriber {subscriber.name!r} is already attached to this bus")
        taken = {link.key for link in self._subscribers} | {link.key for link in self._sinks}
        key, n = subscriber.name, 1
        while key in taken:
            n += 1
            key = f"{subscriber.name}#{n}"
        self.counters.register(_SUBSCRIBER_COUNTERS, key)
        if isinstance(subscriber, Sink):
            self._sinks = (*self._sinks, _SinkLink(sink=subscriber, key=key))
            return key
        assert capacity is not None
        # A subscriber cut off at the end of the last recording may still be in consume() or
        # finish(): sharing its limiter keeps its calls one at a time.
        lingering = [link.limiter for link in self._feeding if link.subscriber is subscriber]
        send, receive = anyio.create_memory_object_stream[EventBatch | _FlushMarker](capacity)
        link = _SubscriberLink(
            subscriber=subscriber,
            key=key,
            capacity=capacity,
            send=send,
            receive=receive,
            limiter=lingering[0] if lingering else anyio.CapacityLimiter(1),
            scope=anyio.CancelScope(),
            finished=anyio.Event(),
        )
        self._subscribers = (*self._subscribers, link)
        self._feeding.add(link)
        for tracer_link in self._tracers:  # those that hand over while recording start polling for it
            if tracer_link.tracer.hands_over_while_recording:
                tracer_link.wake.set()
        self._task_group.start_soon(self._feed, link, name=f"polyprof-bus feed {key}")
        return key

    # ------------------------------------------------------------------ loop: tracer side

    async def _pull(self, link: _TracerLink) -> None:
        """Drain one tracer's outbox every poll interval, or at once when woken."""
        outbox = link.tracer.outbox
        try:
            with link.scope:
                while True:
                    # Take the requests before draining: whatever was put before a flush
                    # asked is in this drain.
                    requests, link.flush_requests = link.flush_requests, []
                    stopping = link.stop_requested
                    pending = link.pending
                    pending.extend(outbox.drain())
                    while pending:
                        await self._decode_and_route(link, pending.popleft())
                    for request in requests:
                        request.set()
                    if stopping:
                        return
                    with anyio.move_on_after(self._poll_interval(link)):
                        await link.wake.wait()
                    if link.wake.is_set():
                        link.wake = anyio.Event()
        except Exception:  # noqa: BLE001 - a bug of ours; never let it cancel the sibling tasks
            _log().error("bus_task_crashed", task="pull", tracer=link.name, exc_info=True)
        finally:
            if link.pending:  # cancelled mid-way (finish_recording timed out)
                self.counters.add(link.name, items_abandoned=len(link.pending))
                link.pending.clear()
            for request in link.flush_requests:
                request.set()
            link.flush_requests.clear()
            link.stopped.set()

    def _poll_interval(self, link: _TracerLink) -> float | None:
        """How long a pull task sleeps before it looks at its outbox again; None: until woken.

        Only a streamed subscriber wants batches while the recording runs: with none attached
        (a plain profile: the collector alone) the outboxes are drained at ``flush`` and at the
        end, and the bus thread never wakes while the user's program runs.
        """
        if link.tracer.hands_over_while_recording and self._subscribers:
            return self.poll_interval_s
        return None

    async def _decode_and_route(self, link: _TracerLink, item: Any) -> None:
        self.counters.add(link.name, items_decoded=1)
        try:
            for batch in link.tracer.decode(item):
                if not isinstance(batch, EventBatch):
                    raise TypeError(
                        f"{type(link.tracer).__qualname__}.decode yielded {type(batch).__qualname__}, "
                        "not an EventBatch"
                    )
                await self._route(link.name, batch)
        except Exception as exc:  # noqa: BLE001 - isolation: one tracer's bad item does not stop the bus
            self.counters.add(link.name, tracer_errors=1)
            self._log_once(
                "bus_tracer_decode_failed",
                link.name,
                exc,
                tracer=link.name,
                component=f"{type(link.tracer).__module__}.{type(link.tracer).__qualname__}",
            )

    async def _route(self, source: str, batch: EventBatch) -> None:
        """Hand one batch to every sink, then offer it to every streamed subscriber's stream."""
        events = len(batch)
        self.counters.add(source, batches_received=1, events_received=events)
        for sink_link in self._sinks:
            self._feed_sink(sink_link, batch)
        for link in self._subscribers:
            try:
                link.send.send_nowait(batch)
                continue
            except anyio.WouldBlock:
                delivered = await self._send_with_backpressure(link, batch)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                delivered = False
            if not delivered:
                self._count_drop(link, events, source)

    def _feed_sink(self, link: _SinkLink, batch: EventBatch) -> None:
        self.counters.add(link.key, batches_delivered=1, events_delivered=len(batch))
        try:
            link.sink.consume(batch)
        except Exception as exc:  # noqa: BLE001 - isolation, as for streamed subscribers
            self._sink_failed(link, "consume", exc)

    def _sink_failed(self, link: _SinkLink, call: str, exc: Exception) -> None:
        self.counters.add(link.key, subscriber_errors=1)
        self._log_once(
            "bus_subscriber_failed",
            f"{link.key}.{call}",
            exc,
            subscriber=link.key,
            call=call,
            component=f"{type(link.sink).__module__}.{type(link.sink).__qualname__}",
        )

    async def _send_with_backpressure(self, link: _SubscriberLink, batch: EventBatch) -> bool:
        # Wait on a "space freed" event rather than cancelling a pending send(): a
        # cancelled send can race with its item being taken, which would count a
        # delivered batch as dropped. During a finish the wait also spends the
        # subscriber's drain budget, so a slow one cannot hold up the decoding for long.
        waited = 0.0
        while True:
            limit = self.overflow_wait_s
            if link.drain_left_s is not None:
                limit = min(limit, waited + link.drain_left_s)
            remaining = limit - waited
            if remaining <= 0:
                return False
            if link.space_freed is None:
                link.space_freed = anyio.Event()
            began = anyio.current_time()
            with anyio.move_on_after(remaining):
                await link.space_freed.wait()
            spent = anyio.current_time() - began
            waited += spent
            if link.drain_left_s is not None:
                link.drain_left_s = max(0.0, link.drain_left_s - spent)
            try:
                link.send.send_nowait(batch)
                return True
            except anyio.WouldBlock:
                continue
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return False

    def _count_drop(self, link: _SubscriberLink, events: int, source: str) -> None:
        self.counters.add(link.key, batches_dropped=1, events_dropped=events)
        link.dropped_batches += 1
        link.dropped_events += events
        if link.dropped_batches == 1:
            _log().warning(
                "bus_batches_dropped",
                subscriber=link.key,
                tracer=source,
                capacity=link.capacity,
                overflow_wait_s=self.overflow_wait_s,
                dropped_batches=link.dropped_batches,
                dropped_events=link.dropped_events,
                detail="the subscriber is slower than its tracers; raise its capacity or make it faster",
            )

    # ------------------------------------------------------------------ loop: subscriber side

    async def _feed(self, link: _SubscriberLink) -> None:
        """Hand one subscriber its batches, in order, then call ``finish`` when its stream ends."""
        try:
            with link.scope, link.receive:
                ended = False
                try:
                    while True:
                        try:
                            link.in_hand.append(await link.receive.receive())
                        except anyio.EndOfStream:
                            break
                        # Take the whole backlog at once: one worker-thread hop for many batches.
                        while True:
                            try:
                                link.in_hand.append(link.receive.receive_nowait())
                            except (anyio.WouldBlock, anyio.EndOfStream):
                                break
                        if link.space_freed is not None:
                            link.space_freed.set()
                            link.space_freed = None
                        await self._deliver_in_hand(link)
                    ended = True
                finally:
                    if not ended:  # cut, cancelled or crashed: account for what never reached consume()
                        self._release_backlog(link)
                await self._finish_subscriber(link)
        except Exception:  # noqa: BLE001 - a bug of ours; never let it cancel the sibling tasks
            _log().error("bus_task_crashed", task="feed", subscriber=link.key, exc_info=True)
        finally:
            try:
                # Cut off at its drain deadline: it still gets finish(), after its consume in
                # flight, even if the bus closes meanwhile (close waits for that consume anyway).
                if link.cut and link.finish_after_cut and not link.finish_called:
                    with anyio.CancelScope(shield=True):
                        await self._finish_subscriber(link)
            finally:
                link.finished.set()
                self._feeding.discard(link)

    async def _deliver_in_hand(self, link: _SubscriberLink) -> None:
        in_hand = link.in_hand
        while in_hand and not link.cut:
            if isinstance(in_hand[0], _FlushMarker):
                in_hand.popleft().reached.set()
                continue
            batches = []
            for item in in_hand:
                if isinstance(item, _FlushMarker):
                    break
                batches.append(item)
            await self._deliver(link, batches)

    async def _deliver(self, link: _SubscriberLink, batches: list[EventBatch]) -> None:
        # run_sync is shielded once the call is handed to the worker: if it raises
        # cancellation, consume() was not called for any of these batches.
        link.handed, link.in_call = 0, True
        try:
            failures = await anyio.to_thread.run_sync(
                _run_consume, link, batches, self.counters, self.note_worker_thread, limiter=link.limiter
            )
        finally:
            link.in_call = False
            # Popped only once handed over, so what is left stays for _release_backlog (a cut
            # on the loop meanwhile left exactly the handed ones in hand).
            for _ in range(link.handed):
                link.in_hand.popleft()
        for exc in failures:
            self.counters.add(link.key, subscriber_errors=1)
            self._log_once(
                "bus_subscriber_failed",
                link.key,
                exc,
                subscriber=link.key,
                call="consume",
                component=f"{type(link.subscriber).__module__}.{type(link.subscriber).__qualname__}",
            )

    async def _finish_subscriber(self, link: _SubscriberLink) -> None:
        exc = await anyio.to_thread.run_sync(_run_finish, link, self.note_worker_thread, limiter=link.limiter)
        if exc is not None:
            self.counters.add(link.key, subscriber_errors=1)
            self._log_once(
                "bus_subscriber_failed",
                link.key + ".finish",
                exc,
                subscriber=link.key,
                call="finish",
                component=f"{type(link.subscriber).__module__}.{type(link.subscriber).__qualname__}",
            )

    def _release_backlog(self, link: _SubscriberLink) -> None:
        """For a subscriber that stops early: count its backlog as dropped, unblock flushes."""
        while True:
            if link.in_hand:
                item = link.in_hand.popleft()
            else:
                try:
                    item = link.receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    return
            if isinstance(item, _FlushMarker):
                item.reached.set()
            else:
                self._count_drop(link, len(item), item.source)

    def _cut(self, link: _SubscriberLink, *, finish_after: bool) -> None:
        """Stop feeding ``link`` now: count all it was not handed as dropped, stop its feed task.

        A ``consume`` in flight runs to its end (threads cannot be interrupted) but is
        handed no further batch; the counters are final when this returns.
        """
        with link.handoff_lock:
            link.cut = True
            handed = link.handed if link.in_call else 0
        link.finish_after_cut = finish_after
        in_flight = [link.in_hand.popleft() for _ in range(min(handed, len(link.in_hand)))]
        self._release_backlog(link)
        link.in_hand.extend(in_flight)  # the feed pops them when the call returns
        link.scope.cancel()

    # ------------------------------------------------------------------ loop: flush and finish

    async def flush(self, timeout_s: float | None) -> bool:
        with anyio.move_on_after(timeout_s):
            await self._flush_all()
            return True
        _log().warning(
            "bus_flush_timed_out",
            timeout_s=timeout_s,
            tracers=[t.name for t in self._tracers],
            subscribers=[s.key for s in self._subscribers],
        )
        return False

    async def _flush_all(self) -> None:
        requests = []
        for tracer_link in self._tracers:
            if tracer_link.stopped.is_set():
                continue
            request = anyio.Event()
            tracer_link.flush_requests.append(request)
            tracer_link.wake.set()
            requests.append(request)
        for request in requests:
            await request.wait()
        # Every batch of those items is now in the sinks and in a stream (or was
        # dropped and counted). A marker behind them is reached once they are consumed.
        markers = []
        for subscriber_link in self._subscribers:
            if subscriber_link.finished.is_set():
                continue
            marker = _FlushMarker(anyio.Event())
            try:
                await subscriber_link.send.send(marker)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                continue
            markers.append(marker)
        for marker in markers:
            await marker.reached.wait()

    async def finish_recording(self, timeout_s: float | None) -> bool:
        tracers, sinks, subscribers = self._tracers, self._sinks, self._subscribers
        for tracer_link in tracers:
            if not tracer_link.tracer.outbox.closed:
                _log().warning(
                    "bus_tracer_not_stopped",
                    tracer=tracer_link.name,
                    detail="finish_recording() was called before the tracer's stop(); "
                    "only what it handed over so far is delivered",
                )
        # From now on every wait on a streamed subscriber spends its drain budget; a router
        # already waiting for room is woken to take the budget into account.
        for subscriber_link in subscribers:
            subscriber_link.drain_left_s = self.subscriber_drain_s
            if subscriber_link.space_freed is not None:
                subscriber_link.space_freed.set()
                subscriber_link.space_freed = None
        complete = False
        with anyio.move_on_after(timeout_s):
            for tracer_link in tracers:
                tracer_link.stop_requested = True
                tracer_link.wake.set()
            for tracer_link in tracers:
                await tracer_link.stopped.wait()
            # Everything is decoded: the sinks hold the whole recording.
            for sink_link in sinks:
                try:
                    sink_link.sink.finish()
                except Exception as exc:  # noqa: BLE001 - isolation, as for consume
                    self._sink_failed(sink_link, "finish", exc)
            # No more routing: closing the send side ends each feed after its backlog.
            for subscriber_link in subscribers:
                subscriber_link.send.close()
            async with anyio.create_task_group() as drains:
                for subscriber_link in subscribers:
                    drains.start_soon(self._drain, subscriber_link)
            complete = True
        if not complete:
            self._abandon(tracers, subscribers, timeout_s)
        for subscriber_link in subscribers:
            if subscriber_link.dropped_batches:
                _log().warning(
                    "bus_recording_dropped_batches",
                    subscriber=subscriber_link.key,
                    dropped_batches=subscriber_link.dropped_batches,
                    dropped_events=subscriber_link.dropped_events,
                    capacity=subscriber_link.capacity,
                )
        self._tracers = tuple(t for t in self._tracers if t not in tracers)
        self._sinks = tuple(s for s in self._sinks if s not in sinks)
        self._subscribers = tuple(s for s in self._subscribers if s not in subscribers)
        self.counters.end_recording()
        return complete

    async def _drain(self, link: _SubscriberLink) -> None:
        """Wait for one subscriber to consume its backlog and finish, within its drain budget."""
        if link.finished.is_set():
            return
        budget = link.drain_left_s or 0.0
        if budget > 0:
            with anyio.move_on_after(budget):
                await link.finished.wait()
        if link.finished.is_set():
            return
        self._cut(link, finish_after=True)
        _log().warning(
            "bus_subscriber_cut_off",
            subscriber=link.key,
            subscriber_drain_s=self.subscriber_drain_s,
            dropped_batches=link.dropped_batches,
            dropped_events=link.dropped_events,
            detail="the subscriber did not keep up by the end of the recording; what it was not "
            "handed is dropped for it (the trace is complete), and finish() runs when its "
            "consume() in flight returns",
        )

    def _abandon(
        self,
        tracers: tuple[_TracerLink, ...],
        subscribers: tuple[_SubscriberLink, ...],
        timeout_s: float | None,
    ) -> None:
        stuck_tracers, stuck_subscribers = [], []
        for tracer_link in tracers:
            if not tracer_link.stopped.is_set():
                stuck_tracers.append(tracer_link.name)
                tracer_link.scope.cancel()
            # Items still waiting would otherwise leak into the tracer's next recording.
            left = len(tracer_link.tracer.outbox.drain()) + len(tracer_link.pending)
            tracer_link.pending.clear()
            if left:
                self.counters.add(tracer_link.name, items_abandoned=left)
        for subscriber_link in subscribers:
            subscriber_link.send.close()
            if not subscriber_link.finished.is_set() and not subscriber_link.cut:
                stuck_subscribers.append(subscriber_link.key)
                # Cut short: its finish() is not called, its backlog is counted as dropped now.
                self._cut(subscriber_link, finish_after=False)
        _log().error(
            "bus_finish_timed_out",
            timeout_s=timeout_s,
            tracers_not_drained=stuck_tracers,
            subscribers_not_finished=stuck_subscribers,
        )


class EventBus:
    """Moves event batches from tracers to subscribers on one background thread.

    Typical use, one recording after another on the same bus::

        bus = EventBus()
        bus.add_tracer(tracer)
        bus.subscribe(subscriber)
        tracer.start(); ...; tracer.stop()      # stop() leaves everything in the outbox
        bus.finish_recording()                  # deliver all, subscriber.finish(), detach
        ...                                     # next recording: attach again
        bus.close()

    The bus thread starts on the first ``add_tracer``/``subscribe`` (or
    ``start``). Lifecycle calls come from the profiling thread(s), never from a
    tracer's ``decode`` or a subscriber's ``consume`` (that is a ``RuntimeError``).
    Tracer threads and native callbacks only ever ``outbox.put``.

    A ``decode`` or ``consume`` that raises is counted, logged once per error
    type, and isolated: the other tracers and subscribers carry on, the failing
    subscriber keeps receiving later batches, and the exception never reaches
    the profiled program.

    Guarantees: a ``Sink`` receives every batch the tracers' ``decode`` yields
    (only a ``decode`` that fails or a ``finish_recording`` timeout costs it
    anything, and both are counted: ``BusStatistics.collection_complete``). A
    streamed subscriber receives each batch at most once, in order; what it
    does not receive is counted as dropped for it, so ``batches_delivered +
    batches_dropped`` is every batch routed while it was attached.
    """

    def __init__(
        self,
        *,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        overflow_wait_s: float = DEFAULT_OVERFLOW_WAIT_S,
        subscriber_drain_s: float = DEFAULT_SUBSCRIBER_DRAIN_S,
        default_capacity: int = DEFAULT_CAPACITY,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        thread_name: str = "polyprof-bus",
    ) -> None:
        """
        :param poll_interval_s: how often each tracer's outbox is checked when
            nobody calls ``flush``, while a streamed subscriber is attached (with
            sinks alone, outboxes are drained at ``flush`` and at the end only).
        :param overflow_wait_s: how long routing waits for room in a full
            subscriber stream (backpressure) before dropping the batch for that
            subscriber; 0 drops at once.
        :param subscriber_drain_s: how long, in all, ``finish_recording`` may
            wait on one streamed subscriber: backpressure while the last items
            are decoded, then its backlog and its ``finish()``. Past it, what
            the subscriber has not been handed is dropped and counted for it,
            and the recording ends without it (it still gets ``finish()`` once
            its ``consume`` in flight returns). Sinks do not wait and are not
            limited. 0 cuts a subscriber that is not done at once.
        :param default_capacity: stream size, in batches, for ``subscribe``
            without ``capacity``.
        :param stop_timeout_s: the longest ``close`` waits for the loop; past it
            the (daemon) thread is abandoned and an error logged.
        :param thread_name: name of the bus thread.
        """
        _check_seconds(poll_interval_s, "poll_interval_s", allow_zero=False)
        _check_seconds(overflow_wait_s, "overflow_wait_s", allow_zero=True)
        _check_seconds(subscriber_drain_s, "subscriber_drain_s", allow_zero=True)
        _check_seconds(stop_timeout_s, "stop_timeout_s", allow_zero=False)
        self._default_capacity = _check_capacity(default_capacity)
        self._engine = _BusEngine(
            thread_name=thread_name,
            poll_interval_s=float(poll_interval_s),
            overflow_wait_s=float(overflow_wait_s),
            subscriber_drain_s=float(subscriber_drain_s),
            stop_timeout_s=float(stop_timeout_s),
        )
        # Shuts the loop down if the bus is collected or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, self._engine.close)

    # ---------------------------------------------------------------- lifecycle

    @property
    def running(self) -> bool:
        """True between the (lazy) start and ``close``, in the process that started the bus."""
        return self._engine.state == "running" and not self._engine.forked()

    @property
    def forked(self) -> bool:
        """True in a forked child of the process that started the bus (its thread is not here)."""
        return self._engine.forked()

    @property
    def closed(self) -> bool:
        return self._engine.state in ("closing", "closed")

    @property
    def thread(self) -> threading.Thread | None:
        """The bus thread, once started."""
        return self._engine.loop_thread

    def start(self) -> None:
        """Start the bus thread now (otherwise the first attach does). Idempotent.

        :raises RuntimeError: if the bus was closed, or started in the parent of this forked process.
        """
        self._engine.start()

    def add_tracer(self, tracer: Tracer) -> None:
        """Attach ``tracer`` for the current recording: a task starts pulling its outbox.

        :raises TypeError: if ``tracer`` is not a ``polyprof.hooks.components.Tracer``.
        :raises ValueError: if it, or another tracer of the same name, is attached.
        """
        if not isinstance(tracer, Tracer):
            raise TypeError(f"add_tracer() needs a polyprof.plugin.Tracer, not {type(tracer).__qualname__}")
        self.start()
        self._engine.call(self._engine.attach_tracer, tracer, what="add_tracer")

    def subscribe(self, subscriber: Subscriber, *, capacity: int | None = None) -> str:
        """Attach ``subscriber`` for the current recording.

        A ``Sink`` is fed inline, before the others, and has no stream; any
        other ``Subscriber`` is fed from its own bounded stream.

        :param capacity: stream size in batches (default: the bus's
            ``default_capacity``); not for a ``Sink``.
        :returns: the key of its counters in ``statistics()``: its ``name``, or
            ``name#2``... when attached subscribers share a name.
        :raises TypeError: if ``subscriber`` is not a ``Subscriber`` or capacity not an int.
        :raises ValueError: if it is already attached, ``capacity < 1``, or a
            capacity is given for a ``Sink``.
        """
        if not isinstance(subscriber, Subscriber):
            raise TypeError(
                f"subscribe() needs a polyprof.plugin.Subscriber, not {type(subscriber).__qualname__}"
            )
        if isinstance(subscriber, Sink):
            if capacity is not None:
                raise ValueError(
                    f"subscriber {subscriber.name!r} is a Sink, fed inline without a stream; "
                    "capacity applies only to streamed subscribers"
                )
        else:
            capacity = self._default_capacity if capacity is None else _check_capacity(capacity)
        self.start()
        return self._engine.call(self._engine.attach_subscriber, subscriber, capacity, what="subscribe")

    def flush(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bool:
        """Deliver everything handed over so far.

        Blocks until every item that was in a tracer's outbox when ``flush`` was
        called is decoded and each resulting batch consumed by every subscriber
        (or dropped and counted). Wakes the pull tasks at once rather than
        waiting for their next poll. Does not call ``Tracer.flush`` (call it
        first to hand over native buffers).

        :param timeout_s: the longest to wait, or None for no limit.
        :returns: True when complete, False on timeout (logged; nothing is lost,
            delivery goes on in the background), and False at once in a forked
            child (the bus thread is in the parent).
        """
        _check_timeout(timeout_s, "timeout_s")
        if self._engine.forked():
            return self._refuse_in_forked_child("flush")
        if not self.running:
            return True
        return self._wait_on_loop(self._engine.flush, timeout_s, "flush")

    def finish_recording(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bool:
        """End the current recording: deliver everything, call ``finish()``, detach all.

        Call it after the tracers' ``stop()`` (which closes their outboxes; a
        tracer still open is warned about and its later items are not part of
        this recording). It drains every outbox one last time, decoding every
        item into the sinks, calls each sink's ``finish()``, waits until each
        streamed subscriber has consumed its backlog, calls its ``finish()``
        once (on its worker thread, after its last ``consume``), then detaches
        every tracer and subscriber so the next recording can attach afresh.

        A streamed subscriber is waited on for ``subscriber_drain_s`` at most
        (in all, from this call on). Past that it is cut off: batches it was not
        handed are counted as dropped for it, a warning names it, and its
        ``finish()`` runs in the background once its ``consume`` in flight
        returns. The sinks and the other subscribers are not affected.

        On timeout the recording is cut short: undecoded items are discarded and
        counted (``items_abandoned``), batches still queued are counted as
        dropped, subscribers that did not get to the end do not get ``finish()``,
        and an error is logged. Everything is detached either way.

        The counters of this recording are then kept for ``last_recording_statistics``.

        :param timeout_s: the longest to wait, or None for no limit.
        :returns: True when every item was decoded and every subscriber finished
            or was cut off at its drain deadline within ``timeout_s``; False on
            timeout, and False at once in a forked child (the bus thread is in
            the parent; nothing is delivered there).
        """
        _check_timeout(timeout_s, "timeout_s")
        if self._engine.forked():
            return self._refuse_in_forked_child("finish_recording")
        if not self.running:
            return True
        return self._wait_on_loop(self._engine.finish_recording, timeout_s, "finish_recording")

    def statistics(self) -> BusStatistics:
        """A snapshot of the counters (cumulative since the bus was created).

        In a forked child: the counts as they were at the fork.
        """
        return self._engine.counters.snapshot(locked=not self._engine.forked())

    def last_recording_statistics(self) -> BusStatistics:
        """The counters of the last recording that ``finish_recording`` ended (empty before one).

        Subscribers' keys are the ones ``subscribe`` returned for that recording.
        """
        return self._engine.counters.last_recording(locked=not self._engine.forked())

    def close(self) -> None:
        """Stop the bus: cancel its tasks, close the streams, join its threads.

        Idempotent, and safe on a bus that never started. A recording still
        attached is abandoned without ``finish()`` (a warning says so): call
        ``finish_recording`` first. Waits at most ``stop_timeout_s``. In a
        forked child it returns at once: only this copy of the bus is closed.
        """
        self._engine.close()
        if not self._engine.on_bus_thread():
            self._finalizer.detach()

    #: Alias of ``close``.
    stop = close

    def __enter__(self) -> EventBus:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EventBus {self._engine.state}>"

    def _refuse_in_forked_child(self, what: str) -> bool:
        _log().debug(
            "bus_call_in_forked_child",
            call=what,
            pid=os.getpid(),
            owner_pid=self._engine.owner_pid,
            detail="the bus thread lives in the parent process; nothing is delivered here",
        )
        return False

    def _wait_on_loop(self, func: Callable[..., Any], timeout_s: float | None, what: str) -> bool:
        user_timeout = None if timeout_s is None else timeout_s + _USER_SIDE_GRACE_S
        try:
            return self._engine.call(func, timeout_s, timeout_s=user_timeout, what=what)
        except TimeoutError:
            _log().error(
                "bus_loop_unresponsive",
                call=what,
                timeout_s=timeout_s,
                detail="the bus loop did not answer; a tracer's decode may be blocked",
            )
            return False
