"""``polyprof report`` on GPU traces that torch.profiler (Kineto) wrote on A100s and an H200.

The traces are Holistic Trace Analysis's test data (tests/data/kineto_gpu/README.md).
The oracle is torch's rule, computed here from the JSON alone: a runtime or
driver call belongs to the op its ``External id`` names when that op is the
innermost op (not a ``record_function`` range) open on the calling thread at the
call (torch pushes only ops' ids on the thread's correlation stack); a kernel,
copy or fill belongs to the op of
the call with its correlation id; an op's Self CUDA is the time of the device rows
that belong to it; a range's GPU span is a device row of its own; syncs and overhead
are never device time. Needs no torch.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from polyprof.base.events import DeviceType
from polyprof.cli.cli_report import load_report_results

DATA = Path(__file__).parent / "data" / "kineto_gpu"
TRACES = sorted(p.name for p in DATA.glob("*.json.gz"))
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def _complete_events(name: str) -> list[dict[str, Any]]:
    with gzip.open(DATA / name) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def torch_self_cuda(events: list[dict[str, Any]]) -> tuple[Counter, Counter]:
    """(Self CUDA µs per op name, Self CUDA µs per device-row name) under torch's linking rule."""
    ops = [e for e in events if e.get("cat") == "cpu_op"]

    def innermost_op(call: dict) -> dict | None:
        """The latest-started op of the call's thread that holds its start (record_function ranges never)."""
        holding = [
            op
            for op in ops
            if (op["pid"], op["tid"]) == (call["pid"], call["tid"])
            and op["ts"] <= call["ts"] <= op["ts"] + op["dur"]
        ]
        return max(holding, key=lambda op: (op["ts"], -op["dur"]), default=None)

    op_of_correlation = {}
    for call in events:
        if call.get("cat") in ("cuda_runtime", "cuda_driver") and "External id" in call["args"]:
            op = innermost_op(call)
            if op is not None and op["args"].get("External id") == call["args"]["External id"]:
                op_of_correlation[call["args"]["correlation"]] = op["name"]
    by_op: Counter = Counter()
    by_device_row: Counter = Counter()
    for row in events:
        if row.get("cat") in DEVICE_WORK:
            by_device_row[row["name"]] += row["dur"]
            owner = op_of_correlation.get(row["args"].get("correlation"))
            if owner is not None:
                by_op[owner] += row["dur"]
        elif row.get("cat") == "gpu_user_annotation":
            # a range's GPU span is a device row of its own, its time the span's (Kineto wrote it
            # 2 ns longer); torch's table names every step's span "ProfilerStep*"
            name = "ProfilerStep*" if row["name"].startswith("ProfilerStep#") else row["name"]
            by_device_row[name] += row["dur"] - 0.002
    return by_op, by_device_row


def polyprof_self_cuda(name: str) -> tuple[dict[str, float], dict[str, float]]:
    averages = load_report_results(DATA / name).key_averages()
    # with torch loaded, device_type is torch's enum, which does not compare equal to polyprof's
    host = {a.key: a.self_device_time_total for a in averages if int(a.device_type) == DeviceType.CPU}
    device = {a.key: a.self_device_time_total for a in averages if int(a.device_type) != DeviceType.CPU}
    return host, device


@pytest.mark.parametrize("name", TRACES)
def test_self_cuda_per_op_and_per_kernel_is_torchs(name: str) -> None:
    expected_ops, expected_rows = torch_self_cuda(_complete_events(name))
    host, device = polyprof_self_cuda(name)
    assert {k: round(v, 3) for k, v in host.items() if v} == {k: round(v, 3) for k, v in expected_ops.items()}
    assert {k: round(v, 3) for k, v in device.items() if v} == {
        k: round(v, 3) for k, v in expected_rows.items()
    }


def test_unlinked_rows_never_take_an_op_with_the_same_id() -> None:
    """Every call and device row here has its own correlation id as ``External id``; many equal op ids."""
    events = _complete_events("a100_simple_add_unlinked.json.gz")
    op_ids = {e["args"].get("External id") for e in events if e.get("cat") == "cpu_op"}
    aliased = [e for e in events if e.get("cat") != "cpu_op" and e["args"].get("External id") in op_ids]
    assert len(aliased) >= 50 and any(e["cat"] in DEVICE_WORK for e in aliased)  # the trap is really there
    host, device = polyprof_self_cuda("a100_simple_add_unlinked.json.gz")
    assert not any(host.values())  # torch linked nothing, so no op has Self CUDA
    device_total = sum(e["dur"] for e in events if e.get("cat") in DEVICE_WORK)
    assert sum(device.values()) == pytest.approx(device_total)  # 41 syncs add nothing
    assert device_total == pytest.approx(49_816)


def test_linked_gemm_and_workspace_memset_are_aten_mm_self_cuda() -> None:
    host, device = polyprof_self_cuda("a100_event_sync_multi_stream.json.gz")
    assert host["aten::mm"] == pytest.approx(372.0)  # 3 GEMMs (369 µs) and 3 memsets (3 µs)
    assert host["aten::matmul"] == 0
    assert device["Event Sync"] == 0  # a sync is not device time


def test_triton_kernel_belongs_to_its_launcher_not_the_sync() -> None:
    host, device = polyprof_self_cuda("a100_triton_compiled.json.gz")
    assert host["triton_poi_fused_add_cos_sin_0"] == pytest.approx(1.76)
    assert host["cudaDeviceSynchronize"] == 0 and host["cuLaunchKernel"] == 0
    assert device["triton_poi_fused_add_cos_sin_0"] == pytest.approx(1.76)


def _write_trace(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    path = tmp_path / "old_kineto.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_an_unlinked_call_whose_own_id_equals_a_range_or_parent_op_id_gives_them_nothing(
    tmp_path: Path,
) -> None:
    """Old-Kineto style: an unlinked call carries its own correlation id as ``External id``.

    ids 7 (the step range) and 8 (the parent op) are also the correlation ids of two
    unlinked calls inside ``aten::addmm``; only the third call, linked to ``aten::addmm``
    (id 9) by Kineto, gives its kernel to an op.
    """

    def x(cat: str, name: str, ts: float, dur: float, args: dict, pid: int = 1, tid: int = 1) -> dict:
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

    events = [
        x("user_annotation", "ProfilerStep#1", 0, 1000, {"External id": 7}),
        x("cpu_op", "aten::linear", 10, 900, {"External id": 8}),
        x("cpu_op", "aten::addmm", 20, 800, {"External id": 9}),
    ]
    for corr, ext, at in ((7, 7, 100), (8, 8, 200), (30, 9, 300)):
        events.append(x("cuda_runtime", "cudaLaunchKernel", at, 5, {"External id": ext, "correlation": corr}))
        kernel_args = {"External id": ext, "correlation": corr, "device": 0, "stream": 7}
        events.append(x("kernel", f"kernel_{corr}", at + 10, 50, kernel_args, pid=0, tid=7))
    averages = load_report_results(_write_trace(tmp_path, events)).key_averages()
    self_cuda = {a.key: a.self_device_time_total for a in averages if int(a.device_type) == DeviceType.CPU}
    assert self_cuda["aten::addmm"] == pytest.approx(50.0)  # kernel_30 only
    assert self_cuda["aten::linear"] == 0 and self_cuda["ProfilerStep*"] == 0
