"""An EventBus in a forked child: its thread stayed in the parent, so nothing may wait on it.

Issue 11, "Faults and bad input" item 1 (the bus's part): ``os.fork()`` inside a recording left
the child hanging forever in any call that waited on the bus thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bus_fakes import FakeTracer, RecordingSubscriber, same_batches
from polyprof.runtime.bus import EventBus

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python 3.12+ warns that forking a process with threads may deadlock the child: that is the fault.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

#: Exit codes the child reports; anything else (or no exit) fails the test.
CHILD_OK = 0
CHILD_WRONG = 3
CHILD_CRASHED = 4


def wait_for_child(pid: int, deadline_s: float) -> tuple[int | None, float]:
    """The child's exit code, or None after killing it at the deadline; and the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), time.monotonic() - started
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None, time.monotonic() - started


@pytest.mark.slow
def test_a_forked_child_never_waits_on_the_parents_bus_thread():
    bus = EventBus(poll_interval_s=0.005)
    tracer = FakeTracer("t")
    sub = RecordingSubscriber()
    bus.add_tracer(tracer)
    bus.subscribe(sub)
    tracer.start()
    for _ in range(5):
        tracer.put([3])
    assert bus.flush(timeout_s=10)
    tracer.put([3])  # still in the outbox at the fork

    pid = os.fork()
    if pid == 0:  # the child: every path ends in os._exit, never back into pytest
        code = CHILD_CRASHED
        try:
            checks = [
                bus.finish_recording(timeout_s=None) is False,  # no limit: a wait would be forever
                bus.flush(timeout_s=None) is False,
                bus.statistics().batches_received == {"t": 5},
                bus.last_recording_statistics().batches_received == {},
                bus.forked,
                not bus.running,
            ]
            try:
                bus.add_tracer(FakeTracer("late"))
                checks.append(False)
            except RuntimeError as exc:
                checks.append("forked child" in str(exc))
            bus.close()
            checks.append(bus.closed)
            bus.close()  # idempotent
            code = CHILD_OK if all(checks) else CHILD_WRONG
        finally:
            os._exit(code)

    exit_code, waited = wait_for_child(pid, deadline_s=30)
    assert exit_code is not None, f"the forked child hung on the bus (killed after {waited:.0f} s)"
    assert exit_code == CHILD_OK, f"the forked child exited with {exit_code}"
    assert waited < 10

    # The parent's bus is untouched by the child.
    assert bus.running and not bus.forked
    tracer.stop()
    assert bus.finish_recording(timeout_s=10)
    assert same_batches(sub.batches, tracer.produced) and len(sub.batches) == 6 and sub.finished == 1
    bus.close()


@pytest.mark.slow
def test_a_forked_child_that_exits_normally_does_not_wait_on_the_bus():
    # Interpreter exit in the child runs the bus's finalizer (close): it must return at once.
    script = textwrap.dedent(
        """
        import os, sys, time
        from polyprof.runtime.bus import EventBus
        from polyprof.hooks.components import Subscriber, Tracer
        from polyprof.base.events import EventBatch

        class T(Tracer):
            name = "t"
            def start(self): pass
            def stop(self): self.outbox.close()

        class S(Subscriber):
            def consume(self, batch): pass

        BUS = EventBus(stop_timeout_s=30)  # a child waiting on close would take 30 s
        t = T(); BUS.add_tracer(t); BUS.subscribe(S())
        t.outbox.put(EventBatch.empty("t"))
        assert BUS.flush(timeout_s=10)
        pid = os.fork()
        if pid == 0:
            started = time.monotonic()
            assert BUS.finish_recording() is False
            print(f"child {time.monotonic() - started:.3f}", flush=True)
            sys.exit(0)  # a normal exit: atexit and the bus's finalizer run
        started = time.monotonic()
        while time.monotonic() - started < 20:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print("child hung", flush=True)
            sys.exit(1)
        print(f"child exit {os.waitstatus_to_exitcode(status)} after {time.monotonic() - started:.3f}")
        t.stop()
        assert BUS.finish_recording(timeout_s=10)
        BUS.close()
        print("parent done")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "parent done", result.stdout
    exit_line = next(line for line in lines if line.startswith("child exit"))
    assert exit_line.startswith("child exit 0 "), result.stdout
    assert float(exit_line.split()[-1]) < 15, result.stdout
