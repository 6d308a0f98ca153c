"""torch's own collector result, shared by every tracer that decodes rows from it.

CUPTI and PTI are process-wide, and a GPU build of torch hands them to its
Kineto as soon as its collector is prepared, even for CPU-only recording
(DESIGN.md, "One owner of CUPTI and PTI per process"). So where torch's
Kineto serves a device, polyprof asks torch's collector for that activity
and takes the device rows from its raw result. The public contract:

* a device plugin names the torch activities it needs through the
  ``polyprof_torch_collector_activities`` hook; the session collects them
  into ``ProfileConfig.torch_activities``;
* the tracer that drives torch's collector (a ``TorchCollectorOwner``, the
  built-in ``torch_cpu``) prepares it for CPU (when asked) plus those
  activities, and hands every raw result it takes, wrapped in a
  ``CollectorResult``, to each ``TorchResultTracer`` of the session;
* a ``TorchResultTracer`` records nothing itself: its ``decode`` turns the
  rows it owns into event batches on its own bus task, concurrently with
  the CPU rows.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import numpy as np

from polyprof.base.activity import ProfilerActivity, device_for_use_device
from polyprof.base.events import DeviceType, EventBatch, EventKind
from polyprof.base.kineto_format import CATEGORY_BY_KIND, DEVICE_KINDS, FLOW_AC2G, HOST_CATEGORIES
from polyprof.hooks.components import Tracer

#: Kineto's activity types (``_KinetoEvent.activity_type()``) of the rows the CPU tracer always
#: owns: the trace format's host categories. It also keeps host rows of types no device tracer
#: claims, as torch lists them.
HOST_ACTIVITY_TYPES: frozenset[str] = HOST_CATEGORIES
#: Before torch 2.12 (no activity type): the kind of a host-side row of a collector result that a
#: device tracer decodes (a runtime or driver call, its tracer's overhead), told by Kineto's name
#: for it; None leaves the row to the CPU tracer.
HostRowKind = Callable[[str], "EventKind | None"]
#: Before torch 2.13 (no ``flow_*`` accessors on torch's events): for a row a device tracer decodes,
#: of this kind and with this name, whether Kineto's writer draws an ``ac2g`` flow event at it that
#: starts an arrow there (True) or ends one there (False), or none (None). The flow's id is the row's
#: correlation id, as Kineto's is (``CuptiActivity::flowId``).
FlowRule = Callable[[EventKind, str], "bool | None"]


class CollectorResult:
    """One raw ``torch._C._autograd._ProfilerResult`` and what several decoders read of it once.

    Thread-safe: the CPU tracer and device tracers decode on their own bus
    tasks. ``events()`` is torch's list (pybind builds a new wrapper list on
    every call, so it is fetched once); ``activity_types()`` is each event's
    Kineto activity type where the installed torch has the accessor (2.12+),
    else None.
    """

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._lock = threading.Lock()
        self._events: list[Any] | None = None
        self._activity_types: list[str] | None = None
        self._read_once: dict[str, Any] = {}

    def events(self) -> list[Any]:
        with self._lock:
            if self._events is None:
                self._events = self.raw.events()
            return self._events

    def activity_types(self) -> list[str] | None:
        events = self.events()
        with self._lock:
            if self._activity_types is None:
                if not events or not hasattr(events[0], "activity_type"):
                    return None if events else []
                self._activity_types = [ev.activity_type() for ev in events]
            return self._activity_types

    def read_once(self, key: str, read: Callable[[Any], Any]) -> Any:
        """``read(raw)`` the first time ``key`` is asked for, the same value after.

        For what torch gives only once, such as its own writer's file
        (``result.save``: a result is written once), shared by the decoders.
        """
        with self._lock:
            if key not in self._read_once:
                self._read_once[key] = read(self.raw)
            return self._read_once[key]

    def release(self) -> None:
        """Drop the event wrappers (~330 bytes each); the raw result lives while anyone holds it."""
        with self._lock:
            self._events = None


class TorchResultTracer(Tracer):
    """A tracer whose rows come from torch's own collector result.

    It records nothing itself, so it hands nothing over while recording. The
    session connects it to the session's ``TorchCollectorOwner``, which puts
    each ``CollectorResult`` into this tracer's outbox and closes the outbox
    once the recording's last result is in. ``stop`` runs before the owner
    stops the collector (tracers stop in order, the owner last): the place to
    synchronize devices in use, as torch does before ``_disable_profiler``.
    """

    hands_over_while_recording = False
    #: Kineto's activity types of the rows ``decode`` takes (torch 2.12+). The CPU tracer leaves
    #: these out and keeps every other host row.
    claimed_activity_types: frozenset[str] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        self._owner: TorchCollectorOwner | None = None

    def host_row_kind(self, name: str) -> EventKind | None:
        """Before torch 2.12: the kind of the host-side row named ``name`` if ``decode`` takes it.

        Runtime and driver calls and the device tracer's overhead are CPU-tagged
        rows there, told apart only by Kineto's names for them. Default: none.
        """
        return None

    def fed_by(self, owner: TorchCollectorOwner) -> None:
        """The session connects this tracer to the owner of torch's collector."""
        self._owner = owner

    def start(self) -> None:
        self.outbox.reopen()

    def before_collector_stops(self) -> None:
        """torch's collector is about to stop, at the end or for a nested torch profiler (user's
        thread): wait for the devices in use here, as torch.profiler does. Default: nothing."""

    def stop(self) -> None:
        """Before the owner stops the collector (user's thread); the owner closes the outbox."""
        self.before_collector_stops()

    def toggle_collection(self, enable: bool, activities: frozenset[ProfilerActivity]) -> None:
        """Pause or resume this tracer's activities in torch's collector (through its owner)."""
        names = {activity.name for activity in self.activities & activities}
        if names and self._owner is not None:
            self._owner.toggle_torch_activities(enable, frozenset(names))

    def receive(self, result: CollectorResult) -> None:
        """A result of the collector (owner's thread, at stop or at a nested profiler's start)."""
        self.outbox.put(result)

    def results_complete(self) -> None:
        """The recording's last result is in (owner's thread)."""
        self.outbox.close()

    @abc.abstractmethod
    def decode(self, item: CollectorResult) -> list[EventBatch]:
        """The event batches of this tracer's rows of ``item`` (its own bus task)."""


#: Kinds that happen on a device (pid: device index, tid: stream or queue); the other kinds a
#: device plugin decodes (runtime, driver, sync, overhead) happen on the host. A sync sits on a
#: device lane only when Kineto recorded it on the device (``decode_device_rows``).
ON_DEVICE_KINDS = DEVICE_KINDS - {EventKind.SYNC}


#: The activity type Kineto files each device kind under (for rows of torch before 2.12).
_KINETO_TYPE_OF_DEVICE_KIND = {kind: CATEGORY_BY_KIND[kind] for kind in ON_DEVICE_KINDS}


def device_row_kind_by_name(event: Any) -> EventKind:
    """A device row's kind where torch has no activity type (before 2.12): by what Kineto names it."""
    if event.is_user_annotation():
        return EventKind.GPU_USER_ANNOTATION
    name = event.name()
    if name.startswith("Memcpy"):
        return EventKind.GPU_MEMCPY
    if name.startswith("Memset"):
        return EventKind.GPU_MEMSET
    return EventKind.KERNEL


def decode_device_rows(
    result: CollectorResult,
    *,
    source: str,
    device_type: DeviceType,
    kind_by_activity_type: dict[str, EventKind],
    pid: int,
    also_tagged: frozenset[DeviceType] = frozenset(),
    host_row_kind: HostRowKind | None = None,
    flow_rule: FlowRule | None = None,
) -> EventBatch:
    """One device's rows of ``result`` as a batch, with the links and flows torch made.

    Which rows: by Kineto's activity type where torch has the accessor (2.12+),
    through ``kind_by_activity_type``. Before 2.12, the rows on ``device_type``
    (``device_row_kind_by_name``), and the CPU-tagged rows ``host_row_kind``
    names (runtime and driver calls, overhead; ``record_function`` ranges
    never), filed under the activity type ``kind_by_activity_type`` gives
    their kind. Device rows sit on (device index,
    stream); host rows on (process ``pid``, OS thread), with torch's small
    thread id for the tree. ``linked_correlation_id`` is the launching op's id,
    ``correlation_id`` the device API's. ``also_tagged``: other device types
    torch gives this device's rows (some releases tag XPU rows CUDA); the
    rows come out as ``device_type``. Rows torch's own parse hides
    (``is_hidden_event``: Kineto metadata ``"hidden": "1"``, which only
    third-party Kineto plugins set, never Kineto's CUPTI or XPU code) are left
    out, as torch's tables leave them out and as the CPU tracer leaves out its
    own; torch's trace, written by Kineto, still has them.

    Flows: each row's ``ac2g`` flow as Kineto gave it to torch (``flow_id``,
    ``flow_type``, ``flow_start``; torch 2.13+), which is what Kineto's
    writer draws in torch's trace: every runtime or driver call and every
    device activity with a correlation id gets a flow event, a start on the
    calls that launch, copy, fill or wait, an end on everything else (the
    device work, and calls such as ``cudaStreamIsCapturing`` whose arrow
    leads nowhere). Before 2.13, ``flow_rule`` gives the same from each
    row's kind and name; without one the rows carry no flows (the Chrome
    writer then pairs each launch with its device work itself).
    """
    tagged = {int(device_type), *(int(t) for t in also_tagged)}
    events = result.events()
    types = result.activity_types()
    picked: list[tuple[Any, EventKind, str]] = []
    if types is not None:
        for ev, t in zip(events, types, strict=True):
            kind = kind_by_activity_type.get(t)
            # "kernel", "gpu_memcpy", ... name no device: keep the device rows of this device only
            if kind is not None and (kind not in ON_DEVICE_KINDS or int(ev.device_type()) in tagged):
                picked.append((ev, kind, t))
    else:
        cpu = int(DeviceType.CPU)
        type_of_kind = {kind: t for t, kind in kind_by_activity_type.items()}
        for ev in events:
            device = int(ev.device_type())
            if device in tagged:
                kind = device_row_kind_by_name(ev)
                picked.append((ev, kind, _KINETO_TYPE_OF_DEVICE_KIND[kind]))
            elif device == cpu and host_row_kind is not None:
                host_kind = host_row_kind(ev.name())
                if host_kind is not None and not ev.is_user_annotation():  # as DeviceRowClaims
                    picked.append((ev, host_kind, type_of_kind.get(host_kind, host_kind.name.lower())))
    if picked and hasattr(picked[0][0], "is_hidden_event"):
        picked = [p for p in picked if not p[0].is_hidden_event()]  # torch's parse skips these
    n = len(picked)
    if not n:
        return EventBatch.empty(source)
    rows = [ev for ev, _, _ in picked]
    kinds = np.array([int(k) for _, k, _ in picked], dtype=np.int8)
    on_device = np.isin(kinds, [int(k) for k in ON_DEVICE_KINDS])
    # a stream sync recorded on the device (cuda_sync) sits on its stream's lane, as Kineto draws it;
    # it is never device time (polyprof.analysis.tree)
    device_tagged = np.array([int(ev.device_type()) in tagged for ev in rows], dtype=bool)
    on_device |= (kinds == int(EventKind.SYNC)) & device_tagged
    # Kineto's activity type marks each row as one torch's collector recorded: the tree applies the
    # installed release's rules to those (before 2.12, the type Kineto files the kind under).
    type_names: dict[str, int] = {}
    type_idx = np.array([type_names.setdefault(t, len(type_names)) for _, _, t in picked], dtype=np.int32)
    start = np.array([ev.start_ns() for ev in rows], dtype=np.int64)
    end = np.array([ev.end_ns() for ev in rows], dtype=np.int64)
    device_index = np.array([ev.device_index() for ev in rows], dtype=np.int64)
    resource = np.array([_as_int64(ev.device_resource_id()) for ev in rows], dtype=np.int64)
    names: dict[str, int] = {}
    name_idx = np.array([names.setdefault(ev.name(), len(names)) for ev in rows], dtype=np.int32)
    linked = np.array([ev.linked_correlation_id() for ev in rows], dtype=np.int64)
    correlation = np.array([ev.correlation_id() for ev in rows], dtype=np.int64)
    columns = {
        "kind": kinds,
        "name": name_idx,
        "start_ns": start,
        "dur_ns": end - start,
        "pid": np.where(on_device, device_index, pid),
        "tid": resource,
        "thread": np.array([_as_int64(ev.start_thread_id()) for ev in rows], dtype=np.int64),
        "is_async": np.array([ev.is_async() for ev in rows], dtype=bool),
        "device_type": np.where(on_device, int(device_type), int(DeviceType.CPU)).astype(np.int8),
        "device_index": np.where(on_device, device_index, 0).astype(np.int32),
        "stream": np.where(on_device, resource, -1),
        "correlation_id": correlation,
        "linked_correlation_id": linked,
        # Kineto's "External id" of a device row is the op it belongs to (2.12+ has the accessor)
        "external_id": np.array([ev.external_id() for ev in rows], dtype=np.int64)
        if hasattr(rows[0], "external_id")
        else linked,
    }
    columns["activity_type"] = type_idx
    flows = _flow_columns(rows, kinds, tuple(names), name_idx, correlation, flow_rule)
    if flows is not None:
        columns.update(flows)
    return EventBatch.build(source, columns, {"name": tuple(names), "activity_type": tuple(type_names)})


def _flow_columns(
    rows: list[Any],
    kinds: np.ndarray,
    names: tuple[str, ...],
    name_idx: np.ndarray,
    correlation_id: np.ndarray,
    flow_rule: FlowRule | None,
) -> dict[str, np.ndarray] | None:
    """``flow_id``, ``flow_type`` and ``flow_start`` of ``rows`` (see ``decode_device_rows``), or None."""
    n = len(rows)
    flow_type = np.zeros(n, dtype=np.int8)
    flow_start = np.zeros(n, dtype=bool)
    if hasattr(rows[0], "flow_id"):  # torch 2.13+: Kineto's own flow of each activity
        flow_id = np.array([ev.flow_id() for ev in rows], dtype=np.int64)
        with_flow = np.flatnonzero(flow_id).tolist()
        for i in with_flow:  # type and start are read only where there is a flow
            flow_type[i] = rows[i].flow_type()
            flow_start[i] = rows[i].flow_start()
        # Kineto gives every activity with a correlation id a flow: none at all means this torch
        # does not hand device rows' flows over, while its writer still draws them
        if with_flow or flow_rule is None or not correlation_id.any():
            return {"flow_id": flow_id, "flow_type": flow_type, "flow_start": flow_start}
    if flow_rule is None:
        return None
    rule = {  # one call per distinct (kind, name)
        pair: flow_rule(EventKind(pair[0]), names[pair[1]])
        for pair in set(zip(kinds.tolist(), name_idx.tolist(), strict=True))
    }
    starts = [rule[pair] for pair in zip(kinds.tolist(), name_idx.tolist(), strict=True)]
    drawn = np.array([s is not None for s in starts], dtype=bool) & (correlation_id != 0)
    flow_type[drawn] = FLOW_AC2G
    flow_start[drawn] = np.array([bool(s) for s in starts], dtype=bool)[drawn]
    return {"flow_id": np.where(drawn, correlation_id, 0), "flow_type": flow_type, "flow_start": flow_start}


def _as_int64(value: int) -> int:
    """An id torch hands out as unsigned 64-bit (an unset thread: 2**64 - 1), as int64 bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def kineto_device_reason(device: str, *, hint: str = "") -> str | None:
    """None when torch sees a ``device`` (a ``use_device``: "cuda", "xpu") and Kineto records it, else why.

    What ``torch.profiler.supported_activities()`` asks before it lists a
    device activity; device plugins ask it when that device is recorded or
    torch is loaded. ``hint`` follows "sees no ... device" (e.g. the visible
    devices setting).
    """
    import sys

    torch: Any = sys.modules.get("torch")
    if torch is None:
        import torch
    row = device_for_use_device(device)
    name = row.collector_activity if row is not None else device.upper()
    try:
        if not getattr(torch, device).is_available():
            return f"torch {torch.__version__} sees no {name} device{hint}"
        from torch.profiler import ProfilerActivity as TorchActivity
        from torch.profiler import supported_activities

        if getattr(TorchActivity, name) not in supported_activities():
            return f"torch {torch.__version__}'s Kineto cannot record {name}"
    except Exception as exc:  # noqa: BLE001 - a broken device setup is a reason, not a crash
        return f"torch's {name} check failed: {exc!r}"
    return None


@attrs.frozen
class DeviceRowClaims:
    """Which rows of a collector result the session's device tracers decode; the CPU tracer reads the rest.

    ``activity_types`` (torch 2.12+): None claims every type but the host
    ones. ``host_row_kinds`` (before 2.12): each tracer's ``host_row_kind``.
    """

    activity_types: frozenset[str] | None = None
    host_row_kinds: tuple[HostRowKind, ...] = ()

    @classmethod
    def of(cls, tracers: Iterable[TorchResultTracer]) -> DeviceRowClaims:
        tracers = list(tracers)
        types = frozenset().union(*(t.claimed_activity_types for t in tracers))
        return cls(types, tuple(t.host_row_kind for t in tracers))

    def claims_type(self, activity_type: str) -> bool:
        if activity_type in HOST_ACTIVITY_TYPES:
            return False
        return self.activity_types is None or activity_type in self.activity_types

    def claims_host_row(self, event: Any) -> bool:
        """Before 2.12: whether a CPU-tagged row is a device tracer's (its name says so, and it is not
        a ``record_function`` range, which may be named anything)."""
        if not self.host_row_kinds:
            return False
        name = event.name()
        return any(kind(name) is not None for kind in self.host_row_kinds) and not event.is_user_annotation()

    def host_rows(self, events: list[Any], activity_types: list[str] | None) -> list[Any]:
        """The rows of ``events`` the CPU tracer decodes (``host_row_mask``)."""
        return [
            ev for ev, kept in zip(events, self.host_row_mask(events, activity_types), strict=True) if kept
        ]

    def host_row_mask(self, events: list[Any], activity_types: list[str] | None) -> list[bool]:
        """For each of ``events``, whether the CPU tracer decodes it.

        2.12+: host types, and unclaimed types tagged CPU (a device-tagged row
        of a type no tracer claims has no decoder: it is left out, as before
        any device plugin existed). Before: CPU-tagged rows no tracer claims.
        """
        cpu = int(DeviceType.CPU)
        if activity_types is not None:
            return [
                t in HOST_ACTIVITY_TYPES or (not self.claims_type(t) and int(ev.device_type()) == cpu)
                for ev, t in zip(events, activity_types, strict=True)
            ]
        return [int(ev.device_type()) == cpu and not self.claims_host_row(ev) for ev in events]


class TorchCollectorOwner(abc.ABC):
    """The one tracer of a session that drives torch's collector."""

    @abc.abstractmethod
    def share_results_with(self, tracer: TorchResultTracer) -> None:
        """Hand every result of the collector to ``tracer`` too, and tell it when they are complete."""

    @abc.abstractmethod
    def toggle_torch_activities(self, enable: bool, names: frozenset[str]) -> None:
        """Pause or resume torch's collector for these activities (``"CUDA"``, ...) while recording."""

    def memory_profile_results(self) -> tuple[Any, ...]:
        """The raw results of the last recording, kept only when torch's memory profile needs them
        (``polyprof.runtime.memory_timeline.keeps_memory_profile``); else none."""
        return ()

    def collector_lost(self) -> bool:
        """Whether code outside polyprof ended the collector session this tracer started (user's thread).

        Once True it stays True for the session: the tracer records nothing more
        with torch's collector, and the session's recording lets another one take
        the process's recording gate (``polyprof.runtime.recording``). Default: never.
        """
        return False


__all__ = [
    "HOST_ACTIVITY_TYPES",
    "ON_DEVICE_KINDS",
    "CollectorResult",
    "DeviceRowClaims",
    "FlowRule",
    "HostRowKind",
    "TorchCollectorOwner",
    "TorchResultTracer",
    "decode_device_rows",
    "device_row_kind_by_name",
    "kineto_device_reason",
]
