"""Columnar event batches: the unit that travels from tracers over the bus.

An ``EventBatch`` holds one numpy array per field and never one Python object
per event. Fields whose values are strings or structures (names, shapes,
stacks, trace args) are stored as ``int32`` indices into a per-batch table of
unique values (interning): ``batch.tables["name"][batch.columns["name"][i]]``.
Index ``-1`` means "no value" (the empty string, empty list or no args).

Every timestamp is Unix-epoch nanoseconds; each tracer converts its own clock.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np


class EventKind(enum.IntEnum):
    """What an event is. The Chrome trace category follows from it."""

    CPU_OP = 0
    USER_ANNOTATION = 1
    PYTHON_FUNCTION = 2
    MEMORY = 3
    OUT_OF_MEMORY = 4
    KERNEL = 10
    GPU_MEMCPY = 11
    GPU_MEMSET = 12
    GPU_USER_ANNOTATION = 13
    RUNTIME = 20
    DRIVER = 21
    OVERHEAD = 22
    SYNC = 23
    #: A sampled value (a GPU's utilization, power, ...), not an op: drawn as a Chrome counter
    #: track (``"ph": "C"``); ``counter_series`` names the series, ``counter_value`` holds the
    #: value. Counter rows are always ``trace_only``: ``events()`` and tables never list them.
    COUNTER = 30


#: Host-side calls into a device runtime or driver: the calls that launch device work.
API_CALL_KINDS = frozenset({EventKind.RUNTIME, EventKind.DRIVER})
#: Kinds recorded on the host (pid = OS process, tid = OS thread); the others happen on a device.
HOST_KINDS = frozenset(
    {
        EventKind.CPU_OP,
        EventKind.USER_ANNOTATION,
        EventKind.PYTHON_FUNCTION,
        EventKind.MEMORY,
        EventKind.OUT_OF_MEMORY,
        *API_CALL_KINDS,
    }
)


def kind_codes(kinds: Iterable[EventKind]) -> np.ndarray:
    """``kinds`` as an array of ``kind`` column values, for ``np.isin``."""
    return np.array(sorted(int(k) for k in kinds), dtype=np.int8)


#: torch's ``DeviceType`` integer values, for the ``device_type`` column. What each accelerator's
#: type means (its activity, Kineto's names for it, ...) is its row of ``polyprof.base.activity.DEVICES``.
class DeviceType(enum.IntEnum):
    CPU = 0
    CUDA = 1
    MKLDNN = 2
    IDEEP = 5
    HIP = 6
    XPU = 12
    HPU = 15
    MTIA = 19
    PrivateUse1 = 20


@attrs.frozen
class Field:
    """One column of the schema."""

    dtype: str
    #: Value used when a batch does not carry this column.
    default: Any
    #: True for columns that index into ``EventBatch.tables[name]``.
    interned: bool = False
    doc: str = ""


#: The schema. Tracers fill what they know; missing columns read as the default.
FIELDS: dict[str, Field] = {
    "kind": Field("int8", int(EventKind.CPU_OP), doc="EventKind"),
    "name": Field("int32", -1, True, "event name (interned str)"),
    "start_ns": Field("int64", 0, doc="start, Unix-epoch ns"),
    "dur_ns": Field("int64", 0, doc="duration in ns (0 for instants)"),
    "pid": Field("int64", 0, doc="OS process id (CPU) or device index (device events)"),
    "tid": Field("int64", 0, doc="OS thread id (CPU) or stream/queue id (device events)"),
    "thread": Field("int64", 0, doc="torch's small sequential thread id (FunctionEvent.thread)"),
    "is_async": Field("bool", False, doc="started and ended on different threads"),
    "device_type": Field("int8", int(DeviceType.CPU), doc="torch DeviceType value"),
    "device_index": Field("int32", 0, doc="device ordinal; -1 for CPU memory events"),
    "correlation_id": Field("int64", 0, doc="this event's id (FunctionEvent.id for CPU ops)"),
    "linked_correlation_id": Field(
        "int64", 0, doc="for device activity and runtime calls: the launching CPU op's correlation id"
    ),
    "external_id": Field("int64", 0, doc="Kineto 'External id'"),
    "sequence_nr": Field("int64", -1, doc="autograd sequence number; -1 when none"),
    "fwd_thread": Field("int64", 0, doc="forward thread id of a backward op"),
    "scope": Field("int8", 0, doc="torch RecordScope (1 = backward, 7 = user scope)"),
    "flops": Field("int64", 0, doc="estimated FLOPs (with_flops)"),
    "nbytes": Field("int64", 0, doc="memory events: bytes (negative = free); copies: bytes moved"),
    "total_allocated": Field("int64", 0, doc="memory events: allocator total after the event"),
    "total_reserved": Field("int64", 0, doc="memory events: allocator reserved after the event"),
    "addr": Field("int64", 0, doc="memory events: address"),
    "flow_id": Field("int64", 0, doc="Chrome flow id (0 = none)"),
    "flow_type": Field("int8", 0, doc="1 = fwdbwd, 2 = ac2g"),
    "flow_start": Field("bool", False, doc="this event starts its flow"),
    "trace_only": Field(
        "bool",
        False,
        doc="in the trace only, not in events() or tables (torch < 2.12 lists no python_function events)",
    ),
    "python_id": Field("int64", -1, doc="python_function events: id"),
    "python_parent_id": Field("int64", -1, doc="python_function events: parent id"),
    "stream": Field("int64", -1, doc="device events: stream or queue id"),
    "overload": Field("int32", -1, True, "operator overload name (interned str)"),
    "shapes": Field("int32", -1, True, "input shapes (interned tuple of tuples of ints)"),
    "stack": Field("int32", -1, True, "Python stack, innermost frame first (interned tuple of str)"),
    "module": Field("int32", -1, True, "module hierarchy (interned str)"),
    "args": Field(
        "int32",
        -1,
        True,
        "extra Chrome trace args (interned): a mapping of str to JSON values, or Kineto's own text "
        "as polyprof.base.kineto_format.KinetoArgsText (see that module)",
    ),
    # torch's _KinetoEvent values that only FunctionEvent attributes read (intern_structured_column)
    "concrete_inputs": Field("int32", -1, True, "scalar input values (interned list; record_shapes)"),
    "kwinputs": Field("int32", -1, True, "keyword inputs (interned dict; record_shapes)"),
    "input_dtypes": Field("int32", -1, True, "input dtype names (interned list of str; record_shapes)"),
    "structured_input_shapes": Field("int32", -1, True, "input shapes, TensorLists nested (interned list)"),
    "structured_input_strides": Field("int32", -1, True, "input strides, TensorLists nested (interned list)"),
    "metadata_json": Field("int32", -1, True, "Kineto's metadata text of the event (interned str)"),
    "extra_meta": Field("int32", -1, True, "Kineto's metadata as str -> str (interned dict)"),
    "typed_metadata": Field("int32", -1, True, "Kineto's typed metadata (interned dict)"),
    "activity_type": Field("int32", -1, True, "Kineto's activity type name, e.g. 'cpu_op' (interned str)"),
    "python_module_id": Field("int64", -1, doc="python_function events: nn.Module id, else -1"),
    "counter_value": Field("float64", 0.0, doc="counter rows: the sampled value"),
    "counter_series": Field(
        "int32", -1, True, "counter rows: the series, the key of the Chrome counter's args (interned str)"
    ),
}

REQUIRED_FIELDS = ("kind", "name", "start_ns", "dur_ns")


class Interner(dict):
    """Value -> index, in order of first appearance: the one interner of polyprof.

    ``interner[value]`` gives the value's index, adding it when new;
    ``map(interner.__getitem__, values)`` interns a stream at C speed (a
    dict lookup per known value, ``__missing__`` only for new ones), so
    ``np.fromiter`` over it builds a column without a Python loop. Values must
    be hashable; ``intern_structured_column`` takes the others.
    """

    __slots__ = ()

    def __missing__(self, value: Any) -> int:
        index = self[value] = len(self)
        return index

    def table(self) -> tuple:
        """The values, each once, in index order."""
        return tuple(self)


def intern_column(values: Iterable[Any], *, empty: Any = None, count: int = -1) -> tuple[np.ndarray, tuple]:
    """Intern a stream of hashable values: returns ``(indices, table)``.

    Values equal to ``empty`` get index -1 and stay out of the table. Runs at
    C speed (``Interner``); ``count``, the number of values when known, saves
    the array's regrowth.
    """
    interner = Interner()
    indices = np.fromiter(map(interner.__getitem__, values), dtype=np.int32, count=count)
    empty_index = interner.pop(empty, None)
    if empty_index is None:
        return indices, interner.table()
    # Drop the empty value from the table: its rows read -1, later indices move down one.
    indices = np.where(indices == empty_index, -1, indices - (indices > empty_index)).astype(np.int32)
    return indices, interner.table()


def intern_structured_column(values: Iterable[Any]) -> tuple[np.ndarray, tuple]:
    """Intern values that may be unhashable (lists, dicts): returns ``(indices, table)``.

    Values are told apart by their ``repr``, which keeps ``1``, ``1.0`` and
    ``True`` apart where equality would merge them. Empty values (``[]``,
    ``{}``, ``""``, None) get index -1. The table holds the first value seen
    of each kind; readers copy it before handing it out.
    """
    interner = Interner()
    table: list[Any] = []
    indices: list[int] = []
    append = indices.append
    for value in values:
        if not value:
            append(-1)
            continue
        idx = interner[repr(value)]
        if idx == len(table):
            table.append(value)
        append(idx)
    return np.asarray(indices, dtype=np.int32), tuple(table)


def _as_column(name: str, values: Any, n: int) -> np.ndarray:
    spec = FIELDS[name]
    arr = np.asarray(values, dtype=spec.dtype)
    if arr.shape != (n,):
        raise ValueError(f"column {name!r} has shape {arr.shape}, expected ({n},)")
    arr.setflags(write=False)
    return arr


#: Produces a column on first use: returns the array, and for interned fields its table.
ColumnProvider = Callable[[], "tuple[np.ndarray, tuple | None]"]


@attrs.frozen(eq=False)
class EventBatch:
    """A batch of events from one tracer, one array per field.

    Build with ``EventBatch.build``; read with ``batch[field]`` (defaults filled
    in for absent columns) and ``batch.values(field)`` for interned fields.

    A tracer may leave columns that only some consumers need (trace args,
    flow ids) as *deferred* columns: a provider decodes them on first read,
    once, so a table can be printed before those are ever decoded.
    """

    #: Name of the tracer that produced the batch.
    source: str
    #: Field name -> read-only numpy array, all of the same length.
    columns: Mapping[str, np.ndarray]
    #: Interned field name -> tuple of unique values.
    tables: Mapping[str, tuple]
    #: Field name -> provider of a column decoded on first read.
    deferred: Mapping[str, ColumnProvider] = attrs.field(factory=dict)
    _resolved: dict = attrs.field(factory=dict, init=False, repr=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    @classmethod
    def build(
        cls,
        source: str,
        columns: Mapping[str, Any],
        tables: Mapping[str, Sequence[Any]] | None = None,
        deferred: Mapping[str, ColumnProvider] | None = None,
    ) -> EventBatch:
        """Validate and freeze columns. Unknown fields are an error."""
        missing = [f for f in REQUIRED_FIELDS if f not in columns]
        if missing:
            raise ValueError(f"EventBatch from {source!r} lacks required columns {missing}")
        unknown = sorted((set(columns) | set(deferred or {})) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown event fields {unknown}; valid fields: {sorted(FIELDS)}")
        n = len(np.asarray(columns["kind"]))
        frozen = {name: _as_column(name, values, n) for name, values in columns.items()}
        frozen_tables = {k: tuple(v) for k, v in (tables or {}).items()}
        for name, arr in frozen.items():
            if FIELDS[name].interned:
                _check_indices(name, arr, len(frozen_tables.setdefault(name, ())))
        lazy = {k: v for k, v in (deferred or {}).items() if k not in frozen}
        return cls(source=source, columns=frozen, tables=frozen_tables, deferred=lazy)

    @classmethod
    def empty(cls, source: str = "") -> EventBatch:
        return cls.build(source, {f: () for f in REQUIRED_FIELDS})

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def _resolve(self, field: str) -> tuple[np.ndarray, tuple | None]:
        with self._lock:
            done = self._resolved.get(field)
            if done is None:
                arr, table = self.deferred[field]()
                arr = _as_column(field, arr, len(self))
                table = tuple(table) if table is not None else None
                if FIELDS[field].interned:
                    table = table or ()
                    _check_indices(field, arr, len(table))
                done = self._resolved[field] = (arr, table)
            return done

    def __getitem__(self, field: str) -> np.ndarray:
        """The column ``field``, or a column of its default when absent."""
        arr = self.columns.get(field)
        if arr is not None:
            return arr
        if field in self.deferred:
            return self._resolve(field)[0]
        spec = FIELDS[field]  # KeyError names the unknown field
        return np.full(len(self), spec.default, dtype=spec.dtype)

    def has(self, field: str) -> bool:
        return field in self.columns or field in self.deferred

    @property
    def fields(self) -> list[str]:
        """Fields this batch carries (decoded or deferred)."""
        return sorted(set(self.columns) | set(self.deferred))

    def table(self, field: str) -> tuple:
        if field not in self.tables and field in self.deferred:
            return self._resolve(field)[1] or ()
        return self.tables.get(field, ())

    def values(self, field: str, empty: Any = None) -> list[Any]:
        """Decode an interned column to Python values (``empty`` for -1).

        One Python object per event: for tests, exporters and small subsets.
        """
        lookup = [*self.table(field), empty]  # index -1 reads the last slot
        return [lookup[i] for i in self[field].tolist()]

    def materialized(self) -> EventBatch:
        """The same batch with every deferred column decoded."""
        if not self.deferred:
            return self
        cols = dict(self.columns)
        tables = dict(self.tables)
        for field in self.deferred:
            cols[field] = self[field]
            if FIELDS[field].interned:
                tables[field] = self.table(field)
        return EventBatch.build(self.source, cols, tables)

    def take(self, indices: np.ndarray) -> EventBatch:
        """A batch of the rows at ``indices`` (or a boolean mask), tables shared."""
        full = self.materialized()
        cols = {name: arr[indices] for name, arr in full.columns.items()}
        return EventBatch.build(self.source, cols, full.tables)


def _check_indices(name: str, arr: np.ndarray, size: int) -> None:
    if len(arr) and (arr.max(initial=-1) >= size or arr.min(initial=-1) < -1):
        raise ValueError(f"column {name!r} indexes outside its table of {size} values")


def concat(batches: Sequence[EventBatch], source: str = "") -> EventBatch:
    """Concatenate batches, merging their interned tables (vectorized remap).

    Columns deferred in any input stay deferred in the result.
    """
    batches = [b for b in batches if len(b)]
    if not batches:
        return EventBatch.empty(source)
    if len(batches) == 1 and not source:
        return batches[0]
    decoded = sorted({f for b in batches for f in b.columns if not any(f in o.deferred for o in batches)})
    lazy = sorted({f for b in batches for f in b.fields} - set(decoded))
    columns: dict[str, np.ndarray] = {}
    tables: dict[str, tuple] = {}
    for field in decoded:
        columns[field], table = _concat_field(batches, field)
        if table is not None:
            tables[field] = table
    deferred = {field: _deferred_concat(batches, field) for field in lazy}
    return EventBatch.build(source or batches[0].source, columns, tables, deferred)


def _deferred_concat(batches: Sequence[EventBatch], field: str) -> ColumnProvider:
    return lambda: _concat_field(batches, field)


def _concat_field(batches: Sequence[EventBatch], field: str) -> tuple[np.ndarray, tuple | None]:
    if not FIELDS[field].interned:
        return np.concatenate([b[field] for b in batches]), None
    interner = Interner()
    merged: list[Any] = []
    parts = []
    for batch in batches:
        source_table = batch.table(field)
        remap = np.empty(len(source_table) + 1, dtype=np.int32)
        remap[-1] = -1  # "no value" stays -1
        for i, value in enumerate(source_table):
            idx = remap[i] = interner[_merge_key(value)]
            if idx == len(merged):
                merged.append(value)
        parts.append(remap[batch[field]])
    return np.concatenate(parts), tuple(merged)


#: Tags the ``repr`` key of an unhashable table value, so it never equals a hashable value.
_UNHASHABLE = object()


def _merge_key(value: Any) -> Any:
    """``value`` where hashable; else its ``repr`` (as ``intern_structured_column`` tells them apart)."""
    try:
        hash(value)
    except TypeError:
        return (_UNHASHABLE, repr(value))
    return value
