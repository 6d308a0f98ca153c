"""Profiler activities, spelled as torch spells them.

``ProfilerActivity`` has torch's member names and integer values, so user code
that passes ``torch.profiler.ProfilerActivity.CPU`` or ``polyprof.ProfilerActivity.CPU``
(or the strings ``"cpu"``, ``"cuda"``, ``"xpu"``) means the same thing.
"""

from __future__ import annotations

import enum
from typing import Any


class ProfilerActivity(enum.IntEnum):
    """What a tracer records. Values match ``torch.profiler.ProfilerActivity``."""

    CPU = 0
    XPU = 1
    CUDA = 2
    HPU = 3
    MTIA = 4
    PrivateUse1 = 5


#: The distribution a user installs to get an activity the core does not provide.
DISTRIBUTION_FOR_ACTIVITY: dict[ProfilerActivity, str] = {
    ProfilerActivity.CUDA: "polyprof-cuda",
    ProfilerActivity.XPU: "polyprof-xpu",
}

#: Kineto's activity types of the CPU group: the names a ``{ProfilerActivity.CPU: [...]}`` filter
#: takes (any other makes torch's collector raise), each the upper-case spelling of the trace
#: category its events are written under. Asked of torch 2.13 and 2.15 by
#: tests/test_frontend_versions.py.
CPU_GROUP_ACTIVITY_TYPES = (
    "CPU_OP",
    "CPU_INSTANT_EVENT",
    "USER_ANNOTATION",
    "EXTERNAL_CORRELATION",
    "PYTHON_FUNCTION",
    "CUDA_RUNTIME",
    "CUDA_DRIVER",
    "XPU_RUNTIME",
    "XPU_DRIVER",
    "PRIVATEUSE1_RUNTIME",
    "PRIVATEUSE1_DRIVER",
)

_BY_LOWER_NAME = {member.name.lower(): member for member in ProfilerActivity}


def coerce_activity(value: Any) -> ProfilerActivity:
    """Turn a polyprof or torch activity, or its name, into ``ProfilerActivity``.

    Raises ``ValueError`` naming the valid choices for anything else.
    """
    if isinstance(value, ProfilerActivity):
        return value
    name = getattr(value, "name", None)  # torch's pybind enum has .name
    if isinstance(name, str) and name.lower() in _BY_LOWER_NAME:
        return _BY_LOWER_NAME[name.lower()]
    if isinstance(value, str) and value.lower() in _BY_LOWER_NAME:
        return _BY_LOWER_NAME[value.lower()]
    valid = ", ".join(f"ProfilerActivity.{m.name}" for m in ProfilerActivity)
    raise ValueError(f"unknown profiler activity {value!r}; valid activities are: {valid}")
