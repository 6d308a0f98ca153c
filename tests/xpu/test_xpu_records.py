"""Record decoding: buffers laid out by gcc from PTI's C structs, walked by ptiViewGetNextRecord, decoded.

In this process the fake's walker (PTI 1.2.0 strides) is used; the test that
runs in a child process with the library path set walks with the REAL
ptiViewGetNextRecord of the intel-pti wheel and must give the same columns.
"""

from __future__ import annotations

import ctypes
import json
import os

import pytest
from conftest import UUID0, UUID1, FakePti, real_pti_lib_dir, real_pti_library, run_python
from polyprof.events import DeviceType, EventKind
from polyprof_xpu import records as R
from polyprof_xpu.decode import L0_QUEUE_STREAM_BASE, Clock, Decoder, DeviceTable

PID = 4242
DEVICES = [
    {"index": 0, "uuid": UUID0.hex(), "name": "gpu0"},
    {"index": 1, "uuid": UUID1.hex(), "name": "gpu1"},
]
T0 = 1_700_000_000_000_000_000


def queue_one_of_each(fake: FakePti) -> None:
    """One record of every kind the plugin reads, plus one it does not (external correlation)."""
    fake.fakePtiAddKernel(T0 + 100, T0 + 400, 11, 77, UUID0, 5, 0xA0, fake.name("gemm"), 1)
    fake.fakePtiAddKernel(
        T0 + 500, T0 + 900, 12, 77, UUID1, R.INVALID_SYCL_QUEUE_ID, 0xB0, fake.name("relu"), 2
    )
    fake.fakePtiAddMemcpy(T0 + 1000, T0 + 1200, 13, 77, UUID0, 5, 0xA0, 6, 1, 2, 4096)  # H2D
    fake.fakePtiAddMemcpyP2P(T0 + 1300, T0 + 1500, 14, 77, UUID1, UUID0, 9, 0xC0, 8192)
    fake.fakePtiAddMemfill(T0 + 1600, T0 + 1700, 15, 77, UUID1, 9, 0xC0, 2, 512, 0)
    fake.fakePtiAddApi(6, T0 + 50, T0 + 90, 3, 0, PID, 77, 11)  # urEnqueueKernelLaunch
    fake.fakePtiAddApi(3, T0 + 60, T0 + 80, 1, 1, 0, 77, 11)  # zeCommandListAppendLaunchKernel, pid 0
    fake.fakePtiAddSync(T0 + 2000, T0 + 2500, 4, 77, 16, 0, 4, 0)  # host event wait
    fake.fakePtiAddSync(T0 + 2600, T0 + 2700, 1, 77, 17, 0xC0, 5, 2)  # GPU barrier on queue 0xC0
    fake.fakePtiAddOverhead(T0 + 3000, T0 + 3100, 77, 3, 2, 80)
    fake.fakePtiAddExternalCorrelation(11, 999, 2)


def build_buffer(fake: FakePti) -> tuple[ctypes.Array, int]:
    fake.fakePtiEnableAllForBuilding()
    fake.fakePtiReset()
    queue_one_of_each(fake)
    buf = (ctypes.c_uint8 * 65536)()
    used = fake.fakePtiBuildBuffer(buf, len(buf))
    return buf, used


def api_name(group: int, api_id: int) -> str:
    return {
        (3, 0): "urEnqueueKernelLaunch",
        (1, 1): "zeCommandListAppendLaunchKernel",
        (1, 4): "zeEventHostSynchronize",
        (1, 5): "zeCommandListAppendBarrier",
    }.get((group, api_id), f"<api group {group} id {api_id}>")


def decode(next_record, buf: ctypes.Array, used: int, offset_ns: int = 0) -> tuple[dict, Decoder]:
    decoder = Decoder(api_name, DeviceTable(DEVICES), Clock(offset_ns), pid=PID)
    batch = decoder.decode_buffer(next_record, ctypes.addressof(buf), used)
    names = batch.values("name")
    rows = {}
    for i, name in enumerate(names):
        rows[name] = {
            f: int(batch[f][i])
            for f in (
                "kind",
                "start_ns",
                "dur_ns",
                "pid",
                "tid",
                "stream",
                "device_type",
                "device_index",
                "correlation_id",
                "nbytes",
            )
        }
        rows[name]["args"] = batch.values("args")[i]
    return rows, decoder


def expected_rows() -> dict:
    l0 = L0_QUEUE_STREAM_BASE
    xpu = int(DeviceType.XPU)
    return {
        "gemm": {
            "kind": EventKind.KERNEL,
            "start_ns": T0 + 100,
            "dur_ns": 300,
            "pid": 0,
            "tid": 5,
            "stream": 5,
            "device_index": 0,
            "correlation_id": 11,
            "nbytes": 0,
        },
        "relu": {
            "kind": EventKind.KERNEL,
            "start_ns": T0 + 500,
            "dur_ns": 400,
            "pid": 1,
            "tid": l0,
            "stream": l0,
            "device_index": 1,
            "correlation_id": 12,
            "nbytes": 0,
        },
        "Memcpy H2D (Host (Driver Allocated) -> Device)": {
            "kind": EventKind.GPU_MEMCPY,
            "start_ns": T0 + 1000,
            "dur_ns": 200,
            "pid": 0,
            "tid": 5,
            "stream": 5,
            "device_index": 0,
            "correlation_id": 13,
            "nbytes": 4096,
        },
        "Memcpy D2D (Device -> Device)": {
            "kind": EventKind.GPU_MEMCPY,
            "start_ns": T0 + 1300,
            "dur_ns": 200,
            "pid": 1,
            "tid": 9,
            "stream": 9,
            "device_index": 1,
            "correlation_id": 14,
            "nbytes": 8192,
        },
        "Memset (Device)": {
            "kind": EventKind.GPU_MEMSET,
            "start_ns": T0 + 1600,
            "dur_ns": 100,
            "pid": 1,
            "tid": 9,
            "stream": 9,
            "device_index": 1,
            "correlation_id": 15,
            "nbytes": 512,
        },
        "urEnqueueKernelLaunch": {
            "kind": EventKind.RUNTIME,
            "start_ns": T0 + 50,
            "dur_ns": 40,
            "pid": PID,
            "tid": 77,
            "stream": -1,
            "device_index": 0,
            "correlation_id": 11,
            "nbytes": 0,
        },
        "zeCommandListAppendLaunchKernel": {
            "kind": EventKind.DRIVER,
            "start_ns": T0 + 60,
            "dur_ns": 20,
            "pid": PID,
            "tid": 77,
            "stream": -1,
            "device_index": 0,
            "correlation_id": 11,
            "nbytes": 0,
        },
        "zeEventHostSynchronize": {
            "kind": EventKind.SYNC,
            "start_ns": T0 + 2000,
            "dur_ns": 500,
            "pid": PID,
            "tid": 77,
            "stream": -1,
            "device_index": -1,
            "correlation_id": 0,
            "nbytes": 0,
        },
        "zeCommandListAppendBarrier": {
            "kind": EventKind.SYNC,
            "start_ns": T0 + 2600,
            "dur_ns": 100,
            "pid": 1,
            "tid": 9,
            "stream": 9,
            "device_index": 1,
            "correlation_id": 17,
            "nbytes": 0,
        },
        "Buffer Flush": {
            "kind": EventKind.OVERHEAD,
            "start_ns": T0 + 3000,
            "dur_ns": 100,
            "pid": PID,
            "tid": 77,
            "stream": -1,
            "device_index": 0,
            "correlation_id": 0,
            "nbytes": 0,
        },
    } | {"_xpu": xpu}


def check_rows(rows: dict) -> None:
    expected = expected_rows()
    xpu = expected.pop("_xpu")
    assert set(rows) == set(expected)
    for name, want in expected.items():
        got = {k: rows[name][k] for k in want}
        assert got == {k: int(v) for k, v in want.items()}, name
        assert rows[name]["device_type"] == xpu
    assert '"bytes": 4096' in rows["Memcpy H2D (Host (Driver Allocated) -> Device)"]["args"]
    assert '"l0 call": "zeCommandListAppendMemoryCopy"' in rows["Memcpy D2D (Device -> Device)"]["args"]
    assert '"kernel_id": 1' in rows["gemm"]["args"] and '"sycl queue": 5' in rows["gemm"]["args"]
    assert '"sync type": "Host Event"' in rows["zeEventHostSynchronize"]["args"]
    assert '"overhead count": 2, "overhead duration ns": 80' == rows["Buffer Flush"]["args"]
    json.loads("{" + rows["gemm"]["args"] + "}")


def test_struct_sizes_are_pti_1_2_0_strides_and_layouts_are_v1_prefixes(fake_pti) -> None:
    strides = {1: 184, 3: 48, 5: 56, 6: 48, 7: 24, 8: 152, 9: 152, 10: 192, 11: 72}
    for kind, stride in strides.items():
        assert fake_pti.lib.fakePtiRecordSize(kind) == stride, kind
        assert R.DTYPES[R.ViewKind(kind)].itemsize <= stride


def test_every_kind_decoded(fake_pti) -> None:
    buf, used = build_buffer(fake_pti)
    assert used == 2 * 184 + 152 + 192 + 152 + 48 + 48 + 2 * 72 + 56 + 24
    rows, decoder = decode(fake_pti.lib.ptiViewGetNextRecord, buf, used)
    check_rows(rows)
    assert sum(decoder.records_walked.values()) == 11
    assert decoder.records_walked[R.ViewKind.EXTERNAL_CORRELATION] == 1
    assert sum(decoder.rows_emitted.values()) == 10
    assert decoder.walk_problems == []
    assert fake_pti.counter("own_walks") > 0


def test_clock_offset_is_applied(fake_pti) -> None:
    buf, used = build_buffer(fake_pti)
    rows, _ = decode(fake_pti.lib.ptiViewGetNextRecord, buf, used, offset_ns=-1000)
    assert rows["gemm"]["start_ns"] == T0 + 100 - 1000


def test_unknown_device_gets_next_ordinal(fake_pti) -> None:
    fake_pti.fakePtiEnableAllForBuilding()
    fake_pti.fakePtiReset()
    fake_pti.fakePtiAddKernel(T0, T0 + 10, 1, 1, bytes([0xAB] * 16), 3, 0xA, fake_pti.name("k"), 1)
    buf = (ctypes.c_uint8 * 4096)()
    used = fake_pti.fakePtiBuildBuffer(buf, 4096)
    table = DeviceTable(DEVICES)
    batch = Decoder(api_name, table, Clock(), pid=PID).decode_buffer(
        fake_pti.lib.ptiViewGetNextRecord, ctypes.addressof(buf), used
    )
    assert int(batch["device_index"][0]) == 2
    assert table.unknown == ["ab" * 16]


def test_truncated_buffer_is_reported(fake_pti) -> None:
    buf, used = build_buffer(fake_pti)
    _, decoder = decode(fake_pti.lib.ptiViewGetNextRecord, buf, used - 10)
    # The fake's walker (like PTI's) stops past the end; nothing past valid bytes is read.
    assert sum(decoder.records_walked.values()) <= 11


REAL_WALK = r"""
import ctypes, json, sys
sys.path.insert(0, {tests!r})
from conftest import FakePti
import test_xpu_records as T
fake = FakePti({fake!r})
real = ctypes.CDLL({real!r})
real.ptiViewGetNextRecord.restype = ctypes.c_uint32
real.ptiViewGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
buf, used = T.build_buffer(fake)
rows, decoder = T.decode(real.ptiViewGetNextRecord, buf, used)
T.check_rows(rows)
print(json.dumps({{"walked": sum(decoder.records_walked.values()), "problems": decoder.walk_problems}}))
"""


@pytest.mark.skipif(real_pti_library() is None, reason="intel-pti is not installed")
def test_every_kind_decoded_with_the_real_ptiViewGetNextRecord(fake_libs) -> None:
    """The intel-pti wheel's own walker (its backend loads against the fake loader) over gcc-built records."""
    code = REAL_WALK.format(tests=os.path.dirname(__file__), fake=fake_libs.pti, real=real_pti_library())
    proc = run_python(code, {"LD_LIBRARY_PATH": f"{fake_libs.ze_dir}:{real_pti_lib_dir()}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"walked": 11, "problems": []}
