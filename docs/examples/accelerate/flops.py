"""Accelerate profiler guide, "FLOPS", on the CPU.

Run it through polyprof without changing it:

    polyprof run docs/examples/accelerate/flops.py

``with_flops=True`` estimates the floating point operations of matrix
multiplications and 2D convolutions; the table, sorted by them, shows torch's
"Total FLOPs" column (scaled: "Total MFLOPs", "Total GFLOPs", ...). As in the
guide, ``ProfileKwargs`` names no activities: every activity available is
recorded, which is the CPU here.
"""

from __future__ import annotations

from _models import guide_inputs, parse_sample_args, resnet18
from accelerate import Accelerator, ProfileKwargs

args = parse_sample_args(__doc__, default_out=".")

model = resnet18()
inputs = guide_inputs(args.image_size)

profile_kwargs = ProfileKwargs(with_flops=True)
accelerator = Accelerator(kwargs_handlers=[profile_kwargs])

with accelerator.profile() as prof:
    model(inputs)

print(prof.key_averages().table(sort_by="flops", row_limit=10))
