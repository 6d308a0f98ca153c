"""IPEX Kineto-supported profiler guide: a schedule and a trace handler over a loop of iterations.

Run: ``python -m polyprof run schedule_trace_handler.py``. The schedule skips 10 steps, then
twice waits 1, warms up 3 and records 1 step, so the handler runs twice, after steps 14 and 19
(``p.step_num`` is then 15 and 20): it prints a table of at most 10 rows and writes
``trace_15.json`` and ``trace_20.json``, Kineto-shaped Chrome traces, into the temporary
directory.

Adapted for a machine without an Intel GPU; the profiler calls are the guide's otherwise:

* ``activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]`` became ``[ProfilerActivity.CPU]``
  (with no ``polyprof-xpu`` plugin installed, XPU raises ``ActivityUnavailableError`` naming
  ``polyprof-xpu``). ``sort_by="self_xpu_time_total"`` is kept: as in torch it reads as
  ``self_device_time_total``, which is 0 for every CPU-only row, so rows keep their order.
* The guide's handler lacks a closing parenthesis on its ``print`` line; it is added.
* ``"/tmp/trace_"`` became ``tempfile.gettempdir()`` (``/tmp`` unless ``TMPDIR`` says otherwise),
  so that the tests can run it in a directory of their own.
* The guide leaves ``model``, ``input`` and ``dataloader`` to the reader: here a small MLP and
  a list of 24 batches. The last line, which prints the profiler's class, is added.
"""

# The guide's code is kept as written (its import order, imports and nesting).
# ruff: noqa: I001

import os
import tempfile

import torch
from torch.profiler import profile, ProfilerActivity
from torch.profiler import schedule

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
input = torch.randn(32, 64)
dataloader = [input] * 24

# assign a customized schedule
my_schedule = schedule(skip_first=10, wait=1, warmup=3, active=1, repeat=2)


# also define a handler for outputing results
def trace_handler(p):
    print(p.key_averages().table(sort_by="self_xpu_time_total", row_limit=10))
    p.export(os.path.join(tempfile.gettempdir(), "trace_" + str(p.step_num) + ".json"))


# pass customized schedule and trace handler to profiler outside the for-loop
with profile(activities=[ProfilerActivity.CPU], schedule=my_schedule, on_trace_ready=trace_handler) as prof:
    for iter in range(len(dataloader)):
        model(input)
        # don't forget a step() at the end of each loop
        prof.step()

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
