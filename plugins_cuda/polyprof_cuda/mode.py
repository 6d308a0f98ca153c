"""Which way polyprof-cuda records CUDA in this process, and why: one owner of CUPTI.

* **kineto**: torch is a CUDA build. Its Kineto takes CUPTI as soon as
  torch's collector is prepared, even for CPU only, so polyprof-cuda never
  calls CUPTI: it asks torch's collector for ``ProfilerActivity.CUDA`` and
  decodes the CUDA rows of torch's result (``polyprof_cuda.kineto``).
* **direct**: torch is absent or a CPU build (its Kineto never touches
  CUPTI), cupti-python is installed and CUPTI can run: polyprof's own CUPTI
  tracer (``polyprof_cuda.tracer``).

Deciding never initialises CUDA in the user's process: torch's build is read
from its package files (``polyprof.torch_support.installed_build``) when torch is not imported, and
the direct-mode CUPTI probe runs in a child process (``polyprof_cuda.probe``).
Whether a device is visible in kineto mode is asked when CUDA is recorded,
through ``torch.cuda.is_available()``, as torch.profiler asks it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

import attrs
from polyprof import torch_support
from polyprof.torch_support import TorchBuild

from polyprof_cuda import probe

KINETO: Literal["kineto"] = "kineto"
DIRECT: Literal["direct"] = "direct"

@attrs.frozen
class CudaMode:
    """The mode, or None with the reason CUDA cannot be recorded here."""

    kind: Literal["kineto", "direct"] | None
    #: For a mode, what ``polyprof plugins`` shows; else why CUDA is unavailable.
    detail: str


_lock = threading.Lock()
_cached: dict[str, CudaMode] = {}


def current_mode() -> CudaMode:
    """The mode of this process (cached: torch's build and the driver do not change mid-run)."""
    with _lock:
        if "mode" not in _cached:
            _cached["mode"] = choose_mode(torch_support.installed_build(), probe.unavailable_reason)
        return _cached["mode"]


def forget_cached_mode() -> None:
    with _lock:
        _cached.clear()


def choose_mode(torch_build: TorchBuild | None, direct_probe: Callable[[], str | None]) -> CudaMode:
    """The mode for ``torch_build``; ``direct_probe()`` (None or a reason) is called only when needed."""
    if torch_build is not None and torch_build.cuda:
        return CudaMode(KINETO, f"via torch's Kineto (torch {torch_build.version}, CUDA {torch_build.cuda})")
    reason = direct_probe()
    if reason is not None:
        return CudaMode(None, reason)
    why = "torch is not installed" if torch_build is None else f"torch {torch_build.version} is not a CUDA build"
    return CudaMode(DIRECT, f"direct CUPTI ({why})")
