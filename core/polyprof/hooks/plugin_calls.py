"""Calling a hook one plugin at a time, so that one plugin's failure costs only its own answer.

pluggy calls every implementation of a hook in one go and stops at the first
exception. ``HookCalls.each`` calls them one plugin at a time, in pluggy's
order, through pluggy's public API only (``subset_hook_caller``), each with
the hook's wrappers around it: an exception gets a note naming the
plugin and is raised, or, with ``isolate_errors``, is logged and recorded as
a ``HookFailure`` and the next plugin is asked. A plugin that raises
``PluginUnavailable`` is marked unavailable and skipped either way.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol, cast

import attrs
import pluggy

from polyprof.base.errors import PluginUnavailable, PolyprofError, PolyprofWarning
from polyprof.base.log import get_logger

log = get_logger(__name__)

__all__ = [
    "HookCalls",
    "HookFailure",
    "PluginCallError",
    "PluginDirectory",
    "PluginFailureWarning",
    "add_note",
    "describe_exception",
    "format_traceback",
    "short_repr",
]


class PluginCallError(PolyprofError):
    """A plugin broke the contract of a hook (duplicate tracers and the like)."""


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


def describe_exception(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` (the type alone when the message is empty)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def add_note(exc: BaseException, text: str) -> None:
    """``exc.add_note(text)``; on Python 3.10, PEP 678's ``__notes__`` list, which the exceptiongroup
    backport that anyio brings there prints with the traceback."""
    if hasattr(exc, "add_note"):
        exc.add_note(text)
        return
    notes = getattr(exc, "__notes__", None)
    exc.__notes__ = [*(notes if isinstance(notes, list) else []), text]  # type: ignore[attr-defined]


def short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class PluginDirectory(Protocol):
    """What ``HookCalls`` needs to know of the plugins it calls (the plugin manager answers)."""

    def describe_plugin(self, name: str) -> str:
        """``plugin 'cuda' (polyprof-cuda 0.3.1)``."""
        ...

    def distribution_of(self, name: str) -> str | None:
        """The distribution that installed plugin ``name``, if known."""
        ...

    def mark_unavailable(self, name: str, reason: str) -> None:
        """Record that plugin ``name`` said it cannot run here (``PluginUnavailable``)."""
        ...


class HookCalls:
    """Calls the hooks of one pluggy manager plugin by plugin, and keeps the failures it skipped."""

    def __init__(self, manager: pluggy.PluginManager, directory: PluginDirectory) -> None:
        self._manager = manager
        self._directory = directory
        self._failures: list[HookFailure] = []
        self._lock = threading.Lock()

    def failures(self) -> tuple[HookFailure, ...]:
        """Hook implementations that failed and were skipped, oldest first."""
        with self._lock:
            return tuple(self._failures)

    def record_failure(self, plugin: str, hook: str, exc: BaseException) -> HookFailure:
        """Log and keep the failure of ``plugin`` in ``hook`` (the caller goes on without it)."""
        failure = HookFailure(
            plugin=plugin,
            hook=hook,
            error=describe_exception(exc),
            label=self._directory.describe_plugin(plugin),
            traceback=format_traceback(exc),
        )
        with self._lock:
            self._failures.append(failure)
        log.warning(
            "plugin_hook_failed",
            plugin=plugin,
            distribution=self._directory.distribution_of(plugin),
            hook=hook,
            error=failure.error,
            exc_info=exc,
        )
        return failure

    def each(
        self,
        hook_name: str,
        kwargs: Mapping[str, Any],
        *,
        isolate_errors: bool = False,
        only: pluggy.HookImpl | None = None,
    ) -> Iterator[tuple[str, Any]]:
        """``(plugin, result)`` for each plugin implementing ``hook_name`` (``only``: that one's plugin).

        ``None`` results are left out; a firstresult hook stops at the first
        other result.

        Each plugin is called through pluggy's public ``subset_hook_caller``,
        with every other plugin that implements the hook left out, so hook
        wrappers and hook-call monitoring apply as in a normal call. Where
        pluggy cannot leave the others out (before 1.7 it keeps a plugin whose
        implementation has another name, through ``specname``; it cannot
        hold an unhashable plugin object in its set), the plugin's
        implementations are called directly, without wrappers.

        :raises ValueError: no hook specification is named ``hook_name``, or
            the hook is historic (pluggy replays those itself).
        """
        hook = self._manager.hook
        caller = getattr(hook, hook_name, None)
        if caller is None or not caller.has_spec():
            known = sorted(n for n, c in vars(hook).items() if not n.startswith("_") and c.has_spec())
            raise ValueError(f"no hook named {hook_name!r}; known hooks: {', '.join(known)}")
        if caller.is_historic():
            raise ValueError(
                f"{hook_name} is a historic hook: call it with call_historic, not plugin by plugin"
            )
        spec = caller.spec
        firstresult = bool(spec.opts.get("firstresult")) if spec is not None else False
        plain = [i for i in caller.get_hookimpls() if not (i.wrapper or i.hookwrapper)]
        # pluggy's call order: the last registered first.
        plugins: list[tuple[str, object]] = []
        for impl in reversed(plain):
            if all(plugin is not impl.plugin for _, plugin in plugins):
                plugins.append((impl.plugin_name, impl.plugin))
        if only is not None:
            plugins = [(name, plugin) for name, plugin in plugins if plugin is only.plugin]
        for name, plugin in plugins:
            try:
                outcome = self._call_one(hook_name, plugin, plain, kwargs, firstresult)
            except PluginUnavailable as exc:
                reason = str(exc) or "unavailable"
                log.info("plugin_unavailable", plugin=name, hook=hook_name, reason=reason)
                self._directory.mark_unavailable(name, reason)
                continue
            except Exception as exc:
                if not isolate_errors:
                    add_note(exc, f"raised by polyprof plugin {name!r} in {hook_name}")
                    raise
                self.record_failure(name, hook_name, exc)
                continue
            results: list[Any] = [outcome] if firstresult else list(cast("Iterable[Any]", outcome))
            for result in results:
                if result is not None:
                    yield name, result
                    if firstresult:
                        return

    def _call_one(
        self,
        hook_name: str,
        plugin: object,
        plain: list[pluggy.HookImpl],
        kwargs: Mapping[str, Any],
        firstresult: bool,
    ) -> Any:
        """What pluggy's call of ``hook_name`` returns with ``plugin``'s implementations alone."""
        others = [i.plugin for i in plain if i.plugin is not plugin]
        own = [i for i in plain if i.plugin is plugin]
        try:
            subset = self._manager.subset_hook_caller(hook_name, remove_plugins=others)
        except TypeError:  # an unhashable plugin object among the others (an attrs class, say)
            subset = None
        if subset is not None:
            kept = [i for i in subset.get_hookimpls() if not (i.wrapper or i.hookwrapper)]
            if len(kept) == len(own) and all(i.plugin is plugin for i in kept):
                return subset(**kwargs)
        # pluggy cannot call this plugin alone: call its implementations as pluggy would, in its
        # order (the last registered first), without the hook's wrappers.
        results = []
        for impl in reversed(own):
            missing = [arg for arg in impl.argnames if arg not in kwargs]
            if missing:
                raise pluggy.HookCallError(f"hook call must provide argument {missing[0]!r}")
            result = impl.function(*(kwargs[arg] for arg in impl.argnames))
            if result is not None:
                if firstresult:
                    return result
                results.append(result)
        return None if firstresult else results
