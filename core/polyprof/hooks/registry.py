"""The plugin registry: one pluggy manager per profiling session.

``make_plugin_manager()`` builds a ``PolyprofPluginManager``: it adds
``polyprof.hooks.hookspecs``, registers the built-in plugins, then the third-party
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

The manager's parts that have a job of their own live in their own modules,
and their names are imported from there: which entry points load
(``polyprof.hooks.plugin_discovery``), each plugin's record (``polyprof.hooks.plugin_info``)
and calling a hook plugin by plugin with failures isolated
(``polyprof.hooks.plugin_calls``). Which activities a
session records, and which plugin's tracer records each, is
``polyprof.hooks.activity_resolution``'s to decide: it asks this manager through its
public calls, and the manager does not call it back.
"""

from __future__ import annotations

import difflib
import os
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import pluggy

from polyprof.analysis.averages import Aggregator
from polyprof.base.activity import coerce_activity
from polyprof.base.errors import PluginUnavailable, PolyprofError, PolyprofWarning
from polyprof.base.log import get_logger
from polyprof.hooks import hookspecs, plugin_discovery, plugin_info
from polyprof.hooks.components import Capabilities, Exporter, Subscriber, Tracer, check_component
from polyprof.hooks.plugin_calls import HookCalls, add_note, describe_exception, format_traceback, short_repr

if TYPE_CHECKING:
    from polyprof.base.config import ProfileConfig
    from polyprof.hooks.plugin_calls import HookFailure
    from polyprof.hooks.plugin_discovery import EntryPointCandidate
    from polyprof.hooks.plugin_info import PluginInfo, PluginStatus

log = get_logger(__name__)


#: Set to 1 to log every hook call and result (pluggy hook-call monitoring).
TRACE_ENV: Final = "POLYPROF_TRACE_PLUGINS"


class UnknownExporterError(PolyprofError, ValueError):
    """No loaded plugin offers an exporter of the requested name."""


class ExporterFailedError(UnknownExporterError):
    """The plugin that provides the requested exporter failed to make it; the message gives its reason."""


def _core_version() -> str:
    # The version module, not the package face: polyprof/__init__ imports every frontend.
    from polyprof._version import __version__

    return __version__


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


@attrs.frozen
class _Strong:
    """A component held as a weak reference would be, for one that cannot have weak references."""

    component: object

    def __call__(self) -> object:
        return self.component


@attrs.frozen
class _CapabilitiesAnswer:
    """A plugin's answer to ``polyprof_capabilities``, as the status it gives the plugin."""

    status: PluginStatus
    reason: str | None
    capabilities: Capabilities | None = None
    traceback: str | None = None


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
        #: The ``PolyprofWarning`` messages its making gave (``shared_plugin_manager`` gives them again).
        self.load_warnings: list[str] = []
        self._undo_monitoring: Callable[[], None] | None = None
        self._calls = HookCalls(self, self)
        # Which plugin made each component, held weakly where it can be (plugin_of checks identity).
        self._component_plugins: dict[int, tuple[Callable[[], object], str]] = {}
        # Plugins that said they cannot run here: kept to be asked again (confirm_provisional once
        # torch is imported, refresh_capabilities for each session of a shared manager).
        self._set_aside: dict[str, tuple[object, tuple[Callable[[], Any], ...]]] = {}

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
        return entry[1] if entry is not None and entry[0]() is component else None

    def hook_failures(self) -> tuple[HookFailure, ...]:
        """Hook implementations that failed and were skipped (``isolate_errors``), oldest first."""
        return self._calls.failures()

    def record_hook_failure(self, plugin: str, hook: str, exc: BaseException) -> None:
        """Log and keep the failure of ``plugin`` in ``hook`` (``hook_failures``): for a caller that
        checks a hook's answers itself (``polyprof.hooks.activity_resolution.collector_activities``)."""
        self._calls.record_failure(plugin, hook, exc)

    def distribution_of(self, name: str) -> str | None:
        """The distribution that installed plugin ``name`` (None: registered in code, or unknown)."""
        with self._lock:
            info = self._infos.get(name)
        return info.distribution if info is not None else None

    def mark_unavailable(self, name: str, reason: str) -> None:
        """Record that plugin ``name`` said, in a hook, that it cannot run here."""
        with self._lock:
            if name in self._infos:
                self._set_status(name, "unavailable", reason)

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
        base = plugin_info.PluginInfo(
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
        except Exception as exc:  # noqa: BLE001 - a plugin that fails to import is reported and skipped
            tb = format_traceback(exc)
            log.warning(
                "plugin_load_failed",
                plugin=candidate.name,
                distribution=candidate.distribution,
                module=candidate.value,
                error=describe_exception(exc),
            )
            return self._record(
                attrs.evolve(base, status="failed", reason=describe_exception(exc), traceback=tb)
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
        base = plugin_info.PluginInfo(
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
        except Exception as exc:  # noqa: BLE001 - a plugin that fails to register is reported and skipped
            self._forget(base.name)
            log.warning("plugin_register_failed", plugin=base.name, error=describe_exception(exc))
            return self._record(
                attrs.evolve(
                    base, status="failed", reason=describe_exception(exc), traceback=format_traceback(exc)
                )
            )
        hooks = tuple(sorted(caller.name for caller in self.get_hookcallers(plugin) or ()))
        return self._record(attrs.evolve(base, hooks=hooks))

    def _forget(self, name: str) -> None:
        """Unregister ``name`` if registered; never raises."""
        try:
            if self.get_plugin(name) is not None:
                self.unregister(name=name)
        except Exception as exc:  # noqa: BLE001 - a half-registered plugin must not stop the others
            log.warning("plugin_unregister_failed", plugin=name, error=describe_exception(exc))

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
        """Call this registered plugin's own ``polyprof_capabilities`` and record the answer."""
        plugin = self.get_plugin(name)
        functions = self._capability_functions(plugin)
        answer = self._ask_capabilities(name, functions)
        if answer.status == "unavailable":
            log.info("plugin_unavailable", plugin=name, reason=answer.reason)
            with self._lock:  # asked again by confirm_provisional or refresh_capabilities
                self._set_aside[name] = (plugin, functions)
        if answer.status != "loaded":
            # An unavailable plugin takes no part in sessions; its record still says what it would provide.
            self._forget(name)
        self._set_status(
            name, answer.status, answer.reason, answer.traceback, capabilities=answer.capabilities
        )

    def _capability_functions(self, plugin: object) -> tuple[Callable[[], Any], ...]:
        """The functions of ``plugin`` that implement ``polyprof_capabilities``, first called first."""
        caller = self.hook.polyprof_capabilities
        impls = [i for i in caller.get_hookimpls() if i.plugin is plugin and not (i.wrapper or i.hookwrapper)]
        return tuple(impl.function for impl in reversed(impls))

    def _ask_capabilities(self, name: str, functions: Sequence[Callable[[], Any]]) -> _CapabilitiesAnswer:
        """What a plugin's ``polyprof_capabilities`` says (first non-None result), as a status."""
        for function in functions:
            try:
                result = function()
            except PluginUnavailable as exc:
                reason = str(exc) or "unavailable"
                return _CapabilitiesAnswer("unavailable", reason, Capabilities(unavailable_reason=reason))
            except Exception as exc:  # noqa: BLE001 - a plugin whose capabilities fail is reported and skipped
                log.warning("plugin_capabilities_failed", plugin=name, error=describe_exception(exc))
                reason = f"polyprof_capabilities raised {describe_exception(exc)}"
                return _CapabilitiesAnswer("failed", reason, traceback=format_traceback(exc))
            if result is None:
                continue
            if not isinstance(result, Capabilities):
                reason = f"polyprof_capabilities returned {short_repr(result)}, which is not a Capabilities"
                return _CapabilitiesAnswer("failed", reason)
            try:
                activities = frozenset(coerce_activity(a) for a in result.activities)
            except ValueError as exc:
                return _CapabilitiesAnswer("failed", f"polyprof_capabilities declared a bad activity: {exc}")
            capabilities = attrs.evolve(result, activities=activities)
            if capabilities.unavailable_reason:
                return _CapabilitiesAnswer("unavailable", capabilities.unavailable_reason, capabilities)
            return _CapabilitiesAnswer("loaded", None, capabilities)
        return _CapabilitiesAnswer("loaded", None, Capabilities())

    def confirm_provisional(self) -> None:
        """Ask again every plugin whose capabilities were provisional (given while torch was not
        imported), so that a profile goes by torch's own answers; call it once torch is imported."""
        self._ask_again(lambda info: info.provisional is not None)

    def refresh_capabilities(self) -> None:
        """Ask every loaded or unavailable plugin for its capabilities again.

        A manager that serves many sessions (``shared_plugin_manager``) calls it for each, so
        that each goes by what its plugins' ``polyprof_capabilities`` answer now (a device that
        appeared or went away, ``CUDA_VISIBLE_DEVICES`` changed); an unavailable plugin is asked
        without being registered again. Not asked again: a plugin that failed (at import, at
        registration or in this hook) or raised ``PluginUnavailable`` while registering; a new
        manager (the installed distributions or the ``POLYPROF_*`` variables changed) retries those.
        """
        self._ask_again(lambda info: info.status in ("loaded", "unavailable"))

    def _ask_again(self, chosen: Callable[[PluginInfo], bool]) -> None:
        for info in self.plugin_infos():
            if not chosen(info):
                continue
            if self.get_plugin(info.name) is not None:
                self._read_capabilities(info.name)
                continue
            with self._lock:
                aside = self._set_aside.get(info.name)
            if aside is None:
                continue
            plugin, functions = aside
            answer = self._ask_capabilities(info.name, functions)
            if answer.status != "loaded":
                if answer.status == "failed":
                    with self._lock:
                        self._set_aside.pop(info.name, None)
                if (answer.status, answer.reason) != (info.status, info.reason):
                    log.info("plugin_capabilities_changed", plugin=info.name, status=answer.status)
                self._set_status(
                    info.name,
                    answer.status,
                    answer.reason,
                    answer.traceback,
                    capabilities=answer.capabilities,
                )
                continue
            with self._lock:
                self._set_aside.pop(info.name, None)
            registered = self._register_guarded(plugin, attrs.evolve(info, status="loaded", reason=None))
            if registered.loaded:
                self._set_status(info.name, "loaded", None, capabilities=answer.capabilities)

    # --------------------------------------------------------------- debugging

    def enable_hook_logging(self) -> Callable[[], None]:
        """Log every hook call (name, plugins, arguments) and its outcome; returns an undo function."""

        def before(hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
            log.info(
                "hook_call",
                hook=hook_name,
                plugins=[i.plugin_name for i in impls],
                kwargs={k: short_repr(v) for k, v in kwargs.items()},
            )

        def after(
            outcome: pluggy.Result[Any], hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Any
        ) -> None:
            if outcome.exception is not None:
                log.info("hook_error", hook=hook_name, error=describe_exception(outcome.exception))
            else:
                log.info("hook_result", hook=hook_name, result=short_repr(outcome.get_result()))

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
        return list(self.iter_each(hook_name, isolate_errors=isolate_errors, **kwargs))

    def iter_each(
        self, hook_name: str, *, isolate_errors: bool = False, **kwargs: Any
    ) -> Iterator[tuple[str, Any]]:
        """``call_each``, lazily: each plugin is called when the iteration reaches it, so that the
        caller can check an answer before the next plugin is asked."""
        return self._iter_each(hook_name, kwargs, isolate_errors=isolate_errors)

    def _iter_each(
        self,
        hook_name: str,
        kwargs: Mapping[str, Any],
        *,
        isolate_errors: bool = False,
        only: pluggy.HookImpl | None = None,
    ) -> Iterator[tuple[str, Any]]:
        return self._calls.each(hook_name, kwargs, isolate_errors=isolate_errors, only=only)

    def _components(
        self, hook_name: str, kind: type, config: ProfileConfig, *, isolate_errors: bool = False
    ) -> list[tuple[str, Any]]:
        found: list[tuple[str, Any]] = []
        for plugin, result in self._iter_each(hook_name, {"config": config}, isolate_errors=isolate_errors):
            try:
                components = self._checked_components(plugin, hook_name, kind, result)
            except TypeError as exc:
                if not isolate_errors:
                    raise
                self.record_hook_failure(plugin, hook_name, exc)  # all or nothing from this plugin
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
                f"(or None), not {short_repr(result)}"
            )
        components = list(result)
        for component in components:
            try:
                check_component(component, kind, plugin)
            except TypeError as exc:
                add_note(exc, f"returned from {hook_name}")
                raise
        self._remember_origin(plugin, components)
        return components

    def _remember_origin(self, plugin: str, components: Iterable[object]) -> None:
        with self._lock:
            for component in components:
                try:  # weakly where it can: a manager that outlives its sessions must not keep their parts
                    held: Callable[[], object] = weakref.ref(component)
                except TypeError:  # no weak references to it (__slots__ without __weakref__)
                    held = _Strong(component)
                self._component_plugins[id(component)] = (held, plugin)

    def forget_components(self, components: Iterable[object]) -> None:
        """Let go of ``components`` (made by this manager): ``plugin_of`` no longer knows them.

        A manager that outlives its sessions (``shared_plugin_manager``) would otherwise hold
        every tracer, subscriber, aggregator and exporter it ever made.
        """
        with self._lock:
            for component in components:
                entry = self._component_plugins.get(id(component))
                if entry is not None and entry[0]() in (component, None):
                    del self._component_plugins[id(component)]

    # ------------------------------------------------------------ activities

    def make_tracers(self, config: ProfileConfig, *, isolate_errors: bool = False) -> list[Tracer]:
        """Tracers from every plugin, in pluggy's call order (``isolate_errors``: a plugin whose hook
        raises or returns something other than tracers is skipped and recorded, ``hook_failures``).

        Whether two of them claim one activity, and whether every activity asked for has one, is
        ``polyprof.hooks.activity_resolution.make_tracers``'s to check.
        """
        return [tracer for _, tracer in self.tracers_by_plugin(config, isolate_errors=isolate_errors)]

    def tracers_by_plugin(
        self, config: ProfileConfig, *, isolate_errors: bool = False
    ) -> list[tuple[str, Tracer]]:
        """``make_tracers``, each tracer with the plugin that made it: ``[(plugin, tracer), ...]``."""
        return self._components("polyprof_make_tracers", Tracer, config, isolate_errors=isolate_errors)

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
        asked; when none makes it and a plugin declaring ``name`` failed, the
        error is an ``ExporterFailedError`` naming that plugin and its reason.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"exporter name must be a non-empty str, not {name!r}")
        hook = "polyprof_make_exporter"
        caller = self.hook.polyprof_make_exporter
        impls = [i for i in caller.get_hookimpls() if not (i.wrapper or i.hookwrapper)]
        # One plugin at a time (each once), so that a plugin skipped for a bad answer hands over
        # to the next.
        asked: list[object] = []
        failures_before = len(self.hook_failures())
        for impl in reversed(impls):
            if any(impl.plugin is plugin for plugin in asked):
                continue
            asked.append(impl.plugin)
            answers = self._iter_each(
                hook, {"config": config, "name": name}, isolate_errors=isolate_errors, only=impl
            )
            for plugin, exporter in answers:
                try:
                    check_component(exporter, Exporter, plugin)
                except TypeError as exc:
                    add_note(exc, f"returned from polyprof_make_exporter(name={name!r})")
                    if not isolate_errors:
                        raise
                    self.record_hook_failure(plugin, hook, exc)
                    continue
                self._remember_origin(plugin, [exporter])
                with self._lock:
                    self._exporters_made.append(exporter)
                return exporter
        failed = [f for f in self.hook_failures()[failures_before:] if f.hook == hook]
        self._raise_if_provider_failed(name, failed)
        for info in self.plugin_infos():
            if not info.loaded and info.capabilities is not None and name in info.capabilities.exporters:
                raise UnknownExporterError(
                    f"exporter {name!r} comes from plugin {info.name!r}, which is {info.display_status}"
                )
        available = self.exporter_names()
        also = "".join(f"; {f.label} failed in {hook} ({f.error})" for f in failed)
        raise UnknownExporterError(
            f"no exporter named {name!r}; available exporters: {', '.join(available) or 'none'} "
            f"(see `polyprof plugins`){also}"
        )

    def _raise_if_provider_failed(self, name: str, failed: Sequence[HookFailure]) -> None:
        """Raise ``ExporterFailedError`` when a plugin declaring the exporter ``name`` failed to make it."""
        for failure in failed:
            with self._lock:
                info = self._infos.get(failure.plugin)
            if info is not None and info.capabilities is not None and name in info.capabilities.exporters:
                raise ExporterFailedError(
                    f"exporter {name!r} could not be made: {failure.label}, which provides it, failed in "
                    f"polyprof_make_exporter: {failure.error}"
                )

    # -------------------------------------------------------------- shutdown

    def close(self) -> None:
        """Shut down every exporter this manager made; errors are logged, not raised."""
        with self._lock:
            exporters, self._exporters_made = self._exporters_made, []
        self._shut_down(exporters)
        if self._undo_monitoring is not None:
            self._undo_monitoring()
            self._undo_monitoring = None

    def shut_down_exporters(self, exporters: Iterable[Exporter]) -> None:
        """Shut down ``exporters`` (made by this manager) and forget them; the manager stays open.

        For a manager that outlives the session that asked for them (``shared_plugin_manager``).
        """
        chosen = list(exporters)
        with self._lock:
            self._exporters_made = [e for e in self._exporters_made if not any(e is c for c in chosen)]
        self._shut_down(chosen)

    @staticmethod
    def _shut_down(exporters: Iterable[Exporter]) -> None:
        for exporter in exporters:
            try:
                exporter.shutdown()
            except Exception as exc:  # noqa: BLE001 - one exporter's shutdown failure must not stop the others
                log.warning(
                    "exporter_shutdown_failed",
                    exporter=getattr(exporter, "name", "?"),
                    error=describe_exception(exc),
                )

    def __enter__(self) -> PolyprofPluginManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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
    if plugin_discovery.env_flag(TRACE_ENV, given=pm.load_warnings):
        pm.enable_hook_logging()
    pm.hook.polyprof_addhooks.call_historic(kwargs={"pluginmanager": pm})

    autoload = (
        not plugin_discovery.env_flag(plugin_discovery.DISABLE_AUTOLOAD_ENV, given=pm.load_warnings)
        if autoload is None
        else bool(autoload)
    )
    allowed = plugin_discovery.parse_allow_list(
        os.environ.get(plugin_discovery.ALLOW_LIST_ENV) if allow is None else allow
    )
    allow_source = plugin_discovery.ALLOW_LIST_ENV if allow is None else "the allow-list"

    candidates = plugin_discovery.discover_entry_points_once() if entry_points else []
    core = {c.name: c for c in candidates if c.builtin}
    third_party = sorted(
        (c for c in candidates if not c.builtin), key=lambda c: (c.name, c.distribution or "")
    )

    if builtins:
        version = _core_version()
        builtin_names = dict(plugin_discovery.BUILTIN_PLUGINS)
        if autoload:  # a newer core may declare built-ins this module does not list yet
            builtin_names.update({name: c.value for name, c in core.items()})
        for name, module in builtin_names.items():
            candidate = core.get(name) if autoload else None
            if candidate is None:  # autoload off, or no core metadata: load by module path
                candidate = plugin_discovery.EntryPointCandidate(
                    name,
                    module,
                    plugin_discovery.CORE_DISTRIBUTION,
                    version,
                    plugin_discovery.builtin_entry_point(name, module),
                )
            pm.load_entry_point(candidate, builtin=True)

    selected: set[EntryPointCandidate] = set()
    if allowed:
        # Resolved before anything third-party is imported: a refused allow-list loads nothing.
        selected, unknown = plugin_discovery.resolve_allow_list(
            allowed, third_party, {*plugin_discovery.BUILTIN_PLUGINS, *core}, allow_source
        )
        if unknown:
            installed = sorted({c.name for c in third_party})
            message = (
                f"{allow_source} names plugins that are not installed: {', '.join(unknown)}; "
                f"installed third-party plugins: {', '.join(installed) or 'none'}"
            )
            warnings.warn(message, PolyprofWarning, stacklevel=2)
            pm.load_warnings.append(message)

    taken = {info.name: info.distribution or plugin_discovery.CORE_DISTRIBUTION for info in pm.plugin_infos()}
    plan = plugin_discovery.plan_third_party(
        third_party,
        taken=taken,
        allowed=allowed,
        selected=selected,
        autoload=autoload,
        source=allow_source,
    )
    for decision in plan:
        candidate = decision.candidate
        if decision.loads:
            pm.load_entry_point(candidate, builtin=False)
            continue
        pm._record(
            plugin_info.PluginInfo(
                name=decision.listed_as,
                module=candidate.value,
                distribution=candidate.distribution,
                version=candidate.version,
                status="blocked",
                reason=decision.blocked_reason,
                conflicts_with=decision.conflicts_with,
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


@attrs.frozen(eq=False)
class _SharedManager:
    key: tuple[Any, ...]
    manager: PolyprofPluginManager


_shared_lock = threading.Lock()
_shared: _SharedManager | None = None


def _forget_shared_in_child() -> None:
    """A forked child makes its own manager: a parent's thread may have held its locks at the fork."""
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared_in_child)


def _shared_manager_key() -> tuple[Any, ...]:
    return (
        make_plugin_manager,  # replaced (tests inject their plugins so): a manager of the new one
        plugin_discovery.installed_distributions_key(),
        *(
            os.environ.get(name)
            for name in (plugin_discovery.DISABLE_AUTOLOAD_ENV, plugin_discovery.ALLOW_LIST_ENV, TRACE_ENV)
        ),
    )


def shared_plugin_manager() -> PolyprofPluginManager:
    """The plugin manager sessions made without one use: made once, made again when its inputs change.

    Its inputs are the installed distributions (``installed_distributions_key``) and the
    environment variables ``make_plugin_manager`` reads. Making one costs milliseconds (plugins
    registered, their capabilities asked) that a profile's start should not pay each time; the
    warnings its making gave (an allow-list naming plugins that are not installed) are given
    again on every call, as a fresh manager would give them. It is never closed: each session
    shuts down the exporters it asked for (``PolyprofPluginManager.shut_down_exporters``).
    """
    global _shared
    key = _shared_manager_key()
    with _shared_lock:
        shared = _shared
        if shared is None or shared.key != key:
            _shared = _SharedManager(key, make_plugin_manager())  # which gives its warnings itself
            return _shared.manager
    for message in shared.manager.load_warnings:
        warnings.warn(message, PolyprofWarning, stacklevel=3)
    return shared.manager


def forget_shared_plugin_manager() -> None:
    """The next ``shared_plugin_manager()`` makes a new manager (this one is left to its users)."""
    global _shared
    with _shared_lock:
        _shared = None


__all__ = [
    "TRACE_ENV",
    "ExporterFailedError",
    "PolyprofPluginManager",
    "UnknownExporterError",
    "forget_shared_plugin_manager",
    "make_plugin_manager",
    "shared_plugin_manager",
]
