"""PyTorch profiler notes, "Demo": ``profile(...)``, ``start()``, ``stop()``, table and Chrome trace.

Run: ``python -m polyprof run demo_start_stop.py``. It prints the 10 ops with the largest
``CPU total`` (torch's columns: Name, Self CPU %, Self CPU, CPU total %, CPU total,
CPU time avg, # of Calls, and the "Self CPU time total" footer) and writes ``trace.json``, a
Kineto-shaped Chrome trace, in the current directory.

The notes' code runs unchanged, with one exception: ``torchvision`` is optional here. Without
it, ``models.resnet18()`` becomes a small stand-in with the same kinds of layers
(``_model.py``). The last line, which prints the profiler's class, is added.
"""

# The guide's code is kept as written (its import order, imports and nesting).
# ruff: noqa: I001, F401

import torch
from torch.profiler import profile, record_function, ProfilerActivity

from _model import resnet18_or_stand_in

# 创建模型，需要 profile 的对象 (the model, the object to profile)
model = resnet18_or_stand_in()
inputs = torch.randn(5, 3, 224, 224)

# 配置 (configuration)
prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)

prof.start()

model(inputs)

prof.stop()

# 结果分析和输出 (analysis and output)
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))

prof.export_chrome_trace("trace.json")

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
