"""Which CUDA API calls are recorded: Kineto's default filters, by name.

Kineto filters at two points, and so does polyprof-cuda:

* at enable time, CUPTI is told not to record a few very frequent calls at all
  (``activity_enable_runtime_api(cbid, 0)``): ``cudaGetDevice`` and the driver's
  ``cuKernelGetAttribute``, ``cuDevicePrimaryCtxGetState``, ``cuCtxGetCurrent``;
* while decoding, runtime calls on a blocklist are dropped, and of the driver
  calls only launches and virtual-memory calls are kept (libkineto's
  ``CuptiCbidRegistry``). The driver list grows when the runtime domain is
  unavailable (cupti-python 12.x rejects ``ActivityKind.RUNTIME``): then the
  driver's copies, memsets, launches and synchronisations stand in for the
  runtime calls, so device work still has a host call to attribute it by.

Names are matched without CUPTI's ``_v7000`` version suffix; a name also
matches its ``_ptsz`` / ``_v2`` variants.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

import attrs
import numpy as np

#: Not recorded at all (set at enable time).
RUNTIME_DISABLED_AT_SOURCE = ("cudaGetDevice",)
DRIVER_DISABLED_AT_SOURCE = ("cuKernelGetAttribute", "cuDevicePrimaryCtxGetState", "cuCtxGetCurrent")

#: Runtime calls dropped while decoding.
RUNTIME_BLOCKLIST = (
    "cudaGetDevice",
    "cudaSetDevice",
    "cudaGetLastError",
    "cudaEventCreate",
    "cudaEventCreateWithFlags",
    "cudaEventDestroy",
)
#: Driver calls kept while decoding (everything else is dropped).
DRIVER_KEEP = (
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuMemCreate",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemRelease",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
)
#: Driver calls also kept when the runtime domain cannot be recorded.
DRIVER_KEEP_WITHOUT_RUNTIME = re.compile(
    r"^(cuLaunch\w*|cuGraphLaunch\w*|cuMemcpy\w*|cuMemset\w*|cuStreamWaitEvent\w*|\w+Synchronize\w*)$"
)

#: Set to 1 to keep every runtime/driver call CUPTI records (no decode-time filtering).
ENV_ALL_API_CALLS = "POLYPROF_CUDA_ALL_API_CALLS"


def _matches(name: str, wanted: Iterable[str]) -> bool:
    return any(name == w or name.startswith(w + "_") for w in wanted)


@attrs.frozen
class ApiCallFilter:
    """Decode-time filter over (domain, cbid), as sorted arrays for ``np.isin``."""

    #: Runtime cbids dropped.
    runtime_dropped: np.ndarray
    #: Driver cbids kept; None keeps every driver call.
    driver_kept: np.ndarray | None

    @classmethod
    def build(
        cls,
        runtime_names: Mapping[int, str],
        driver_names: Mapping[int, str],
        *,
        runtime_recorded: bool,
        keep_all: bool | None = None,
    ) -> ApiCallFilter:
        if keep_all is None:
            keep_all = os.environ.get(ENV_ALL_API_CALLS, "").strip() in ("1", "true", "yes")
        if keep_all:
            return cls(np.zeros(0, dtype=np.int64), None)
        dropped = [c for c, n in runtime_names.items() if _matches(n, RUNTIME_BLOCKLIST)]
        kept = [
            c
            for c, n in driver_names.items()
            if _matches(n, DRIVER_KEEP) or (not runtime_recorded and DRIVER_KEEP_WITHOUT_RUNTIME.match(n))
        ]
        return cls(np.array(sorted(dropped), dtype=np.int64), np.array(sorted(kept), dtype=np.int64))

    def keep(self, is_runtime: np.ndarray, is_driver: np.ndarray, cbid: np.ndarray) -> np.ndarray:
        """Mask of API records to keep (non-API rows are always kept)."""
        keep = np.ones(len(cbid), dtype=bool)
        if len(self.runtime_dropped):
            keep &= ~(is_runtime & np.isin(cbid, self.runtime_dropped))
        if self.driver_kept is not None:
            keep &= ~(is_driver & ~np.isin(cbid, self.driver_kept))
        return keep


def disabled_at_source(names: Mapping[int, str], wanted: Iterable[str]) -> list[int]:
    """The cbids to switch off at enable time."""
    wanted = tuple(wanted)
    return sorted(c for c, n in names.items() if n in wanted)
