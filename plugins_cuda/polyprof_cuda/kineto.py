"""CUDA rows from torch's own collector: the mode for every CUDA build of torch with a device.

torch's Kineto owns CUPTI in such a process (it takes it as soon as torch's
collector is prepared, even for CPU only), so polyprof-cuda never calls
CUPTI itself. It asks torch's collector for ``ProfilerActivity.CUDA``
(``polyprof_torch_collector_activities``) and decodes the CUDA rows of the
raw result on its own bus task: kernels, copies, fills, GPU annotations,
runtime and driver calls, synchronization and CUPTI overhead rows, with the
links torch made through its external correlation. Self CUDA, kernel names
and counts, stream lanes and flows then agree with torch.profiler by
construction.

Which rows are CUDA's: by Kineto's activity type where torch has the
accessor (2.12+; ``claimed_activity_types``). Before 2.12, by device type:
device rows are kernels, copies (``Memcpy ...``), fills (``Memset ...``) or
GPU annotations; the runtime and driver calls and CUPTI's overhead are
CPU-tagged there, told by Kineto's names for them (``host_row_kind``). The
CPU tracer keeps every other row.

Flows: torch 2.13+ gives each row the ``ac2g`` flow Kineto drew for it.
Before, ``kineto_flow`` gives the same from the row's kind and Kineto's name
for it, by libkineto's rules (``RuntimeActivity::flowStart``,
``DriverActivity::flowStart``, ``GpuActivity::flowStart``,
``CudaSyncActivity::flowStart`` and the writer's ``handleActivity``, which
draws a flow event for every activity with a correlation id).
"""

from __future__ import annotations

import os
import re
from typing import Any

from polyprof.plugin import (
    CollectorResult,
    DeviceType,
    EventBatch,
    EventKind,
    ProfilerActivity,
    TorchResultTracer,
    TraceMetadata,
    decode_device_rows,
    kind_by_activity_type,
    kineto_device_reason,
)
from polyprof_cuda.device import DeviceInfo, cuda_initialized

SOURCE = "cuda_kineto"
#: Kineto's activity type -> polyprof's kind, for the rows polyprof-cuda decodes ("kernel",
#: "cuda_runtime", ...): the trace format's table for CUDA.
KIND_BY_ACTIVITY_TYPE: dict[str, EventKind] = kind_by_activity_type(DeviceType.CUDA)
#: CUPTI's overhead records as Kineto names them (``overheadKindString``); "Unknown" is left to
#: the CPU tracer, as an op could be named so.
OVERHEAD_NAMES = frozenset(
    {
        "Driver Compiler",
        "Buffer Flush",
        "Instrumentation",
        "Resource",
        "Runtime Triggered Module Loading",
        "Lazy Function Loading",
        "Command Buffer Full",
        "Activity Buffer Request",
        "UVM Activity Init",
    }
)
#: The CUDA runtime calls whose flow event starts an arrow: libkineto's ``RuntimeActivity::flowStart``
#: (its ``CuptiCbidRegistry`` since 2026, the same list before): the kernel and graph launches, CUPTI's
#: runtime cbids 31 to 52 (``cudaMemcpy`` to ``cudaMemset2DAsync``), the synchronizations and the event
#: wait, and ``cudaLaunchKernelExC`` (CUPTI API 18+). Every other runtime call with a correlation id
#: gets a flow event too, an end that no arrow reaches (``cudaStreamIsCapturing``, ``cudaMalloc``, ...).
FLOW_STARTING_RUNTIME_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchCooperativeKernel",
        "cudaLaunchCooperativeKernelMultiDevice",
        "cudaLaunchKernelExC",
        "cudaGraphLaunch",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaStreamWaitEvent",
        # cbids 31 to 52
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyToArray",
        "cudaMemcpy2DToArray",
        "cudaMemcpyFromArray",
        "cudaMemcpy2DFromArray",
        "cudaMemcpyArrayToArray",
        "cudaMemcpy2DArrayToArray",
        "cudaMemcpyToSymbol",
        "cudaMemcpyFromSymbol",
        "cudaMemcpyAsync",
        "cudaMemcpyToArrayAsync",
        "cudaMemcpyFromArrayAsync",
        "cudaMemcpy2DAsync",
        "cudaMemcpy2DToArrayAsync",
        "cudaMemcpy2DFromArrayAsync",
        "cudaMemcpyToSymbolAsync",
        "cudaMemcpyFromSymbolAsync",
        "cudaMemset",
        "cudaMemset2D",
        "cudaMemsetAsync",
        "cudaMemset2DAsync",
    }
)
#: The driver calls whose flow event starts an arrow (``DriverActivity::flowStart``): Triton's launches.
FLOW_STARTING_DRIVER_CALLS = frozenset({"cuLaunchKernel", "cuLaunchKernelEx"})
#: Device rows whose flow event ends an arrow (``GpuActivity`` and ``CudaSyncActivity``); before torch
#: 2.12 a device-tagged sync row is decoded as a kernel, which ends its arrow all the same.
_FLOW_ENDS = frozenset({EventKind.KERNEL, EventKind.GPU_MEMCPY, EventKind.GPU_MEMSET, EventKind.SYNC})
_RUNTIME_CALL = re.compile(r"cuda[A-Z]")
_DRIVER_CALL = re.compile(r"cu[A-Z]")


def host_row_kind(name: str) -> EventKind | None:
    """Before torch 2.12: a CPU-tagged row of torch's result that is CUDA's, by Kineto's name for it.

    Runtime calls are ``cuda<Name>`` (``cudaLaunchKernel``), driver calls ``cu<Name>``
    (``cuLaunchKernel``): names no aten op or autograd node has.
    """
    if _RUNTIME_CALL.match(name):
        return EventKind.RUNTIME
    if _DRIVER_CALL.match(name):
        return EventKind.DRIVER
    return EventKind.OVERHEAD if name in OVERHEAD_NAMES else None


def kineto_flow(kind: EventKind, name: str) -> bool | None:
    """The ``ac2g`` flow event Kineto's writer draws at a CUDA row of this kind and name, where torch
    does not hand the row's flow over (before 2.13).

    True: it starts an arrow there (a launch, copy, fill or wait call); False: it ends one (device
    work, a sync record, any other runtime or driver call); None: no flow (CUPTI's overhead rows have
    no correlation id, and the GPU spans of ``record_function`` ranges no flow).
    """
    if kind == EventKind.RUNTIME:
        return name in FLOW_STARTING_RUNTIME_CALLS
    if kind == EventKind.DRIVER:
        return name in FLOW_STARTING_DRIVER_CALLS
    return False if kind in _FLOW_ENDS else None


def kineto_mode_reason() -> str | None:
    """None when torch's Kineto can record CUDA in this process, else why not.

    The plugin asks it in Kineto mode only (a CUDA build of torch,
    ``polyprof_cuda.mode``), when CUDA is recorded or torch is loaded, as
    torch.profiler asks it; it never initialises a CUDA context.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return kineto_device_reason(
        "cuda", hint=f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    )


class KinetoCudaTracer(TorchResultTracer):
    """``ProfilerActivity.CUDA`` from torch's collector result."""

    name = SOURCE
    activities = frozenset({ProfilerActivity.CUDA})
    claimed_activity_types = frozenset(KIND_BY_ACTIVITY_TYPE)

    def host_row_kind(self, name: str) -> EventKind | None:
        return host_row_kind(name)

    def __init__(self, device_info: DeviceInfo | None = None) -> None:
        super().__init__()
        self._device_info = device_info if device_info is not None else DeviceInfo()
        self._device_properties: list[dict[str, Any]] = []

    def before_collector_stops(self) -> None:
        # torch.profiler synchronizes the current device before stopping its collector, so the
        # last kernels are in the result; never initialise CUDA for it.
        if cuda_initialized():
            import torch

            torch.cuda.synchronize()

    def stop(self) -> None:
        super().stop()
        # Kineto's deviceProperties, read from torch while CUDA is up (none when it never was)
        self._device_properties = self._device_info.all_properties()

    def trace_metadata(self) -> TraceMetadata:
        return {"device_properties": list(self._device_properties)}

    def decode(self, item: CollectorResult) -> list[EventBatch]:
        batch = decode_cuda_rows(item, pid=os.getpid())
        return [batch] if len(batch) else []


def decode_cuda_rows(result: CollectorResult, *, pid: int) -> EventBatch:
    """The CUDA rows of ``result`` as one batch (``polyprof.plugin.decode_device_rows``)."""
    return decode_device_rows(
        result,
        source=SOURCE,
        device_type=DeviceType.CUDA,
        kind_by_activity_type=KIND_BY_ACTIVITY_TYPE,
        pid=pid,
        host_row_kind=host_row_kind,
        flow_rule=kineto_flow,
    )
