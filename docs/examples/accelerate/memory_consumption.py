"""Accelerate profiler guide, "Using profiler to analyze memory consumption", on the CPU.

Run it through polyprof without changing it:

    polyprof run docs/examples/accelerate/memory_consumption.py

Prints the memory the operators allocated ("CPU Mem") and allocated themselves
("Self CPU Mem"), sorted by the latter, 10 rows.
"""

from __future__ import annotations

from _models import guide_inputs, parse_sample_args, resnet18
from accelerate import Accelerator, ProfileKwargs

args = parse_sample_args(__doc__, default_out=".")

model = resnet18()
inputs = guide_inputs(args.image_size)

profile_kwargs = ProfileKwargs(activities=["cpu"], profile_memory=True, record_shapes=True)

accelerator = Accelerator(cpu=True, kwargs_handlers=[profile_kwargs])
model = accelerator.prepare(model)

with accelerator.profile() as prof:
    model(inputs)

print(prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=10))
