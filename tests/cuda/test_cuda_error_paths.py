"""Regressions: CUPTI failures after start must not end the user's program, Kineto's peer-copy
arg names, and pthread-id mapping for buffers decoded while the recording runs."""

from __future__ import annotations

import threading
import warnings

import pytest
from cupti_fakes import C, FakeCupti, K, api_call, kernel, record
from polyprof.activity import ProfilerActivity
from test_cuda_decode import make_decoder, rows
from test_cuda_tracer import drain, make_tracer

CUDA = frozenset({ProfilerActivity.CUDA})


class FailingForcedFlush(FakeCupti):
    """CUPTI refuses the final forced flush (a driver error, an unloaded libcupti)."""

    def flush_all(self, forced: bool) -> None:
        if forced:
            self.calls.append(("flush", forced))
            raise C.cuptiError(int(C.Result.ERROR_UNKNOWN))
        super().flush_all(forced)


class FailingDisable(FakeCupti):
    def disable_kind(self, kind: int) -> None:
        raise C.cuptiError(int(C.Result.ERROR_UNKNOWN))


def test_a_failing_final_flush_warns_and_does_not_raise():
    api = FailingForcedFlush()
    tracer = make_tracer(api)
    tracer.start()
    api.queue([kernel()])
    with pytest.warns(RuntimeWarning, match="flush"):
        tracer.stop()
    assert tracer.outbox.closed
    assert not api.subscribed
    assert any("flush" in note for note in tracer.trace_metadata()["notes"])


def test_a_failing_toggle_warns_and_does_not_raise():
    tracer = make_tracer(FailingDisable())
    tracer.start()
    try:
        with pytest.warns(RuntimeWarning, match="pause"):
            tracer.toggle_collection(False, CUDA)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tracer.stop()


@pytest.mark.parametrize("cls_name", [n for n in dir(C) if n.startswith("ActivityMemcpyPtoP")])
def test_peer_copy_args_use_kinetos_keys(cls_name):
    rec = record(
        cls_name, K.MEMCPY2, start=10, end=20, device_id=2, context_id=5, stream_id=3, correlation_id=4,
        bytes=8, copy_kind=int(C.ActivityMemcpyKind.PTOP), src_kind=3, dst_kind=3, src_device_id=0,
        dst_device_id=1, src_context_id=6, dst_context_id=7,
    )  # fmt: skip
    (row,) = rows(make_decoder().decode([rec])[0])
    args = row["args"]
    assert (args["fromDevice"], args["inDevice"], args["toDevice"]) == (0, 2, 1)
    assert (args["fromContext"], args["inContext"], args["toContext"]) == (6, 5, 7)
    assert args["bytes"] == 8
    assert "src device" not in args and "dst device" not in args


def test_pthread_ids_of_threads_started_during_the_recording_are_mapped_at_periodic_flushes():
    api = FakeCupti(system_thread_ids=False)
    tracer = make_tracer(api)
    tracer.start()
    try:
        seen: dict[str, int] = {}
        release = threading.Event()

        def worker() -> None:
            seen["pthread"] = threading.get_ident() & 0xFFFFFFFF
            seen["native"] = threading.get_native_id()
            release.wait(5)

        thread = threading.Thread(target=worker)
        thread.start()
        while "native" not in seen:
            pass
        api.queue([api_call(thread_id=seen["pthread"])])
        tracer.flush()  # a periodic flush: the bus decodes while the worker still runs
        batch = drain(tracer)
        release.set()
        thread.join()
    finally:
        tracer.stop()
    assert batch["tid"].tolist() == [seen["native"]]
