"""PyTorch profiler notes, "API": ``schedule``, ``on_trace_ready``, ``step()`` and ``ProfilerAction``.

Run: ``python -m polyprof run schedule_steps.py``. The notes describe how ``step()`` asks the
schedule for each step's ``ProfilerAction`` and how ``on_trace_ready`` runs once a
``RECORD_AND_SAVE`` step is left. This script prints the action of each step, then profiles 8
steps with ``schedule(wait=1, warmup=1, active=2, repeat=2)``: each of the two cycles records
steps 2-3 and 6-7, and its handler prints which steps it saw (the ``ProfilerStep#N`` ranges
that ``step()`` opens) and the cycle's table, where they show as one ``ProfilerStep*`` row.
Without ``acc_events=True`` each cycle replaces the previous one's events, with torch's warning.
"""

import torch
from _model import resnet18_or_stand_in
from torch.profiler import ProfilerAction, ProfilerActivity, profile, record_function, schedule

model = resnet18_or_stand_in()
inputs = torch.randn(2, 3, 64, 64)

my_schedule = schedule(wait=1, warmup=1, active=2, repeat=2)
for step in range(8):
    print(f"step {step}: {my_schedule(step).name}")
assert my_schedule(3) is ProfilerAction.RECORD_AND_SAVE


def trace_handler(p):
    # FunctionEvent.name folds every step into "ProfilerStep*"; trace_name keeps the step number.
    steps = sorted({e.trace_name for e in p.events() if e.trace_name.startswith("ProfilerStep#")})
    print(f"on_trace_ready at step_num={p.step_num}: recorded {', '.join(steps)}")
    print(p.key_averages().table(sort_by="cpu_time_total", row_limit=5))


with profile(activities=[ProfilerActivity.CPU], schedule=my_schedule, on_trace_ready=trace_handler) as prof:
    for step in range(8):
        with record_function("forward"):
            model(inputs)
        prof.step()

print(f"profiled by {type(prof).__module__}.{type(prof).__qualname__}")
