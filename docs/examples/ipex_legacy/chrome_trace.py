"""IPEX legacy profiler guide, "Export to Chrome Trace": ``prof.export_chrome_trace(...)``.

Run: ``python -m polyprof run chrome_trace.py``. It writes ``trace_file.json`` in the current
directory: the legacy profiler's Chrome trace, a JSON array of ``"ph": "X"`` events, one per
op, which ``chrome://tracing`` and https://ui.perfetto.dev open. polyprof writes it atomically.

Adapted for a machine without an Intel GPU, otherwise the guide's "Use Tool" script:
``import intel_extension_for_pytorch`` is dropped, ``device='xpu:0'`` became ``'cpu'`` and
``use_xpu=True`` became ``use_xpu=False`` (with no ``polyprof-xpu`` plugin installed,
``use_xpu=True`` raises ``ActivityUnavailableError`` naming ``polyprof-xpu``). The last line,
which prints the profiler's class, is added.
"""

import torch

input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")

with torch.autograd.profiler_legacy.profile(use_xpu=False) as prof:
    output_tensor_1 = torch.nonzero(input_tensor)
    output_tensor_2 = torch.unique(input_tensor)

prof.export_chrome_trace("trace_file.json")

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
