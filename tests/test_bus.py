"""Tests for polyprof.runtime.bus: delivery, isolation, overflow, flush, reuse, shutdown."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus_fakes import FakeTracer, RecordingSubscriber, same_batches
from hypothesis_budget import examples
from polyprof.runtime.bus import BusStatistics, EventBus, Sink

# ---------------------------------------------------------------------------- fixtures


@pytest.fixture
def bus() -> Iterator[EventBus]:
    bus = EventBus(poll_interval_s=0.005)
    yield bus
    bus.close()


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leaked, f"threads left behind: {leaked}"


def assert_lossless(stats: BusStatistics, tracers: list[FakeTracer], keys: list[str]) -> None:
    for tracer in tracers:
        assert stats.batches_received[tracer.name] == len(tracer.produced)
        assert stats.events_received[tracer.name] == sum(len(b) for b in tracer.produced)
        assert stats.tracer_errors[tracer.name] == 0
    for key in keys:
        assert stats.batches_dropped[key] == 0
        assert stats.events_dropped[key] == 0
        assert stats.batches_delivered[key] == stats.batches_received_total
        assert stats.events_delivered[key] == stats.events_received_total
    assert stats.lossless


# ---------------------------------------------------------------------------- delivery


def test_concurrent_tracers_and_foreign_threads_deliver_everything_once_in_order(no_thread_leak):
    bus = EventBus(poll_interval_s=0.005)
    tracers = [FakeTracer(f"tracer{i}") for i in range(4)]
    subscribers = [RecordingSubscriber(f"sub{i}") for i in range(3)]
    for tracer in tracers:
        bus.add_tracer(tracer)
        tracer.start()
    keys = [bus.subscribe(s, capacity=4) for s in subscribers]

    def produce(tracer: FakeTracer) -> None:  # a "native callback thread"
        for i in range(60):
            tracer.put([50 + i % 7, 0, 3])
            if i % 10 == 0:
                time.sleep(0.002)

    threads = [threading.Thread(target=produce, args=(t,)) for t in tracers[:3]]
    for thread in threads:
        thread.start()
    for _ in range(40):  # the last tracer puts from the test's own thread
        tracers[3].put([1000])
    for thread in threads:
        thread.join()
    for tracer in tracers:
        tracer.stop()
    assert bus.finish_recording(timeout_s=30)

    for tracer in tracers:
        assert len(tracer.produced) == (180 if tracer is not tracers[3] else 40)
        for sub in subscribers:
            assert same_batches(sub.from_source(tracer.name), tracer.produced)
    for sub in subscribers:
        assert sub.finished == 1 and sub.calls[-1] == "finish"
    assert_lossless(bus.statistics(), tracers, keys)
    bus.close()


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(  # per tracer: items; per item: batch sizes
        st.lists(st.lists(st.integers(0, 40), max_size=4), max_size=12),
        min_size=1,
        max_size=4,
    ),
    capacities=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    foreign=st.booleans(),
)
def test_every_batch_reaches_every_subscriber_exactly_once(plan, capacities, foreign):
    # Tiny capacities force the backpressure path; the default 2 s wait means no drops.
    with EventBus(poll_interval_s=0.002) as bus:
        tracers = [FakeTracer(f"t{i}") for i in range(len(plan))]
        subscribers = [RecordingSubscriber(f"s{i}") for i in range(len(capacities))]
        for tracer in tracers:
            bus.add_tracer(tracer)
        keys = [bus.subscribe(s, capacity=c) for s, c in zip(subscribers, capacities)]

        def produce(tracer: FakeTracer, items: list[list[int]]) -> None:
            for sizes in items:
                tracer.put(sizes)
            tracer.stop()

        if foreign:
            threads = [threading.Thread(target=produce, args=a) for a in zip(tracers, plan)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for args in zip(tracers, plan):
                produce(*args)
        assert bus.finish_recording(timeout_s=30)

        for tracer, items in zip(tracers, plan):
            assert [len(b) for b in tracer.produced] == [n for sizes in items for n in sizes]
            for sub in subscribers:
                assert same_batches(sub.from_source(tracer.name), tracer.produced)
        for sub in subscribers:
            assert len(sub.batches) == sum(len(t.produced) for t in tracers)
            assert sub.finished == 1
        assert_lossless(bus.statistics(), tracers, keys)


def test_decode_runs_on_the_bus_thread_and_consume_off_the_users_thread(bus):
    tracer = FakeTracer("t")
    sub = RecordingSubscriber()
    bus.add_tracer(tracer)
    bus.subscribe(sub)
    tracer.put([5])
    assert bus.flush(timeout_s=10)
    assert bus.thread is not None and bus.thread.daemon and bus.thread.name == "polyprof-bus"
    assert tracer.decode_threads == {bus.thread.ident}
    assert threading.get_ident() not in sub.threads
    tracer.stop()
    assert bus.finish_recording(timeout_s=10)


class DrainCountingTracer(FakeTracer):
    """Counts how often the bus looks into its outbox."""

    def __init__(self, name: str, *, hands_over: bool) -> None:
        super().__init__(name)
        self.hands_over_while_recording = hands_over
        self.drains = 0
        drain = self.outbox.drain

        def counting_drain() -> list:
            self.drains += 1
            return drain()

        self.outbox.drain = counting_drain  # type: ignore[method-assign]


@pytest.mark.parametrize("hands_over", [True, False])
def test_a_tracer_that_hands_over_nothing_while_recording_is_not_polled(hands_over):
    """The bus thread sleeps for such a tracer, so torch's Python tracer records none of its frames."""
    with EventBus(poll_interval_s=0.005) as bus:
        tracer = DrainCountingTracer("t", hands_over=hands_over)
        sub = RecordingSubscriber()
        bus.add_tracer(tracer)
        bus.subscribe(sub)
        time.sleep(0.3)
        polled = tracer.drains
        tracer.put([3])
        assert bus.flush(timeout_s=10)  # a flush still drains it
        tracer.stop()
        assert bus.finish_recording(timeout_s=10)
    assert [len(b) for b in sub.batches] == [3]
    if hands_over:
        assert polled >= 10
    else:
        assert polled <= 1


class KeepingSink(Sink):
    """Polyprof's own kind of subscriber: fed inline, keeps every batch."""

    name = "keeping"

    def __init__(self) -> None:
        self.batches: list = []

    def consume(self, batch) -> None:
        self.batches.append(batch)


def test_with_only_a_sink_attached_no_tracer_is_polled_until_a_streamed_subscriber_asks():
    """A plain profile (the collector alone) leaves the bus thread asleep while the program runs."""
    with EventBus(poll_interval_s=0.005) as bus:
        tracer = DrainCountingTracer("t", hands_over=True)
        sink = KeepingSink()
        bus.add_tracer(tracer)
        bus.subscribe(sink)
        tracer.put([1])
        time.sleep(0.3)
        assert tracer.drains <= 1, "the bus polled a tracer although no streamed subscriber is attached"
        assert bus.flush(timeout_s=10)  # a flush drains it
        assert [len(b) for b in sink.batches] == [1]
        streamed = RecordingSubscriber()
        bus.subscribe(streamed)
        before = tracer.drains
        tracer.put([2])
        time.sleep(0.3)
        assert tracer.drains - before >= 10, "a streamed subscriber attached, but the bus does not poll"
        assert [len(b) for b in sink.batches] == [1, 2], "the polled batch did not arrive without a flush"
        tracer.stop()
        assert bus.finish_recording(timeout_s=10)
    assert [len(b) for b in streamed.batches] == [2]


# ---------------------------------------------------------------------------- isolation


def test_raising_subscriber_is_isolated_counted_and_logged_once_per_error_type(bus):
    tracer = FakeTracer("t")
    bad = RecordingSubscriber("bad", fail_every=3)
    good = RecordingSubscriber("good")
    bus.add_tracer(tracer)
    bus.subscribe(bad)
    bus.subscribe(good)
    with structlog.testing.capture_logs() as logs:
        for _ in range(10):
            tracer.put([4, 4, 4])
        tracer.stop()
        assert bus.finish_recording(timeout_s=10)

    assert same_batches(good.batches, tracer.produced)
    # The failing subscriber keeps getting every batch after it raised.
    assert same_batches(bad.batches, tracer.produced)
    assert bad.finished == 1
    stats = bus.statistics()
    assert stats.subscriber_errors == {"bad": 10, "good": 0}  # 30 batches, every third raises
    assert stats.batches_delivered["bad"] == 30 and stats.batches_dropped["bad"] == 0
    failures = [e for e in logs if e["event"] == "bus_subscriber_failed"]
    assert sorted(e["error_type"] for e in failures) == ["RuntimeError", "ValueError"]
    for entry in failures:
        assert entry["log_level"] == "error"
        assert entry["subscriber"] == "bad"
        assert isinstance(entry["exc_info"], (RuntimeError, ValueError))


def test_failing_finish_is_counted_and_logged(bus):
    class BadFinish(RecordingSubscriber):
        def finish(self) -> None:
            raise OSError("disk full")

    tracer, sub, good = FakeTracer("t"), BadFinish("bad_finish"), RecordingSubscriber("good")
    bus.add_tracer(tracer)
    bus.subscribe(sub)
    bus.subscribe(good)
    tracer.put([1])
    tracer.stop()
    with structlog.testing.capture_logs() as logs:
        assert bus.finish_recording(timeout_s=10)
    assert good.finished == 1
    assert bus.statistics().subscriber_errors["bad_finish"] == 1
    [entry] = [e for e in logs if e["event"] == "bus_subscriber_failed"]
    assert entry["call"] == "finish" and isinstance(entry["exc_info"], OSError)


def test_raising_decode_is_isolated_counted_and_logged(bus):
    class NotBatches(FakeTracer):
        def decode(self, item):
            if item == ["junk"]:
                return ["not a batch"]
            return super().decode(item)

    broken = NotBatches("broken", failures={2: KeyError("bad record"), 5: KeyError("again")})
    healthy = FakeTracer("healthy")
    sub = RecordingSubscriber()
    bus.add_tracer(broken)
    bus.add_tracer(healthy)
    bus.subscribe(sub)
    with structlog.testing.capture_logs() as logs:
        for _ in range(8):
            broken.put([2])
            healthy.put([3])
        broken.outbox.put(["junk"])
        broken.stop()
        healthy.stop()
        assert bus.finish_recording(timeout_s=10)

    assert same_batches(sub.from_source("healthy"), healthy.produced) and len(healthy.produced) == 8
    # Items after the failing ones were still decoded and delivered.
    assert same_batches(sub.from_source("broken"), broken.produced) and len(broken.produced) == 6
    stats = bus.statistics()
    assert stats.tracer_errors == {"broken": 3, "healthy": 0}
    assert stats.items_decoded == {"broken": 9, "healthy": 8}
    assert not stats.lossless
    failures = [e for e in logs if e["event"] == "bus_tracer_decode_failed"]
    assert sorted(e["error_type"] for e in failures) == ["KeyError", "TypeError"]  # once per type
    assert all(e["tracer"] == "broken" and e["exc_info"] is not None for e in failures)
    assert sub.finished == 1


# ---------------------------------------------------------------------------- overflow


def test_overflow_with_a_slow_subscriber_is_counted_as_dropped_and_logged(no_thread_leak):
    bus = EventBus(poll_interval_s=0.005, overflow_wait_s=0.01)
    tracer = FakeTracer("t")
    slow = RecordingSubscriber("slow", delay_s=0.02)
    fast = RecordingSubscriber("fast")
    bus.add_tracer(tracer)
    bus.subscribe(slow, capacity=1)
    bus.subscribe(fast, capacity=64)
    with structlog.testing.capture_logs() as logs:
        for _ in range(30):
            tracer.put([10])
        tracer.stop()
        assert bus.finish_recording(timeout_s=30)
    bus.close()

    stats = bus.statistics()
    assert same_batches(fast.batches, tracer.produced)
    assert stats.batches_dropped["fast"] == 0
    dropped = stats.batches_dropped["slow"]
    assert dropped > 0
    assert stats.batches_delivered["slow"] == len(slow.batches) == 30 - dropped
    assert stats.events_dropped["slow"] == 10 * dropped
    assert not stats.lossless and stats.batches_dropped_total == dropped
    # What the slow one did get is still in order.
    order = [int(b["correlation_id"][0]) for b in slow.batches]
    assert order == sorted(order)
    first = [e for e in logs if e["event"] == "bus_batches_dropped"]
    assert len(first) == 1 and first[0]["subscriber"] == "slow" and first[0]["log_level"] == "warning"
    [summary] = [e for e in logs if e["event"] == "bus_recording_dropped_batches"]
    assert summary["dropped_batches"] == dropped and summary["dropped_events"] == 10 * dropped


def test_backpressure_waits_for_a_slow_subscriber_instead_of_dropping(bus):
    tracer = FakeTracer("t")
    slow = RecordingSubscriber("slow", delay_s=0.003)
    bus.add_tracer(tracer)
    bus.subscribe(slow, capacity=1)
    for _ in range(40):
        tracer.put([1])
    tracer.stop()
    assert bus.finish_recording(timeout_s=30)
    assert same_batches(slow.batches, tracer.produced)
    assert bus.statistics().batches_dropped["slow"] == 0


# ---------------------------------------------------------------------------- flush


def test_flush_delivers_what_was_handed_over_and_wakes_the_pull_tasks(no_thread_leak):
    # A poll interval far beyond the test: only flush's wake-up can deliver in time.
    bus = EventBus(poll_interval_s=60)
    tracers = [FakeTracer("a"), FakeTracer("b")]
    sub = RecordingSubscriber(delay_s=0.001)
    for tracer in tracers:
        bus.add_tracer(tracer)
    bus.subscribe(sub, capacity=2)
    for round_ in range(3):
        for tracer in tracers:
            for _ in range(5):
                tracer.put([7, 7])
        started = time.monotonic()
        assert bus.flush(timeout_s=10)
        assert time.monotonic() - started < 5
        for tracer in tracers:
            assert len(tracer.produced) == 10 * (round_ + 1)
            assert same_batches(sub.from_source(tracer.name), tracer.produced)
    assert sub.finished == 0  # flush is not the end of the recording
    for tracer in tracers:
        tracer.stop()
    assert bus.finish_recording(timeout_s=10)
    assert sub.finished == 1
    bus.close()


def test_flush_times_out_then_completes_without_losing_anything(bus):
    gate = threading.Event()
    tracer = FakeTracer("t")
    stuck = RecordingSubscriber("stuck", gate=gate)
    bus.add_tracer(tracer)
    bus.subscribe(stuck)
    for _ in range(3):
        tracer.put([2])
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        assert bus.flush(timeout_s=0.2) is False
    assert 0.15 < time.monotonic() - started < 3
    assert any(e["event"] == "bus_flush_timed_out" for e in logs)
    gate.set()
    assert bus.flush(timeout_s=10)
    assert same_batches(stuck.batches, tracer.produced) and len(stuck.batches) == 3
    tracer.stop()
    assert bus.finish_recording(timeout_s=10)


def test_flush_and_finish_on_an_idle_bus_do_not_start_it(no_thread_leak):
    bus = EventBus()
    assert bus.flush(timeout_s=1) is True
    assert bus.finish_recording(timeout_s=1) is True
    assert not bus.running and bus.thread is None
    assert bus.statistics() == BusStatistics()
    bus.close()


# ---------------------------------------------------------------------------- recordings


def test_bus_is_reused_across_recordings(no_thread_leak):
    bus = EventBus(poll_interval_s=0.005)
    tracer = FakeTracer("t")
    first, second = RecordingSubscriber("first"), RecordingSubscriber("second")

    bus.add_tracer(tracer)
    bus.subscribe(first)
    tracer.start()
    for _ in range(5):
        tracer.put([3])
    tracer.stop()
    assert bus.finish_recording(timeout_s=10)
    recording_one = list(tracer.produced)
    assert same_batches(first.batches, recording_one) and first.finished == 1

    # Everything was detached: the same tracer (reopened by start) and a new
    # subscriber make the second recording; the first subscriber sees none of it.
    bus.add_tracer(tracer)
    assert bus.subscribe(second) == "second"
    bus.subscribe(first)
    tracer.start()
    for _ in range(7):
        tracer.put([2])
    tracer.stop()
    assert bus.finish_recording(timeout_s=10)
    recording_two = tracer.produced[5:]
    assert same_batches(second.batches, recording_two) and second.finished == 1
    assert same_batches(first.batches, recording_one + recording_two) and first.finished == 2

    stats = bus.statistics()
    assert stats.batches_received == {"t": 12}
    assert stats.batches_delivered == {"first": 12, "second": 7}
    assert stats.lossless
    bus.close()


def test_finish_recording_warns_about_a_tracer_that_was_not_stopped(bus):
    tracer = FakeTracer("t")
    sub = RecordingSubscriber()
    bus.add_tracer(tracer)
    bus.subscribe(sub)
    tracer.put([1])
    with structlog.testing.capture_logs() as logs:
        assert bus.finish_recording(timeout_s=10)
    assert [e["tracer"] for e in logs if e["event"] == "bus_tracer_not_stopped"] == ["t"]
    assert same_batches(sub.batches, tracer.produced) and sub.finished == 1


def test_finish_recording_timeout_abandons_counts_and_detaches(no_thread_leak):
    gate = threading.Event()
    bus = EventBus(poll_interval_s=0.005)
    tracer = FakeTracer("t")
    stuck = RecordingSubscriber("stuck", gate=gate)
    fine = RecordingSubscriber("fine")
    bus.add_tracer(tracer)
    bus.subscribe(stuck, capacity=64)
    bus.subscribe(fine)
    for _ in range(5):
        tracer.put([4])
    tracer.stop()
    with structlog.testing.capture_logs() as logs:
        assert bus.finish_recording(timeout_s=0.3) is False
    [entry] = [e for e in logs if e["event"] == "bus_finish_timed_out"]
    assert entry["subscribers_not_finished"] == ["stuck"]
    assert fine.finished == 1 and same_batches(fine.batches, tracer.produced)
    gate.set()
    bus.close()  # waits for the consume in flight, then joins every thread
    stats = bus.statistics()
    assert stuck.finished == 0  # cut short: no finish()
    # Every batch is accounted for: consumed, or counted as dropped.
    assert stats.batches_delivered["stuck"] + stats.batches_dropped["stuck"] == 5
    assert stats.batches_delivered["stuck"] == len(stuck.batches) >= 1
    assert stats.events_dropped["stuck"] == 4 * stats.batches_dropped["stuck"]


def test_duplicate_subscriber_names_get_distinct_keys(bus):
    subs = [RecordingSubscriber("same") for _ in range(3)]
    assert [bus.subscribe(s) for s in subs] == ["same", "same#2", "same#3"]
    tracer = FakeTracer("t")
    bus.add_tracer(tracer)
    tracer.put([1])
    tracer.stop()
    assert bus.finish_recording(timeout_s=10)
    assert bus.statistics().batches_delivered == {"same": 1, "same#2": 1, "same#3": 1}


# ---------------------------------------------------------------------------- asyncio


def test_bus_works_inside_asyncio_run_and_leaves_the_users_loop_alone(no_thread_leak):
    tracer = FakeTracer("t")
    sub = RecordingSubscriber()

    async def profiled_program() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        tasks_before = asyncio.all_tasks()
        bus = EventBus(poll_interval_s=0.005)
        bus.start()
        bus.add_tracer(tracer)
        bus.subscribe(sub)
        tracer.start()
        for _ in range(20):
            tracer.put([8])
            await asyncio.sleep(0)  # the user's own loop keeps running between puts
        flushed = bus.flush(timeout_s=10)
        tracer.stop()
        finished = bus.finish_recording(timeout_s=10)
        bus.close()
        assert asyncio.get_running_loop() is loop
        assert asyncio.all_tasks() == tasks_before
        assert not loop._scheduled  # no timers or callbacks of ours on the user's loop
        assert not loop._ready
        assert id(loop) not in tracer.decode_loops  # decode ran on the bus's own loop
        return flushed, finished

    assert asyncio.run(profiled_program()) == (True, True)
    assert len(tracer.decode_loops) == 1
    assert same_batches(sub.batches, tracer.produced) and len(sub.batches) == 20


# ---------------------------------------------------------------------------- lifecycle


def test_close_is_idempotent_safe_unstarted_and_leaves_no_thread(no_thread_leak):
    never_started = EventBus()
    never_started.close()
    never_started.stop()
    assert never_started.closed and never_started.thread is None

    bus = EventBus()
    tracer, sub = FakeTracer("t"), RecordingSubscriber()
    bus.add_tracer(tracer)
    bus.subscribe(sub)
    tracer.put([3])
    assert bus.flush(timeout_s=10)
    tracer.stop()
    assert bus.finish_recording(timeout_s=10)
    thread = bus.thread
    bus.close()
    bus.close()
    bus.stop()
    assert bus.closed and not bus.running
    assert thread is not None and not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        bus.add_tracer(FakeTracer("late"))
    with pytest.raises(RuntimeError, match="closed"):
        bus.start()
    assert bus.flush(timeout_s=1) is True  # nothing attached, nothing to wait for


def test_close_during_a_recording_warns_and_skips_finish(no_thread_leak):
    bus = EventBus()
    tracer, sub = FakeTracer("t"), RecordingSubscriber()
    bus.add_tracer(tracer)
    bus.subscribe(sub)
    with structlog.testing.capture_logs() as logs:
        bus.close()
    [entry] = [e for e in logs if e["event"] == "bus_closed_during_recording"]
    assert entry["tracers"] == ["t"] and entry["subscribers"] == ["recorder"]
    assert sub.finished == 0


def test_context_manager_closes(no_thread_leak):
    with EventBus() as bus:
        bus.start()
        assert bus.running
    assert bus.closed


def test_lifecycle_calls_from_inside_the_bus_are_refused(bus):
    errors: list[BaseException] = []

    class Reentrant(RecordingSubscriber):
        def consume(self, batch):
            try:
                bus.flush(timeout_s=1)
            except RuntimeError as exc:
                errors.append(exc)
            super().consume(batch)

    class ReentrantTracer(FakeTracer):
        def decode(self, item):
            try:
                bus.flush(timeout_s=1)
            except RuntimeError as exc:
                errors.append(exc)
            return super().decode(item)

    tracer, sub = ReentrantTracer("t"), Reentrant()
    bus.add_tracer(tracer)
    bus.subscribe(sub)
    tracer.put([1])
    tracer.stop()
    assert bus.finish_recording(timeout_s=10)
    assert len(errors) == 2
    assert all("from the bus itself" in str(e) for e in errors)
    assert len(sub.batches) == 1


def test_forgotten_bus_does_not_hang_interpreter_exit():
    script = (
        "import numpy as np\n"
        "from polyprof.runtime.bus import EventBus\n"
        "from polyprof.hooks.components import Tracer, Subscriber\n"
        "from polyprof.base.events import EventBatch\n"
        "class T(Tracer):\n"
        "    name = 't'\n"
        "    def start(self): pass\n"
        "    def stop(self): self.outbox.close()\n"
        "class S(Subscriber):\n"
        "    def consume(self, batch): pass\n"
        "BUS = EventBus()\n"  # module global: never collected before exit
        "t = T(); BUS.add_tracer(t); BUS.subscribe(S())\n"
        "t.outbox.put(EventBatch.empty('t'))\n"
        "assert BUS.flush(timeout_s=10)\n"
        "print('done')\n"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 30


# ---------------------------------------------------------------------------- validation


def test_bad_arguments_are_clear_errors(bus):
    with pytest.raises(TypeError, match="Tracer"):
        bus.add_tracer(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Subscriber"):
        bus.subscribe(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Unbounded"):
        bus.subscribe(RecordingSubscriber(), capacity=math.inf)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        bus.subscribe(RecordingSubscriber(), capacity=0)
    with pytest.raises(ValueError, match="timeout_s"):
        bus.flush(timeout_s=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        bus.finish_recording(timeout_s=math.nan)
    with pytest.raises(ValueError, match="overflow_wait_s"):
        EventBus(overflow_wait_s=-0.5)
    with pytest.raises(ValueError, match="poll_interval_s"):
        EventBus(poll_interval_s=0)
    with pytest.raises(TypeError, match=r"default_capacity|capacity"):
        EventBus(default_capacity=2.5)  # type: ignore[arg-type]

    tracer = FakeTracer("dup")
    bus.add_tracer(tracer)
    with pytest.raises(ValueError, match="already attached"):
        bus.add_tracer(tracer)
    with pytest.raises(ValueError, match="named 'dup'"):
        bus.add_tracer(FakeTracer("dup"))
    sub = RecordingSubscriber()
    bus.subscribe(sub)
    with pytest.raises(ValueError, match="already attached"):
        bus.subscribe(sub)
