"""A profiling session: one plugin manager, one bus, the tracers, across recordings.

The frontends (``polyprof.profile``, ``polyprof.legacy.profile``) own one
session each. A recording is prepare -> start -> stop; ``stop`` returns the
assembled ``Trace``. Tracers are started on the caller's thread (torch's
collector is per thread); their data reaches the collector over the bus.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from polyprof.analysis.averages import Aggregator
from polyprof.base import torch_support, user_warnings
from polyprof.base.activity import ProfilerActivity, coerce_activity
from polyprof.base.attribution import link_launches
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import PolyprofError
from polyprof.base.events import EventBatch, concat
from polyprof.base.log import get_logger
from polyprof.base.trace import JsonValue, Trace
from polyprof.hooks import activity_resolution
from polyprof.hooks.components import Exporter, Subscriber, Tracer
from polyprof.hooks.plugin_calls import HookFailure, PluginFailureWarning
from polyprof.hooks.registry import PolyprofPluginManager
from polyprof.runtime.bus import BusStatistics, EventBus, Sink

log = get_logger(__name__)


class TraceCollector(Sink):
    """The core's own collection: keeps every batch of a recording for its ``Trace``.

    A ``polyprof.runtime.bus.Sink``: the bus hands it each batch itself, before any
    plugin's subscriber, so it never waits and never drops, whatever those do.
    ``consume`` runs on the bus thread and only appends; ``take`` runs on the
    user's thread once ``finish_recording`` has returned.
    """

    name = "trace_collector"

    def __init__(self) -> None:
        self._batches: list[EventBatch] = []

    def consume(self, batch: EventBatch) -> None:
        self._batches.append(batch)

    def take(self) -> list[EventBatch]:
        batches, self._batches = self._batches, []
        return batches


def _warn_plugin_failures(failures: Iterable[HookFailure]) -> None:
    """Tell the user, at their line, about each plugin hook that failed and was skipped.

    The registry logged each one (``plugin_hook_failed``, with the traceback).
    """
    for failure in failures:
        warnings.warn(failure.message, PluginFailureWarning, stacklevel=user_warnings.user_stacklevel())


def _connect_torch_result_tracers(tracers: list[Tracer]) -> None:
    """Give every tracer that decodes torch's collector result to the tracer that drives the collector."""
    from polyprof.runtime.torch_result import TorchCollectorOwner, TorchResultTracer

    clients = [t for t in tracers if isinstance(t, TorchResultTracer)]
    if not clients:
        return
    owners = [t for t in tracers if isinstance(t, TorchCollectorOwner)]
    if len(owners) != 1:
        names = ", ".join(t.name for t in clients)
        raise PolyprofError(
            f"tracer(s) {names} take their rows from torch's own collector, which needs exactly one tracer "
            f"driving it (the built-in torch_cpu plugin); found {len(owners)}: "
            f"{', '.join(t.name for t in owners) or 'none'}"
        )
    for client in clients:
        owners[0].share_results_with(client)
        client.fed_by(owners[0])


@attrs.define(eq=False)
class Session:
    """Plugins, bus and components for one profiler object."""

    config: ProfileConfig
    plugin_manager: PolyprofPluginManager
    tracers: list[Tracer]
    subscribers: list[Subscriber]
    aggregators: Mapping[str, Aggregator]
    collector: TraceCollector
    bus: EventBus
    #: True when it uses the process's shared plugin manager (``registry.shared_plugin_manager``),
    #: False for one its caller passed in and closes.
    shares_plugin_manager: bool = False
    _exporters: dict[str, Exporter] = attrs.field(factory=dict)
    _closed: bool = False
    _recording: bool = False
    #: Whether this recording's tracers and subscribers are attached to the bus (``_attach_to_bus``).
    _on_bus: bool = False
    #: Per-tracer decode failures counted by the bus before this recording.
    _errors_before: dict = attrs.field(factory=dict)
    #: Third-party tracers left out of this recording because their ``prepare()`` or ``start()``
    #: raised, with the note the trace keeps about each (``_leave_out``).
    _left_out: dict[int, str] = attrs.field(factory=dict)

    @classmethod
    def create(
        cls,
        *,
        activities: Iterable[Any] | None = None,
        plugin_manager: Any = None,
        trace_id: str = "",
        **flags: Any,
    ) -> Session:
        """Build a session: resolve activities against installed plugins, make components."""
        from polyprof.hooks.registry import shared_plugin_manager

        # Plugins answer from torch itself once it is imported, never provisionally (Capabilities);
        # a manager made before (polyprof run's) asks its provisional ones again, the shared one all.
        torch_support.import_installed()
        shares_pm = plugin_manager is None
        if shares_pm:
            pm = shared_plugin_manager()
            pm.refresh_capabilities()  # what each plugin can do now, as a manager made now would say
        else:
            pm = plugin_manager
            confirm = getattr(pm, "confirm_provisional", None)
            if confirm is not None:
                confirm()
        requested = None if activities is None else frozenset(coerce_activity(a) for a in activities)
        chosen = activity_resolution.resolve_activities(pm, requested)
        config = ProfileConfig(activities=chosen, trace_id=trace_id, **flags)
        bus = EventBus()
        try:
            return cls._build(pm, config, bus, shares_pm=shares_pm)
        except BaseException:
            bus.close()
            raise

    @classmethod
    def _build(
        cls, pm: PolyprofPluginManager, config: ProfileConfig, bus: EventBus, *, shares_pm: bool
    ) -> Session:
        # One plugin's broken hook must not cost every profile: it is skipped, logged and warned about.
        made = activity_resolution.make_tracers(pm, config)
        seen = len(pm.hook_failures())
        _warn_plugin_failures(made.failures)
        config = activity_resolution.activities_with_tracers(made)
        tracers = list(made.tracers)
        _connect_torch_result_tracers(tracers)
        collector = TraceCollector()
        subscribers = [collector, *pm.make_subscribers(config, isolate_errors=True)]
        aggregators = pm.make_aggregators(config, isolate_errors=True)
        session = cls(
            config=config,
            plugin_manager=pm,
            tracers=tracers,
            subscribers=subscribers,
            aggregators=aggregators,
            collector=collector,
            bus=bus,
            shares_plugin_manager=shares_pm,
        )
        pm.call_each("polyprof_session_start", isolate_errors=True, session=session)
        _warn_plugin_failures(pm.hook_failures()[seen:])
        log.debug(
            "session_created",
            activities=sorted(a.name for a in config.activities),
            tracers=[t.name for t in tracers],
        )
        return session

    # ---------------------------------------------------------- recording

    def prepare(self, trace_id: str = "") -> None:
        """Warm up every tracer (caller's thread); a new ``trace_id`` reaches them through ``configure``.

        A third-party tracer whose ``prepare()`` raises is left out of this recording (``_leave_out``).
        """
        if trace_id and trace_id != self.config.trace_id:
            self.config = attrs.evolve(self.config, trace_id=trace_id)
            for tracer in self.tracers:
                tracer.configure(self.config)
        self._left_out = {}
        for index, tracer in enumerate(self.tracers):
            try:
                tracer.prepare()
            except Exception as exc:
                if self._is_essential(tracer):
                    # the tracers prepared so far hold what they prepared (torch's collector keeps a
                    # prepared session, and the next profile's would fail): stopping releases it
                    for prepared in reversed(self.tracers[:index]):
                        if id(prepared) not in self._left_out:
                            _stop_quietly(prepared)
                    raise
                self._leave_out(tracer, "prepare", exc)

    def _is_essential(self, tracer: Tracer) -> bool:
        """Whether a failure of ``tracer`` stops the recording: it is a built-in's (torch's collector), or
        of unknown origin. A third-party tracer's failure costs only its own events."""
        pm = self.plugin_manager
        plugin = pm.plugin_of(tracer)
        if plugin is None:
            return True
        try:
            return bool(pm.plugin_info(plugin).builtin)
        except KeyError:
            return True

    def _leave_out(self, tracer: Tracer, step: str, exc: Exception) -> None:
        """Record without ``tracer``, which failed in ``step``: warned, and noted in the trace.

        A tracer that failed to start is stopped (it may be half started); its outbox is closed so
        that the bus does not wait for it.
        """
        if step == "start":
            _stop_quietly(tracer)
        tracer.outbox.close()
        self._left_out[id(tracer)] = self._tracer_failed(tracer, step, exc)

    def start(self) -> None:
        """Start every tracer; they join the bus now if a streamed subscriber is there, else at the end.

        A third-party tracer whose ``start()`` raises is left out of this recording: the others
        record, a ``PluginFailureWarning`` names the tracer's plugin and the error, and the trace's
        notes say so. A built-in tracer's failure (torch's collector) stops the start.
        """
        if self._closed:
            raise RuntimeError("this session is closed; a recording used again makes a new session")
        if any(not isinstance(subscriber, Sink) for subscriber in self.subscribers):
            self._attach_to_bus()  # a streamed subscriber reads batches while the recording runs
        try:
            for tracer in self.tracers:
                if id(tracer) in self._left_out:
                    continue
                try:
                    tracer.start()
                except Exception as exc:
                    if self._is_essential(tracer):
                        raise
                    self._leave_out(tracer, "start", exc)
        except BaseException:
            # every tracer still in, started or only prepared (torch's collector keeps a prepared
            # session, and the next profile's would fail): a stop ends or releases it
            for tracer in reversed(self.tracers):
                if id(tracer) not in self._left_out:
                    _stop_quietly(tracer)
            self._left_out = {}
            self._finish_on_bus()
            self.collector.take()
            raise
        self._recording = True
        self._errors_before = dict(self.bus.statistics().tracer_errors)

    def stop(self, *, metadata_json: Mapping[str, str] | None = None, trace_id: str = "") -> Trace:
        """Stop every tracer, wait for the bus to deliver everything, and assemble the Trace.

        A tracer whose ``stop()`` raises costs only its own events: the others'
        are kept, a ``PluginFailureWarning`` names the tracer's plugin and the
        error, and the trace's notes say which tracer failed.
        """
        notes = list(self._left_out.values())
        for index, tracer in enumerate(self.tracers):
            if id(tracer) in self._left_out:
                continue  # never started: nothing to stop
            try:
                tracer.stop()
            except Exception as exc:  # noqa: BLE001 - one plugin's failure must not cost the recording
                # What it handed over is delivered; nothing later may leak into the next recording.
                tracer.outbox.close()
                notes.append(self._tracer_failed(tracer, "stop", exc))
            except BaseException:
                # An interrupt (Ctrl-C) mid-stop: no tracer, torch's collector included, may be left
                # running, or every later profile in the process would refuse to start.
                self._discard_after_interrupt(self.tracers[index + 1 :], interrupted=tracer)
                raise
        self._recording = False
        left_out, self._left_out = frozenset(self._left_out), {}
        if not self._finish_on_bus():
            log.error("bus_finish_timed_out", statistics=str(self.bus.statistics()))
        failed = self._tracers_that_failed()
        return self._assemble(metadata_json or {}, trace_id, failed, notes, left_out)

    def _discard_after_interrupt(self, unstopped: Sequence[Tracer], *, interrupted: Tracer) -> None:
        for tracer in unstopped:
            _stop_quietly(tracer)
        try:  # the interrupted one may have stopped before the interrupt; a second stop is harmless
            interrupted.stop()
        except BaseException:  # the first interrupt is re-raised by the caller
            log.warning("tracer_stop_after_interrupt_failed", tracer=interrupted.name, exc_info=True)
        self._recording = False
        self._finish_on_bus()
        self.collector.take()

    def _attach_to_bus(self) -> None:
        """Attach the subscribers, then the tracers, for this recording (once).

        Only a streamed subscriber needs the bus while the recording runs; otherwise this waits
        for the end (``_finish_on_bus``), so that a profile's start makes no call into the bus
        thread, and the thread is started then. Subscribers come first: whatever the tracers
        hold when they are attached is delivered at once.
        """
        if self._on_bus:
            return
        for subscriber in self.subscribers:
            self.bus.subscribe(subscriber)
        for tracer in self.tracers:
            self.bus.add_tracer(tracer)
        self._on_bus = True

    def _finish_on_bus(self) -> bool:
        """Deliver what the tracers handed over (attaching them first if need be) and detach them."""
        self._attach_to_bus()
        try:
            return bool(self.bus.finish_recording())
        finally:
            self._on_bus = False

    def _tracer_failed(self, tracer: Tracer, step: str, exc: Exception) -> str:
        """Log and warn that ``tracer`` failed in ``step``, naming its plugin; returns the trace note."""
        plugin = self.plugin_manager.plugin_of(tracer)
        who = f"tracer {tracer.name!r}"
        if plugin is not None:
            who += f" of {self.plugin_manager.describe_plugin(plugin)}"
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        event = f"tracer_{step}_failed"  # tracer_start_failed, tracer_stop_failed, ...
        log.error(event, tracer=tracer.name, plugin=plugin, error=error, exc_info=exc)
        warnings.warn(
            f"polyprof: {who} failed in {step}() ({error}); the recording keeps the other tracers' "
            "events, and its own may be missing or incomplete",
            PluginFailureWarning,
            stacklevel=user_warnings.user_stacklevel(),
        )
        return f"{who} failed in {step}() ({error}); its events may be missing or incomplete"

    def abort(self) -> None:
        """Stop tracers after a failure, discarding what they recorded."""
        if not self._recording:
            return
        for tracer in self.tracers:
            if id(tracer) not in self._left_out:
                _stop_quietly(tracer)
        self._recording = False
        self._left_out = {}
        self._finish_on_bus()
        self.collector.take()

    def _tracers_that_failed(self) -> list[str]:
        """Tracers whose data could not be decoded in this recording (logged by the bus); warns."""
        errors = self.bus.statistics().tracer_errors
        before = self._errors_before
        failed = [name for name, count in errors.items() if count > before.get(name, 0)]
        for name in failed:
            warnings.warn(
                f"polyprof: tracer {name!r} failed to decode what it recorded; its events are missing from "
                "the results (the error is in the 'polyprof.runtime.bus' log)",
                RuntimeWarning,
                stacklevel=user_warnings.user_stacklevel(),
            )
        return failed

    def _assemble(
        self,
        metadata_json: Mapping[str, str],
        trace_id: str,
        failed: Sequence[str] = (),
        failure_notes: Sequence[str] = (),
        left_out: frozenset[int] = frozenset(),
    ) -> Trace:
        """The trace of this recording; the tracers whose ids are in ``left_out`` did not record it.

        Those are not asked for metadata: they may still report an earlier recording's span.
        """
        tracer_starts: list[int] = []
        tracer_ends: list[int] = []
        notes = [*failure_notes, *(f"tracer {name!r} failed; its events are missing" for name in failed)]
        device_properties: list[Mapping[str, JsonValue]] = []
        extra_meta: dict[str, str] = {}
        for tracer in self.tracers:
            if id(tracer) in left_out:
                continue
            try:
                meta = tracer.trace_metadata() or {}
            except Exception as exc:  # noqa: BLE001 - the events stand without this tracer's metadata
                notes.append(self._tracer_failed(tracer, "trace_metadata", exc))
                continue
            if meta.get("start_ns"):
                tracer_starts.append(int(meta["start_ns"]))
            if meta.get("end_ns"):
                tracer_ends.append(int(meta["end_ns"]))
            notes.extend(meta.get("notes", ()))
            device_properties.extend(meta.get("device_properties", ()))
            extra_meta.update(meta.get("metadata_json", {}))
        # Device tracers' API calls learn which CPU op launched them (polyprof.base.attribution).
        events = concat(link_launches(self.collector.take()))
        starts = tracer_starts or [int(events["start_ns"].min()) if len(events) else 0]
        ends = tracer_ends or [int((events["start_ns"] + events["dur_ns"]).max()) if len(events) else 0]
        # What the bus lost in this recording: the core's collection only on a timeout; plugins'
        # streamed subscribers whenever they could not keep up (the trace is whole then).
        recording = self.bus.last_recording_statistics()
        for tracer_name, items in sorted(recording.items_abandoned.items()):
            if items:
                notes.append(
                    f"tracer {tracer_name!r}: {items} recorded item(s) were not decoded because the event "
                    "bus timed out finishing the recording; their events are missing"
                )
        for subscriber, batches in sorted(recording.batches_dropped.items()):
            if batches:
                missed = recording.events_dropped[subscriber]
                routed = missed + recording.events_delivered[subscriber]
                notes.append(
                    f"subscriber {subscriber!r} could not keep up and missed {missed} of {routed} events "
                    f"({batches} batches), which the event bus dropped for it"
                    + ("; the trace itself holds every event" if recording.collection_complete else "")
                )
        return Trace(
            events=events,
            config=self.config,
            start_ns=min(starts),
            end_ns=max(ends),
            pid=os.getpid(),
            hostname=socket.gethostname(),
            trace_id=trace_id or self.config.trace_id,
            metadata_json={**extra_meta, **metadata_json},
            device_properties=tuple(device_properties),
            notes=tuple(notes),
        )

    def collector_lost(self) -> bool:
        """Whether code outside polyprof ended the torch collector session of this session's recording.

        Its torch tracer then records nothing more with torch's collector
        (``TorchCollectorOwner.collector_lost``), so another recording may have
        it. False when no tracer drives torch's collector, and when asking fails
        (logged): the recording keeps its claim.
        """
        from polyprof.runtime.torch_result import TorchCollectorOwner

        for tracer in self.tracers:
            if isinstance(tracer, TorchCollectorOwner):
                try:
                    return bool(tracer.collector_lost())
                except Exception:
                    log.warning("collector_lost_failed", tracer=tracer.name, exc_info=True)
                    return False
        return False

    def trace_ready(self, trace: Trace) -> None:
        """Tell plugins a trace is finished; their errors are logged, never raised."""
        seen = len(self.plugin_manager.hook_failures())
        self.plugin_manager.call_each("polyprof_trace_ready", isolate_errors=True, session=self, trace=trace)
        _warn_plugin_failures(self.plugin_manager.hook_failures()[seen:])

    def toggle_collection(self, enable: bool, activities: frozenset[ProfilerActivity]) -> None:
        """Pause or resume collection of ``activities`` (torch's toggle_collection_dynamic).

        Each tracer recording one of them is asked; one that cannot pause raises ``NotImplementedError``
        naming itself (``Tracer.toggle_collection``'s default).
        """
        for tracer in self.tracers:
            if tracer.activities & activities:
                tracer.toggle_collection(enable, activities)

    # -------------------------------------------------------------- output

    def exporter(self, name: str) -> Exporter:
        """The exporter called ``name`` (built once per session)."""
        exporter = self._exporters.get(name)
        if exporter is None:
            pm = self.plugin_manager
            seen = len(pm.hook_failures())
            try:
                exporter = self._exporters[name] = pm.make_exporter(self.config, name, isolate_errors=True)
            finally:
                _warn_plugin_failures(pm.hook_failures()[seen:])
        return exporter

    def statistics(self) -> BusStatistics:
        return self.bus.statistics()

    def close(self) -> None:
        """End the session: plugins are told (once), the bus thread exits."""
        if self._closed:
            return
        self._closed = True
        seen = len(self.plugin_manager.hook_failures())
        self.plugin_manager.call_each("polyprof_session_finish", isolate_errors=True, session=self)
        _warn_plugin_failures(self.plugin_manager.hook_failures()[seen:])
        self.bus.close()

    def shutdown(self) -> None:
        """Close, then shut down the exporters this session asked the shared plugin manager for."""
        self.close()
        self.release_exporters()

    def release_exporters(self) -> None:
        """Shut down the exporters this session asked the shared plugin manager for; forget its parts.

        A plugin manager passed in by the caller is the caller's to close, with its exporters;
        they stay cached here, so exports after the end reuse them instead of piling up.
        """
        if self.shares_plugin_manager:
            exporters = list(self._exporters.values())
            self._exporters.clear()
            self.plugin_manager.shut_down_exporters(exporters)
            # the shared manager outlives this session: it must not keep its components alive
            components = [*self.tracers, *self.subscribers, *self.aggregators.values(), *exporters]
            self.plugin_manager.forget_components(components)


def _stop_quietly(tracer: Tracer) -> None:
    try:
        tracer.stop()
    except Exception:  # cleanup after another failure
        log.warning("tracer_stop_failed", tracer=tracer.name, exc_info=True)
