"""The event bus: moves event batches from tracers to subscribers off the user's thread.

Topology::

    tracer thread / native callback --put--> Outbox (SimpleQueue, never blocks)
        bus loop: one pull task per tracer: drain -> tracer.decode(item) -> route
            route: every batch to every subscriber's own bounded memory stream
        bus loop: one feed task per subscriber: receive -> consume() in a worker thread

The bus runs an anyio event loop (asyncio backend) on one daemon thread,
started lazily through ``anyio.from_thread.start_blocking_portal``. The user's
thread only makes lifecycle calls (``start``, ``add_tracer``, ``subscribe``,
``flush``, ``finish_recording``, ``close``, ``statistics``); it never runs a
portal round trip per batch, and the bus never touches an event loop that the
user's program runs itself (profiling inside ``asyncio.run`` works).

Threads:

* ``Tracer.decode`` runs on the bus thread (the loop), one item at a time per tracer.
* ``Subscriber.consume`` and ``Subscriber.finish`` run on the bus's worker threads,
  one call at a time per subscriber (a per-subscriber ``CapacityLimiter(1)``), so a
  slow subscriber never stalls the loop, the tracers or the other subscribers.
  It is backpressure on the tracers' pull tasks while its stream is full, for at
  most ``overflow_wait_s``; after that the batch is dropped for that subscriber
  and counted (drop newest, never silently: a warning is logged).

Recordings: attach tracers and subscribers for a recording (``add_tracer``,
``subscribe``), let the tracers run and stop (``Tracer.stop`` closes the
outbox), then call ``finish_recording``: it delivers everything, calls each
subscriber's ``finish()`` once and detaches all of them, leaving the bus ready
for the next recording (a profiler with a schedule records several cycles on
one bus). ``close`` ends the bus.
"""

from __future__ import annotations

import collections
import concurrent.futures
import inspect
import math
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

from polyprof._log import get_logger
from polyprof.components import Subscriber, Tracer
from polyprof.events import EventBatch

__all__ = ["BusStatistics", "EventBus"]

#: How often a pull task looks at its outbox when nobody wakes it.
DEFAULT_POLL_INTERVAL_S = 0.01
#: How long routing waits for room in a full subscriber stream before dropping.
DEFAULT_OVERFLOW_WAIT_S = 2.0
#: Default size of a subscriber's stream, in batches (batches hold thousands of events).
DEFAULT_CAPACITY = 64
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


@attrs.frozen
class BusStatistics:
    """Counters of one bus since it was created (cumulative over recordings).

    Tracer counters are keyed by ``Tracer.name``; subscriber counters by the
    key ``EventBus.subscribe`` returned (the subscriber's ``name``, with
    ``#2``, ``#3``... appended when several attached subscribers share a name).
    For every subscriber, ``batches_delivered + batches_dropped`` equals the
    batches routed while it was attached.
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
    #: Batches handed to ``consume``, per subscriber (whether or not it raised).
    batches_delivered: Mapping[str, int] = _counts_field("batches per subscriber")
    #: Events in those batches, per subscriber.
    events_delivered: Mapping[str, int] = _counts_field("events per subscriber")
    #: Batches dropped because the subscriber's stream stayed full, per subscriber.
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
    def lossless(self) -> bool:
        """True when nothing was dropped, abandoned or lost to a failing ``decode``."""
        return (
            self.batches_dropped_total == 0
            and sum(self.items_abandoned.values()) == 0
            and sum(self.tracer_errors.values()) == 0
        )


class _Counters:
    """The mutable counters behind ``BusStatistics``.

    Written on the bus thread, read from the user's thread: a lock keeps a
    snapshot consistent. One lock round per batch, not per event.
    """

    _NAMES = tuple(f.name for f in attrs.fields(BusStatistics))

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {name: {} for name in self._NAMES}

    def register(self, names: Iterable[str], key: str) -> None:
        with self._lock:
            for name in names:
                self._counts[name].setdefault(key, 0)

    def add(self, key: str, **increments: int) -> None:
        with self._lock:
            for name, amount in increments.items():
                table = self._counts[name]
                table[key] = table.get(key, 0) + amount

    def snapshot(self) -> BusStatistics:
        with self._lock:
            return BusStatistics(**{name: dict(table) for name, table in self._counts.items()})


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
class _SubscriberLink:
    """Loop-side state of one attached subscriber (touched only on the bus thread)."""

    subscriber: Subscriber
    key: str
    capacity: int
    send: Any  # MemoryObjectSendStream[EventBatch | _FlushMarker]
    receive: Any  # MemoryObjectReceiveStream[EventBatch | _FlushMarker]
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


class _CallbackState(threading.local):
    #: True while this thread runs a subscriber's ``consume``/``finish`` for the bus.
    active = False


_callback_state = _CallbackState()


def _run_consume(subscriber: Subscriber, batches: list[EventBatch], note_thread: Callable[[], None]) -> list:
    """Worker-thread side of delivery: consume each batch, collect (not raise) failures."""
    note_thread()
    failures = []
    _callback_state.active = True
    try:
        for batch in batches:
            try:
                subscriber.consume(batch)
            except Exception as exc:  # isolation: the subscriber's failure stays in the bus
                failures.append(exc)
    finally:
        _callback_state.active = False
    return failures


def _run_finish(subscriber: Subscriber, note_thread: Callable[[], None]) -> Exception | None:
    note_thread()
    _callback_state.active = True
    try:
        subscriber.finish()
    except Exception as exc:
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


_PORTAL_TAKES_NAME = "name" in inspect.signature(anyio.from_thread.start_blocking_portal).parameters


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
        stop_timeout_s: float,
    ) -> None:
        self.thread_name = thread_name
        self.poll_interval_s = poll_interval_s
        self.overflow_wait_s = overflow_wait_s
        self.stop_timeout_s = stop_timeout_s
        self.counters = _Counters()
        # Lifecycle (user's threads).
        self._lifecycle_lock = threading.Lock()
        self._state = "new"  # new -> running -> closing -> closed
        self._portal_cm: Any = None
        self._portal: Any = None
        self._supervisor: concurrent.futures.Future | None = None
        self.loop_thread: threading.Thread | None = None
        self._worker_threads: set[threading.Thread] = set()
        self._worker_threads_lock = threading.Lock()
        # Loop-side state (bus thread only).
        self._task_group: Any = None
        self._tracers: tuple[_TracerLink, ...] = ()
        self._subscribers: tuple[_SubscriberLink, ...] = ()
        self._logged: set[tuple[str, str, type]] = set()

    # ------------------------------------------------------------------ lifecycle (user's thread)

    @property
    def state(self) -> str:
        return self._state

    def start(self) -> None:
        with self._lifecycle_lock:
            if self._state == "running":
                return
            if self._state != "new":
                raise RuntimeError("this EventBus is closed; create a new EventBus")
            kwargs = {"name": self.thread_name} if _PORTAL_TAKES_NAME else {}
            cm = anyio.from_thread.start_blocking_portal("asyncio", **kwargs)
            portal = cm.__enter__()
            try:
                self._supervisor, _ = portal.start_task(self._supervise, name="polyprof-bus supervisor")
                self.loop_thread = portal.call(threading.current_thread)
            except BaseException as exc:
                cm.__exit__(type(exc), exc, exc.__traceback__)
                raise
            self._portal_cm, self._portal = cm, portal
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
        """Cancel all tasks, stop the loop and join the threads; idempotent; bounded in time."""
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
        deadline = time.monotonic() + self.stop_timeout_s
        portal, cm, supervisor = self._portal, self._portal_cm, self._supervisor
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
        try:
            # Cancels what a user thread may still await (a flush in flight), then stops.
            portal.call(portal.stop, True)
        except RuntimeError:
            pass
        cm.__exit__(None, None, None)  # joins the loop thread (its own stop call is a no-op now)
        with self._worker_threads_lock:
            workers = list(self._worker_threads)
            self._worker_threads.clear()
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
        self._portal = self._portal_cm = self._supervisor = None
        self._state = "closed"

    def note_worker_thread(self) -> None:
        """Remember a worker thread that ran subscriber code, so ``close`` can join it."""
        thread = threading.current_thread()
        if thread not in self._worker_threads:
            with self._worker_threads_lock:
                self._worker_threads.add(thread)

    # ------------------------------------------------------------------ loop: supervision

    async def _supervise(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        if not _PORTAL_TAKES_NAME:
            threading.current_thread().name = self.thread_name
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
        if self._tracers or self._subscribers:
            _log().warning(
                "bus_closed_during_recording",
                tracers=[t.name for t in self._tracers],
                subscribers=[s.key for s in self._subscribers],
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

    async def attach_subscriber(self, subscriber: Subscriber, capacity: int) -> str:
        if any(link.subscriber is subscriber for link in self._subscribers):
            raise ValueError(f"subscriber {subscriber.name!r} is already attached to this bus")
        taken = {link.key for link in self._subscribers}
        key, n = subscriber.name, 1
        while key in taken:
            n += 1
            key = f"{subscriber.name}#{n}"
        send, receive = anyio.create_memory_object_stream(capacity)
        link = _SubscriberLink(
            subscriber=subscriber,
            key=key,
            capacity=capacity,
            send=send,
            receive=receive,
            limiter=anyio.CapacityLimiter(1),
            scope=anyio.CancelScope(),
            finished=anyio.Event(),
        )
        self.counters.register(_SUBSCRIBER_COUNTERS, key)
        self._subscribers = (*self._subscribers, link)
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
                    poll = self.poll_interval_s if link.tracer.hands_over_while_recording else None
                    with anyio.move_on_after(poll):
                        await link.wake.wait()
                    if link.wake.is_set():
                        link.wake = anyio.Event()
        except Exception:  # a bug of ours; never let it cancel the sibling tasks
            _log().error("bus_task_crashed", task="pull", tracer=link.name, exc_info=True)
        finally:
            if link.pending:  # cancelled mid-way (finish_recording timed out)
                self.counters.add(link.name, items_abandoned=len(link.pending))
                link.pending.clear()
            for request in link.flush_requests:
                request.set()
            link.flush_requests.clear()
            link.stopped.set()

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
        except Exception as exc:  # isolation: one tracer's bad item does not stop the bus
            self.counters.add(link.name, tracer_errors=1)
            self._log_once(
                "bus_tracer_decode_failed",
                link.name,
                exc,
                tracer=link.name,
                component=f"{type(link.tracer).__module__}.{type(link.tracer).__qualname__}",
            )

    async def _route(self, source: str, batch: EventBatch) -> None:
        """Offer one batch to every attached subscriber's stream."""
        events = len(batch)
        self.counters.add(source, batches_received=1, events_received=events)
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

    async def _send_with_backpressure(self, link: _SubscriberLink, batch: EventBatch) -> bool:
        # Wait on a "space freed" event rather than cancelling a pending send(): a
        # cancelled send can race with its item being taken, which would count a
        # delivered batch as dropped.
        deadline = anyio.current_time() + self.overflow_wait_s
        while True:
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return False
            if link.space_freed is None:
                link.space_freed = anyio.Event()
            with anyio.move_on_after(remaining):
                await link.space_freed.wait()
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
        ended = False
        try:
            with link.scope, link.receive:
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
                    await self._finish_subscriber(link)
                finally:
                    if not ended:  # cancelled or crashed: account for what never reached consume()
                        self._release_backlog(link)
        except Exception:  # a bug of ours; never let it cancel the sibling tasks
            _log().error("bus_task_crashed", task="feed", subscriber=link.key, exc_info=True)
        finally:
            link.finished.set()

    async def _deliver_in_hand(self, link: _SubscriberLink) -> None:
        in_hand = link.in_hand
        while in_hand:
            if isinstance(in_hand[0], _FlushMarker):
                in_hand.popleft().reached.set()
                continue
            batches = []
            for item in in_hand:
                if isinstance(item, _FlushMarker):
                    break
                batches.append(item)
            await self._deliver(link, batches)
            # Popped only once consumed, so a cancellation leaves them to _release_backlog.
            for _ in batches:
                in_hand.popleft()

    async def _deliver(self, link: _SubscriberLink, batches: list[EventBatch]) -> None:
        # run_sync is shielded once the call is handed to the worker: if it raises
        # cancellation, consume() was not called for any of these batches.
        failures = await anyio.to_thread.run_sync(
            _run_consume, link.subscriber, batches, self.note_worker_thread, limiter=link.limiter
        )
        self.counters.add(
            link.key, batches_delivered=len(batches), events_delivered=sum(len(b) for b in batches)
        )
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
        exc = await anyio.to_thread.run_sync(
            _run_finish, link.subscriber, self.note_worker_thread, limiter=link.limiter
        )
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
        for link in self._tracers:
            if link.stopped.is_set():
                continue
            request = anyio.Event()
            link.flush_requests.append(request)
            link.wake.set()
            requests.append(request)
        for request in requests:
            await request.wait()
        # Every batch of those items now sits in a stream (or was dropped and
        # counted). A marker behind them is reached once they are consumed.
        markers = []
        for link in self._subscribers:
            if link.finished.is_set():
                continue
            marker = _FlushMarker(anyio.Event())
            try:
                await link.send.send(marker)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                continue
            markers.append(marker)
        for marker in markers:
            await marker.reached.wait()

    async def finish_recording(self, timeout_s: float | None) -> bool:
        tracers, subscribers = self._tracers, self._subscribers
        for link in tracers:
            if not link.tracer.outbox.closed:
                _log().warning(
                    "bus_tracer_not_stopped",
                    tracer=link.name,
                    detail="finish_recording() was called before the tracer's stop(); "
                    "only what it handed over so far is delivered",
                )
        complete = False
        with anyio.move_on_after(timeout_s):
            for link in tracers:
                link.stop_requested = True
                link.wake.set()
            for link in tracers:
                await link.stopped.wait()
            # No more routing: closing the send side ends each feed after its backlog.
            for link in subscribers:
                link.send.close()
            for link in subscribers:
                await link.finished.wait()
            complete = True
        if not complete:
            self._abandon(tracers, subscribers, timeout_s)
        for link in subscribers:
            if link.dropped_batches:
                _log().warning(
                    "bus_recording_dropped_batches",
                    subscriber=link.key,
                    dropped_batches=link.dropped_batches,
                    dropped_events=link.dropped_events,
                    capacity=link.capacity,
                )
        self._tracers = tuple(t for t in self._tracers if t not in tracers)
        self._subscribers = tuple(s for s in self._subscribers if s not in subscribers)
        return complete

    def _abandon(
        self,
        tracers: tuple[_TracerLink, ...],
        subscribers: tuple[_SubscriberLink, ...],
        timeout_s: float | None,
    ) -> None:
        stuck_tracers, stuck_subscribers = [], []
        for link in tracers:
            if not link.stopped.is_set():
                stuck_tracers.append(link.name)
                link.scope.cancel()
            # Items still waiting would otherwise leak into the tracer's next recording.
            left = len(link.tracer.outbox.drain())
            if left:
                self.counters.add(link.name, items_abandoned=left)
        for link in subscribers:
            link.send.close()
            if not link.finished.is_set():
                stuck_subscribers.append(link.key)
                # Its finish() is not called. The feed task accounts for its backlog itself
                # when it next wakes: it may still be inside consume() with some of it.
                link.scope.cancel()
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
    """

    def __init__(
        self,
        *,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        overflow_wait_s: float = DEFAULT_OVERFLOW_WAIT_S,
        default_capacity: int = DEFAULT_CAPACITY,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        thread_name: str = "polyprof-bus",
    ) -> None:
        """
        :param poll_interval_s: how often each tracer's outbox is checked when
            nobody calls ``flush``.
        :param overflow_wait_s: how long routing waits for room in a full
            subscriber stream (backpressure) before dropping the batch for that
            subscriber; 0 drops at once.
        :param default_capacity: stream size, in batches, for ``subscribe``
            without ``capacity``.
        :param stop_timeout_s: the longest ``close`` waits for the loop; past it
            the (daemon) thread is abandoned and an error logged.
        :param thread_name: name of the bus thread.
        """
        _check_seconds(poll_interval_s, "poll_interval_s", allow_zero=False)
        _check_seconds(overflow_wait_s, "overflow_wait_s", allow_zero=True)
        _check_seconds(stop_timeout_s, "stop_timeout_s", allow_zero=False)
        self._default_capacity = _check_capacity(default_capacity)
        self._engine = _BusEngine(
            thread_name=thread_name,
            poll_interval_s=float(poll_interval_s),
            overflow_wait_s=float(overflow_wait_s),
            stop_timeout_s=float(stop_timeout_s),
        )
        # Shuts the loop down if the bus is collected or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, self._engine.close)

    # ---------------------------------------------------------------- lifecycle

    @property
    def running(self) -> bool:
        """True between the (lazy) start and ``close``."""
        return self._engine.state == "running"

    @property
    def closed(self) -> bool:
        return self._engine.state in ("closing", "closed")

    @property
    def thread(self) -> threading.Thread | None:
        """The bus thread, once started."""
        return self._engine.loop_thread

    def start(self) -> None:
        """Start the bus thread now (otherwise the first attach does). Idempotent.

        :raises RuntimeError: if the bus was closed.
        """
        self._engine.start()

    def add_tracer(self, tracer: Tracer) -> None:
        """Attach ``tracer`` for the current recording: a task starts pulling its outbox.

        :raises TypeError: if ``tracer`` is not a ``polyprof.components.Tracer``.
        :raises ValueError: if it, or another tracer of the same name, is attached.
        """
        if not isinstance(tracer, Tracer):
            raise TypeError(
                f"add_tracer() needs a polyprof.components.Tracer, not {type(tracer).__qualname__}"
            )
        self.start()
        self._engine.call(self._engine.attach_tracer, tracer, what="add_tracer")

    def subscribe(self, subscriber: Subscriber, *, capacity: int | None = None) -> str:
        """Attach ``subscriber`` for the current recording, fed by its own bounded stream.

        :param capacity: stream size in batches (default: the bus's ``default_capacity``).
        :returns: the key of its counters in ``statistics()``: its ``name``, or
            ``name#2``... when attached subscribers share a name.
        :raises TypeError: if ``subscriber`` is not a ``Subscriber`` or capacity not an int.
        :raises ValueError: if it is already attached or ``capacity < 1``.
        """
        if not isinstance(subscriber, Subscriber):
            raise TypeError(
                f"subscribe() needs a polyprof.components.Subscriber, not {type(subscriber).__qualname__}"
            )
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
            delivery goes on in the background).
        """
        _check_timeout(timeout_s, "timeout_s")
        if not self.running:
            return True
        return self._wait_on_loop(self._engine.flush, timeout_s, "flush")

    def finish_recording(self, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bool:
        """End the current recording: deliver everything, call ``finish()``, detach all.

        Call it after the tracers' ``stop()`` (which closes their outboxes; a
        tracer still open is warned about and its later items are not part of
        this recording). It drains every outbox one last time, waits until each
        subscriber has consumed its backlog, calls each subscriber's ``finish()``
        once (on its worker thread, after its last ``consume``), then detaches
        every tracer and subscriber so the next recording can attach afresh.

        On timeout the recording is cut short: undecoded items are discarded and
        counted (``items_abandoned``), batches still queued are counted as
        dropped, subscribers that did not get to the end do not get ``finish()``,
        and an error is logged. Everything is detached either way.

        :param timeout_s: the longest to wait, or None for no limit.
        :returns: True when everything was delivered and finished in time.
        """
        _check_timeout(timeout_s, "timeout_s")
        if not self.running:
            return True
        return self._wait_on_loop(self._engine.finish_recording, timeout_s, "finish_recording")

    def statistics(self) -> BusStatistics:
        """A snapshot of the counters (cumulative since the bus was created)."""
        return self._engine.counters.snapshot()

    def close(self) -> None:
        """Stop the bus: cancel its tasks, close the streams, join its threads.

        Idempotent, and safe on a bus that never started. A recording still
        attached is abandoned without ``finish()`` (a warning says so): call
        ``finish_recording`` first. Waits at most ``stop_timeout_s``.
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
