"""torch's ``FunctionEvent`` and ``FunctionEventAvg``, as views over the rows of an ``EventTree``.

They carry the installed torch's attribute names and behaviour
(``polyprof.analysis.torch_event_surface``: an attribute that release lacks does not
exist here either, and where torch warns on reading one, so does polyprof), so
code written for ``prof.events()`` / ``prof.key_averages()`` runs unchanged.
How they are made:

* ``FunctionEvent`` is a *view* of one row of an ``EventTree`` (the columnar
  result of ``polyprof.analysis.tree``), held by an ``EventStore``: made when asked
  for, then kept, so ``evt.cpu_parent is parent`` holds and a 200k-event list
  costs nothing until it is iterated. Its attributes are read-only, except the
  three that torch's table code writes (``self_cpu_percent``,
  ``total_cpu_percent``, ``total_device_percent``) and what torch's
  ``append_kernel``, ``append_cpu_child`` and ``set_cpu_parent`` change (the
  event's own times follow; its parents' precomputed totals do not). torch's
  per-argument details (``concrete_inputs``, ``kwinputs``, ``input_dtypes``,
  ``structured_input_*``) and Kineto's metadata are the values the tracer
  decoded from torch's ``_KinetoEvent``; lists and dicts are copied on each
  read, as each torch event has its own.
* ``FunctionEventAvg`` is a plain mutable object, as in torch; the ones from
  ``key_averages`` are built from a columnar ``KeyAveragesSummary``
  (``polyprof.analysis.event_list.average_by_key``), their descriptive fields read from
  a tree row (``average_of_row``).
"""

from __future__ import annotations

import copy
import threading
import warnings
from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from polyprof.analysis.table import format_time
from polyprof.analysis.torch_event_surface import (
    device_type_member,
    missing_attribute_error,
    torch_event_surface,
)
from polyprof.analysis.tree import LAZY_COLUMNS, EventTree
from polyprof.base.events import FIELDS, DeviceType, EventKind
from polyprof.base.kineto_format import DEVICE_BY_PREFIX, category_of

if TYPE_CHECKING:
    from polyprof.base.trace import Trace

__all__ = [
    "AVERAGE_ATTRIBUTES",
    "AVERAGE_SUMS",
    "FLOAT_SUMS",
    "INT_ZERO_WHERE",
    "EventStore",
    "FormattedTimesMixin",
    "FunctionEvent",
    "FunctionEventAvg",
    "Interval",
    "Kernel",
    "RecordingResults",
    "average_of_row",
]

Kernel = namedtuple("Kernel", ["name", "device", "duration"])


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`{old}` is deprecated. Use `{new}` instead.", FutureWarning, stacklevel=3)


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


class RecordingResults(Protocol):
    """What the lists of an ``EventStore``'s views read of the recording its tree belongs to.

    ``polyprof.analysis.results.ProfileResults`` is one; ``polyprof.analysis.event_list.average_by_key``
    asks its ``key_averages`` aggregator.
    """

    # Any, not Aggregator: polyprof.analysis.averages types Aggregator on this module's FunctionEventAvg,
    # so naming it here would tie the two modules in a circle.
    @property
    def aggregators(self) -> Mapping[str, Any] | None:
        """The session's aggregators (``polyprof.analysis.averages.Aggregator``) by name, or None."""
        ...

    def merged_trace(self) -> Trace:
        """One trace holding every cycle's events (what an aggregator is given)."""
        ...


class EventStore:
    """One tree, its columns as Python lists, and the ``FunctionEvent`` views made of it.

    A view reads ``values(name)[row]``: each column becomes a list once, on
    first use, so reading an attribute of every event costs a list index, not
    a numpy scalar conversion. Each row's view is made once, so identity holds
    among the lists that share the store. ``results`` is the recording the tree
    belongs to (None for a tree given by hand): its aggregators answer
    ``key_averages`` for every list of these views.
    """

    def __init__(self, tree: EventTree, results: RecordingResults | None = None) -> None:
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
        zero = INT_ZERO_WHERE.get(name)
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


#: Batch field (polyprof.base.events.FIELDS) -> how torch fills the ``FunctionEvent`` attribute from it.
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


def _derived_activity_types(tree: EventTree) -> list[Any]:
    """Kineto's activity type of each row, from its kind, for batches that did not record one.

    Runtime, driver and sync calls take the category of the tree's device
    (``cuda_runtime``, ``xpu_sync``; ``privateuse1_*`` for a device Kineto has
    no prefix for), as ``polyprof.base.kineto_format`` spells them.
    """
    device = DEVICE_BY_PREFIX.get(tree.use_device or "", DeviceType.PrivateUse1)
    by_kind = {kind: category_of(kind, device) for kind in EventKind}
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
FLOAT_SUMS = ("cpu_time_total", "self_cpu_time_total", "device_time_total", "self_device_time_total")

#: Rows where torch's property returns the int 0.
INT_ZERO_WHERE = {
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
            raise missing_attribute_error(self, name)
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

    def __init__(self, store: EventStore, row: int) -> None:
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
        return device_type_member(self._store.values("device_type")[self._row])

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
        if self.device_type != device_type_member(int(DeviceType.CPU)):
            raise AssertionError(f"Expected device_type to be CPU to {what}, got {self.device_type}")
        if other is not None:
            if not isinstance(other, FunctionEvent):
                raise AssertionError(f"Expected a FunctionEvent to {what}, got {type(other).__name__}")
            if other.device_type != device_type_member(int(DeviceType.CPU)):
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
AVERAGE_SUMS = (
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
#: What ``FunctionEventAvg.add`` reads of a row: its key, its sums and its FLOPs.
AVERAGE_ATTRIBUTES = ("key", *AVERAGE_SUMS, "flops")


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
        self._first: tuple[EventStore, int] | None = None
        self.device_type: Any = device_type_member(int(DeviceType.CPU))
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

    def add(self, other: FunctionEvent | FunctionEventAvg) -> FunctionEventAvg:
        """Add one ``FunctionEvent`` (or ``FunctionEventAvg``) with the same key."""
        missing = [name for name in AVERAGE_ATTRIBUTES if not hasattr(other, name)]
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
        for name in AVERAGE_SUMS:
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


def average_of_row(store: EventStore, row: int) -> FunctionEventAvg:
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
    avg.device_type = device_type_member(int(tree.device_type[row]))
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
