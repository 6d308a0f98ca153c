"""Accelerate profiler guide, "Using profiler to analyze execution time", on the CPU.

Run it through polyprof without changing it:

    polyprof run docs/examples/accelerate/execution_time.py

Prints the operators' times (sorted by total CPU time, 10 rows), then the
same table grouped by input shapes (with torch's "Input Shapes" column).
"""

from __future__ import annotations

import torch
from _models import guide_inputs, parse_sample_args, resnet18
from accelerate import Accelerator, ProfileKwargs

args = parse_sample_args(__doc__, default_out=".")

model = resnet18()
inputs = guide_inputs(args.image_size)

profile_kwargs = ProfileKwargs(activities=["cpu"], record_shapes=True)

accelerator = Accelerator(cpu=True, kwargs_handlers=[profile_kwargs])
model = accelerator.prepare(model)

with accelerator.profile() as prof:  # noqa: SIM117 (the guide's code)
    with torch.no_grad():
        model(inputs)

print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))

# Finer granularity: one row per operator and input shapes (needs record_shapes=True).
print(prof.key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total", row_limit=10))
