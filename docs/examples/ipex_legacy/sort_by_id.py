"""IPEX legacy profiler guide, "Results": ``print(prof.table(sort_by='id'))``.

Run: ``python -m polyprof run sort_by_id.py``. ``prof.table()`` lists every recorded op (not
the averages), and ``sort_by='id'`` orders them by id, descending as torch sorts: the op
called last comes first, so the list is in reverse call order.

Adapted for a machine without an Intel GPU, otherwise the guide's "Use Tool" script:
``import intel_extension_for_pytorch`` is dropped, ``device='xpu:0'`` became ``'cpu'`` and
``use_xpu=True`` became ``use_xpu=False`` (with no ``polyprof-xpu`` plugin installed,
``use_xpu=True`` raises ``ActivityUnavailableError`` naming ``polyprof-xpu``). The line that
prints the profiler's class is added.
"""

import torch

input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")

with torch.autograd.profiler_legacy.profile(use_xpu=False) as prof:
    output_tensor_1 = torch.nonzero(input_tensor)
    output_tensor_2 = torch.unique(input_tensor)

# sort all called operators in reverse order
print(prof.table(sort_by="id"))

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
