"""Every hook polyprof calls, grouped by lifecycle phase.

Plugins implement hooks with ``@polyprof.hookimpl`` in a module registered
through the ``polyprof`` entry-point group. Hooks build and wire components
(``polyprof.hooks.components``); they are never called per event.

Phases: bootstrap -> describe -> session start -> collect components ->
trace ready -> session finish. All hooks are called on the thread that owns
the profiling session (the user's thread) unless a docstring says otherwise.

In a profiling session, an implementation of the session-start, collect and
later hooks that raises (or returns something its hook does not allow) is
skipped for that call, with a ``PluginFailureWarning`` and a log event naming
the plugin and the error; the recording goes on with the other plugins.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from polyprof.analysis.averages import Aggregator
    from polyprof.base.config import ProfileConfig
    from polyprof.base.trace import Trace
    from polyprof.hooks.components import Capabilities, Exporter, Subscriber, Tracer
    from polyprof.hooks.registry import PolyprofPluginManager
    from polyprof.runtime.session import Session

PROJECT = "polyprof"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------- bootstrap


@hookspec(historic=True)
def polyprof_addhooks(pluginmanager: PolyprofPluginManager) -> None:
    """Add new hook specifications (``pluginmanager.add_hookspecs(module)``).

    Called once when a plugin manager is created, and replayed for plugins
    registered later (historic). Not firstresult; the return value is ignored.

    :param pluginmanager: the session's plugin manager.
    """


# ----------------------------------------------------------------- describe


@hookspec(firstresult=True)
def polyprof_capabilities() -> Capabilities | None:
    """Say what this plugin provides and whether it can run here.

    Called per plugin (the registry calls each implementation on its own) when
    the registry lists plugins or resolves an activity; cheap and side-effect
    free. Raising ``polyprof.PluginUnavailable`` is the same as returning
    ``Capabilities(unavailable_reason=...)``.

    :returns: a ``Capabilities`` record.
    """


# ------------------------------------------------------------ session start


@hookspec
def polyprof_session_start(session: Session) -> None:
    """A profiling session was created and is about to start its first recording.

    Not firstresult; return values are ignored. An exception is logged and
    warned about with the plugin's name, and the session goes on without it.

    :param session: the session (its ``config`` says what is recorded).
    """


# ------------------------------------------------------- collect components


@hookspec
def polyprof_torch_collector_activities(config: ProfileConfig) -> Iterable[str] | None:
    """Name the activities torch's own collector must record for this plugin, besides CPU.

    For a device whose CUPTI or PTI torch's Kineto owns in this process
    (``ProfilerActivity.CUDA`` / ``XPU`` in ``torch.profiler.supported_activities()``
    and a device present): polyprof then never calls CUPTI or PTI itself, and
    the device rows come from torch's raw result (``polyprof.runtime.torch_result``).
    Called once per session, before ``polyprof_make_tracers``; the union of
    all answers becomes ``config.torch_activities``, which the tracer that
    drives torch's collector requests. Return nothing for a device this plugin
    records another way, or when ``config.activities`` does not ask for it.

    :param config: what the user asked to record (``torch_activities`` still empty).
    :returns: names of ``torch.profiler.ProfilerActivity`` members, e.g. ``["CUDA"]``.
    """


@hookspec
def polyprof_make_tracers(config: ProfileConfig) -> list[Tracer] | None:
    """Build the tracers this plugin offers for ``config.activities``.

    Called once per session, before recording. Return tracers only for
    activities that are in ``config.activities`` and usable here; return an
    empty list or None otherwise. Not firstresult: tracers from all plugins are
    combined; two tracers claiming the same activity is an error.

    :param config: what the user asked to record.
    :returns: a list of ``Tracer`` objects.
    """


@hookspec
def polyprof_make_subscribers(config: ProfileConfig) -> list[Subscriber] | None:
    """Build streaming consumers that receive every event batch on the bus.

    Called once per session. Subscribers run on bus worker threads (one call
    at a time per subscriber), each fed by its own bounded stream; one that raises is isolated and logged. Not
    firstresult: all subscribers are attached.

    :param config: the session's configuration.
    :returns: a list of ``Subscriber`` objects.
    """


@hookspec
def polyprof_make_aggregators(config: ProfileConfig) -> list[Aggregator] | None:
    """Build aggregators, selected later by their ``name``.

    Called once per session. Not firstresult. When two plugins return an
    aggregator with the same name, the one registered later wins, so an
    installed plugin can replace a built-in (built-ins use ``trylast``).
    The one named ``key_averages`` answers every ``key_averages()`` table
    of the session's recordings: ``Aggregator.aggregate(trace, tree=...,
    rows=..., **grouping)`` returns a ``polyprof.analysis.averages.KeyAveragesSummary``
    (``summarize``'s, or ``KeyAveragesSummary.of_rows`` of rows it built itself).

    :param config: the session's configuration.
    :returns: a list of ``Aggregator`` objects.
    """


@hookspec(firstresult=True)
def polyprof_make_exporter(config: ProfileConfig, name: str) -> Exporter | None:
    """Build the exporter called ``name``, if this plugin has it.

    Called when a trace is exported, on the exporting thread. Firstresult:
    stops at the first non-None result; built-ins are ``trylast`` so
    third-party exporters of the same name take precedence.

    :param config: the session's configuration.
    :param name: the exporter asked for ("chrome", "stacks", ...).
    :returns: an ``Exporter`` or None.
    """


# -------------------------------------------------------------- trace ready


@hookspec
def polyprof_trace_ready(session: Session, trace: Trace) -> None:
    """A recording finished and its ``Trace`` is assembled.

    Called on the user's thread, before the frontend's ``on_trace_ready``
    callback. Not firstresult. Exceptions are logged and do not reach the
    profiled program.

    :param session: the session.
    :param trace: the finished trace.
    """


# ----------------------------------------------------------- session finish


@hookspec
def polyprof_session_finish(session: Session) -> None:
    """The session stopped for good (the profiler's ``__exit__`` ran).

    Not firstresult. Exceptions are logged and do not reach the profiled
    program.

    :param session: the session.
    """
