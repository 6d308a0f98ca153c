"""The CUPTI tracer's life cycle through a fake CUPTI facade: callbacks, outbox, flushes, accounting.

``FakeCupti`` delivers staged record buffers through the tracer's real
callbacks on the flushing thread (or a separate worker thread), as CUPTI does;
everything from the callback on is the tracer's own code.
"""

from __future__ import annotations

import threading
import time
import warnings

import pytest
from cupti_fakes import FakeCupti, K, api_call, kernel, memcpy
from polyprof.events import EventKind, concat
from polyprof_cuda.device import DeviceInfo
from polyprof_cuda.tracer import CudaTracingUnavailableWarning, CuptiBuffer, CuptiTracer


class NoDevices(DeviceInfo):
    def properties(self, index):
        return None

    def all_properties(self):
        return []


def make_tracer(api: FakeCupti, **kw) -> CuptiTracer:
    kw.setdefault("synchronize", lambda: None)
    kw.setdefault("device_info", NoDevices())
    return CuptiTracer(None, api, **kw)


def drain(tracer: CuptiTracer):
    """What the bus would do: decode every outbox item."""
    batches = []
    for item in tracer.outbox.drain():
        batches.extend(tracer.decode(item))
    return concat(batches)


def test_start_subscribes_enables_and_filters_like_kineto():
    api = FakeCupti()
    tracer = make_tracer(api)
    tracer.start()
    try:
        assert api.subscribed and ("subscribe", "polyprof-cuda") in api.calls
        assert ("set_thread_id_type_system",) in api.calls
        names = {k.name for k in K if int(k) in api.enabled}
        assert {
            "CONCURRENT_KERNEL",
            "MEMCPY",
            "MEMSET",
            "RUNTIME",
            "DRIVER",
            "SYNCHRONIZATION",
            "OVERHEAD",
        } <= names
        disabled_runtime = {c for (what, c, on) in (x for x in api.calls if x[0] == "runtime_cbid") if not on}
        disabled_driver = {c for (what, c, on) in (x for x in api.calls if x[0] == "driver_cbid") if not on}
        assert {api.runtime_cbids()[c] for c in disabled_runtime} == {"cudaGetDevice"}
        assert {api.driver_cbids()[c] for c in disabled_driver} == {
            "cuKernelGetAttribute",
            "cuDevicePrimaryCtxGetState",
            "cuCtxGetCurrent",
        }
    finally:
        tracer.stop()
    assert not api.enabled and not api.subscribed
    assert tracer.outbox.closed


def test_stop_synchronizes_then_forces_a_flush_and_everything_reaches_the_outbox():
    api = FakeCupti()
    order = []
    tracer = make_tracer(api, synchronize=lambda: order.append("synchronize"))
    tracer.start()
    api.queue([api_call(correlation_id=1), kernel(correlation_id=1)])
    api.queue([memcpy(correlation_id=2)])
    original_flush = api.flush_all
    api.flush_all = lambda forced: (order.append(("flush", forced)), original_flush(forced))[1]
    tracer.stop()
    assert order[:2] == ["synchronize", ("flush", True)]
    batch = drain(tracer)
    assert sorted(EventKind(k).name for k in batch["kind"].tolist()) == ["GPU_MEMCPY", "KERNEL", "RUNTIME"]
    meta = tracer.trace_metadata()
    assert meta["notes"] == []  # delivered == in the trace
    assert tracer.accounting()["delivered"] == tracer.accounting()["rows"] == 3
    assert meta["start_ns"] <= meta["end_ns"]


def test_callbacks_run_on_a_foreign_thread_and_only_hand_over():
    api = FakeCupti(deliver_on_worker=True)
    tracer = make_tracer(api)
    tracer.start()
    api.queue([kernel()])
    tracer.stop()
    assert api.delivery_threads == ["fake-cupti-worker"]
    items = tracer.outbox.drain()
    assert len(items) == 1 and isinstance(items[0], CuptiBuffer)  # decoding waits for the bus


def test_periodic_flush_delivers_while_recording():
    api = FakeCupti()
    tracer = make_tracer(api, flush_period_s=0.02)
    tracer.start()
    try:
        api.queue([kernel()])
        deadline = time.monotonic() + 5
        while tracer.outbox.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not tracer.outbox.empty(), "the periodic flush did not deliver within 5 s"
        assert ("flush", False) in api.calls
        assert "polyprof-cupti-flush" in api.delivery_threads
    finally:
        tracer.stop()
    assert not any(t.name == "polyprof-cupti-flush" for t in threading.enumerate())


def test_dropped_and_filtered_records_are_reported_in_notes():
    api = FakeCupti(dropped=5)
    tracer = make_tracer(api)
    tracer.start()  # reads (and so resets) CUPTI's counter: drops before the recording do not count
    api.dropped = 7  # CUPTI ran out of buffer space during the recording
    get_last_error = int(api.module.runtime_api_trace_cbid.cudaGetLastError_v3020)
    api.queue([kernel(), api_call(cbid=get_last_error), kernel(start=5, end=0)])
    tracer.stop()
    drain(tracer)
    notes = tracer.trace_metadata()["notes"]
    assert any("CUPTI dropped 7 activity records" in n for n in notes)
    (summary,) = [n for n in notes if "delivered" in n]
    assert "CUPTI delivered 3 records, 1 are in the trace" in summary
    assert "1 runtime/driver calls left out" in summary and "1 without timestamps" in summary


def test_records_never_decoded_are_reported():
    api = FakeCupti()
    tracer = make_tracer(api)
    tracer.start()
    api.queue([kernel(), kernel()])
    tracer.stop()
    tracer.outbox.drain()  # the bus lost them (e.g. finish_recording timed out)
    (note,) = tracer.trace_metadata()["notes"]
    assert "2 delivered but never decoded" in note


def test_subscriber_conflict_warns_naming_the_other_tool_and_records_nothing():
    api = FakeCupti(conflict="CUPTI for PyTorch Profiler")
    tracer = make_tracer(api)
    with pytest.warns(CudaTracingUnavailableWarning, match=r"CUPTI for PyTorch Profiler.*CPU-only"):
        tracer.start()
    api.queue([kernel()])
    tracer.stop()
    assert not api.enabled and ("flush", True) not in api.calls
    assert tracer.outbox.closed and tracer.outbox.empty()
    (note,) = tracer.trace_metadata()["notes"]
    assert "CUPTI for PyTorch Profiler" in note


def test_subscriber_conflict_without_a_name_still_warns():
    tracer = make_tracer(FakeCupti(conflict=None))
    with pytest.warns(CudaTracingUnavailableWarning, match="another CUPTI client holds"):
        tracer.start()
    tracer.stop()


def test_cupti_error_at_enable_goes_cpu_only_and_releases_the_subscriber():
    err = FakeCupti().module.cuptiError(int(FakeCupti().module.Result.ERROR_INSUFFICIENT_PRIVILEGES))
    api = FakeCupti(fail_enable=err)
    tracer = make_tracer(api)
    with pytest.warns(CudaTracingUnavailableWarning, match="NVreg_RestrictProfilingToAdminUsers"):
        tracer.start()
    assert not api.subscribed
    tracer.stop()


def test_runtime_kind_rejected_falls_back_to_driver_calls():
    api = FakeCupti(reject_runtime=True)
    tracer = make_tracer(api)
    tracer.start()
    assert int(K.RUNTIME) not in api.enabled and int(K.DRIVER) in api.enabled
    assert not [c for c in api.calls if c[0] == "runtime_cbid"]
    memcpy_cbid = int(api.module.driver_api_trace_cbid.cuMemcpyHtoDAsync_v2)
    api.queue([api_call(kind=K.DRIVER, cbid=memcpy_cbid)])
    tracer.stop()
    assert drain(tracer).values("name") == ["cuMemcpyHtoDAsync_v2"]
    assert any("cannot record CUDA runtime calls" in n for n in tracer.trace_metadata()["notes"])


def test_clock_offset_is_measured_and_applied():
    offset = 3_600 * 10**9  # CUPTI clock one hour behind CLOCK_REALTIME
    api = FakeCupti(clock_offset_ns=offset)
    tracer = make_tracer(api)
    tracer.start()
    cupti_now = api.get_timestamp()
    api.queue([kernel(start=cupti_now, end=cupti_now + 1_000)])
    tracer.stop()
    start = int(drain(tracer)["start_ns"][0])
    assert abs(start - (cupti_now + offset)) < 5_000_000
    assert any("not CLOCK_REALTIME" in n for n in tracer.trace_metadata()["notes"])


def test_realtime_clock_needs_no_conversion():
    api = FakeCupti()
    tracer = make_tracer(api)
    tracer.start()
    api.queue([kernel(start=1_000, end=2_000)])
    tracer.stop()
    assert drain(tracer)["start_ns"].tolist() == [1_000]


def test_pthread_ids_are_mapped_when_system_thread_ids_are_refused():
    api = FakeCupti(system_thread_ids=False)
    tracer = make_tracer(api)
    tracer.start()
    api.queue([api_call(thread_id=threading.get_ident() & 0xFFFFFFFF)])
    tracer.stop()
    assert drain(tracer)["tid"].tolist() == [threading.get_native_id()]


def test_a_second_recording_starts_clean():
    api = FakeCupti(dropped=1)
    tracer = make_tracer(api)
    for expected in (1, 2):
        tracer.start()
        api.queue([kernel()] * expected)
        tracer.stop()
        assert len(drain(tracer)) == expected
        assert tracer.accounting()["delivered"] == expected


def test_decode_rejects_foreign_items():
    tracer = make_tracer(FakeCupti())
    tracer.start()
    try:
        with pytest.raises(TypeError, match="CuptiBuffer"):
            tracer.decode([kernel()])
    finally:
        tracer.stop()


def test_flush_period_must_be_positive():
    with pytest.raises(ValueError, match="flush_period_s"):
        CuptiTracer(None, FakeCupti(), flush_period_s=0)


def test_toggle_collection_disables_and_reenables_kinds():
    from polyprof.activity import ProfilerActivity

    api = FakeCupti()
    tracer = make_tracer(api)
    tracer.start()
    try:
        enabled = set(api.enabled)
        tracer.toggle_collection(False, frozenset({ProfilerActivity.CUDA}))
        assert not api.enabled
        tracer.toggle_collection(True, frozenset({ProfilerActivity.CUDA}))
        assert api.enabled == enabled
    finally:
        tracer.stop()


def test_no_warning_on_a_clean_recording():
    tracer = make_tracer(FakeCupti())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracer.start()
        tracer.stop()
