"""The result objects users see: torch's ``FunctionEvent``, ``FunctionEventAvg`` and ``EventList``.

They carry the installed torch's attribute names and behaviour
(``TorchEventSurface``, asked of torch's own classes: an attribute that
release lacks does not exist here either, and where torch warns on reading
one, so does polyprof), so code written for ``prof.events()`` /
``prof.key_averages()`` runs unchanged, and ``table()`` prints torch's text.
Differences in how they are made:

* ``FunctionEvent`` is a *view* of one row of an ``EventTree`` (the columnar
  result of ``polyprof.tree``): made when asked for, then kept, so
  ``evt.cpu_parent is parent`` holds and a 200k-event list costs nothing until
  it is iterated. Its attributes are read-only, except the three that torch's
  table code writes (``self_cpu_percent``, ``total_cpu_percent``,
  ``total_device_percent``) and what torch's ``append_kernel``,
  ``append_cpu_child`` and ``set_cpu_parent`` change (the event's own times
  follow; its parents' precomputed totals do not). torch's per-argument
  details (``concrete_inputs``, ``kwinputs``, ``input_dtypes``,
  ``structured_input_*``) and Kineto's metadata are the values the tracer
  decoded from torch's ``_KinetoEvent``; lists and dicts are copied on each
  read, as each torch event has its own.
* ``EventList`` is a mutable sequence. While it still mirrors tree rows it
  answers ``key_averages``, ``total_average``, ``self_cpu_time_total`` and
  ``export_stacks`` with vectorized code; after arbitrary edits it falls back
  to torch's per-object algorithms, with the same results.
* ``FunctionEventAvg`` is a plain mutable object, as in torch; the ones from
  ``key_averages`` are built from a columnar ``KeyAveragesSummary``
  (``polyprof.averages``).

``ProfileResults`` is what a profiler frontend holds after recording: its
traces (several with ``acc_events``, newest first in ``events()`` as in torch),
``use_device`` and the session's aggregators. Every ``key_averages()`` table
takes one route (``_average_by_key``): ``prof.key_averages()``,
``prof.events().key_averages()`` and the key averages of any list of a
recording's events ask the session's aggregator named ``key_averages``,
handing it the recording's trace, its ``EventTree`` and the rows to summarise;
without a session (a saved trace, a list built by hand) the same rows go to
``polyprof.averages.summarize``, which the built-in aggregator wraps.
"""

from __future__ import annotations

import copy
import functools
import os
import sys
import threading
import warnings
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableSequence, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from polyprof._log import get_logger
from polyprof.averages import KEY_AVERAGES, KeyAveragesSummary, summarize
from polyprof.collapsed_stacks import (
    SUPPORTED_METRICS,
    collapsed_stack_lines,
    collapsed_stack_lines_of_objects,
    write_lines,
)
from polyprof.events import CATEGORY_BY_KIND, FIELDS, DeviceType, EventKind, concat
from polyprof.table import format_time
from polyprof.tree import (
    LAZY_COLUMNS,
    EventTree,
    MergedTrace,
    post_processing_rules,
    python_sum_by_segment,
    tree_for,
)

if TYPE_CHECKING:
    from polyprof.components import Aggregator
    from polyprof.trace import Trace

log = get_logger(__name__)

__all__ = [
    "EventList",
    "FormattedTimesMixin",
    "FunctionEvent",
    "FunctionEventAvg",
    "Interval",
    "Kernel",
    "ProfileResults",
    "wrap_key_averages",
]

Kernel = namedtuple("Kernel", ["name", "device", "duration"])


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
    return {int(m): m for m in TorchDeviceType.__members__.values()}


def _device_type(value: int) -> Any:
    members = _device_type_members()
    member = members.get(value)
    return member if member is not None else DeviceType(value)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`{old}` is deprecated. Use `{new}` instead.", FutureWarning, stacklevel=3)


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


def _no_attribute(owner: object, name: str) -> AttributeError:
    version = torch_event_surface().torch_version
    return AttributeError(
        f"{type(owner).__name__!r} object has no attribute {name!r} "
        f"(the installed torch {version}'s {type(owner).__name__} has none)"
    )


class Interval:
    """A time range in µs (torch's ``Interval``)."""

    __slots__ = ("end", "start")

    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.end = end

    def elapsed_us(self) -> float:
        """The length of the interval."""
        return self.end - self.start

    def __repr__(self) -> str:
        return f"Interval(start={self.start!r}, end={self.end!r})"


def _time_property(name: str) -> property:
    return property(
        lambda self: format_time(getattr(self, name)), doc=f"``{name}`` formatted as torch prints it."
    )


class FormattedTimesMixin:
    """``*_str`` formatted times and per-call averages (torch's mixin of the same name)."""

    __slots__ = ()

    cpu_time_str = _time_property("cpu_time")
    device_time_str = _time_property("device_time")
    cpu_time_total_str = _time_property("cpu_time_total")
    device_time_total_str = _time_property("device_time_total")
    self_cpu_time_total_str = _time_property("self_cpu_time_total")
    self_device_time_total_str = _time_property("self_device_time_total")

    @property
    def cpu_time(self) -> float:
        """Average CPU time per call (µs)."""
        return 0.0 if self.count == 0 else 1.0 * self.cpu_time_total / self.count  # type: ignore[attr-defined]

    @property
    def device_time(self) -> float:
        """Average device time per call (µs)."""
        return 0.0 if self.count == 0 else 1.0 * self.device_time_total / self.count  # type: ignore[attr-defined]

    @property
    def cuda_time(self) -> float:
        """Deprecated alias of ``device_time``."""
        warnings.warn(
            "`cuda_time` is deprecated, please use `device_time` instead.", FutureWarning, stacklevel=2
        )
        return self.device_time


# ------------------------------------------------------------------ store


class _EventStore:
    """One tree, its columns as Python lists, and the ``FunctionEvent`` views made of it.

    A view reads ``values(name)[row]``: each column becomes a list once, on
    first use, so reading an attribute of every event costs a list index, not
    a numpy scalar conversion. Each row's view is made once, so identity holds
    among the lists that share the store. ``results`` is the recording the tree
    belongs to (None for a tree given by hand): its aggregators answer
    ``key_averages`` for every list of these views.
    """

    def __init__(self, tree: EventTree, results: ProfileResults | None = None) -> None:
        self.tree = tree
        self.results = results
        self._views: list[FunctionEvent | None] = [None] * len(tree)
        self._values: dict[str, list[Any]] = {}
        self._lock = threading.Lock()

    def view(self, row: int) -> FunctionEvent:
        evt = self._views[row]
        if evt is None:
            with self._lock:
                evt = self._views[row]
                if evt is None:
                    evt = self._views[row] = FunctionEvent(self, row)
        return evt

    def views(self, rows: Iterable[int]) -> list[FunctionEvent]:
        """The views of ``rows``, made under one lock acquisition."""
        cache = self._views
        rows = list(rows)
        if any(cache[r] is None for r in rows):
            with self._lock:
                for r in rows:
                    if cache[r] is None:
                        cache[r] = FunctionEvent(self, r)
        return [cache[r] for r in rows]  # type: ignore[misc]

    def values(self, name: str) -> list[Any]:
        """Column ``name`` as a list of the Python values torch's ``FunctionEvent`` returns."""
        found = self._values.get(name)
        if found is None:
            built = self._build(name)
            with self._lock:
                found = self._values.setdefault(name, built)
        return found

    def _build(self, name: str) -> list[Any]:
        t = self.tree
        if name in LAZY_COLUMNS:
            return t.column(name).tolist()
        if name == "name":
            keys = t.keys
            return [keys[k] for k in t.key.tolist()]
        if name in _TABLE_COLUMNS:
            column, table_name, empty = _TABLE_COLUMNS[name]
            table = [*getattr(t, table_name), empty]  # index -1 reads the empty value
            return [table[i] for i in getattr(t, column).tolist()]
        if name in _RAW_FIELDS:
            return _raw_values(t, name)
        if name == "thread":  # torch's thread ids are unsigned: an unset one reads 2**64 - 1, not -1
            return np.asarray(t.thread, dtype=np.int64).view(np.uint64).tolist()
        values = getattr(t, name).tolist()
        zero = _ZERO_WHERE.get(name)
        if zero is not None:  # torch returns the int 0 there, not 0.0
            for row in np.flatnonzero(zero(t)).tolist():
                values[row] = 0
        return values


#: Interned columns read as values: list name -> (tree column, tree table, value for -1).
_TABLE_COLUMNS: dict[str, tuple[str, str, Any]] = {
    "trace_name": ("trace_name", "trace_names", None),
    "overload_name": ("overload", "overloads", ""),
    "stack_tuple": ("stack", "stacks", ()),
    "shapes_tuple": ("input_shapes", "shapes", ()),
}


#: Marks a row whose batch holds no value: the reader returns a fresh ``_RawField.empty``.
_EMPTY: Any = object()
#: Marks torch's synthetic ``[memory]`` rows: the reader returns ``_RawField.synthetic``.
_SYNTHETIC: Any = object()


@attrs.frozen
class _RawField:
    """A per-event value polyprof keeps as the tracer decoded it from torch's ``_KinetoEvent``."""

    #: The value of an event that recorded none (torch's accessor returns it): ``[]``, ``{}``, ``""``.
    empty: Any
    #: torch's value on its synthetic ``[memory]`` / ``[OutOfMemory]`` rows (the constructor default).
    synthetic: Any = None


#: Batch field (polyprof.events.FIELDS) -> how torch fills the ``FunctionEvent`` attribute from it.
_RAW_FIELDS: dict[str, _RawField] = {
    "concrete_inputs": _RawField([]),
    "kwinputs": _RawField({}),
    "input_dtypes": _RawField([]),
    "structured_input_shapes": _RawField([]),
    "structured_input_strides": _RawField([]),
    "metadata_json": _RawField(""),
    "extra_meta": _RawField({}),
    "typed_metadata": _RawField({}),
    "activity_type": _RawField(None),
    "python_module_id": _RawField(-1, -1),
}

_RUNTIME_ACTIVITY = {"cuda": ("cuda_runtime", "cuda_driver"), "xpu": ("xpu_runtime", "xpu_driver")}


def _derived_activity_types(tree: EventTree) -> list[Any]:
    default = ("privateuse1_runtime", "privateuse1_driver")
    runtime, driver = _RUNTIME_ACTIVITY.get(tree.use_device or "", default)
    by_kind = {
        **CATEGORY_BY_KIND,
        EventKind.RUNTIME: runtime,
        EventKind.DRIVER: driver,
        EventKind.SYNC: "cuda_sync",
    }
    return [by_kind.get(k) for k in tree.kind.tolist()]


def _raw_values(tree: EventTree, field: str) -> list[Any]:
    """Per row of ``tree``: the decoded value of ``field``, or ``_EMPTY`` / ``_SYNTHETIC``."""
    if tree.parts:
        return [v for part in tree.parts for v in _raw_values(part, field)]
    batch = tree.batch
    synthetic = tree.synthetic.tolist()
    if batch is None or not batch.has(field):
        if field == "activity_type":
            values = _derived_activity_types(tree)
        else:
            values = [_EMPTY] * len(tree)
    elif FIELDS[field].interned:
        table = [*batch.table(field), _EMPTY]  # index -1 reads _EMPTY
        values = [table[i] for i in batch[field][tree.source].tolist()]
    else:
        values = batch[field][tree.source].tolist()
    return [_SYNTHETIC if syn else v for v, syn in zip(values, synthetic, strict=True)]


def _not_on_cpu(t: EventTree) -> np.ndarray:
    return t.device_type != DeviceType.CPU


def _without_self_metrics(t: EventTree) -> np.ndarray:
    return (t.device_type != DeviceType.CPU) | t.is_async


def _without_device_time(t: EventTree) -> np.ndarray:
    """Rows whose device times torch computes as the int 0.

    Async rows and every row without ``use_device``; and CPU rows with no
    kernel anywhere below them: torch adds ``sum([])`` of kernels to the
    children's int zeros, which stays an int.
    """
    n = len(t)
    if not t.use_device:
        return np.ones(n, dtype=bool)
    launches = (np.diff(t.kernel_indptr) > 0) & ~t.is_async
    current = np.flatnonzero(launches)
    while len(current):  # one level of ancestors per pass
        up = t.parent[current]
        up = up[(up >= 0)]
        up = np.unique(up[~launches[up] & ~t.is_async[up]])
        launches[up] = True
        current = up
    return t.is_async | ((t.device_type == DeviceType.CPU) & ~launches)


#: Sums that torch's ``FunctionEventAvg`` starts at the int 0.
_FLOAT_SUMS = ("cpu_time_total", "self_cpu_time_total", "device_time_total", "self_device_time_total")

#: Rows where torch's property returns the int 0.
_ZERO_WHERE = {
    "cpu_time_total": _not_on_cpu,
    "self_cpu_time_total": _without_self_metrics,
    "device_time_total": _without_device_time,
    "self_device_time_total": _without_device_time,
}


# ------------------------------------------------------------ FunctionEvent


def _column(name: str, doc: str = "") -> property:
    def get(self: FunctionEvent) -> Any:
        return self._store.values(name)[self._row]

    return property(get, doc=doc or f"torch's ``FunctionEvent.{name}``.")


def _versioned(name: str, getter: Callable[[FunctionEvent], Any], doc: str) -> property:
    """An attribute that exists only where the installed torch's ``FunctionEvent`` has it.

    Elsewhere reading it raises ``AttributeError`` (so ``hasattr`` agrees with
    torch's); where torch's warns on reading (deprecated), this warns the same.
    """

    def get(self: FunctionEvent) -> Any:
        surface = torch_event_surface()
        if not surface.event_has(name):
            raise _no_attribute(self, name)
        warning = surface.deprecated.get(name)
        if warning is not None:
            warnings.warn(warning[1], warning[0], stacklevel=2)
        return getter(self)

    return property(get, doc=doc)


def _versioned_column(name: str, doc: str = "") -> property:
    return _versioned(
        name, lambda self: self._store.values(name)[self._row], doc or f"torch's ``FunctionEvent.{name}``."
    )


def _thawed(value: Any) -> Any:
    """A copy the caller may change: one decoded value is shared by every event that recorded it."""
    return copy.deepcopy(value) if isinstance(value, (list, dict)) and value else copy.copy(value)


def _raw_reader(field: str) -> Callable[[FunctionEvent], Any]:
    spec = _RAW_FIELDS[field]

    def read(self: FunctionEvent) -> Any:
        value = self._store.values(field)[self._row]
        if value is _SYNTHETIC:
            return spec.synthetic
        return _thawed(spec.empty if value is _EMPTY else value)

    return read


def _raw(field: str, doc: str, *, attribute: str | None = None) -> property:
    """A raw ``_KinetoEvent`` value as torch's attribute ``attribute`` (default: ``field``)."""
    return _versioned(attribute or field, _raw_reader(field), doc)


class FunctionEvent(FormattedTimesMixin):
    """One profiled event, as torch's ``FunctionEvent`` (a view of one tree row).

    Times are µs relative to the start of the recording, computed exactly as
    torch computes them, so ``cpu_time_total`` and ``self_cpu_time_total`` are
    the same floats torch reports for the same raw result. The attributes are
    those of the installed torch's ``FunctionEvent`` (``TorchEventSurface``):
    one that release lacks raises ``AttributeError`` and is left out of ``dir``.
    """

    __slots__ = ("_edits", "_row", "_store", "self_cpu_percent", "total_cpu_percent", "total_device_percent")

    def __init__(self, store: _EventStore, row: int) -> None:
        self._store = store
        self._row = row
        #: What ``append_kernel`` / ``append_cpu_child`` / ``set_cpu_parent`` changed, if anything.
        self._edits: dict[str, Any] | None = None
        self.self_cpu_percent: Any = -1
        self.total_cpu_percent: Any = -1
        self.total_device_percent: Any = -1

    def __dir__(self) -> list[str]:
        surface = torch_event_surface()
        hidden = {n for n in _VERSIONED_NAMES if not surface.event_has(n)}
        return sorted(set(super().__dir__()) - hidden)

    id = _column("event_id", "The event's correlation id (torch's ``FunctionEvent.id``).")
    name = _column("name", "The name, ``ProfilerStep#N`` folded to ``ProfilerStep*``.")
    key = _column("name", "The grouping key: the name.")
    trace_name = _column("trace_name", "The name as written to traces (None for memory rows).")
    overload_name = _versioned_column("overload_name", "The operator's overload name (torch 2.7+).")
    thread = _column("thread", "torch's sequential thread id.")
    fwd_thread = _column("fwd_thread")
    scope = _column("scope", "torch's RecordScope value (1: backward function).")
    sequence_nr = _column("sequence_nr")
    device_index = _column("device_index")
    device_resource_id = _column("device_resource_id")
    is_async = _column("is_async")
    is_user_annotation = _column("is_user_annotation")
    external_id = _versioned_column("external_id", "Kineto's External id (torch 2.12+).")
    linked_correlation_id = _versioned_column(
        "linked_correlation_id", "Id of the CPU op that launched this device activity (torch 2.12+)."
    )
    python_id = _versioned_column("python_id", "Id of a python_function event, else -1 (torch 2.12+).")
    python_parent_id = _versioned_column("python_parent_id", "Its caller's python_id, else -1 (torch 2.12+).")
    python_module_id = _raw("python_module_id", "Id of the nn.Module a python_function event ran, else -1.")
    cpu_memory_usage = _column("cpu_memory_usage")
    device_memory_usage = _column("device_memory_usage")

    concrete_inputs = _raw("concrete_inputs", "Scalar values of the op's inputs (record_shapes).")
    kwinputs = _raw("kwinputs", "Keyword inputs (record_shapes).")
    input_dtypes = _raw("input_dtypes", "Input dtypes, one string per input (torch 2.12+).")
    structured_input_shapes = _raw(
        "structured_input_shapes", "Input shapes with a list of shapes per TensorList input (torch 2.12+)."
    )
    structured_input_strides = _raw(
        "structured_input_strides", "Input strides, shaped as ``structured_input_shapes`` (torch 2.12+)."
    )
    activity_type = _raw("activity_type", "Kineto's activity type: ``cpu_op``, ``kernel``, ... (2.12+).")
    metadata_json = _raw("metadata_json", "Kineto's metadata text of the event (torch 2.10 to 2.14).")

    @property
    def _extra_meta(self) -> dict | None:
        value = _raw_reader("extra_meta")(self)
        return value or None

    event_metadata = _versioned(
        "event_metadata",
        lambda self: _event_metadata(self._extra_meta),
        "Kineto's metadata as torch's ``EventMetadata`` (torch 2.12+), or None.",
    )
    metadata = _versioned(
        "metadata",
        lambda self: _raw_reader("typed_metadata")(self) or None,
        "Kineto's typed metadata (torch 2.14+; needs ``expose_kineto_event_metadata``), or None.",
    )

    node_id = property(lambda self: -1, doc="Always -1 (no RPC nodes).")
    count = property(lambda self: 1, doc="Always 1.")
    is_remote = property(lambda self: False, doc="Always False.")
    is_legacy = property(lambda self: False, doc="Always False (Kineto-style events).")

    @property
    def use_device(self) -> str | None:
        return self._store.tree.use_device

    @property
    def time_range(self) -> Interval:
        store, row = self._store, self._row
        return Interval(store.values("start_us")[row], store.values("end_us")[row])

    @property
    def device_type(self) -> Any:
        """torch's ``DeviceType`` member (polyprof's when torch is not installed)."""
        return _device_type(self._store.values("device_type")[self._row])

    is_python_function = _versioned(
        "is_python_function",
        lambda self: self._store.values("kind")[self._row] == EventKind.PYTHON_FUNCTION,
        "True for the Python tracer's events (with_stack; torch 2.12+).",
    )

    @property
    def flops(self) -> int | None:
        """Estimated FLOPs (None for the synthetic ``[memory]`` rows, as in torch)."""
        if self._store.values("synthetic")[self._row]:
            return None
        return self._store.values("flops")[self._row]

    @property
    def input_shapes(self) -> list:
        return [list(s) if isinstance(s, tuple) else s for s in self._store.values("shapes_tuple")[self._row]]

    @property
    def stack(self) -> list[str]:
        """Python frames, innermost first (torch's filtering and backward stacks applied)."""
        return list(self._store.values("stack_tuple")[self._row])

    def _flow(self, name: str) -> Any:
        if self._store.values("synthetic")[self._row]:
            return None  # torch's memory rows have no flow fields
        return self._store.values(name)[self._row]

    flow_id = _versioned(
        "flow_id", lambda self: self._flow("flow_id"), "Chrome flow id (None for memory rows; torch 2.12+)."
    )
    flow_type = _versioned("flow_type", lambda self: self._flow("flow_type"), "Chrome flow type (2.12+).")
    flow_start = _versioned(
        "flow_start", lambda self: self._flow("flow_start"), "Whether this event starts its flow (2.12+)."
    )

    # -------------------------------------------------------- relations

    def _edited(self, name: str) -> Any:
        edits = self._edits
        return _UNSET if edits is None else edits.get(name, _UNSET)

    @property
    def cpu_parent(self) -> FunctionEvent | None:
        edited = self._edited("cpu_parent")
        if edited is not _UNSET:
            return edited
        parent = self._store.values("parent")[self._row]
        return None if parent < 0 else self._store.view(parent)

    @property
    def cpu_children(self) -> list[FunctionEvent]:
        edited = self._edited("cpu_children")
        if edited is not _UNSET:
            return list(edited)
        return self._store.views(self._store.tree.children_of(self._row).tolist())

    @property
    def kernels(self) -> list[Kernel]:
        """Device work this op launched: ``Kernel(name, device, duration_us)``."""
        edited = self._edited("kernels")
        if edited is not _UNSET:
            return list(edited)
        store = self._store
        rows = store.tree.kernels_of(self._row).tolist()
        if not rows:
            return []
        names, devices = store.values("name"), store.values("device_index")
        start, end = store.values("start_us"), store.values("end_us")
        return [Kernel(names[r], devices[r], end[r] - start[r]) for r in rows]

    def _require_cpu(self, what: str, other: Any = None) -> None:
        # torch's checks (its AssertionError), before anything changes
        if self.device_type != _device_type(int(DeviceType.CPU)):
            raise AssertionError(f"Expected device_type to be CPU to {what}, got {self.device_type}")
        if other is not None:
            if not isinstance(other, FunctionEvent):
                raise AssertionError(f"Expected a FunctionEvent to {what}, got {type(other).__name__}")
            if other.device_type != _device_type(int(DeviceType.CPU)):
                raise AssertionError(f"Expected the event to {what} to be on CPU, got {other.device_type}")

    def _edit(self, name: str, value: Any) -> None:
        if self._edits is None:
            self._edits = {}
        self._edits[name] = value

    def append_kernel(self, name: str, device: int, duration: float) -> None:
        """Add a kernel this op launched (torch's method; its device times then count it)."""
        self._require_cpu("append a kernel")
        self._edit("kernels", [*self.kernels, Kernel(name, device, duration)])

    def append_cpu_child(self, child: FunctionEvent) -> None:
        """Add a direct CPU child (torch's method; self times then subtract it)."""
        self._require_cpu("append a CPU child", child)
        self._edit("cpu_children", [*self.cpu_children, child])

    def set_cpu_parent(self, parent: FunctionEvent) -> None:
        """Set the direct CPU parent (torch's method)."""
        self._require_cpu("set a CPU parent", parent)
        self._edit("cpu_parent", parent)

    # -------------------------------------------------------- times and memory

    def _is_cpu(self) -> bool:
        return self._store.values("device_type")[self._row] == DeviceType.CPU

    @property
    def cpu_time_total(self) -> float:
        """Elapsed µs on the CPU (0 for device work)."""
        return self._store.values("cpu_time_total")[self._row]

    @property
    def self_cpu_time_total(self) -> float:
        """CPU µs minus the children's (0 for async/device rows)."""
        if self._edits is None or "cpu_children" not in self._edits:
            return self._store.values("self_cpu_time_total")[self._row]
        if self.is_async or not self._is_cpu():
            return 0
        return self.cpu_time_total - sum(child.cpu_time_total for child in self.cpu_children)

    @property
    def device_time_total(self) -> float:
        """Device µs of this op's kernels and its children's."""
        if self._edits is None or not {"cpu_children", "kernels"} & self._edits.keys():
            return self._store.values("device_time_total")[self._row]
        if self.is_async or not self.use_device:
            return 0
        if self._is_cpu():
            kernels = sum(k.duration for k in self.kernels)
            return kernels + sum(ch.device_time_total for ch in self.cpu_children)
        return self.time_range.elapsed_us()

    @property
    def self_device_time_total(self) -> float:
        """Device µs of this op's own kernels."""
        if self._edits is None or not {"cpu_children", "kernels"} & self._edits.keys():
            return self._store.values("self_device_time_total")[self._row]
        if self.is_async or not self.use_device:
            return 0
        if self._is_cpu():
            return self.device_time_total - sum(ch.device_time_total for ch in self.cpu_children)
        return self.device_time_total

    @property
    def self_cpu_memory_usage(self) -> int:
        if self._edits is None or "cpu_children" not in self._edits:
            return self._store.values("self_cpu_memory_usage")[self._row]
        if self.is_async or not self._is_cpu():
            return 0
        return self.cpu_memory_usage - sum(child.cpu_memory_usage for child in self.cpu_children)

    @property
    def self_device_memory_usage(self) -> int:
        if self._edits is None or "cpu_children" not in self._edits:
            return self._store.values("self_device_memory_usage")[self._row]
        if self.is_async or not self._is_cpu():
            return 0
        return self.device_memory_usage - sum(child.device_memory_usage for child in self.cpu_children)

    # -------------------------------------------------------- deprecated

    @property
    def cuda_time_total(self) -> float:
        _deprecated("cuda_time_total", "device_time_total")
        return self.device_time_total

    @property
    def self_cuda_time_total(self) -> float:
        _deprecated("self_cuda_time_total", "self_device_time_total")
        return self.self_device_time_total

    @property
    def self_cuda_memory_usage(self) -> int:
        _deprecated("self_cuda_memory_usage", "self_device_memory_usage")
        return self.self_device_memory_usage

    def __repr__(self) -> str:
        device_name = self.use_device
        # torch 2.6's repr has no overload name (its events have none)
        overload = (
            f" overload_name={self.overload_name}" if torch_event_surface().event_has("overload_name") else ""
        )
        return (
            f"<FunctionEvent id={self.id} name={self.name}{overload} "
            f"device_type={self.device_type} node_id={self.node_id} cpu_time={self.cpu_time_str} "
            f"start_us={self.time_range.start} end_us={self.time_range.end} "
            f"cpu_children={[child.id for child in self.cpu_children]!s} "
            f"{device_name}_time={self.device_time_str} "
            f"name={self.name} thread={self.thread} input_shapes={self.input_shapes!s} "
            f"cpu_memory_usage={self.cpu_memory_usage} {device_name}_memory_usage={self.device_memory_usage} "
            f"is_async={self.is_async} is_remote={self.is_remote} seq_nr={self.sequence_nr} "
            f"is_legacy={self.is_legacy}>"
        )


#: ``FunctionEvent`` attributes that not every supported torch has.
_VERSIONED_NAMES = frozenset(
    name
    for name, value in vars(FunctionEvent).items()
    if isinstance(value, property)
    and value.fget is not None
    and value.fget.__qualname__.startswith("_versioned")
)


def _event_metadata(extra_meta: dict | None) -> Any:
    """torch's ``EventMetadata`` of Kineto's ``extra_meta`` dict, made by torch's own ``_build_metadata``."""
    if not extra_meta:
        return None
    build = torch_event_surface().build_metadata
    return extra_meta if build is None else build(extra_meta)


# --------------------------------------------------------- FunctionEventAvg

_UNSET: Any = object()
_AVG_SUMMED = (
    "cpu_time_total",
    "device_time_total",
    "self_cpu_time_total",
    "self_device_time_total",
    "cpu_memory_usage",
    "device_memory_usage",
    "self_cpu_memory_usage",
    "self_device_memory_usage",
    "count",
)


class FunctionEventAvg(FormattedTimesMixin):
    """Statistics summed over events with the same key (torch's ``FunctionEventAvg``).

    Mutable, with ``add`` / ``+=`` as in torch. ``cpu_parent`` and
    ``cpu_children`` are those of the first event added.
    """

    def __init__(self) -> None:
        self.key: str | None = None
        self.count: int = 0
        self.node_id: int = 0
        self.is_async: bool = False
        self.is_remote: bool = False
        self.use_device: str | None = None
        self.cpu_time_total: float = 0
        self.device_time_total: float = 0
        self.self_cpu_time_total: float = 0
        self.self_device_time_total: float = 0
        self.input_shapes: Any = None
        if torch_event_surface().average_has("overload_name"):  # torch 2.7+
            self.overload_name: str | None = None
        self.stack: list | None = None
        self._scope: Any = None
        self.cpu_memory_usage: int = 0
        self.device_memory_usage: int = 0
        self.self_cpu_memory_usage: int = 0
        self.self_device_memory_usage: int = 0
        self._cpu_children: Any = None
        self._cpu_parent: Any = None
        self._first: tuple[_EventStore, int] | None = None
        self.device_type: Any = _device_type(int(DeviceType.CPU))
        self.is_legacy: bool = False
        self.flops: int = 0
        # is_user_annotation is set by add(), as in torch: a fresh average has none.

    @property
    def scope(self) -> int | None:
        """The first added event's ``scope``."""
        if self._scope is _UNSET and self._first is not None:
            store, row = self._first
            self._scope = store.view(row).scope
        return self._scope

    @scope.setter
    def scope(self, value: int | None) -> None:
        self._scope = value

    @property
    def cpu_parent(self) -> Any:
        """The first added event's ``cpu_parent``."""
        if self._cpu_parent is _UNSET and self._first is not None:
            store, row = self._first
            self._cpu_parent = store.view(row).cpu_parent
        return self._cpu_parent

    @cpu_parent.setter
    def cpu_parent(self, value: Any) -> None:
        self._cpu_parent = value

    @property
    def cpu_children(self) -> Any:
        """The first added event's ``cpu_children``."""
        if self._cpu_children is _UNSET and self._first is not None:
            store, row = self._first
            self._cpu_children = store.view(row).cpu_children
        return self._cpu_children

    @cpu_children.setter
    def cpu_children(self, value: Any) -> None:
        self._cpu_children = value

    def add(self, other: Any) -> FunctionEventAvg:
        """Add one ``FunctionEvent`` (or ``FunctionEventAvg``) with the same key."""
        missing = [name for name in ("key", *_AVG_SUMMED, "flops") if not hasattr(other, name)]
        if missing:
            raise TypeError(
                f"FunctionEventAvg.add() needs a FunctionEvent or FunctionEventAvg; {type(other).__name__} "
                f"lacks {missing}"
            )
        if self.key is None:
            # The first event sets the descriptive fields.
            self.key = other.key
            self.node_id = other.node_id
            self.is_async = other.is_async
            self.is_remote = other.is_remote
            self.cpu_parent = other.cpu_parent
            self.cpu_children = other.cpu_children
            if torch_event_surface().average_has("overload_name"):
                self.overload_name = other.overload_name
            self.input_shapes = other.input_shapes
            self.stack = other.stack
            self.scope = other.scope
            self.device_type = other.device_type
            self.is_legacy = other.is_legacy
            self.use_device = other.use_device
            # torch reads it unguarded and so cannot add an empty average; polyprof can
            self.is_user_annotation = getattr(other, "is_user_annotation", False)
        if other.key != self.key:
            raise ValueError(f"cannot add an event with key {other.key!r} to the average of {self.key!r}")
        for name in _AVG_SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if self.flops is None:
            self.flops = other.flops
        elif other.flops is not None:
            self.flops += other.flops
        return self

    def __iadd__(self, other: Any) -> FunctionEventAvg:
        return self.add(other)

    def __repr__(self) -> str:
        device_name = "cuda" if not self.use_device else self.use_device
        return (
            f"<FunctionEventAvg key={self.key} self_cpu_time={self.self_cpu_time_total_str} "
            f"cpu_time={self.cpu_time_str}  self_{device_name}_time={self.self_device_time_total_str} "
            f"{device_name}_time={self.device_time_str} input_shapes={self.input_shapes!s} "
            f"cpu_memory_usage={self.cpu_memory_usage} {device_name}_memory_usage={self.device_memory_usage}>"
        )


def _average_of_row(store: _EventStore, row: int) -> FunctionEventAvg:
    """A ``FunctionEventAvg`` whose descriptive fields are those of tree row ``row``.

    What torch's ``add`` copies from the first event; ``cpu_parent``,
    ``cpu_children`` and ``scope`` are read only if asked for. Sums are left at 0.
    """
    tree = store.tree
    avg = FunctionEventAvg()
    avg.key = tree.keys[tree.key[row]]
    avg.node_id = -1
    avg.is_async = bool(tree.is_async[row])
    avg.use_device = tree.use_device
    avg.device_type = _device_type(int(tree.device_type[row]))
    avg.is_user_annotation = bool(tree.is_user_annotation[row])
    shapes = int(tree.input_shapes[row])
    avg.input_shapes = [] if shapes < 0 else [list(s) for s in tree.shapes[shapes]]
    if torch_event_surface().average_has("overload_name"):
        overload = int(tree.overload[row])
        avg.overload_name = "" if overload < 0 else tree.overloads[overload]
    stack = int(tree.stack[row])
    avg.stack = [] if stack < 0 else list(tree.stacks[stack])
    avg._first = (store, row)
    avg._cpu_parent = _UNSET
    avg._cpu_children = _UNSET
    avg._scope = _UNSET  # the scope column may not be decoded yet
    return avg


def wrap_key_averages(
    summary: KeyAveragesSummary, *, profile_memory: bool = False, with_flops: bool = False
) -> EventList:
    """A columnar ``KeyAveragesSummary`` as torch's list of ``FunctionEventAvg``."""
    return _wrap_summary(summary, _EventStore(summary.tree), profile_memory, with_flops)


def _wrap_summary(
    summary: KeyAveragesSummary, store: _EventStore, profile_memory: bool, with_flops: bool
) -> EventList:
    """``summary`` as ``FunctionEventAvg`` rows whose ``cpu_parent`` / ``cpu_children`` are ``store``'s views."""
    tree = summary.tree
    n_stack = summary.group_by_stack_n
    sums = {name: getattr(summary, name).tolist() for name in (*_AVG_SUMMED, "flops")}
    considered = summary.group_of_row >= 0
    groups = summary.group_of_row[considered]
    for name in _FLOAT_SUMS:
        # torch adds to an int 0: a group's sum stays an int while every value added is one
        floats = ~_ZERO_WHERE[name](tree)[considered]
        all_int = np.bincount(groups, weights=floats, minlength=len(summary)) == 0
        values = sums[name]
        for g in np.flatnonzero(all_int).tolist():
            values[g] = 0
    averages = []
    for g, row in enumerate(summary.first_row.tolist()):
        avg = _average_of_row(store, row)
        for name, values in sums.items():
            setattr(avg, name, values[g])
        # torch's key_averages blanks what it did not group by.
        if not summary.group_by_input_shape:
            avg.input_shapes = ""
        if not summary.group_by_overload_name and hasattr(avg, "overload_name"):
            avg.overload_name = ""
        avg.stack = avg.stack[:n_stack] if n_stack > 0 else []
        averages.append(avg)
    return EventList(
        averages, use_device=tree.use_device, profile_memory=profile_memory, with_flops=with_flops
    )


#: What each row of an aggregator's sequence needs (what ``FunctionEventAvg.add`` reads).
_AVERAGE_ATTRIBUTES = ("key", *_AVG_SUMMED, "flops")


def _average_by_key(
    store: _EventStore,
    rows: np.ndarray,
    *,
    group_by_input_shape: bool,
    group_by_stack_n: int,
    group_by_overload_name: bool,
    include_python_functions: bool | None,
    profile_memory: bool,
    with_flops: bool,
) -> EventList:
    """The one route to every ``key_averages()`` table: ``rows`` of ``store``'s tree averaged by key.

    When the tree belongs to a recording whose session has an aggregator named
    ``key_averages`` (the built-in one, or a plugin's that replaced it), that
    aggregator answers, given the recording's trace, the tree and the rows;
    otherwise ``polyprof.averages.summarize`` does (what the built-in returns).

    :param include_python_functions: None: the installed torch's default; the
        aggregator is always given the resolved bool.
    :raises TypeError: the aggregator returned something that is not a
        ``KeyAveragesSummary`` or a sequence of ``FunctionEventAvg``-like rows.
    """
    if include_python_functions is None:
        include_python_functions = not post_processing_rules().key_averages_skips_python_functions
    grouping = {
        "group_by_input_shape": bool(group_by_input_shape),
        "group_by_stack_n": group_by_stack_n,
        "group_by_overload_name": bool(group_by_overload_name),
        "include_python_functions": bool(include_python_functions),
    }
    rows = np.array(rows, dtype=np.int64).reshape(-1)
    rows.setflags(write=False)
    results = store.results
    aggregator = (results.aggregators or {}).get(KEY_AVERAGES) if results is not None else None
    if aggregator is None or results is None:
        return _wrap_summary(summarize(store.tree, rows=rows, **grouping), store, profile_memory, with_flops)
    result = aggregator.aggregate(results.merged_trace(), tree=store.tree, rows=rows, **grouping)
    if isinstance(result, KeyAveragesSummary):
        # A summary of another tree (the aggregator built its own) gets views of that tree.
        owner = store if result.tree is store.tree else _EventStore(result.tree)
        return _wrap_summary(result, owner, profile_memory, with_flops)
    if isinstance(result, Sequence) and not isinstance(result, (str, bytes)):
        for item in result:
            missing = [name for name in _AVERAGE_ATTRIBUTES if not hasattr(item, name)]
            if missing:
                raise TypeError(
                    f"the key_averages aggregator {type(aggregator).__name__} returned a "
                    f"{type(item).__name__} row that lacks {missing}; expected a KeyAveragesSummary "
                    "or a sequence of FunctionEventAvg"
                )
        if isinstance(result, EventList):
            return result
        return EventList(
            result, use_device=store.tree.use_device, profile_memory=profile_memory, with_flops=with_flops
        )
    raise TypeError(
        f"the key_averages aggregator {type(aggregator).__name__} returned {type(result).__name__}; "
        "expected a KeyAveragesSummary or a sequence of FunctionEventAvg"
    )


# ---------------------------------------------------------------- EventList

#: Default of parameters that not every supported torch has: tells "not given" from any value.
_NOT_GIVEN: Any = object()


def _refuse_key_averages_arguments(method: str, **arguments: Any) -> None:
    """TypeError for an argument given that the installed torch's ``method`` does not take."""
    surface = torch_event_surface()
    given = sorted(name for name, value in arguments.items() if value is not _NOT_GIVEN)
    lacking = [name for name in given if not surface.key_averages_takes(name)]
    if lacking:
        valid = sorted(surface.key_averages_params or ())
        raise TypeError(
            f"{method}() got unexpected argument(s) {lacking}: the installed torch "
            f"{surface.torch_version}'s takes {valid}"
        )


def _check_stack_n(group_by_stack_n: Any) -> None:
    if isinstance(group_by_stack_n, bool) or not isinstance(group_by_stack_n, int) or group_by_stack_n < 0:
        raise ValueError(f"group_by_stack_n must be an int >= 0, got {group_by_stack_n!r}")


#: Views are made in chunks while iterating: one lock per chunk, little memory up front.
_VIEW_CHUNK = 4096

SUPPORTED_EXPORT_STACKS_METRICS = SUPPORTED_METRICS


class EventList(MutableSequence):
    """A list of events (``FunctionEvent`` or ``FunctionEventAvg``) with torch's helpers.

    ``EventList(iterable, use_device=None, profile_memory=False, with_flops=False)``
    as in torch; ``prof.events()`` returns one that mirrors tree rows lazily.
    """

    def __init__(
        self,
        *args: Iterable[Any],
        use_device: str | None = None,
        profile_memory: bool = False,
        with_flops: bool = False,
    ) -> None:
        if len(args) > 1:
            raise TypeError(f"EventList expected at most 1 positional argument, got {len(args)}")
        self._items: list[Any] | None = list(args[0]) if args else []
        self._store: _EventStore | None = None
        self._rows: np.ndarray | None = None
        self._use_device = use_device
        self._profile_memory = profile_memory
        self._with_flops = with_flops
        self._tree_built = True

    @classmethod
    def _of_store(
        cls,
        store: _EventStore,
        rows: np.ndarray | None = None,
        *,
        profile_memory: bool = False,
        with_flops: bool = False,
    ) -> EventList:
        """The views of ``store``'s tree rows (all, or ``rows`` in that order), made lazily."""
        tree = store.tree
        out = cls(use_device=tree.use_device, profile_memory=profile_memory, with_flops=with_flops)
        out._items = None
        out._store = store
        out._rows = np.arange(len(tree), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        return out

    @classmethod
    def _of_tree(
        cls,
        tree: EventTree,
        rows: np.ndarray | None = None,
        *,
        profile_memory: bool = False,
        with_flops: bool = False,
    ) -> EventList:
        """The events of a tree given by hand (no recording, so no aggregator), made lazily."""
        return cls._of_store(_EventStore(tree), rows, profile_memory=profile_memory, with_flops=with_flops)

    def _derived(self, rows_or_items: Any) -> EventList:
        if self._store is not None and isinstance(rows_or_items, np.ndarray):
            out = EventList._of_store(
                self._store,
                rows_or_items,
                profile_memory=self._profile_memory,
                with_flops=self._with_flops,
            )
            out._use_device = self._use_device
            return out
        return EventList(
            rows_or_items,
            use_device=self._use_device,
            profile_memory=self._profile_memory,
            with_flops=self._with_flops,
        )

    def _materialize(self) -> list[Any]:
        if self._items is None:
            assert self._store is not None and self._rows is not None
            self._items = self._store.views(self._rows.tolist())
            self._store = None
            self._rows = None
        return self._items

    def _tree_rows(self) -> tuple[_EventStore, np.ndarray] | None:
        """(store, rows) when every element is a view of one store's tree, else None."""
        if self._store is not None and self._rows is not None:
            return self._store, self._rows
        items = self._items or []
        if not items or not all(type(e) is FunctionEvent for e in items):
            return None
        store = items[0]._store
        if any(e._store is not store for e in items):
            return None
        return store, np.fromiter((e._row for e in items), dtype=np.int64, count=len(items))

    # -------------------------------------------------------- sequence

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else len(self._items or ())

    def __getitem__(self, index: Any) -> Any:
        if self._rows is not None and self._store is not None:
            if isinstance(index, slice):
                return self._derived(self._rows[index])
            return self._store.view(int(self._rows[index]))
        items = self._items if self._items is not None else []
        if isinstance(index, slice):
            return self._derived(items[index])
        return items[index]

    def __iter__(self) -> Iterator[Any]:
        if self._rows is not None and self._store is not None:
            return self._iter_views(self._store, self._rows)
        return iter(self._items if self._items is not None else ())

    @staticmethod
    def _iter_views(store: _EventStore, rows: np.ndarray) -> Iterator[FunctionEvent]:
        for start in range(0, len(rows), _VIEW_CHUNK):
            yield from store.views(rows[start : start + _VIEW_CHUNK].tolist())

    def __setitem__(self, index: Any, value: Any) -> None:
        self._materialize()[index] = value

    def __delitem__(self, index: Any) -> None:
        del self._materialize()[index]

    def insert(self, index: int, value: Any) -> None:
        self._materialize().insert(index, value)

    def sort(self, *, key: Any = None, reverse: bool = False) -> None:
        """Sort in place, as ``list.sort``."""
        self._materialize().sort(key=key, reverse=reverse)

    def clear(self) -> None:
        self._materialize().clear()

    def copy(self) -> list[Any]:
        """A shallow copy as a plain ``list`` (torch's ``EventList`` is a list; its ``copy`` gives one)."""
        return list(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (EventList, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __add__(self, other: Iterable[Any]) -> EventList:
        return self._derived([*self, *other])

    def __repr__(self) -> str:
        return repr(list(self))

    def __str__(self) -> str:
        return self.table()

    def _build_tree(self) -> None:
        """torch builds the tree here; polyprof's lists come with it built."""

    # -------------------------------------------------------- analysis

    @property
    def self_cpu_time_total(self) -> float:
        """Sum of ``self_cpu_time_total`` over the events (as Python's ``sum`` adds them)."""
        located = self._tree_rows()
        if located is None:
            return sum(event.self_cpu_time_total for event in self)
        store, rows = located
        values = store.tree.self_cpu_time_total[rows]
        if not len(values):
            return 0
        return float(python_sum_by_segment(np.zeros(len(values), dtype=np.int64), values, 1)[0])

    def table(
        self,
        sort_by: str | None = None,
        row_limit: int = 100,
        max_src_column_width: int = 75,
        max_name_column_width: int = 55,
        max_shapes_column_width: int = 80,
        header: str | None = None,
        top_level_events_only: bool = False,
        time_unit: str | None = None,
    ) -> str:
        """torch's summary table of these events (see ``polyprof.table.build_table``)."""
        from polyprof.table import build_table

        return build_table(
            self,
            sort_by=sort_by,
            row_limit=row_limit,
            max_src_column_width=max_src_column_width,
            max_name_column_width=max_name_column_width,
            max_shapes_column_width=max_shapes_column_width,
            header=header,
            profile_memory=self._profile_memory,
            with_flops=self._with_flops,
            top_level_events_only=top_level_events_only,
            time_unit=time_unit,
        )

    def key_averages(
        self,
        group_by_input_shapes: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = _NOT_GIVEN,
        include_python_functions: bool = _NOT_GIVEN,
        *,
        group_by_input_shape: bool | None = None,
    ) -> EventList:
        """Events averaged by key, in first-seen order (torch's ``EventList.key_averages``).

        ``group_by_input_shape`` is accepted as a spelling of
        ``group_by_input_shapes`` (``profile.key_averages`` uses it). As in the
        installed torch: ``group_by_overload_name`` exists from 2.7, and from
        2.14 python_function events are left out unless ``include_python_functions``.

        :raises TypeError: an argument the installed torch's ``key_averages`` does not take.
        """
        if group_by_input_shape is not None:
            group_by_input_shapes = group_by_input_shape
        _refuse_key_averages_arguments(
            "EventList.key_averages",
            group_by_overload_name=group_by_overload_name,
            include_python_functions=include_python_functions,
        )
        by_overload = bool(group_by_overload_name) if group_by_overload_name is not _NOT_GIVEN else False
        include_python = None if include_python_functions is _NOT_GIVEN else bool(include_python_functions)
        _check_stack_n(group_by_stack_n)
        located = self._tree_rows()
        if located is not None:
            store, rows = located
            return _average_by_key(
                store,
                rows,
                group_by_input_shape=bool(group_by_input_shapes),
                group_by_stack_n=group_by_stack_n,
                group_by_overload_name=by_overload,
                include_python_functions=include_python,
                profile_memory=self._profile_memory,
                with_flops=self._with_flops,
            )
        if include_python is None:
            include_python = not post_processing_rules().key_averages_skips_python_functions
        return self._key_averages_of_objects(
            bool(group_by_input_shapes), group_by_stack_n, by_overload, include_python
        )

    def _key_averages_of_objects(
        self, by_shapes: bool, stack_n: int, by_overload: bool, include_python: bool
    ) -> EventList:
        stats: dict[tuple, FunctionEventAvg] = {}
        for evt in self:
            if not include_python and getattr(evt, "is_python_function", False):
                continue
            key = [
                str(evt.key),
                str(evt.node_id),
                str(evt.device_type),
                str(evt.is_legacy),
                str(getattr(evt, "is_user_annotation", False)),
            ]
            if by_overload:
                key.append(evt.overload_name)
            if by_shapes:
                key.append(str(evt.input_shapes))
            if stack_n > 0:
                key += (evt.stack or [])[:stack_n]
            avg = stats.get(tuple(key))
            if avg is None:
                avg = stats[tuple(key)] = FunctionEventAvg()
            avg.add(evt)
        out = EventList(
            stats.values(),
            use_device=self._use_device,
            profile_memory=self._profile_memory,
            with_flops=self._with_flops,
        )
        for avg in out:
            avg.stack = (avg.stack or [])[:stack_n]
            if not by_shapes:
                avg.input_shapes = ""
            if not by_overload and hasattr(avg, "overload_name"):
                avg.overload_name = ""
        return out

    def total_average(self) -> FunctionEventAvg:
        """Everything summed into one ``FunctionEventAvg`` with key ``"Total"``.

        As in torch, the descriptive fields (``is_async``, ``cpu_parent``, ...)
        are those of the last event.
        """
        located = self._tree_rows()
        if located is None or not len(located[1]):
            total = FunctionEventAvg()
            for evt in self:
                total += evt
                total.key = None
            total.key = "Total"
            return total
        store, rows = located
        tree = store.tree
        total = _average_of_row(store, int(rows[-1]))  # the last event's fields
        zeros = np.zeros(len(rows), dtype=np.int64)

        def sequential(values: np.ndarray) -> float:
            return float(np.bincount(zeros, weights=values, minlength=1)[0])

        # The tree already holds 0 wherever torch's properties return 0.
        for name in _FLOAT_SUMS:
            # torch adds to an int 0: the sum stays an int while every value added is one
            all_int = bool(_ZERO_WHERE[name](tree)[rows].all())
            setattr(total, name, 0 if all_int else sequential(getattr(tree, name)[rows]))
        for name in (
            "cpu_memory_usage",
            "device_memory_usage",
            "self_cpu_memory_usage",
            "self_device_memory_usage",
        ):
            setattr(total, name, int(getattr(tree, name)[rows].sum()))
        total.flops = int(np.where(tree.synthetic[rows], 0, tree.flops[rows]).sum())
        total.count = len(rows)
        total.key = "Total"
        return total

    # -------------------------------------------------------- exports

    def supported_export_stacks_metrics(self) -> list[str]:
        return list(SUPPORTED_EXPORT_STACKS_METRICS)

    def export_stacks(self, path: str | os.PathLike[str], metric: str = "self_cpu_time_total") -> str:
        """Write collapsed stacks (``frame;frame;... value``) for flame graphs; returns the path.

        :raises ValueError: ``metric`` is not one of ``supported_export_stacks_metrics()``.
        """
        located = self._tree_rows()
        if located is not None:
            lines = collapsed_stack_lines(located[0].tree, metric, rows=located[1])
        else:
            lines = collapsed_stack_lines_of_objects(self, metric)
        return write_lines(path, lines)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> str:
        """torch's legacy Python export: a JSON array of ``"ph": "X"`` events plus kernel flows."""
        from polyprof.fileio import atomic_writer

        device_name = self._use_device or "cuda"
        parts = []
        next_id = 0
        for evt in self:
            if evt.trace_name is None:
                continue
            thread = evt.thread if not evt.is_remote else f'" node_id:{evt.node_id}, thread_id:{evt.thread} "'
            parts.append(
                f'{{"name": "{evt.trace_name}", "ph": "X", "ts": {evt.time_range.start}, '
                f'"dur": {evt.time_range.elapsed_us()}, "tid": {thread}, "pid": "CPU functions", '
                '"args": {}}'
            )
            for _ in evt.kernels:
                parts.append(
                    f'{{"name": "{evt.trace_name}", "ph": "s", "ts": {evt.time_range.start}, '
                    f'"tid": {evt.thread}, '
                    f'"pid": "CPU functions", "id": {next_id}, "cat": "cpu_to_{device_name}", "args": {{}}}}'
                )
                next_id += 1
        with atomic_writer(path) as f:
            f.write("[" + ", ".join(parts) + "]")
        return os.fspath(path)


# ------------------------------------------------------------ ProfileResults


@attrs.define(eq=False)
class ProfileResults:
    """What a profiler holds after recording: its traces and how to read them.

    With several traces (``acc_events``) ``events()`` lists the newest cycle
    first, each cycle's events in torch's order, as torch does. Every list of
    its events (``events()``, ``event_list(rows)``, their slices) shares one set
    of views, and averages by key through the session's ``key_averages``
    aggregator (``_average_by_key``).
    """

    traces: tuple[Trace, ...] = attrs.field(converter=tuple)
    use_device: str | None = None
    #: The session's aggregators by name; the one named ``key_averages`` answers every
    #: ``key_averages()`` of these results (``polyprof.averages.summarize`` when there is none).
    aggregators: Mapping[str, Aggregator] | None = None
    _events: EventList | None = attrs.field(default=None, init=False)
    _tree: EventTree | None = attrs.field(default=None, init=False)
    _store: _EventStore | None = attrs.field(default=None, init=False)
    _merged: MergedTrace | None = attrs.field(default=None, init=False)
    # One tree and one store per results, even when two threads ask first.
    _lock: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.traces:
            raise ValueError("ProfileResults needs at least one trace")

    @property
    def _config(self) -> Any:
        return self.traces[-1].config

    def tree(self) -> EventTree:
        """All events as one ``EventTree`` (newest cycle first), built once."""
        with self._lock:
            if self._tree is None:
                trees = [tree_for(t, self.use_device) for t in reversed(self.traces)]
                self._tree = EventTree.concat(trees)
            return self._tree

    def _event_store(self) -> _EventStore:
        with self._lock:
            if self._store is None:
                self._store = _EventStore(self.tree(), results=self)
            return self._store

    def event_list(self, rows: np.ndarray | None = None) -> EventList:
        """A new ``EventList`` of ``rows`` of ``tree()`` (all, in tree order), sharing ``events()``'s views."""
        return EventList._of_store(
            self._event_store(),
            rows,
            profile_memory=self._config.profile_memory,
            with_flops=self._config.with_flops,
        )

    def events(self) -> EventList:
        """torch's ``prof.events()``: the same ``EventList`` object on every call."""
        if self._events is None:
            self._events = self.event_list()
        return self._events

    def merged_trace(self) -> Trace:
        """One trace holding every cycle's events (the trace itself when there is one).

        With several cycles it is a ``polyprof.tree.MergedTrace``, whose tree
        (``polyprof.tree.tree_for``) is the concatenation of the cycles' trees,
        as ``tree()`` is: exporters see torch's numbers.
        """
        if len(self.traces) == 1:
            return self.traces[0]
        if self._merged is None:
            newest_first = tuple(reversed(self.traces))
            last = self.traces[-1]
            self._merged = MergedTrace(
                events=concat([t.events for t in newest_first], source="merged"),
                config=last.config,
                start_ns=min(t.start_ns for t in self.traces),
                end_ns=max(t.end_ns for t in self.traces),
                pid=last.pid,
                hostname=last.hostname,
                trace_id=last.trace_id,
                metadata_json=dict(last.metadata_json),
                device_properties=last.device_properties,
                notes=tuple(note for t in self.traces for note in t.notes),
                cycles=newest_first,
            )
        return self._merged

    def key_averages(
        self,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
        include_python_functions: bool | None = None,
    ) -> EventList:
        """torch's ``prof.key_averages()``: every event averaged by key, through the one route.

        :param include_python_functions: None: the installed torch's default (python_function
            events are left out from torch 2.14, kept before).
        :raises ValueError: ``group_by_stack_n`` is not an int >= 0.
        :raises TypeError: the session's ``key_averages`` aggregator returned something unusable.
        """
        _check_stack_n(group_by_stack_n)
        store = self._event_store()
        return _average_by_key(
            store,
            np.arange(len(store.tree), dtype=np.int64),
            group_by_input_shape=group_by_input_shape,
            group_by_stack_n=group_by_stack_n,
            group_by_overload_name=group_by_overload_name,
            include_python_functions=include_python_functions,
            profile_memory=self._config.profile_memory,
            with_flops=self._config.with_flops,
        )

    def total_average(self) -> FunctionEventAvg:
        """Every event summed into one ``FunctionEventAvg`` keyed ``"Total"``."""
        return self.events().total_average()

    @property
    def self_cpu_time_total(self) -> float:
        """The sum of the events' self CPU time (µs)."""
        return self.events().self_cpu_time_total
