"""IPEX legacy profiler guide, "Use Tool": profile two ops and print the averages table.

Run: ``python -m polyprof run use_tool.py`` (the shims make
``torch.autograd.profiler_legacy.profile`` polyprof's ``polyprof.legacy.profile``).

Adapted for a machine without an Intel GPU; the profiler calls are the guide's otherwise:

* ``import intel_extension_for_pytorch`` is dropped (polyprof needs no IPEX build).
* ``device='xpu:0'`` became ``device='cpu'``.
* ``use_xpu=True`` became ``use_xpu=False``: with ``use_xpu=True`` and no ``polyprof-xpu``
  plugin installed, polyprof raises ``ActivityUnavailableError`` naming ``polyprof-xpu``
  (see ``xpu_without_plugin.py``); torch's own legacy profiler has no ``use_xpu`` at all.
  On an XPU machine with ``pip install polyprof-xpu``, keep ``use_xpu=True`` and the table gains
  ``Self XPU``, ``Self XPU %``, ``XPU total`` and ``XPU time avg`` columns.
* The last line, which prints the profiler's class, is added to show whose profiler ran.
"""

# import all necessary libraries
import torch

# these lines won't be profiled before enabling profiler tool
input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")

# enable legacy profiler tool with a `with` statement
with torch.autograd.profiler_legacy.profile(use_xpu=False) as prof:
    # do what you want to profile here after the `with` statement with proper indent
    output_tensor_1 = torch.nonzero(input_tensor)
    output_tensor_2 = torch.unique(input_tensor)

# print the result table formatted by the legacy profiler tool as your wish
print(prof.key_averages().table())

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
