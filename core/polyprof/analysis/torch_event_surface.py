"""What the installed torch's event classes look like: their public names, deprecations and ``DeviceType``.

polyprof's ``FunctionEvent`` and ``FunctionEventAvg`` (``polyprof.analysis.function_events``)
have the attributes the installed torch's have and no others, and warn where
torch's warn. This module asks torch's own classes once (``torch_event_surface``)
and answers "every name" without torch, so reading a saved trace never pays
torch's import.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from polyprof.base.events import DeviceType
from polyprof.base.log import get_logger

log = get_logger(__name__)

__all__ = [
    "TorchEventSurface",
    "device_type_member",
    "missing_attribute_error",
    "probe_torch_event_surface",
    "torch_event_surface",
]


def _device_type_members() -> dict[int, Any]:
    """int -> torch's ``DeviceType`` member when the program uses torch, else polyprof's.

    torch is never imported here just for an enum: reading a saved trace must
    not pay torch's import (seconds).
    """
    if "torch" not in sys.modules:
        return _POLYPROF_DEVICE_TYPES
    return _torch_device_types()


_POLYPROF_DEVICE_TYPES = {int(m): m for m in DeviceType}


@functools.lru_cache(maxsize=1)
def _torch_device_types() -> dict[int, Any]:
    try:
        from torch.autograd import DeviceType as TorchDeviceType
    except ImportError:
        return _POLYPROF_DEVICE_TYPES
    return {int(m.value): m for m in TorchDeviceType.__members__.values()}


def device_type_member(value: int) -> Any:
    """torch's ``DeviceType`` member of ``value`` when the program uses torch, else polyprof's."""
    members = _device_type_members()
    member = members.get(value)
    return member if member is not None else DeviceType(value)


# ------------------------------------------------------- the installed torch's surface


@attrs.frozen
class TorchEventSurface:
    """The public names of the installed torch's ``FunctionEvent`` and ``FunctionEventAvg``.

    Asked of torch's own classes (``probe_torch_event_surface``): a
    ``FunctionEvent`` made by torch, and a ``FunctionEventAvg`` after one
    ``add``. polyprof's objects have the attributes torch's have and no
    others, and warn where torch's warn. Without torch (reading a saved trace)
    every attribute of every supported release exists and none warns beyond
    the ``cuda`` aliases.
    """

    #: The torch version asked, or None without torch.
    torch_version: str | None
    #: Public names of a torch ``FunctionEvent``; None: no torch, every name.
    event: frozenset[str] | None
    #: Public names of a torch ``FunctionEventAvg`` after ``add``; None: every name.
    average: frozenset[str] | None
    #: Attributes whose reading warns in torch: name -> (warning class, message).
    deprecated: Mapping[str, tuple[type[Warning], str]] = attrs.field(factory=dict)
    #: Parameter names of torch's ``EventList.key_averages``; None: every one polyprof knows.
    key_averages_params: frozenset[str] | None = None
    #: torch's ``_build_metadata`` (``extra_meta`` dict -> ``EventMetadata``), where it has one.
    build_metadata: Callable[[dict], Any] | None = None

    def event_has(self, name: str) -> bool:
        return self.event is None or name in self.event

    def average_has(self, name: str) -> bool:
        return self.average is None or name in self.average

    def key_averages_takes(self, name: str) -> bool:
        return self.key_averages_params is None or name in self.key_averages_params


_NO_TORCH_SURFACE = TorchEventSurface(torch_version=None, event=None, average=None)


def probe_torch_event_surface() -> TorchEventSurface:
    """Ask the installed torch's ``profiler_util`` for its events' public names (imports torch)."""
    import inspect

    import torch
    from torch.autograd import profiler_util

    event = profiler_util.FunctionEvent(id=0, name="probe", thread=0, start_us=0, end_us=0)
    average = profiler_util.FunctionEventAvg()
    average.add(event)
    event_names = frozenset(n for n in dir(event) if not n.startswith("_"))
    deprecated: dict[str, tuple[type[Warning], str]] = {}
    for name in sorted(event_names):
        if not isinstance(inspect.getattr_static(event, name, None), property):
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                getattr(event, name)
            except Exception:  # noqa: BLE001 - a bare probe event's property may fail; warnings count
                continue
        if caught:
            deprecated[name] = (caught[0].category, str(caught[0].message))
    return TorchEventSurface(
        torch_version=str(torch.__version__),
        event=event_names,
        average=frozenset(n for n in dir(average) if not n.startswith("_")),
        deprecated=deprecated,
        key_averages_params=frozenset(inspect.signature(profiler_util.EventList.key_averages).parameters)
        - {"self"},
        build_metadata=getattr(profiler_util, "_build_metadata", None),
    )


_surface: TorchEventSurface | None = None


def torch_event_surface() -> TorchEventSurface:
    """The installed torch's surface once torch is imported (asked once), else every name.

    torch is never imported here: a program reading saved traces does not pay
    its import, and gets every attribute.
    """
    global _surface
    if _surface is not None:
        return _surface
    if sys.modules.get("torch") is None:
        return _NO_TORCH_SURFACE
    try:
        found = probe_torch_event_surface()
    except (ImportError, AttributeError, TypeError) as exc:
        log.warning("torch_event_surface_unreadable", error=repr(exc), using="every attribute")
        found = _NO_TORCH_SURFACE
    _surface = found
    return found


def missing_attribute_error(owner: object, name: str) -> AttributeError:
    """The ``AttributeError`` for ``name``, which the installed torch's class of ``owner`` lacks."""
    version = torch_event_surface().torch_version
    return AttributeError(
        f"{type(owner).__name__!r} object has no attribute {name!r} "
        f"(the installed torch {version}'s {type(owner).__name__} has none)"
    )
