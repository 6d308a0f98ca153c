"""Wrong-typed profiler arguments, and stop() without start() (issue 11, faults 10 and 11).

Every argument of ``polyprof.profile`` and ``polyprof.legacy.profile`` given a
value of the wrong type fails when the profile is made, with an error that
names the argument, shows the value and says what the argument takes. Values
that torch 2.13 accepts keep working (torch is asked in the same test).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch
import torch.autograd.profiler_legacy as torch_legacy
import torch.profiler as tp

import polyprof
from polyprof import ProfilerActivity
from polyprof.base.config import ProfileArgumentError
from polyprof.base.errors import PolyprofWarning
from polyprof.frontends import legacy
from polyprof.frontends.profiler import NoActivitiesError, ProfilerNotStartedError
from polyprof.shim import AutogradProfile, TorchProfile

CPU = ProfilerActivity.CPU
CONFIG_FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


def _no_arguments() -> None:
    return None


def _one_argument(x: Any) -> str:
    return "id"


#: (argument, wrong value, exception type, what the message must say besides the argument's name)
WRONG = [
    # Strings: torch 2.6 to 2.13 find no activity (AssertionError), 2.14+ refuse the item (TypeError).
    ("activities", "cpu", (NoActivitiesError, TypeError), ["'cpu'", "ProfilerActivity.CPU"]),
    ("activities", 5, TypeError, ["5", "ProfilerActivity.CPU"]),
    ("activities", ["cpu"], (NoActivitiesError, TypeError), ["'cpu'", "ProfilerActivity.CPU"]),
    ("activities", [CPU, "cuda"], TypeError, ["'cuda'", "ProfilerActivity.CPU"]),
    ("activities", [{"cpu": ["x"]}], TypeError, ["'cpu'", "ProfilerActivity"]),
    ("schedule", 5, TypeError, ["5 (int)", "callable", "step number"]),
    ("schedule", "x", TypeError, ["'x' (str)", "callable"]),
    ("schedule", _no_arguments, TypeError, ["_no_arguments", "step number"]),
    ("schedule", lambda step: "record", ValueError, ["'record'", "ProfilerAction.RECORD"]),
    ("on_trace_ready", "x", TypeError, ["'x' (str)", "callable", "the profile"]),
    ("on_trace_ready", 5, TypeError, ["5 (int)", "callable"]),
    ("on_trace_ready", _no_arguments, TypeError, ["_no_arguments", "the profile"]),
    *[
        (flag, value, TypeError, [repr(value), "True or False"])
        for flag in CONFIG_FLAGS
        for value in ("yes", [1])
    ],
    ("experimental_config", 3, AttributeError, ["3 (int)", "_ExperimentalConfig"]),
    ("experimental_config", {"verbose": True}, AttributeError, ["{'verbose': True}", "_ExperimentalConfig"]),
    ("execution_trace_observer", "x", AttributeError, ["'x' (str)", "ExecutionTraceObserver", "start()"]),
    ("execution_trace_observer", object(), AttributeError, ["object", "cleanup()"]),
    ("custom_trace_id_callback", "x", TypeError, ["'x' (str)", "callable", "no arguments"]),
    ("custom_trace_id_callback", 3, TypeError, ["3 (int)", "callable"]),
    ("custom_trace_id_callback", _one_argument, TypeError, ["_one_argument", "no arguments"]),
    ("post_processing_timeout_s", "x", TypeError, ["'x' (str)", "seconds"]),
    ("post_processing_timeout_s", [1], TypeError, ["[1] (list)", "seconds"]),
    ("post_processing_timeout_s", -1, ValueError, ["-1", "non-negative"]),
    ("post_processing_timeout_s", math.nan, ValueError, ["nan", "non-negative"]),
    ("plugin_manager", "x", TypeError, ["'x' (str)", "PolyprofPluginManager"]),
]


def _case_id(case: tuple) -> str:
    name, value = case[0], case[1]
    return f"{name}={getattr(value, '__name__', None) or type(value).__name__}-{str(value)[:12]}"


@pytest.mark.parametrize("case", WRONG, ids=[_case_id(c) for c in WRONG])
def test_wrong_argument_is_named_with_what_it_takes(case: tuple) -> None:
    name, value, error, says = case
    with pytest.raises(error) as info:
        polyprof.profile(**{name: value})  # at construction, before anything records
    message = str(info.value)
    assert name in message
    for words in says:
        assert words in message, f"{words!r} missing from: {message}"
    assert "\n" not in message


def _torch_refuses(cls: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
    """Whether torch raises anywhere in a small profile with these arguments (polyprof's CPU as torch's)."""
    if isinstance(kwargs.get("activities"), list):
        kwargs = {
            **kwargs,
            "activities": [tp.ProfilerActivity.CPU if a is CPU else a for a in kwargs["activities"]],
        }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with cls(**kwargs) as prof:
                torch.ones(2).sum()
                if hasattr(prof, "step"):
                    prof.step()
            prof.key_averages()
    except Exception:  # noqa: BLE001 - any refusal counts
        return True
    return False


@pytest.mark.parametrize("case", [c for c in WRONG if c[0] != "plugin_manager"], ids=_case_id)
def test_torch_refuses_them_too(case: tuple) -> None:
    """polyprof refuses only what torch refuses too (torch often later, at exit or at the results)."""
    name, value = case[0], case[1]
    assert _torch_refuses(tp.profile, {name: value})


#: Whether the installed torch.profiler.profile still takes ``use_cuda`` (2.6 to 2.13; 2.14 removed it).
TORCH_TAKES_USE_CUDA = "use_cuda" in inspect.signature(tp.profile).parameters


def _check_torch_takes(kwargs: dict[str, Any]) -> None:
    """torch takes ``kwargs``; or, with ``use_cuda`` where torch 2.14+ removed it, refuses them as the
    shim does, while ``polyprof.profile`` keeps torch 2.13's signature (DESIGN.md)."""
    if "use_cuda" in kwargs and not TORCH_TAKES_USE_CUDA:
        assert _torch_refuses(tp.profile, kwargs)
        with pytest.raises(TypeError, match="unexpected keyword argument 'use_cuda'"):
            TorchProfile(**kwargs)
        return
    assert not _torch_refuses(tp.profile, kwargs)


#: Values of the wrong type that torch 2.13 takes, read as their truth value.
ACCEPTED = [
    *[(flag, value) for flag in CONFIG_FLAGS for value in (1, 0, np.bool_(True))],
    *[(flag, value) for flag in ("profile_memory", "with_stack", "with_modules") for value in (1.5, None)],
    ("acc_events", 1),
    ("use_cuda", 0),
    ("post_processing_timeout_s", True),
]


@pytest.mark.parametrize(("name", "value"), ACCEPTED, ids=[f"{n}={v!r}" for n, v in ACCEPTED])
def test_values_torch_takes_are_taken(name: str, value: Any) -> None:
    _check_torch_takes({name: value})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # use_cuda is deprecated, as in torch
        prof = polyprof.profile(**{name: value})
    if name in CONFIG_FLAGS:
        assert getattr(prof, name) is bool(value)


@pytest.mark.parametrize(("name", "value"), [("acc_events", "no"), ("use_cuda", "no")])
def test_strings_torch_reads_as_true_warn(name: str, value: str) -> None:
    _check_torch_takes({name: value, "activities": [CPU]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        polyprof.profile(activities=[CPU], **{name: value})
    ours = [w for w in caught if issubclass(w.category, PolyprofWarning)]
    assert len(ours) == 1 and f"{name}='no' is a string, which is read as True" in str(ours[0].message)
    assert ours[0].filename == __file__  # points at the user's line


def test_profile_records_with_truthy_flags() -> None:
    with polyprof.profile(activities=[CPU], record_shapes=1, profile_memory=1.5, with_stack=None) as prof:
        torch.ones(4, 4).mm(torch.ones(4, 4))
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    assert prof.record_shapes is True and prof.with_stack is False


def test_set_custom_trace_id_callback_is_checked() -> None:
    prof = polyprof.profile(activities=[CPU])
    with pytest.raises(ProfileArgumentError, match="callback must be a callable that takes no arguments"):
        prof.set_custom_trace_id_callback("abc")


# ------------------------------------------------------------------ the legacy frontend

LEGACY_CONFIG_FLAGS = ("record_shapes", "with_flops", "profile_memory", "with_stack", "with_modules")
LEGACY_WRONG = [
    *[(flag, value) for flag in LEGACY_CONFIG_FLAGS for value in ("yes", [1], {})],
    ("plugin_manager", 3),
]


@pytest.mark.parametrize(("name", "value"), LEGACY_WRONG, ids=[f"{n}={v!r}" for n, v in LEGACY_WRONG])
def test_legacy_wrong_argument_is_named(name: str, value: Any) -> None:
    with pytest.raises(TypeError) as info:
        legacy.profile(**{name: value})
    message = str(info.value)
    assert name in message and repr(value) in message
    assert ("True or False" if name != "plugin_manager" else "PolyprofPluginManager") in message
    if name != "plugin_manager":
        assert _torch_refuses(torch_legacy.profile, {name: value})


LEGACY_ACCEPTED = [
    *[(flag, value) for flag in ("profile_memory", "with_stack", "with_modules") for value in (1.5, None)],
    *[(flag, value) for flag in LEGACY_CONFIG_FLAGS for value in (1, np.bool_(False))],
    ("enabled", [1]),
    ("enabled", 1.5),
    ("use_cuda", 0.0),
]


@pytest.mark.parametrize(("name", "value"), LEGACY_ACCEPTED, ids=[f"{n}={v!r}" for n, v in LEGACY_ACCEPTED])
def test_legacy_values_torch_takes_are_taken(name: str, value: Any) -> None:
    assert not _torch_refuses(torch_legacy.profile, {name: value})
    prof = legacy.profile(**{name: value})
    assert getattr(prof, name) is bool(value)


@pytest.mark.parametrize("name", ["enabled", "use_cuda", "use_xpu"])
def test_legacy_truth_flags_take_strings_with_a_warning(name: str) -> None:
    if name != "use_xpu":  # torch has no use_xpu (IPEX's); torch reads the others for truth
        assert not _torch_refuses(torch_legacy.profile, {name: "no"})
    with pytest.warns(PolyprofWarning, match=f"{name}='no' is a string, which is read as True") as caught:
        prof = legacy.profile(**{name: "no"})
    assert getattr(prof, name) is True
    assert caught[0].filename == __file__  # points at the user's line


# ------------------------------------------------------------------ stop() without start()


def test_stop_without_start_raises_as_torch_and_fires_nothing() -> None:
    theirs = tp.profile(activities=[tp.ProfilerActivity.CPU], on_trace_ready=lambda p: None)
    with pytest.raises(
        AssertionError, match="Profiler must be initialized before stopping trace"
    ) as their_error:
        theirs.stop()
    fired: list[Any] = []
    ours = polyprof.profile(activities=[CPU], on_trace_ready=fired.append)
    with pytest.raises(ProfilerNotStartedError, match=str(their_error.value)) as info:
        ours.stop()
    assert isinstance(info.value, AssertionError) and isinstance(info.value, RuntimeError)
    assert "never started" in str(info.value)
    assert fired == []
    with pytest.raises(ProfilerNotStartedError):
        ours.__exit__(None, None, None)
    assert fired == []
    # Nothing was left claimed: the same profile can still record.
    with ours:
        torch.ones(2).sum()
    assert fired == [ours]


def test_stop_without_start_before_the_schedule_records_is_quiet_as_in_torch() -> None:
    fired: list[Any] = []
    their_schedule = tp.schedule(wait=1, warmup=1, active=1)
    tp.profile(
        activities=[tp.ProfilerActivity.CPU], schedule=their_schedule, on_trace_ready=fired.append
    ).stop()
    ours = polyprof.profile(
        activities=[CPU], schedule=polyprof.schedule(wait=1, warmup=1, active=1), on_trace_ready=fired.append
    )
    ours.stop()
    assert fired == []


def test_legacy_exit_without_enter_raises_as_torch() -> None:
    with pytest.raises(RuntimeError):
        torch_legacy.profile().__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="was never entered"):
        legacy.profile().__exit__(None, None, None)
    prof = legacy.profile()
    with prof:
        torch.ones(2).sum()
    with pytest.raises(RuntimeError, match="has already exited"):
        prof.__exit__(None, None, None)
    assert prof.key_averages()  # the results are still there
    # Disabled: nothing to stop, in torch as here.
    assert not torch_legacy.profile(enabled=False).__exit__(None, None, None)
    assert not legacy.profile(enabled=False).__exit__(None, None, None)


def test_autograd_shim_exit_without_enter_is_quiet_as_in_torch() -> None:
    torch.autograd.profiler.profile().__exit__(None, None, None)
    AutogradProfile().__exit__(None, None, None)
