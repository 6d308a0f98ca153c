"""IPEX Kineto-supported profiler guide, "Add Profiler Into Script": profile two ops, print the table.

Run: ``python -m polyprof run use_tool.py`` (the shims make ``torch.profiler.profile``, and the
``profile`` imported from it here, polyprof's ``polyprof.profile``).

Adapted for a machine without an Intel GPU; the profiler calls are the guide's otherwise:

* ``import intel_extension_for_pytorch`` is dropped (polyprof needs no IPEX build, and no
  ``IPEX_ZE_TRACING`` variable).
* ``device='xpu:0'`` became ``device='cpu'``.
* ``activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]`` became ``[ProfilerActivity.CPU]``:
  with no ``polyprof-xpu`` plugin installed, asking for XPU raises ``ActivityUnavailableError``
  naming ``polyprof-xpu`` (see ``xpu_without_plugin.py``). On an XPU machine with
  ``pip install polyprof-xpu``, keep ``ProfilerActivity.XPU`` and the table gains ``Self XPU``,
  ``Self XPU %``, ``XPU total`` and ``XPU time avg`` columns.
* The last line, which prints the profiler's class, is added to show whose profiler ran.
"""

# The guide's code is kept as written (its import order, imports and nesting).
# ruff: noqa: I001

# import all necessary libraries
import torch
from torch.profiler import profile, ProfilerActivity

# these lines won't be profiled before enabling profiler tool
input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")

# enable Kineto supported profiler tool with a `with` statement
with profile(activities=[ProfilerActivity.CPU]) as prof:
    # do what you want to profile here after the `with` statement with proper indent
    output_tensor_1 = torch.nonzero(input_tensor)
    output_tensor_2 = torch.unique(input_tensor)

# print the result table formatted by the profiler tool as your wish
print(prof.key_averages().table())

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
