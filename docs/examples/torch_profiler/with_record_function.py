"""PyTorch profiler notes: ``profile`` as a ``with`` block, and a ``record_function`` range.

Run: ``python -m polyprof run with_record_function.py``. As in the notes' output, the table's
first row is the ``model_inference`` range, called once and covering 100% of the CPU total,
followed by the model's ops (``aten::conv2d``, ``aten::batch_norm``, ...).

The notes' code runs unchanged, with two additions: the table is printed with the notes'
``print(...)`` from the demo, and the last line prints the profiler's class. ``torchvision`` is
optional: without it ``models.resnet18()`` becomes a small stand-in with the same kinds of
layers (``_model.py``).
"""

# The guide's code is kept as written (its import order, imports and nesting).
# ruff: noqa: I001, SIM117

import torch
from torch.profiler import profile, record_function, ProfilerActivity

from _model import resnet18_or_stand_in

model = resnet18_or_stand_in()
inputs = torch.randn(5, 3, 224, 224)

with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    with record_function("model_inference"):
        model(inputs)

print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
