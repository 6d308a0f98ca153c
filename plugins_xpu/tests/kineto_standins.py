"""Stand-ins for torch's raw collector result of an XPU run (no Intel GPU here).

``KinetoEvent`` is ``polyprof.testing.KinetoEventStandIn`` (every accessor
torch 2.6 to 2.15 has; ``KinetoEvent211``: 2.11's, without ``activity_type``
and ``external_id``),
filled as Kineto's XPU session fills them: an op's SYCL runtime call
(``xpu_runtime``) and Level Zero driver call (``xpu_driver``) launch device
work with the same PTI correlation id, and torch's external correlation links
all of them to the op (``linked_correlation_id``); a host wait (``xpu_sync``)
and a PTI overhead row are there too. These rows are synthetic,
not captured on an Intel GPU.
"""

from __future__ import annotations

from polyprof.base.events import DeviceType
from polyprof.testing import KinetoEventStandIn, KinetoEventStandIn211, RawResultStandIn

PID = 4242
OS_TID = 777
QUEUE = 3  # the SYCL queue id Kineto gives as the device resource ("Stream 3")

#: (name, activity type, XPU index or None for a host row, start ns, end ns, correlation id,
#: linked correlation id, device resource: the queue of a device row, the OS thread of a host row)
ROWS = [
    ("aten::mm", "cpu_op", None, 1_000, 9_000, 1, 0, OS_TID),
    ("urEnqueueKernelLaunch", "xpu_runtime", None, 2_000, 3_000, 101, 1, OS_TID),
    ("zeCommandListAppendLaunchKernel", "xpu_driver", None, 2_200, 2_800, 101, 1, OS_TID),
    ("gemm_kernel", "kernel", 0, 4_000, 54_000, 101, 1, QUEUE),
    ("aten::copy_", "cpu_op", None, 60_000, 70_000, 2, 0, OS_TID),
    ("urEnqueueUSMMemcpy", "xpu_runtime", None, 61_000, 62_000, 102, 2, OS_TID),
    ("Memcpy M2D (Host (User Allocated) -> Device)", "gpu_memcpy", 0, 63_000, 65_000, 102, 2, QUEUE),
    ("zeEventHostSynchronize", "xpu_sync", None, 65_000, 69_000, 104, 2, OS_TID),  # a host wait: no XPU time
    ("aten::fill_", "cpu_op", None, 80_000, 90_000, 3, 0, OS_TID),
    ("urEnqueueUSMFill", "xpu_runtime", None, 81_000, 82_000, 103, 3, OS_TID),
    ("Memset (0 -> Device)", "gpu_memset", 1, 83_000, 83_500, 103, 3, QUEUE),
    ("Buffer Flush", "overhead", None, 91_000, 92_000, 0, 0, OS_TID),  # PTI's own cost
    # A launch outside every op: nothing to link. Its PTI correlation id (2) is also aten::copy_'s
    # op id, a number from another counter: it must not give that op the kernel.
    ("urEnqueueKernelLaunch", "xpu_runtime", None, 95_000, 96_000, 2, 0, OS_TID),
    ("relu_kernel", "kernel", 0, 97_000, 99_000, 2, 0, QUEUE),
]


class KinetoEvent(KinetoEventStandIn):
    """An XPU run's ``_KinetoEvent`` (torch 2.15's accessors) from a ``ROWS`` row."""

    def __init__(self, row: tuple) -> None:
        name, activity_type, index, start, end, corr, linked, resource = row
        super().__init__(
            name,
            activity_type,
            DeviceType.CPU if index is None else DeviceType.XPU,
            PID if index is None else index,
            start,
            end,
            corr,
            linked,
            resource,
        )


class KinetoEvent211(KinetoEventStandIn211, KinetoEvent):
    """The same row as torch 2.11 gives it: no activity_type, no external_id."""


class Raw(RawResultStandIn):
    """A ``_ProfilerResult`` stand-in holding ``rows`` as ``event_type`` events."""

    def __init__(self, rows: list[tuple] = ROWS, event_type: type = KinetoEvent) -> None:
        super().__init__([event_type(row) for row in rows])
