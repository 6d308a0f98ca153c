"""Accelerate profiler guide, "Using Profiler to Analyze Long-Running Jobs", on the CPU.

Run it through polyprof without changing it:

    polyprof run docs/examples/accelerate/long_running.py

``schedule_option`` is the guide's: skip 10 steps, then twice (``repeat=2``)
wait 5 steps, warm up 1 and record 3. Each time a cycle's 3 recorded steps end,
``trace_handler`` prints that cycle's table and writes
``<out>/trace_<step_num>.json``: here after steps 19 and 28.

Two changes from the guide: the guide loops 8 times, which never gets past
``skip_first=10``, so its handler would never run (with torch's profiler as
with polyprof's); this loop makes the 28 steps the schedule needs. And the
handler sorts by ``self_cpu_time_total`` instead of ``self_cuda_time_total``,
since nothing runs on a GPU here.
"""

from __future__ import annotations

import os

from _models import guide_inputs, parse_sample_args, resnet18
from accelerate import Accelerator, ProfileKwargs

args = parse_sample_args(__doc__, default_out="/tmp")

model = resnet18()
inputs = guide_inputs(args.image_size)

SKIP_FIRST, WAIT, WARMUP, ACTIVE, REPEAT = 10, 5, 1, 3, 2
STEPS = SKIP_FIRST + REPEAT * (WAIT + WARMUP + ACTIVE)


def trace_handler(p):
    output = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    print(output)
    p.export_chrome_trace(os.path.join(args.out, "trace_" + str(p.step_num) + ".json"))


profile_kwargs = ProfileKwargs(
    activities=["cpu"],
    schedule_option={
        "wait": WAIT,
        "warmup": WARMUP,
        "active": ACTIVE,
        "repeat": REPEAT,
        "skip_first": SKIP_FIRST,
    },
    on_trace_ready=trace_handler,
)

accelerator = Accelerator(cpu=True, kwargs_handlers=[profile_kwargs])
model = accelerator.prepare(model)

with accelerator.profile() as prof:
    for idx in range(STEPS):
        model(inputs)
        prof.step()
