"""The configuration a profiling session hands to plugins, and the error of a frontend argument's type.

``ProfileConfig``: what to record, the value every plugin receives. ``ProfileArgumentError``: a
frontend argument of the wrong type, raised by the checks in ``polyprof.frontends.frontend_arguments`` and
caught by users under this name (docs/user-guide.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from polyprof.base.activity import ProfilerActivity
from polyprof.base.errors import PolyprofError


# Typed converters: mypy's attrs plugin cannot bind frozenset's type variable when the
# converter is the class itself.
def _activity_set(values: Iterable[ProfilerActivity]) -> frozenset[ProfilerActivity]:
    return frozenset(values)


def _name_set(values: Iterable[str]) -> frozenset[str]:
    return frozenset(values)


def _frozen_filters(value: Mapping[Any, Any] | None) -> Mapping[ProfilerActivity, frozenset[str]]:
    return {act: frozenset(names) for act, names in (value or {}).items()}


@attrs.frozen
class ProfileConfig:
    """What to record. Immutable; shared with tracers on any thread."""

    #: Activities asked for (after resolving defaults).
    activities: frozenset[ProfilerActivity] = attrs.field(converter=_activity_set)
    #: Dict form of ``activities``: per activity, the activity types to keep (empty = all).
    activity_filters: Mapping[ProfilerActivity, frozenset[str]] = attrs.field(
        factory=dict, converter=_frozen_filters
    )
    record_shapes: bool = False
    profile_memory: bool = False
    #: Python stacks per op; torch fills them only with ``verbose`` too.
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    #: torch's ``_ExperimentalConfig(profile_all_threads=True)``.
    profile_all_threads: bool = False
    #: torch's ``_ExperimentalConfig(verbose=True)``.
    verbose: bool = False
    #: torch's ``_ExperimentalConfig(capture_overload_names=True)``.
    capture_overload_names: bool = False
    #: torch's ``_ExperimentalConfig(trace_only=True)`` (2.13+): the trace only, no ``events()``.
    trace_only: bool = False
    #: The user's ``torch._C._profiler._ExperimentalConfig``, passed through as is.
    experimental_config: Any = None
    trace_id: str = ""
    #: Activities torch's own collector records for device plugins (``polyprof_torch_collector_activities``),
    #: as ``torch.profiler.ProfilerActivity`` member names ("CUDA", "XPU"); filled by the session.
    torch_activities: frozenset[str] = attrs.field(default=frozenset(), converter=_name_set)
    #: Free-form options for plugins (``polyprof run`` flags, plugin settings).
    options: Mapping[str, Any] = attrs.field(factory=dict)


class ProfileArgumentError(PolyprofError, TypeError):
    """A profiler argument of the wrong type; the message names the argument, the value and what it takes."""


class ProfileArgumentAttributeError(ProfileArgumentError, AttributeError):
    """An argument that lacks attributes torch uses (``experimental_config``, ``execution_trace_observer``).

    Also an AttributeError, the type torch raises when it first uses such a value.
    """
