"""Old import paths and old plugin forms, kept for one minor release: polyprof's one compatibility module.

Every name has one home. When a name moves, its old module keeps no import of
it, only ``__getattr__ = _compat.moved_names(__name__)``: reading the name there
still gives the object, with a ``PolyprofDeprecationWarning`` that names the new
home. ``MOVED`` is the one table of such paths, and docs/changelog.md
("Deprecated") lists the same ones with the release that removes them. The
messages of polyprof's other deprecations are kept here as constants, as pytest
keeps its own in ``_pytest/deprecated.py``.

Removing the paths in ``REMOVED_IN``: delete ``MOVED``'s entries, the old
modules' ``__getattr__`` lines (and ``polyprof._log``), the 0.1 aggregator call
in ``polyprof.event_list`` and then this module.

Every old module imports this one: it imports nothing of polyprof but
``polyprof.errors`` at import time.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Final

from polyprof.errors import PolyprofDeprecationWarning

#: The release that removes every deprecated path and form below.
REMOVED_IN: Final = "0.3.0"
#: ... and not before this date.
REMOVAL_DATE: Final = "2027-03-01"

#: The namespace a plugin imports polyprof's names from, and the moved names that are in its
#: ``__all__`` (the warning names it for them too). Kept here rather than asked of the namespace, so
#: that reading an old path imports nothing above this layer; tests/test_module_jobs.py checks it
#: against ``polyprof.plugin.__all__``.
PLUGIN_NAMESPACE: Final = "polyprof.plugin"
IN_PLUGIN_NAMESPACE: Final = frozenset(
    {
        "get_logger",
        "Aggregator",
        "FunctionEventAvg",
        "ActivityUnavailableWarning",
        "user_stacklevel",
        "CATEGORY_BY_KIND",
        "TORCH_COLLECTOR_ACTIVITY_NAMES",
    }
)

_DISCOVERY = "polyprof.plugin_discovery"
_CALLS = "polyprof.plugin_calls"
_INFO = "polyprof.plugin_info"
_EVENT_LIST = "polyprof.event_list"
_FUNCTION_EVENTS = "polyprof.function_events"
_SURFACE = "polyprof.torch_event_surface"
_USER_WARNINGS = "polyprof.user_warnings"

#: old module -> name -> the module that defines the name now.
MOVED: Final[Mapping[str, Mapping[str, str]]] = {
    "polyprof._log": {"get_logger": "polyprof.log"},
    "polyprof.components": {"Aggregator": "polyprof.averages"},
    "polyprof.registry": {
        "ALLOW_LIST_ENV": _DISCOVERY,
        "BUILTIN_PLUGINS": _DISCOVERY,
        "CORE_DISTRIBUTION": _DISCOVERY,
        "DISABLE_AUTOLOAD_ENV": _DISCOVERY,
        "ENTRY_POINT_GROUP": _DISCOVERY,
        "EntryPointCandidate": _DISCOVERY,
        "PluginSelectionError": _DISCOVERY,
        "canonical_name": _DISCOVERY,
        "discover_entry_points": _DISCOVERY,
        "env_flag": _DISCOVERY,
        "parse_allow_list": _DISCOVERY,
        "resolve_allow_list": _DISCOVERY,
        "HookFailure": _CALLS,
        "PluginCallError": _CALLS,
        "PluginFailureWarning": _CALLS,
        "PLUGIN_STATUSES": _INFO,
        "PluginInfo": _INFO,
    },
    "polyprof.results": {
        "EventList": _EVENT_LIST,
        "average_by_key": _EVENT_LIST,
        "wrap_key_averages": _EVENT_LIST,
        "FormattedTimesMixin": _FUNCTION_EVENTS,
        "FunctionEvent": _FUNCTION_EVENTS,
        "FunctionEventAvg": _FUNCTION_EVENTS,
        "Interval": _FUNCTION_EVENTS,
        "Kernel": _FUNCTION_EVENTS,
        "TorchEventSurface": _SURFACE,
        "probe_torch_event_surface": _SURFACE,
        "torch_event_surface": _SURFACE,
    },
    "polyprof.events": {"CATEGORY_BY_KIND": "polyprof.kineto_format"},
    "polyprof.torch_result": {"TORCH_COLLECTOR_ACTIVITY_NAMES": "polyprof.activity"},
    "polyprof.session": {
        "resolve_activities": "polyprof.activity_resolution",
        "ActivityUnavailableWarning": _USER_WARNINGS,
        "user_stacklevel": _USER_WARNINGS,
    },
}

#: ``polyprof.event_list``'s warning for a ``key_averages`` aggregator written for polyprof 0.1
#: (``aggregate(trace, use_device=..., group_by_...)``); ``{aggregator}`` is its class's path.
AGGREGATOR_0_1_SIGNATURE: Final = (
    "the key_averages aggregator {aggregator} has polyprof 0.1's "
    "aggregate(trace, use_device=..., group_by_...) signature; polyprof 0.2 passes tree= and "
    "rows= (docs/plugin-author-guide.md, aggregators) and will stop calling the 0.1 form in 0.3"
)


def moved_names(module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of the old module ``module``: its ``MOVED`` names, each with a warning.

    A name ``MOVED`` does not list for ``module`` raises the ``AttributeError`` Python
    raises for a module without it.
    """
    moved = MOVED[module]

    def module_getattr(name: str) -> Any:
        home = moved.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        # Every read warns; Python's filters show it once per line that reads it (so a library's
        # read never hides the user's own). stacklevel 2: Python calls a module's __getattr__
        # straight from the line that reads the name (``from old import name`` or ``old.name``).
        warnings.warn(moved_message(module, name), PolyprofDeprecationWarning, stacklevel=2)
        return value

    return module_getattr


def moved_message(module: str, name: str) -> str:
    """What ``moved_names`` warns when ``module.name``, a ``MOVED`` path, is read."""
    home = MOVED[module][name]
    plugin = f" (a plugin imports it from {PLUGIN_NAMESPACE})" if name in IN_PLUGIN_NAMESPACE else ""
    return (
        f"{module}.{name} has moved to {home}.{name}{plugin}; the old path is removed in "
        f"polyprof {REMOVED_IN}, not before {REMOVAL_DATE}"
    )
