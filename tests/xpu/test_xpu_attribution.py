"""Invariants of attributing generated PTI records to CPU ops (hypothesis).

Ops are nested intervals on one OS thread; each launch is a runtime API call
plus the kernel it launched, written as PTI records by the fake, walked and
decoded by the plugin, then linked by the core's time containment. The
oracle is a brute-force search for the innermost op containing the call.
"""

from __future__ import annotations

import ctypes

import numpy as np
from conftest import UUID0
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polyprof.attribution import link_launches
from polyprof.events import EventBatch, EventKind
from polyprof_xpu.decode import Clock, Decoder, DeviceTable

TID = 5151
T0 = 1_800_000_000_000_000_000


@st.composite
def workloads(draw):
    """Nested ops (a random tree laid out on a time line) and launches at random times."""
    ops: list[tuple[int, int]] = []

    def build(start: int, end: int, depth: int) -> None:
        if depth > 3 or end - start < 40:
            return
        n = draw(st.integers(0, 3))
        cursor = start
        for _ in range(n):
            a = draw(st.integers(cursor, end - 20))
            b = draw(st.integers(a + 10, min(end, a + (end - start))))
            ops.append((a, b))
            build(a + 1, b - 1, depth + 1)
            cursor = b + 1
            if cursor >= end - 20:
                break

    build(0, 10_000, 0)
    launches = draw(
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 50), st.integers(1, 500)), max_size=25)
    )
    return ops, launches


def innermost(ops: list[tuple[int, int]], a: int, b: int) -> int:
    best = 0
    best_start = -1
    for i, (s, e) in enumerate(ops):
        if s <= a and e >= b and s >= best_start:
            best, best_start = i + 1, s  # ids are 1-based; later ops win ties, as the sort does
    return best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workloads())
def test_kernels_go_to_the_op_that_contains_their_launch(fake_pti, workload) -> None:
    ops, launches = workload
    fake_pti.fakePtiEnableAllForBuilding()
    fake_pti.fakePtiReset()
    for i, (at, api_dur, kernel_dur) in enumerate(launches):
        corr = i + 1
        fake_pti.fakePtiAddApi(6, T0 + at, T0 + at + api_dur, 3, 0, 1, TID, corr)
        fake_pti.fakePtiAddKernel(
            T0 + 20_000 + i * 600,
            T0 + 20_000 + i * 600 + kernel_dur,
            corr,
            TID,
            UUID0,
            1,
            0xA,
            fake_pti.name("k"),
            corr,
        )
    buf = (ctypes.c_uint8 * (1 << 16))()
    used = fake_pti.fakePtiBuildBuffer(buf, len(buf))
    decoder = Decoder(
        lambda g, i: "urEnqueueKernelLaunch", DeviceTable([{"index": 0, "uuid": UUID0.hex()}]), Clock(), pid=1
    )
    xpu = decoder.decode_buffer(fake_pti.lib.ptiViewGetNextRecord, ctypes.addressof(buf), used)
    n_ops = len(ops)
    cpu = EventBatch.build(
        "torch_cpu",
        {
            "kind": np.zeros(n_ops, dtype=np.int8),
            "name": np.zeros(n_ops, dtype=np.int32),
            "start_ns": np.array([T0 + s for s, _ in ops], dtype=np.int64),
            "dur_ns": np.array([e - s for s, e in ops], dtype=np.int64),
            "tid": np.full(n_ops, TID, dtype=np.int64),
            "correlation_id": np.arange(1, n_ops + 1, dtype=np.int64),
        },
        {"name": ("op",)},
    )
    if xpu is None:
        assert not launches
        return
    assert len(xpu) == 2 * len(launches)  # every record decoded exactly once
    linked = link_launches([cpu, xpu])[1]
    kind, corr, link = linked["kind"], linked["correlation_id"], linked["linked_correlation_id"]
    dur = linked["dur_ns"]
    for i, (at, api_dur, kernel_dur) in enumerate(launches):
        want = innermost(ops, at, at + api_dur)
        api_row = np.flatnonzero((kind == EventKind.RUNTIME) & (corr == i + 1))
        kernel_row = np.flatnonzero((kind == EventKind.KERNEL) & (corr == i + 1))
        assert len(api_row) == len(kernel_row) == 1
        assert link[api_row[0]] == link[kernel_row[0]] == want
        assert dur[kernel_row[0]] == kernel_dur
    # Device time is conserved: what ops receive plus what stays unattributed is all kernel time.
    kernels = kind == EventKind.KERNEL
    assert dur[kernels & (link > 0)].sum() + dur[kernels & (link == 0)].sum() == sum(
        k for _, _, k in launches
    )


def test_barriers_overhead_and_unlinked_calls_are_not_an_ops_xpu_time(fake_pti) -> None:
    """PTI's rows through the plugin, the core's linking and torch's tree (m8, M1, M2).

    ``aten::item`` (op 1) waits on a 500 µs GPU barrier; ``aten::mm`` (op 2)
    launches a 300 µs kernel while PTI flushes a buffer; a call outside every op
    has PTI correlation id 2, the number of ``aten::mm``.
    """
    from polyprof.events import concat
    from polyprof.testing import make_trace
    from polyprof.tree import EventTree, PostProcessingRules

    fake_pti.fakePtiEnableAllForBuilding()
    fake_pti.fakePtiReset()
    fake_pti.fakePtiAddApi(
        6, T0 + 110_000, T0 + 190_000, 3, 0, 1, TID, 17
    )  # the barrier's call, inside aten::item
    fake_pti.fakePtiAddSync(T0 + 120_000, T0 + 620_000, 1, TID, 17, 0xC0, 5, 1)  # GPU barrier on queue 0xC0
    fake_pti.fakePtiAddApi(6, T0 + 1_050_000, T0 + 1_090_000, 3, 0, 1, TID, 11)  # aten::mm's launch
    fake_pti.fakePtiAddKernel(
        T0 + 5_000_000, T0 + 5_300_000, 11, TID, UUID0, 1, 0xA, fake_pti.name("gemm"), 11
    )
    fake_pti.fakePtiAddOverhead(T0 + 1_060_000, T0 + 1_080_000, TID, 3, 1, 20)
    fake_pti.fakePtiAddApi(6, T0 + 3_000_000, T0 + 3_040_000, 3, 0, 1, TID, 2)  # outside every op, id 2
    buf = (ctypes.c_uint8 * (1 << 16))()
    used = fake_pti.fakePtiBuildBuffer(buf, len(buf))
    decoder = Decoder(
        lambda g, i: "urEnqueueKernelLaunch", DeviceTable([{"index": 0, "uuid": UUID0.hex()}]), Clock(), pid=1
    )
    xpu = decoder.decode_buffer(fake_pti.lib.ptiViewGetNextRecord, ctypes.addressof(buf), used)
    cpu = EventBatch.build(
        "torch_cpu",
        {
            "kind": np.zeros(2, dtype=np.int8),
            "name": np.array([0, 1], dtype=np.int32),
            "start_ns": np.array([T0 + 100_000, T0 + 1_000_000], dtype=np.int64),
            "dur_ns": np.array([700_000, 200_000], dtype=np.int64),
            "tid": np.full(2, TID, dtype=np.int64),
            "thread": np.ones(2, dtype=np.int64),
            "correlation_id": np.array([1, 2], dtype=np.int64),
        },
        {"name": ("aten::item", "aten::mm")},
    )
    events = concat(link_launches([cpu, xpu]))
    trace = make_trace(events)
    for minor in range(6, 16):
        tree = EventTree.from_trace(trace, use_device="xpu", rules=PostProcessingRules.for_torch(2, minor))
        keys = np.array(tree.keys, dtype=object)[tree.key]
        self_xpu = dict(zip(keys.tolist(), tree.self_device_time_total.tolist(), strict=True))
        assert self_xpu["aten::item"] == 0.0, minor
        assert self_xpu["aten::mm"] == 300.0, minor  # the kernel only
        (barrier,) = np.flatnonzero(tree.kind == EventKind.SYNC)
        assert tree.device_time_total[barrier] == 0.0
        (unlinked,) = np.flatnonzero((tree.start_us > 2_000) & (tree.kind == EventKind.RUNTIME))
        assert tree.kernels_of(int(unlinked)).tolist() == []
        assert float(tree.self_device_time_total.sum()) == 600.0  # aten::mm and its kernel row
