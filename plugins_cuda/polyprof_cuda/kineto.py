"""CUDA rows from torch's own collector: the mode for every CUDA build of torch with a device.

torch's Kineto owns CUPTI in such a process (it takes it as soon as torch's
collector is prepared, even for CPU only), so polyprof-cuda never calls
CUPTI there. It asks torch's collector for ``ProfilerActivity.CUDA``
(``polyprof_torch_collector_activities``) and decodes the CUDA rows of the
raw result on its own bus task: kernels, copies, fills, GPU annotations,
runtime and driver calls, synchronization and CUPTI overhead rows, with the
links torch made through its external correlation. Self CUDA, kernel names
and counts, stream lanes and flows then agree with torch.profiler by
construction.

Which rows are CUDA's: by Kineto's activity type where torch has the
accessor (2.12+). Before 2.12, by device type: device rows are kernels,
copies (``Memcpy ...``), fills (``Memset ...``) or GPU annotations; the
runtime and driver calls are CPU-side there and the CPU tracer keeps them
(docs/cuda.md).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity
from polyprof.events import DeviceType, EventBatch, EventKind
from polyprof.torch_result import CollectorResult, TorchResultTracer

from polyprof_cuda.device import cuda_initialized

log = get_logger(__name__)

SOURCE = "cuda_kineto"
#: Kineto's activity type -> polyprof's kind, for the rows polyprof-cuda decodes.
KIND_BY_ACTIVITY_TYPE: dict[str, EventKind] = {
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.GPU_MEMCPY,
    "gpu_memset": EventKind.GPU_MEMSET,
    "gpu_user_annotation": EventKind.GPU_USER_ANNOTATION,
    "cuda_runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.DRIVER,
    "cuda_sync": EventKind.SYNC,
    "overhead": EventKind.OVERHEAD,
}
#: Kinds that happen on the device (pid: device index, tid: stream).
_ON_DEVICE = frozenset(
    {EventKind.KERNEL, EventKind.GPU_MEMCPY, EventKind.GPU_MEMSET, EventKind.GPU_USER_ANNOTATION}
)


def kineto_mode_reason() -> str | None:
    """None when torch's Kineto serves CUDA in this process, else why not.

    Asked only when CUDA is being recorded (torch.profiler asks the same of
    ``torch.cuda.is_available()`` then); it never initialises a CUDA context.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return "torch is not installed"
    cuda_version = getattr(torch.version, "cuda", None)
    if not cuda_version:
        return f"torch {torch.__version__} is not a CUDA build"
    try:
        from torch._C._profiler import ProfilerActivity as TorchActivity

        if not hasattr(TorchActivity, "CUDA"):
            return f"torch {torch.__version__}'s profiler has no CUDA activity"
        if not torch.cuda.is_available():
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return f"torch {torch.__version__} sees no CUDA device{hint}"
    except Exception as exc:  # noqa: BLE001 - a broken CUDA setup is a reason, not a crash
        return f"torch's CUDA check failed: {exc!r}"
    return None


class KinetoCudaTracer(TorchResultTracer):
    """``ProfilerActivity.CUDA`` from torch's collector result."""

    name = SOURCE
    activities = frozenset({ProfilerActivity.CUDA})

    def stop(self) -> None:
        # torch.profiler synchronizes the current device before stopping its collector, so the
        # last kernels are in the result; never initialise CUDA for it.
        if cuda_initialized():
            import torch

            torch.cuda.synchronize()

    def decode(self, item: CollectorResult) -> list[EventBatch]:
        batch = decode_cuda_rows(item, pid=os.getpid())
        return [batch] if len(batch) else []


def _cuda_rows(result: CollectorResult) -> tuple[list[Any], list[EventKind]]:
    events = result.events()
    types = result.activity_types()
    if types is not None:
        picked = [
            (ev, KIND_BY_ACTIVITY_TYPE[t]) for ev, t in zip(events, types, strict=True) if t in KIND_BY_ACTIVITY_TYPE
        ]
    else:
        picked = [(ev, _device_row_kind(ev)) for ev in events if int(ev.device_type()) == int(DeviceType.CUDA)]
    return [ev for ev, _ in picked], [kind for _, kind in picked]


def _device_row_kind(event: Any) -> EventKind:
    """A CUDA device row's kind where torch has no activity type (before 2.12)."""
    if event.is_user_annotation():
        return EventKind.GPU_USER_ANNOTATION
    name = event.name()
    if name.startswith("Memcpy"):
        return EventKind.GPU_MEMCPY
    if name.startswith("Memset"):
        return EventKind.GPU_MEMSET
    return EventKind.KERNEL


def decode_cuda_rows(result: CollectorResult, *, pid: int) -> EventBatch:
    """The CUDA rows of ``result`` as one batch.

    Device rows sit on (device index, stream); runtime, driver, sync and
    overhead rows on (process, OS thread), with torch's small thread id for
    the tree. Links are torch's: ``linked_correlation_id`` is the launching
    op's id, ``correlation_id`` CUPTI's.
    """
    events, kinds = _cuda_rows(result)
    n = len(events)
    if not n:
        return EventBatch.empty(SOURCE)
    kind = np.array([int(k) for k in kinds], dtype=np.int8)
    on_device = np.isin(kind, [int(k) for k in _ON_DEVICE])
    start = np.array([ev.start_ns() for ev in events], dtype=np.int64)
    end = np.array([ev.end_ns() for ev in events], dtype=np.int64)
    device_index = np.array([ev.device_index() for ev in events], dtype=np.int64)
    resource = np.array([_unsigned_bits(ev.device_resource_id()) for ev in events], dtype=np.int64)
    names: dict[str, int] = {}
    name_idx = np.array([names.setdefault(ev.name(), len(names)) for ev in events], dtype=np.int32)
    linked = np.array([ev.linked_correlation_id() for ev in events], dtype=np.int64)
    columns = {
        "kind": kind,
        "name": name_idx,
        "start_ns": start,
        "dur_ns": end - start,
        "pid": np.where(on_device, device_index, pid),
        "tid": resource,
        "thread": np.array([_unsigned_bits(ev.start_thread_id()) for ev in events], dtype=np.int64),
        "is_async": np.array([ev.is_async() for ev in events], dtype=bool),
        "device_type": np.where(on_device, int(DeviceType.CUDA), int(DeviceType.CPU)).astype(np.int8),
        "device_index": np.where(on_device, device_index, 0).astype(np.int32),
        "stream": np.where(on_device, resource, -1),
        "correlation_id": np.array([ev.correlation_id() for ev in events], dtype=np.int64),
        "linked_correlation_id": linked,
        # Kineto's "External id" of a CUDA row is the op it belongs to
        "external_id": np.array([ev.external_id() for ev in events], dtype=np.int64)
        if hasattr(events[0], "external_id")
        else linked,
    }
    return EventBatch.build(SOURCE, columns, {"name": tuple(names)})


def _unsigned_bits(value: int) -> int:
    """An id torch hands out as unsigned 64-bit (an unset thread: 2**64 - 1), as int64 bits."""
    return value - (1 << 64) if value >= 1 << 63 else value
