"""polyprof.analysis.tree against torch's own post-processing as the oracle.

Synthetic event sets (hypothesis) are turned two ways: into an ``EventBatch``
for ``EventTree.from_trace``, and into fake ``_KinetoEvent`` objects (same
accessors as the installed torch's ``_KinetoEvent``, same values) fed to the
installed torch's real ``profile._parse_kineto_results`` and
``EventList._build_tree``. Every row attribute must then be identical, floats
bit for bit: names, order, parents, children, self times, memory, kernels and
device times, stacks. This runs on every supported torch, each against its
own code; the one deliberate difference (XPU device rows before torch 2.11,
where torch's own ``device_time_total`` raises) is checked against torch on
the same events with those rows labelled CUDA. The same data also checks
invariants that hold whatever torch does. Real-profile comparisons live in
test_results.py.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof.analysis import tree as tree_module
from polyprof.analysis.tree import (
    FILTERED_NAMES,
    LAZY_COLUMNS,
    EventTree,
    MergedTrace,
    PostProcessingRules,
    _neumaier_by_segment,
    _populate_parents,
    _through_us,
    filter_stack_entry,
    post_processing_rules,
    python_sum_by_segment,
    rewrite_name,
    tree_for,
    use_device_for,
)
from polyprof.base import torch_support
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import DeviceType, EventBatch, EventKind, concat
from polyprof.testing import make_event_batch, make_trace

torch = pytest.importorskip("torch")
from torch.autograd import DeviceType as TorchDeviceType  # noqa: E402
from torch.autograd import profiler as torch_profiler  # noqa: E402
from torch.autograd import profiler_util  # noqa: E402

TRACE_START = 1_700_000_000_000_000_000
TORCH_DEVICE = {int(m): m for m in TorchDeviceType.__members__.values()}
ACTIVITY_TYPE = {
    EventKind.CPU_OP: "cpu_op",
    EventKind.USER_ANNOTATION: "user_annotation",
    EventKind.PYTHON_FUNCTION: "python_function",
    EventKind.MEMORY: "cpu_instant_event",
    EventKind.OUT_OF_MEMORY: "cpu_instant_event",
    EventKind.KERNEL: "kernel",
    EventKind.GPU_MEMCPY: "gpu_memcpy",
    EventKind.GPU_USER_ANNOTATION: "gpu_user_annotation",
    EventKind.RUNTIME: "cuda_runtime",
    EventKind.OVERHEAD: "overhead",
}
CPU_SIDE = (EventKind.CPU_OP, EventKind.USER_ANNOTATION, EventKind.PYTHON_FUNCTION)
NO_EXTERNAL_ID = (EventKind.KERNEL, EventKind.GPU_MEMCPY, EventKind.GPU_MEMSET, EventKind.RUNTIME)
FEATURES = torch_support.installed()
RULES = post_processing_rules()
#: torch before 2.11 raises from ``device_time_total`` for XPU rows and links no XPU kernels.
XPU_AS_TORCH = FEATURES.at_least(2, 11)


# ------------------------------------------------------------- the oracle


class _AllAccessors:
    """Every ``_KinetoEvent`` accessor of the supported torch releases, from one event spec."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.s = spec

    def duration_ns(self) -> int:
        return self.s["dur_ns"]

    def name(self) -> str:
        return self.s["name"]

    def is_hidden_event(self) -> bool:
        return False

    def start_ns(self) -> int:
        return TRACE_START + self.s["start_ns"]

    def end_ns(self) -> int:
        return TRACE_START + self.s["start_ns"] + self.s["dur_ns"]

    def device_type(self) -> Any:
        return TORCH_DEVICE[self.s.get("device_type", 0)]

    def is_async(self) -> bool:
        return bool(self.s.get("is_async", False))

    def start_thread_id(self) -> int:
        return self.s.get("thread", 0)

    def end_thread_id(self) -> int:
        return self.s.get("thread", 0)

    def correlation_id(self) -> int:
        return self.s.get("correlation_id", 0)

    def linked_correlation_id(self) -> int:
        return self.s.get("linked_correlation_id", 0)

    def overload_name(self) -> str:
        return self.s.get("overload", "")

    def fwd_thread_id(self) -> int:
        return self.s.get("fwd_thread", 0)

    def shapes(self) -> list:
        return [list(s) for s in self.s.get("shapes", ())]

    def stack(self) -> list:
        return list(self.s.get("stack", ()))

    def scope(self) -> int:
        return self.s.get("scope", 0)

    def sequence_nr(self) -> int:
        return self.s.get("sequence_nr", -1)

    def device_index(self) -> int:
        # Kineto reports the process id as the device of CPU-side events.
        return self.s.get("pid", 0) if self.s["kind"] in CPU_SIDE else self.s.get("device_index", 0)

    def device_resource_id(self) -> int:
        return self.s.get("tid", 0)

    def flops(self) -> int:
        return self.s.get("flops", 0)

    def is_user_annotation(self) -> bool:
        return self.s["kind"] in (EventKind.USER_ANNOTATION, EventKind.GPU_USER_ANNOTATION)

    def is_python_function(self) -> bool:
        return self.s["kind"] == EventKind.PYTHON_FUNCTION

    def activity_type(self) -> str:
        return ACTIVITY_TYPE.get(self.s["kind"], "cpu_op")

    def nbytes(self) -> int:
        return self.s.get("nbytes", 0)

    def python_id(self) -> int:
        return self.s.get("python_id", -1)

    def python_parent_id(self) -> int:
        return self.s.get("python_parent_id", -1)

    def cuda_elapsed_us(self) -> int:
        return -1

    def privateuse1_elapsed_us(self) -> int:
        return -1

    def metadata_json(self) -> str:
        return ""

    def extra_meta(self) -> dict:
        return {}

    def concrete_inputs(self) -> list:
        return []

    def kwinputs(self) -> dict:
        return {}

    def dtypes(self) -> list:
        return []

    def structured_input_shapes(self) -> list:
        return []

    def structured_input_strides(self) -> list:
        return []

    def flow_id(self) -> int:
        return self.s.get("flow_id", 0)

    def flow_type(self) -> int:
        return self.s.get("flow_type", 0)

    def flow_start(self) -> bool:
        return bool(self.s.get("flow_start", False))

    def external_id(self) -> int:
        if "external_id" in self.s:
            return self.s["external_id"]
        # Kineto's: the launching op's id for linked rows, none for device and API rows
        if self.s.get("linked_correlation_id", 0) > 0:
            return self.s["linked_correlation_id"]
        return 0 if self.s["kind"] in NO_EXTERNAL_ID else self.s.get("correlation_id", 0)

    def python_module_id(self) -> int:
        return -1

    def typed_metadata(self) -> dict:
        return {}


#: Exactly the installed torch's accessors, so its parse fails here if it calls one this torch lacks.
FakeKinetoEvent = type(
    "FakeKinetoEvent",
    (),
    {
        "__init__": _AllAccessors.__init__,
        **{name: fn for name, fn in vars(_AllAccessors).items() if name in FEATURES.event_accessors},
    },
)


class FakeResult:
    def __init__(self, specs: Sequence[dict[str, Any]]) -> None:
        self._events = [FakeKinetoEvent(s) for s in specs]

    def events(self) -> list[FakeKinetoEvent]:
        return self._events

    def trace_start_ns(self) -> int:
        return TRACE_START


def torch_events(specs: Sequence[dict[str, Any]], use_device: str | None) -> Any:
    """torch's ``prof.events()`` for these events: its own parse and tree building."""
    prof = torch_profiler.profile.__new__(torch_profiler.profile)
    prof.use_device = use_device
    events = torch_profiler.profile._parse_kineto_results(prof, FakeResult(specs))
    out = profiler_util.EventList(events, use_device=use_device, profile_memory=True, with_flops=True)
    out._build_tree()
    return out


def our_tree(
    specs: Sequence[dict[str, Any]], use_device: str | None, rules: PostProcessingRules | None = None
) -> EventTree:
    rows = []
    for s in specs:
        row = dict(s)
        # These rows stand for torch's collector result, whose rows carry Kineto's activity type.
        row.setdefault("activity_type", ACTIVITY_TYPE.get(s["kind"], "cpu_op"))
        row["kind"] = int(row["kind"])
        row["start_ns"] = TRACE_START + row["start_ns"]
        rows.append(row)
    batch = make_event_batch(rows)
    return EventTree.from_trace(make_trace(batch, start_ns=TRACE_START), use_device=use_device, rules=rules)


def torch_view(specs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events to give torch as the oracle for polyprof's tree of ``specs``.

    polyprof treats XPU device rows (kernels, copies) as torch 2.11 and newer
    do, which is exactly how every release treats CUDA rows; torch before 2.11
    links no XPU kernel and raises from ``device_time_total`` for XPU rows
    (docs/torch-versions.md). There the oracle gets those rows labelled CUDA.
    """
    if XPU_AS_TORCH:
        return list(specs)
    MEMORY_KINDS = (EventKind.MEMORY, EventKind.OUT_OF_MEMORY)  # noqa: N806
    return [
        dict(s, device_type=int(DeviceType.CUDA))
        if s.get("device_type") == DeviceType.XPU and s["kind"] not in MEMORY_KINDS
        else s
        for s in specs
    ]


def assert_same_as_torch(tree: EventTree, theirs: Any, *, xpu_as_cuda: bool = False) -> None:
    """Row by row equality; ``xpu_as_cuda``: torch was given ``torch_view`` events."""
    assert len(tree) == len(theirs)
    index = {id(e): i for i, e in enumerate(theirs)}
    t = tree
    device_index = t.column("device_index")
    event_id = t.column("event_id")
    device_type = t.device_type.astype(np.int64)
    if xpu_as_cuda:
        device_type = np.where(device_type == DeviceType.XPU, int(DeviceType.CUDA), device_type)
    for i, e in enumerate(theirs):
        where = f"row {i} ({e.name!r})"
        assert t.keys[t.key[i]] == e.key, where
        assert (t.trace_names[t.trace_name[i]] if t.trace_name[i] >= 0 else None) == e.trace_name, where
        assert float(t.start_us[i]) == e.time_range.start and float(t.end_us[i]) == e.time_range.end, where
        assert int(t.thread[i]) == e.thread, where
        assert bool(t.is_async[i]) == e.is_async, where
        assert int(device_type[i]) == int(e.device_type), where
        assert int(event_id[i]) == e.id, where
        assert int(device_index[i]) == e.device_index, where
        expected_parent = -1 if e.cpu_parent is None else index[id(e.cpu_parent)]
        assert int(t.parent[i]) == expected_parent, where
        assert t.children_of(i).tolist() == [index[id(c)] for c in e.cpu_children], where
        assert float(t.cpu_time_total[i]) == e.cpu_time_total, where
        assert float(t.self_cpu_time_total[i]) == e.self_cpu_time_total, where
        assert int(t.cpu_memory_usage[i]) == e.cpu_memory_usage, where
        assert int(t.device_memory_usage[i]) == e.device_memory_usage, where
        assert int(t.self_cpu_memory_usage[i]) == e.self_cpu_memory_usage, where
        assert int(t.self_device_memory_usage[i]) == e.self_device_memory_usage, where
        assert float(t.device_time_total[i]) == e.device_time_total, where
        assert float(t.self_device_time_total[i]) == e.self_device_time_total, where
        ours_kernels = [
            (t.keys[t.key[k]], int(device_index[k]), float(t.end_us[k] - t.start_us[k]))
            for k in t.kernels_of(i)
        ]
        assert ours_kernels == [tuple(k) for k in e.kernels], where
        assert (None if t.synthetic[i] else int(t.flops[i])) == e.flops, where
        stack = list(t.stacks[t.stack[i]]) if t.stack[i] >= 0 else []
        assert stack == e.stack, where
        shapes = [list(s) for s in t.shapes[t.input_shapes[i]]] if t.input_shapes[i] >= 0 else []
        assert shapes == e.input_shapes, where
        assert bool(t.is_user_annotation[i]) == bool(e.is_user_annotation), where


# ---------------------------------------------------- synthetic event sets

NAMES = ["aten::add", "aten::mm", "blk", "ProfilerStep#1", "ProfilerStep#2", "_Z3foov", "t", "aten::is_leaf"]
STACKS = [
    (),
    ("a.py(1): f", "b.py(2): <module>"),
    ("torch/autograd/__init__.py(10): backward", "m.py(3): main"),
    ("c.py(5): h; x",),
]
SHAPES = [(), ((2, 3),), ((2, 3), ()), ((4,), (4,))]
UNITS = [0, 1, 7, 333, 1000, 1234]


@st.composite
def event_sets(draw: Any, *, devices: bool = True, max_nodes: int = 30) -> list[dict[str, Any]]:
    """Nested CPU ops on a few threads, plus overlaps, memory, filtered names and device work."""
    budget = [draw(st.integers(1, max_nodes))]
    next_id = [1]
    specs: list[dict[str, Any]] = []

    def node(depth: int, parent_name: str | None, thread: int, t: int) -> int:
        budget[0] -= 1
        name = parent_name if parent_name and draw(st.integers(0, 3)) == 0 else draw(st.sampled_from(NAMES))
        kind = draw(
            st.sampled_from([EventKind.CPU_OP] * 4 + [EventKind.USER_ANNOTATION, EventKind.PYTHON_FUNCTION])
        )
        start = t + draw(st.sampled_from(UNITS))
        spec: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "start_ns": start,
            "thread": thread,
            "tid": 1000 + thread,
            "pid": 4242,
            "correlation_id": 0 if kind == EventKind.PYTHON_FUNCTION else next_id[0],
            "scope": draw(st.sampled_from([0, 0, 1, 7])),
            "sequence_nr": draw(st.integers(-1, 2)),
            "fwd_thread": draw(st.integers(0, 2)),
            "stack": draw(st.sampled_from(STACKS)),
            "shapes": draw(st.sampled_from(SHAPES)),
            "flops": draw(st.sampled_from([0, 0, 3, 10**9])),
        }
        next_id[0] += 1
        specs.append(spec)
        cur = start + draw(st.sampled_from(UNITS))
        n_children = draw(st.integers(0, 3)) if depth < 6 else 0
        for _ in range(n_children):
            if budget[0] <= 0:
                break
            cur = node(depth + 1, name, thread, cur)
        end = cur + draw(st.sampled_from(UNITS))
        spec["dur_ns"] = end - start
        return end

    threads = draw(st.integers(1, 3))
    for thread in range(1, threads + 1):
        t = draw(st.integers(0, 5000))
        while budget[0] > 0 and draw(st.booleans()):
            t = node(0, None, thread, t)
        if budget[0] > 0:
            t = node(0, None, thread, t)
    horizon = max(s["start_ns"] + s["dur_ns"] for s in specs) + 10
    cpu_ops = [s for s in specs if s["correlation_id"] > 0]
    boundaries = sorted({s["start_ns"] for s in specs} | {s["start_ns"] + s["dur_ns"] for s in specs})

    # Partial overlaps and async events.
    for _ in range(draw(st.integers(0, 3))):
        start = draw(st.integers(0, horizon))
        specs.append(
            {
                "name": draw(st.sampled_from(NAMES)),
                "kind": EventKind.CPU_OP,
                "start_ns": start,
                "dur_ns": draw(st.integers(0, horizon)),
                "thread": draw(st.integers(1, threads)),
                "is_async": draw(st.booleans()),
                "correlation_id": next_id[0],
            }
        )
        next_id[0] += 1
    # Memory records (some exactly on op boundaries) and out-of-memory records.
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.one_of(st.sampled_from(boundaries), st.integers(0, horizon)))
        specs.append(
            {
                "name": "[memory]",
                "kind": EventKind.MEMORY,
                "start_ns": at,
                "dur_ns": 0,
                "thread": draw(st.integers(1, threads)),
                "nbytes": draw(st.sampled_from([4096, -4096, 24, 1 << 30])),
                "device_type": draw(st.sampled_from([0, 0, 1, 2, 12])),
                "device_index": -1,
            }
        )
    for _ in range(draw(st.integers(0, 1))):
        specs.append(
            {
                "name": "[OutOfMemory]",
                "kind": EventKind.OUT_OF_MEMORY,
                "start_ns": draw(st.integers(0, horizon)),
                "dur_ns": 0,
                "thread": 1,
                "nbytes": 1 << 20,
                "device_type": 1,
            }
        )
    # Profiler overhead rows: they launch what links to them before torch 2.14, nothing from it.
    for _ in range(draw(st.integers(0, 2))):
        overhead = {
            "name": "Activity Buffer Request",
            "kind": EventKind.OVERHEAD,
            "start_ns": draw(st.integers(0, horizon)),
            "dur_ns": draw(st.sampled_from(UNITS)),
            "thread": draw(st.integers(1, threads)),
            "correlation_id": next_id[0],
        }
        next_id[0] += 1
        specs.append(overhead)
        cpu_ops.append(overhead)
    if devices and cpu_ops:
        # Kernels and copies linked to CPU ops (or to no op), and runtime calls on another thread.
        for _ in range(draw(st.integers(0, 6))):
            target = draw(st.sampled_from(cpu_ops))["correlation_id"] if draw(st.integers(0, 4)) else 99_999
            specs.append(
                {
                    "name": draw(st.sampled_from(["_Z6kernelv", "gemm", "Memcpy HtoD"])),
                    "kind": draw(st.sampled_from([EventKind.KERNEL, EventKind.GPU_MEMCPY])),
                    "start_ns": draw(st.integers(0, horizon)),
                    "dur_ns": draw(st.sampled_from(UNITS)),
                    "thread": 50,
                    "device_type": draw(st.sampled_from([1, 1, 12, 20, 19])),
                    "device_index": draw(st.integers(0, 1)),
                    "linked_correlation_id": target,
                    "correlation_id": 0,
                }
            )
        for _ in range(draw(st.integers(0, 3))):
            op = draw(st.sampled_from(cpu_ops))
            specs.append(
                {
                    "name": "cudaLaunchKernel",
                    "kind": EventKind.RUNTIME,
                    "start_ns": op["start_ns"] + (op["dur_ns"] // 3),
                    "dur_ns": op["dur_ns"] // 3,
                    "thread": 77,
                    "linked_correlation_id": op["correlation_id"],
                    "correlation_id": 0,
                }
            )
    if draw(st.booleans()):
        # Recorded external ids, some ops without one (from torch 2.15 those launch nothing).
        for spec in specs:
            if spec.get("linked_correlation_id", 0) > 0:
                spec["external_id"] = spec["linked_correlation_id"]
            elif spec.get("correlation_id", 0) > 0:
                spec["external_id"] = draw(st.sampled_from([spec["correlation_id"], 0]))
            else:
                spec["external_id"] = 0
    # torch's raw events come sorted by start; decode order matters only for ties.
    order = draw(st.permutations(range(len(specs)))) if draw(st.booleans()) else range(len(specs))
    return [specs[i] for i in order]


def _use_devices() -> st.SearchStrategy[str | None]:
    return st.sampled_from([None, "cuda", "xpu"])


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_sets(), _use_devices())
def test_tree_matches_torch_on_synthetic_events(specs: list[dict[str, Any]], use_device: str | None) -> None:
    assert_same_as_torch(
        our_tree(specs, use_device), torch_events(torch_view(specs), use_device), xpu_as_cuda=not XPU_AS_TORCH
    )


def test_same_name_chain_collapses_into_its_top_with_the_bottom_kernels() -> None:
    # blk > blk > blk (single children), the bottom one launching a kernel; the
    # top's own kernel and the middle's are dropped, as torch drops them.
    specs = [
        {
            "name": "blk",
            "kind": EventKind.CPU_OP,
            "start_ns": 0,
            "dur_ns": 100,
            "thread": 1,
            "correlation_id": 1,
        },
        {
            "name": "blk",
            "kind": EventKind.CPU_OP,
            "start_ns": 10,
            "dur_ns": 80,
            "thread": 1,
            "correlation_id": 2,
        },
        {
            "name": "blk",
            "kind": EventKind.CPU_OP,
            "start_ns": 20,
            "dur_ns": 60,
            "thread": 1,
            "correlation_id": 3,
        },
        {
            "name": "aten::mm",
            "kind": EventKind.CPU_OP,
            "start_ns": 30,
            "dur_ns": 10,
            "thread": 1,
            "correlation_id": 4,
        },
        {
            "name": "aten::mm",
            "kind": EventKind.CPU_OP,
            "start_ns": 50,
            "dur_ns": 10,
            "thread": 1,
            "correlation_id": 5,
        },
    ]
    kernels = [
        {
            "name": k,
            "kind": EventKind.KERNEL,
            "start_ns": 200 + i,
            "dur_ns": 5 + i,
            "thread": 9,
            "device_type": 1,
            "linked_correlation_id": corr,
        }
        for i, (k, corr) in enumerate([("top", 1), ("mid", 2), ("bottom", 3)])
    ]
    tree = our_tree(specs + kernels, "cuda")
    assert_same_as_torch(tree, torch_events(specs + kernels, "cuda"))
    keys = [tree.keys[k] for k in tree.key]
    assert keys.count("blk") == 1
    top = keys.index("blk")
    assert [keys[c] for c in tree.children_of(top)] == ["aten::mm", "aten::mm"]
    assert [keys[k] for k in tree.kernels_of(top)] == ["bottom"]


def test_kernel_without_launching_op_is_a_row_but_nobodys_kernel() -> None:
    specs = [
        {
            "name": "aten::mm",
            "kind": EventKind.CPU_OP,
            "start_ns": 0,
            "dur_ns": 100,
            "thread": 1,
            "correlation_id": 1,
        },
        {
            "name": "k",
            "kind": EventKind.KERNEL,
            "start_ns": 10,
            "dur_ns": 5,
            "thread": 9,
            "device_type": 1,
            "linked_correlation_id": 42,
        },
    ]
    tree = our_tree(specs, "cuda")
    assert_same_as_torch(tree, torch_events(specs, "cuda"))
    assert len(tree) == 2 and len(tree.kernel_rows) == 0
    kernel_row = [tree.keys[k] for k in tree.key].index("k")
    assert tree.device_time_total[kernel_row] == tree.elapsed_us[kernel_row] > 0


def test_memory_outside_every_op_becomes_top_level_memory_rows() -> None:
    specs = [
        {
            "name": "aten::empty",
            "kind": EventKind.CPU_OP,
            "start_ns": 100,
            "dur_ns": 100,
            "thread": 1,
            "correlation_id": 7,
        },
        # inclusive ends: a record at the op's start and one at its end belong to it
        {"name": "[memory]", "kind": EventKind.MEMORY, "start_ns": 100, "thread": 1, "nbytes": 64},
        {"name": "[memory]", "kind": EventKind.MEMORY, "start_ns": 200, "thread": 2, "nbytes": -16},
        {
            "name": "[memory]",
            "kind": EventKind.MEMORY,
            "start_ns": 300,
            "thread": 1,
            "nbytes": 8,
            "device_type": 1,
        },
        {"name": "[OutOfMemory]", "kind": EventKind.OUT_OF_MEMORY, "start_ns": 150, "thread": 1, "nbytes": 1},
    ]
    tree = our_tree(specs, None)
    assert_same_as_torch(tree, torch_events(specs, None))
    keys = [tree.keys[k] for k in tree.key]
    assert keys == ["aten::empty", "[OutOfMemory]", "[memory]"]
    assert tree.cpu_memory_usage.tolist() == [48, 1, 0]  # the OOM record's bytes count as its own
    assert tree.device_memory_usage.tolist() == [0, 0, 8]
    assert tree.column("event_id").tolist() == [7, 9, 8]  # ids continue after the largest one
    assert tree.synthetic.tolist() == [False, True, True]


def test_profiler_step_names_fold_in_key_but_not_in_trace_name() -> None:
    specs = [
        {
            "name": f"ProfilerStep#{i}",
            "kind": EventKind.USER_ANNOTATION,
            "start_ns": 100 * i,
            "dur_ns": 50,
            "thread": 1,
            "correlation_id": i + 1,
        }
        for i in range(3)
    ]
    tree = our_tree(specs, None)
    assert [tree.keys[k] for k in tree.key] == ["ProfilerStep*"] * 3
    assert [tree.trace_names[k] for k in tree.trace_name] == [
        "ProfilerStep#0",
        "ProfilerStep#1",
        "ProfilerStep#2",
    ]


# ------------------------------------------------------- torch releases


def _op(name: str, start: int, dur: int, corr: int, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": EventKind.CPU_OP,
        "start_ns": start,
        "dur_ns": dur,
        "thread": 1,
        "correlation_id": corr,
        **more,
    }


def _kernel(start: int, dur: int, linked: int, device_type: int = 1) -> dict[str, Any]:
    return {
        "name": "gemm",
        "kind": EventKind.KERNEL,
        "start_ns": start,
        "dur_ns": dur,
        "thread": 50,
        "device_type": device_type,
        "linked_correlation_id": linked,
    }


#: Devices whose memory records count as device memory: before 2.8 XPU's did not (DEVICES order).
BEFORE_2_8 = (DeviceType.CUDA, DeviceType.HIP, DeviceType.PrivateUse1)
FROM_2_8 = (DeviceType.CUDA, DeviceType.HIP, DeviceType.XPU, DeviceType.PrivateUse1)


@pytest.mark.parametrize(
    ("minor", "expected"),
    [
        (6, dict(overload_names=False, device_memory_devices=BEFORE_2_8, memory_window_through_us=True)),
        (
            7,
            dict(
                overload_names=True,
                device_memory_devices=BEFORE_2_8,
                memory_units=("Gb", "Mb", "Kb", "b"),
            ),
        ),
        (8, dict(device_memory_devices=FROM_2_8, memory_units=("GB", "MB", "KB", "B"))),
        (10, dict(memory_window_through_us=True, overhead_launches_nothing=False)),
        (11, dict(memory_window_through_us=False, key_averages_skips_python_functions=False)),
        (13, dict(overhead_launches_nothing=False, launcher_needs_external_id=False)),
        (
            14,
            dict(
                overhead_launches_nothing=True,
                launcher_needs_external_id=False,
                key_averages_skips_python_functions=True,
            ),
        ),
        (
            15,
            dict(
                overhead_launches_nothing=False,
                launcher_needs_external_id=True,
                key_averages_skips_python_functions=True,
            ),
        ),
        (
            16,
            dict(
                overhead_launches_nothing=False,
                launcher_needs_external_id=True,
                device_memory_devices=FROM_2_8,
            ),
        ),
    ],
)
def test_rules_of_each_release(minor: int, expected: dict[str, Any]) -> None:
    rules = PostProcessingRules.for_torch(2, minor)
    assert rules.torch_minor == (2, minor)
    for name, value in expected.items():
        assert getattr(rules, name) == value, name


def test_installed_rules_ask_the_installed_torch() -> None:
    assert RULES.torch_minor == FEATURES.minor
    assert RULES.overload_names == FEATURES.has_accessor("overload_name")
    assert RULES == PostProcessingRules.for_torch(*FEATURES.minor)  # the accessor agrees with the version
    assert PostProcessingRules.newest() == PostProcessingRules.for_torch(*torch_support.SUPPORTED_MAX)


def test_rules_without_importing_torch_come_from_its_metadata() -> None:
    import subprocess

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from polyprof.analysis.tree import post_processing_rules\n"
        "print(post_processing_rules().torch_minor)\n"
        "assert sys.modules['torch'] is None\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(FEATURES.minor)


def test_rules_without_torch_installed_are_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def no_torch(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(importlib.metadata, "version", no_torch)
    tree_module._installed_torch_version.cache_clear()
    try:
        assert post_processing_rules() == PostProcessingRules.newest()
    finally:
        tree_module._installed_torch_version.cache_clear()


def test_rules_must_be_rules() -> None:
    with pytest.raises(TypeError, match="PostProcessingRules"):
        our_tree([_op("a", 0, 10, 1)], None, rules=(2, 6))  # type: ignore[arg-type]


@settings(max_examples=examples(300), deadline=None)
@given(
    st.one_of(
        st.integers(0, 10**7), st.integers(TRACE_START - 10**12, TRACE_START + 10**12), st.integers(0, 2**62)
    )
)
def test_through_us_is_pythons_float_round_trip(ns: int) -> None:
    ours = _through_us(np.array([ns], dtype=np.int64))
    assert float(ours[0]) == ns / 1000 * 1000


def test_memory_window_is_rounded_through_microseconds_before_2_11() -> None:
    # The op starts 100 ns into a trace at 1.7e18 ns; torch < 2.11 rounds that bound to the
    # nearest double (multiples of 256 ns here), so a record 50 ns before the op is the op's.
    specs = [
        _op("aten::empty", 100, 1000, 1),
        {"name": "[memory]", "kind": EventKind.MEMORY, "start_ns": 50, "thread": 1, "nbytes": 64},
    ]
    assert_same_as_torch(our_tree(specs, None), torch_events(specs, None))
    rounded = our_tree(specs, None, rules=PostProcessingRules.for_torch(2, 10))
    exact = our_tree(specs, None, rules=PostProcessingRules.for_torch(2, 11))
    assert rounded.cpu_memory_usage.tolist() == [64]
    assert [exact.keys[k] for k in exact.key] == ["[memory]", "aten::empty"]
    assert exact.cpu_memory_usage.tolist() == [64, 0]  # a top-level [memory] row of its own
    assert (
        our_tree(specs, None).cpu_memory_usage.tolist()
        == (rounded if RULES.memory_window_through_us else exact).cpu_memory_usage.tolist()
    )


def test_xpu_memory_counts_as_device_memory_from_2_8() -> None:
    specs = [
        _op("aten::empty", 0, 1000, 1),
        {
            "name": "[memory]",
            "kind": EventKind.MEMORY,
            "start_ns": 10,
            "thread": 1,
            "nbytes": 512,
            "device_type": int(DeviceType.XPU),
        },
    ]
    assert_same_as_torch(our_tree(specs, "xpu"), torch_events(specs, "xpu"))
    assert our_tree(specs, "xpu", PostProcessingRules.for_torch(2, 7)).device_memory_usage.tolist() == [0]
    assert our_tree(specs, "xpu", PostProcessingRules.for_torch(2, 8)).device_memory_usage.tolist() == [512]


def test_which_rows_launch_device_work_follows_each_release() -> None:
    # An overhead row and an op without an external id, each with a kernel linked to its id.
    specs = [
        dict(_op("aten::mm", 0, 100, 1), external_id=1),
        dict(_op("aten::add", 200, 100, 2), external_id=0),
        {
            "name": "Activity Buffer Request",
            "kind": EventKind.OVERHEAD,
            "start_ns": 400,
            "dur_ns": 50,
            "thread": 1,
            "correlation_id": 3,
            "external_id": 3,
        },
        dict(_kernel(1000, 7, 1), external_id=1),
        dict(_kernel(1100, 8, 2), external_id=2),
        dict(_kernel(1200, 9, 3), external_id=3),
    ]
    assert_same_as_torch(our_tree(specs, "cuda"), torch_events(specs, "cuda"))

    def launchers(minor: int) -> list[str]:
        tree = our_tree(specs, "cuda", PostProcessingRules.for_torch(2, minor))
        return [tree.keys[tree.key[r]] for r in range(len(tree)) if len(tree.kernels_of(r))]

    assert launchers(13) == ["aten::mm", "aten::add", "Activity Buffer Request"]
    assert launchers(14) == ["aten::mm", "aten::add"]
    assert launchers(15) == ["aten::mm", "Activity Buffer Request"]


def test_xpu_device_rows_are_treated_as_torch_2_11_does_on_every_release() -> None:
    specs = [_op("aten::mm", 0, 100, 1), _kernel(200, 9, 1, device_type=int(DeviceType.XPU))]
    ours = our_tree(specs, "xpu")
    assert ours.kernels_of(0).tolist() == [1]
    kernel_time = float(ours.elapsed_us[1])
    assert kernel_time > 0
    assert ours.device_time_total.tolist() == [kernel_time, kernel_time]
    assert ours.self_device_time_total.tolist() == [kernel_time, kernel_time]
    theirs = torch_events(specs, "xpu")
    if XPU_AS_TORCH:
        assert_same_as_torch(ours, theirs)
    else:
        # torch < 2.11 links no XPU kernel and cannot time XPU rows; polyprof does not copy that
        assert theirs[0].kernels == []
        with pytest.raises(AssertionError):
            theirs[1].device_time_total  # noqa: B018
        assert_same_as_torch(ours, torch_events(torch_view(specs), "xpu"), xpu_as_cuda=True)


# ------------------------------------------------------------- invariants


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_sets(), _use_devices())
def test_tree_invariants(specs: list[dict[str, Any]], use_device: str | None) -> None:
    tree = our_tree(specs, use_device)
    n = len(tree)
    parent = tree.parent
    # Each row is a child of its parent exactly once; children are in row order.
    assert int((parent >= 0).sum()) == len(tree.children)
    for row in range(n):
        kids = tree.children_of(row)
        assert (parent[kids] == row).all() and (np.diff(kids) > 0).all()
        assert (kids > row).all()  # parents come first in torch's order
    # Rows are in torch's order: start ascending, then end descending.
    keys = np.lexsort((np.arange(n), -tree.end_us, tree.start_us))
    assert (keys == np.arange(n)).all()
    # Self time is total minus the children's totals, so it never exceeds the total.
    tol = 1e-9 * max(1.0, float(np.abs(tree.end_us).max(initial=0.0)))
    assert (tree.self_cpu_time_total <= tree.cpu_time_total + tol).all()
    # Over each root's subtree, self times add up to the root's total; memory exactly.
    root_of = np.arange(n)
    while True:
        up = np.where(parent[root_of] >= 0, parent[root_of], root_of)
        if (up == root_of).all():
            break
        root_of = up
    in_tree = (tree.device_type == DeviceType.CPU) & ~tree.is_async
    for root in np.flatnonzero((parent < 0) & in_tree):
        members = root_of == root
        assert abs(tree.self_cpu_time_total[members].sum() - tree.cpu_time_total[root]) <= tol * members.sum()
        assert tree.self_cpu_memory_usage[members].sum() == tree.cpu_memory_usage[root]
        assert tree.self_device_memory_usage[members].sum() == tree.device_memory_usage[root]
    # Rows outside the CPU tree (device work, async ranges) have no self CPU metrics.
    assert (tree.self_cpu_time_total[~in_tree] == 0).all() and (
        tree.cpu_time_total[tree.device_type != 0] == 0
    ).all()
    # Every kernel belongs to at most one op (ids are unique here), is a device row, and is a row of the tree.
    kernels = tree.kernel_rows
    assert len(np.unique(kernels)) == len(kernels)
    assert np.isin(tree.device_type[kernels], [DeviceType.CUDA, DeviceType.XPU, DeviceType.PrivateUse1]).all()
    # Device time: an op's self device time is its own kernels' time; totals add up per root.
    if use_device is None:
        assert not tree.device_time_total.any() and not tree.self_device_time_total.any()
    else:
        own = np.zeros(n)
        np.add.at(own, np.repeat(np.arange(n), np.diff(tree.kernel_indptr)), tree.kernel_durations)
        assert np.allclose(tree.self_device_time_total[in_tree], own[in_tree], rtol=1e-9, atol=1e-9)
        for root in np.flatnonzero((parent < 0) & in_tree):
            members = root_of == root
            assert np.isclose(own[members].sum(), tree.device_time_total[root], rtol=1e-9, atol=1e-9)
        devices = ~in_tree & (tree.device_type != DeviceType.CPU) & ~tree.is_async
        timed = devices & np.isin(tree.device_type, [1, 12, 19, 20])
        assert (tree.device_time_total[timed] == tree.elapsed_us[timed]).all()


# ------------------------------------------------------------- components


def _torch_stack_walk(
    start: np.ndarray, end: np.ndarray, thread: np.ndarray, eligible: np.ndarray
) -> list[int]:
    """torch's ``_populate_cpu_children`` loop, on plain arrays."""
    parent = [-1] * len(start)
    rows = sorted((i for i in range(len(start)) if eligible[i]), key=lambda i: thread[i])
    for th in sorted(set(thread[rows].tolist())):
        stack: list[int] = []
        for e in sorted((i for i in rows if thread[i] == th), key=lambda i: (start[i], -end[i])):
            while stack:
                p = stack[-1]
                if start[e] >= end[p] or end[e] > end[p]:
                    stack.pop()
                else:
                    parent[e] = p
                    break
            stack.append(e)
    return parent


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 10), st.integers(0, 2), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_parents_follow_torchs_stack_walk_even_for_partial_overlaps(
    rows: list[tuple[int, int, int, bool]],
) -> None:
    start = np.array([r[0] for r in rows], dtype=np.float64)
    end = start + np.array([r[1] for r in rows], dtype=np.float64)
    order = np.lexsort((-end, start))
    start, end = start[order], end[order]
    thread = np.array([rows[i][2] for i in order])
    eligible = np.array([rows[i][3] for i in order])
    assert _populate_parents(start, end, thread, eligible).tolist() == _torch_stack_walk(
        start, end, thread, eligible
    )


def _neumaier(values: list[float]) -> float:
    """CPython 3.12's float ``sum`` (Neumaier), written out."""
    total, comp = 0.0, 0.0
    for x in values:
        t = total + x
        comp += (total - t) + x if abs(total) >= abs(x) else (x - t) + total
        total = t
    return total + comp if comp and np.isfinite(comp) else total


_floats = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False) | st.sampled_from(
    [0.1, 0.2, 0.3, 1e-3, 1e16]
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), _floats), max_size=200))
def test_segment_sums_equal_pythons_sum(pairs: list[tuple[int, float]]) -> None:
    segments = np.array([p[0] for p in pairs], dtype=np.int64)
    values = np.array([p[1] for p in pairs], dtype=np.float64)
    ours = python_sum_by_segment(segments, values, 5)
    with mock.patch.object(tree_module, "_LONG_SEGMENT", 10**9):  # every segment takes the vectorized path
        neumaier = _neumaier_by_segment(segments, values, 5)
    for seg in range(5):
        part = values[segments == seg].tolist()
        assert ours[seg] == sum(part)  # this interpreter's own sum, whichever algorithm it uses
        assert neumaier[seg] == _neumaier(part)


def test_long_segments_use_pythons_own_sum() -> None:
    # Used from 3.12 only, where CPython's sum is the Neumaier sum itself.
    values = np.array([0.1, 1e16, 0.3, -1e16] * 40)
    segments = np.zeros(len(values), dtype=np.int64)
    assert _neumaier_by_segment(segments, values, 1)[0] == sum(values.tolist())
    assert python_sum_by_segment(segments, values, 1)[0] == sum(values.tolist())
    with mock.patch.object(tree_module, "_LONG_SEGMENT", 10**9):
        assert _neumaier_by_segment(segments, values, 1)[0] == _neumaier(values.tolist())


@pytest.mark.parametrize(
    "name",
    ["aten::add", "ProfilerStep#12", "_Z3foov", "t", "_ZN2at6native3addEv", "[memory]", "ProfilerStep"],
)
def test_rewrite_name_matches_torch(name: str) -> None:
    assert rewrite_name(name, with_wildcard=True) == profiler_util._rewrite_name(name, with_wildcard=True)
    assert rewrite_name(name, with_wildcard=False) == profiler_util._rewrite_name(name, with_wildcard=False)


@pytest.mark.parametrize(
    "entry",
    [
        "torch/autograd/__init__.py(200): backward",
        "torch/autograd/__init__.py(88): _make_grads",
        "torch/tensor.py(5): backward",
        "torch/testing/_internal/common_utils.py(1): prof_callable",
        "model.py(3): forward",
        "backward.py(1): main",
    ],
)
def test_filter_stack_entry_matches_torch(entry: str) -> None:
    assert filter_stack_entry(entry) == profiler_util._filter_stack_entry(entry)


def test_filtered_names_match_torch() -> None:
    for name in [*FILTERED_NAMES, "aten::add", "[memory]x"]:
        assert (name in FILTERED_NAMES) == profiler_util._filter_name(name)


def test_use_device_follows_torchs_priority() -> None:
    def config(*acts: ProfilerActivity) -> ProfileConfig:
        return ProfileConfig(activities=set(acts))

    assert use_device_for(config(ProfilerActivity.CPU)) is None
    assert use_device_for(config(ProfilerActivity.CPU, ProfilerActivity.XPU, ProfilerActivity.CUDA)) == "cuda"
    assert use_device_for(config(ProfilerActivity.XPU, ProfilerActivity.HPU)) == "xpu"
    assert use_device_for(config(ProfilerActivity.PrivateUse1)) == "privateuseone"


def test_negative_link_is_a_clear_error() -> None:
    specs = [
        {
            "name": "k",
            "kind": int(EventKind.KERNEL),
            "start_ns": 0,
            "dur_ns": 1,
            "device_type": 1,
            "linked_correlation_id": -3,
        }
    ]
    with pytest.raises(ValueError, match="negative linked_correlation_id"):
        EventTree.from_trace(make_trace(make_event_batch(specs)), use_device="cuda")


def test_use_device_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="use_device"):
        EventTree.from_trace(make_trace(make_event_batch([{"name": "a"}])), use_device=1)  # type: ignore[arg-type]


def test_empty_trace_gives_an_empty_tree() -> None:
    tree = EventTree.from_trace(make_trace(EventBatch.empty("x")), use_device="cuda")
    assert len(tree) == 0 and tree.children_indptr.tolist() == [0] and tree.kernel_indptr.tolist() == [0]
    assert tree.column("event_id").tolist() == []


def test_concat_reindexes_and_keeps_each_trees_rows() -> None:
    a_specs = [
        {
            "name": "x",
            "kind": EventKind.CPU_OP,
            "start_ns": 0,
            "dur_ns": 10,
            "thread": 1,
            "correlation_id": 1,
        },
        {"name": "y", "kind": EventKind.CPU_OP, "start_ns": 2, "dur_ns": 3, "thread": 1, "correlation_id": 2},
        {
            "name": "k",
            "kind": EventKind.KERNEL,
            "start_ns": 20,
            "dur_ns": 3,
            "device_type": 1,
            "linked_correlation_id": 2,
        },
    ]
    b_specs = [
        {"name": "y", "kind": EventKind.CPU_OP, "start_ns": 0, "dur_ns": 4, "thread": 1, "correlation_id": 5},
        {"name": "z", "kind": EventKind.CPU_OP, "start_ns": 1, "dur_ns": 1, "thread": 1, "correlation_id": 6},
    ]
    a, b = our_tree(a_specs, "cuda"), our_tree(b_specs, "cuda")
    both = EventTree.concat([a, b])
    assert len(both) == len(a) + len(b)
    assert [both.keys[k] for k in both.key] == [a.keys[k] for k in a.key] + [b.keys[k] for k in b.key]
    assert both.parent.tolist() == a.parent.tolist() + [
        p + len(a) if p >= 0 else -1 for p in b.parent.tolist()
    ]
    for row in range(len(both)):
        expected = a.children_of(row) if row < len(a) else b.children_of(row - len(a)) + len(a)
        assert both.children_of(row).tolist() == list(expected)
    assert both.kernel_rows.tolist() == a.kernel_rows.tolist()
    assert both.trace_index.tolist() == [0] * len(a) + [1] * len(b)
    assert both.column("event_id").tolist() == a.column("event_id").tolist() + b.column("event_id").tolist()
    with pytest.raises(ValueError, match="use_device"):
        EventTree.concat([a, our_tree(b_specs, None)])


class _CountingProvider:
    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.calls = 0

    def __call__(self) -> tuple[np.ndarray, None]:
        self.calls += 1
        return self.values, None


def test_building_and_summarizing_never_decode_deferred_columns() -> None:
    from polyprof.analysis.averages import summarize

    n = 4
    providers = {
        field: _CountingProvider(np.zeros(n, dtype=dtype))
        for field, dtype in [
            ("correlation_id", np.int64),
            ("tid", np.int64),
            ("flow_id", np.int64),
            ("sequence_nr", np.int64),
            ("fwd_thread", np.int64),
            ("scope", np.int8),
        ]
    }
    batch = EventBatch.build(
        "t",
        {
            "kind": np.zeros(n, dtype=np.int8),
            "name": np.array([0, 1, 0, 1], dtype=np.int32),
            "start_ns": np.array([0, 1, 10, 11]),
            "dur_ns": np.array([5, 2, 5, 2]),
        },
        {"name": ("outer", "inner")},
        providers,
    )
    tree = tree_for(make_trace(batch), None)
    summary = summarize(tree)
    assert summary.count.tolist() == [2, 2]
    assert all(p.calls == 0 for p in providers.values())
    # A view's id reads the deferred correlation ids, once.
    assert tree.column("event_id").tolist() == [0, 0, 0, 0]
    tree.column("event_id")
    assert providers["correlation_id"].calls == 1


def test_lazy_column_names_are_checked() -> None:
    tree = our_tree([{"name": "a", "kind": EventKind.CPU_OP, "start_ns": 0, "dur_ns": 1}], None)
    with pytest.raises(KeyError, match="lazy columns"):
        tree.column("key")
    assert set(LAZY_COLUMNS) >= {"event_id", "scope", "sequence_nr"}


def test_tree_for_builds_from_the_trace_alone() -> None:
    """No module cache: each call builds the trace's own tree, so no caller can plant another one."""
    trace = make_trace(make_event_batch([{"name": "a", "start_ns": 0, "dur_ns": 5}]))
    first, second = tree_for(trace, None), tree_for(trace, None)
    assert first is not second
    assert first.key.tolist() == second.key.tolist() and first.end_us.tolist() == second.end_us.tolist()
    assert tree_for(trace, "cuda").use_device == "cuda"
    assert not hasattr(tree_module, "_cache") and not hasattr(tree_module, "remember_tree")


def test_merged_trace_tree_is_its_cycles_trees_concatenated() -> None:
    """torch lists acc_events cycle by cycle, each timed from its own start: not one tree of all events."""
    cycles = tuple(
        make_trace(
            make_event_batch(
                [
                    {"name": "outer", "start_ns": base, "dur_ns": 10_000, "thread": 1},
                    {"name": "inner", "start_ns": base + 1_000, "dur_ns": 3_000, "thread": 1},
                ]
            ),
            start_ns=base,
        )
        for base in (1_000_000, 0)  # newest first
    )
    merged = MergedTrace(
        events=concat([c.events for c in cycles], source="merged"),
        config=cycles[0].config,
        start_ns=0,
        end_ns=1_010_000,
        pid=1,
        cycles=cycles,
    )
    tree = tree_for(merged, None)
    expected = EventTree.concat([EventTree.from_trace(c, use_device=None) for c in cycles])
    assert tree.start_us.tolist() == expected.start_us.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert tree.parent.tolist() == expected.parent.tolist() == [-1, 0, -1, 2]
    assert tree.trace_index.tolist() == [0, 0, 1, 1]
    # The merged events as one trace would time the older cycle from the newer one's start.
    assert EventTree.from_trace(merged, use_device=None).start_us.tolist() != tree.start_us.tolist()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="checks the sequential path used before 3.12")
def test_sequential_sum_is_bincount_before_312() -> None:
    values = np.array([0.1, 0.2, 0.3])
    assert python_sum_by_segment(np.zeros(3, dtype=np.int64), values, 1)[0] == (0.1 + 0.2) + 0.3
