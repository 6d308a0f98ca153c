"""Sessions that ask torch's collector for CUDA on its CPU build (run in their own process by
tests/test_torch_result.py: Kineto keeps device state for the rest of the process)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polyprof.base.activity import ProfilerActivity
from polyprof.base.events import EventKind
from test_torch_result import _DevicePlugin, _profile


def test_the_device_tracer_gets_the_collector_result_the_cpu_tracer_decodes() -> None:
    plugin = _DevicePlugin()
    prof = _profile(plugin, [ProfilerActivity.CPU, ProfilerActivity.CUDA])
    assert plugin.asked_with and not plugin.asked_with[0].torch_activities
    assert prof.trace.config.torch_activities == frozenset({"CUDA"})
    tracer = plugin.tracer
    assert len(tracer.received) == 1
    assert tracer.stopped_before_results, "device tracers stop before the collector does"
    names = prof.trace.events.values("name")
    kinds = prof.trace.events["kind"].tolist()
    assert sum(1 for n, k in zip(names, kinds, strict=True) if k == EventKind.KERNEL) == 3
    assert sum(1 for n in names if n == "aten::add") == 3, "the CPU rows are still there"
    assert tracer.decoded_on and threading.main_thread().name not in tracer.decoded_on


def test_without_cpu_the_collector_still_runs_for_the_device_tracer() -> None:
    plugin = _DevicePlugin()
    prof = _profile(plugin, [ProfilerActivity.CUDA])
    assert len(plugin.tracer.received) == 1
    # torch's collector ran for CUDA alone: no CPU rows in its result (a CPU build records nothing)
    assert plugin.tracer.received[0].activity_types() in ([], None)
    assert not len(prof.trace.events)
