"""XPU rows from torch's own collector: how polyprof-xpu records XPU (``polyprof_xpu.mode``).

torch's Kineto owns Intel PTI in an XPU build of torch: its XPU session
registers PTI's callbacks when torch's collector is prepared. So polyprof-xpu
never calls PTI: it asks torch's collector for ``ProfilerActivity.XPU``
(``polyprof_torch_collector_activities``) and decodes the XPU rows of torch's
result (``polyprof.plugin.decode_device_rows``): kernels, copies, fills,
the runtime (SYCL) and driver (Level Zero) calls, synchronization and PTI's
overhead rows, with the links torch made. The CPU tracer leaves those rows
out (``claimed_activity_types``; before torch 2.12, ``host_row_kind``).
Level Zero's tracing layer must be on before the loader starts for PTI to
see anything: ``polyprof_xpu.env`` arranges that.
"""

from __future__ import annotations

import os
import re
import sys

from polyprof.plugin import (
    CollectorResult,
    DeviceType,
    EventBatch,
    EventKind,
    ProfilerActivity,
    TorchResultTracer,
    decode_device_rows,
    kind_by_activity_type,
    kineto_device_reason,
)

SOURCE = "xpu_kineto"
#: Kineto's activity type -> polyprof's kind, for the rows polyprof-xpu decodes ("kernel",
#: "xpu_runtime", ...): the trace format's table for XPU.
KIND_BY_ACTIVITY_TYPE: dict[str, EventKind] = kind_by_activity_type(DeviceType.XPU)
#: Before torch 2.12 (no activity type) the runtime and driver calls are CPU-tagged rows, told
#: apart only by their API names: Unified Runtime (``urEnqueueKernelLaunch``) or, in older SYCL,
#: Plugin Interface (``piEnqueueKernelLaunch``) calls, and Level Zero (``zeCommandListAppend...``).
_RUNTIME_CALL = re.compile(r"(ur|pi)[A-Z]")
_DRIVER_CALL = re.compile(r"ze[A-Z]")


def host_row_kind(name: str) -> EventKind | None:
    """Before torch 2.12: RUNTIME or DRIVER for a SYCL or Level Zero call's row, else None."""
    if _DRIVER_CALL.match(name):
        return EventKind.DRIVER
    if _RUNTIME_CALL.match(name):
        return EventKind.RUNTIME
    return None


def device_reason() -> str | None:
    """None when torch sees an XPU device and its Kineto records XPU, else why not."""
    return kineto_device_reason("xpu")


def _xpu_initialized() -> bool:
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.xpu.is_initialized())
    except Exception:  # noqa: BLE001 - no XPU support in this torch: nothing to wait for
        return False


class KinetoXpuTracer(TorchResultTracer):
    """``ProfilerActivity.XPU`` from torch's collector result."""

    name = SOURCE
    activities = frozenset({ProfilerActivity.XPU})
    claimed_activity_types = frozenset(KIND_BY_ACTIVITY_TYPE)

    def host_row_kind(self, name: str) -> EventKind | None:
        return host_row_kind(name)

    def before_collector_stops(self) -> None:
        # torch.profiler synchronizes XPU before stopping its collector, so the last kernels are
        # in the result; polyprof never initialises the device for it.
        if _xpu_initialized():
            import torch

            torch.xpu.synchronize()

    def decode(self, item: CollectorResult) -> list[EventBatch]:
        batch = decode_xpu_rows(item, pid=os.getpid())
        return [batch] if len(batch) else []


def decode_xpu_rows(result: CollectorResult, *, pid: int) -> EventBatch:
    """The XPU rows of ``result`` as one batch."""
    # Releases before Kineto's XPU branch of deviceTypeFromActivity tag XPU kernels, copies and
    # fills CUDA, and GPU annotations are tagged CUDA in every XPU build: an XPU process has no CUDA.
    return decode_device_rows(
        result,
        source=SOURCE,
        device_type=DeviceType.XPU,
        kind_by_activity_type=KIND_BY_ACTIVITY_TYPE,
        pid=pid,
        also_tagged=frozenset({DeviceType.CUDA}),
        host_row_kind=host_row_kind,
    )
