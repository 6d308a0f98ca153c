"""The ``ac2g`` flow arrows of a CUDA trace, as Kineto draws them in torch's own trace.

Kineto gives every CUPTI activity a flow whose id is its correlation id
(``CuptiActivity::flowId``), and its writer draws a flow event for every
activity with one (``ChromeTraceLogger::handleActivity``): a start ("s") on the
runtime and driver calls whose ``flowStart()`` is true (kernel and graph
launches, copies and fills, the synchronizations and the event wait:
``RuntimeActivity::flowStart``, ``DriverActivity::flowStart``), an end ("f")
on everything else: the kernels, copies, fills and sync records, and every
other runtime call, whose end no arrow reaches (``cudaStreamIsCapturing``,
``cudaMalloc``, ...). CUPTI's overhead rows and the GPU mirrors of
``record_function`` ranges have none. So a trace has more flow events than
twice its launches.

torch 2.13+ hands each row's flow to polyprof (``_KinetoEvent.flow_id``,
``flow_type``, ``flow_start``); before, polyprof-cuda gives the same by those
rules (``polyprof_cuda.kineto.kineto_flow``). Checked on stand-ins shaped as
Kineto fills them, and on the real A100 traces torch.profiler wrote
(tests/data/kineto_gpu): the rows of each trace, read back as torch's
collector gives them (with their flows on 2.15, without on 2.11 and 2.12),
must export to exactly that trace's flow events.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import DeviceType, EventKind
from polyprof.base.kineto_format import FLOW_AC2G
from polyprof.runtime.chrome_trace import ChromeTraceExporter
from polyprof.runtime.torch_result import CollectorResult
from polyprof.testing import KinetoEventStandIn, KinetoEventStandIn211, RawResultStandIn, make_trace
from polyprof_cuda import kineto

PID = 4242
OS_TID = 777
BASE = 1_700_000_000 * 10**9
DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "kineto_gpu"

#: (name, activity type, on device, start µs, end µs, correlation id, stream or OS thread, the flow
#: event Kineto writes at the row: "s", "f" or None). A step that checks whether it is being
#: captured, launches a GEMM, fills and copies, logs its loss with ``.item()`` (a copy back and a
#: stream sync, recorded with ``enable_cuda_sync_events``), launches a Triton kernel through the
#: driver, and runs inside a ``record_function`` range that Kineto mirrors on the stream.
ROWS = [
    ("cudaStreamIsCapturing", "cuda_runtime", 0, 1, 2, 11, OS_TID, "f"),
    ("cudaLaunchKernel", "cuda_runtime", 0, 3, 5, 12, OS_TID, "s"),
    ("ampere_sgemm_64x64_nn", "kernel", 1, 10, 40, 12, 7, "f"),
    ("cudaMemsetAsync", "cuda_runtime", 0, 6, 7, 13, OS_TID, "s"),
    ("Memset (Device)", "gpu_memset", 1, 41, 42, 13, 7, "f"),
    ("cudaMemcpyAsync", "cuda_runtime", 0, 8, 9, 14, OS_TID, "s"),
    ("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 1, 43, 45, 14, 7, "f"),
    ("cudaStreamSynchronize", "cuda_runtime", 0, 9, 46, 15, OS_TID, "s"),
    ("Stream Sync", "cuda_sync", 1, 11, 45, 15, 7, "f"),
    ("cuLaunchKernel", "cuda_driver", 0, 47, 48, 16, OS_TID, "s"),
    ("triton_poi_fused_add_0", "kernel", 1, 49, 50, 16, 7, "f"),
    ("cudaEventRecord", "cuda_runtime", 0, 48, 49, 17, OS_TID, "f"),
    ("Activity Buffer Request", "overhead", 0, 51, 52, 0, 0, None),
    ("loss step", "gpu_user_annotation", 1, 10, 50, 5, 7, None),
]


def _flow(row: tuple) -> tuple[int, int, bool]:
    ph, correlation = row[7], row[5]
    return (0, 0, False) if ph is None else (correlation, FLOW_AC2G, ph == "s")


class KinetoEvent(KinetoEventStandIn):
    """torch 2.15's ``_KinetoEvent`` of a ``ROWS`` row, with the flow Kineto gave it."""

    def __init__(self, row: tuple, flow: bool = True) -> None:
        name, activity_type, on_device, start, end, corr, resource, _ = row
        super().__init__(
            name,
            activity_type,
            DeviceType.CUDA if on_device else DeviceType.CPU,
            0 if on_device else PID,
            BASE + start * 1000,
            BASE + end * 1000,
            corr,
            0,
            resource,
            flow=_flow(row) if flow else (0, 0, False),
        )


class KinetoEvent212(KinetoEvent):
    """torch 2.12's: activity types, no ``flow_*`` accessors (2.13)."""

    def __getattribute__(self, name: str) -> Any:
        if name in ("flow_id", "flow_type", "flow_start"):
            raise AttributeError(name)
        return super().__getattribute__(name)


class KinetoEvent211(KinetoEventStandIn211, KinetoEvent):
    """torch 2.11's: no activity types, no flows."""


STAND_INS = {"2.15": KinetoEvent, "2.12": KinetoEvent212, "2.11": KinetoEvent211}


def _decoded(events: list[Any]) -> Any:
    return kineto.decode_cuda_rows(CollectorResult(RawResultStandIn(events, trace_start_ns=BASE)), pid=PID)


def _flows_of_batch(batch: Any) -> dict[str, tuple[int, int, bool]]:
    return {
        name: (fid, ftype, start)
        for name, fid, ftype, start in zip(
            batch.values("name"),
            batch["flow_id"].tolist(),
            batch["flow_type"].tolist(),
            batch["flow_start"].tolist(),
            strict=True,
        )
    }


def _cuda_trace(batch: Any, *, pid: int = PID, start_ns: int = BASE) -> Any:
    config = ProfileConfig(
        activities={ProfilerActivity.CPU, ProfilerActivity.CUDA}, torch_activities={"CUDA"}
    )
    return make_trace(batch, config=config, start_ns=start_ns, pid=pid)


def flow_events(path: Path) -> list[tuple[str, int, Any, Any, int]]:
    """Every ``ac2g`` flow event of a Chrome trace as (ph, id, pid, tid, absolute ns), sorted.

    Times are read exactly (as decimals), whether the file writes absolute microseconds (Kineto
    before ``baseTimeNanoseconds``) or microseconds after ``baseTimeNanoseconds``.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        doc = json.loads(f.read(), parse_float=Decimal)
    base = int(doc.get("baseTimeNanoseconds", 0))
    return sorted(
        (e["ph"], int(e["id"]), e["pid"], e["tid"], base + int(Decimal(e["ts"]) * 1000))
        for e in doc["traceEvents"]
        if e.get("ph") in ("s", "f") and e.get("cat") == "ac2g"
    )


# ------------------------------------------------------------------ stand-ins


def test_each_row_keeps_the_flow_kineto_gave_it() -> None:
    batch = _decoded([KinetoEvent(row) for row in ROWS])
    assert _flows_of_batch(batch) == {row[0]: _flow(row) for row in ROWS}


@pytest.mark.parametrize("torch_version", ["2.12", "2.11"])
def test_before_2_13_the_flows_follow_kinetos_rules(torch_version: str) -> None:
    batch = _decoded([STAND_INS[torch_version](row) for row in ROWS])
    expected = {row[0]: _flow(row) for row in ROWS}
    # before 2.12 a sync row is decoded as device work (EventKind.KERNEL); its flow is the same
    assert _flows_of_batch(batch) == expected


def test_a_torch_whose_device_rows_carry_no_flow_gets_kinetos_rule() -> None:
    """Kineto gives every activity with a correlation id a flow; a torch whose accessors give none
    for any device row does not hand them over, and its writer still draws them."""
    batch = _decoded([KinetoEvent(row, flow=False) for row in ROWS])
    assert _flows_of_batch(batch) == {row[0]: _flow(row) for row in ROWS}


@pytest.mark.parametrize("torch_version", sorted(STAND_INS))
def test_the_trace_draws_every_flow_event_kineto_draws(torch_version: str, tmp_path: Path) -> None:
    """Not only the launch -> kernel pairs: the starts on the copy and sync calls, the sync record's
    end, and the ends of ``cudaStreamIsCapturing`` and ``cudaEventRecord`` that no arrow reaches."""
    batch = _decoded([STAND_INS[torch_version](row) for row in ROWS])
    path = tmp_path / "trace.json"
    ChromeTraceExporter().export(_cuda_trace(batch), str(path))
    expected = sorted(
        (row[7], row[5], 0 if row[2] else PID, row[6], BASE + row[3] * 1000)
        for row in ROWS
        if row[7] is not None
    )
    assert flow_events(path) == expected
    starts = {fid for ph, fid, *_ in expected if ph == "s"}
    ends = {fid for ph, fid, *_ in expected if ph == "f"}
    assert len(expected) == 12 and len(starts) == 5 and starts <= ends  # every arrow lands somewhere


def test_rows_without_torchs_flows_or_a_rule_are_paired_by_the_writer(tmp_path: Path) -> None:
    """A device tracer without a flow rule (before 2.13): the Chrome writer pairs each launch with its
    device work itself, as before."""
    events = [KinetoEvent211(row) for row in ROWS]
    result = CollectorResult(RawResultStandIn(events, trace_start_ns=BASE))
    batch = kineto.decode_device_rows(
        result,
        source="cuda_test",
        device_type=DeviceType.CUDA,
        kind_by_activity_type=kineto.KIND_BY_ACTIVITY_TYPE,
        pid=PID,
        host_row_kind=kineto.host_row_kind,
    )
    assert not batch.has("flow_id")
    path = tmp_path / "trace.json"
    ChromeTraceExporter().export(_cuda_trace(batch), str(path))
    arrows = {fid for ph, fid, *_ in flow_events(path) if ph == "s"}
    assert arrows == {12, 13, 14, 15, 16}  # each launch, copy, fill and sync call with device work


def test_kinetos_flow_rule_by_kind_and_name() -> None:
    assert kineto.kineto_flow(EventKind.RUNTIME, "cudaLaunchKernel") is True
    assert kineto.kineto_flow(EventKind.RUNTIME, "cudaMemcpy2DFromArrayAsync") is True  # cbid 46
    assert kineto.kineto_flow(EventKind.RUNTIME, "cudaGraphLaunch") is True
    assert kineto.kineto_flow(EventKind.RUNTIME, "cudaMemcpy3DAsync") is False  # cbid 145: not in 31-52
    assert kineto.kineto_flow(EventKind.RUNTIME, "cudaStreamGetCaptureInfo_v2") is False
    assert kineto.kineto_flow(EventKind.DRIVER, "cuLaunchKernelEx") is True
    assert kineto.kineto_flow(EventKind.DRIVER, "cuMemCreate") is False
    for kind in (EventKind.KERNEL, EventKind.GPU_MEMCPY, EventKind.GPU_MEMSET, EventKind.SYNC):
        assert kineto.kineto_flow(kind, "anything") is False
    for kind in (EventKind.OVERHEAD, EventKind.GPU_USER_ANNOTATION):
        assert kineto.kineto_flow(kind, "anything") is None


def test_a_row_torch_hides_is_left_out_as_torchs_parse_leaves_it_out() -> None:
    class Hidden(KinetoEvent):
        def is_hidden_event(self) -> bool:
            return self.name() == "cudaEventRecord"

    batch = _decoded([Hidden(row) for row in ROWS])
    assert "cudaEventRecord" not in batch.values("name")
    assert len(batch) == len(ROWS) - 1


# ------------------------------------------------------------------ real Kineto traces

_CUDA_CATEGORIES = (
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_sync",
    "overhead",
)
_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")


def _rows_of_real_trace(path: Path, event_type: type) -> tuple[list[Any], int]:
    """The CUDA rows of a trace torch.profiler wrote, as torch's collector gave them to it, and the
    host pid: name, activity type, device or OS thread, times and correlation id, and (on 2.15)
    the flow the trace drew at the row."""
    with gzip.open(path, "rb") as f:
        doc = json.loads(f.read(), parse_float=Decimal)
    events = doc["traceEvents"]
    base = int(doc.get("baseTimeNanoseconds", 0))
    flows = {
        (e["pid"], e["tid"], base + int(Decimal(e["ts"]) * 1000), int(e["id"])): e["ph"] == "s"
        for e in events
        if e.get("ph") in ("s", "f") and e.get("cat") == "ac2g"
    }
    host_pid = next(e["pid"] for e in events if e.get("cat") == "cpu_op")
    rows = []
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in _CUDA_CATEGORIES:
            continue
        args = e.get("args") or {}
        start = base + int(Decimal(e["ts"]) * 1000)
        corr = int(args.get("correlation", 0))
        on_device = cat in _DEVICE_CATEGORIES
        key = (e["pid"], e["tid"], start, corr)
        flow = (corr, FLOW_AC2G, flows[key]) if key in flows else (0, 0, False)
        rows.append(
            event_type(
                str(e["name"]),
                cat,
                DeviceType.CUDA if on_device else DeviceType.CPU,
                int(e["pid"]) if on_device else host_pid,
                start,
                start + int(Decimal(e["dur"]) * 1000),
                corr,
                0,
                int(e["tid"]),
                flow=flow,
            )
        )
    return rows, host_pid


class _Real211(KinetoEventStandIn211):
    pass


@pytest.mark.parametrize("torch_version", ["2.15", "2.11"])
@pytest.mark.parametrize("path", sorted(DATA.glob("*.json.gz")), ids=lambda p: p.name)
def test_a_real_kineto_traces_flow_events_come_out_as_torch_wrote_them(
    path: Path, torch_version: str, tmp_path: Path
) -> None:
    event_type = KinetoEventStandIn if torch_version == "2.15" else _Real211
    rows, host_pid = _rows_of_real_trace(path, event_type)
    batch = kineto.decode_cuda_rows(CollectorResult(RawResultStandIn(rows)), pid=host_pid)
    assert len(batch) == len(rows)
    out = tmp_path / "polyprof.json"
    ChromeTraceExporter().export(
        _cuda_trace(batch, pid=host_pid, start_ns=int(batch["start_ns"].min())), str(out)
    )
    theirs = flow_events(path)
    ours = flow_events(out)
    assert len(ours) == len(theirs)
    assert ours == theirs
    assert np.count_nonzero(batch["flow_id"]) == len(theirs)
