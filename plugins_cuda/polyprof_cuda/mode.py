"""How polyprof-cuda records CUDA in this process: through torch's Kineto, or not at all.

CUPTI is process-wide, and a CUDA build of torch hands it to its Kineto as soon as torch's
collector is prepared, even for CPU only. So polyprof-cuda never calls CUPTI: it asks torch's
collector for ``ProfilerActivity.CUDA`` and decodes the CUDA rows of its result
(``polyprof_cuda.kineto``). That needs a CUDA build of torch; with a CPU build, or no torch,
CUDA is unavailable, as torch.profiler's is on a CPU build. There is no CUPTI tracer of
polyprof's own: it cannot be made safe with the Python bindings that exist (docs/cuda.md).

Deciding imports neither torch nor libcupti: torch's build is read from its package files
(``polyprof.plugin.installed_build``), the CUPTI version from the metadata of the CUPTI
wheel torch's CUDA wheels pin. Whether a device is visible is asked when CUDA is recorded
(``polyprof_cuda.kineto.kineto_mode_reason``), as torch.profiler asks it.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import os
import threading
from collections.abc import Callable, Mapping
from typing import Literal

import attrs

from polyprof.plugin import TorchBuild, installed_build

KINETO: Literal["kineto"] = "kineto"


@attrs.frozen
class CudaMode:
    """The mode, or None with the reason CUDA cannot be recorded here."""

    kind: Literal["kineto"] | None
    #: For a mode, what ``polyprof plugins`` shows; else why CUDA is unavailable.
    detail: str


_lock = threading.Lock()
_cached: dict[str, CudaMode] = {}


def current_mode() -> CudaMode:
    """The mode of this process (cached: torch's build does not change mid-run)."""
    with _lock:
        if "mode" not in _cached:
            _cached["mode"] = choose_mode(installed_build(), installed_cupti_version)
        return _cached["mode"]


def forget_cached_mode() -> None:
    with _lock:
        _cached.clear()


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_cupti_version(
    cuda: str, version_of: Callable[[str], str | None] = _distribution_version
) -> str | None:
    """The installed CUPTI wheel's version for torch's CUDA ``cuda`` ("13.0"), without loading libcupti.

    torch's CUDA wheels pin ``nvidia-cuda-cupti`` (cu13) or ``nvidia-cuda-cupti-cu12`` / ``-cu11``.
    Only a wheel of torch's CUDA major counts; None when there is none (a CUPTI from a CUDA toolkit,
    conda, or a source build of torch).
    """
    major = cuda.split(".", 1)[0]
    for name in (f"nvidia-cuda-cupti-cu{major}", "nvidia-cuda-cupti"):
        version = version_of(name)
        if version and version.split(".", 1)[0] == major:
            return version
    return None


#: Where an NVIDIA driver shows itself without being loaded: its kernel module's version file and
#: its control device (libcuda is then looked up in the loader's cache).
DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")


def driver_reason(
    environ: Mapping[str, str] = os.environ,
    exists: Callable[[str], bool] = os.path.exists,
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
) -> str | None:
    """Why no GPU can be visible here, from the environment and the driver's files, else None.

    What ``polyprof plugins`` can tell without importing torch (which takes seconds): it never
    loads the driver, so "None" is provisional until torch says whether it sees a GPU.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        # CUDA reads the list up to its first entry that is not a device index or UUID
        first = visible.split(",", 1)[0].strip()
        if not (first.isdigit() or first.startswith(("GPU-", "MIG-"))):
            return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    if any(exists(path) for path in DRIVER_FILES) or find_library("cuda"):
        return None
    return f"no NVIDIA driver found (neither {' nor '.join(DRIVER_FILES)} exists, and no libcuda)"


def choose_mode(torch_build: TorchBuild | None, cupti_version: Callable[[str], str | None]) -> CudaMode:
    """The mode for ``torch_build``; ``cupti_version(cuda)`` names the CUPTI beside it, if known."""
    if torch_build is None:
        return CudaMode(
            None,
            "torch is not installed: polyprof-cuda records CUDA only through torch's Kineto; "
            "install a CUDA build of torch (see docs/cuda.md)",
        )
    if not torch_build.cuda:
        return CudaMode(
            None,
            f"torch {torch_build.version} is not a CUDA build: torch's Kineto cannot record CUDA here; "
            "install a CUDA build of torch (polyprof-cuda records CUDA only through it, see docs/cuda.md)",
        )
    cupti = cupti_version(torch_build.cuda)
    facts = [f"torch {torch_build.version}", f"CUDA {torch_build.cuda}"] + (
        [f"CUPTI {cupti}"] if cupti else []
    )
    return CudaMode(KINETO, f"via torch's Kineto ({', '.join(facts)})")
