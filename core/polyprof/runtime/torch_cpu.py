"""The CPU tracer: torch's own C++ collector, read straight from its raw result.

torch's Python post-processing (``_parse_kineto_results``, ``FunctionEvent``)
costs 75-120 µs per event; reading the raw ``_ProfilerResult.events()``
accessors costs a few µs per event. This plugin drives
``_prepare_profiler`` / ``_enable_profiler`` / ``_disable_profiler`` directly
and decodes the result into one columnar ``EventBatch`` on the bus thread.

The module imports without torch; the plugin then reports itself unavailable.
"""

from __future__ import annotations

import abc
import copy
import enum
import functools
import gc
import os
import sys
import threading
import time
import warnings
import weakref
from collections import defaultdict
from types import FrameType
from typing import Any

import numpy as np

from polyprof.base import torch_support
from polyprof.base._memory import release_free_heap_in_background
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import PolyprofError
from polyprof.base.events import (
    EventBatch,
    EventKind,
    Interner,
    concat,
    intern_column,
    intern_structured_column,
)
from polyprof.base.kineto_format import (
    FLOW_TYPE_BY_CATEGORY,
    HOST_CATEGORIES,
    MEMORY_EVENT_NAME,
    OUT_OF_MEMORY_EVENT_NAME,
    Arg,
    KinetoArgsText,
    kineto_args_column,
)
from polyprof.base.log import get_logger
from polyprof.base.user_warnings import ProfilerStoppedOutsideWarning, user_stacklevel
from polyprof.hooks.components import Capabilities, TraceMetadata, Tracer
from polyprof.hooks.hookspecs import hookimpl
from polyprof.hooks.plugin_calls import PluginFailureWarning
from polyprof.native import native_reader
from polyprof.runtime import own_frames
from polyprof.runtime.memory_timeline import keeps_memory_profile
from polyprof.runtime.result_rows import UNDECODABLE_NAME, ResultRows, safe_text
from polyprof.runtime.result_rows import accessor as _accessor
from polyprof.runtime.torch_result import (
    CollectorResult,
    DeviceRowClaims,
    TorchCollectorOwner,
    TorchResultTracer,
)

log = get_logger(__name__)

SOURCE = "torch_cpu"


def torch_unavailable_reason() -> str | None:
    """None when torch's profiler can be driven here, else why not (names the version and the range)."""
    reason = torch_support.unsupported_reason()
    if reason is not None:
        return reason
    try:
        from torch._C._autograd import _disable_profiler, _enable_profiler, _prepare_profiler  # noqa: F401
        from torch._C._profiler import ProfilerConfig, ProfilerState  # noqa: F401
    except ImportError as exc:
        return f"torch {torch_support.installed().version_text} lacks its profiler ({exc})"
    return None


def _shapes_key(shapes: list) -> tuple:
    return tuple(tuple(s) if isinstance(s, list) else s for s in shapes)


def _trace_args_column(rows: ResultRows) -> tuple[np.ndarray, tuple]:
    """The ``args`` column: Kineto's own args of each event (what its JSON writer prints).

    Where torch has ``trace_activities()`` (2.13+) they are its activities'
    ``metadata_json()`` texts, kept as ``KinetoArgsText`` (checked once,
    written as torch writes them); older torch has no accessor for them, so
    its own writer (``result.save``) writes the trace once and the args are
    read back from that file as mappings (``_saved_trace_columns``). Either
    way they are matched to the rows by (name as Kineto writes it, start
    ns), ties in order of appearance.
    """
    result = rows.result
    if "trace_activities" not in torch_support.installed().result_methods:
        return intern_structured_column(_saved_trace_rows(rows).args())
    pending: dict[int, list[tuple[str, str]]] = defaultdict(list)
    try:
        for act in result.trace_activities():
            pending[act.timestamp()].append((_safe_name(act), act.metadata_json()))
    except UnicodeDecodeError as exc:
        # torch read a frame name from freed memory into an event's args: pybind cannot hand the
        # fragment over, so read them all from torch's own writer, whose bytes are replaced.
        log.warning("undecodable_trace_args", reason=str(exc))
        warnings.warn(
            "polyprof: torch's result holds args that are not valid UTF-8 (a torch bug: Python frame "
            "names read from freed memory); the trace takes them from torch's own writer, with the "
            "invalid bytes replaced by U+FFFD",
            RuntimeWarning,
            stacklevel=2,
        )
        return intern_structured_column(_saved_trace_rows(rows).args())
    for queue in pending.values():
        queue.reverse()  # popped from the end: first in the list, first matched
    texts = (
        _pop_match(waiting, name)[1] if (waiting := pending.get(start)) else None
        for name, start in zip(_kineto_names(rows), rows.column("start_ns", "int64").tolist(), strict=True)
    )
    return kineto_args_column(texts, rows.count)


def _saved_trace_columns(
    rows: ResultRows, *, with_args: bool, saved: SavedKinetoTrace | None = None
) -> dict[str, tuple]:
    """The flow columns (and the args, ``with_args``) of ``events``, from torch's own writer.

    For torch without the ``flow_*`` accessors (before 2.13): its writer still
    draws the fwdbwd flows, so one ``result.save`` gives both flows and args
    (torch writes a result once). ``saved``: that file, where it was read already.
    """
    matched = saved.rows_for(rows) if saved is not None else _saved_trace_rows(rows)
    columns: dict[str, tuple] = {
        field: (np.asarray(values, dtype=dtype), None)
        for (field, dtype), values in zip(
            (("flow_id", "int64"), ("flow_type", "int8"), ("flow_start", "bool")),
            matched.flows(),
            strict=True,
        )
    }
    if with_args:
        columns["args"] = intern_structured_column(matched.args())
    return columns


def _kineto_names(rows: ResultRows) -> list[str]:
    """Names as Kineto writes them: ``aten::add.Tensor`` where torch recorded an overload name."""
    name_idx, table, _ = rows.names()
    # torch 2.7 records overload names but its writer leaves them out of names; 2.8+ writes them.
    features = torch_support.installed()
    if rows.count and features.at_least(2, 8) and rows.has_accessor("overload_name"):
        overload_idx, overloads, _ = rows.names("overload_name", empty="")
        if len(overloads):
            pairs = Interner()
            pair_idx = np.fromiter(
                map(pairs.__getitem__, zip(name_idx.tolist(), overload_idx.tolist())),
                dtype=np.int64,
                count=rows.count,
            )
            written = [f"{table[n]}.{overloads[o]}" if o >= 0 else table[n] for n, o in pairs.table()]
            return [written[i] for i in pair_idx.tolist()]
    return [table[i] for i in name_idx.tolist()]


def _pop_match(queue: list[tuple[str, Any]], name: str) -> tuple[str, Any] | tuple[None, None]:
    """The first entry named ``name`` (the queue is reversed), removed; ``(None, None)`` if none.

    A lone entry with another name is the same event under a name Kineto
    rewrote (it replaces backslashes and drops newlines in older releases).
    """
    for i in range(len(queue) - 1, -1, -1):
        if queue[i][0] == name:
            return queue.pop(i)
    if len(queue) == 1:
        return queue.pop()
    return None, None


class _SavedRows:
    """Per event of ``events()``: the matching event of torch's saved trace (or None) and its flow."""

    def __init__(self, rows: list[dict[str, Any] | None], flows: dict[int, tuple[int, int, bool]]) -> None:
        self._rows = rows
        self._flows = flows  # id(saved event) -> (flow id, flow type, starts here)

    def args(self) -> list[dict[str, Any] | None]:
        """Each event's args without the ``"External id"`` the writer puts first (the exporter
        adds it back from the correlation id)."""
        args: list[dict[str, Any] | None] = []
        for row in self._rows:
            if row is None:
                args.append(None)
                continue
            kept = dict(row["args"])
            kept.pop(Arg.EXTERNAL_ID, None)
            args.append(kept)
        return args

    def flows(self) -> tuple[list[int], list[int], list[bool]]:
        none = (0, 0, False)
        found = [self._flows.get(id(row), none) if row is not None else none for row in self._rows]
        return [f[0] for f in found], [f[1] for f in found], [f[2] for f in found]


def _saved_trace_rows(rows: ResultRows) -> _SavedRows:
    """Match ``rows`` to the host events of the trace torch's own writer writes for their result."""
    saved = SavedKinetoTrace.read(rows.result)
    return saved.rows_for(rows) if saved is not None else _SavedRows([None] * rows.count, {})


class SavedKinetoTrace:
    """The host events of the trace torch's own writer writes for a result, read once.

    torch writes a result only once, so everything polyprof takes from that
    file (args and flows before 2.13, python_function events before 2.12) is
    taken from one read. A file torch wrote as invalid JSON (unescaped quotes
    in names, before 2.15) or a result torch already wrote gives ``None`` from
    ``read``, with the reason logged: the exporter then writes the standard
    args from the columns and no flows.
    """

    def __init__(
        self, host: list[dict[str, Any]], starts: list[int], flows: dict[int, tuple[int, int, bool]]
    ) -> None:
        self.host = host  # cpu_op, user_annotation, python_function and instant events, in file order
        self.starts = starts  # their start, Unix-epoch ns
        self.flows = flows  # id(host event) -> (flow id, flow type, starts here)

    @classmethod
    def read(cls, result: Any) -> SavedKinetoTrace | None:
        import tempfile

        import orjson

        from polyprof.base.kineto_format import us_to_ns

        fd, path = tempfile.mkstemp(prefix="polyprof-kineto-", suffix=".json")
        os.close(fd)
        try:
            try:
                result.save(path)
            except RuntimeError as exc:  # "Trace is already saved."
                log.warning("kineto_trace_unavailable", reason=f"torch could not write this result: {exc}")
                return None
            with open(path, "rb") as file:
                raw = file.read()
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            text = raw.decode()
        except UnicodeDecodeError:  # names torch read from freed memory: replaced, as the decoder does
            text = raw.decode(errors="replace")
            log.warning("kineto_trace_undecodable_bytes_replaced")
        del raw
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            log.warning("kineto_trace_unavailable", reason=f"torch wrote invalid JSON: {exc}")
            return None
        del text
        host: list[dict[str, Any]] = []
        flows: dict[int, tuple[int, int, bool]] = {}
        last: dict[str, Any] | None = None
        for ev in doc.get("traceEvents", ()):
            ph = ev.get("ph")
            if ph in ("s", "f"):  # Kineto writes a flow right after the slice it binds to
                flow_type = FLOW_TYPE_BY_CATEGORY.get(ev.get("cat", ""))
                if last is not None and flow_type is not None:
                    flows[id(last)] = (int(ev.get("id", 0)), flow_type, ph == "s")
                continue
            last = None
            if ev.get("cat") in HOST_CATEGORIES and isinstance(ev.get("args"), dict):
                host.append(ev)
                last = ev
        base = int(doc.get("baseTimeNanoseconds", 0))
        starts = (us_to_ns([ev.get("ts", 0) for ev in host]) + base).tolist() if host else []
        return cls(host, starts, flows)

    def rows_for(self, rows: ResultRows) -> _SavedRows:
        """The saved event of each of ``rows`` (by name as Kineto writes it and start; ties in order)."""
        pending: dict[int, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        for ev, start in zip(self.host, self.starts, strict=True):
            pending[start].append((str(ev.get("name", "")), ev))
        for queue in pending.values():
            queue.reverse()  # popped from the end: first in the file, first matched
        matched = [
            _pop_match(waiting, name)[1] if (waiting := pending.get(start)) else None
            for name, start in zip(
                _kineto_names(rows), rows.column("start_ns", "int64").tolist(), strict=True
            )
        ]
        return _SavedRows(matched, self.flows)

    def python_function_batch(self) -> EventBatch:
        """The python_function events of the file, as trace-only rows.

        torch before 2.12 writes its Python tracer's frames into the trace but
        lists none of them in ``events()``: polyprof's trace takes them from
        here, and ``events()`` / tables leave them out (the ``trace_only``
        column), as torch's do. pid and tid are as torch wrote them (0 for
        frames of threads torch does not track); polyprof's own bus-thread
        frames are left out.
        """
        from polyprof.base.kineto_format import CATEGORY_BY_KIND, us_to_ns

        category = CATEGORY_BY_KIND[EventKind.PYTHON_FUNCTION]
        picked = [i for i, ev in enumerate(self.host) if ev.get("cat") == category]
        n = len(picked)
        if not n:
            return EventBatch.empty(SOURCE)
        events = [self.host[i] for i in picked]
        name_idx, names = intern_column((str(ev.get("name", "")) for ev in events), count=n)
        args = [ev["args"] for ev in events]
        py_id = np.array([_as_int64(a.get(Arg.PYTHON_ID), -1) for a in args], dtype=np.int64)
        py_parent = np.array([_as_int64(a.get(Arg.PYTHON_PARENT_ID), -1) for a in args], dtype=np.int64)
        kind = np.full(n, EventKind.PYTHON_FUNCTION, dtype=np.int8)
        own = _own_python_frames(kind, names, name_idx, py_id, py_parent)
        if own.any():
            tid = np.array([_as_int64(ev.get("tid"), 0) for ev in events], dtype=np.int64)
            entry = own_frames.thread_entries(names, name_idx)
            py_parent, moved = _reparented(own, py_id, py_parent, entry, tid)
            for i in np.flatnonzero(moved).tolist():
                parent = int(py_parent[i])
                args[i] = {**args[i], Arg.PYTHON_PARENT_ID: parent if parent >= 0 else None}
        columns = {
            "kind": kind,
            "name": name_idx,
            "start_ns": np.array([self.starts[i] for i in picked], dtype=np.int64),
            "dur_ns": us_to_ns([ev.get("dur", 0) for ev in events]),
            "pid": np.array([_as_int64(ev.get("pid"), 0) for ev in events], dtype=np.int64),
            "tid": np.array([_as_int64(ev.get("tid"), 0) for ev in events], dtype=np.int64),
            "python_id": py_id,
            "python_parent_id": py_parent,
            "trace_only": np.ones(n, dtype=bool),
        }
        columns["args"], args_table = intern_structured_column(args)
        batch = EventBatch.build(SOURCE, columns, {"name": names, "args": args_table})
        return batch.take(np.flatnonzero(~own)) if own.any() else batch


def _as_int64(value: Any, default: int) -> int:
    """A JSON id as int64: ``default`` for null; unsigned 64-bit values (2**64 - 1) keep their bits."""
    if not isinstance(value, int) or isinstance(value, bool):
        return default
    return value - (1 << 64) if value >= 1 << 63 else value


#: What device attribution (polyprof.base.attribution) reads of every op: decoded at once when a
#: device tracer records too, deferred otherwise.
ATTRIBUTION_KEYS = (
    ("tid", "device_resource_id", "int64"),
    ("correlation_id", "correlation_id", "int64"),
)
#: Columns only traces and ``events()`` need: (field, accessor, dtype).
DEFERRED_SCALARS = (
    *ATTRIBUTION_KEYS,
    ("flow_id", "flow_id", "int64"),
    ("flow_type", "flow_type", "int8"),
    ("flow_start", "flow_start", "bool"),
)
#: Backward ops inherit their forward op's stack through these three, so
#: they are decoded at once when stacks are recorded, deferred otherwise.
AUTOGRAD_LINKS = (
    ("sequence_nr", "sequence_nr", "int64"),
    ("fwd_thread", "fwd_thread_id", "int64"),
    ("scope", "scope", "int8"),
)
#: Values only ``FunctionEvent`` attributes read (polyprof.analysis.function_events), deferred like the
#: scalars and
#: decoded where the installed torch has the accessor: (field, accessor, recorded only with shapes).
DEFERRED_STRUCTURED = (
    ("concrete_inputs", "concrete_inputs", True),
    ("kwinputs", "kwinputs", True),
    ("input_dtypes", "dtypes", True),
    ("structured_input_shapes", "structured_input_shapes", True),
    ("structured_input_strides", "structured_input_strides", True),
    ("metadata_json", "metadata_json", False),
    ("extra_meta", "extra_meta", False),
    ("typed_metadata", "typed_metadata", False),
    ("activity_type", "activity_type", False),
)
#: torch 2.12+: the nn.Module of a python_function event (-1 for the others).
MODULE_ID = ("python_module_id", "python_module_id", "int64")


class _DeferredDecoder:
    """Decodes every deferred column in one pass, on first need, then lets go of torch's result.

    torch's raw result holds ~1.3 KB per event in C++; once everything a trace
    needs is in numpy columns, dropping it returns that memory.
    """

    def __init__(
        self,
        rows: ResultRows,
        scalars: tuple,
        with_args: bool,
        structured: tuple[tuple[str, str], ...] = (),
        saved: SavedKinetoTrace | None = None,
        reparented: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self._rows: ResultRows | None = rows  # the batch's rows of torch's result, in batch order
        # (rows, new parent ids) of the frames whose parent was one of polyprof's own
        self._reparented = reparented
        self._saved = saved  # torch's own trace of the result, where decoding read it already
        self._scalars = scalars
        self._structured = structured
        self._with_args = with_args
        self._lock = threading.Lock()
        self._columns: dict[str, tuple[np.ndarray, tuple | None]] | None = None

    def provider(self, field: str) -> Any:
        return lambda: self._get(field)

    def fields(self) -> list[str]:
        return (
            [f for f, _, _ in self._scalars]
            + [f for f, _ in self._structured]
            + (["args"] if self._with_args else [])
        )

    def _get(self, field: str) -> tuple[np.ndarray, tuple | None]:
        self.decode_now()
        assert self._columns is not None
        return self._columns[field]

    def decode_now(self, *, at_exit: bool = False) -> None:
        """Decode every deferred column now (once), and let go of torch's result."""
        with self._lock:
            if self._columns is None:
                self._columns = self._decode_all(at_exit=at_exit)

    def _decode_all(self, *, at_exit: bool = False) -> dict[str, tuple[np.ndarray, tuple | None]]:
        rows = self._rows
        assert rows is not None
        columns = self._read(rows)  # on failure the rows stay, for the next attempt
        self._rows = self._saved = None
        # At the exit the decode's callers still hold torch's result: it is freed as they let go.
        if not rows.close() and not at_exit:  # freed now, through Python
            release_free_heap_in_background()
        return columns

    def _read(self, rows: ResultRows) -> dict[str, tuple[np.ndarray, tuple | None]]:
        with _gc_paused():
            columns: dict[str, tuple[np.ndarray, tuple | None]] = {
                field: (values, None) for field, values in _scalar_columns(rows, self._scalars).items()
            }
            for field, accessor in self._structured:
                columns[field] = rows.structured(accessor)
            if not torch_support.installed().has_accessor("flow_id"):
                # torch < 2.13 has no flow accessors, yet its writer draws the fwdbwd flows: both
                # flows and args come from one result.save (torch writes a result only once).
                columns.update(_saved_trace_columns(rows, with_args=self._with_args, saved=self._saved))
            elif self._with_args:
                columns["args"] = _trace_args_column(rows)
            if "args" in columns and self._reparented is not None and len(self._reparented[0]):
                indices, table = columns["args"]
                assert table is not None  # an interned column: the args always come with their table
                columns["args"] = _with_python_parents(indices, table, *self._reparented)
        return columns


#: Flow columns torch leaves at 0 / False on events without a flow (``flow_id`` 0): read only for
#: the events with one, which saves two passes over every event of a trace with few flows.
FLOW_DETAILS = frozenset({"flow_type", "flow_start"})


def _scalar_columns(rows: ResultRows, scalars: tuple) -> dict[str, np.ndarray]:
    """The ``(field, accessor, dtype)`` columns of ``rows``; flow details only where ``flow_id`` is set."""
    columns = {
        field: rows.column(accessor, dtype) for field, accessor, dtype in scalars if field not in FLOW_DETAILS
    }
    flow_id = columns.get("flow_id")
    with_flow = None if flow_id is None else np.flatnonzero(flow_id != 0)
    flowing = None if with_flow is None or not len(with_flow) else rows.take(with_flow)
    for field, accessor, dtype in scalars:
        if field not in FLOW_DETAILS:
            continue
        if with_flow is None:
            columns[field] = rows.column(accessor, dtype)
            continue
        values = np.zeros(rows.count, dtype=dtype)
        if flowing is not None:
            values[with_flow] = flowing.column(accessor, dtype)
        columns[field] = values
    return columns


class _gc_paused:  # noqa: N801 - a context manager, named as one
    """Pause the cyclic GC while decoding.

    Decoding allocates hundreds of thousands of short-lived containers next to
    as many pybind objects, and the collector would rescan them again and again.
    """

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()


def decode_result(
    result: Any,
    config: ProfileConfig,
    *,
    pid: int | None = None,
    claims: DeviceRowClaims | None = None,
    reader: str | None = None,
    keep_kineto_trace: bool = False,
) -> tuple[EventBatch, dict]:
    """Turn a ``torch._C._autograd._ProfilerResult`` into one ``EventBatch``.

    Decodes now what tables need (names, times, threads, and what the flags
    ask for: FLOPs, shapes, stacks, memory) and defers what only traces and
    ``events()`` need (OS thread ids, correlation and sequence ids, flows,
    Kineto's args), so a table prints before those are ever read. Returns the
    batch and facts for the trace (``start_ns``). ``claims``: the rows the
    session's device tracers decode from the same result (default, when
    ``config.torch_activities`` asked torch for device activity: every row
    of a device type). ``reader``: "native", "python" or "auto" (default:
    ``POLYPROF_KINETO_READER``; ``polyprof.native.native_reader``). ``keep_kineto_trace``:
    someone else holds ``result`` too (whoever stopped torch's profiler from outside
    polyprof got it) and may still ``save()`` it, so Kineto's copy of the events inside
    it is not freed early.
    """
    rows = ResultRows(result, _reader(reader))
    with _gc_paused():
        return _decode_now(
            rows,
            config,
            pid=os.getpid() if pid is None else pid,
            claims=claims,
            keep_kineto_trace=keep_kineto_trace,
        )


def _reader(requested: str | None) -> Any:
    """The compiled reader to decode with, or None for the Python one; never costs the profile."""
    try:
        return native_reader.reader(requested)
    except Exception as exc:  # noqa: BLE001 - the Python reader gives the same result
        log.warning("kineto_reader_unavailable", reason=str(exc))
        return None


def _start_reader_build(requested: str) -> None:
    """The compiled reader's background build, started and announced on the user's thread when it is
    missing (``native_reader.build_in_background``); never costs the profile."""
    try:
        native_reader.build_in_background(requested)
    except Exception as exc:  # noqa: BLE001 - the recording is handed over whatever happens here
        # The announcement made an error (-W error), or no build spec here: the decode's own reader
        # choice logs that one (kineto_reader_unavailable), so this stays quiet by default.
        log.info("kineto_reader_build_not_announced", reason=f"{type(exc).__name__}: {exc}")


def _visible_rows(rows: ResultRows, claims: DeviceRowClaims | None = None) -> ResultRows:
    """The rows of torch's result without the events torch's own parse skips (hidden ones).

    ``claims``: without the rows device tracers decode (kernels, copies,
    runtime and driver calls, ...) when torch's collector recorded device
    activity for them (``polyprof.runtime.torch_result``).
    """
    if claims is not None:
        rows = rows.take(np.flatnonzero(_host_row_mask(rows, claims)))
    if not torch_support.installed().has_accessor("is_hidden_event"):
        return rows  # a torch without the accessor (2.6) hides nothing: its parse reads every event
    hidden = rows.column("is_hidden_event", "bool")
    if hidden.any():
        rows = rows.take(np.flatnonzero(~hidden))
    return rows


def _host_row_mask(rows: ResultRows, claims: DeviceRowClaims) -> np.ndarray:
    """Which rows of a result that holds device rows too are the CPU tracer's: those no device
    tracer claims.

    By Kineto's activity type where torch has the accessor (2.12+); before, by
    device type and the names device tracers give their host-side rows.
    """
    events = rows.events()
    types = None
    if torch_support.installed().has_accessor("activity_type"):
        types = list(map(_accessor(events, "activity_type"), events))
    return np.array(claims.host_row_mask(events, types), dtype=bool)


def _own_python_frames(
    kind: np.ndarray, names: tuple, name_idx: np.ndarray, py_id: np.ndarray, py_parent: np.ndarray
) -> np.ndarray:
    """Mask of the Python frames that are polyprof's own (polyprof.runtime.own_frames)."""
    python = np.flatnonzero(kind == EventKind.PYTHON_FUNCTION)
    mask = np.zeros(len(kind), dtype=bool)
    mask[python] = own_frames.profiler_frames(python, names, name_idx, py_id, py_parent)
    return mask


def _with_python_parents(
    indices: np.ndarray, table: tuple, rows: np.ndarray, parents: np.ndarray
) -> tuple[np.ndarray, tuple]:
    """The args column with ``parents`` as the Python parent ids of ``rows``; a root (-1) as torch
    writes one: ``"Python parent id": null`` (before 2.15) or no such key (2.15+)."""
    omit = torch_support.installed().at_least(2, 15)
    indices = indices.copy()
    table_list = list(table)
    for row, new_parent in zip(rows.tolist(), parents.tolist(), strict=True):
        index = int(indices[row])
        if index < 0:
            continue
        value = table_list[index]
        args = value.mapping() if isinstance(value, KinetoArgsText) else dict(value)
        parent = args.get(Arg.PYTHON_PARENT_ID)
        if not isinstance(parent, int) or isinstance(parent, bool):  # none, or null already
            continue
        if new_parent >= 0:
            args[Arg.PYTHON_PARENT_ID] = new_parent
        elif omit:
            del args[Arg.PYTHON_PARENT_ID]
        else:
            args[Arg.PYTHON_PARENT_ID] = None
        indices[row] = len(table_list)
        table_list.append(args)
    return indices, tuple(table_list)


def _reparented(
    own: np.ndarray,
    py_id: np.ndarray,
    py_parent: np.ndarray,
    entry: np.ndarray,
    tid: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Python parent ids once ``own`` frames are gone, and which kept frames' parent changed:
    the user's frames that polyprof called hang from their nearest kept ancestor; a thread's
    frames that torch chained to polyprof's thread are roots, as in torch.profiler's run."""
    parents = own_frames.kept_parents(own, py_id, py_parent, entry, tid)
    return parents, ~own & (parents != py_parent)


UNDECODABLE_FRAME = "<undecodable stack frame>"


#: torch sometimes hands out python_function names from freed memory (first verbose profile of a
#: process); the event is kept, its name marked.
_safe_name = safe_text("name")


def _stacks(events: list[Any], notes: list[str]) -> list[tuple[str, ...]]:
    """Every event's Python stack; a stack torch cannot decode is kept as one marker frame, and noted.

    torch builds stacks from the same frame names that it sometimes reads from
    freed memory; pybind then raises for the whole stack, which must not cost
    the profile.
    """
    stack_of = _accessor(events, "stack")
    stacks: list[tuple[str, ...]] = []
    undecodable = 0
    for event in events:
        try:
            stacks.append(tuple(stack_of(event)))
        except UnicodeDecodeError:
            undecodable += 1
            stacks.append((UNDECODABLE_FRAME,))
    if undecodable:
        log.warning("undecodable_stacks", events=undecodable)
        notes.append(
            f"{undecodable} Python stack(s) in torch's result were not valid UTF-8 (a torch bug: frame "
            f"names read from freed memory); each is kept as {UNDECODABLE_FRAME!r}"
        )
    return stacks


#: Up to this many events, and where they are cheap (torch 2.13+ without Kineto's args, whose
#: text or torch's own writer the other cases read), the deferred columns are decoded at the exit
#: too: deferring them saves the table little on a small profile (about 0.2 ms at 2,500 events),
#: while the first export paid for the decode and the result's free (2.5 ms of a conv net's 5 ms
#: fresh export, against 2.3 ms once decoded). torch's result is then freed at the exit, through
#: Python, as the decode's callers let go of it (about 0.5 us per event).
EAGER_DECODE_EVENTS = 5_000


def _decode_deferred_at_exit(deferred: _DeferredDecoder) -> None:
    """Decode the deferred columns now; should that fail, they wait for an export, as usual."""
    try:
        deferred.decode_now(at_exit=True)
    except Exception as exc:  # noqa: BLE001 - the table must not depend on trace-only columns
        log.warning("deferred_decode_at_exit_failed", reason=repr(exc))


def _kineto_args_wanted(config: ProfileConfig) -> bool:
    """Whether the trace carries Kineto's args: torch writes them only under these flags."""
    return bool(
        config.record_shapes
        or config.with_flops
        or config.profile_memory
        or config.with_stack
        or config.with_modules
    )


def _decode_now(
    all_rows: ResultRows,
    config: ProfileConfig,
    *,
    pid: int,
    claims: DeviceRowClaims | None,
    keep_kineto_trace: bool = False,
) -> tuple[EventBatch, dict]:
    result = all_rows.result
    with_args = _kineto_args_wanted(config)
    # Nothing will read Kineto's own copy of the events (its args, or its writer's flows before
    # 2.13) unless a device tracer decodes rows of the same result, or the result is someone
    # else's too: about half of the result, freed beside the decode.
    trace_freed = (
        not keep_kineto_trace
        and claims is None
        and not config.torch_activities
        and not with_args
        and torch_support.installed().has_accessor("flow_id")
        and all_rows.release_kineto_trace()
    )
    if claims is None and config.torch_activities:
        claims = DeviceRowClaims()  # every row of a device type is some device tracer's
    rows = _visible_rows(all_rows, claims)
    n = rows.count
    notes: list[str] = []
    name_idx, names, bad = rows.names()
    if bad:
        log.warning("undecodable_event_names", events=bad)
        notes.append(
            f"{bad} event name(s) in torch's result were not valid UTF-8 (a torch bug: names read from "
            f"freed memory); they are kept as {UNDECODABLE_NAME!r}"
        )
    start = rows.column("start_ns", "int64")
    end = rows.column("end_ns", "int64")
    thread = rows.column("start_thread_id", "int64")
    end_thread = rows.column("end_thread_id", "int64")
    # Booleans instead of activity_type(): no string per event to build and intern.
    kind = np.full(n, EventKind.CPU_OP, dtype=np.int8)
    kind[rows.column("is_user_annotation", "bool")] = EventKind.USER_ANNOTATION
    if config.with_stack:
        kind[rows.column("is_python_function", "bool")] = EventKind.PYTHON_FUNCTION
    for special, special_kind in (
        (MEMORY_EVENT_NAME, EventKind.MEMORY),
        (OUT_OF_MEMORY_EVENT_NAME, EventKind.OUT_OF_MEMORY),
    ):
        if special in names:
            kind[name_idx == names.index(special)] = special_kind
    columns: dict[str, Any] = {
        "kind": kind,
        "name": name_idx,
        "start_ns": start,
        "dur_ns": end - start,
        "pid": np.full(n, pid, dtype=np.int64),
        "thread": thread,
        "is_async": rows.column("is_async", "bool") | (thread != end_thread),
    }
    tables: dict[str, tuple] = {"name": names}
    deferred_scalars: tuple[tuple[str, str, str], ...] = DEFERRED_SCALARS
    if config.with_stack:
        for field, accessor, dtype in AUTOGRAD_LINKS:
            columns[field] = rows.column(accessor, dtype)
    else:
        deferred_scalars = DEFERRED_SCALARS + AUTOGRAD_LINKS
    if config.activities - {ProfilerActivity.CPU}:
        # A device tracer records too: attribution (polyprof.base.attribution) needs every op's OS
        # thread and id before the table. Two passes now, instead of the whole deferred decode.
        for field, accessor, dtype in ATTRIBUTION_KEYS:
            columns[field] = rows.column(accessor, dtype)
        deferred_scalars = tuple(spec for spec in deferred_scalars if spec not in ATTRIBUTION_KEYS)
        if torch_support.installed().has_accessor("external_id"):
            # The device rows carry torch's external id (2.12+), and 2.15 lets only rows with one
            # launch: the ops need theirs in the same column, or concat fills them with 0.
            columns["external_id"] = rows.column("external_id", "int64")
    if config.with_flops:
        columns["flops"] = rows.column("flops", "int64")
    if config.record_shapes or config.with_flops:
        events = rows.events()
        columns["shapes"], tables["shapes"] = intern_column(
            (_shapes_key(s) for s in map(_accessor(events, "shapes"), events)), empty=()
        )
    if config.with_stack:
        columns["stack"], stack_table = intern_column(_stacks(rows.events(), notes), empty=())
        tables["stack"] = tuple(
            map(own_frames.without_own_frames, stack_table)
        )  # one pass per distinct stack
        python = np.flatnonzero(kind == EventKind.PYTHON_FUNCTION)
        python_rows: ResultRows | None  # let go of below, with its event wrappers
        python_rows = rows.take(python)
        for col in ("python_id", "python_parent_id"):
            values = np.full(n, -1, dtype=np.int64)
            values[python] = python_rows.column(col, "int64")
            columns[col] = values
    if config.capture_overload_names:
        columns["overload"], tables["overload"], _ = rows.names("overload_name", empty="")
    memory_rows = None
    memory = np.flatnonzero((kind == EventKind.MEMORY) | (kind == EventKind.OUT_OF_MEMORY))
    if len(memory):
        memory_rows = rows.take(memory)
        nbytes = np.zeros(n, dtype=np.int64)
        device_type = np.zeros(n, dtype=np.int8)
        device_index = np.zeros(n, dtype=np.int32)
        nbytes[memory] = memory_rows.column("nbytes", "int64")
        device_type[memory] = memory_rows.column("device_type", "int8")
        device_index[memory] = memory_rows.column("device_index", "int32")
        columns.update(nbytes=nbytes, device_type=device_type, device_index=device_index)
    # the wrappers cost ~330 bytes per event; the deferred pass fetches them again
    python_rows = memory_rows = None
    rows.forget_events()
    if not trace_freed:
        release_free_heap_in_background()
    keep = reparented = None
    if config.with_stack:
        own = _own_python_frames(kind, names, name_idx, columns["python_id"], columns["python_parent_id"])
        if own.any():
            entry = own_frames.thread_entries(names, name_idx) & (kind == EventKind.PYTHON_FUNCTION)
            parents, moved = _reparented(own, columns["python_id"], columns["python_parent_id"], entry)
            columns["python_parent_id"] = parents
            keep = np.flatnonzero(~own)
            columns = {field: values[keep] for field, values in columns.items()}
            moved_rows = np.flatnonzero(moved[keep])
            reparented = (moved_rows, columns["python_parent_id"][moved_rows])
    features = torch_support.installed()
    if features.has_accessor(MODULE_ID[1]):
        deferred_scalars = (*deferred_scalars, MODULE_ID)
    structured = tuple(
        (field, accessor)
        for field, accessor, with_shapes in DEFERRED_STRUCTURED
        if features.has_accessor(accessor) and (config.record_shapes or config.with_flops or not with_shapes)
    )
    saved = trace_only = None
    if config.with_stack and not features.has_accessor("is_python_function"):
        # torch < 2.12 lists no python_function events in events(), only in the trace its writer
        # writes: read that once, now, for them (and later for the args and flows of the rest).
        saved = SavedKinetoTrace.read(result)
        if saved is None:
            notes.append(
                "torch's own trace of this result could not be read (see the log), so the trace "
                "has no python_function events"
            )
        else:
            trace_only = saved.python_function_batch()
    deferred = _DeferredDecoder(
        rows if keep is None else rows.take(keep), deferred_scalars, with_args, structured, saved, reparented
    )
    batch = EventBatch.build(SOURCE, columns, tables, {f: deferred.provider(f) for f in deferred.fields()})
    facts = {"start_ns": int(result.trace_start_ns()), "notes": notes}
    if trace_only is not None and len(trace_only):
        batch = concat([batch, trace_only])
    if n <= EAGER_DECODE_EVENTS and not with_args and saved is None and features.has_accessor("flow_id"):
        _decode_deferred_at_exit(deferred)
    if trace_freed:
        # The table's arrays then reuse the freed heap instead of adding to the peak (1M events:
        # 1.93 GB, against 2.07 GB when the free ran beside the table), and the table runs without
        # the free's allocator locks beside it (0.25 s against 0.3-0.7 s). No trim: pages handed
        # back would be faulted in again by the table at once (0.44-0.74 s measured).
        all_rows.wait_for_kineto_trace_release()
    return batch, facts


def _experimental_config(config: ProfileConfig) -> Any:
    """The user's ``_ExperimentalConfig``, or one with polyprof's flags; never with ``trace_only``.

    polyprof always reads the events (its post-processing is cheap) and honours
    ``trace_only`` itself: exports work and ``events()`` raises, as in torch.
    """
    user = config.experimental_config
    if user is None:
        return torch_support.make_experimental_config(
            verbose=config.verbose,
            profile_all_threads=config.profile_all_threads,
            capture_overload_names=config.capture_overload_names,
        )
    if config.trace_only:
        user = copy.copy(user)
        user.trace_only = False
    return user


def _profiler_flag(enabled: bool) -> None:
    """torch's ``_run_on_profiler_start`` / ``_run_on_profiler_stop``, called where torch calls them."""
    from torch.autograd import profiler as autograd_profiler

    if enabled:
        autograd_profiler._run_on_profiler_start()
    else:
        autograd_profiler._run_on_profiler_stop()


class NestedProfilerWarning(UserWarning):
    """A torch profiler started inside a polyprof recording; polyprof paused around it."""


NESTED_PROFILER_MESSAGE = (
    "a torch profiler (torch.profiler.profile or torch.autograd.profiler.profile) was started inside a "
    "polyprof profile on the same thread. torch's collector keeps one session per process, so the inner "
    "profiler would silently empty polyprof's profile: polyprof keeps what it recorded so far, pauses "
    "while the inner profiler runs (those ops go to the inner profiler only) and resumes when it stops."
)


#: The functions of ``torch.autograd`` that end this thread's collector session whoever started
#: it. Libraries call these private names: PyTorch Lightning's ``PyTorchProfiler.start`` calls
#: ``torch.autograd._disable_profiler()`` when ``_profiler_enabled()``, to close a profiler it
#: assumes is its own. torch's profilers call ``torch.autograd.profiler``'s own imported names,
#: which these wrappers do not touch. ``_disable_profiler_legacy`` ends a Kineto session too, then
#: raises.
OUTSIDE_STOPS = ("_disable_profiler", "_disable_profiler_legacy")


def _describe_caller(frame: FrameType | None) -> str:
    """``module (function, line N)`` of the first frame outside polyprof; a script by its file name."""
    while frame is not None and frame.f_globals.get("__name__", "").startswith("polyprof"):
        frame = frame.f_back
    if frame is None:
        return "code outside polyprof"
    module = frame.f_globals.get("__name__") or "?"
    if module == "__main__":
        module = os.path.basename(frame.f_code.co_filename)
    code = frame.f_code
    function = getattr(code, "co_qualname", None)  # 3.11+
    if function is None:  # 3.10: a method by its instance's class
        owner = frame.f_locals.get("self") if code.co_argcount else None
        function = code.co_name if owner is None else f"{type(owner).__qualname__}.{code.co_name}"
    return f"{module} ({function}, line {frame.f_lineno})"


class _CollectorState(enum.Enum):
    """Where the torch collector session of a ``TorchCpuTracer`` stands."""

    #: No session: before the first recording, or between recordings.
    IDLE = "idle"
    #: ``_prepare_profiler`` done (warm-up of a schedule), not enabled yet.
    PREPARED = "prepared"
    #: Recording.
    RUNNING = "running"
    #: A torch profiler started inside the recording has torch's collector until it stops.
    PAUSED = "paused"
    #: Code outside polyprof ended this recording's session; the recording has not stopped yet.
    STOPPED_OUTSIDE = "stopped_outside"
    #: Code outside polyprof ended a session of an earlier recording of this session (an earlier
    #: cycle of a schedule): torch's collector is left to that code for the rest of the session.
    GIVEN_UP = "given_up"


#: polyprof's wrappers of torch's functions whose ``_TorchWrappers`` were uninstalled: pass-throughs.
_SPENT_WRAPPERS: weakref.WeakSet[Any] = weakref.WeakSet()


class _TorchWrappers(abc.ABC):
    """Replaces functions in torch's modules with wrappers for as long as a tracer records.

    The wrappers reach the tracer only through ``tracer``, which ``uninstall``
    clears: a wrapper left in place (code outside polyprof replaced the name
    after polyprof did, so ``uninstall`` leaves that code's binding alone) is
    then a plain pass-through and keeps no tracer alive. Putting a function
    back skips such spent wrappers of polyprof's (``_live``): two recordings
    whose stops did not come in the reverse order of their starts (one given
    up to the next, ``TorchCpuTracer.collector_lost``) still leave torch's own
    functions. The wrappers act only on the recording thread: torch's session
    belongs to the thread that started it.
    """

    def __init__(self, tracer: TorchCpuTracer) -> None:
        #: The tracer while it records; None once uninstalled.
        self.tracer: TorchCpuTracer | None = tracer
        self._thread = threading.get_ident()
        #: (module, name, torch's function, polyprof's wrapper)
        self._replaced: list[tuple[Any, str, Any, Any]] = []

    @abc.abstractmethod
    def install(self) -> None:
        """Replace torch's functions (``_replace``), on the recording thread as the recording starts."""

    def _recording_tracer(self) -> TorchCpuTracer | None:
        """The tracer, when called on its recording thread while installed; else None."""
        tracer = self.tracer
        return tracer if tracer is not None and threading.get_ident() == self._thread else None

    def _replace(self, module: Any, name: str, wrapper: Any) -> None:
        self._replaced.append((module, name, getattr(module, name), wrapper))
        setattr(module, name, wrapper)

    def uninstall(self) -> None:
        """Put torch's functions back; one that other code replaced meanwhile stays as that code left it."""
        self.tracer = None
        for module, name, original, wrapper in reversed(self._replaced):
            _SPENT_WRAPPERS.add(wrapper)
            if getattr(module, name, None) is wrapper:
                setattr(module, name, _live(original))
        self._replaced = []


def _live(function: Any) -> Any:
    """``function``, or what it wraps while it is a spent polyprof wrapper (``_SPENT_WRAPPERS``)."""
    while function in _SPENT_WRAPPERS:
        function = function.__wrapped__
    return function


class _NestedProfilerGuard(_TorchWrappers):
    """Keeps a polyprof recording alive across a torch profiler started inside it.

    torch's own ``_prepare_profiler`` for a second session discards the running
    one (2.13 logs a warning and returns nothing; 2.6 raises at the outer
    stop). While polyprof records, ``torch.autograd.profiler``'s module-level
    ``_prepare_profiler`` (which every torch Kineto profiler calls first) and
    ``_run_on_profiler_stop`` (which it calls last) are wrapped: the first
    hands polyprof's partial result over and pauses, the second resumes.
    """

    def install(self) -> None:
        from torch.autograd import profiler as autograd_profiler

        prepare = autograd_profiler._prepare_profiler
        stop = autograd_profiler._run_on_profiler_stop

        @functools.wraps(prepare)
        def guarded_prepare(*args: Any, **kwargs: Any) -> Any:
            tracer = self._recording_tracer()
            if tracer is not None:
                tracer._pause_for_inner_profiler()
            return prepare(*args, **kwargs)

        @functools.wraps(stop)
        def guarded_stop(*args: Any, **kwargs: Any) -> Any:
            result = stop(*args, **kwargs)
            tracer = self._recording_tracer()
            if tracer is not None:
                tracer._resume_after_inner_profiler()
            return result

        self._replace(autograd_profiler, "_prepare_profiler", guarded_prepare)
        self._replace(autograd_profiler, "_run_on_profiler_stop", guarded_stop)


class _OutsideStopGuard(_TorchWrappers):
    """Keeps what a polyprof recording recorded when code outside polyprof stops torch's profiler.

    ``torch.autograd``'s ``OUTSIDE_STOPS`` are wrapped: called while polyprof
    records, polyprof stops the session itself, keeps the result (the caller
    of ``_disable_profiler`` gets the same result, as from torch) and records
    nothing more with torch's collector (``TorchCpuTracer.collector_lost``).
    """

    def install(self) -> None:
        import torch.autograd

        for name in OUTSIDE_STOPS:
            original = getattr(torch.autograd, name, None)
            if original is not None:
                self._replace(torch.autograd, name, self._guarded(name, original))

    def _guarded(self, name: str, original: Any) -> Any:
        @functools.wraps(original)
        def guarded_outside_stop(*args: Any, **kwargs: Any) -> Any:
            tracer = self._recording_tracer()
            if tracer is not None and tracer._state is _CollectorState.RUNNING:
                caller = _describe_caller(sys._getframe(1))
                raw = tracer._stopped_from_outside(f"torch.autograd.{name}()", caller)
                if name == "_disable_profiler":
                    return raw
            # _disable_profiler_legacy now finds no session and raises, as it would without polyprof's
            return original(*args, **kwargs)

        return guarded_outside_stop


class TorchCpuTracer(Tracer, TorchCollectorOwner):
    """Records torch ops, record_function ranges, memory, shapes, FLOPs and stacks.

    It drives torch's collector, so it also asks it for the activities device
    plugins need (``config.torch_activities``) and hands every raw result to
    their ``TorchResultTracer``s; it decodes only the host rows itself.
    """

    name = SOURCE
    #: torch's result exists only after ``_disable_profiler`` (or a pause for a nested profiler,
    #: which stop then follows): nothing to poll for.
    hands_over_while_recording = False

    def __init__(self, config: ProfileConfig) -> None:
        super().__init__()
        self.config = config
        # Without CPU asked for, it only drives the collector for the device plugins.
        self.activities = frozenset({ProfilerActivity.CPU} & config.activities)
        self._result_tracers: list[TorchResultTracer] = []
        self._state = _CollectorState.IDLE
        #: The wrappers of torch's functions installed while recording.
        self._guards: tuple[_TorchWrappers, ...] = ()
        self._start_ns = 0
        self._end_ns = 0
        self._result_start_ns = 0
        self._notes: list[str] = []
        self._start_thread = threading.get_ident()
        #: Why the current recording ended before polyprof stopped it, said when it stops.
        self._stopped_outside: ProfilerStoppedOutsideWarning | None = None
        #: The trace note of each later recording once torch's collector is given up (GIVEN_UP).
        self._given_up_note = ""
        #: (tracer, call, error type) of the device tracers' faults already logged and warned about.
        self._result_tracer_faults: set[tuple[str, str, type]] = set()
        #: ids of the results whoever stopped torch's profiler from outside holds too (decode keeps
        #: them whole); ids, so that this tracer does not keep a result alive after its decode.
        self._shared_result_ids: set[int] = set()
        #: The last recording's raw results, kept for torch's memory profile
        #: (polyprof.runtime.memory_timeline).
        self._memory_profile_results: list[Any] = []
        # Checked now, so a bad POLYPROF_KINETO_READER fails the profile's creation, not its decode;
        # "native" builds the compiled reader now, before anything is recorded.
        self._reader_mode = native_reader.mode()
        if self._reader_mode == "native":
            native_reader.reader("native")

    def _profiler_config(self) -> Any:
        from torch._C._profiler import ProfilerConfig, ProfilerState

        cfg = self.config
        return ProfilerConfig(
            ProfilerState.KINETO,
            cfg.record_shapes or cfg.with_flops,  # torch: with_flops implies record_shapes
            cfg.profile_memory,
            cfg.with_stack,
            cfg.with_flops,
            cfg.with_modules,
            _experimental_config(cfg),
            cfg.trace_id,
        )

    def _check_no_other_profiler(self) -> None:
        import torch

        if torch.autograd._profiler_enabled():
            kind = torch._C._autograd._profiler_type()
            raise RuntimeError(
                f"another profiler ({kind}) is already running on this thread; torch's collector "
                "supports one at a time, and starting a second one would silently discard the first "
                "one's events. Stop it before starting this one."
            )

    def share_results_with(self, tracer: TorchResultTracer) -> None:
        self._result_tracers.append(tracer)

    def prepare(self) -> None:
        if self._state is _CollectorState.GIVEN_UP:  # torch's collector is that code's now
            return
        self._check_no_other_profiler()
        # the last cycle's raw result goes as the next is prepared, as torch's prepare_trace drops
        # its profiler: kept on, it would be held while the next cycle records (about twice the memory)
        self._memory_profile_results = []
        self._cfg = self._profiler_config()
        self._torch_activities = _collector_activities(self.config)
        self._prepare_collector()
        self._state = _CollectorState.PREPARED

    def _hand_over(self, raw: Any, *, shared: bool = False) -> None:
        """One collector result: to this tracer's outbox when it records CPU, and to every device tracer.

        ``shared``: code outside polyprof holds the same result (it stopped torch's profiler).
        """
        result = CollectorResult(raw)
        if shared:
            self._shared_result_ids.add(id(result))
        if keeps_memory_profile(self.config):
            self._memory_profile_results.append(raw)
        if self.activities:
            self.outbox.put(result)
        self._tell_result_tracers("receive", result)

    def _close_outboxes(self) -> None:
        self.outbox.close()
        self._tell_result_tracers("results_complete")

    def _tell_result_tracers(self, call: str, *args: Any) -> None:
        """Call ``call`` on every device tracer fed by this collector, each on its own.

        These calls run on the user's thread, also inside code that stopped torch's profiler or
        started one (style.md §9: the profiled program never sees a plugin's exception): a device
        tracer that raises is logged and warned about once, the trace notes it, and the others and
        this tracer go on.
        """
        for tracer in self._result_tracers:
            try:
                getattr(tracer, call)(*args)
            except Exception as exc:  # noqa: BLE001 - one plugin's failure must not reach the program
                self._result_tracer_failed(tracer, call, exc)

    def _result_tracer_failed(self, tracer: TorchResultTracer, call: str, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        note = f"tracer {tracer.name!r} failed in {call}() ({error}); its events may be missing or incomplete"
        if note not in self._notes:
            self._notes.append(note)
        if call == "results_complete":  # the bus must not wait for its outbox
            tracer.outbox.close()
        key = (tracer.name, call, type(exc))
        if key in self._result_tracer_faults:
            return
        self._result_tracer_faults.add(key)
        event = f"tracer_{call}_failed"  # tracer_receive_failed, ... as the session names a tracer's faults
        log.error(
            event,
            tracer=tracer.name,
            component=f"{type(tracer).__module__}.{type(tracer).__qualname__}",
            error=error,
            exc_info=exc,
        )
        warnings.warn(
            f"polyprof: tracer {tracer.name!r} failed in {call}() ({error}); the recording keeps the other "
            "tracers' events, and its own may be missing or incomplete",
            PluginFailureWarning,
            stacklevel=user_stacklevel(),
        )

    def _prepare_collector(self) -> None:
        """torch's ``_prepare_profiler`` with this recording's config and CPU activity filter.

        Called as torch.profiler calls it: on torch with activity filters (2.13+) the filter is
        always passed, empty when none was asked for, and on 2.15+ empty profiler extensions.
        """
        from torch._C._autograd import _prepare_profiler
        from torch._C._profiler import ProfilerActivity as TorchActivity

        cpu_filter = self.config.activity_filters.get(ProfilerActivity.CPU)
        features = torch_support.installed()
        if not features.prepare_takes_activity_filter:
            if cpu_filter is not None:
                raise ValueError(
                    f"torch {features.version_text} cannot filter CPU activity types "
                    "(activity filters need torch 2.13 or newer); pass activities=[ProfilerActivity.CPU]"
                )
            _prepare_profiler(self._cfg, self._torch_activities)
            return
        activity_filter = {} if cpu_filter is None else {TorchActivity.CPU: set(cpu_filter)}
        # torch 2.15+ also passes its profiler extensions; polyprof takes none (they configure torch's own
        # CUDA metrics profiler, polyprof.frontends.autograd_profile refuses them), so they are empty as
        # in torch
        extensions: dict[str, dict[str, object]] = (
            {"profiler_extensions": {}} if features.prepare_takes_profiler_extensions else {}
        )
        _prepare_profiler(self._cfg, self._torch_activities, activity_filter=activity_filter, **extensions)

    def start(self) -> None:
        from torch._C._autograd import _enable_profiler

        if self._state is _CollectorState.GIVEN_UP:
            self.outbox.reopen()
            self._notes = [self._given_up_note]
            self._result_start_ns = 0
            self._start_ns = time.time_ns()
            return
        if self._state is not _CollectorState.PREPARED:
            self.prepare()
        self.outbox.reopen()
        self._notes = []
        self._result_start_ns = 0
        self._stopped_outside = None
        self._shared_result_ids = set()
        self._start_thread = threading.get_ident()
        self._start_ns = time.time_ns()
        # torch's profiler flag, set as torch.profiler sets it: code that records extra ranges only
        # under a profiler (torch.compile's "## Call CompiledFxGraph ##", AOTDispatcher wrappers,
        # Inductor's kernel ranges) reads torch.autograd.profiler._is_profiler_enabled.
        _profiler_flag(True)
        try:
            _enable_profiler(self._cfg, self._torch_activities)
        except BaseException:
            _profiler_flag(False)
            raise
        self._state = _CollectorState.RUNNING
        self._guards = (_NestedProfilerGuard(self), _OutsideStopGuard(self))
        for guard in self._guards:
            guard.install()

    def _pause_for_inner_profiler(self) -> None:
        """A torch profiler is about to start on this thread: keep what was recorded, then step aside."""
        from torch._C._autograd import _disable_profiler

        if self._state is not _CollectorState.RUNNING:
            return
        if self._session_gone():  # nothing to pause: stopping it would warn (2.13) or raise (2.6)
            self._stopped_unseen()
            return
        warnings.warn(NESTED_PROFILER_MESSAGE, NestedProfilerWarning, stacklevel=user_stacklevel())
        log.warning("nested_torch_profiler", action="paused")
        self._tell_result_tracers("before_collector_stops")  # their devices' queued work belongs here
        self._hand_over(_disable_profiler())
        _start_reader_build(self._reader_mode)
        self._state = _CollectorState.PAUSED
        self._notes.append(
            "a torch profiler ran inside this recording; polyprof paused while it ran, so its ops are "
            "missing here (they are in that profiler's results)"
        )

    def _stopped_from_outside(self, call: str, caller: str) -> Any:
        """Code outside polyprof ends torch's session on the recording thread: keep what it recorded.

        polyprof stops the session itself and hands the result over; torch then
        records nothing more for this recording. Returns torch's result, which
        the caller gets too. The note is given when the recording stops.
        """
        from torch._C._autograd import _disable_profiler

        after_s = (time.time_ns() - self._start_ns) / 1e9
        self._tell_result_tracers("before_collector_stops")  # their devices' queued work belongs here
        try:
            raw = _disable_profiler()
        finally:
            self._state = _CollectorState.STOPPED_OUTSIDE  # first: the flag's stop below must not resume
            _profiler_flag(False)
        self._hand_over(raw, shared=True)
        _start_reader_build(self._reader_mode)
        log.info("torch_profiler_stopped_outside", stopped_by=caller, call=call, after_s=round(after_s, 3))
        self._stopped_outside = ProfilerStoppedOutsideWarning(
            f"{caller} stopped torch's profiler with {call} {after_s:.3f} s into the recording",
            "the results hold what torch recorded until then, and nothing after it",
            stopped_by=caller,
        )
        return raw

    def _session_gone(self) -> bool:
        """torch's session ended without polyprof seeing it (``torch._C._autograd._disable_profiler()``).

        Known only on the recording thread: torch's session belongs to it. Not known at all when
        recording every thread (``profile_all_threads``): torch then reports no profiler on any
        thread while its session runs.
        """
        from torch._C._autograd import _profiler_enabled

        if self.config.profile_all_threads:
            return False
        return threading.get_ident() == self._start_thread and not _profiler_enabled()

    def _stopped_unseen(self) -> None:
        """torch's session ended through a name polyprof does not wrap: its result went to whoever
        stopped it, and this recording records nothing more."""
        self._state = _CollectorState.STOPPED_OUTSIDE  # first: the flag's stop below must not resume
        _profiler_flag(False)
        log.info("torch_profiler_stopped_outside", stopped_by=None, call=None, after_s=None)
        self._stopped_outside = ProfilerStoppedOutsideWarning(
            "code outside polyprof stopped torch's profiler before this recording ended, not through "
            "torch.autograd._disable_profiler(), so polyprof cannot tell who or when",
            "the events torch recorded since the recording started (or last resumed) went to that "
            "code and are missing from the results",
        )

    def _say_stopped_outside(self) -> None:
        """The one note of a recording that code outside polyprof ended: trace note and warning."""
        note = self._stopped_outside
        if note is None:
            return
        self._stopped_outside = None
        self._notes.append(note.trace_note())
        self._given_up_note = (
            f"this cycle holds nothing from torch's collector: earlier in this profile, {note.what}, and "
            "polyprof leaves torch's collector to that code for the rest of the profile"
        )
        warnings.warn(note, stacklevel=user_stacklevel())

    def collector_lost(self) -> bool:
        """Whether code outside polyprof ended this tracer's torch session, so that this session
        records nothing more with torch's collector and another recording may take it.

        Asked by the process's recording gate when another recording starts
        (``polyprof.runtime.recording``), on that recording's thread. A session that
        torch ended without polyprof seeing it (``_profiler_enabled()`` false on
        the recording thread) is found here too, and from then on treated as one
        that was seen: the next recording's session must never be stopped as
        this one's.
        """
        if self._state is _CollectorState.RUNNING and self._session_gone():
            self._stopped_unseen()
        return self._state in (_CollectorState.STOPPED_OUTSIDE, _CollectorState.GIVEN_UP)

    def _resume_after_inner_profiler(self) -> None:
        from torch._C._autograd import _enable_profiler

        if self._state is not _CollectorState.PAUSED:
            return
        self._prepare_collector()
        _profiler_flag(True)
        _enable_profiler(self._cfg, self._torch_activities)
        self._state = _CollectorState.RUNNING
        log.info("nested_torch_profiler", action="resumed")

    def stop(self) -> None:
        from torch._C._autograd import _disable_profiler

        guards, self._guards = self._guards, ()
        for guard in reversed(guards):
            guard.uninstall()
        if self._state is _CollectorState.RUNNING and self._session_gone():
            # Asking torch again would log "no active profiling session" (2.13) or raise (2.6).
            self._stopped_unseen()
        if self._state is _CollectorState.STOPPED_OUTSIDE:
            self._state = _CollectorState.GIVEN_UP
            self._end_ns = time.time_ns()
            self._close_outboxes()
            self._say_stopped_outside()
            return
        if self._state is _CollectorState.GIVEN_UP:
            self._end_ns = time.time_ns()
            self._close_outboxes()
            return
        if self._state is _CollectorState.PAUSED:  # the inner profiler never stopped: what it took is its own
            self._state = _CollectorState.IDLE
            self._end_ns = time.time_ns()
            self._close_outboxes()
            return
        if self._state is _CollectorState.PREPARED:  # prepared, never started: the recording failed to begin
            self._release_prepared_collector()
        if self._state is not _CollectorState.RUNNING:
            self._close_outboxes()
            return
        try:
            try:
                result = _disable_profiler()
            finally:
                self._state = _CollectorState.IDLE
                self._end_ns = time.time_ns()
                _profiler_flag(False)
            self._hand_over(result)
            _start_reader_build(self._reader_mode)
        finally:
            self._close_outboxes()

    def memory_profile_results(self) -> tuple[Any, ...]:
        return tuple(self._memory_profile_results)

    def _release_prepared_collector(self) -> None:
        """Start and stop the collector this tracer prepared, discarding the result: torch keeps a
        prepared session until then, and the next profile's would fail (2.6: "Can't disable Kineto
        profiler when it's not running"). torch.profiler does the same when it exits in warmup."""
        from torch._C._autograd import _disable_profiler, _enable_profiler

        self._state = _CollectorState.IDLE
        try:
            _enable_profiler(self._cfg, self._torch_activities)
            _disable_profiler()
        except Exception:  # the recording has already failed; this is only tidying
            log.debug("prepared_collector_not_released", exc_info=True)

    def toggle_collection(self, enable: bool, activities: frozenset[ProfilerActivity]) -> None:
        """Pause or resume recording without ending it (torch's ``_toggle_collection_dynamic``)."""
        from torch._C._autograd import _toggle_collection_dynamic
        from torch._C._profiler import ProfilerActivity as TorchActivity

        if ProfilerActivity.CPU in activities & self.activities and self._state is _CollectorState.RUNNING:
            _toggle_collection_dynamic(enable, {TorchActivity.CPU})

    def toggle_torch_activities(self, enable: bool, names: frozenset[str]) -> None:
        """A device tracer's activities, paused or resumed in this collector (``TorchResultTracer``)."""
        from torch._C._autograd import _toggle_collection_dynamic
        from torch._C._profiler import ProfilerActivity as TorchActivity

        chosen = {getattr(TorchActivity, name) for name in names & self.config.torch_activities}
        if chosen and self._state is _CollectorState.RUNNING:
            _toggle_collection_dynamic(enable, chosen)

    def decode(self, item: CollectorResult) -> list[EventBatch]:
        claims = DeviceRowClaims.of(self._result_tracers) if self.config.torch_activities else None
        shared = id(item) in self._shared_result_ids
        self._shared_result_ids.discard(id(item))
        batch, facts = decode_result(
            item.raw, self.config, claims=claims, reader=self._reader_mode, keep_kineto_trace=shared
        )
        # A recording paused around a nested profiler has several results: the first start counts.
        # An empty result (torch 2.13's answer to a stop with no session) has none.
        self._result_start_ns = min(filter(None, (self._result_start_ns, facts["start_ns"])), default=0)
        self._notes.extend(facts["notes"])
        return [batch]

    def trace_metadata(self) -> TraceMetadata:
        return {
            "start_ns": self._result_start_ns or self._start_ns,
            "end_ns": self._end_ns,
            "notes": tuple(self._notes),
        }


class TorchCpuUnavailable(PolyprofError):
    """Raised when CPU profiling is asked for and torch cannot be driven."""


@hookimpl(trylast=True)
def polyprof_capabilities() -> Capabilities:
    if "torch" not in sys.modules:
        # Listing plugins never imports torch (seconds): its package files say its version.
        reason = torch_support.unsupported_reason_from_build(torch_support.installed_build())
        return Capabilities(
            activities={ProfilerActivity.CPU},
            unavailable_reason=reason,
            provisional=None if reason else "whether this torch build has the profiler polyprof reads",
        )
    return Capabilities(activities={ProfilerActivity.CPU}, unavailable_reason=torch_unavailable_reason())


def _collector_activities(config: ProfileConfig) -> set[Any]:
    """torch's activities for ``_prepare_profiler``: CPU when asked, plus what device plugins need."""
    from torch._C._profiler import ProfilerActivity as TorchActivity

    chosen = {TorchActivity.CPU} if ProfilerActivity.CPU in config.activities else set()
    for name in sorted(config.torch_activities):
        activity = getattr(TorchActivity, name, None)
        if activity is None:
            valid = sorted(m for m in TorchActivity.__members__ if m != "CPU")
            raise ValueError(
                f"a device plugin asked torch's collector for {name!r}, which torch "
                f"{torch_support.installed().version_text} does not have; it has: {', '.join(valid)}"
            )
        chosen.add(activity)
    return chosen


@hookimpl(trylast=True)
def polyprof_make_tracers(config: ProfileConfig) -> list[Tracer]:
    if ProfilerActivity.CPU not in config.activities and not config.torch_activities:
        return []
    reason = torch_unavailable_reason()
    if reason is not None:
        raise TorchCpuUnavailable(f"CPU profiling needs torch: {reason}")
    return [TorchCpuTracer(config)]
