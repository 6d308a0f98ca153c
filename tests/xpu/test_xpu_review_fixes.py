"""Regression tests for bugs found in review of polyprof-xpu (each failed before its fix)."""

from __future__ import annotations

import ctypes
import time

import pytest
from conftest import UUID0, UUID_UNKNOWN
from polyprof.events import EventKind
from test_xpu_records import DEVICES, PID, T0, api_name
from polyprof_xpu.decode import Clock, Decoder, DeviceTable

torch = pytest.importorskip("torch")
import polyprof  # noqa: E402
from polyprof import ProfilerActivity  # noqa: E402


def _views_off(fake) -> None:
    """Other tests enable every view of the fake for building buffers; PTI starts with all off."""
    for kind in range(16):
        fake.lib.ptiViewDisable(kind)


def _buffer(fake) -> tuple[ctypes.Array, int]:
    buf = (ctypes.c_uint8 * 65536)()
    return buf, fake.fakePtiBuildBuffer(buf, len(buf))


def test_records_without_device_timestamps_get_no_epoch_long_duration(fake_pti) -> None:
    """pti_view.h: a timestamp PTI could not determine is 0. Such a record must not become an event
    at 1970 or one lasting ~56 years (it would swamp every op's XPU time); it is left out and noted."""
    fake = fake_pti
    fake.fakePtiEnableAllForBuilding()
    fake.fakePtiReset()
    fake.fakePtiAddKernel(T0 + 100, T0 + 400, 11, 77, UUID0, 5, 0xA0, fake.name("good"), 1)
    fake.fakePtiAddKernel(0, T0 + 900, 12, 77, UUID0, 5, 0xA0, fake.name("no_start"), 2)
    fake.fakePtiAddKernel(T0 + 950, 0, 13, 77, UUID0, 5, 0xA0, fake.name("no_end"), 3)
    fake.fakePtiAddApi(6, 0, T0 + 90, 3, 0, PID, 77, 11)  # a host call without its enter time
    buf, used = _buffer(fake)
    _views_off(fake)
    decoder = Decoder(api_name, DeviceTable(DEVICES), Clock(0), pid=PID)
    batch = decoder.decode_buffer(fake.lib.ptiViewGetNextRecord, ctypes.addressof(buf), used)
    names = batch.values("name")
    assert list(names) == ["good"]
    assert int(batch["start_ns"][0]) == T0 + 100 and int(batch["dur_ns"][0]) == 300
    assert (batch["start_ns"] > T0 - 10**12).all() and (batch["dur_ns"] < 10**9).all()
    assert decoder.missing_timestamps == {1: 2, 6: 1}
    assert decoder.rows_emitted == {1: 1}


def _unknown_device_notes(trace) -> list[str]:
    return [n for n in trace.notes if "did not list" in n]


def test_unknown_device_note_belongs_to_the_recording_that_saw_it(fake_pti) -> None:
    """A schedule runs several recordings with one tracer: the "unknown device" note must describe
    the records of its own cycle, not every cycle after the first one that saw the device."""
    fake = fake_pti
    _views_off(fake)
    traces = []
    unknown_in_cycle = {0: True, 1: False}
    cycle = [0]

    def ready(prof) -> None:
        traces.append(prof.trace)
        cycle[0] += 1

    x = torch.ones(4)
    with polyprof.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.XPU],
        schedule=polyprof.schedule(wait=1, warmup=1, active=2, repeat=2),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(8):
            torch.add(x, x)
            now = time.time_ns()
            uuid = UUID_UNKNOWN if unknown_in_cycle.get(cycle[0]) else UUID0
            fake.fakePtiAddKernel(now, now + 1000, 1, 1, uuid, 5, 0xA0, fake.name("k"), 1)
            prof.step()
    assert len(traces) == 2
    assert all(int((t.events["kind"] == int(EventKind.KERNEL)).sum()) == 2 for t in traces)
    assert _unknown_device_notes(traces[0]), traces[0].notes
    assert not _unknown_device_notes(traces[1]), traces[1].notes


def test_unknown_device_seen_again_in_a_later_recording_is_noted_again(fake_pti) -> None:
    fake = fake_pti
    _views_off(fake)
    traces = []
    x = torch.ones(4)
    with polyprof.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.XPU],
        schedule=polyprof.schedule(wait=1, warmup=1, active=2, repeat=2),
        on_trace_ready=lambda p: traces.append(p.trace),
    ) as prof:
        for _ in range(8):
            torch.add(x, x)
            now = time.time_ns()
            fake.fakePtiAddKernel(now, now + 1000, 1, 1, UUID_UNKNOWN, 5, 0xA0, fake.name("k"), 1)
            prof.step()
    assert len(traces) == 2
    for t in traces:
        assert _unknown_device_notes(t), t.notes
