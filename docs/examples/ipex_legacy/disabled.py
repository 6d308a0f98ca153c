"""IPEX legacy profiler guide, "Disable Tool in Model Script": ``enabled=False``.

Run: ``python -m polyprof run disabled.py``. As the guide says, the final ``print`` raises an
error, so the run ends with status 1 and a traceback on stderr. With polyprof the error is
``polyprof.ProfilerDisabledError`` (a ``RuntimeError``) saying "the profiler was disabled
(enabled=False), so it recorded nothing", where torch's legacy profiler gives an
``AttributeError`` on ``None``.

Adapted for a machine without an Intel GPU; the profiler call is the guide's, ``use_xpu=True``
included:

* ``import intel_extension_for_pytorch`` is dropped, and ``device='xpu:0'`` became ``'cpu'``.
* ``use_xpu=True`` is kept: a disabled profile starts no tracer, so it needs no ``polyprof-xpu``
  plugin (an enabled one would raise ``ActivityUnavailableError``, see ``xpu_without_plugin.py``).
* The guide's snippet continues the "Use Tool" script; its setup lines are repeated here, and the
  line that prints the profiler's class is added to show whose profiler ran.
"""

import torch

input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")

with torch.autograd.profiler_legacy.profile(enabled=False, use_xpu=True) as prof:
    # as `enabled` is set to false, the profiler won't work on these lines of code
    output_tensor_1 = torch.nonzero(input_tensor)
    output_tensor_2 = torch.unique(input_tensor)

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")

# This print will raise an error to user as the profiler was disabled
print(prof.key_averages().table())
