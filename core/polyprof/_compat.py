"""Old import paths and old plugin forms, kept for one minor release: polyprof's one compatibility module.

Every name has one home. Two tables list the paths that moved:

- ``MOVED_MODULES``: the modules that moved into the layer subpackages (``polyprof.tree`` is now
  ``polyprof.analysis.tree``), and the essential built-in plugins that moved into the core
  (``polyprof_builtins.torch_cpu`` is now ``polyprof.runtime.torch_cpu``). Importing an old path
  warns once with a ``PolyprofDeprecationWarning`` naming the new one, and gives the new module
  itself (the same object under both names).
- ``MOVED``: names that left their module for another one; such an old module path gives a
  stand-in that reads (and sets) the new module's names, and reading a moved name there warns,
  naming its new home, and gives the object.

``install()`` (called by ``polyprof/__init__``, so before any ``polyprof.*`` import) puts the finder
for these paths at the end of ``sys.meta_path``: it answers only for a path no real module has.
docs/changelog.md ("Deprecated") lists the same paths with the release that removes them. The
messages of polyprof's other deprecations are kept here as constants, as pytest keeps its own in
``_pytest/deprecated.py``.

Removing the paths in ``REMOVED_IN``: delete both tables, the ``install()`` call in
``polyprof/__init__``, the 0.1 aggregator call in ``polyprof.analysis.event_list`` and then this module.

It imports nothing of polyprof but ``polyprof.base.errors`` at import time.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Final

from polyprof.base.errors import PolyprofDeprecationWarning

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
        "Aggregator",
        "FunctionEventAvg",
        "ActivityUnavailableWarning",
        "user_stacklevel",
        "CATEGORY_BY_KIND",
        "TORCH_COLLECTOR_ACTIVITY_NAMES",
    }
)

#: old module path -> the module it is now. ``polyprof.schedule`` is not here: the name is
#: ``polyprof.schedule()``, the function, whose module is ``polyprof.frontends.schedule``.
MOVED_MODULES: Final[Mapping[str, str]] = {
    "polyprof._log": "polyprof.base.log",
    "polyprof._memory": "polyprof.base._memory",
    "polyprof.activity": "polyprof.base.activity",
    "polyprof.activity_resolution": "polyprof.hooks.activity_resolution",
    "polyprof.attribution": "polyprof.base.attribution",
    "polyprof.autograd_profile": "polyprof.frontends.autograd_profile",
    "polyprof.averages": "polyprof.analysis.averages",
    "polyprof.bus": "polyprof.runtime.bus",
    "polyprof.chrome_reader": "polyprof.formats.chrome_reader",
    "polyprof.cli_convert": "polyprof.cli.cli_convert",
    "polyprof.cli_merge": "polyprof.cli.cli_merge",
    "polyprof.cli_report": "polyprof.cli.cli_report",
    "polyprof.cli_run": "polyprof.cli.cli_run",
    "polyprof.collapsed_stacks": "polyprof.analysis.collapsed_stacks",
    "polyprof.columnar": "polyprof.formats.columnar",
    "polyprof.components": "polyprof.hooks.components",
    "polyprof.config": "polyprof.base.config",
    "polyprof.distributed": "polyprof.base.distributed",
    "polyprof.errors": "polyprof.base.errors",
    "polyprof.event_list": "polyprof.analysis.event_list",
    "polyprof.events": "polyprof.base.events",
    "polyprof.exporting": "polyprof.runtime.exporting",
    "polyprof.fileio": "polyprof.base.fileio",
    "polyprof.frontend_arguments": "polyprof.frontends.frontend_arguments",
    "polyprof.frontend_results": "polyprof.frontends.frontend_results",
    "polyprof.function_events": "polyprof.analysis.function_events",
    "polyprof.hookspecs": "polyprof.hooks.hookspecs",
    "polyprof.kineto_format": "polyprof.base.kineto_format",
    "polyprof.legacy_trace": "polyprof.formats.legacy_trace",
    "polyprof.log": "polyprof.base.log",
    "polyprof.memory_timeline": "polyprof.runtime.memory_timeline",
    "polyprof.merge": "polyprof.ranks.merge",
    "polyprof.native_columns": "polyprof.native.native_columns",
    "polyprof.native_reader": "polyprof.native.native_reader",
    "polyprof.plugin_calls": "polyprof.hooks.plugin_calls",
    "polyprof.plugin_discovery": "polyprof.hooks.plugin_discovery",
    "polyprof.plugin_info": "polyprof.hooks.plugin_info",
    "polyprof.profiler": "polyprof.frontends.profiler",
    "polyprof.rank_analysis": "polyprof.ranks.rank_analysis",
    "polyprof.rank_ray": "polyprof.ranks.rank_ray",
    "polyprof.rank_report": "polyprof.ranks.rank_report",
    "polyprof.rank_report_html": "polyprof.ranks.rank_report_html",
    "polyprof.rank_set": "polyprof.ranks.rank_set",
    "polyprof.record": "polyprof.frontends.record",
    "polyprof.recording": "polyprof.runtime.recording",
    "polyprof.registry": "polyprof.hooks.registry",
    "polyprof.result_rows": "polyprof.runtime.result_rows",
    "polyprof.results": "polyprof.analysis.results",
    "polyprof.run_options": "polyprof.cli.run_options",
    "polyprof.run_target": "polyprof.cli.run_target",
    "polyprof.session": "polyprof.runtime.session",
    "polyprof.shim_arguments": "polyprof.base.shim_arguments",
    "polyprof.shim_classes": "polyprof.frontends.shim_classes",
    "polyprof.table": "polyprof.analysis.table",
    "polyprof.terminal": "polyprof.base.terminal",
    "polyprof.torch_event_surface": "polyprof.analysis.torch_event_surface",
    "polyprof.torch_result": "polyprof.runtime.torch_result",
    "polyprof.torch_support": "polyprof.base.torch_support",
    "polyprof.trace": "polyprof.base.trace",
    "polyprof.tree": "polyprof.analysis.tree",
    "polyprof.user_warnings": "polyprof.base.user_warnings",
    "polyprof.whole_script": "polyprof.cli.whole_script",
    # The essential built-in plugins, now in the core (their entry points name the new paths).
    # ``polyprof_builtins/__init__`` imports polyprof, so this finder serves them in a fresh process.
    "polyprof_builtins.chrome_trace": "polyprof.runtime.chrome_trace",
    "polyprof_builtins.own_frames": "polyprof.runtime.own_frames",
    "polyprof_builtins.parquet_trace": "polyprof.runtime.parquet_trace",
    "polyprof_builtins.torch_cpu": "polyprof.runtime.torch_cpu",
}

_DISCOVERY = "polyprof.hooks.plugin_discovery"
_CALLS = "polyprof.hooks.plugin_calls"
_INFO = "polyprof.hooks.plugin_info"
_EVENT_LIST = "polyprof.analysis.event_list"
_FUNCTION_EVENTS = "polyprof.analysis.function_events"
_SURFACE = "polyprof.analysis.torch_event_surface"
_USER_WARNINGS = "polyprof.base.user_warnings"

#: old module path -> name -> the module that defines the name now (not the old module's new home).
MOVED: Final[Mapping[str, Mapping[str, str]]] = {
    "polyprof.components": {"Aggregator": "polyprof.analysis.averages"},
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
    "polyprof.events": {"CATEGORY_BY_KIND": "polyprof.base.kineto_format"},
    "polyprof.torch_result": {"TORCH_COLLECTOR_ACTIVITY_NAMES": "polyprof.base.activity"},
    "polyprof.session": {
        "resolve_activities": "polyprof.hooks.activity_resolution",
        "ActivityUnavailableWarning": _USER_WARNINGS,
        "user_stacklevel": _USER_WARNINGS,
    },
}

#: ``polyprof.analysis.event_list``'s warning for a ``key_averages`` aggregator written for polyprof
#: 0.1 (``aggregate(trace, use_device=..., group_by_...)``); ``{aggregator}`` is its class's path.
AGGREGATOR_0_1_SIGNATURE: Final = (
    "the key_averages aggregator {aggregator} has polyprof 0.1's "
    "aggregate(trace, use_device=..., group_by_...) signature; polyprof 0.2 passes tree= and "
    "rows= (docs/plugin-author-guide.md, aggregators) and will stop calling the 0.1 form in 0.3"
)


def module_message(old: str) -> str:
    """What importing ``old``, a ``MOVED_MODULES`` path, warns."""
    return (
        f"the module {old} has moved to {MOVED_MODULES[old]}; the old path is removed in "
        f"polyprof {REMOVED_IN}, not before {REMOVAL_DATE}"
    )


def moved_message(module: str, name: str) -> str:
    """What reading ``module.name``, a ``MOVED`` path, warns."""
    home = MOVED[module][name]
    plugin = f" (a plugin imports it from {PLUGIN_NAMESPACE})" if name in IN_PLUGIN_NAMESPACE else ""
    return (
        f"{module}.{name} has moved to {home}.{name}{plugin}; the old path is removed in "
        f"polyprof {REMOVED_IN}, not before {REMOVAL_DATE}"
    )


_ABSENT: Final = object()


class OldModulePath(types.ModuleType):
    """The stand-in for an old module path: every name read or set is the new module's.

    A name listed in ``MOVED`` for the old path comes from its new home, with a warning.
    """

    def __getattr__(self, name: str) -> Any:
        # Only names the stand-in does not hold itself (its module attributes) come here.
        old = self.__name__
        home = MOVED.get(old, {}).get(name)
        if home is None:
            try:
                return getattr(importlib.import_module(MOVED_MODULES[old]), name)
            except AttributeError:
                raise AttributeError(f"module {old!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(home), name)
        # Every read warns; Python's filters show it once per line that reads it. stacklevel 2:
        # Python calls a module's __getattr__ straight from the line that reads the name.
        warnings.warn(moved_message(old, name), PolyprofDeprecationWarning, stacklevel=2)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        # Module attributes the import system sets stay on the stand-in; a patch of a name reaches
        # the module that reads it, and the value it replaced is stacked for ``__delattr__``.
        if name.startswith("__") and name.endswith("__"):
            super().__setattr__(name, value)
            return
        new = importlib.import_module(MOVED_MODULES[self.__name__])
        self.__dict__.setdefault("__replaced__", {}).setdefault(name, []).append(vars(new).get(name, _ABSENT))
        setattr(new, name, value)

    def __delattr__(self, name: str) -> None:
        # Undoing a patch made through the old path (pytest's monkeypatch and unittest.mock delete
        # a name they set that was not in the module's own namespace) puts back the value that
        # patch replaced; nested patches unwind in order.
        new = importlib.import_module(MOVED_MODULES[self.__name__])
        stack = self.__dict__.get("__replaced__", {}).get(name)
        replaced = stack.pop() if stack else _ABSENT
        if replaced is _ABSENT:
            delattr(new, name)
        else:
            setattr(new, name, replaced)

    def __dir__(self) -> list[str]:
        new = importlib.import_module(MOVED_MODULES[self.__name__])
        return sorted(set(dir(new)) | set(MOVED.get(self.__name__, {})))


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old module paths (``MOVED_MODULES``) that no real module answers for.

    An old path is the new module itself (``sys.modules`` holds the one object under both names, so
    pluggy, ``isinstance``, ``importlib.reload`` and patches see what they saw before), except the
    paths ``MOVED`` lists names for: those get an ``OldModulePath`` stand-in, which warns by name.
    """

    def __init__(self) -> None:
        #: The new module's own spec, put back after the import system has set the old path's.
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name in MOVED:
            return OldModulePath(spec.name)
        module = importlib.import_module(MOVED_MODULES[spec.name])
        self._specs[spec.name] = module.__spec__  # the import lock of spec.name guards this entry
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__spec__.name if module.__spec__ is not None else module.__name__
        if isinstance(module, OldModulePath):
            importlib.import_module(MOVED_MODULES[old])  # an import error shows here
        else:
            module.__spec__ = self._specs.pop(old)
        _warn_at_importer(module_message(old))


#: Frames between the line that imports an old path and the warning: the import system's, this
#: module's and the package's (``polyprof.tree`` read as an attribute of ``polyprof``).
_IMPORT_FILES: Final = frozenset(
    {__file__, importlib.__file__, os.path.join(os.path.dirname(__file__), "__init__.py")}
)


def _warn_at_importer(message: str) -> None:
    """Warn at the line that imported the old path: the first frame outside the import system."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (
        frame.f_code.co_filename in _IMPORT_FILES or frame.f_code.co_filename.startswith("<frozen importlib")
    ):
        frame = frame.f_back
    namespace = frame.f_globals
    warnings.warn_explicit(
        message,
        PolyprofDeprecationWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=namespace.get("__name__", "<unknown>"),
        registry=namespace.setdefault("__warningregistry__", {}),
    )


_FINDER: Final = _OldPathFinder()


def install() -> None:
    """Serve the old module paths (once per process; the finder goes last, after every real path)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
