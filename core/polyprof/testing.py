"""Helpers for testing polyprof plugins without torch, hardware or installation.

Typical exporter test::

    from polyprof.testing import make_event_batch, make_plugin_manager_for_tests, make_trace
    import my_plugin

    def test_my_exporter(tmp_path):
        pm = make_plugin_manager_for_tests(my_plugin)
        trace = make_trace(make_event_batch([{"name": "aten::mm", "start_ns": 0, "dur_ns": 1000}]))
        exporter = pm.make_exporter(trace.config, "mine")
        exporter.export(trace, str(tmp_path / "out.mine"))

``make_plugin_manager_for_tests`` registers only the plugins you pass (no
entry points, no built-ins) unless you ask for them, and raises when one of
them fails to register, so a misspelled hook name fails the test.
``InMemoryExporter``, ``FakeTracer`` and ``ComponentPlugin`` stand in for the
other side of the contract. ``KinetoEventStandIn`` and ``RawResultStandIn``
stand in for torch's collector result, so a device plugin's decoding
(``polyprof.runtime.torch_result``) is tested without the device.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from polyprof.analysis.averages import Aggregator
from polyprof.base.activity import ProfilerActivity, coerce_activity
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import PluginLoadError
from polyprof.base.events import FIELDS, EventBatch, EventKind, concat, intern_column
from polyprof.base.trace import Trace
from polyprof.hooks.components import Capabilities, Exporter, Subscriber, TraceMetadata, Tracer
from polyprof.hooks.hookspecs import hookimpl
from polyprof.hooks.registry import PolyprofPluginManager, make_plugin_manager


def make_plugin_manager_for_tests(
    *plugins: object | tuple[str, object],
    autoload: bool = False,
    builtins: bool | None = None,
    strict: bool = True,
) -> PolyprofPluginManager:
    """A plugin manager holding ``plugins`` (modules, objects or ``(name, plugin)`` pairs).

    :param autoload: also load third-party plugins from entry points (as a real session does).
    :param builtins: also load polyprof's built-in plugins; defaults to ``autoload``.
    :param strict: raise ``PluginLoadError`` when one of ``plugins`` failed to
        register (bad hook signature, unknown hook name, capabilities that
        raise). An *unavailable* plugin is not an error: test that path
        through ``pm.plugin_info(name).status``.
    """
    pm = make_plugin_manager(
        autoload=autoload,
        allow=None if autoload else (),
        extra_plugins=plugins,
        builtins=autoload if builtins is None else builtins,
        entry_points=autoload,
    )
    if strict:
        # Plugins given in code are the ones without a distribution.
        failed = [info for info in pm.plugin_infos() if info.distribution is None and info.status == "failed"]
        if failed:
            details = "\n\n".join(
                f"plugin {i.name!r} ({i.module}): {i.reason}\n{i.traceback or ''}" for i in failed
            )
            raise PluginLoadError(f"{len(failed)} plugin(s) failed to register:\n{details}")
    return pm


@attrs.frozen(eq=False)
class ExportedTrace:
    """One call to ``InMemoryExporter.export``."""

    trace: Trace
    path: str
    options: Mapping[str, Any]


class InMemoryExporter(Exporter):
    """An exporter that keeps what it is given instead of writing files.

    Thread-safe. ``exported`` lists the calls in order; ``traces`` the traces.
    """

    def __init__(self, name: str = "memory", suffixes: tuple[str, ...] = (".memory",)) -> None:
        self.name = name
        self.suffixes = tuple(suffixes)
        self._lock = threading.Lock()
        self._exported: list[ExportedTrace] = []
        self.shut_down = False

    def export(self, trace: Trace, path: str, **options: Any) -> str:
        if not isinstance(trace, Trace):
            raise TypeError(
                f"InMemoryExporter.export needs a polyprof.plugin.Trace, not {type(trace).__name__}"
            )
        written = os.fspath(path)
        with self._lock:
            self._exported.append(ExportedTrace(trace, written, dict(options)))
        return written

    @property
    def exported(self) -> list[ExportedTrace]:
        with self._lock:
            return list(self._exported)

    @property
    def traces(self) -> list[Trace]:
        return [item.trace for item in self.exported]

    def clear(self) -> None:
        with self._lock:
            self._exported.clear()

    def shutdown(self) -> None:
        self.shut_down = True


class FakeTracer(Tracer):
    """A tracer that emits the given ``EventBatch`` objects at ``stop``.

    ``calls`` records the life-cycle calls (``prepare``, ``start``, ``stop``,
    ``flush``) in order, so tests can check how a session drives tracers.
    Each recording cycle emits the same batches again.
    """

    def __init__(
        self,
        batches: Iterable[EventBatch] = (),
        *,
        name: str = "fake",
        activities: Iterable[Any] = (ProfilerActivity.CPU,),
    ) -> None:
        super().__init__()
        self.batches = tuple(batches)
        for batch in self.batches:
            if not isinstance(batch, EventBatch):
                raise TypeError(f"FakeTracer takes EventBatch objects, not {type(batch).__name__}")
        self.name = name
        self.activities = frozenset(coerce_activity(a) for a in activities)
        self.calls: list[str] = []
        self.start_ns: int | None = None
        self.end_ns: int | None = None

    def prepare(self) -> None:
        self.calls.append("prepare")

    def start(self) -> None:
        self.calls.append("start")
        self.outbox.reopen()
        self.start_ns = time.time_ns()
        self.end_ns = None

    def stop(self) -> None:
        self.calls.append("stop")
        for batch in self.batches:
            self.outbox.put(batch)
        self.end_ns = time.time_ns()
        self.outbox.close()

    def flush(self) -> None:
        self.calls.append("flush")

    def trace_metadata(self) -> TraceMetadata:
        meta: TraceMetadata = {}
        if self.start_ns is not None:
            meta["start_ns"] = self.start_ns
        if self.end_ns is not None:
            meta["end_ns"] = self.end_ns
        return meta


class ComponentPlugin:
    """A plugin object serving ready-made components through the hooks.

    ``make_plugin_manager_for_tests(ComponentPlugin(exporters=[InMemoryExporter()]))``
    gives a manager whose ``make_exporter(config, "memory")`` returns that
    exporter. Tracers are offered for the activities in ``config.activities``.
    """

    def __init__(
        self,
        *,
        plugin_name: str = "components",
        tracers: Sequence[Tracer] = (),
        subscribers: Sequence[Subscriber] = (),
        aggregators: Sequence[Aggregator] = (),
        exporters: Sequence[Exporter] = (),
        unavailable_reason: str | None = None,
    ) -> None:
        self.plugin_name = plugin_name
        self.tracers = list(tracers)
        self.subscribers = list(subscribers)
        self.aggregators = list(aggregators)
        self.exporters = list(exporters)
        self.unavailable_reason = unavailable_reason

    @hookimpl
    def polyprof_capabilities(self) -> Capabilities:
        return Capabilities(
            activities=frozenset(a for t in self.tracers for a in t.activities),
            exporters=tuple(e.name for e in self.exporters),
            aggregators=tuple(a.name for a in self.aggregators),
            unavailable_reason=self.unavailable_reason,
        )

    @hookimpl
    def polyprof_make_tracers(self, config: ProfileConfig) -> list[Tracer]:
        return [t for t in self.tracers if set(t.activities) & set(config.activities)]

    @hookimpl
    def polyprof_make_subscribers(self, config: ProfileConfig) -> list[Subscriber]:
        return list(self.subscribers)

    @hookimpl
    def polyprof_make_aggregators(self, config: ProfileConfig) -> list[Aggregator]:
        return list(self.aggregators)

    @hookimpl
    def polyprof_make_exporter(self, config: ProfileConfig, name: str) -> Exporter | None:
        for exporter in self.exporters:
            if exporter.name == name:
                return exporter
        return None


def make_event_batch(events: Sequence[Mapping[str, Any]], source: str = "test") -> EventBatch:
    """An ``EventBatch`` from one dict per event (test data; a Python loop per event).

    Keys are ``polyprof.base.events.FIELDS`` names; interned fields take plain
    values (``"name": "aten::mm"``, ``"shapes": ((2, 3),)``). ``kind`` may be
    an ``EventKind``; missing ``kind``/``start_ns``/``dur_ns`` default to
    ``CPU_OP``/0/0.
    """
    keys = {key for event in events for key in event}
    unknown = sorted(keys - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown event fields {unknown}; valid fields: {sorted(FIELDS)}")
    columns: dict[str, Any] = {}
    tables: dict[str, tuple] = {}
    for field in keys | {"kind", "name", "start_ns", "dur_ns"}:
        spec = FIELDS[field]
        if spec.interned:
            empty = () if field in ("shapes", "stack") else ""
            values = [event.get(field, empty) for event in events]
            values = [
                tuple(map(tuple, v)) if field == "shapes" else tuple(v) if field == "stack" else v
                for v in values
            ]
            columns[field], tables[field] = intern_column(values, empty=empty)
        else:
            convert = float if spec.dtype.startswith("float") else int  # counter values are floats
            columns[field] = [convert(event.get(field, spec.default)) for event in events]
    return EventBatch.build(source, columns, tables)


def make_trace(
    *batches: EventBatch,
    config: ProfileConfig | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    pid: int = 4242,
    hostname: str = "test-host",
) -> Trace:
    """A ``Trace`` of ``batches`` (concatenated) for exporter and aggregator tests.

    ``start_ns``/``end_ns`` default to the events' extent.
    """
    events = concat(list(batches), source="test") if batches else EventBatch.empty("test")
    if len(events):
        first = int(events["start_ns"].min())
        last = int((events["start_ns"] + events["dur_ns"]).max())
    else:
        first = last = 0
    return Trace(
        events=events,
        config=config if config is not None else ProfileConfig(activities={ProfilerActivity.CPU}),
        start_ns=first if start_ns is None else start_ns,
        end_ns=last if end_ns is None else end_ns,
        pid=pid,
        hostname=hostname,
    )


class KinetoEventStandIn:
    """One of torch's ``_KinetoEvent``s, with every accessor torch 2.6 to 2.15 has (torch itself needed).

    The row's own values come from the constructor; the rest are what torch
    gives a row recorded without shapes, stacks or memory. ``flow`` is the
    row's ``(flow_id, flow_type, flow_start)`` as Kineto gave it to torch (a
    CUDA run's runtime calls and device activities have an ``ac2g`` flow whose
    id is their correlation id; ``polyprof_cuda.kineto.kineto_flow`` says
    which); by default none. ``KinetoEventStandIn211`` has the accessors of
    torch before 2.12 (no ``activity_type``, no ``external_id``, no ``flow_*``).
    """

    def __init__(
        self,
        name: str,
        activity_type: str,
        device_type: int,
        device_index: int,
        start_ns: int,
        end_ns: int,
        correlation_id: int,
        linked_correlation_id: int,
        device_resource_id: int,
        *,
        start_thread_id: int = 1,
        flow: tuple[int, int, bool] = (0, 0, False),
    ) -> None:
        from torch._C._autograd import DeviceType as TorchDeviceType

        by_value = {int(member.value): member for member in TorchDeviceType.__members__.values()}
        self._name, self._type, self._device = name, activity_type, by_value[int(device_type)]
        self._index, self._start, self._end = device_index, start_ns, end_ns
        self._corr, self._linked, self._resource = correlation_id, linked_correlation_id, device_resource_id
        self._thread = start_thread_id
        self._flow = flow

    def name(self) -> str:
        return self._name

    def activity_type(self) -> str:
        return self._type

    def device_type(self) -> Any:
        return self._device

    def device_index(self) -> int:
        return self._index

    def device_resource_id(self) -> int:
        return self._resource

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._end

    def duration_ns(self) -> int:
        return self._end - self._start

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        return self._linked

    def external_id(self) -> int:
        # Kineto's: a host op's own id, the op it belongs to for the others
        return self._corr if self._type in ("cpu_op", "user_annotation") else self._linked

    def start_thread_id(self) -> int:
        return self._thread

    end_thread_id = start_thread_id

    def is_async(self) -> bool:
        return False

    def is_user_annotation(self) -> bool:
        return self._type in ("user_annotation", "gpu_user_annotation")

    def is_python_function(self) -> bool:
        return self._type == "python_function"

    def is_hidden_event(self) -> bool:
        return False

    def sequence_nr(self) -> int:
        return -1

    def fwd_thread_id(self) -> int:
        return 0

    def scope(self) -> int:
        return 0

    def flops(self) -> int:
        return 0

    def shapes(self) -> list:
        return []

    def flow_id(self) -> int:
        return self._flow[0]

    def flow_type(self) -> int:
        return self._flow[1]

    def flow_start(self) -> bool:
        return self._flow[2]

    def overload_name(self) -> str:
        return ""

    def dtypes(self) -> list:
        return []

    structured_input_shapes = structured_input_strides = stack = concrete_inputs = dtypes

    def kwinputs(self) -> dict:
        return {}

    def metadata_json(self) -> str:
        return ""

    def extra_meta(self) -> dict:
        return {}

    typed_metadata = extra_meta

    def nbytes(self) -> int:
        return 0

    def python_id(self) -> int:
        return 0

    python_parent_id = python_id

    def python_module_id(self) -> int:
        return -1

    def cuda_elapsed_us(self) -> int:
        return -1

    privateuse1_elapsed_us = cuda_elapsed_us


class KinetoEventStandIn211(KinetoEventStandIn):
    """torch 2.11's ``_KinetoEvent``: no ``activity_type``, no ``external_id``, no ``flow_*`` (2.13)."""

    _MISSING = frozenset({"activity_type", "external_id", "flow_id", "flow_type", "flow_start"})

    def __getattribute__(self, name: str) -> Any:
        if name in KinetoEventStandIn211._MISSING:
            raise AttributeError(name)
        return super().__getattribute__(name)


class RawResultStandIn:
    """torch's ``_ProfilerResult`` holding ``events`` (``KinetoEventStandIn``s)."""

    def __init__(self, events: Sequence[Any], trace_start_ns: int = 500) -> None:
        self._events = list(events)
        self._trace_start_ns = trace_start_ns

    def events(self) -> list[Any]:
        return self._events

    def trace_start_ns(self) -> int:
        return self._trace_start_ns

    def save(self, path: str) -> None:
        """torch's own writer, which polyprof reads on torch < 2.13 (flows, python_function rows):
        a trace with no events, as torch writes for rows recorded without them."""
        with open(path, "w", encoding="utf-8") as file:
            file.write('{"traceEvents": []}')


__all__ = [
    "ComponentPlugin",
    "EventKind",
    "ExportedTrace",
    "FakeTracer",
    "InMemoryExporter",
    "KinetoEventStandIn",
    "KinetoEventStandIn211",
    "RawResultStandIn",
    "make_event_batch",
    "make_plugin_manager_for_tests",
    "make_trace",
]


def run_pytest_in_child(path: str, *args: str, timeout_s: float = 600.0) -> str:
    """Run the tests of ``path`` with pytest in a fresh Python process; return its summary line.

    For tests that change what is process-wide and cannot be undone, such as
    asking torch's collector for a device activity torch's build cannot record
    (its Kineto keeps device state for the rest of the process). Raises
    ``AssertionError`` with pytest's output when any test there fails.
    """
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    if done.returncode != 0:
        raise AssertionError(
            f"{path} failed in its own process: {summary}\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
        )
    return summary
