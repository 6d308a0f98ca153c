"""Decoding real cupti-python record objects (built without a driver) into EventBatch rows.

Parametrised over every record-class version this cupti-python ships
(ActivityKernel9..13, ActivityMemcpy5..7, ActivityMemset4/5, ...): the decoder
reads attributes by name and must give the same rows for all of them.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
from cupti_fakes import (
    DRIVER_CTX_GET_DEVICE,
    DRIVER_LAUNCH,
    KERNEL_CLASSES,
    MEMCPY_CLASSES,
    MEMCPY_PTOP_CLASSES,
    MEMSET_CLASSES,
    OVERHEAD_CLASSES,
    RUNTIME_GET_LAST_ERROR,
    RUNTIME_LAUNCH,
    RUNTIME_MEMCPY_ASYNC,
    SYNC_CLASSES,
    C,
    K,
    api_call,
    kernel,
    memcpy,
    memset,
    overhead,
    record,
    sync,
)
from polyprof.events import DeviceType, EventKind
from polyprof_cuda.cbids import ApiCallFilter
from polyprof_cuda.cupti_api import CuptiApi
from polyprof_cuda.decode import RecordDecoder

API = CuptiApi()


def make_decoder(*, runtime_recorded: bool = True, offset_ns: int = 0, **kw) -> RecordDecoder:
    runtime, driver = API.runtime_cbids(), API.driver_cbids()
    return RecordDecoder(
        kinds=API.kind_values(),
        runtime_names=runtime,
        driver_names=driver,
        api_filter=ApiCallFilter.build(runtime, driver, runtime_recorded=runtime_recorded, keep_all=False),
        offset_ns=offset_ns,
        **kw,
    )


def rows(batch) -> list[dict]:
    """One dict per row with decoded names and parsed args (test-only convenience)."""
    names = batch.values("name")
    args = batch.values("args", empty="")
    out = []
    for i in range(len(batch)):
        row = {f: batch[f][i].item() for f in batch.fields if f not in ("name", "args")}
        row["name"] = names[i]
        row["args"] = json.loads("{" + args[i] + "}")
        out.append(row)
    return out


def test_record_class_families_are_present():
    # The decoder is only meaningful if this binding ships the record families it reads.
    for family in (KERNEL_CLASSES, MEMCPY_CLASSES, MEMSET_CLASSES, SYNC_CLASSES, OVERHEAD_CLASSES):
        assert family, "cupti-python lacks a record family polyprof-cuda decodes"


@pytest.mark.parametrize("cls_name", KERNEL_CLASSES)
def test_kernel_record_fields(cls_name):
    decoder = make_decoder(offset_ns=1_000_000, sm_count=lambda d: 64, warp_size=lambda d: 32)
    batch, stats = decoder.decode([kernel(cls_name, device_id=1, stream_id=13, correlation_id=77)])
    (row,) = rows(batch)
    assert row["kind"] == EventKind.KERNEL
    assert row["name"] == "void gemm_kernel<float>(int)"
    assert row["start_ns"] == 2_000 + 1_000_000 and row["dur_ns"] == 3_000
    assert (row["pid"], row["tid"], row["device_index"], row["stream"]) == (1, 13, 1, 13)
    assert row["device_type"] == DeviceType.CUDA
    assert row["correlation_id"] == 77
    assert row["args"] == {
        "queued": 0,
        "context": 1,
        "registers per thread": 32,
        "shared memory": 1024 + 4096,
        "blocks per SM": 2.0,
        "warps per SM": 16.0,
        "grid": [128, 1, 1],
        "block": [256, 1, 1],
    }
    assert (stats.records, stats.rows, stats.accounted) == (1, 1, 1)


@pytest.mark.parametrize("cls_name", KERNEL_CLASSES)
def test_kernel_queued_timestamp_like_kineto(cls_name):
    """Kineto writes the kernel's queued timestamp, 0 when CUPTI did not collect it."""
    decoder = make_decoder(offset_ns=1_000_000)
    batch, _ = decoder.decode(
        [
            kernel(cls_name, queued=1_500, correlation_id=1),
            kernel(cls_name, correlation_id=2),
            kernel(cls_name, queued=0),
        ]
    )
    queued = [r["args"]["queued"] for r in rows(batch)]
    # A known value is on polyprof's clock, like start_ns; unknown stays 0 (not 0 + offset).
    assert queued == [1_500 + 1_000_000, 0, 0]


def test_kernel_args_without_device_facts_leave_out_occupancy_keys():
    batch, _ = make_decoder().decode([kernel()])
    (row,) = rows(batch)
    assert "blocks per SM" not in row["args"] and row["args"]["grid"] == [128, 1, 1]


def test_kernel_names_are_demangled_like_kineto():
    pytest.importorskip("torch")
    mangled = "_Z10add_kernelPfS_i"
    batch, _ = make_decoder().decode([kernel(name=mangled)])
    assert batch.values("name") == ["add_kernel(float*, float*, int)"]


@pytest.mark.parametrize("cls_name", MEMCPY_CLASSES)
def test_memcpy_record_fields(cls_name):
    batch, stats = make_decoder().decode([memcpy(cls_name)])
    (row,) = rows(batch)
    assert row["kind"] == EventKind.GPU_MEMCPY
    assert row["name"] == "Memcpy HtoD (Pageable -> Device)"
    assert (row["start_ns"], row["dur_ns"], row["nbytes"]) == (600, 300, 4096)
    assert (row["pid"], row["tid"], row["correlation_id"]) == (0, 7, 6)
    assert row["args"]["bytes"] == 4096 and row["args"]["context"] == 1
    assert row["args"]["memory bandwidth (GB/s)"] == pytest.approx(4096 / 300, rel=1e-5)
    assert "fromDevice" not in row["args"]
    assert stats.rows == 1


@pytest.mark.parametrize("cls_name", MEMCPY_PTOP_CLASSES)
def test_peer_to_peer_memcpy_names_both_devices(cls_name):
    rec = record(
        cls_name, K.MEMCPY2, start=10, end=20, device_id=0, context_id=1, stream_id=3, correlation_id=4,
        bytes=8, copy_kind=int(C.ActivityMemcpyKind.PTOP), src_kind=3, dst_kind=3, src_device_id=0,
        dst_device_id=1,
    )  # fmt: skip
    (row,) = rows(make_decoder().decode([rec])[0])
    assert row["name"] == "Memcpy PtoP (Device -> Device)"
    assert (row["args"]["fromDevice"], row["args"]["toDevice"]) == (0, 1)


@pytest.mark.parametrize("cls_name", MEMSET_CLASSES)
def test_memset_record_fields(cls_name):
    (row,) = rows(make_decoder().decode([memset(cls_name, value=255)])[0])
    assert row["kind"] == EventKind.GPU_MEMSET
    assert row["name"] == "Memset (Device)"
    assert (row["start_ns"], row["dur_ns"], row["nbytes"], row["correlation_id"]) == (1_000, 200, 2048, 8)
    assert row["args"]["value"] == 255 and row["args"]["bytes"] == 2048


def test_runtime_and_driver_calls_carry_host_lane_and_cbid():
    tid = threading.get_native_id()
    decoder = make_decoder()
    batch, stats = decoder.decode(
        [
            api_call(cbid=RUNTIME_LAUNCH, correlation_id=5, thread_id=tid),
            api_call(kind=K.DRIVER, cbid=DRIVER_LAUNCH, correlation_id=6, thread_id=tid),
        ]
    )
    runtime, driver = rows(batch)
    assert (runtime["kind"], runtime["name"]) == (EventKind.RUNTIME, "cudaLaunchKernel")
    assert (driver["kind"], driver["name"]) == (EventKind.DRIVER, "cuLaunchKernel")
    for row, corr in ((runtime, 5), (driver, 6)):
        assert (row["pid"], row["tid"], row["correlation_id"]) == (os.getpid(), tid, corr)
        assert row["device_type"] == DeviceType.CUDA
        assert row.get("linked_correlation_id", 0) == 0
    assert runtime["args"] == {"cbid": RUNTIME_LAUNCH}
    assert stats.rows == 2


def test_kineto_noise_filter_drops_blocklisted_runtime_and_unlisted_driver_calls():
    batch, stats = make_decoder().decode(
        [
            api_call(cbid=RUNTIME_GET_LAST_ERROR),
            api_call(cbid=RUNTIME_MEMCPY_ASYNC),
            api_call(kind=K.DRIVER, cbid=DRIVER_CTX_GET_DEVICE),
            api_call(kind=K.DRIVER, cbid=DRIVER_LAUNCH),
        ]
    )
    assert batch.values("name") == ["cudaMemcpyAsync", "cuLaunchKernel"]
    assert (stats.rows, stats.filtered_api_calls, stats.accounted) == (2, 2, 4)


def test_without_runtime_records_driver_copies_stand_in():
    memcpy_cbid = int(C.driver_api_trace_cbid.cuMemcpyHtoDAsync_v2)
    rec = api_call(kind=K.DRIVER, cbid=memcpy_cbid)
    assert make_decoder(runtime_recorded=True).decode([rec])[1].filtered_api_calls == 1
    batch, stats = make_decoder(runtime_recorded=False).decode([rec])
    assert batch.values("name") == ["cuMemcpyHtoDAsync_v2"] and stats.filtered_api_calls == 0


def test_pthread_ids_are_mapped_to_os_thread_ids_when_cupti_records_them():
    decoder = make_decoder(thread_map={0xABC: 4242})
    batch, _ = decoder.decode([api_call(thread_id=0xABC), api_call(thread_id=99, correlation_id=3)])
    assert batch["tid"].tolist() == [4242, 99]


@pytest.mark.parametrize("cls_name", SYNC_CLASSES)
def test_sync_record_lands_on_the_device_of_its_context(cls_name):
    decoder = make_decoder()
    decoder.decode([kernel(device_id=3, context_id=9)])  # an earlier buffer teaches context 9 -> device 3
    batch, _ = decoder.decode(
        [
            sync(cls_name, context_id=9, stream_id=5, correlation_id=21),
            sync(
                cls_name,
                context_id=9,
                stream_id=0xFFFFFFFF,
                type=int(C.ActivitySynchronizationType.CONTEXT_SYNCHRONIZE),
            ),
        ]
    )
    stream_sync, ctx_sync = rows(batch)
    assert (stream_sync["kind"], stream_sync["name"]) == (EventKind.SYNC, "Stream Sync")
    assert (stream_sync["pid"], stream_sync["tid"], stream_sync["correlation_id"]) == (3, 5, 21)
    assert stream_sync["args"] == {"cuda_sync_kind": "Stream Sync", "context": 9}
    assert (ctx_sync["name"], ctx_sync["stream"]) == ("Context Sync", -1)


@pytest.mark.parametrize("cls_name", OVERHEAD_CLASSES)
def test_overhead_record(cls_name):
    (row,) = rows(make_decoder().decode([overhead(cls_name, correlation_id=11)])[0])
    assert (row["kind"], row["name"], row["dur_ns"]) == (EventKind.OVERHEAD, "Activity Buffer Request", 300)
    # CUPTI's own cost is host time, as Kineto's overhead rows are CPU events (never an op's Self CUDA).
    assert (row["device_type"], row["pid"], row["correlation_id"]) == (DeviceType.CPU, -1, 11)


def test_untimed_and_unknown_records_are_counted_not_emitted():
    ext = record("ActivityExternalCorrelation", K.EXTERNAL_CORRELATION, correlation_id=1, external_id=2)
    batch, stats = make_decoder().decode(
        [kernel(start=0, end=0), kernel(start=10, end=0), kernel(start=10, end=20), ext]
    )
    assert len(batch) == 1 and stats.untimed == 2
    assert stats.ignored == {"EXTERNAL_CORRELATION": 1}
    assert stats.accounted == stats.records == 4


def test_mixed_buffer_of_every_kind_decodes_in_one_batch():
    records = [kernel(), memcpy(), memset(), api_call(), sync(), overhead()]
    batch, stats = make_decoder().decode(records)
    kinds = sorted(EventKind(k).name for k in batch["kind"].tolist())
    assert kinds == ["GPU_MEMCPY", "GPU_MEMSET", "KERNEL", "OVERHEAD", "RUNTIME", "SYNC"]
    assert stats.rows == len(batch) == 6


def test_records_read_back_from_numpy_layouts_decode_the_same():
    # from_data views a numpy record laid out with cupti-python's own dtype (what CUPTI buffers hold).
    name = KERNEL_CLASSES[-1]
    dtype = getattr(C, "activity_" + name[len("Activity") :].lower() + "_dtype")
    arr = np.zeros(1, dtype=dtype)
    for field, value in {
        "kind": int(K.CONCURRENT_KERNEL),
        "start": 5,
        "end": 9,
        "correlation_id": 3,
        "stream_id": 2,
    }.items():
        arr[0][field] = value
    rec = getattr(C, name).from_data(arr)
    (row,) = rows(make_decoder().decode([rec])[0])
    assert (row["start_ns"], row["dur_ns"], row["correlation_id"], row["stream"]) == (5, 4, 3, 2)


def test_duck_typed_records_missing_fields_read_defaults():
    class Minimal:  # e.g. an older record without the cluster / shared-memory fields
        kind = int(K.CONCURRENT_KERNEL)
        start, end, correlation_id, name = 100, 150, 4, "k"

    (row,) = rows(make_decoder().decode([Minimal()])[0])
    assert (row["name"], row["dur_ns"], row["args"]["grid"]) == ("k", 50, [0, 0, 0])
