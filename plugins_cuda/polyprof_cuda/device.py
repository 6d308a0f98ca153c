"""Facts about CUDA devices, from torch, for the trace's ``deviceProperties`` (Kineto's keys).

Read only when torch has already initialised CUDA (polyprof-cuda never does) and cached per
device.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from polyprof.plugin import get_logger

log = get_logger(__name__)


def cuda_initialized() -> bool:
    """True when torch is imported and has initialised CUDA in this process."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a CPU build or a broken CUDA: not initialised
        return False


def _kineto_properties(index: int, props: Any) -> dict[str, Any]:
    """One ``deviceProperties`` entry with Kineto's keys (libkineto's ``devicePropertiesJson``)."""

    def get(name: str, default: Any = 0) -> Any:
        return getattr(props, name, default)

    return {
        "id": index,
        "name": str(get("name", "")),
        "totalGlobalMem": int(get("total_memory")),
        "computeMajor": int(get("major")),
        "computeMinor": int(get("minor")),
        "maxThreadsPerBlock": int(get("max_threads_per_block", 1024)),
        "maxThreadsPerMultiprocessor": int(get("max_threads_per_multi_processor")),
        "regsPerBlock": int(get("regs_per_block", get("regs_per_multiprocessor"))),
        "warpSize": int(get("warp_size", 32)),
        "sharedMemPerBlock": int(get("shared_memory_per_block")),
        "numSms": int(get("multi_processor_count")),
        "regsPerMultiprocessor": int(get("regs_per_multiprocessor")),
        "sharedMemPerBlockOptin": int(get("shared_memory_per_block_optin")),
        "sharedMemPerMultiprocessor": int(get("shared_memory_per_multiprocessor")),
    }


class DeviceInfo:
    """Per-device properties, read lazily from torch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._props: dict[int, dict[str, Any] | None] = {}

    def properties(self, index: int) -> dict[str, Any] | None:
        with self._lock:
            if index not in self._props:
                self._props[index] = self._read(index)
            return self._props[index]

    def _read(self, index: int) -> dict[str, Any] | None:
        if not cuda_initialized():
            return None
        try:
            import torch

            return _kineto_properties(index, torch.cuda.get_device_properties(index))
        except Exception:
            log.debug("cuda_device_properties_failed", device=index, exc_info=True)
            return None

    def all_properties(self) -> list[dict[str, Any]]:
        """``deviceProperties`` for every visible device (empty when CUDA is not initialised)."""
        if not cuda_initialized():
            return []
        import torch

        found = (self.properties(i) for i in range(torch.cuda.device_count()))
        return [p for p in found if p is not None]
