"""Device activity -> launching CPU op, by time containment on the launching thread.

The rules are polyprof.base.attribution's.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof.analysis.tree import EventTree
from polyprof.base.attribution import link_launches
from polyprof.base.events import DeviceType, EventKind, concat
from polyprof.testing import make_event_batch, make_trace

CUDA = int(DeviceType.CUDA)


def _op(name, start, end, tid=1, corr=0, kind=EventKind.CPU_OP):
    return {
        "kind": kind,
        "name": name,
        "start_ns": start,
        "dur_ns": end - start,
        "tid": tid,
        "correlation_id": corr,
    }


def _launch(corr, start, end, tid=1, kind=EventKind.RUNTIME, name="cudaLaunchKernel"):
    return {
        "kind": kind,
        "name": name,
        "start_ns": start,
        "dur_ns": end - start,
        "tid": tid,
        "correlation_id": corr,
        "device_type": CUDA,
    }


def _kernel(corr, start, end, name="k", kind=EventKind.KERNEL, stream=7):
    return {
        "kind": kind,
        "name": name,
        "start_ns": start,
        "dur_ns": end - start,
        "correlation_id": corr,
        "device_type": CUDA,
        "stream": stream,
        "tid": stream,
    }


def _links(batch) -> dict[str, int]:
    return dict(zip(batch.values("name"), batch["linked_correlation_id"].tolist(), strict=True))


def test_innermost_op_on_the_same_thread_wins():
    cpu = make_event_batch(
        [
            _op("aten::linear", 0, 100, corr=1),
            _op("aten::addmm", 10, 60, corr=2),
            _op("model", 0, 200, corr=3, kind=EventKind.USER_ANNOTATION),  # user ranges never launch
            _op("aten::relu", 120, 150, corr=4),
            _op("aten::other_thread", 0, 1000, tid=2, corr=5),
        ],
        source="torch_cpu",
    )
    device = make_event_batch(
        [
            _launch(101, 20, 30, name="launch_addmm"),
            _launch(102, 125, 130, name="launch_relu"),
            _launch(103, 170, 180, name="launch_outside"),  # only the user range is open here
            _launch(104, 55, 65, name="launch_straddling"),  # ends after addmm: linear contains it
            _kernel(101, 40, 90, name="k_addmm"),
            _kernel(102, 140, 160, name="k_relu"),
            _kernel(103, 190, 195, name="k_outside"),
            _kernel(104, 70, 75, name="k_straddling"),
            _kernel(999, 70, 75, name="k_no_launch"),
        ],
        source="cuda",
    )
    cpu_out, device_out = link_launches([cpu, device])
    assert cpu_out is cpu  # CPU rows are never rewritten
    assert _links(device_out) == {
        "launch_addmm": 2,
        "launch_relu": 4,
        "launch_outside": 0,
        "launch_straddling": 1,
        "k_addmm": 2,
        "k_relu": 4,
        "k_outside": 0,
        "k_straddling": 1,
        "k_no_launch": 0,
    }


def test_links_cross_buffers_but_not_tracers():
    cpu = make_event_batch([_op("aten::mm", 0, 100, corr=1)], source="torch_cpu")
    api = make_event_batch([_launch(5, 10, 20)], source="cuda")
    kernels_later = make_event_batch([_kernel(5, 30, 40, name="cuda_k")], source="cuda")
    other_tracer = make_event_batch([_kernel(5, 30, 40, name="xpu_k")], source="xpu")
    out = link_launches([cpu, api, kernels_later, other_tracer])
    assert out[2]["linked_correlation_id"].tolist() == [1]
    assert out[3] is other_tracer


def test_existing_links_and_batches_without_launches_are_untouched():
    cpu = make_event_batch([_op("aten::mm", 0, 100, corr=1)])
    pre_linked = make_event_batch([{**_launch(5, 10, 20), "linked_correlation_id": 77}], source="cuda")
    batches = [cpu, pre_linked]
    assert link_launches(batches) == batches


def test_cpu_deferred_columns_stay_deferred_without_device_launches():
    calls = []

    def provider():
        calls.append(1)
        return np.array([1]), None

    from polyprof.base.events import EventBatch

    cpu = EventBatch.build(
        "torch_cpu",
        {"kind": [int(EventKind.CPU_OP)], "name": [-1], "start_ns": [0], "dur_ns": [5]},
        deferred={"tid": provider},
    )
    assert link_launches([cpu]) == [cpu]
    assert calls == []


def _nested_ops(draw, tid: int, first_corr: int) -> list[dict]:
    """A well-nested op sequence on one thread, from a random bracket sequence (ties allowed)."""
    steps = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=30))
    now, stack, ops = 0, [], []
    corr = first_corr
    for opens, gap in steps:
        now += gap
        if opens:
            stack.append((corr, now))
            corr += 1
        elif stack:
            c, s = stack.pop()
            ops.append(_op(f"op{c}", s, now, tid=tid, corr=c))
    while stack:
        now += 1
        c, s = stack.pop()
        ops.append(_op(f"op{c}", s, now, tid=tid, corr=c))
    return ops


@st.composite
def _workloads(draw):
    ops = _nested_ops(draw, tid=1, first_corr=1) + _nested_ops(draw, tid=2, first_corr=1000)
    n_launch = draw(st.integers(0, 25))
    launches, kernels = [], []
    for i in range(n_launch):
        start = draw(st.integers(0, 100))
        tid = draw(st.sampled_from([1, 2, 3]))  # thread 3 has no ops
        corr = 10_000 + i
        launches.append(_launch(corr, start, start + draw(st.integers(0, 4)), tid=tid, name=f"L{corr}"))
        for k in range(draw(st.integers(0, 2))):
            ks = draw(st.integers(0, 200))
            kernels.append(_kernel(corr, ks, ks + draw(st.integers(0, 50)), name=f"K{corr}_{k}"))
    return ops, launches, kernels


def _reference_op(ops: list[dict], launch: dict) -> int:
    """Brute force: the latest-started containing torch op on the thread (ties: innermost, then later)."""
    best = None
    for i, op in enumerate(ops):
        end = op["start_ns"] + op["dur_ns"]
        if op["tid"] != launch["tid"] or op["start_ns"] > launch["start_ns"]:
            continue
        if end < launch["start_ns"] + launch["dur_ns"]:
            continue
        key = (op["start_ns"], -end, i)
        if best is None or key > best[0]:
            best = (key, op["correlation_id"])
    return 0 if best is None else best[1]


@settings(max_examples=examples(300), deadline=None)
@given(_workloads())
def test_matches_brute_force_and_device_time_invariants(workload):
    ops, launches, kernels = workload
    cpu = make_event_batch(ops or [_op("idle", 0, 0, tid=99, corr=99_999)], source="torch_cpu")
    device = make_event_batch(launches + kernels or [_kernel(0, 0, 0)], source="cuda")
    _, linked = link_launches([cpu, device])
    by_name = _links(linked)
    expected_launch = {launch["name"]: _reference_op(ops, launch) for launch in launches}
    for launch in launches:
        assert by_name[launch["name"]] == expected_launch[launch["name"]]
    for kernel in kernels:
        # Each device activity gets at most one op: its launch's.
        assert by_name[kernel["name"]] == expected_launch[f"L{kernel['correlation_id']}"]

    # Per op, self device time = the durations of the activities it launched; unattributed
    # kernels stay in the trace and count for no op.
    trace = make_trace(concat([cpu, linked]))
    tree = EventTree.from_trace(trace, use_device="cuda")
    assert len(trace.events) == len(cpu) + len(linked)
    launched_us: dict[int, float] = {}
    for kernel in kernels:
        op = expected_launch[f"L{kernel['correlation_id']}"]
        if op:
            launched_us[op] = launched_us.get(op, 0.0) + kernel["dur_ns"] / 1000
    for row in range(len(tree)):
        name = tree.keys[tree.key[row]]
        if not name.startswith("op"):
            continue
        op_corr = int(name[2:])
        assert tree.self_device_time_total[row] == pytest.approx(launched_us.get(op_corr, 0.0), abs=1e-6)
        assert tree.device_time_total[row] >= tree.self_device_time_total[row] - 1e-6


# ------------------------------------------------------------------ end to end


torch = pytest.importorskip("torch")


class _FakeDevice:
    """Records fake 'launches' made from inside a real torch op, as a device tracer would see them."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.corr = 0

    def launch(self, kernel_ns: int) -> None:
        self.corr += 1
        start = time.time_ns()
        time.sleep(0.0005)
        end = time.time_ns()
        self.rows.append(
            _launch(self.corr, start, end, tid=threading.get_native_id(), name="fakeLaunchKernel")
        )
        self.rows[-1]["pid"] = os.getpid()
        self.rows.append(_kernel(self.corr, end + 1000, end + 1000 + kernel_ns, name="fake_kernel"))


def test_end_to_end_device_columns_for_the_op_that_launched(tmp_path, monkeypatch):
    from polyprof import ProfilerActivity, profile
    from polyprof.hooks.components import Capabilities
    from polyprof.hooks.hookspecs import hookimpl
    from polyprof.testing import FakeTracer, make_plugin_manager_for_tests

    device = _FakeDevice()

    @torch.library.custom_op("polyprof_attribution_test::launching", mutates_args=())
    def launching(x: torch.Tensor) -> torch.Tensor:
        device.launch(kernel_ns=40_000)
        device.launch(kernel_ns=10_000)
        return x.clone()

    class DeviceTracer(FakeTracer):
        def stop(self) -> None:
            self.batches = (make_event_batch(device.rows, source=self.name),)
            super().stop()

    class DevicePlugin:
        @hookimpl
        def polyprof_capabilities(self):
            return Capabilities(activities=[ProfilerActivity.CUDA])

        @hookimpl
        def polyprof_make_tracers(self, config):
            if ProfilerActivity.CUDA in config.activities:
                return [DeviceTracer(name="fake_cuda", activities=[ProfilerActivity.CUDA])]
            return []

    from polyprof.runtime import torch_cpu

    args_decoded = []
    real_args = torch_cpu._trace_args_column
    monkeypatch.setattr(torch_cpu, "_trace_args_column", lambda *a: args_decoded.append(1) or real_args(*a))
    monkeypatch.setattr(torch_cpu, "EAGER_DECODE_EVENTS", 0)  # a large profile's deferral, on a small one
    pm = make_plugin_manager_for_tests(("fake_cuda", DevicePlugin()), builtins=True)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], plugin_manager=pm, record_shapes=True
    ) as prof:
        launching(torch.ones(4))
        device.launch(kernel_ns=5_000)  # no op open: unattributed

    averages = {e.key: e for e in prof.key_averages()}
    if "polyprof_attribution_test::launching" not in averages:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as oracle:
            launching(torch.ones(4))
        if "polyprof_attribution_test::launching" not in {e.key for e in oracle.key_averages()}:
            pytest.skip(f"torch {torch.__version__} does not record calls of a torch.library.custom_op")
    op = averages["polyprof_attribution_test::launching"]
    assert op.self_device_time_total == pytest.approx(50.0)
    assert averages["fake_kernel"].count == 3
    table = prof.key_averages().table(sort_by="self_cuda_time_total")
    assert "Self CUDA" in table and "CUDA total" in table
    # Attribution read the ops' threads and ids, decoded with the table's columns: Kineto's args
    # text (the costly deferred part) still waits for an export.
    assert args_decoded == []

    path = prof.export_chrome_trace(str(tmp_path / "t.json")) or str(tmp_path / "t.json")
    import json
    from pathlib import Path

    events = json.loads(Path(path).read_text())["traceEvents"]
    assert args_decoded == [1]
    op_id = next(
        e["args"]["External id"] for e in events if e.get("name") == "polyprof_attribution_test::launching"
    )
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert sorted(k["args"]["External id"] for k in kernels if "External id" in k["args"]) == [op_id, op_id]
    assert {e["name"] for e in events if e.get("cat") == "ac2g"} == {"ac2g"}
