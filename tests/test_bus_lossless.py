"""The core's collection never drops; only streamed subscribers may, counted, and never for long.

Issue 11, "Faults and bad input" item 3: with one slow third-party subscriber the trace lost
device events and the profile's exit stalled for a minute, while the note named only the
subscriber's drops.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus_fakes import FakeTracer, RecordingSubscriber, same_batches
from hypothesis_budget import examples
from polyprof.base.activity import ProfilerActivity
from polyprof.base.events import EventBatch
from polyprof.hooks.components import Subscriber
from polyprof.runtime.bus import DEFAULT_SUBSCRIBER_DRAIN_S, EventBus, Sink
from polyprof.runtime.session import Session, TraceCollector
from polyprof.testing import ComponentPlugin, make_event_batch, make_plugin_manager_for_tests
from polyprof.testing import FakeTracer as SessionFakeTracer


class ListSink(Sink):
    """A sink that keeps its batches and notes where ``finish`` fell."""

    def __init__(self, name: str = "sink", *, fail_on: int | None = None) -> None:
        self.name = name
        self.fail_on = fail_on
        self.batches: list[EventBatch] = []
        self.threads: set[int] = set()
        self.finished = 0

    def consume(self, batch: EventBatch) -> None:
        self.threads.add(threading.get_ident())
        self.batches.append(batch)
        if self.fail_on is not None and len(self.batches) == self.fail_on:
            raise RuntimeError("sink failure")

    def finish(self) -> None:
        self.finished += 1


class OneCallAtATime(RecordingSubscriber):
    """Slow, and records whether two of its calls ever overlapped."""

    def __init__(self, name: str, delay_s: float) -> None:
        super().__init__(name, delay_s=delay_s)
        self._active = 0
        self._lock = threading.Lock()
        self.overlapped = False

    def _enter(self) -> None:
        with self._lock:
            self._active += 1
            self.overlapped |= self._active > 1

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1

    def consume(self, batch: EventBatch) -> None:
        self._enter()
        try:
            super().consume(batch)
        finally:
            self._leave()

    def finish(self) -> None:
        self._enter()
        try:
            time.sleep(self.delay_s)
            super().finish()
        finally:
            self._leave()


def wait_until(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def assert_accounted(stats, key: str, routed: int) -> None:
    """The bus's invariant: every batch routed to a subscriber was handed to it or dropped for it."""
    assert stats.batches_delivered[key] + stats.batches_dropped[key] == routed


# ---------------------------------------------------------------------------- the bus


def test_a_sink_gets_every_batch_on_the_bus_thread_while_a_streamed_subscriber_drops():
    bus = EventBus(poll_interval_s=0.005, overflow_wait_s=0.005)
    tracer = FakeTracer("t")
    sink = ListSink()
    slow = RecordingSubscriber("slow", delay_s=0.01)
    bus.add_tracer(tracer)
    assert bus.subscribe(sink) == "sink"
    bus.subscribe(slow, capacity=1)
    tracer.start()
    for _ in range(60):
        tracer.put([5, 5])
    tracer.stop()
    assert bus.finish_recording(timeout_s=30)
    bus_thread = bus.thread
    bus.close()

    stats = bus.statistics()
    assert same_batches(sink.batches, tracer.produced) and len(sink.batches) == 120
    assert sink.threads == {bus_thread.ident} and sink.finished == 1
    assert stats.batches_delivered["sink"] == 120 and stats.batches_dropped["sink"] == 0
    assert stats.batches_dropped["slow"] > 0
    assert_accounted(stats, "slow", 120)
    assert stats.batches_delivered["slow"] == len(slow.batches)
    assert stats.collection_complete and not stats.lossless


def test_a_failing_sink_is_isolated_counted_and_logged_once():
    bus = EventBus(poll_interval_s=0.005)
    tracer = FakeTracer("t")
    broken, sink, sub = ListSink("broken", fail_on=2), ListSink("fine"), RecordingSubscriber()
    bus.add_tracer(tracer)
    for subscriber in (broken, sink, sub):
        bus.subscribe(subscriber)
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            tracer.put([3])
        tracer.stop()
        assert bus.finish_recording(timeout_s=30)
    bus.close()
    assert len(broken.batches) == 4  # it keeps receiving after its failure
    assert same_batches(sink.batches, tracer.produced) and same_batches(sub.batches, tracer.produced)
    assert bus.statistics().subscriber_errors == {"broken": 1, "fine": 0, "recorder": 0}
    failures = [e for e in logs if e["event"] == "bus_subscriber_failed"]
    assert [(e["subscriber"], e["call"]) for e in failures] == [("broken", "consume")]


def test_a_slow_subscriber_is_cut_off_at_its_drain_deadline_and_still_finished():
    drain_s = 0.3
    bus = EventBus(poll_interval_s=0.005, subscriber_drain_s=drain_s)
    tracer = FakeTracer("t")
    sink = ListSink()
    slow = OneCallAtATime("slow", delay_s=0.05)  # 100 batches: 5 s to consume them all
    bus.add_tracer(tracer)
    bus.subscribe(sink)
    bus.subscribe(slow, capacity=8)
    tracer.start()
    for _ in range(100):
        tracer.put([4])
    tracer.stop()
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        assert bus.finish_recording(timeout_s=30)
    took = time.monotonic() - started
    # The bound is generous on purpose (a loaded machine); a stall waits for all 5 s of consume.
    assert took < 3.0, f"finish_recording took {took:.2f} s with a {drain_s} s drain"

    # The counts are final when finish_recording returns: the cut decided what was handed over.
    at_return = bus.statistics()
    assert_accounted(at_return, "slow", 100)
    assert at_return.batches_dropped["slow"] > 0
    assert same_batches(sink.batches, tracer.produced) and sink.finished == 1
    assert bus.last_recording_statistics() == at_return
    [cut] = [e for e in logs if e["event"] == "bus_subscriber_cut_off"]
    assert cut["subscriber"] == "slow" and cut["dropped_batches"] == at_return.batches_dropped["slow"]

    # Its consume in flight ends, then it gets finish(), in the background.
    assert wait_until(lambda: slow.finished == 1)
    assert slow.calls[-1] == "finish"
    assert len(slow.batches) == at_return.batches_delivered["slow"]
    assert bus.statistics() == at_return
    order = [int(b["correlation_id"][0]) for b in slow.batches]
    assert order == sorted(order)
    bus.close()


def test_backpressure_during_the_finish_spends_the_drain_budget_not_the_whole_timeout():
    # A subscriber that takes nothing: with the old per-batch wait, 50 batches cost 50 x 1 s.
    gate = threading.Event()
    bus = EventBus(poll_interval_s=0.005, overflow_wait_s=1.0, subscriber_drain_s=0.2)
    tracer = FakeTracer("t")
    sink = ListSink()
    stuck = RecordingSubscriber("stuck", gate=gate)
    bus.add_tracer(tracer)
    bus.subscribe(sink)
    bus.subscribe(stuck, capacity=1)
    tracer.start()
    for _ in range(50):
        tracer.put([2])
    tracer.stop()
    started = time.monotonic()
    assert bus.finish_recording(timeout_s=60)
    took = time.monotonic() - started
    assert took < 5.0, f"finish_recording took {took:.2f} s"
    assert same_batches(sink.batches, tracer.produced) and len(sink.batches) == 50
    stats = bus.statistics()
    assert_accounted(stats, "stuck", 50)
    assert stats.batches_delivered["stuck"] <= 1  # at most the one held at the gate
    gate.set()
    assert wait_until(lambda: stuck.finished == 1)
    bus.close()


def test_a_cut_subscriber_attached_again_never_runs_two_calls_at_once():
    bus = EventBus(poll_interval_s=0.005, subscriber_drain_s=0.05)
    tracer = FakeTracer("t")
    slow = OneCallAtATime("slow", delay_s=0.03)
    for _ in range(2):
        bus.add_tracer(tracer)
        bus.subscribe(slow, capacity=4)
        tracer.start()
        for _ in range(20):
            tracer.put([1])
        tracer.stop()
        assert bus.finish_recording(timeout_s=30)
    assert wait_until(lambda: slow.finished == 2)
    bus.close()
    assert not slow.overlapped
    stats = bus.statistics()
    assert_accounted(stats, "slow", 40)
    assert stats.batches_delivered["slow"] == len(slow.batches)


def test_last_recording_statistics_count_one_recording_and_statistics_all():
    bus = EventBus(poll_interval_s=0.005, overflow_wait_s=0)
    tracer = FakeTracer("t")
    assert bus.last_recording_statistics().batches_received == {}
    sizes = [3, 5]
    for n_items in sizes:
        bus.add_tracer(tracer)
        bus.subscribe(ListSink())
        tracer.start()
        for _ in range(n_items):
            tracer.put([2])
        tracer.stop()
        assert bus.finish_recording(timeout_s=30)
        last = bus.last_recording_statistics()
        assert last.batches_received == {"t": n_items}
        assert last.events_delivered == {"sink": 2 * n_items}
    assert bus.statistics().batches_received == {"t": sum(sizes)}
    bus.close()


def test_sink_and_drain_arguments_are_checked():
    with pytest.raises(ValueError, match="subscriber_drain_s"):
        EventBus(subscriber_drain_s=-1)
    with pytest.raises(TypeError, match="subscriber_drain_s"):
        EventBus(subscriber_drain_s="5")  # type: ignore[arg-type]
    with EventBus() as bus:
        with pytest.raises(ValueError, match=r"Sink.*capacity"):
            bus.subscribe(ListSink(), capacity=4)
        sink = ListSink()
        bus.subscribe(sink)
        with pytest.raises(ValueError, match="already attached"):
            bus.subscribe(sink)
        assert bus.subscribe(RecordingSubscriber("sink")) == "sink#2"  # keys shared with sinks
        bus.finish_recording(timeout_s=10)
    assert DEFAULT_SUBSCRIBER_DRAIN_S > 0


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.lists(st.lists(st.integers(0, 20), max_size=3), max_size=10), min_size=1, max_size=3),
    delays=st.lists(st.sampled_from([0.0, 0.002, 0.01]), min_size=1, max_size=3),
    capacity=st.integers(1, 3),
    drain_s=st.sampled_from([0.0, 0.02, 5.0]),
)
def test_sinks_get_everything_and_streamed_subscribers_account_for_every_batch(
    plan, delays, capacity, drain_s
):
    # overflow_wait_s=0 and small drains make drops likely; whatever drops, the sink has it all.
    with EventBus(poll_interval_s=0.002, overflow_wait_s=0, subscriber_drain_s=drain_s) as bus:
        tracers = [FakeTracer(f"t{i}") for i in range(len(plan))]
        sink = ListSink()
        subscribers = [OneCallAtATime(f"s{i}", delay) for i, delay in enumerate(delays)]
        for tracer in tracers:
            bus.add_tracer(tracer)
            tracer.start()
        bus.subscribe(sink)
        for sub in subscribers:
            bus.subscribe(sub, capacity=capacity)
        for tracer, items in zip(tracers, plan):
            for sizes in items:
                tracer.put(sizes)
            tracer.stop()
        assert bus.finish_recording(timeout_s=60)
        at_return = bus.statistics()
        assert wait_until(lambda: all(sub.finished == 1 for sub in subscribers))

    total = sum(len(t.produced) for t in tracers)
    for tracer in tracers:
        assert same_batches([b for b in sink.batches if b.source == tracer.name], tracer.produced)
    assert len(sink.batches) == total and sink.finished == 1
    stats = bus.statistics()
    assert stats == at_return and stats.collection_complete
    assert stats.batches_dropped["sink"] == 0
    for sub in subscribers:
        assert_accounted(stats, sub.name, total)
        assert stats.batches_delivered[sub.name] == len(sub.batches)
        assert not sub.overlapped
        for tracer in tracers:  # a subsequence of what the tracer produced, in order, no repeats
            got = iter(tracer.produced)
            assert all(any(b is p for p in got) for b in sub.from_source(tracer.name))


# ---------------------------------------------------------------------------- the session


class SleepPerBatch(Subscriber):
    """A third-party streaming subscriber that needs a quarter of a second per batch."""

    name = "slow_stream"

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.events = 0
        self.finished = threading.Event()

    def consume(self, batch: EventBatch) -> None:
        time.sleep(self.delay_s)
        self.events += len(batch)

    def finish(self) -> None:
        self.finished.set()


def device_batches(n_batches: int, per_batch: int) -> list[EventBatch]:
    return [
        make_event_batch(
            [
                {"name": f"kernel_{i}", "start_ns": 1_000 * (i * per_batch + j), "dur_ns": 500}
                for j in range(per_batch)
            ],
            source="device",
        )
        for i in range(n_batches)
    ]


def test_trace_collector_is_a_sink():
    assert isinstance(TraceCollector(), Sink)


@pytest.mark.slow
def test_a_slow_third_party_subscriber_costs_the_trace_nothing_and_the_exit_little():
    # 3,000 device events in 600 batches; the subscriber would need 150 s for them.
    batches = device_batches(600, 5)
    tracer = SessionFakeTracer(batches, name="device", activities=[ProfilerActivity.CPU])
    slow = SleepPerBatch(delay_s=0.25)
    pm = make_plugin_manager_for_tests(ComponentPlugin(tracers=[tracer], subscribers=[slow]))
    session = Session.create(activities=[ProfilerActivity.CPU], plugin_manager=pm)
    try:
        session.prepare()
        session.start()
        started = time.monotonic()
        trace = session.stop()
        took = time.monotonic() - started
        stats = session.bus.last_recording_statistics()
    finally:
        session.shutdown()
    print(f"Session.stop() with a subscriber needing 0.25 s per batch: {took:.2f} s")

    # The trace holds every event the tracer produced.
    assert len(trace.events) == 3_000
    expected = np.sort(np.concatenate([b["start_ns"] for b in batches]))
    assert np.array_equal(np.sort(trace.events["start_ns"]), expected)
    assert stats.batches_delivered["trace_collector"] == 600
    assert stats.batches_dropped["trace_collector"] == 0 and stats.collection_complete

    # The subscriber's drops are counted, and the note names it with the counts.
    dropped = stats.events_dropped["slow_stream"]
    assert dropped > 0
    assert stats.events_delivered["slow_stream"] + dropped == 3_000
    [note] = [n for n in trace.notes if "slow_stream" in n]
    assert f"missed {dropped} of 3000 events ({stats.batches_dropped['slow_stream']} batches)" in note
    assert "the trace itself holds every event" in note

    # The exit waits about the drain deadline, not for the subscriber (generous bound: catches a stall).
    assert took < DEFAULT_SUBSCRIBER_DRAIN_S + 20, f"Session.stop() took {took:.1f} s"
    assert slow.finished.is_set()  # shutdown() closed the bus after its finish()
