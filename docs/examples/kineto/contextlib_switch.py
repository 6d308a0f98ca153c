"""IPEX Kineto-supported profiler guide, "Disable Tool in Model Script": a ``contextlib`` switch.

Run: ``python -m polyprof run contextlib_switch.py --profile`` to profile (the trace handler
prints a table and writes ``trace_<step>.json`` files into the temporary directory, as in
``schedule_trace_handler.py``), or without ``--profile`` to run with ``contextlib.nullcontext()``
in the profiler's place. The last line says which.

Without ``--profile`` the script starts no profiler of its own, so ``polyprof run`` profiles the
script as a whole: its table goes to stderr and its trace into ``polyprof-out/``. Run the script
with plain ``python`` to run it without any profiler.

polyprof's profilers record nothing when disabled either: ``polyprof.legacy.profile`` and
``torch.autograd.profiler.profile`` under the shims take ``enabled=False``. ``torch.profiler.profile``
has no such switch, in torch or in polyprof, hence the guide's pattern.

Adapted for a machine without an Intel GPU; the profiler calls are the guide's otherwise:

* ``activities=[ProfileActivity.XPU]`` (the guide misspells ``ProfilerActivity``) became
  ``[ProfilerActivity.CPU]``: with no ``polyprof-xpu`` plugin installed, XPU raises
  ``ActivityUnavailableError`` naming ``polyprof-xpu``.
* ``range((len(dataloader))`` (one parenthesis too many in the guide) became ``range(len(dataloader))``.
* ``should_profile``, ``my_schedule``, ``trace_handler``, ``model``, ``input`` and ``dataloader``
  come from the guide's other samples or are left to the reader: they are defined here.
"""

import contextlib
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, schedule

should_profile = "--profile" in sys.argv[1:]

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
input = torch.randn(32, 64)
dataloader = [input] * 8
my_schedule = schedule(wait=1, warmup=1, active=2, repeat=1)


def trace_handler(p):
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    p.export(os.path.join(tempfile.gettempdir(), "trace_" + str(p.step_num) + ".json"))


def profiler_setup(profiling=False, *args, **kwargs):
    if profiling:
        return torch.profiler.profile(*args, **kwargs)
    else:
        return contextlib.nullcontext()


# you can pass official arguments as normal
with profiler_setup(
    profiling=should_profile,
    activities=[ProfilerActivity.CPU],
    schedule=my_schedule,
    on_trace_ready=trace_handler,
) as prof:
    for iter in range(len(dataloader)):
        model(input)

        if should_profile:
            prof.step()

if should_profile:
    print(f"profiling was on: profiled by {type(prof).__module__}.{type(prof).__qualname__}")
else:
    print("profiling was off: the script ran under contextlib.nullcontext()")
