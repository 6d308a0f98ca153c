"""The plugin registry: one pluggy manager per profiling session.

``make_plugin_manager()`` builds a ``PolyprofPluginManager``: it adds
``polyprof.hookspecs``, registers the built-in plugins, then the third-party
plugins found in the ``polyprof`` entry-point group, each through a guarded
loader. A plugin that cannot import, register or describe itself is recorded
(``PluginInfo``) and skipped; the run goes on without it.

Loading order (later registrations are called first by pluggy, so they win):

1. built-ins (``BUILTIN_PLUGINS``): always loaded, never blocked;
2. third-party entry points, in entry-point name order, unless autoload is
   off (``POLYPROF_DISABLE_PLUGIN_AUTOLOAD=1``) or an allow-list
   (``POLYPROF_PLUGINS=a,b``) leaves them out. An entry-point name declared by
   two distributions (or by a third party and a built-in) fails closed: none of
   them loads under it unless the allow-list names the distribution
   (``DIST:NAME``);
3. ``extra_plugins`` given in code (tests, embedding applications).

Then hooks with no specification fail their plugin (pluggy's ``check_pending``
done per plugin), and each plugin's own ``polyprof_capabilities`` says what it
provides and whether it can run here.

Nothing here runs at import time: no global manager exists.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
import re
import threading
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
import pluggy

from polyprof import hookspecs
from polyprof._log import get_logger
from polyprof.activity import DISTRIBUTION_FOR_ACTIVITY, ProfilerActivity, coerce_activity
from polyprof.components import Aggregator, Capabilities, Exporter, Subscriber, Tracer, check_component
from polyprof.errors import ActivityUnavailableError, PluginUnavailable, PolyprofError, PolyprofWarning
from polyprof.torch_result import TORCH_COLLECTOR_ACTIVITY_NAMES

if TYPE_CHECKING:
    from polyprof.config import ProfileConfig

log = get_logger(__name__)

#: The one entry-point group; each entry point names a plugin module.
ENTRY_POINT_GROUP: Final = "polyprof"
#: The distribution whose entry points are the built-in plugins.
CORE_DISTRIBUTION: Final = "polyprof"
#: Built-in plugins: entry-point name -> module. Must match pyproject.toml's
#: ``[project.entry-points.polyprof]`` (a test checks). Used directly when
#: autoload is off or the core's metadata is missing (running from a checkout).
BUILTIN_PLUGINS: Final[Mapping[str, str]] = types.MappingProxyType(
    {
        "torch_cpu": "polyprof_builtins.torch_cpu",
        "key_averages": "polyprof_builtins.key_averages",
        "chrome_trace": "polyprof_builtins.chrome_trace",
        "stacks": "polyprof_builtins.stacks",
        "itt_export": "polyprof_builtins.itt_export",
    }
)

#: Set to 1 to stop loading third-party plugins from entry points.
DISABLE_AUTOLOAD_ENV: Final = "POLYPROF_DISABLE_PLUGIN_AUTOLOAD"
#: Comma-separated third-party plugins to load: ``NAME`` (entry point), ``DIST`` (distribution) or
#: ``DIST:NAME``. Set but blank: no third-party plugin.
ALLOW_LIST_ENV: Final = "POLYPROF_PLUGINS"
#: Set to 1 to log every hook call and result (pluggy hook-call monitoring).
TRACE_ENV: Final = "POLYPROF_TRACE_PLUGINS"

PluginStatus = Literal["loaded", "failed", "unavailable", "blocked"]
PLUGIN_STATUSES: Final[tuple[str, ...]] = ("loaded", "failed", "unavailable", "blocked")

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


class UnknownExporterError(PolyprofError, ValueError):
    """No loaded plugin offers an exporter of the requested name."""


class PluginCallError(PolyprofError):
    """A plugin broke the contract of a hook (duplicate tracers and the like)."""


class PluginSelectionError(PolyprofError, ValueError):
    """The allow-list cannot be resolved safely: a malformed entry, or a name of several distributions."""


class PluginFailureWarning(PolyprofWarning):
    """A plugin failed in a hook or a component; the recording goes on without that part of it."""


@attrs.frozen
class HookFailure:
    """A plugin's hook implementation that raised (or broke the hook's contract) and was skipped."""

    plugin: str
    hook: str
    #: ``"<ExceptionType>: <message>"``.
    error: str
    #: The plugin, its distribution and version, as the user knows it.
    label: str
    traceback: str | None = None

    @property
    def message(self) -> str:
        return f"polyprof: skipped {self.label} in {self.hook}: {self.error}; profiling goes on without it"


@attrs.frozen
class PluginInfo:
    """What the registry knows about one plugin; shown by ``polyprof plugins``."""

    #: Entry-point name (or the name an in-code plugin was registered under).
    name: str
    #: The module (entry-point value) or class that implements the plugin.
    module: str
    #: Distribution that installed it; None for plugins registered in code.
    distribution: str | None
    version: str | None
    #: One of ``PLUGIN_STATUSES``.
    status: PluginStatus = attrs.field(validator=attrs.validators.in_(PLUGIN_STATUSES))
    #: Why it is not loaded (None when loaded).
    reason: str | None = None
    #: Formatted traceback of the failure, when one was caught.
    traceback: str | None = None
    #: What it provides; None when it never got far enough to say.
    capabilities: Capabilities | None = None
    #: Hook names it implements (empty unless it was registered).
    hooks: tuple[str, ...] = ()
    #: Part of the ``polyprof`` distribution itself (always loaded).
    builtin: bool = False
    #: Other distributions that declare the same entry-point name (a conflict: it fails closed).
    conflicts_with: tuple[str, ...] = ()

    @property
    def loaded(self) -> bool:
        return self.status == "loaded"

    @property
    def display_status(self) -> str:
        """``loaded`` (with the plugin's mode, if it says one), or the status and its reason on one line."""
        if self.status == "loaded":
            mode = self.capabilities.mode if self.capabilities is not None else None
            return f"loaded, {mode}" if mode else "loaded"
        if not self.reason:
            return self.status
        return f"{self.status}: {' '.join(self.reason.split())}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``polyprof plugins --json``)."""
        caps = self.capabilities
        return {
            "name": self.name,
            "module": self.module,
            "distribution": self.distribution,
            "version": self.version,
            "builtin": self.builtin,
            "status": self.status,
            "reason": self.reason,
            "display_status": self.display_status,
            "traceback": self.traceback,
            "capabilities": None
            if caps is None
            else {
                "activities": sorted(a.name for a in caps.activities),
                "exporters": list(caps.exporters),
                "aggregators": list(caps.aggregators),
                "unavailable_reason": caps.unavailable_reason,
                "mode": caps.mode,
            },
            "hooks": list(self.hooks),
            "conflicts_with": list(self.conflicts_with),
        }


@attrs.frozen
class EntryPointCandidate:
    """One entry point of the ``polyprof`` group, before it is loaded."""

    name: str
    #: ``module`` or ``module:attribute``.
    value: str
    distribution: str | None
    version: str | None
    #: Anything with ``load()`` (an ``importlib.metadata.EntryPoint``).
    entry_point: Any = attrs.field(eq=False, repr=False)

    @property
    def builtin(self) -> bool:
        return self.distribution is not None and canonical_name(self.distribution) == CORE_DISTRIBUTION


def canonical_name(name: str) -> str:
    """Distribution names compare like pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def env_flag(var: str, environ: Mapping[str, str] | None = None) -> bool:
    """Read a boolean environment variable (1/true/yes/on or 0/false/no/off)."""
    raw = (os.environ if environ is None else environ).get(var, "")
    value = raw.strip().lower()
    if value in _TRUE_WORDS:
        return True
    if value in _FALSE_WORDS:
        return False
    warnings.warn(
        f"{var}={raw!r} is not a recognised boolean; use one of 1, true, yes, on, 0, false, no, off. "
        "Treating it as set.",
        PolyprofWarning,
        stacklevel=3,
    )
    return True


def parse_allow_list(value: str | Iterable[str] | None) -> frozenset[str] | None:
    """``"a, b"`` or ``["a", "b"]`` -> ``{"a", "b"}``; None -> None (no allow-list).

    A blank string is an empty allow-list: no third-party plugin loads. An
    allow-list that was set fails closed, however it was emptied.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    names = frozenset(name.strip() for name in value if name and name.strip())
    return names


def _spelled(candidate: EntryPointCandidate) -> str:
    """How the allow-list names exactly this entry point."""
    return f"{candidate.distribution}:{candidate.name}"


def _dist_key(candidate: EntryPointCandidate) -> str:
    return canonical_name(candidate.distribution or "")


def resolve_allow_list(
    allowed: frozenset[str],
    third_party: Sequence[EntryPointCandidate],
    builtin_names: Iterable[str] = BUILTIN_PLUGINS,
    source: str = ALLOW_LIST_ENV,
) -> tuple[set[EntryPointCandidate], list[str]]:
    """The third-party entry points ``allowed`` selects, and its entries that match nothing.

    An entry is ``NAME`` (an entry-point name), ``DIST`` (every entry point of
    that distribution) or ``DIST:NAME``. A bare word that several
    distributions answer to is refused, as is a selection that puts two
    plugins under one entry-point name: a squatting distribution must never
    be picked by accident. Built-in names are always allowed (and never a
    third party's).

    :raises PluginSelectionError: naming the entry and the candidates.
    """
    builtin_names = set(builtin_names)
    selected: set[EntryPointCandidate] = set()
    unknown: list[str] = []
    for entry in sorted(allowed):
        if ":" in entry:
            dist, _, name = (part.strip() for part in entry.partition(":"))
            if not dist or not name:
                raise PluginSelectionError(
                    f"{source} entry {entry!r} is malformed; write NAME, DIST or DIST:NAME "
                    "(e.g. polyprof-cuda:cuda)"
                )
            matches = [c for c in third_party if _dist_key(c) == canonical_name(dist) and c.name == name]
            if not matches and not (canonical_name(dist) == CORE_DISTRIBUTION and name in builtin_names):
                unknown.append(entry)
            selected.update(matches)
            continue
        if entry in builtin_names:
            continue  # built-ins always load; a third party cannot take their names
        matches = [c for c in third_party if c.name == entry or _dist_key(c) == canonical_name(entry)]
        if not matches:
            unknown.append(entry)
            continue
        if len({_dist_key(c) for c in matches}) > 1:
            choices = ", ".join(sorted(_spelled(c) for c in matches))
            raise PluginSelectionError(
                f"{source} entry {entry!r} is ambiguous: it matches plugins of several distributions "
                f"({choices}); name the one to load as DIST:NAME"
            )
        selected.update(matches)
    by_name: dict[str, list[EntryPointCandidate]] = {}
    for candidate in selected:
        by_name.setdefault(candidate.name, []).append(candidate)
    for name, same in sorted(by_name.items()):
        if len(same) > 1:
            choices = ", ".join(sorted(_spelled(c) for c in same))
            raise PluginSelectionError(
                f"{source} selects {len(same)} plugins with the entry-point name {name!r} ({choices}); "
                "only one can load under a name: keep one"
            )
    return selected, unknown


def discover_entry_points(group: str = ENTRY_POINT_GROUP) -> list[EntryPointCandidate]:
    """Every entry point of ``group`` across installed distributions.

    A distribution found twice on ``sys.path`` (an ``.egg-info`` in the working
    directory next to the installed ``.dist-info``) counts once: the first, as
    Python's import system would pick it. Unreadable metadata is logged and
    skipped.
    """
    seen: set[str] = set()
    found: list[EntryPointCandidate] = []
    for dist in importlib.metadata.distributions():
        try:
            dist_name = dist.metadata["Name"] or getattr(dist, "name", None)
            if not dist_name:
                continue
            key = canonical_name(dist_name)
            if key in seen:
                continue
            seen.add(key)
            eps = [ep for ep in dist.entry_points if ep.group == group]
            version = dist.version
        except Exception as exc:  # broken metadata must not stop discovery
            log.warning("distribution_metadata_unreadable", error=f"{type(exc).__name__}: {exc}")
            continue
        for ep in eps:
            found.append(EntryPointCandidate(ep.name, ep.value, dist_name, version, ep))
    return found


def _builtin_entry_point(name: str, module: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=module, group=ENTRY_POINT_GROUP)


def _core_version() -> str:
    from polyprof import __version__

    return __version__


def _describe_exception(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(text)


def _short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _default_plugin_name(plugin: object) -> str:
    if isinstance(plugin, types.ModuleType):
        return plugin.__name__
    explicit = getattr(plugin, "plugin_name", None)
    if isinstance(explicit, str) and explicit:
        return explicit
    if isinstance(plugin, type):
        return plugin.__qualname__
    return type(plugin).__name__


def _module_of(plugin: object) -> str:
    if isinstance(plugin, types.ModuleType):
        return plugin.__name__
    cls = plugin if isinstance(plugin, type) else type(plugin)
    return f"{cls.__module__}:{cls.__qualname__}"


class PolyprofPluginManager(pluggy.PluginManager):
    """A pluggy manager that records each plugin's status and builds components.

    Build one with ``make_plugin_manager()``. Component builders
    (``make_tracers``, ``make_exporter``, ...) call each plugin's hook
    implementation on its own, so every returned object is type-checked and a
    failure names the plugin. Hook wrappers on those hooks run around each
    implementation separately.
    """

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self._infos: dict[str, PluginInfo] = {}
        self._lock = threading.RLock()
        self._exporters_made: list[Exporter] = []
        self._undo_monitoring: Callable[[], None] | None = None
        self._hook_failures: list[HookFailure] = []
        # Which plugin made each component (held, so an id is never reused while recorded).
        self._component_plugins: dict[int, tuple[object, str]] = {}

    # ------------------------------------------------------------ plugin records

    def plugin_infos(self) -> tuple[PluginInfo, ...]:
        """Every plugin seen, in load order, whatever its status."""
        with self._lock:
            return tuple(self._infos.values())

    def plugin_info(self, name: str) -> PluginInfo:
        """The record of plugin ``name``; ``KeyError`` lists the known names."""
        with self._lock:
            try:
                return self._infos[name]
            except KeyError:
                raise KeyError(
                    f"no plugin named {name!r}; known plugins: {', '.join(self._infos) or 'none'}"
                ) from None

    def describe_plugin(self, name: str) -> str:
        """``plugin 'cuda' (polyprof-cuda 0.3.1)``: the plugin as its user installed it."""
        with self._lock:
            info = self._infos.get(name)
        if info is None or info.distribution is None:
            return f"plugin {name!r}"
        version = f" {info.version}" if info.version else ""
        return f"plugin {name!r} ({info.distribution}{version})"

    def plugin_of(self, component: object) -> str | None:
        """The name of the plugin whose hook returned ``component``, if this manager made it."""
        with self._lock:
            entry = self._component_plugins.get(id(component))
        return entry[1] if entry is not None and entry[0] is component else None

    def hook_failures(self) -> tuple[HookFailure, ...]:
        """Hook implementations that failed and were skipped (``isolate_errors``), oldest first."""
        with self._lock:
            return tuple(self._hook_failures)

    def _hook_failed(self, plugin: str, hook: str, exc: BaseException) -> None:
        failure = HookFailure(
            plugin=plugin,
            hook=hook,
            error=_describe_exception(exc),
            label=self.describe_plugin(plugin),
            traceback=_format_traceback(exc),
        )
        with self._lock:
            self._hook_failures.append(failure)
            distribution = self._infos[plugin].distribution if plugin in self._infos else None
        log.warning(
            "plugin_hook_failed",
            plugin=plugin,
            distribution=distribution,
            hook=hook,
            error=failure.error,
            exc_info=exc,
        )

    def _record(self, info: PluginInfo) -> PluginInfo:
        with self._lock:
            self._infos[info.name] = info
        return info

    def _set_status(
        self,
        name: str,
        status: PluginStatus,
        reason: str | None,
        tb: str | None = None,
        *,
        capabilities: Capabilities | None = None,
    ) -> None:
        with self._lock:
            old = self._infos[name]
            self._infos[name] = attrs.evolve(
                old,
                status=status,
                reason=reason,
                traceback=tb if tb is not None else old.traceback,
                capabilities=capabilities if capabilities is not None else old.capabilities,
            )

    # ------------------------------------------------------------------ loading

    def load_entry_point(self, candidate: EntryPointCandidate, *, builtin: bool | None = None) -> PluginInfo:
        """Import and register one entry point, guarded; returns its record."""
        base = PluginInfo(
            name=candidate.name,
            module=candidate.value,
            distribution=candidate.distribution,
            version=candidate.version,
            status="loaded",
            builtin=candidate.builtin if builtin is None else builtin,
        )
        if candidate.name in self._infos:
            other = self._infos[candidate.name]
            return self._record(
                attrs.evolve(
                    base,
                    name=f"{candidate.name} ({candidate.distribution})",
                    status="failed",
                    reason=(
                        f"entry point name {candidate.name!r} is already taken by plugin {other.name!r} "
                        f"from {other.distribution or 'code'}; rename one of the entry points"
                    ),
                )
            )
        try:
            plugin = candidate.entry_point.load()
        except PluginUnavailable as exc:
            log.info(
                "plugin_unavailable",
                plugin=candidate.name,
                distribution=candidate.distribution,
                reason=str(exc),
            )
            return self._record(attrs.evolve(base, status="unavailable", reason=str(exc) or "unavailable"))
        except Exception as exc:
            tb = _format_traceback(exc)
            log.warning(
                "plugin_load_failed",
                plugin=candidate.name,
                distribution=candidate.distribution,
                module=candidate.value,
                error=_describe_exception(exc),
            )
            return self._record(
                attrs.evolve(base, status="failed", reason=_describe_exception(exc), traceback=tb)
            )
        return self._register_guarded(plugin, base)

    def add_plugin(self, plugin: object, name: str | None = None) -> PluginInfo:
        """Register a plugin object given in code, guarded; returns its record.

        Call ``finish_loading()`` afterwards to check hook names and read
        capabilities (``make_plugin_manager`` does).
        """
        if name is None:
            name = _default_plugin_name(plugin)
            unique, n = name, 2
            while unique in self._infos:
                unique, n = f"{name}-{n}", n + 1
            name = unique
        elif name in self._infos:
            raise ValueError(f"a plugin named {name!r} is already registered; pick another name")
        base = PluginInfo(
            name=name, module=_module_of(plugin), distribution=None, version=None, status="loaded"
        )
        return self._register_guarded(plugin, base)

    def _register_guarded(self, plugin: object, base: PluginInfo) -> PluginInfo:
        try:
            self.register(plugin, name=base.name)
        except PluginUnavailable as exc:  # raised from a historic hook replayed at registration
            self._forget(base.name)
            log.info("plugin_unavailable", plugin=base.name, reason=str(exc))
            return self._record(attrs.evolve(base, status="unavailable", reason=str(exc) or "unavailable"))
        except Exception as exc:
            self._forget(base.name)
            log.warning("plugin_register_failed", plugin=base.name, error=_describe_exception(exc))
            return self._record(
                attrs.evolve(
                    base, status="failed", reason=_describe_exception(exc), traceback=_format_traceback(exc)
                )
            )
        hooks = tuple(sorted(caller.name for caller in self.get_hookcallers(plugin) or ()))
        return self._record(attrs.evolve(base, hooks=hooks))

    def _forget(self, name: str) -> None:
        """Unregister ``name`` if registered; never raises."""
        try:
            if self.get_plugin(name) is not None:
                self.unregister(name=name)
        except Exception as exc:  # a half-registered plugin must not stop the others
            log.warning("plugin_unregister_failed", plugin=name, error=_describe_exception(exc))

    def finish_loading(self) -> None:
        """Fail plugins with unknown hooks, then read every plugin's capabilities."""
        self._fail_unknown_hooks()
        for info in self.plugin_infos():
            if info.status == "loaded" and info.capabilities is None:
                self._read_capabilities(info.name)

    def _fail_unknown_hooks(self) -> None:
        """``check_pending`` per plugin: a misspelled hook fails only its own plugin."""
        known = sorted(
            name for name, caller in vars(self.hook).items() if not name.startswith("_") and caller.has_spec()
        )
        unknown: dict[str, list[str]] = {}
        for hook_name, caller in list(vars(self.hook).items()):
            if hook_name.startswith("_") or caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if not impl.optionalhook:
                    unknown.setdefault(impl.plugin_name, []).append(hook_name)
        for plugin_name, hook_names in unknown.items():
            parts = []
            for hook_name in sorted(hook_names):
                close = difflib.get_close_matches(hook_name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                parts.append(f"{hook_name!r}{hint}")
            reason = (
                f"unknown hook {', '.join(parts)}: no such hook specification; "
                f"known hooks: {', '.join(known)} (mark optional hooks with optionalhook=True)"
            )
            log.warning("plugin_unknown_hook", plugin=plugin_name, hooks=sorted(hook_names))
            self._forget(plugin_name)
            if plugin_name in self._infos:
                self._set_status(plugin_name, "failed", reason)

    def _read_capabilities(self, name: str) -> None:
        """Call this plugin's own ``polyprof_capabilities`` (first non-None result)."""
        plugin = self.get_plugin(name)
        caller = self.hook.polyprof_capabilities
        impls = [i for i in caller.get_hookimpls() if i.plugin is plugin and not (i.wrapper or i.hookwrapper)]
        capabilities = Capabilities()
        for impl in reversed(impls):
            try:
                result = impl.function()
            except PluginUnavailable as exc:
                reason = str(exc) or "unavailable"
                log.info("plugin_unavailable", plugin=name, reason=reason)
                self._forget(name)
                self._set_status(
                    name, "unavailable", reason, capabilities=Capabilities(unavailable_reason=reason)
                )
                return
            except Exception as exc:
                log.warning("plugin_capabilities_failed", plugin=name, error=_describe_exception(exc))
                self._forget(name)
                self._set_status(
                    name,
                    "failed",
                    f"polyprof_capabilities raised {_describe_exception(exc)}",
                    _format_traceback(exc),
                )
                return
            if result is None:
                continue
            if not isinstance(result, Capabilities):
                self._forget(name)
                self._set_status(
                    name,
                    "failed",
                    f"polyprof_capabilities returned {_short_repr(result)}, which is not a Capabilities",
                )
                return
            try:
                activities = frozenset(coerce_activity(a) for a in result.activities)
            except ValueError as exc:
                self._forget(name)
                self._set_status(name, "failed", f"polyprof_capabilities declared a bad activity: {exc}")
                return
            capabilities = attrs.evolve(result, activities=activities)
            break
        if capabilities.unavailable_reason:
            log.info("plugin_unavailable", plugin=name, reason=capabilities.unavailable_reason)
            # An unavailable plugin takes no part in sessions; its record still says what it would provide.
            self._forget(name)
            self._set_status(name, "unavailable", capabilities.unavailable_reason, capabilities=capabilities)
            return
        self._set_status(name, "loaded", None, capabilities=capabilities)

    # --------------------------------------------------------------- debugging

    def enable_hook_logging(self) -> Callable[[], None]:
        """Log every hook call (name, plugins, arguments) and its outcome; returns an undo function."""

        def before(hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
            log.info(
                "hook_call",
                hook=hook_name,
                plugins=[i.plugin_name for i in impls],
                kwargs={k: _short_repr(v) for k, v in kwargs.items()},
            )

        def after(
            outcome: pluggy.Result[Any], hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Any
        ) -> None:
            if outcome.exception is not None:
                log.info("hook_error", hook=hook_name, error=_describe_exception(outcome.exception))
            else:
                log.info("hook_result", hook=hook_name, result=_short_repr(outcome.get_result()))

        undo = self.add_hookcall_monitoring(before, after)
        self._undo_monitoring = undo
        return undo

    # -------------------------------------------------------- calling plugins

    def call_each(
        self, hook_name: str, *, isolate_errors: bool = False, **kwargs: Any
    ) -> list[tuple[str, Any]]:
        """Call ``hook_name`` plugin by plugin (pluggy's order); ``[(plugin, result), ...]``.

        ``None`` results are left out; a firstresult hook stops at the first
        other result. An exception gets a note naming the plugin and is raised,
        or, with ``isolate_errors``, logged, recorded (``hook_failures``) and
        skipped. ``PluginUnavailable`` marks the plugin unavailable and skips it.
        """
        return list(self._iter_each(hook_name, kwargs, isolate_errors=isolate_errors))

    def _iter_each(
        self,
        hook_name: str,
        kwargs: Mapping[str, Any],
        *,
        isolate_errors: bool = False,
        only: pluggy.HookImpl | None = None,
    ) -> Iterator[tuple[str, Any]]:
        caller = getattr(self.hook, hook_name, None)
        if caller is None or not caller.has_spec():
            known = sorted(n for n, c in vars(self.hook).items() if not n.startswith("_") and c.has_spec())
            raise ValueError(f"no hook named {hook_name!r}; known hooks: {', '.join(known)}")
        spec = caller.spec
        firstresult = bool(spec.opts.get("firstresult")) if spec is not None else False
        call_kwargs = {**(spec.kwargdefaults if spec is not None else {}), **kwargs}
        impls = caller.get_hookimpls()
        wrappers = [i for i in impls if i.wrapper or i.hookwrapper]
        for impl in reversed([i for i in impls if not (i.wrapper or i.hookwrapper)]):
            if only is not None and impl is not only:
                continue
            try:
                outcome = self._hookexec(hook_name, [impl, *wrappers], call_kwargs, firstresult)
            except PluginUnavailable as exc:
                reason = str(exc) or "unavailable"
                log.info("plugin_unavailable", plugin=impl.plugin_name, hook=hook_name, reason=reason)
                if impl.plugin_name in self._infos:
                    self._set_status(impl.plugin_name, "unavailable", reason)
                continue
            except Exception as exc:
                if not isolate_errors:
                    _note(exc, f"raised by polyprof plugin {impl.plugin_name!r} in {hook_name}")
                    raise
                self._hook_failed(impl.plugin_name, hook_name, exc)
                continue
            results = [outcome] if firstresult else list(outcome)  # type: ignore[arg-type]
            for result in results:
                if result is not None:
                    yield impl.plugin_name, result
                    if firstresult:
                        return

    def _components(
        self, hook_name: str, kind: type, config: ProfileConfig, *, isolate_errors: bool = False
    ) -> list[tuple[str, Any]]:
        found = []
        for plugin, result in self._iter_each(hook_name, {"config": config}, isolate_errors=isolate_errors):
            try:
                components = self._checked_components(plugin, hook_name, kind, result)
            except TypeError as exc:
                if not isolate_errors:
                    raise
                self._hook_failed(plugin, hook_name, exc)  # all or nothing from this plugin
                continue
            found.extend((plugin, component) for component in components)
        return found

    def _checked_components(self, plugin: str, hook_name: str, kind: type, result: Any) -> list[Any]:
        if (
            isinstance(result, kind)
            or isinstance(result, str | bytes | Mapping)
            or not isinstance(result, Iterable)
        ):
            raise TypeError(
                f"plugin {plugin!r}: {hook_name} must return a list of {kind.__name__} objects "
                f"(or None), not {_short_repr(result)}"
            )
        components = list(result)
        for component in components:
            try:
                check_component(component, kind, plugin)
            except TypeError as exc:
                _note(exc, f"returned from {hook_name}")
                raise
        self._remember_origin(plugin, components)
        return components

    def _remember_origin(self, plugin: str, components: Iterable[object]) -> None:
        with self._lock:
            for component in components:
                self._component_plugins[id(component)] = (component, plugin)

    # ------------------------------------------------------------ activities

    def provider_of(self, activity: Any) -> PluginInfo | None:
        """The loaded plugin that provides ``activity`` (the last registered wins), or None."""
        activity = coerce_activity(activity)
        for info in reversed(self.plugin_infos()):
            if info.loaded and info.capabilities is not None and activity in info.capabilities.activities:
                return info
        return None

    def supported_activities(self) -> frozenset[ProfilerActivity]:
        """Activities that some loaded plugin can record here."""
        return frozenset(
            act
            for info in self.plugin_infos()
            if info.loaded and info.capabilities
            for act in info.capabilities.activities
        )

    def check_activities(self, activities: Iterable[Any]) -> dict[ProfilerActivity, PluginInfo]:
        """Map each activity to its provider, or raise ``ActivityUnavailableError`` saying what to do."""
        providers: dict[ProfilerActivity, PluginInfo] = {}
        problems = []
        for value in activities:
            activity = coerce_activity(value)
            info = self.provider_of(activity)
            if info is None:
                problems.append(self.explain_missing_activity(activity))
            else:
                providers[activity] = info
        if problems:
            raise ActivityUnavailableError("; ".join(problems))
        return providers

    def explain_missing_activity(self, activity: ProfilerActivity) -> str:
        """Why no loaded plugin records ``activity``, and what the user can do."""
        label = f"ProfilerActivity.{activity.name}"
        dist = DISTRIBUTION_FOR_ACTIVITY.get(activity)
        # A plugin that declared the activity, or comes from the distribution that should, but is not loaded.
        for info in reversed(self.plugin_infos()):
            declares = info.capabilities is not None and activity in info.capabilities.activities
            from_dist = (
                dist is not None
                and info.distribution is not None
                and canonical_name(info.distribution) == dist
            )
            if not info.loaded and (declares or from_dist):
                origin = (
                    f"the {info.distribution} plugin {info.name!r}"
                    if info.distribution
                    else f"plugin {info.name!r}"
                )
                what = {
                    "failed": "is installed but failed to load",
                    "unavailable": "is installed but unavailable here",
                    "blocked": "is installed but blocked",
                }[info.status]
                detail = f": {info.reason}" if info.reason else ""
                return f"{label} comes from {origin}, which {what}{detail}"
        if dist is not None:
            return f"{label} needs the {dist} plugin: pip install {dist}"
        offered = sorted(a.name for a in self.supported_activities())
        return (
            f"{label}: no installed polyprof plugin provides it; "
            f"activities available here: {', '.join(offered) or 'none'} (see `polyprof plugins`)"
        )

    # ------------------------------------------------------------ components

    def make_tracers(
        self, config: ProfileConfig, *, require_all: bool = True, isolate_errors: bool = False
    ) -> list[Tracer]:
        """Tracers from every plugin for ``config.activities``.

        Raises ``PluginCallError`` when two tracers claim the same activity or
        name, and (with ``require_all``) ``ActivityUnavailableError`` when an
        activity asked for has no tracer. With ``isolate_errors``, a plugin
        whose hook raises or returns something other than tracers is skipped
        and recorded (``hook_failures``); the activities it provides are then
        left out rather than an error.
        """
        failures_before = len(self.hook_failures())
        tracers: list[Tracer] = []
        by_activity: dict[ProfilerActivity, tuple[str, Tracer]] = {}
        by_name: dict[str, str] = {}
        made = self._components("polyprof_make_tracers", Tracer, config, isolate_errors=isolate_errors)
        for plugin, tracer in made:
            if tracer.name in by_name:
                raise PluginCallError(
                    f"plugins {by_name[tracer.name]!r} and {plugin!r} both returned a tracer named "
                    f"{tracer.name!r}; tracer names must be unique per session"
                )
            by_name[tracer.name] = plugin
            for activity in tracer.activities:
                activity = coerce_activity(activity)
                if activity in by_activity:
                    other_plugin, other = by_activity[activity]
                    raise PluginCallError(
                        f"ProfilerActivity.{activity.name} is claimed by tracer {other.name!r} of plugin "
                        f"{other_plugin!r} and by tracer {tracer.name!r} of plugin {plugin!r}; "
                        f"uninstall one or leave it out with {ALLOW_LIST_ENV}"
                    )
                by_activity[activity] = (plugin, tracer)
            tracers.append(tracer)
        if require_all:
            failed = {f.plugin for f in self.hook_failures()[failures_before:]}
            missing = sorted(set(map(coerce_activity, config.activities)) - set(by_activity))
            if missing:
                problems = []
                for activity in missing:
                    info = self.provider_of(activity)
                    if info is not None and info.name in failed:
                        continue  # recorded as a hook failure; the caller goes on without it
                    if info is None:
                        problems.append(self.explain_missing_activity(activity))
                    else:
                        problems.append(
                            f"ProfilerActivity.{activity.name}: plugin {info.name!r} declares it but "
                            "returned no tracer for it"
                        )
                if problems:
                    raise ActivityUnavailableError("; ".join(problems))
        return tracers

    def torch_collector_activities(
        self, config: ProfileConfig, *, isolate_errors: bool = False
    ) -> frozenset[str]:
        """The union of the activities plugins ask torch's collector to record.

        From ``polyprof_torch_collector_activities``, once per session.

        Raises ``PluginCallError`` for an answer that is not a collection of
        ``torch.profiler.ProfilerActivity`` member names; with ``isolate_errors``
        that plugin's answer (or exception) is skipped and recorded instead.
        """
        hook = "polyprof_torch_collector_activities"
        names: set[str] = set()
        for plugin, answer in self._iter_each(hook, {"config": config}, isolate_errors=isolate_errors):
            try:
                names.update(self._checked_collector_answer(plugin, answer))
            except PluginCallError as exc:
                if not isolate_errors:
                    raise
                self._hook_failed(plugin, hook, exc)
        return frozenset(names)

    @staticmethod
    def _checked_collector_answer(plugin: str, answer: Any) -> list[str]:
        names = None if isinstance(answer, str | bytes) or not isinstance(answer, Iterable) else list(answer)
        if names is None or not all(isinstance(n, str) for n in names):
            raise PluginCallError(
                f"plugin {plugin!r} answered polyprof_torch_collector_activities with {answer!r}; "
                "expected names of torch.profiler.ProfilerActivity members, e.g. ['CUDA']"
            )
        unknown = sorted(set(names) - set(TORCH_COLLECTOR_ACTIVITY_NAMES))
        if unknown:
            raise PluginCallError(
                f"plugin {plugin!r} asked torch's collector for {', '.join(unknown)}; valid: "
                f"{', '.join(TORCH_COLLECTOR_ACTIVITY_NAMES)}"
            )
        return names

    def make_subscribers(self, config: ProfileConfig, *, isolate_errors: bool = False) -> list[Subscriber]:
        """Subscribers from every plugin, in pluggy's call order (``isolate_errors``: as ``make_tracers``)."""
        hook = "polyprof_make_subscribers"
        return [s for _, s in self._components(hook, Subscriber, config, isolate_errors=isolate_errors)]

    def make_aggregators(
        self, config: ProfileConfig, *, isolate_errors: bool = False
    ) -> dict[str, Aggregator]:
        """Aggregators by name; for a name offered twice, the later-registered plugin wins.

        ``isolate_errors``: a failing plugin is skipped and recorded, as in ``make_tracers``.
        """
        chosen: dict[str, tuple[str, Aggregator]] = {}
        # pluggy calls later registrations first (built-ins are trylast), so the first seen wins.
        hook = "polyprof_make_aggregators"
        for plugin, aggregator in self._components(hook, Aggregator, config, isolate_errors=isolate_errors):
            if aggregator.name in chosen:
                log.debug(
                    "aggregator_shadowed",
                    name=aggregator.name,
                    kept_plugin=chosen[aggregator.name][0],
                    shadowed_plugin=plugin,
                )
                continue
            chosen[aggregator.name] = (plugin, aggregator)
        return {name: aggregator for name, (_, aggregator) in chosen.items()}

    def exporter_names(self) -> list[str]:
        """Exporter names declared by loaded plugins (their ``Capabilities.exporters``), sorted."""
        return sorted(
            {
                name
                for info in self.plugin_infos()
                if info.loaded and info.capabilities
                for name in info.capabilities.exporters
            }
        )

    def make_exporter(self, config: ProfileConfig, name: str, *, isolate_errors: bool = False) -> Exporter:
        """The exporter called ``name`` from the first plugin that has it.

        Raises ``UnknownExporterError`` listing the available names. With
        ``isolate_errors``, a plugin whose hook raises or returns something
        other than an ``Exporter`` is skipped (and recorded) and the next one
        asked.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"exporter name must be a non-empty str, not {name!r}")
        hook = "polyprof_make_exporter"
        caller = self.hook.polyprof_make_exporter
        impls = [i for i in caller.get_hookimpls() if not (i.wrapper or i.hookwrapper)]
        # One plugin at a time, so that a plugin skipped for a bad answer hands over to the next.
        for impl in reversed(impls):
            answers = self._iter_each(
                hook, {"config": config, "name": name}, isolate_errors=isolate_errors, only=impl
            )
            for plugin, exporter in answers:
                try:
                    check_component(exporter, Exporter, plugin)
                except TypeError as exc:
                    _note(exc, f"returned from polyprof_make_exporter(name={name!r})")
                    if not isolate_errors:
                        raise
                    self._hook_failed(plugin, hook, exc)
                    continue
                self._remember_origin(plugin, [exporter])
                with self._lock:
                    self._exporters_made.append(exporter)
                return exporter
        for info in self.plugin_infos():
            if not info.loaded and info.capabilities is not None and name in info.capabilities.exporters:
                raise UnknownExporterError(
                    f"exporter {name!r} comes from plugin {info.name!r}, which is {info.display_status}"
                )
        available = self.exporter_names()
        raise UnknownExporterError(
            f"no exporter named {name!r}; available exporters: {', '.join(available) or 'none'} "
            "(see `polyprof plugins`)"
        )

    # -------------------------------------------------------------- shutdown

    def close(self) -> None:
        """Shut down every exporter this manager made; errors are logged, not raised."""
        with self._lock:
            exporters, self._exporters_made = self._exporters_made, []
        for exporter in exporters:
            try:
                exporter.shutdown()
            except Exception as exc:
                log.warning(
                    "exporter_shutdown_failed",
                    exporter=getattr(exporter, "name", "?"),
                    error=_describe_exception(exc),
                )
        if self._undo_monitoring is not None:
            self._undo_monitoring()
            self._undo_monitoring = None

    def __enter__(self) -> PolyprofPluginManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _conflict_reason(
    candidate: EntryPointCandidate,
    rivals: Sequence[str],
    selected: set[EntryPointCandidate],
    *,
    builtin: bool,
    source: str,
) -> str | None:
    """Why ``candidate`` may not load under its entry-point name, or None when it may."""
    name = candidate.name
    if builtin:  # built-ins load first and are never replaced
        return (
            f"conflict: entry-point name {name!r} belongs to a plugin polyprof always loads; "
            "a third-party plugin cannot take it (rename the entry point)"
        )
    if not rivals or candidate in selected:
        return None
    chosen = sorted(c.distribution or "?" for c in selected if c.name == name)
    if chosen:
        return f"conflict: entry-point name {name!r} is also declared by {chosen[0]}, which {source} picks"
    return (
        f"conflict: entry-point name {name!r} is also declared by {', '.join(rivals)}; none of them loads "
        f"unless {ALLOW_LIST_ENV} names one as DIST:NAME (e.g. {_spelled(candidate)})"
    )


def make_plugin_manager(
    *,
    autoload: bool | None = None,
    allow: str | Iterable[str] | None = None,
    extra_plugins: Iterable[object | tuple[str, object]] = (),
    builtins: bool = True,
    entry_points: bool = True,
) -> PolyprofPluginManager:
    """Build a fresh plugin manager for one profiling session.

    :param autoload: load third-party plugins from entry points; None reads
        ``POLYPROF_DISABLE_PLUGIN_AUTOLOAD`` (default: on). Built-ins load either way.
        With autoload off, third-party plugins named in the allow-list still load.
    :param allow: the third-party plugins to load, each ``NAME`` (entry point),
        ``DIST`` (distribution) or ``DIST:NAME``; None reads ``POLYPROF_PLUGINS``
        (unset: all; set but blank: none). Unknown names warn; a bare name that
        several distributions provide raises ``PluginSelectionError``.
    :param extra_plugins: plugin objects (or ``(name, plugin)`` pairs) registered
        after all others, so their hook implementations are called first.
    :param builtins: register the built-in plugins (tests may turn this off).
    :param entry_points: look at installed entry points at all; False gives an
        isolated manager (built-ins then load by module path).
    """
    pm = PolyprofPluginManager()
    pm.add_hookspecs(hookspecs)
    if env_flag(TRACE_ENV):
        pm.enable_hook_logging()
    pm.hook.polyprof_addhooks.call_historic(kwargs={"pluginmanager": pm})

    autoload = not env_flag(DISABLE_AUTOLOAD_ENV) if autoload is None else bool(autoload)
    allowed = parse_allow_list(os.environ.get(ALLOW_LIST_ENV) if allow is None else allow)
    allow_source = ALLOW_LIST_ENV if allow is None else "the allow-list"

    candidates = discover_entry_points() if entry_points else []
    core = {c.name: c for c in candidates if c.builtin}
    third_party = sorted(
        (c for c in candidates if not c.builtin), key=lambda c: (c.name, c.distribution or "")
    )

    if builtins:
        version = _core_version()
        builtin_names = dict(BUILTIN_PLUGINS)
        if autoload:  # a newer core may declare built-ins this module does not list yet
            builtin_names.update({name: c.value for name, c in core.items()})
        for name, module in builtin_names.items():
            candidate = core.get(name) if autoload else None
            if candidate is None:  # autoload off, or no core metadata: load by module path
                candidate = EntryPointCandidate(
                    name, module, CORE_DISTRIBUTION, version, _builtin_entry_point(name, module)
                )
            pm.load_entry_point(candidate, builtin=True)

    selected: set[EntryPointCandidate] = set()
    if allowed:
        # Resolved before anything third-party is imported: a refused allow-list loads nothing.
        selected, unknown = resolve_allow_list(allowed, third_party, {*BUILTIN_PLUGINS, *core}, allow_source)
        if unknown:
            installed = sorted({c.name for c in third_party})
            message = (
                f"{allow_source} names plugins that are not installed: {', '.join(unknown)}; "
                f"installed third-party plugins: {', '.join(installed) or 'none'}"
            )
            warnings.warn(message, PolyprofWarning, stacklevel=2)

    providers: dict[str, list[EntryPointCandidate]] = {}
    for candidate in third_party:
        providers.setdefault(candidate.name, []).append(candidate)
    builtin_names = {name: info.distribution or CORE_DISTRIBUTION for name, info in pm._infos.items()}
    for candidate in third_party:
        named = candidate in selected
        if candidate.name in builtin_names:
            rivals = [builtin_names[candidate.name]]
        else:
            others = (c for c in providers[candidate.name] if _dist_key(c) != _dist_key(candidate))
            rivals = sorted({c.distribution or "?" for c in others})
        conflict = _conflict_reason(
            candidate, rivals, selected, builtin=candidate.name in builtin_names, source=allow_source
        )
        if conflict is not None:
            log.warning(
                "plugin_name_conflict",
                plugin=candidate.name,
                distribution=candidate.distribution,
                conflicts_with=rivals,
            )
            reason = conflict
        elif allowed is not None and not named:
            listed = ", ".join(sorted(allowed))
            reason = f"not in {allow_source} ({listed})" if listed else f"{allow_source} is empty"
        elif not autoload and not named:
            reason = f"autoload is off ({DISABLE_AUTOLOAD_ENV}=1) and it is not named in {ALLOW_LIST_ENV}"
        else:
            pm.load_entry_point(candidate, builtin=False)
            continue
        # A blocked rival is listed under its distribution too, so both show in `polyprof plugins`.
        key = candidate.name if conflict is None else f"{candidate.name} ({candidate.distribution})"
        pm._record(
            PluginInfo(
                name=key,
                module=candidate.value,
                distribution=candidate.distribution,
                version=candidate.version,
                status="blocked",
                reason=reason,
                conflicts_with=tuple(rivals) if conflict is not None else (),
            )
        )

    for item in extra_plugins:
        if isinstance(item, tuple):
            name, plugin = item
            pm.add_plugin(plugin, name=name)
        else:
            pm.add_plugin(item)

    pm.finish_loading()
    return pm


__all__ = [
    "ALLOW_LIST_ENV",
    "BUILTIN_PLUGINS",
    "CORE_DISTRIBUTION",
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "PLUGIN_STATUSES",
    "TRACE_ENV",
    "EntryPointCandidate",
    "HookFailure",
    "PluginCallError",
    "PluginFailureWarning",
    "PluginInfo",
    "PluginSelectionError",
    "PolyprofPluginManager",
    "UnknownExporterError",
    "canonical_name",
    "discover_entry_points",
    "env_flag",
    "make_plugin_manager",
    "parse_allow_list",
    "resolve_allow_list",
]
