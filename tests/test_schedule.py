"""polyprof.schedule against torch.profiler.schedule, the oracle."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polyprof
from hypothesis_budget import examples
from polyprof.frontends.schedule import InvalidScheduleError, ProfilerAction, coerce_action

torch_profiler = pytest.importorskip("torch.profiler")

schedule_args = st.fixed_dictionaries(
    {
        "wait": st.integers(0, 4),
        "warmup": st.integers(0, 3),
        "active": st.integers(1, 4),
        "repeat": st.integers(0, 3),
        "skip_first": st.integers(0, 4),
        "skip_first_wait": st.integers(0, 1),
    }
)


@settings(max_examples=examples(200), deadline=None)
@given(args=schedule_args)
def test_same_actions_as_torch(args: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = polyprof.schedule(**args)
        theirs = torch_profiler.schedule(**args)
    for step in range(40):
        assert ours(step).name == theirs(step).name, (args, step)
        assert ours(step).value == theirs(step).value


def test_documented_pattern() -> None:
    # torch_profiler.md §1.4, row 3: wait 1 warmup 1 active 2 repeat 2 skip_first 3
    fn = polyprof.schedule(wait=1, warmup=1, active=2, repeat=2, skip_first=3)
    letters = {"NONE": "N", "WARMUP": "W", "RECORD": "R", "RECORD_AND_SAVE": "S"}
    assert "".join(letters[fn(s).name] for s in range(24)) == "NNNNWRSNWRSNNNNNNNNNNNNN"


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"wait": -1, "warmup": 1, "active": 1}, "wait=-1 (need >= 0)"),
        ({"wait": 0, "warmup": 1, "active": 0}, "active=0 (need >= 1)"),
        ({"wait": 0, "warmup": 1, "active": 1, "repeat": -2}, "repeat=-2"),
        ({"wait": 0, "warmup": 1, "active": 1, "skip_first": -1}, "skip_first=-1"),
        ({"wait": 1.5, "warmup": 1, "active": 1}, "wait=1.5 (need an int)"),
    ],
)
def test_invalid_arguments_name_the_problem(kwargs: dict, needle: str) -> None:
    with pytest.raises(InvalidScheduleError, match="Invalid profiler schedule arguments") as info:
        polyprof.schedule(**kwargs)
    assert needle in str(info.value)
    # torch raises AssertionError here; code that catches that keeps working.
    assert isinstance(info.value, AssertionError) and isinstance(info.value, ValueError)


def test_positional_arguments_rejected_like_torch() -> None:
    with pytest.raises(TypeError):
        polyprof.schedule(1, 1, 1)  # type: ignore[misc]


def test_warmup_zero_warns() -> None:
    with pytest.warns(UserWarning, match="won't be using warmup"):
        polyprof.schedule(wait=0, warmup=0, active=1)


def test_negative_step_rejected() -> None:
    fn = polyprof.schedule(wait=0, warmup=1, active=1)
    with pytest.raises(ValueError, match="step must be >= 0"):
        fn(-1)


def test_torch_actions_are_accepted_from_user_schedules() -> None:
    assert coerce_action(torch_profiler.ProfilerAction.RECORD) is ProfilerAction.RECORD
    with pytest.raises(ValueError, match=r"ProfilerAction.RECORD_AND_SAVE"):
        coerce_action("sometimes")
