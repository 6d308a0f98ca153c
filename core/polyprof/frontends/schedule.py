"""torch.profiler's schedule: which steps wait, warm up, record and save.

``schedule(...)`` computes exactly what torch 2.13's does (true division in the
``repeat`` check, ``skip_first_wait``), so a training loop written for torch
records the same steps under polyprof.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable
from typing import Any


class ProfilerAction(enum.Enum):
    """What the profiler does during a step. Values match torch's."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class InvalidScheduleError(ValueError, AssertionError):
    """Bad schedule arguments.

    Also an AssertionError, because torch raises AssertionError here and code
    written for torch may catch that.
    """


def coerce_action(value: Any) -> ProfilerAction:
    """Accept polyprof's or torch's ``ProfilerAction`` from a user schedule."""
    if isinstance(value, ProfilerAction):
        return value
    name = getattr(value, "name", None)
    if isinstance(name, str) and name in ProfilerAction.__members__:
        return ProfilerAction[name]
    valid = ", ".join(f"ProfilerAction.{a.name}" for a in ProfilerAction)
    raise ValueError(f"a profiler schedule returned {value!r}; it must return one of: {valid}")


def schedule(
    *,
    wait: int,
    warmup: int,
    active: int,
    repeat: int = 0,
    skip_first: int = 0,
    skip_first_wait: int = 0,
) -> Callable[[int], ProfilerAction]:
    """Return a function mapping a step number to a ``ProfilerAction``.

    After ``skip_first`` steps, cycles of ``wait`` idle steps, ``warmup`` steps
    and ``active`` recorded steps repeat ``repeat`` times (0 = forever). The
    last active step of each cycle is RECORD_AND_SAVE, when ``on_trace_ready``
    fires. ``skip_first_wait=1`` skips the wait of the first cycle.
    """
    problems = []
    for arg, value, minimum in (
        ("wait", wait, 0),
        ("warmup", warmup, 0),
        ("active", active, 1),
        ("repeat", repeat, 0),
        ("skip_first", skip_first, 0),
        ("skip_first_wait", skip_first_wait, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"{arg}={value!r} (need an int)")
        elif value < minimum:
            problems.append(f"{arg}={value} (need >= {minimum})")
    if problems:
        raise InvalidScheduleError("Invalid profiler schedule arguments: " + ", ".join(problems))
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results", stacklevel=2)
    cycle = wait + warmup + active

    def schedule_fn(step: int) -> ProfilerAction:
        if step < 0:
            raise ValueError(f"profiler step must be >= 0, got {step}")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait != 0:
            step += wait  # the first cycle starts right at its warm-up
        if repeat > 0 and step / cycle >= repeat:  # true division, as torch does
            return ProfilerAction.NONE
        position = step % cycle
        if position < wait:
            return ProfilerAction.NONE
        if position < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if position < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    return schedule_fn


def default_schedule(_: int) -> ProfilerAction:
    """Without a schedule every step records and nothing is saved until exit."""
    return ProfilerAction.RECORD
