"""Accelerate profiler guide, "Exporting chrome trace", on the CPU.

Run it through polyprof without changing it:

    polyprof run docs/examples/accelerate/chrome_trace.py

Accelerate writes the trace itself when the ``accelerator.profile()`` block
ends: ``<output_trace_dir>/profile_<process index>.json`` (``profile_0.json``
in a single process). Open it in Perfetto (ui.perfetto.dev) or chrome://tracing.
The guide records ``["cpu", "cuda"]`` on a GPU; here the model runs on the CPU,
so only ``"cpu"`` is recorded.
"""

from __future__ import annotations

import os

from _models import guide_inputs, parse_sample_args, resnet18
from accelerate import Accelerator, ProfileKwargs

args = parse_sample_args(__doc__, default_out="trace")

model = resnet18()
inputs = guide_inputs(args.image_size)

profile_kwargs = ProfileKwargs(activities=["cpu"], output_trace_dir=args.out)

accelerator = Accelerator(cpu=True, kwargs_handlers=[profile_kwargs])
model = accelerator.prepare(model)

with accelerator.profile() as prof:
    model(inputs)

# The trace will be saved to the specified directory
trace_path = os.path.join(args.out, f"profile_{accelerator.process_index}.json")
print(f"trace: {trace_path} ({os.path.getsize(trace_path)} bytes)")
