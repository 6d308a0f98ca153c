"""IPEX Kineto-supported profiler guide, "Profile on Multi-device Application".

Run: ``python -m polyprof run multi_device.py``. It writes
``trace_example_on_multi_device.json`` in the current directory: a Kineto-shaped Chrome trace
(``{"traceEvents": [...], ...}``) with both additions.

Adapted for a machine without two Intel GPUs; the profiler calls are the guide's otherwise:

* The two devices ``"xpu:0"`` and ``"xpu:1"`` both became ``"cpu"``, the guide's
  ``assert torch.xpu.device_count() > 1`` is dropped, and ``torch.xpu.synchronize(device)``
  became ``torch.cpu.synchronize(device)`` (which returns at once: CPU ops are synchronous).
* ``activities=[torch.profiler.ProfilerActivity.XPU]`` became ``[...ProfilerActivity.CPU]``:
  with no ``polyprof-xpu`` plugin installed, XPU raises ``ActivityUnavailableError`` naming
  ``polyprof-xpu``. With the plugin on a machine with two XPUs, the guide's code runs as
  written and the kernels of each device are on their own ``XPU <n>`` lanes of the trace.
* The last line, which prints the profiler's class, is added.
"""

import torch

# put first input on the first device ("xpu:0" in the guide)
a_0 = torch.randn(100).to(torch.device("cpu"))
# put second input on the second device ("xpu:1" in the guide)
a_1 = torch.randn(100).to(torch.device("cpu"))

# Start profiler as normal
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    # run kernel on the first device
    b_0 = a_0 + a_0
    # run kernel on the second device
    b_1 = a_1 + a_1
    # explicitly synchronize all involved devices
    torch.cpu.synchronize(torch.device("cpu"))
    torch.cpu.synchronize(torch.device("cpu"))

# You may check kernels on difference devices from chrome trace
prof.export_chrome_trace("trace_example_on_multi_device.json")

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
