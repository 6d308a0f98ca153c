"""The frontends' argument checks: ``polyprof.profile``'s, the legacy profile's and the shims'.

The checks follow what the installed torch accepts: where torch only tests a
value for truth (``acc_events``, ``use_cuda``, the legacy ``enabled``), any value
is read as its truth value; where torch hands a flag to its C++ config
(``record_shapes``, ``with_stack``, ...), which takes bools and numbers, a value
of another type is refused at once with an error naming the argument, the value
and what the argument takes (torch refuses it later, without the name).
The errors are ``polyprof.base.config``'s ``ProfileArgumentError`` and its
``ProfileArgumentAttributeError``.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from typing import Any

from polyprof.base.config import ProfileArgumentAttributeError, ProfileArgumentError
from polyprof.base.errors import PolyprofWarning
from polyprof.base.user_warnings import user_stacklevel

_FLAG_TAKES = "True or False (ints, floats, numpy bools and None are read as their truth value)"


def _given(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def config_flag(name: str, value: Any) -> bool:
    """A flag torch hands to its C++ profiler config, read as its truth value.

    What passes is what that config's bool takes (pybind11's rule): a value whose
    type defines ``__bool__``, such as bools, numbers, numpy bools and None.
    Anything else (``"yes"``, a list) is a ``ProfileArgumentError`` here, where
    torch raises a TypeError that names no argument.
    """
    if hasattr(type(value), "__bool__"):
        return bool(value)
    raise ProfileArgumentError(f"{name} must be {_FLAG_TAKES}; got {_given(value)}")


def truth_flag(name: str, value: Any) -> bool:
    """A flag torch only tests for truth: any value passes, as in torch, read as its truth value.

    A str warns, at the user's line, since ``"no"``, ``"0"`` and ``"False"`` are all true.
    """
    if isinstance(value, (str, bytes)):
        warnings.warn(
            f"{name}={value!r} is a string, which is read as {bool(value)} (its truth value, as torch reads "
            "it); pass True or False",
            PolyprofWarning,
            stacklevel=user_stacklevel(),
        )
    return bool(value)


def check_callable(name: str, value: Any, *, takes: str, arguments: int) -> None:
    """``value`` is None or a callable that can be called with ``arguments`` positional arguments.

    The signature is checked when Python can read it (builtins may not say; they are
    called as given), so a wrong callback fails when the profile is made rather than
    at the end of a long run.
    """
    if value is None:
        return
    if not callable(value):
        raise ProfileArgumentError(
            f"{name} must be a callable that takes {takes}, or None; got {_given(value)}"
        )
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(arguments))
    except TypeError as exc:
        raise ProfileArgumentError(
            f"{name} must be a callable that takes {takes}; {value!r} has the signature {signature} ({exc})"
        ) from None


def check_experimental_config(value: Any) -> None:
    """None or torch's ``_ExperimentalConfig`` (checked by name, so that torch need not be imported)."""
    if value is None or (
        type(value).__name__ == "_ExperimentalConfig" and type(value).__module__.startswith("torch")
    ):
        return
    raise ProfileArgumentAttributeError(
        "experimental_config must be a torch._C._profiler._ExperimentalConfig (e.g. "
        f"torch._C._profiler._ExperimentalConfig(verbose=True)) or None; got {_given(value)}"
    )


#: The methods torch calls on an ``execution_trace_observer`` (its ``_ITraceObserver`` interface).
TRACE_OBSERVER_METHODS = ("start", "stop", "cleanup")


def check_execution_trace_observer(value: Any) -> None:
    """None or an object with torch's ``_ITraceObserver`` methods (``ExecutionTraceObserver`` has them)."""
    if value is None:
        return
    missing = [m for m in TRACE_OBSERVER_METHODS if not callable(getattr(value, m, None))]
    if missing:
        raise ProfileArgumentAttributeError(
            "execution_trace_observer must be a torch.profiler.ExecutionTraceObserver (an object with "
            f"{', '.join(f'{m}()' for m in TRACE_OBSERVER_METHODS)} methods) or None; got {_given(value)}, "
            f"which has no {', '.join(f'{m}()' for m in missing)}"
        )


def check_timeout(name: str, value: Any) -> None:
    """None or a number of seconds >= 0 (torch's check, with the NaN it lets through to fail later)."""
    if value is None:
        return
    if not isinstance(value, numbers.Real):
        raise ProfileArgumentError(f"{name} must be a number of seconds >= 0, or None; got {_given(value)}")
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be non-negative (a number of seconds >= 0, or None); got {value!r}")


def check_plugin_manager(value: Any) -> None:
    """None (the installed plugins) or a ``PolyprofPluginManager``."""
    if value is None:
        return
    from polyprof.hooks.registry import PolyprofPluginManager  # loaded with the manager anyway

    if not isinstance(value, PolyprofPluginManager):
        raise ProfileArgumentError(
            "plugin_manager must be a polyprof.hooks.registry.PolyprofPluginManager (e.g. from "
            f"polyprof.testing.make_plugin_manager_for_tests) or None; got {_given(value)}"
        )
