"""polyprof-cuda: NVIDIA GPU activity for polyprof, from torch's own Kineto collector.

``pip install polyprof-cuda``; polyprof finds it through its entry point. With a CUDA build of
torch, ``ProfilerActivity.CUDA`` then records kernels, copies, memsets, CUDA API calls and
synchronization as torch.profiler does; with a CPU build of torch it is unavailable and says why.
See docs/cuda.md.
"""

from __future__ import annotations

__version__ = "0.2.1"

__all__ = ["__version__"]
