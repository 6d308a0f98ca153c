"""Kineto's activity types as polyprof reads them, checked against Kineto itself.

The GPU plugins' ``KIND_BY_ACTIVITY_TYPE`` and ``polyprof.runtime.torch_result``'s
``HOST_ACTIVITY_TYPES`` come from ``polyprof.base.kineto_format``, so comparing them
with the format module shows nothing. The oracle here is Kineto: its names for
the activity types (libkineto's ``ActivityType.cpp``, the ``cat`` of each event
it writes), the categories of real Kineto GPU traces, and the activity types
the installed torch's collector gives CPU rows.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from polyprof.base import kineto_format
from polyprof.base.events import DeviceType, EventKind
from polyprof.runtime import torch_result

KINETO_GPU_TRACES = sorted((Path(__file__).parent / "data" / "kineto_gpu").glob("*.json.gz"))

#: What libkineto's toString(ActivityType) names each kind a device plugin decodes, per device.
KINETO_DEVICE_ACTIVITY_TYPES = {
    DeviceType.CUDA: {
        "kernel": EventKind.KERNEL,
        "gpu_memcpy": EventKind.GPU_MEMCPY,
        "gpu_memset": EventKind.GPU_MEMSET,
        "gpu_user_annotation": EventKind.GPU_USER_ANNOTATION,
        "cuda_runtime": EventKind.RUNTIME,
        "cuda_driver": EventKind.DRIVER,
        "cuda_sync": EventKind.SYNC,
        "overhead": EventKind.OVERHEAD,
    },
    DeviceType.XPU: {
        "kernel": EventKind.KERNEL,
        "gpu_memcpy": EventKind.GPU_MEMCPY,
        "gpu_memset": EventKind.GPU_MEMSET,
        "gpu_user_annotation": EventKind.GPU_USER_ANNOTATION,
        "xpu_runtime": EventKind.RUNTIME,
        "xpu_driver": EventKind.DRIVER,
        "xpu_sync": EventKind.SYNC,
        "overhead": EventKind.OVERHEAD,
    },
}
#: Kineto's activity types of the host rows torch's collector records itself.
KINETO_HOST_ACTIVITY_TYPES = {"cpu_op", "user_annotation", "python_function", "cpu_instant_event"}


@pytest.mark.parametrize("device", list(KINETO_DEVICE_ACTIVITY_TYPES), ids=lambda d: d.name)
def test_the_formats_device_activity_types_are_kinetos(device: DeviceType) -> None:
    assert kineto_format.kind_by_activity_type(device) == KINETO_DEVICE_ACTIVITY_TYPES[device]


def test_the_cuda_plugin_claims_and_decodes_kinetos_cuda_activity_types() -> None:
    cuda = pytest.importorskip("polyprof_cuda.kineto")
    assert cuda.KIND_BY_ACTIVITY_TYPE == KINETO_DEVICE_ACTIVITY_TYPES[DeviceType.CUDA]
    assert cuda.KinetoCudaTracer.claimed_activity_types == set(KINETO_DEVICE_ACTIVITY_TYPES[DeviceType.CUDA])


def test_the_xpu_plugin_claims_and_decodes_kinetos_xpu_activity_types() -> None:
    xpu = pytest.importorskip("polyprof_xpu.kineto")
    assert xpu.KIND_BY_ACTIVITY_TYPE == KINETO_DEVICE_ACTIVITY_TYPES[DeviceType.XPU]
    assert xpu.KinetoXpuTracer.claimed_activity_types == set(KINETO_DEVICE_ACTIVITY_TYPES[DeviceType.XPU])


def test_the_cpu_tracer_keeps_kinetos_host_activity_types() -> None:
    assert torch_result.HOST_ACTIVITY_TYPES == KINETO_HOST_ACTIVITY_TYPES
    assert not torch_result.HOST_ACTIVITY_TYPES & set(KINETO_DEVICE_ACTIVITY_TYPES[DeviceType.CUDA])


def test_the_device_kinds_are_the_ones_kineto_draws_on_a_device_lane() -> None:
    assert torch_result.ON_DEVICE_KINDS == {
        EventKind.KERNEL,
        EventKind.GPU_MEMCPY,
        EventKind.GPU_MEMSET,
        EventKind.GPU_USER_ANNOTATION,
    }


@pytest.mark.parametrize("path", KINETO_GPU_TRACES, ids=lambda p: p.name)
def test_every_category_of_a_real_kineto_gpu_trace_is_a_host_or_cuda_activity_type(path: Path) -> None:
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    categories = {e["cat"] for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"}
    known = torch_result.HOST_ACTIVITY_TYPES | set(kineto_format.kind_by_activity_type(DeviceType.CUDA))
    assert categories and categories <= known, sorted(categories - known)
    # the rows on a GPU's lanes (pid = device index) are the kinds polyprof puts on a device lane
    cuda = kineto_format.kind_by_activity_type(DeviceType.CUDA)
    host_pids = {e["pid"] for e in events if e.get("cat") == "cpu_op"}
    on_lane = {
        cuda[e["cat"]]
        for e in events
        if e.get("ph") == "X" and e.get("cat") in cuda and e["pid"] not in host_pids
    }
    assert on_lane <= torch_result.ON_DEVICE_KINDS | {EventKind.SYNC}
    assert EventKind.KERNEL in on_lane


def test_torchs_collector_gives_cpu_rows_only_host_activity_types() -> None:
    torch = pytest.importorskip("torch")
    with (
        torch.profiler.profile(profile_memory=True, with_stack=True) as prof,
        torch.profiler.record_function("a range"),
    ):
        torch.ones(64).mul(2)
    events = prof.profiler.kineto_results.events()
    if not events or not hasattr(events[0], "activity_type"):
        pytest.skip(f"torch {torch.__version__} has no _KinetoEvent.activity_type (2.12+)")
    types = {ev.activity_type() for ev in events}
    assert types == KINETO_HOST_ACTIVITY_TYPES
