"""Attribution invariants (hypothesis) on generated runtime + kernel records.

Generated: per OS thread, a forest of properly nested torch ops; CUDA runtime
calls at random times on random threads (inside ops, between them, straddling
boundaries); each call launching one or two kernels. The CUPTI records are
real cupti-python record objects decoded by polyprof-cuda; linking is the
core's ``polyprof.attribution.link_launches``; device totals are the core's
``EventTree`` (torch's ``FunctionEvent`` semantics).

Invariants:

* each device activity is attributed to at most one op, and exactly to the
  innermost op on the launching thread whose interval contains the call;
* per op, self device time equals the device time of the activities it
  launched, and device time total adds its children's totals;
* an activity whose launch has no enclosing op stays unattributed and is
  still in the trace.
"""

from __future__ import annotations

import pytest
from cupti_fakes import C, RUNTIME_LAUNCH, RUNTIME_MEMCPY_ASYNC, api_call, kernel, memcpy, overhead, sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

attribution = pytest.importorskip("polyprof.attribution", reason="polyprof.attribution has not landed")

import numpy as np
from polyprof.activity import ProfilerActivity
from polyprof.config import ProfileConfig
from polyprof.events import EventBatch, EventKind, concat
from polyprof.testing import make_trace
from polyprof.tree import EventTree, PostProcessingRules
from polyprof_cuda.cbids import ApiCallFilter
from polyprof_cuda.cupti_api import CuptiApi
from polyprof_cuda.decode import RecordDecoder

US = 1_000  # generated times are in µs steps, so the tree's µs floats are exact
THREADS = (101, 202)
BASE_NS = 1_700_000_000 * 10**9

API = CuptiApi()


@st.composite
def op_forest(draw, lo: int, hi: int, depth: int = 0) -> list[tuple[int, int, int]]:
    """Properly nested (start, end, depth) intervals within [lo, hi]."""
    ops: list[tuple[int, int, int]] = []
    t = lo
    for _ in range(draw(st.integers(0, 3 if depth < 3 else 0))):
        start = t + draw(st.integers(1, 20))
        end = start + draw(st.integers(4, 200))
        if end >= hi:
            break
        ops.append((start, end, depth))
        ops.extend(draw(op_forest(start, end, depth + 1)))
        t = end
    return ops


@st.composite
def workloads(draw):
    horizon = 2_000
    ops = []  # (op_id, tid, start_us, end_us)
    for tid in THREADS:
        for start, end, _ in draw(op_forest(0, horizon)):
            ops.append((len(ops) + 1, tid, start, end))
    calls = []  # (corr, tid, start_us, end_us, [kernel durations in µs])
    for corr in range(1, draw(st.integers(0, 25)) + 1):
        tid = draw(st.sampled_from(THREADS))
        start = draw(st.integers(0, horizon))
        end = start + draw(st.integers(0, 5))
        durations = draw(st.lists(st.integers(1, 500), min_size=1, max_size=2))
        calls.append((corr, tid, start, end, durations))
    return ops, calls


def cpu_batch(ops) -> EventBatch:
    n = len(ops)
    return EventBatch.build(
        "torch_cpu",
        {
            "kind": np.full(n, int(EventKind.CPU_OP), dtype=np.int8),
            "name": np.arange(n, dtype=np.int32),
            "start_ns": np.array([BASE_NS + s * US for _, _, s, _ in ops], dtype=np.int64),
            "dur_ns": np.array([(e - s) * US for _, _, s, e in ops], dtype=np.int64),
            "pid": np.full(n, 1, dtype=np.int64),
            "tid": np.array([t for _, t, _, _ in ops], dtype=np.int64),
            "thread": np.array([THREADS.index(t) + 1 for _, t, _, _ in ops], dtype=np.int64),
            "correlation_id": np.array([i for i, _, _, _ in ops], dtype=np.int64),
        },
        {"name": tuple(f"op{i}" for i, _, _, _ in ops)},  # unique keys: no duplicate-chain collapsing
    )


def cupti_batches(calls) -> list[EventBatch]:
    """The records CUPTI would deliver, decoded by polyprof-cuda (one buffer per call)."""
    runtime, driver = API.runtime_cbids(), API.driver_cbids()
    decoder = RecordDecoder(
        kinds=API.kind_values(),
        runtime_names=runtime,
        driver_names=driver,
        api_filter=ApiCallFilter.build(runtime, driver, runtime_recorded=True, keep_all=False),
        pid=1,
    )
    batches = []
    gpu = BASE_NS + 10_000 * US
    for corr, tid, start, end, durations in calls:
        records = [
            api_call(cbid=RUNTIME_LAUNCH, start=BASE_NS + start * US, end=BASE_NS + end * US, thread_id=tid,
                     correlation_id=corr)
        ]  # fmt: skip
        for dur in durations:
            records.append(kernel(start=gpu, end=gpu + dur * US, correlation_id=corr, name=f"k{corr}"))
            gpu += dur * US + US
        batch, stats = decoder.decode(records)
        assert stats.rows == len(records)
        batches.append(batch)
    return batches


def innermost(ops, tid: int, start: int, end: int) -> int:
    """Reference: the innermost op on ``tid`` whose interval contains [start, end]; 0 when none."""
    containing = [(s, i) for i, t, s, e in ops if t == tid and s <= start and end <= e]
    return max(containing)[1] if containing else 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_attribution_invariants(workload):
    ops, calls = workload
    linked = attribution.link_launches([cpu_batch(ops), *cupti_batches(calls)])
    events = concat(linked)
    kind = events["kind"]
    is_kernel = kind == EventKind.KERNEL
    # Every kernel is still there, attributed or not.
    assert int(is_kernel.sum()) == sum(len(d) for *_, d in calls)

    expected_op = {corr: innermost(ops, tid, s, e) for corr, tid, s, e, _ in calls}
    corr = events["correlation_id"]
    link = events["linked_correlation_id"]
    for c, got in zip(corr[is_kernel].tolist(), link[is_kernel].tolist(), strict=True):
        assert got == expected_op[c], f"kernel of launch {c} linked to op {got}, expected {expected_op[c]}"
    runtime = kind == EventKind.RUNTIME
    for c, got in zip(corr[runtime].tolist(), link[runtime].tolist(), strict=True):
        assert got == expected_op[c]

    # Device time per op, through the core's tree (torch's FunctionEvent semantics).
    launched_us: dict[int, int] = {}
    for c, _, _, _, durations in calls:
        launched_us[expected_op[c]] = launched_us.get(expected_op[c], 0) + sum(durations)
    trace = make_trace(events, config=ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA}))
    tree = EventTree.from_trace(trace, use_device="cuda")
    keys = np.array(tree.keys, dtype=object)[tree.key]
    by_key = {k: r for r, k in enumerate(keys.tolist())}
    children_total: dict[int, float] = {}
    for op_id, *_ in ops:
        row = by_key[f"op{op_id}"]
        kids = tree.children[tree.children_indptr[row] : tree.children_indptr[row + 1]]
        children_total[op_id] = float(tree.device_time_total[kids].sum())
        assert tree.self_device_time_total[row] == pytest.approx(launched_us.get(op_id, 0))
        assert tree.device_time_total[row] == pytest.approx(launched_us.get(op_id, 0) + children_total[op_id])


RUNTIME_STREAM_SYNC = int(C.runtime_api_trace_cbid.cudaStreamSynchronize_v3020)


def test_sync_overhead_and_unlinked_calls_are_not_an_ops_self_cuda():
    """Real CUPTI records through polyprof-cuda, the core's linking and torch's tree (M1, M2).

    Op 1 ``aten::_local_scalar_dense`` waits 800 µs in a stream sync (CUPTI id
    41); op 5 ``aten::mm`` launches a 50 µs kernel (CUPTI id 1) while CUPTI
    requests a buffer (an overhead record with the launch's id); a
    ``cudaMemcpyAsync`` outside every op has CUPTI id 5, the number of ``aten::mm``.
    """
    ops = [(1, THREADS[0], 0, 900), (5, THREADS[0], 1_000, 1_100)]

    def t(us: int) -> int:
        return BASE_NS + us * US

    records = [
        api_call(cbid=RUNTIME_STREAM_SYNC, start=t(10), end=t(860), thread_id=THREADS[0], correlation_id=41),
        sync(start=t(20), end=t(820), correlation_id=41),
        api_call(cbid=RUNTIME_LAUNCH, start=t(1_010), end=t(1_030), thread_id=THREADS[0], correlation_id=1),
        overhead(start=t(1_012), end=t(1_014), correlation_id=1),
        kernel(start=t(2_000), end=t(2_050), correlation_id=1, name="gemm"),
        api_call(
            cbid=RUNTIME_MEMCPY_ASYNC, start=t(3_000), end=t(3_010), thread_id=THREADS[0], correlation_id=5
        ),
        memcpy(start=t(3_020), end=t(3_050), correlation_id=5),
    ]
    runtime, driver = API.runtime_cbids(), API.driver_cbids()
    decoder = RecordDecoder(
        kinds=API.kind_values(),
        runtime_names=runtime,
        driver_names=driver,
        api_filter=ApiCallFilter.build(runtime, driver, runtime_recorded=True, keep_all=False),
        pid=1,
    )
    cupti, stats = decoder.decode(records)
    assert stats.rows == len(records)
    events = concat(attribution.link_launches([cpu_batch(ops), cupti]))
    trace = make_trace(events, config=ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA}))
    for minor in range(6, 16):
        tree = EventTree.from_trace(trace, use_device="cuda", rules=PostProcessingRules.for_torch(2, minor))
        keys = np.array(tree.keys, dtype=object)[tree.key].tolist()
        self_cuda = dict(zip(keys, tree.self_device_time_total.tolist(), strict=True))
        assert self_cuda["op1"] == 0.0, minor  # the stream sync is not device work
        assert self_cuda["op5"] == 50.0, minor  # the kernel, not the overhead
        assert self_cuda["cudaMemcpyAsync"] == 0.0, minor  # never op 5's kernel
        assert self_cuda["Stream Sync"] == 0.0, minor
        assert sum(self_cuda.values()) == 50.0 + 50.0 + 30.0, minor  # op5, gemm, the copy
