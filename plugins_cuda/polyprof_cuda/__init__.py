"""polyprof-cuda: NVIDIA GPU activity for polyprof through CUPTI (cupti-python).

Install with ``pip install 'polyprof-cuda[cu13]'`` (CUDA 13 driver) or
``'polyprof-cuda[cu12]'``; polyprof then finds it through its entry point and
``ProfilerActivity.CUDA`` records kernels, memcpys, memsets and CUDA API calls.
See docs/cuda.md.
"""

from __future__ import annotations

from polyprof_cuda.cupti_api import CuptiApi, SubscriberConflict
from polyprof_cuda.probe import unavailable_reason
from polyprof_cuda.tracer import CudaTracingUnavailableWarning, CuptiTracer

__version__ = "0.1.0"

__all__ = [
    "CudaTracingUnavailableWarning",
    "CuptiApi",
    "CuptiTracer",
    "SubscriberConflict",
    "__version__",
    "unavailable_reason",
]
