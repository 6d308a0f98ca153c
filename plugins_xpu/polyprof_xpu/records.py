"""PTI View record layouts, as numpy dtypes at the C structs' byte offsets.

Offsets are those of ``pti_view.h`` (PTI 0.11 to 1.x, x86-64). PTI >= 0.18
writes wider "v2" records whose first bytes are the v1 struct, so only the v1
prefix is described here and a record's size is never used to step through a
buffer: ``ptiViewGetNextRecord`` does that. Each dtype lists just the fields
polyprof reads; ``itemsize`` is the v1 size, the bytes gathered per record.
"""

from __future__ import annotations

import enum

import numpy as np


class ViewKind(enum.IntEnum):
    """``pti_view_kind`` (values stable since PTI 0.9; names as of 0.11)."""

    INVALID = 0
    DEVICE_GPU_KERNEL = 1
    DEVICE_CPU_KERNEL = 2
    DRIVER_API = 3
    RESERVED = 4
    COLLECTION_OVERHEAD = 5
    RUNTIME_API = 6
    EXTERNAL_CORRELATION = 7
    DEVICE_GPU_MEM_COPY = 8
    DEVICE_GPU_MEM_FILL = 9
    DEVICE_GPU_MEM_COPY_P2P = 10
    DEVICE_SYNCHRONIZATION = 11
    COMMUNICATION = 12


class PtiResult(enum.IntEnum):
    """``pti_result`` values the plugin tells apart."""

    SUCCESS = 0
    STATUS_END_OF_BUFFER = 1
    ERROR_NOT_IMPLEMENTED = 2
    ERROR_BAD_ARGUMENT = 3
    ERROR_NO_CALLBACKS_SET = 4
    ERROR_EXTERNAL_ID_QUEUE_EMPTY = 5
    ERROR_BAD_TIMESTAMP = 6
    ERROR_BAD_API_ID = 7
    ERROR_NO_GPU_VIEWS_ENABLED = 8
    ERROR_DRIVER = 50
    ERROR_TRACING_NOT_INITIALIZED = 51
    ERROR_L0_LOCAL_PROFILING_NOT_SUPPORTED = 52
    ERROR_INTERNAL = 200


def result_name(code: int) -> str:
    """``PTI_ERROR_NOT_IMPLEMENTED (2)`` style text for any code."""
    try:
        return f"PTI_{PtiResult(code).name} ({code})"
    except ValueError:
        return f"pti_result {code}"


#: ``pti_view_memory_type`` strings, as ``ptiViewMemoryTypeToString`` prints them (PTI 1.2.0).
MEMORY_TYPE_NAMES = ("Host (User Allocated)", "Host (Driver Allocated)", "Device", "Shared")
#: ``pti_view_memcpy_type`` strings: M2M, M2H, ... S2S (source letter, '2', destination letter).
MEMCPY_TYPE_NAMES = tuple(f"{a}2{b}" for a in "MHDS" for b in "MHDS")
#: ``pti_view_overhead_kind`` strings (PTI 1.2.0 ``ptiViewOverheadKindToString``).
OVERHEAD_KIND_NAMES = ("INVALID", "UNKNOWN", "RESOURCE", "BUFFER_FLUSH", "BUFFER_DRIVER", "Instrumentation")
#: Kineto's event names for overhead records, by overhead kind.
OVERHEAD_EVENT_NAMES = (
    "Overhead",
    "Overhead",
    "Resource Overhead",
    "Buffer Flush",
    "Driver Overhead",
    "Instrumentation",
)
#: ``pti_view_synchronization_type``: which ones happen on the GPU (a barrier in a queue).
SYNC_TYPE_NAMES = (
    "Unknown",
    "GPU Barrier Execution",
    "GPU Barrier Memory",
    "Host Fence",
    "Host Event",
    "Host Command List",
    "Host Command Queue",
)
GPU_SYNC_TYPES = (1, 2)
#: ``pti_api_group_id``.
API_GROUP_LEVELZERO = 1
API_GROUP_SYCL = 3
#: ``PTI_INVALID_QUEUE_ID``: the SYCL queue id of work not submitted through SYCL.
INVALID_SYCL_QUEUE_ID = 2**64 - 2


def _dtype(itemsize: int, fields: dict[str, tuple[str, int]]) -> np.dtype:
    return np.dtype(
        {
            "names": list(fields),
            "formats": [f for f, _ in fields.values()],
            "offsets": [o for _, o in fields.values()],
            "itemsize": itemsize,
        }
    )


#: pti_view_record_kernel (v1 168 bytes; v2 184).
KERNEL = _dtype(
    168,
    {
        "kind": ("<u4", 0),
        "queue_handle": ("<u8", 8),
        "context_handle": ("<u8", 16),
        "name": ("<u8", 24),
        "source_file_name": ("<u8", 32),
        "source_line_number": ("<u8", 40),
        "kernel_id": ("<u8", 48),
        "correlation_id": ("<u4", 56),
        "thread_id": ("<u4", 60),
        "pci_address": ("S16", 64),
        "device_uuid": ("V16", 80),
        "append_timestamp": ("<u8", 96),
        "start_timestamp": ("<u8", 104),
        "end_timestamp": ("<u8", 112),
        "submit_timestamp": ("<u8", 120),
        "sycl_task_begin_timestamp": ("<u8", 128),
        "sycl_enqk_begin_timestamp": ("<u8", 136),
        "sycl_node_id": ("<u8", 144),
        "sycl_queue_id": ("<u8", 152),
        "sycl_invocation_id": ("<u4", 160),
    },
)

#: pti_view_record_memory_copy (v1 136 bytes; v2 152).
MEMORY_COPY = _dtype(
    136,
    {
        "kind": ("<u4", 0),
        "memcpy_type": ("<u4", 4),
        "mem_src": ("<u4", 8),
        "mem_dst": ("<u4", 12),
        "queue_handle": ("<u8", 16),
        "context_handle": ("<u8", 24),
        "name": ("<u8", 32),
        "pci_address": ("S16", 40),
        "device_uuid": ("V16", 56),
        "mem_op_id": ("<u8", 72),
        "correlation_id": ("<u4", 80),
        "thread_id": ("<u4", 84),
        "append_timestamp": ("<u8", 88),
        "start_timestamp": ("<u8", 96),
        "end_timestamp": ("<u8", 104),
        "submit_timestamp": ("<u8", 112),
        "bytes": ("<u8", 120),
        "sycl_queue_id": ("<u8", 128),
    },
)

#: pti_view_record_memory_copy_p2p (v1 168 bytes; v2 192). The source device owns the row.
MEMORY_COPY_P2P = _dtype(
    168,
    {
        "kind": ("<u4", 0),
        "memcpy_type": ("<u4", 4),
        "mem_src": ("<u4", 8),
        "mem_dst": ("<u4", 12),
        "queue_handle": ("<u8", 16),
        "context_handle": ("<u8", 24),
        "name": ("<u8", 32),
        "src_pci_address": ("S16", 40),
        "dst_pci_address": ("S16", 56),
        "device_uuid": ("V16", 72),  # _src_uuid
        "dst_uuid": ("V16", 88),
        "mem_op_id": ("<u8", 104),
        "correlation_id": ("<u4", 112),
        "thread_id": ("<u4", 116),
        "append_timestamp": ("<u8", 120),
        "start_timestamp": ("<u8", 128),
        "end_timestamp": ("<u8", 136),
        "submit_timestamp": ("<u8", 144),
        "bytes": ("<u8", 152),
        "sycl_queue_id": ("<u8", 160),
    },
)

#: pti_view_record_memory_fill (v1 136 bytes; v2 152).
MEMORY_FILL = _dtype(
    136,
    {
        "kind": ("<u4", 0),
        "mem_type": ("<u4", 4),
        "queue_handle": ("<u8", 8),
        "context_handle": ("<u8", 16),
        "name": ("<u8", 24),
        "pci_address": ("S16", 32),
        "device_uuid": ("V16", 48),
        "mem_op_id": ("<u8", 64),
        "correlation_id": ("<u4", 72),
        "thread_id": ("<u4", 76),
        "append_timestamp": ("<u8", 80),
        "start_timestamp": ("<u8", 88),
        "end_timestamp": ("<u8", 96),
        "submit_timestamp": ("<u8", 104),
        "bytes": ("<u8", 112),
        "value_for_set": ("<u8", 120),
        "sycl_queue_id": ("<u8", 128),
    },
)

#: pti_view_record_api (48 bytes): kinds DRIVER_API and RUNTIME_API, PTI >= 0.11.
API = _dtype(
    48,
    {
        "kind": ("<u4", 0),
        "start_timestamp": ("<u8", 8),
        "end_timestamp": ("<u8", 16),
        "api_group": ("<u4", 24),
        "api_id": ("<u4", 28),
        "process_id": ("<u4", 32),
        "thread_id": ("<u4", 36),
        "correlation_id": ("<u4", 40),
        "return_code": ("<u4", 44),
    },
)

#: pti_view_record_synchronization (72 bytes), PTI >= 0.12.
SYNCHRONIZATION = _dtype(
    72,
    {
        "kind": ("<u4", 0),
        "synch_type": ("<u4", 4),
        "context_handle": ("<u8", 8),
        "queue_handle": ("<u8", 16),
        "event_handle": ("<u8", 24),
        "start_timestamp": ("<u8", 32),
        "end_timestamp": ("<u8", 40),
        "thread_id": ("<u4", 48),
        "correlation_id": ("<u4", 52),
        "number_wait_events": ("<u4", 56),
        "return_code": ("<u4", 60),
        "api_id": ("<u4", 64),
        "api_group": ("<u4", 68),
    },
)

#: pti_view_record_overhead (56 bytes).
OVERHEAD = _dtype(
    56,
    {
        "kind": ("<u4", 0),
        "start_timestamp": ("<u8", 8),
        "end_timestamp": ("<u8", 16),
        "thread_id": ("<u4", 24),
        "api_id": ("<u4", 28),
        "overhead_count": ("<u8", 32),
        "overhead_duration_ns": ("<u8", 40),
        "overhead_kind": ("<u4", 48),
    },
)

#: pti_view_record_external_correlation (24 bytes).
EXTERNAL_CORRELATION = _dtype(
    24,
    {
        "kind": ("<u4", 0),
        "correlation_id": ("<u4", 4),
        "external_id": ("<u8", 8),
        "external_kind": ("<u4", 16),
    },
)

#: Record kind -> the dtype of its v1 prefix.
DTYPES: dict[ViewKind, np.dtype] = {
    ViewKind.DEVICE_GPU_KERNEL: KERNEL,
    ViewKind.DEVICE_GPU_MEM_COPY: MEMORY_COPY,
    ViewKind.DEVICE_GPU_MEM_COPY_P2P: MEMORY_COPY_P2P,
    ViewKind.DEVICE_GPU_MEM_FILL: MEMORY_FILL,
    ViewKind.DRIVER_API: API,
    ViewKind.RUNTIME_API: API,
    ViewKind.DEVICE_SYNCHRONIZATION: SYNCHRONIZATION,
    ViewKind.COLLECTION_OVERHEAD: OVERHEAD,
    ViewKind.EXTERNAL_CORRELATION: EXTERNAL_CORRELATION,
}

#: The kinds the tracer enables, and the PTI version each first appeared in (ptiVersion()).
TRACED_KINDS: dict[ViewKind, tuple[int, int]] = {
    ViewKind.DEVICE_GPU_KERNEL: (0, 9),
    ViewKind.DEVICE_GPU_MEM_COPY: (0, 9),
    ViewKind.DEVICE_GPU_MEM_FILL: (0, 9),
    ViewKind.DEVICE_GPU_MEM_COPY_P2P: (0, 10),
    ViewKind.DRIVER_API: (0, 11),
    ViewKind.RUNTIME_API: (0, 11),
    ViewKind.DEVICE_SYNCHRONIZATION: (0, 12),
    ViewKind.COLLECTION_OVERHEAD: (0, 9),
}

#: Oldest PTI whose records these layouts describe (kind 6 had another layout before 0.11).
MIN_PTI_VERSION = (0, 11)


def gather(buffer: np.ndarray, offsets: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Records of one kind at byte ``offsets`` of ``buffer`` (uint8), copied once into a structured array."""
    if not len(offsets):
        return np.zeros(0, dtype=dtype)
    index = offsets[:, None] + np.arange(dtype.itemsize, dtype=np.int64)
    return np.ascontiguousarray(buffer[index]).view(dtype).reshape(len(offsets))
