"""torch's device-time semantics for rows that device tracers and saved traces add.

Three defects of issue 10 (reference/gpu_coexistence.md M1, M2):

* a synchronization row is the host waiting, not device work: it is never
  an op's kernel and has no device time (torch's default collector records
  none; Kineto's ``cuda_sync`` rows are linked to the op that waited);
* an overhead row is the tracer's own host-side cost: a CPU event, as in
  Kineto, never linked to an op, never device time;
* an unlinked runtime/driver/overhead row's ``correlation_id`` is CUPTI's or
  PTI's counter, which meets torch's op ids by accident: it never takes the
  device time of the op with the same number.

Rows here are shaped as polyprof-cuda's decoder and the Chrome reader give
them (no Kineto ``activity_type``: that marks rows copied from torch's
collector, which follow the installed release's rules; tests/test_tree.py
checks those against torch itself). Every check runs under the rules of each
supported torch release.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof import cli
from polyprof.analysis.tree import EventTree, PostProcessingRules
from polyprof.base.activity import ProfilerActivity
from polyprof.base.attribution import link_launches
from polyprof.base.config import ProfileConfig
from polyprof.base.events import DeviceType, EventKind, concat
from polyprof.formats.chrome_reader import read_chrome_trace
from polyprof.testing import make_event_batch, make_trace

US = 1_000
BASE_NS = 1_700_000_000 * 10**9
PID = 4242
OS_TID = 777
CUDA_CONFIG = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA})
RELEASES = [PostProcessingRules.for_torch(2, minor) for minor in range(6, 16)]
RELEASE_IDS = [f"torch2.{r.torch_minor[1]}" for r in RELEASES]


def op(name: str, op_id: int, start_us: int, dur_us: int, **extra: Any) -> dict[str, Any]:
    """A torch op as the CPU tracer decodes it from torch's collector."""
    return {"name": name, "kind": EventKind.CPU_OP, "start_ns": BASE_NS + start_us * US,
            "dur_ns": dur_us * US, "pid": PID, "tid": OS_TID, "thread": 1, "correlation_id": op_id,
            **extra}  # fmt: skip


def api_call(
    name: str, cupti_id: int, start_us: int, dur_us: int, kind: EventKind = EventKind.RUNTIME
) -> dict:
    """A runtime/driver call as polyprof-cuda decodes it: OS thread, CUPTI's correlation id."""
    return {"name": name, "kind": kind, "start_ns": BASE_NS + start_us * US, "dur_ns": dur_us * US,
            "pid": PID, "tid": OS_TID, "device_type": int(DeviceType.CUDA),
            "correlation_id": cupti_id}  # fmt: skip


def on_stream(name: str, kind: EventKind, cupti_id: int, start_us: int, dur_us: int) -> dict[str, Any]:
    """A kernel, copy or sync on device 0, stream 7, with the launching call's CUPTI id."""
    return {"name": name, "kind": kind, "start_ns": BASE_NS + start_us * US, "dur_ns": dur_us * US,
            "pid": 0, "tid": 7, "stream": 7, "device_type": int(DeviceType.CUDA),
            "correlation_id": cupti_id}  # fmt: skip


def overhead(cupti_id: int, start_us: int, dur_us: int, device_type: DeviceType = DeviceType.CPU) -> dict:
    """CUPTI's own cost; its correlation id is that of the API call that caused it (cupti_activity.h)."""
    return {"name": "Activity Buffer Request", "kind": EventKind.OVERHEAD,
            "start_ns": BASE_NS + start_us * US, "dur_ns": dur_us * US, "pid": -1,
            "device_type": int(device_type), "correlation_id": cupti_id}  # fmt: skip


def linked_tree(cpu_rows: list[dict], cupti_rows: list[dict], rules: PostProcessingRules) -> EventTree:
    """The session's path: the decoders' batches, linked by containment, then torch's tree."""
    batches = [make_event_batch(cpu_rows, source="torch_cpu"), make_event_batch(cupti_rows, source="cupti")]
    trace = make_trace(concat(link_launches(batches)), config=CUDA_CONFIG)
    return EventTree.from_trace(trace, use_device="cuda", rules=rules)


def row_of(tree: EventTree, key: str) -> int:
    (rows,) = np.nonzero(np.array(tree.keys, dtype=object)[tree.key] == key)
    assert len(rows) == 1, f"{key}: {len(rows)} rows"
    return int(rows[0])


def self_cuda_us(tree: EventTree, key: str) -> float:
    return float(tree.self_device_time_total[row_of(tree, key)])


@pytest.mark.parametrize("rules", RELEASES, ids=RELEASE_IDS)
def test_a_stream_sync_is_not_self_cuda_of_the_op_that_waited(rules: PostProcessingRules) -> None:
    # .item(): aten::_local_scalar_dense calls cudaStreamSynchronize (CUPTI id 41), which waits 800 µs.
    cpu = [op("aten::_local_scalar_dense", 1, 0, 900)]
    cupti = [
        api_call("cudaStreamSynchronize", 41, 10, 850),
        on_stream("Stream Sync", EventKind.SYNC, 41, 20, 800),
    ]
    tree = linked_tree(cpu, cupti, rules)
    sync_row = row_of(tree, "Stream Sync")
    assert tree.column("linked_correlation_id")[sync_row] == 1  # linked, as Kineto links cuda_sync rows
    assert self_cuda_us(tree, "aten::_local_scalar_dense") == 0.0
    assert tree.device_time_total[row_of(tree, "aten::_local_scalar_dense")] == 0.0
    assert tree.kernels_of(row_of(tree, "aten::_local_scalar_dense")).tolist() == []
    assert tree.device_time_total[sync_row] == 0.0 and tree.self_device_time_total[sync_row] == 0.0


@pytest.mark.parametrize("device_type", [DeviceType.CPU, DeviceType.CUDA])
@pytest.mark.parametrize("rules", RELEASES, ids=RELEASE_IDS)
def test_an_overhead_row_adds_nothing_to_the_op(rules: PostProcessingRules, device_type: DeviceType) -> None:
    # CUPTI requests a buffer while aten::mm launches its 50 µs kernel; the overhead record carries the
    # launch's correlation id. A tracer may tag it with the device: it is host time all the same.
    cpu = [op("aten::mm", 1, 0, 100)]
    cupti = [
        api_call("cudaLaunchKernel", 7, 10, 20),
        on_stream("gemm", EventKind.KERNEL, 7, 200, 50),
        overhead(7, 12, 2, device_type),
    ]
    tree = linked_tree(cpu, cupti, rules)
    assert self_cuda_us(tree, "aten::mm") == 50.0
    overhead_row = row_of(tree, "Activity Buffer Request")
    assert tree.column("linked_correlation_id")[overhead_row] == 0
    assert tree.device_type[overhead_row] == DeviceType.CPU
    assert tree.device_time_total[overhead_row] == 0.0


@pytest.mark.parametrize("rules", RELEASES, ids=RELEASE_IDS)
def test_an_unlinked_call_never_takes_the_kernels_of_the_op_with_its_number(
    rules: PostProcessingRules,
) -> None:
    # aten::mm is op 5; its launch has CUPTI id 1. A cudaMemcpyAsync outside any op has CUPTI id 5.
    cpu = [op("aten::mm", 5, 0, 100)]
    cupti = [
        api_call("cudaLaunchKernel", 1, 10, 20),
        on_stream("gemm", EventKind.KERNEL, 1, 200, 50),
        api_call("cudaMemcpyAsync", 5, 300, 10),
        on_stream("Memcpy HtoD (Pageable -> Device)", EventKind.GPU_MEMCPY, 5, 320, 30),
    ]
    tree = linked_tree(cpu, cupti, rules)
    memcpy_call = row_of(tree, "cudaMemcpyAsync")
    assert tree.kernels_of(memcpy_call).tolist() == []
    assert tree.device_time_total[memcpy_call] == 0.0
    assert self_cuda_us(tree, "aten::mm") == 50.0
    # The copy is nobody's, and still a row with its own device time, as in torch.
    assert self_cuda_us(tree, "Memcpy HtoD (Pageable -> Device)") == 30.0
    assert float(tree.self_device_time_total.sum()) == 50.0 + 50.0 + 30.0  # mm, gemm, the copy


def test_rows_from_torchs_collector_keep_the_installed_releases_rules() -> None:
    # Kineto's own unlinked runtime row (activity_type set) aliases op 5 on torch <= 2.14, as torch does.
    cpu = [op("aten::mm", 5, 0, 100, activity_type="cpu_op")]
    device = [
        dict(api_call("cudaMemcpyAsync", 5, 300, 10), activity_type="cuda_runtime"),
        dict(
            on_stream("gemm", EventKind.KERNEL, 1, 200, 50), linked_correlation_id=5, activity_type="kernel"
        ),
    ]
    trace = make_trace(make_event_batch(cpu + device), config=CUDA_CONFIG)
    for rules in RELEASES:
        tree = EventTree.from_trace(trace, use_device="cuda", rules=rules)
        taken = tree.kernels_of(row_of(tree, "cudaMemcpyAsync")).tolist()
        assert (len(taken) == 1) == (rules.torch_minor < (2, 15)), rules.torch_minor
        assert self_cuda_us(tree, "aten::mm") == 50.0


# ------------------------------------------------------------------ the property


@st.composite
def workloads(draw: Any) -> tuple[list[dict], list[dict], list[dict]]:
    """Ops with launches and kernels, and extra unlinked API, sync and overhead rows with any ids.

    The launches' CUPTI ids are 1000 and up (CUPTI never reuses one); the extra
    rows' ids are drawn from the ops' own ids and the launches' ids, where
    aliasing and stray links happen.
    """
    ops: list[dict] = []
    t = 0
    for op_id in range(1, draw(st.integers(1, 6)) + 1):
        t += draw(st.integers(1, 50))
        dur = draw(st.integers(20, 200))
        ops.append(op(f"op{op_id}", op_id, t, dur))
        t += dur
    launches: list[dict] = []
    gpu = t + 100
    for cupti_id in range(1000, 1000 + draw(st.integers(0, 8))):
        target = draw(st.sampled_from(ops))
        start_us = (target["start_ns"] - BASE_NS) // US
        dur_us = target["dur_ns"] // US
        at = start_us + draw(st.integers(0, dur_us - 2))
        launches.append(api_call("cudaLaunchKernel", cupti_id, at, 1))
        for _ in range(draw(st.integers(1, 2))):
            kernel_us = draw(st.integers(1, 300))
            kind = draw(st.sampled_from([EventKind.KERNEL, EventKind.GPU_MEMCPY, EventKind.GPU_MEMSET]))
            launches.append(on_stream(f"k{cupti_id}", kind, cupti_id, gpu, kernel_us))
            gpu += kernel_us + 1
    ids = st.one_of(st.integers(1, 8), st.sampled_from([1000, 1001, 1002]), st.integers(2000, 2010))
    extra: list[dict] = []
    horizon = gpu + 100
    for _ in range(draw(st.integers(1, 8))):
        start = draw(st.integers(0, horizon))
        dur = draw(st.integers(0, 900))
        which = draw(st.sampled_from(["runtime", "driver", "sync", "overhead"]))
        if which in ("runtime", "driver"):
            kind = EventKind.RUNTIME if which == "runtime" else EventKind.DRIVER
            # An extra call's own id never repeats a launch's: CUPTI numbers every call once.
            extra.append(api_call("cudaStreamSynchronize", draw(st.integers(1, 8)), start, dur, kind))
        elif which == "sync":
            extra.append(on_stream("Stream Sync", EventKind.SYNC, draw(ids), start, dur))
        else:
            device_type = draw(st.sampled_from([DeviceType.CPU, DeviceType.CUDA]))
            extra.append(overhead(draw(ids), start, dur, device_type))
    return ops, launches, extra


def _op_device_times(tree: EventTree, n_ops: int) -> dict[str, tuple[float, float]]:
    return {
        key: (float(tree.device_time_total[row]), float(tree.self_device_time_total[row]))
        for key in (f"op{i}" for i in range(1, n_ops + 1))
        for row in [row_of(tree, key)]
    }


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(RELEASES), st.booleans())
def test_unlinked_api_sync_and_overhead_rows_never_change_an_ops_device_time(
    workload: tuple[list[dict], list[dict], list[dict]], rules: PostProcessingRules, through_linking: bool
) -> None:
    ops, launches, extra = workload
    if through_linking:  # a recording: polyprof-cuda's rows, linked by the session
        before = linked_tree(ops, launches, rules)
        after = linked_tree(ops, launches + extra, rules)
    else:  # a saved trace: kernels carry their op's External id, the extra rows none
        linked = link_launches(
            [make_event_batch(ops, source="cpu"), make_event_batch(launches, source="cupti")]
        )
        base = concat(linked)
        before = EventTree.from_trace(make_trace(base, config=CUDA_CONFIG), use_device="cuda", rules=rules)
        with_extra = concat([base, make_event_batch(extra)])
        after = EventTree.from_trace(
            make_trace(with_extra, config=CUDA_CONFIG), use_device="cuda", rules=rules
        )
    assert _op_device_times(after, len(ops)) == _op_device_times(before, len(ops))


# ------------------------------------------------------------------ polyprof report on a saved trace


def _kineto_trace() -> dict[str, Any]:
    """A Kineto-shaped trace: a 50 µs gemm of aten::mm (op 5), an 800 µs Stream Sync under .item(),
    an unlinked cudaMemcpyAsync whose CUPTI correlation id is 5, and overhead rows."""

    def x(cat: str, name: str, ts: float, dur: float, pid: int, tid: int, **args: Any) -> dict[str, Any]:
        return {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": ts,
            "dur": dur,
            "args": args,
        }

    host = {"pid": PID, "tid": OS_TID}
    gpu = {"pid": 0, "tid": 7, "device": 0, "stream": 7}
    events = [
        x("cpu_op", "aten::mm", 0.0, 100.0, **host, **{"External id": 5}),
        x("cuda_runtime", "cudaLaunchKernel", 10.0, 20.0, **host, correlation=1, **{"External id": 5}),
        x("overhead", "Activity Buffer Request", 12.0, 2.0, pid=-1, tid=0, **{"External id": 5}),
        x("kernel", "gemm", 200.0, 50.0, **gpu, correlation=1, **{"External id": 5}),
        x("cpu_op", "aten::_local_scalar_dense", 300.0, 900.0, **host, **{"External id": 6}),
        x("cuda_runtime", "cudaStreamSynchronize", 310.0, 850.0, **host, correlation=2, **{"External id": 6}),
        x("cuda_sync", "Stream Sync", 320.0, 800.0, **gpu, correlation=2, **{"External id": 6}),
        x("cuda_runtime", "cudaMemcpyAsync", 1300.0, 10.0, **host, correlation=5),
        x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 1320.0, 30.0, **gpu, correlation=5),
        x("overhead", "Instrumentation", 1400.0, 3.0, pid=-1, tid=0, correlation=6),
    ]
    meta = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "CUDA 0"}},
        {"ph": "M", "name": "process_name", "pid": -1, "tid": 0, "args": {"name": "Overhead"}},
    ]
    return {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS, "displayTimeUnit": "ms",
            "traceEvents": meta + events}  # fmt: skip


def _table_row(table: str, name: str) -> dict[str, str]:
    header = next(line for line in table.splitlines() if line.lstrip().startswith("Name"))
    columns = re.split(r"\s{2,}", header.strip())
    line = next(line for line in table.splitlines() if line.lstrip().startswith(name + " "))
    cells = re.split(r"\s{2,}", line.strip())
    return dict(zip(columns, cells, strict=True))


@pytest.mark.parametrize("rules", RELEASES, ids=RELEASE_IDS)
def test_saved_trace_gives_torchs_self_cuda(tmp_path: Path, rules: PostProcessingRules) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_kineto_trace()))
    tree = EventTree.from_trace(read_chrome_trace(path), use_device="cuda", rules=rules)
    assert self_cuda_us(tree, "aten::mm") == 50.0
    assert self_cuda_us(tree, "aten::_local_scalar_dense") == 0.0
    assert self_cuda_us(tree, "cudaMemcpyAsync") == 0.0
    assert self_cuda_us(tree, "Stream Sync") == 0.0
    assert self_cuda_us(tree, "Activity Buffer Request") == 0.0
    assert float(tree.self_device_time_total.sum()) == 50.0 + 50.0 + 30.0  # mm, gemm, the copy


def test_polyprof_report_prints_torchs_self_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_kineto_trace()))
    capsys.readouterr()
    assert cli.main(["report", str(path), "--time-unit", "us"]) == 0
    table = capsys.readouterr().out
    assert _table_row(table, "aten::mm")["Self CUDA"] == "50.000us"
    assert _table_row(table, "aten::_local_scalar_dense")["Self CUDA"] == "0.000us"
    assert _table_row(table, "cudaMemcpyAsync")["Self CUDA"] == "0.000us"
    assert _table_row(table, "Stream Sync")["Self CUDA"] == "0.000us"
    assert "Self CUDA time total: 80.000us" in table  # gemm and the copy: device rows, not the sync


def test_linking_leaves_the_calls_torchs_collector_left_unlinked_alone() -> None:
    # torch links through its external correlation; a call it did not link stays so (containment would
    # link this one to aten::mm). polyprof-cuda's own call in the same place is linked.
    cpu = make_event_batch([op("aten::mm", 5, 0, 100, activity_type="cpu_op")], source="torch_cpu")
    from_torch = make_event_batch([dict(api_call("cudaMemcpyAsync", 9, 10, 5), activity_type="cuda_runtime")])
    from_cupti = make_event_batch([api_call("cudaMemcpyAsync", 9, 10, 5)], source="cupti")
    _, torch_rows, cupti_rows = link_launches([cpu, from_torch, from_cupti])
    assert torch_rows["linked_correlation_id"].tolist() == [0]
    assert cupti_rows["linked_correlation_id"].tolist() == [5]
