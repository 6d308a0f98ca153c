"""The built-in "chrome" exporter: Kineto-shaped Chrome trace JSON.

It writes what torch's Kineto writer (``_ProfilerResult.save``) writes, so the
Perfetto UI, chrome://tracing and Holistic Trace Analysis read our files the
way they read torch's:

* top-level keys in Kineto's order: ``schemaVersion``, ``deviceProperties``,
  the metadata keys, ``displayTimeUnit``, ``baseTimeNanoseconds``,
  ``traceEvents`` and, last, ``traceName``;
* ``ts``/``dur`` in microseconds with exactly three decimals, relative to
  ``baseTimeNanoseconds`` (a "trimonth" boundary, so the numbers stay exact as
  doubles), computed with integer arithmetic;
* Kineto's categories, args, process/thread metadata events, ``fwdbwd`` and
  ``ac2g`` flows, the ``PyTorch Profiler (0)`` span and its global instants;
* counter rows (``EventKind.COUNTER``, e.g. polyprof-cuda's NVML samples) as
  Chrome counter events, ``{"ph": "C", "name": ..., "pid": <lane>, "tid": 0,
  "ts": ..., "args": {"<series>": value}}``, which Perfetto draws as a track
  named "<name> <series>" in that process and HTA leaves aside (no ``dur``);
* Python's default JSON separators (``", "``, ``": "``): HTA finds the rank of a
  file with the regex ``"rank":\\s+(\\d+)``.

Speed: the text is built with f-strings over column lists, one string per
event (an op's standard args are written by its line's own f-string), and
names, shapes and stacks are JSON-encoded once per unique value (the columns
are interned), never one dict per event through ``json.dumps``.
Memory: whole-trace work stays in numpy arrays; the per-event strings are
built and written ``CHUNK_EVENTS`` events at a time.

The layout follows the installed torch's writer (``KinetoLayout``: where the
time keys and the process/thread metadata events go, key order, ``host_name``),
and ops carry their overload (``aten::add.Tensor``) under
``capture_overload_names``, as torch writes them.

Unlike Kineto this writer keeps names as recorded, properly escaped: Kineto
before torch 2.15 writes a ``"`` in a ``record_function`` name as is, which
makes its file unreadable, and 2.15 rewrites it to ``'`` and backslashes to
``/``. Kineto's CUDA builds on a machine without a GPU also add a top-level
``"ERROR"`` list of their log lines (until 2.15); that is not written here.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import numpy as np
import orjson

from polyprof.base.activity import CPU_GROUP_ACTIVITY_TYPES, ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.distributed import distributed_info
from polyprof.base.events import API_CALL_KINDS, HOST_KINDS, DeviceType, EventBatch, EventKind, kind_codes
from polyprof.base.fileio import atomic_writer, check_writable_path
from polyprof.base.kineto_format import (
    DEFAULT_COUNTER_SERIES,
    DEFAULT_DEVICE_TYPE,
    DEVICE_CATEGORY_SUFFIX,
    DEVICE_KINDS,
    EV_IDX_GROUP,
    FLOW_AC2G,
    FLOW_CATEGORY_BY_TYPE,
    GPU_LANE_LABEL,
    GPU_LANE_NAMES,
    ITERATION_START_NAME,
    MEMORY_ARG_KEYS,
    NEWEST_LAYOUT,
    OUT_OF_MEMORY_ARG_KEYS,
    PROCESS_LABELS,
    PROCESS_NAME,
    PROCESS_SORT_INDEX,
    SPAN_CATEGORY,
    SPAN_NAME,
    THREAD_NAME,
    THREAD_SORT_INDEX,
    WINDOW_END_NAME,
    Arg,
    KinetoLayout,
    category_of,
    device_names,
    encode_args_table,
    format_us,
    json_string,
    kineto_layout,
    trace_name,
    trimonth_base_ns,
)
from polyprof.base.log import get_logger
from polyprof.base.trace import CHROME_TRACE_RESERVED_KEYS, CONFIG_FLAG_KEYS, Trace
from polyprof.hooks.components import Capabilities, Exporter
from polyprof.hooks.hookspecs import hookimpl
from polyprof.native import native_reader
from polyprof.runtime.exporting import check_export_suffix

log = get_logger(__name__)

EXPORTER_NAME = "chrome"

#: Kineto's process sort indexes: device lanes after the CPU, spans at the bottom.
DEVICE_SORT_INDEX_BASE = 5_000_000
OVERHEAD_SORT_INDEX = 0x100000
SPANS_SORT_INDEX = 0x20000000

#: Keys that Kineto itself places at the top level; metadata may not reuse them.
RESERVED_TOP_LEVEL_KEYS = CHROME_TRACE_RESERVED_KEYS

#: "000" ... "999": a list lookup is faster than a format spec per timestamp.
_THREE_DIGITS = [f"{i:03d}" for i in range(1000)]

#: Events rendered and handed to the file at once. Per-event strings exist for
#: one chunk at a time, so this, not the trace, bounds an export's extra memory.
CHUNK_EVENTS = 20_000

VALID_OPTIONS = ("gzip_level",)


# ------------------------------------------------------------------ helpers


def _json_value(value: Any) -> str:
    """A small JSON value with Python's default separators (``", "`` and ``": "``)."""
    return json.dumps(value, default=str)


def _as_json_list(value: Any) -> Any:
    """Tuples (interned shapes) back to lists, recursively, for JSON."""
    if isinstance(value, (tuple, list)):
        return [_as_json_list(v) for v in value]
    return value


def _metadata_entries(trace: Trace, layout: KinetoLayout = NEWEST_LAYOUT) -> list[tuple[str, str]]:
    """Top-level metadata keys and their raw JSON text, in Kineto's order."""
    entries: dict[str, str] = {}
    entries["trace_id"] = json_string(trace.trace_id or trace.config.trace_id or uuid.uuid4().hex.upper())
    for flag in CONFIG_FLAG_KEYS:
        if getattr(trace.config, flag, False):
            entries[flag] = "1"
    for key, raw in trace.metadata_json.items():
        key = str(key)
        if key in RESERVED_TOP_LEVEL_KEYS:
            log.warning("chrome_trace_reserved_metadata_key_skipped", key=key)
            continue
        text = raw if isinstance(raw, str) else _json_value(raw)
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            # torch would write it unchecked and break the file; keep it, as a string.
            log.warning("chrome_trace_metadata_not_json", key=key)
            entries[key] = json_string(text)
            continue
        if key == "distributedInfo":
            text = _json_value(value)  # HTA needs '"rank": N' with a space
        entries[key] = text.strip()
    if "distributedInfo" not in entries:
        dist = distributed_info()
        if dist is not None:
            entries["distributedInfo"] = _json_value(dist)
    if layout.host_name:
        entries["host_name"] = json_string(trace.hostname or socket.gethostname())
    return list(entries.items())


# ------------------------------------------------------------ event columns


class _Columns:
    """The batch being written, its kinds checked; absent columns read as their defaults."""

    def __init__(self, batch: EventBatch) -> None:
        self.batch = batch
        self.n = len(batch)
        self.kind = batch["kind"].astype(np.int64)
        unknown = sorted(set(np.unique(self.kind).tolist()) - {int(k) for k in EventKind})
        if unknown:
            valid = ", ".join(f"{k.name}={int(k)}" for k in EventKind)
            raise ValueError(f"events have unknown kind values {unknown}; valid kinds: {valid}")
        self._columns: dict[str, np.ndarray] = {}

    def col(self, name: str) -> np.ndarray:
        # Cached: the batch builds a fresh column of defaults for an absent field on every read,
        # and chunks read the same columns again and again.
        column = self._columns.get(name)
        if column is None:
            column = self._columns[name] = self.batch[name]
        return column

    def has(self, name: str) -> bool:
        return self.batch.has(name)


def _kind_mask(kind: np.ndarray, kinds: frozenset[EventKind] | Sequence[EventKind]) -> np.ndarray:
    # a lookup in a 256-entry table: np.isin's sort costs ~20 us a call, ten calls an export
    return _kind_table(frozenset(kind_codes(kinds).tolist()))[kind.astype(np.int8, copy=False).view(np.uint8)]


@functools.cache
def _kind_table(codes: frozenset[int]) -> np.ndarray:
    """Whether each ``kind`` byte (int8 read as uint8: negatives land above 127) is one of ``codes``."""
    table = np.zeros(256, dtype=bool)
    table[[code & 0xFF for code in codes]] = True
    table.setflags(write=False)
    return table


def _device_types_of_host_calls(cols: _Columns) -> np.ndarray:
    """The device each runtime/driver/sync event talks to (DeviceType values).

    Its own ``device_type`` when the tracer set one; else that of the device
    activity with the same correlation id; else the batch's most common device.
    """
    device_type = cols.col("device_type").astype(np.int64)
    result = device_type.copy()
    on_device = _kind_mask(cols.kind, DEVICE_KINDS - {EventKind.SYNC}) & (device_type != int(DeviceType.CPU))
    if on_device.any():
        types, counts = np.unique(device_type[on_device], return_counts=True)
        fallback = int(types[np.argmax(counts)])
    else:
        fallback = DEFAULT_DEVICE_TYPE
    unresolved = result == int(DeviceType.CPU)
    if unresolved.any() and on_device.any():
        corr = cols.col("correlation_id")
        dev_corr = corr[on_device]
        order = np.argsort(dev_corr, kind="stable")
        sorted_corr = dev_corr[order]
        sorted_type = device_type[on_device][order]
        pos = np.searchsorted(sorted_corr, corr)
        pos_clipped = np.minimum(pos, len(sorted_corr) - 1)
        found = unresolved & (sorted_corr[pos_clipped] == corr) & (corr != 0)
        result[found] = sorted_type[pos_clipped[found]]
        unresolved &= ~found
    result[unresolved] = fallback
    return result


def _categories(cols: _Columns) -> tuple[list[str], np.ndarray]:
    """(table of categories, per-event index into it)."""
    table: list[str] = []
    # -1: no category (counter rows, which are written without one)
    index = np.full(cols.n, -1, dtype=np.int64)
    lookup: dict[str, int] = {}

    def add(cat: str) -> int:
        if cat not in lookup:
            lookup[cat] = len(table)
            table.append(cat)
        return lookup[cat]

    device_types = None
    for kind in EventKind:
        kind_mask = cols.kind == int(kind)
        if not kind_mask.any():
            continue
        if kind not in DEVICE_CATEGORY_SUFFIX:
            cat = category_of(kind)
            if cat is not None:
                index[kind_mask] = add(cat)
            continue
        if device_types is None:
            device_types = _device_types_of_host_calls(cols)
        for dt in np.unique(device_types[kind_mask]).tolist():
            index[kind_mask & (device_types == dt)] = add(category_of(kind, dt) or "")
    return table, index


def _ev_idx(kind: np.ndarray) -> np.ndarray:
    """torch's running "Ev Idx": ops and annotations, then memory, then Python events."""
    group = np.full(len(kind), -1, dtype=np.int64)
    for k, g in EV_IDX_GROUP.items():
        group[kind == int(k)] = g
    numbered = np.flatnonzero(group >= 0)
    order = numbered[np.argsort(group[numbered], kind="stable")]
    ev_idx = np.full(len(kind), -1, dtype=np.int64)
    ev_idx[order] = np.arange(len(order), dtype=np.int64)
    return ev_idx


def _interned_json(cols: _Columns, field: str, encode: Any) -> list[str | None] | None:
    """Per-unique-value JSON text of an interned column, plus a trailing None for -1."""
    if not cols.has(field):
        return None
    encoded: list[str | None] = [encode(v) for v in cols.batch.table(field)]
    encoded.append(None)  # index -1 reads the last slot
    return encoded


def _encode_shapes(shapes: Any) -> str | None:
    return _json_value(_as_json_list(shapes)) if shapes else None


def _encode_stack(stack: Any) -> str | None:
    if not stack:
        return None
    frames = [stack] if isinstance(stack, str) else list(stack)
    return json_string("".join(f"{frame};" for frame in frames))


def _optional_args(cols: _Columns, field: str, key: str, encode: Any) -> list[str] | None:
    """Per-unique-value ``, "key": <json>`` text of an interned column ("" for no value), or None."""
    encoded = _interned_json(cols, field, encode)
    if encoded is None:
        return None
    head = f", {_key(key)}"
    return [f"{head}{text}" if text is not None else "" for text in encoded]


def _key(name: str) -> str:
    """An args key as it precedes its value: ``"Ev Idx": ``."""
    return f"{json_string(name)}: "


_ARGS_OPEN = ', "args": {'
#: Heads of standard args with an "External id" (followed by the id) and without one (Kineto
#: leaves it out when there is none).
_EXTERNAL_ID_HEAD = f"{_ARGS_OPEN}{_key(Arg.EXTERNAL_ID)}"
_OP_ARGS_TAIL = f", {_key(Arg.RECORD_FUNCTION_ID)}0"
_OP_ARGS_HEAD = f"{_ARGS_OPEN}{_key(Arg.RECORD_FUNCTION_ID)}0"
_DEVICE_ARGS_TAIL = f", {_key(Arg.DEVICE)}"
_DEVICE_ARGS_HEAD = f"{_ARGS_OPEN}{_key(Arg.DEVICE)}"
_HOST_CALL_ARGS_TAIL = f", {_key(Arg.CORRELATION)}"
_HOST_CALL_ARGS_HEAD = f"{_ARGS_OPEN}{_key(Arg.CORRELATION)}"
_SEQUENCE_NUMBER = f", {_key(Arg.SEQUENCE_NUMBER)}"
_FWD_THREAD_ID = f", {_key(Arg.FWD_THREAD_ID)}"
_STREAM = f", {_key(Arg.STREAM)}"
_CORRELATION = f", {_key(Arg.CORRELATION)}"
_PYTHON_ARGS_HEAD = f"{_ARGS_OPEN}{_key(Arg.PYTHON_THREAD)}"
_PYTHON_PARENT_ID = f", {_key(Arg.PYTHON_PARENT_ID)}"
_PYTHON_ID = f", {_key(Arg.PYTHON_ID)}"
_EV_IDX = f", {_key(Arg.EV_IDX)}"
_FINISHED_EV_IDX = f", {_key(Arg.FINISHED)}true{_EV_IDX}"
#: Standard args of memory and out-of-memory instants: ``str.format`` templates, one value per key.
_MEMORY_ARGS = ', "args": {{' + ", ".join(f"{_key(k)}{{}}" for k in MEMORY_ARG_KEYS) + "}}"
_OUT_OF_MEMORY_ARGS = ', "args": {{' + ", ".join(f"{_key(k)}{{}}" for k in OUT_OF_MEMORY_ARG_KEYS) + "}}"


class _ArgsForm(enum.IntEnum):
    """Which args template an event takes; every event takes exactly one."""

    NONE = 0  # overhead events without a fragment
    OP_FRAGMENT = 1  # ops and annotations with torch's fragment
    OP_STANDARD = 2  # ops and annotations without one
    MEMORY = 3  # memory instants without a fragment
    OUT_OF_MEMORY = 4  # out-of-memory instants without a fragment
    PYTHON = 5  # Python functions without a fragment
    FRAGMENT_ONLY = 6  # memory, Python and overhead events with a fragment
    DEVICE = 7  # device activity
    HOST_CALL = 8  # runtime and driver calls on the host
    GPU_ANNOTATION = 9  # GPU spans of ranges: the range's External id alone, as Kineto writes them


class _ArgsText:
    """The ``, "args": {...}`` text of events ("" when one has none), a chunk at a time.

    The constructor does the whole-trace work: fragment checks, "Ev Idx", JSON
    of each unique shape and stack, and which template each event takes.
    ``chunk`` builds the strings of one range of events, so they never exist
    for the whole trace at once. An event takes Kineto's args fragment when the
    tracer kept one, else the standard args generated from its columns.
    """

    def __init__(self, cols: _Columns, layout: KinetoLayout = NEWEST_LAYOUT) -> None:
        self.cols = cols
        self.ev_idx_head = _FINISHED_EV_IDX if layout.finished_in_op_args else _EV_IDX
        kind = cols.kind
        if cols.has("args"):
            fragments = encode_args_table(cols.batch.table("args"))
            fragments.append(None)  # index -1 reads the last slot
            self.fragment_col = cols.col("args").astype(np.int64)
            has_fragment = np.array([f is not None for f in fragments], dtype=bool)[self.fragment_col]
        else:
            fragments = [None]
            self.fragment_col = np.full(cols.n, -1, dtype=np.int64)
            has_fragment = np.zeros(cols.n, dtype=bool)
        self.fragments = fragments
        self.extra_fragments = [f", {f}" if f is not None else "" for f in fragments]
        self.ev_idx = _ev_idx(kind)
        self.shapes_args = _optional_args(cols, "shapes", Arg.INPUT_DIMS, _encode_shapes)
        self.stack_args = _optional_args(cols, "stack", Arg.CALL_STACK, _encode_stack)

        form = np.full(cols.n, _ArgsForm.NONE, dtype=np.int8)
        ops = _kind_mask(kind, (EventKind.CPU_OP, EventKind.USER_ANNOTATION))
        form[ops & has_fragment] = _ArgsForm.OP_FRAGMENT
        form[ops & ~has_fragment] = _ArgsForm.OP_STANDARD
        form[(kind == int(EventKind.MEMORY)) & ~has_fragment] = _ArgsForm.MEMORY
        form[(kind == int(EventKind.OUT_OF_MEMORY)) & ~has_fragment] = _ArgsForm.OUT_OF_MEMORY
        form[(kind == int(EventKind.PYTHON_FUNCTION)) & ~has_fragment] = _ArgsForm.PYTHON
        fragment_only = (
            EventKind.MEMORY,
            EventKind.OUT_OF_MEMORY,
            EventKind.PYTHON_FUNCTION,
            EventKind.OVERHEAD,
        )
        form[_kind_mask(kind, fragment_only) & has_fragment] = _ArgsForm.FRAGMENT_ONLY
        form[_kind_mask(kind, DEVICE_KINDS)] = _ArgsForm.DEVICE
        form[_kind_mask(kind, API_CALL_KINDS)] = _ArgsForm.HOST_CALL
        form[kind == int(EventKind.GPU_USER_ANNOTATION)] = _ArgsForm.GPU_ANNOTATION
        self.form = form
        self.device_stream = _device_tid(cols) if (form == _ArgsForm.DEVICE).any() else None
        self._render = {
            _ArgsForm.NONE: lambda idx: [""] * len(idx),
            _ArgsForm.OP_FRAGMENT: self._op_fragment,
            _ArgsForm.OP_STANDARD: self._op_standard,
            _ArgsForm.MEMORY: self._memory,
            _ArgsForm.OUT_OF_MEMORY: self._out_of_memory,
            _ArgsForm.PYTHON: self._python,
            _ArgsForm.FRAGMENT_ONLY: self._fragment_only,
            _ArgsForm.DEVICE: self._device,
            _ArgsForm.HOST_CALL: self._host_call,
            _ArgsForm.GPU_ANNOTATION: self._gpu_annotation,
        }

    def chunk(self, lo: int, hi: int, skip: np.ndarray | None = None) -> list[str]:
        """The args text of events ``lo`` to ``hi - 1``, in order ("" where the ``skip`` mask is set)."""
        form = self.form[lo:hi]
        if skip is not None and skip.any():
            form = np.where(skip, np.int8(_ArgsForm.NONE), form)
        forms = np.unique(form).tolist()
        if len(forms) == 1:  # the common case: one template for the whole chunk
            return self._render[forms[0]](np.arange(lo, hi))
        out = np.full(hi - lo, "", dtype=object)
        for f in forms:
            local = np.flatnonzero(form == f)
            out[local] = self._render[f](local + lo)
        return out.tolist()

    def optional_text(self, table: list[str] | None, field: str, idx: np.ndarray) -> list[str]:
        if table is None:
            return [""] * len(idx)
        return [table[i] for i in self.cols.col(field)[idx].tolist()]

    def _op_fragment(self, idx: np.ndarray) -> list[str]:
        # External id, then the fragment as is.
        fragments, head = self.fragments, _EXTERNAL_ID_HEAD
        return [
            f"{head}{c}, {fragments[a]}}}" if c else f"{_ARGS_OPEN}{fragments[a]}}}"
            for c, a in zip(self.cols.col("correlation_id")[idx].tolist(), self.fragment_col[idx].tolist())
        ]

    def _op_standard(self, idx: np.ndarray) -> list[str]:
        # Kineto's standard args from the columns.
        cols = self.cols
        ev_idx_head = self.ev_idx_head
        dims = self.optional_text(self.shapes_args, "shapes", idx)
        stacks = self.optional_text(self.stack_args, "stack", idx)
        head, tail = _EXTERNAL_ID_HEAD, _OP_ARGS_TAIL
        return [
            (f"{head}{c}{tail}" if c else _OP_ARGS_HEAD)
            + (f"{_SEQUENCE_NUMBER}{q}{_FWD_THREAD_ID}{f}" if q >= 0 else "")
            + f"{d}{st}{ev_idx_head}{e}}}"
            for c, q, f, d, st, e in zip(
                cols.col("correlation_id")[idx].tolist(),
                cols.col("sequence_nr")[idx].tolist(),
                cols.col("fwd_thread")[idx].tolist(),
                dims,
                stacks,
                self.ev_idx[idx].tolist(),
            )
        ]

    def _memory_fields(self, idx: np.ndarray) -> list[list[int]]:
        names = ("total_reserved", "total_allocated", "nbytes", "device_index", "device_type", "addr")
        return [self.cols.col(name)[idx].tolist() for name in names] + [self.ev_idx[idx].tolist()]

    def _memory(self, idx: np.ndarray) -> list[str]:
        template = _MEMORY_ARGS.format  # MEMORY_ARG_KEYS' order
        return [
            template(r, a, b, d, t, ad, "false", e) for r, a, b, d, t, ad, e in zip(*self._memory_fields(idx))
        ]

    def _out_of_memory(self, idx: np.ndarray) -> list[str]:
        template = _OUT_OF_MEMORY_ARGS.format  # OUT_OF_MEMORY_ARG_KEYS' order
        return [template(t, d, b, a, r, e) for r, a, b, d, t, _, e in zip(*self._memory_fields(idx))]

    def _python(self, idx: np.ndarray) -> list[str]:
        cols = self.cols
        ev_idx_head = self.ev_idx_head
        stacks = self.optional_text(self.stack_args, "stack", idx)
        return [
            f"{_PYTHON_ARGS_HEAD}{t}{_PYTHON_PARENT_ID}{'null' if p < 0 else p}"
            f"{_PYTHON_ID}{i}{st}{ev_idx_head}{e}}}"
            for t, p, i, st, e in zip(
                cols.col("thread")[idx].tolist(),
                cols.col("python_parent_id")[idx].tolist(),
                cols.col("python_id")[idx].tolist(),
                stacks,
                self.ev_idx[idx].tolist(),
            )
        ]

    def _fragment_only(self, idx: np.ndarray) -> list[str]:
        fragments = self.fragments
        return [f"{_ARGS_OPEN}{fragments[a]}}}" for a in self.fragment_col[idx].tolist()]

    def _device(self, idx: np.ndarray) -> list[str]:
        # External id of the launching op, device, stream, correlation, then any fragment.
        assert self.device_stream is not None
        cols, extra, head, tail = self.cols, self.extra_fragments, _EXTERNAL_ID_HEAD, _DEVICE_ARGS_TAIL
        return [
            (f"{head}{lc}{tail}" if lc else _DEVICE_ARGS_HEAD)
            + f"{d}{_STREAM}{st}{_CORRELATION}{c}{extra[a]}}}"
            for lc, d, st, c, a in zip(
                cols.col("linked_correlation_id")[idx].tolist(),
                cols.col("device_index")[idx].tolist(),
                self.device_stream[idx].tolist(),
                cols.col("correlation_id")[idx].tolist(),
                self.fragment_col[idx].tolist(),
            )
        ]

    def _gpu_annotation(self, idx: np.ndarray) -> list[str]:
        # Kineto writes only the range's id, as "External id" (torch hands it over as the span's
        # correlation id). No device, stream or correlation: Holistic Trace Analysis takes a
        # "correlation" for a launch's and drops the span, as it drops kernels whose launch it
        # cannot find.
        extra = self.extra_fragments
        rows = zip(self.cols.col("correlation_id")[idx].tolist(), self.fragment_col[idx].tolist())
        out = []
        for c, a in rows:
            if c:
                out.append(f"{_EXTERNAL_ID_HEAD}{c}{extra[a]}}}")
            else:  # no range id: only what the tracer kept, if anything
                out.append(f"{_ARGS_OPEN}{extra[a][2:]}}}" if extra[a] else "")
        return out

    def _host_call(self, idx: np.ndarray) -> list[str]:
        # External id of the launching op, correlation, then any fragment.
        cols, extra, head, tail = self.cols, self.extra_fragments, _EXTERNAL_ID_HEAD, _HOST_CALL_ARGS_TAIL
        return [
            (f"{head}{lc}{tail}" if lc else _HOST_CALL_ARGS_HEAD) + f"{c}{extra[a]}}}"
            for lc, c, a in zip(
                cols.col("linked_correlation_id")[idx].tolist(),
                cols.col("correlation_id")[idx].tolist(),
                self.fragment_col[idx].tolist(),
            )
        ]


def _device_tid(cols: _Columns) -> np.ndarray:
    """Stream of device events: the ``stream`` column, else ``tid``."""
    stream = cols.col("stream")
    return np.where(stream >= 0, stream, cols.col("tid"))


def _lanes(cols: _Columns) -> tuple[np.ndarray, np.ndarray]:
    """(pid, tid) of every event as Kineto places it."""
    pid = cols.col("pid").astype(np.int64).copy()
    tid = cols.col("tid").astype(np.int64).copy()
    device = _kind_mask(cols.kind, DEVICE_KINDS)
    pid[device] = cols.col("device_index")[device]
    tid[device] = _device_tid(cols)[device]
    overhead = cols.kind == int(EventKind.OVERHEAD)
    pid[overhead] = -1
    tid[overhead] = 0
    return pid, tid


def _ac2g_flows(cols: _Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flow id, type and start flag per event, adding CPU->device flows Kineto draws.

    Explicit ``flow_*`` columns win. A device activity without one gets an
    ``ac2g`` flow to the runtime call with the same correlation id (or the
    driver call, when no runtime call has it).
    """
    flow_id = cols.col("flow_id").astype(np.int64).copy()
    flow_type = cols.col("flow_type").astype(np.int64).copy()
    flow_start = cols.col("flow_start").astype(bool).copy()
    corr = cols.col("correlation_id")
    launched = _kind_mask(cols.kind, (EventKind.KERNEL, EventKind.GPU_MEMCPY, EventKind.GPU_MEMSET))
    launched &= (flow_id == 0) & (corr != 0)
    if not launched.any():
        return flow_id, flow_type, flow_start
    runtime = (cols.kind == int(EventKind.RUNTIME)) & (flow_id == 0) & (corr != 0)
    # A driver call launches when no runtime call carries its id (cuLaunchKernel called directly,
    # or a backend that records driver calls only), as Kineto draws it.
    driver = (cols.kind == int(EventKind.DRIVER)) & (flow_id == 0) & (corr != 0)
    if driver.any():
        runtime = runtime | (driver & ~np.isin(corr, corr[runtime]))
    linked_corr = np.intersect1d(corr[launched], corr[runtime])
    if not len(linked_corr):
        return flow_id, flow_type, flow_start
    ends = launched & np.isin(corr, linked_corr)
    starts = runtime & np.isin(corr, linked_corr)
    # One start per correlation id: the first runtime call carrying it.
    start_idx = np.flatnonzero(starts)
    _, first = np.unique(corr[start_idx], return_index=True)
    starts = np.zeros(cols.n, dtype=bool)
    starts[start_idx[first]] = True
    for mask, is_start in ((ends, False), (starts, True)):
        flow_id[mask] = corr[mask]
        flow_type[mask] = FLOW_AC2G
        flow_start[mask] = is_start
    return flow_id, flow_type, flow_start


# ------------------------------------------------------------------ writer


def _metadata_event_text(
    name: str, ts: str, pid: Any, tid: Any, key: str, value: str, layout: KinetoLayout = NEWEST_LAYOUT
) -> str:
    head = f'"ph": "M", "name": "{name}"' if layout.metadata_first else f'"name": "{name}", "ph": "M"'
    return f'  {{{head}, "ts": {ts}, "pid": {pid}, "tid": {tid}, "args": {{"{key}": {value}}}}}'


def _unique_pairs(first: np.ndarray, second: np.ndarray) -> list[tuple[int, int]]:
    """Sorted distinct (first, second) pairs (1-D uniques: much faster than ``unique(axis=0)``)."""
    pairs: list[tuple[int, int]] = []
    for value in np.unique(first).tolist():
        pairs.extend((value, other) for other in np.unique(second[first == value]).tolist())
    return pairs


def _lane_metadata(
    cols: _Columns, pid: np.ndarray, tid: np.ndarray, trace: Trace, ts: str, layout: KinetoLayout
) -> list[str]:
    """process_name / labels / sort index and thread_name / sort index events."""
    lines: list[str] = []

    def meta(name: str, ts: str, pid: int, tid: int, key: str, value: str) -> str:
        return _metadata_event_text(name, ts, pid, tid, key, value, layout=layout)

    host = _kind_mask(cols.kind, HOST_KINDS)
    # The Python frames of a thread torch never saw run (one blocked in a wait all along) come
    # with tid 0. torch 2.6 and 2.7 put them on pid 0 and name that thread but not the process;
    # 2.8+ put them on the process and name neither (2.12+: thread id 2**64 - 1 in events()).
    host_pids = sorted((set(np.unique(pid[host]).tolist()) | {trace.pid}) - {0})
    for p in host_pids:
        lines.append(meta(PROCESS_NAME, ts, p, 0, "name", '"python"'))
        lines.append(meta(PROCESS_LABELS, ts, p, 0, "labels", '"CPU"'))
        lines.append(meta(PROCESS_SORT_INDEX, ts, p, 0, "sort_index", str(p)))
    if host.any():
        for p, t in _unique_pairs(pid[host], tid[host]):
            if t == 0 and p != 0:
                continue
            lines.append(meta(THREAD_NAME, ts, p, t, "name", json_string(f"thread {t} (python)")))
            lines.append(meta(THREAD_SORT_INDEX, ts, p, t, "sort_index", str(t)))
    device = _kind_mask(cols.kind, DEVICE_KINDS)
    device_type = cols.col("device_type").astype(np.int64)
    # A device's counters sit in its process, which gets the device's name even without activity.
    device_process = device | ((cols.kind == int(EventKind.COUNTER)) & (device_type != int(DeviceType.CPU)))
    if device_process.any():
        named: set[int] = set()
        for index, dtype in _unique_pairs(pid[device_process], device_type[device_process]):
            if index in named:
                log.warning("chrome_trace_device_lane_shared", device_index=index)
                continue
            named.add(index)
            label = device_names(dtype)[1]
            lines.append(meta(PROCESS_NAME, ts, index, 0, "name", json_string(f"{label} {index}")))
            gpu_label = GPU_LANE_LABEL if label in GPU_LANE_NAMES else label
            lines.append(meta(PROCESS_LABELS, ts, index, 0, "labels", json_string(f"{gpu_label} {index}")))
            lines.append(
                meta(PROCESS_SORT_INDEX, ts, index, 0, "sort_index", str(DEVICE_SORT_INDEX_BASE + index))
            )
        for p, t in _unique_pairs(pid[device], tid[device]):
            lines.append(meta(THREAD_NAME, ts, p, t, "name", json_string(f"stream {t}")))
            lines.append(meta(THREAD_SORT_INDEX, ts, p, t, "sort_index", str(t)))
    if (cols.kind == int(EventKind.OVERHEAD)).any():
        lines.append(meta(PROCESS_NAME, ts, -1, 0, "name", '"Overhead"'))
        lines.append(meta(PROCESS_SORT_INDEX, ts, -1, 0, "sort_index", str(OVERHEAD_SORT_INDEX)))
    return lines


@attrs.frozen
class _ChunkFields:
    """What every line of one chunk (events ``lo`` to ``hi - 1``) is written from."""

    lo: int
    hi: int
    instant: np.ndarray
    counter: np.ndarray
    slices: np.ndarray
    category: np.ndarray
    name: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ts_us: np.ndarray
    ts_ns: np.ndarray
    dur_us: np.ndarray
    dur_ns: np.ndarray


#: The compiled formatter's segment kinds (native/chrome_lines.cpp).
_LITERAL, _INTEGER, _MILLIS, _TABLE = 0, 1, 2, 3
#: Kineto's flow types, sorted, and their category (and name) as the formatter's table.
_FLOW_TYPES = sorted(FLOW_CATEGORY_BY_TYPE)
_FLOW_NAMES = [FLOW_CATEGORY_BY_TYPE[flow_type].encode() for flow_type in _FLOW_TYPES]


def _line_formatter() -> Any:
    """The compiled formatter's ``format_rows`` where it is built and chosen, else None.

    It is part of the compiled reader's module (``POLYPROF_KINETO_READER`` chooses both). The
    export never builds it, nor imports torch for it: the module links torch's libraries.
    """
    if "torch" not in sys.modules:
        return None
    module = native_reader.built_module()
    return getattr(module, "format_rows", None) if module is not None else None


def _utf8(texts: Sequence[str]) -> list[bytes]:
    return [text.encode() for text in texts]


def _int64(values: np.ndarray) -> np.ndarray:
    # the batch's columns are int64 or int32 by schema (events.FIELDS): exact either way
    return np.ascontiguousarray(values, dtype=np.int64)


def _table_index(index: np.ndarray, size: int) -> np.ndarray:
    """Indices into a table of ``size`` entries, -1 (Python's last entry) made explicit."""
    index = _int64(index)
    return np.where(index < 0, index + size, index)


def _microseconds_segments(
    key: bytes, us: np.ndarray, ns: np.ndarray, mask: np.ndarray
) -> list[tuple[int, Any, Any, Any]]:
    """``<key><us>.<ns, three digits>`` in the rows of ``mask``: how every ``ts`` and ``dur`` is written."""
    return [
        (_LITERAL, key, None, mask),
        (_INTEGER, _int64(us), None, mask),
        (_LITERAL, b".", None, mask),
        (_MILLIS, _int64(ns), None, mask),
    ]


def _lane_and_time_segments(fields: _ChunkFields, mask: np.ndarray) -> list[tuple[int, Any, Any, Any]]:
    """``, "pid": <pid>, "tid": <tid>, "ts": <ts>`` in the rows of ``mask``, as slices and flows have it."""
    return [
        (_LITERAL, b', "pid": ', None, mask),
        (_INTEGER, _int64(fields.pid), None, mask),
        (_LITERAL, b', "tid": ', None, mask),
        (_INTEGER, _int64(fields.tid), None, mask),
        *_microseconds_segments(b', "ts": ', fields.ts_us, fields.ts_ns, mask),
    ]


def _positions(rows: np.ndarray, count: int) -> np.ndarray:
    """A column of ``count`` rows holding, at ``rows[k]``, ``k``: row k of a table built for ``rows``."""
    positions = np.zeros(count, dtype=np.int64)
    positions[rows] = np.arange(len(rows), dtype=np.int64)
    return positions


class _EventText:
    """The text of events, one chunk at a time; a flow event follows its slice.

    The constructor does the whole-trace numpy work (categories, args inputs,
    flows); ``chunk`` builds the per-event strings of one range only.
    """

    def __init__(
        self,
        cols: _Columns,
        base_ns: int,
        pid: np.ndarray,
        tid: np.ndarray,
        layout: KinetoLayout = NEWEST_LAYOUT,
    ) -> None:
        self.cols = cols
        self.base_ns = base_ns
        self.pid = pid
        self.tid = tid
        category_table, self.category_index = _categories(cols)
        self.x_prefixes = [f'  {{"ph": "X", "cat": {json_string(cat)}, "name": ' for cat in category_table]
        self.i_prefixes = [
            f'  {{"ph": "i", "cat": {json_string(cat)}, "s": "t", "name": ' for cat in category_table
        ]
        self.names = [json_string(trace_name(str(name), layout)) for name in cols.batch.table("name")]
        self.name_index = (
            _names_with_overloads(cols, self.names)
            if layout.overload_in_names
            else cols.col("name").astype(np.int64)
        )
        self.names.append('""')  # index -1 reads the last slot
        self.args = _ArgsText(cols, layout)
        self.instant = _kind_mask(cols.kind, (EventKind.MEMORY, EventKind.OUT_OF_MEMORY))
        self.counter = cols.kind == int(EventKind.COUNTER)
        self.counter_series: list[str] = []
        if self.counter.any():
            self.counter_series = [json_string(str(series)) for series in cols.batch.table("counter_series")]
            self.counter_series.append(json_string(DEFAULT_COUNTER_SERIES))  # index -1 reads the last slot
        # Kineto moves GPU user annotations 1 ns earlier and 2 ns longer so they
        # enclose the kernels they start with in Chrome's nesting.
        gpu_annotation = cols.kind == int(EventKind.GPU_USER_ANNOTATION)
        self.gpu_annotation = gpu_annotation if gpu_annotation.any() else None

        flow_id, flow_type, flow_start = _ac2g_flows(cols)
        known = np.isin(flow_type, list(FLOW_CATEGORY_BY_TYPE))
        unknown_flows = int(((flow_id > 0) & ~known).sum())
        if unknown_flows:
            log.warning("chrome_trace_unknown_flow_type", events=unknown_flows)
        self.flows = np.flatnonzero((flow_id > 0) & known)  # sorted: a chunk's flows are one slice
        self.flow_id = flow_id[self.flows]
        self.flow_type = flow_type[self.flows]
        self.flow_start = flow_start[self.flows]
        self.formatter = _line_formatter()
        self._encoded: dict[str, list[bytes]] = {}  # the tables the formatter reads, as UTF-8, once

    def chunk(self, lo: int, hi: int) -> str | bytes:
        """Events ``lo`` to ``hi - 1``: their lines, each followed by a comma and a newline.

        UTF-8 bytes where the compiled formatter writes the chunk's standard op lines, else text;
        both are the same characters (tests/test_chrome_lines.py).
        """
        fields = self._fields(lo, hi)
        # Ops and annotations with Kineto's standard args (the bulk of most traces): line and args
        # together (``_op_lines`` or the compiled formatter), the others through ``_ArgsText.chunk``.
        standard_ops = fields.slices & (self.args.form[lo:hi] == _ArgsForm.OP_STANDARD)
        lines_arr = self._other_lines(fields, standard_ops)
        if self.formatter is not None and standard_ops.any():
            try:
                return self._formatted(fields, standard_ops, lines_arr)
            except Exception as exc:  # noqa: BLE001 - the f-strings write the same lines
                log.warning("chrome_line_formatter_failed_writing_in_python", reason=repr(exc))
                self.formatter = None
        flows = self._flow_suffixes(fields)
        idx = np.flatnonzero(standard_ops)
        if len(idx):
            lines_arr[idx] = self._op_lines(
                idx + lo,
                *(
                    getattr(fields, c)[idx]
                    for c in ("category", "name", "pid", "tid", "ts_us", "ts_ns", "dur_us", "dur_ns")
                ),
            )
        lines: list[str] = lines_arr.tolist()
        del lines_arr
        for i, suffix in flows:
            lines[i] = f"{lines[i]}{suffix}"
        return ",\n".join(lines) + ",\n"

    def _fields(self, lo: int, hi: int) -> _ChunkFields:
        cols = self.cols
        instant = self.instant[lo:hi]
        counter = self.counter[lo:hi]
        start = cols.col("start_ns")[lo:hi].astype(np.int64) - self.base_ns
        dur = cols.col("dur_ns")[lo:hi].astype(np.int64)
        if self.gpu_annotation is not None:
            annotation = self.gpu_annotation[lo:hi]
            start = np.where(annotation, start - 1, start)
            dur = np.where(annotation, dur + 2, dur)
        start = np.maximum(start, 0)
        dur = np.maximum(dur, 0)
        ts_us, ts_ns = np.divmod(start, 1000)
        dur_us, dur_ns = np.divmod(dur, 1000)
        return _ChunkFields(
            lo=lo,
            hi=hi,
            instant=instant,
            counter=counter,
            slices=~instant & ~counter,
            category=self.category_index[lo:hi],
            name=self.name_index[lo:hi],
            pid=self.pid[lo:hi],
            tid=self.tid[lo:hi],
            ts_us=ts_us,
            ts_ns=ts_ns,
            dur_us=dur_us,
            dur_ns=dur_ns,
        )

    def _other_lines(self, fields: _ChunkFields, standard_ops: np.ndarray) -> np.ndarray:
        """An object array of the chunk's lines, filled except where ``standard_ops`` is set."""
        cols, lo, hi = self.cols, fields.lo, fields.hi
        category, name, pid, tid = fields.category, fields.name, fields.pid, fields.tid
        ts_us, ts_ns, dur_us, dur_ns = fields.ts_us, fields.ts_ns, fields.dur_us, fields.dur_ns
        names, ms = self.names, _THREE_DIGITS
        lines_arr = np.empty(hi - lo, dtype=object)
        args = self.args.chunk(lo, hi, skip=standard_ops) if not standard_ops.all() else []
        idx = np.flatnonzero(fields.slices & ~standard_ops)
        if len(idx):
            prefixes = self.x_prefixes
            lines_arr[idx] = [
                f'{prefixes[c]}{names[nm]}, "pid": {p}, "tid": {t}, '
                f'"ts": {tu}.{ms[tn]}, "dur": {du}.{ms[dn]}{args[i]}}}'
                for i, c, nm, p, t, tu, tn, du, dn in zip(
                    idx.tolist(),
                    category[idx].tolist(),
                    name[idx].tolist(),
                    pid[idx].tolist(),
                    tid[idx].tolist(),
                    ts_us[idx].tolist(),
                    ts_ns[idx].tolist(),
                    dur_us[idx].tolist(),
                    dur_ns[idx].tolist(),
                )
            ]
        idx = np.flatnonzero(fields.instant)
        if len(idx):
            prefixes = self.i_prefixes
            lines_arr[idx] = [
                f'{prefixes[c]}{names[nm]}, "pid": {p}, "tid": {t}, "ts": {tu}.{ms[tn]}{args[i]}}}'
                for i, c, nm, p, t, tu, tn in zip(
                    idx.tolist(),
                    category[idx].tolist(),
                    name[idx].tolist(),
                    pid[idx].tolist(),
                    tid[idx].tolist(),
                    ts_us[idx].tolist(),
                    ts_ns[idx].tolist(),
                )
            ]
        idx = np.flatnonzero(fields.counter)
        if len(idx):
            series = self.counter_series
            lines_arr[idx] = [
                f'  {{"ph": "C", "name": {names[nm]}, "pid": {p}, "tid": {t}, "ts": {tu}.{ms[tn]}, '
                f'"args": {{{series[sr]}: {_json_number(v)}}}}}'
                for nm, p, t, tu, tn, sr, v in zip(
                    name[idx].tolist(),
                    pid[idx].tolist(),
                    tid[idx].tolist(),
                    ts_us[idx].tolist(),
                    ts_ns[idx].tolist(),
                    cols.col("counter_series")[lo:hi][idx].tolist(),
                    cols.col("counter_value")[lo:hi][idx].tolist(),
                )
            ]
        return lines_arr

    def _flow_suffixes(self, fields: _ChunkFields) -> list[tuple[int, str]]:
        """(row in the chunk, text) of each flow event: it follows its slice's line."""
        first, last = np.searchsorted(self.flows, (fields.lo, fields.hi)).tolist()
        idx = self.flows[first:last] - fields.lo
        ms = _THREE_DIGITS
        suffixes = []
        # "s" binds to the enclosing slice; "f" with "bp": "e" to the enclosing one too.
        for i, fid, ftype, starts, p, t, tu, tn in zip(
            idx.tolist(),
            self.flow_id[first:last].tolist(),
            self.flow_type[first:last].tolist(),
            self.flow_start[first:last].tolist(),
            fields.pid[idx].tolist(),
            fields.tid[idx].tolist(),
            fields.ts_us[idx].tolist(),
            fields.ts_ns[idx].tolist(),
        ):
            flow = FLOW_CATEGORY_BY_TYPE[ftype]
            phase, binding = ("s", "") if starts else ("f", ', "bp": "e"')
            text = (
                f',\n  {{"ph": "{phase}", "id": {fid}, "pid": {p}, "tid": {t}, "ts": {tu}.{ms[tn]}, '
                f'"cat": "{flow}", "name": "{flow}"{binding}}}'
            )
            suffixes.append((i, text))
        return suffixes

    def _encoded_table(self, key: str, texts: Sequence[str]) -> list[bytes]:
        if key not in self._encoded:
            self._encoded[key] = _utf8(texts)
        return self._encoded[key]

    def _formatted(
        self,
        fields: _ChunkFields,
        standard_ops: np.ndarray,
        other_lines: np.ndarray,
    ) -> bytes:
        """The chunk as UTF-8, its standard op lines written by the compiled formatter.

        The same text as ``_op_lines`` and ``_flow_suffixes`` (segment by segment, in their order);
        the other lines, built in Python, go in as a table.
        """
        assert self.formatter is not None
        args, cols, lo, hi = self.args, self.cols, fields.lo, fields.hi
        count = hi - lo
        prefixes = self._encoded_table("prefixes", self.x_prefixes)
        names = self._encoded_table("names", self.names)
        events = slice(lo, hi)
        correlation = _int64(cols.col("correlation_id")[events])
        sequence = _int64(cols.col("sequence_nr")[events])
        has_ext = standard_ops & (correlation != 0)
        no_ext = standard_ops & (correlation == 0)
        has_seq = standard_ops & (sequence >= 0)
        segments: list[tuple[int, Any, Any, Any]] = [
            (_TABLE, _table_index(fields.category, len(prefixes)), prefixes, standard_ops),
            (_TABLE, _table_index(fields.name, len(names)), names, standard_ops),
            *_lane_and_time_segments(fields, standard_ops),
            *_microseconds_segments(b', "dur": ', fields.dur_us, fields.dur_ns, standard_ops),
            (_LITERAL, _EXTERNAL_ID_HEAD.encode(), None, has_ext),
            (_INTEGER, correlation, None, has_ext),
            (_LITERAL, _OP_ARGS_TAIL.encode(), None, has_ext),
            (_LITERAL, _OP_ARGS_HEAD.encode(), None, no_ext),
            (_LITERAL, _SEQUENCE_NUMBER.encode(), None, has_seq),
            (_INTEGER, sequence, None, has_seq),
            (_LITERAL, _FWD_THREAD_ID.encode(), None, has_seq),
            (_INTEGER, _int64(cols.col("fwd_thread")[events]), None, has_seq),
        ]
        for table, field in ((args.shapes_args, "shapes"), (args.stack_args, "stack")):
            if table is not None:
                encoded = self._encoded_table(field, table)
                segments.append(
                    (_TABLE, _table_index(cols.col(field)[events], len(encoded)), encoded, standard_ops)
                )
        segments += [
            (_LITERAL, args.ev_idx_head.encode(), None, standard_ops),
            (_INTEGER, _int64(args.ev_idx[events]), None, standard_ops),
            (_LITERAL, b"}}", None, standard_ops),
        ]
        others = ~standard_ops
        if others.any():
            other_rows = np.flatnonzero(others)
            segments.append(
                (_TABLE, _positions(other_rows, count), _utf8(other_lines[other_rows].tolist()), others)
            )
        segments += self._flow_segments(fields)
        segments.append((_LITERAL, b",\n", None, None))
        return self.formatter(count, segments)

    def _flow_segments(self, fields: _ChunkFields) -> list[tuple[int, Any, Any, Any]]:
        """The flow events of the chunk as the formatter's segments: ``_flow_suffixes``' text."""
        first, last = np.searchsorted(self.flows, (fields.lo, fields.hi)).tolist()
        if first == last:
            return []
        count = fields.hi - fields.lo
        rows = self.flows[first:last] - fields.lo
        has_flow = np.zeros(count, dtype=bool)
        has_flow[rows] = True
        finishes = np.zeros(count, dtype=bool)
        finishes[rows] = self.flow_start[first:last] == 0
        flow_id = np.zeros(count, dtype=np.int64)
        flow_id[rows] = self.flow_id[first:last]
        category = np.zeros(count, dtype=np.int64)
        category[rows] = np.searchsorted(_FLOW_TYPES, self.flow_type[first:last])  # known types only
        names = _FLOW_NAMES
        return [
            (_LITERAL, b',\n  {"ph": "', None, has_flow),
            (_TABLE, finishes.astype(np.int64), [b"s", b"f"], has_flow),
            (_LITERAL, b'", "id": ', None, has_flow),
            (_INTEGER, flow_id, None, has_flow),
            *_lane_and_time_segments(fields, has_flow),
            (_LITERAL, b', "cat": "', None, has_flow),
            (_TABLE, category, names, has_flow),
            (_LITERAL, b'", "name": "', None, has_flow),
            (_TABLE, category, names, has_flow),
            (_LITERAL, b'"', None, has_flow),
            (_LITERAL, b', "bp": "e"', None, finishes),
            (_LITERAL, b"}", None, has_flow),
        ]

    def _op_lines(
        self,
        events: np.ndarray,
        category: np.ndarray,
        name: np.ndarray,
        pid: np.ndarray,
        tid: np.ndarray,
        ts_us: np.ndarray,
        ts_ns: np.ndarray,
        dur_us: np.ndarray,
        dur_ns: np.ndarray,
    ) -> list[str]:
        """Lines of ops and annotations with Kineto's standard args (``_ArgsText._op_standard``'s text).

        One f-string per event builds the line and its args together: no per-event args
        string to make, concatenate and keep apart.
        """
        args, cols = self.args, self.cols
        prefixes, names, ms = self.x_prefixes, self.names, _THREE_DIGITS
        ext, record, no_ext = _EXTERNAL_ID_HEAD, _OP_ARGS_TAIL, _OP_ARGS_HEAD
        seq, fwd, ev_idx_head = _SEQUENCE_NUMBER, _FWD_THREAD_ID, args.ev_idx_head
        dims = args.optional_text(args.shapes_args, "shapes", events)
        stacks = args.optional_text(args.stack_args, "stack", events)
        return [
            f'{prefixes[c]}{names[nm]}, "pid": {p}, "tid": {t}, "ts": {tu}.{ms[tn]}, "dur": {du}.{ms[dn]}'
            f"{ext if x else no_ext}{x if x else ''}{record if x else ''}"
            f"{seq if q >= 0 else ''}{q if q >= 0 else ''}{fwd if q >= 0 else ''}{f if q >= 0 else ''}"
            f"{d}{st}{ev_idx_head}{e}}}}}"
            for c, nm, p, t, tu, tn, du, dn, x, q, f, d, st, e in zip(
                category.tolist(),
                name.tolist(),
                pid.tolist(),
                tid.tolist(),
                ts_us.tolist(),
                ts_ns.tolist(),
                dur_us.tolist(),
                dur_ns.tolist(),
                cols.col("correlation_id")[events].tolist(),
                cols.col("sequence_nr")[events].tolist(),
                cols.col("fwd_thread")[events].tolist(),
                dims,
                stacks,
                args.ev_idx[events].tolist(),
            )
        ]


def _json_number(value: float) -> str:
    """A counter value as JSON: integral values without ".0"; NaN and infinities (not JSON) as null."""
    if not math.isfinite(value):
        return "null"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def _names_with_overloads(cols: _Columns, names: list[str]) -> np.ndarray:
    """Per-event index into ``names``, adding ``"aten::add.Tensor"`` where an op has an overload name.

    torch's writer names ops ``<name>.<overload>`` when ``capture_overload_names``
    recorded one (``events()`` keeps them apart: ``name`` and ``overload_name``).
    The JSON of each new (name, overload) pair is appended to ``names``.
    """
    name_index = cols.col("name").astype(np.int64)
    if not cols.has("overload"):
        return name_index
    overloads = cols.batch.table("overload")
    overload = cols.col("overload").astype(np.int64)
    named = np.flatnonzero((overload >= 0) & (name_index >= 0))
    if not len(named):
        return name_index
    table = cols.batch.table("name")
    pairs = name_index[named] * len(overloads) + overload[named]
    unique_pairs, inverse = np.unique(pairs, return_inverse=True)
    new_index = np.empty(len(unique_pairs), dtype=np.int64)
    for j, pair in enumerate(unique_pairs.tolist()):
        nm, ov = divmod(pair, len(overloads))
        if overloads[ov]:
            new_index[j] = len(names)
            names.append(json_string(f"{table[nm]}.{overloads[ov]}"))
        else:
            new_index[j] = nm
    name_index = name_index.copy()
    name_index[named] = new_index[inverse.reshape(-1)]
    return name_index


def _event_lines(
    cols: _Columns, base_ns: int, pid: np.ndarray, tid: np.ndarray, layout: KinetoLayout = NEWEST_LAYOUT
) -> Iterator[str | bytes]:
    """The text of every event, in batch order, ``CHUNK_EVENTS`` events per chunk.

    Each chunk is its events' lines, each followed by a comma and a newline.
    Per-event strings exist for one chunk at a time, so the extra memory of an
    export is bounded by the chunk size, not by the trace.
    """
    if cols.n == 0:
        return
    text = _EventText(cols, base_ns, pid, tid, layout)
    for lo in range(0, cols.n, CHUNK_EVENTS):
        yield text.chunk(lo, min(lo + CHUNK_EVENTS, cols.n))


def _trace_base_ns(trace: Trace) -> int:
    """The base time: a trimonth boundary at or before every timestamp written."""
    candidates = [t for t in (trace.start_ns,) if t > 0]
    if len(trace.events):
        candidates.append(int(trace.events["start_ns"].min()))
    earliest = min(candidates) if candidates else time.time_ns()
    return trimonth_base_ns(max(earliest, 0))


def _kept_by_activity_filter(events: EventBatch, cpu_filter: frozenset[str] | None) -> EventBatch:
    """The events a ``{ProfilerActivity.CPU: [...]}`` filter lets into the trace, as torch's writer does.

    torch's collector still reports every op to ``events()`` under a filter;
    only Kineto's trace leaves out the CPU-group activity types not named.
    """
    if cpu_filter is None or not len(events):
        return events
    table, index = _categories(_Columns(events))
    dropped = [i for i, cat in enumerate(table) if cat.upper() in set(CPU_GROUP_ACTIVITY_TYPES) - cpu_filter]
    if not dropped:
        return events
    return events.take(~np.isin(index, dropped))


def render_chrome_trace(trace: Trace, trace_name: str, layout: KinetoLayout | None = None) -> Iterator[str]:
    """The Chrome trace JSON of ``trace``, as text chunks to concatenate.

    ``trace_name`` is written as the ``traceName`` key (Kineto writes the
    output path there). ``layout`` defaults to the installed torch's.
    """
    for chunk in _trace_chunks(trace, trace_name, layout):
        yield chunk if isinstance(chunk, str) else chunk.decode()


def chrome_trace_bytes(trace: Trace, trace_name: str, layout: KinetoLayout | None = None) -> bytes:
    """The whole Chrome trace JSON of ``trace`` as UTF-8, as ``write_chrome_trace`` writes it."""
    return b"".join(c.encode() if isinstance(c, str) else c for c in _trace_chunks(trace, trace_name, layout))


def _trace_chunks(trace: Trace, trace_name: str, layout: KinetoLayout | None) -> Iterator[str | bytes]:
    """``render_chrome_trace``'s chunks, the event lines as UTF-8 where the compiled formatter wrote them."""
    if layout is None:
        layout = kineto_layout()
    events = _kept_by_activity_filter(trace.events, trace.config.activity_filters.get(ProfilerActivity.CPU))
    cols = _Columns(events)
    base_ns = _trace_base_ns(trace)
    time_keys = ['  "displayTimeUnit": "ms",', f'  "baseTimeNanoseconds": {base_ns},']
    header = ["{", '  "schemaVersion": 1,']
    header.append(f'  "deviceProperties": {_json_value([dict(p) for p in trace.device_properties])},')
    header.extend(f"  {json_string(key)}: {value}," for key, value in _metadata_entries(trace, layout))
    if layout.time_keys_first:
        header.extend(time_keys)
    header.append('  "traceEvents": [')
    yield "\n".join(header) + "\n"

    start_ns = (
        trace.start_ns if trace.start_ns > 0 else (int(events["start_ns"].min()) if cols.n else base_ns)
    )
    end_ns = max(trace.end_ns, start_ns)
    last_event_end = int((events["start_ns"] + np.maximum(events["dur_ns"], 0)).max()) if cols.n else 0
    span_ts = format_us(start_ns - base_ns)
    span_dur = format_us(end_ns - start_ns)
    window_ts = format_us(max(end_ns, last_event_end) - base_ns)
    pid, tid = _lanes(cols)

    metadata = _lane_metadata(cols, pid, tid, trace, span_ts, layout)
    if metadata and layout.metadata_first:
        yield ",\n".join(metadata) + ",\n"
    yield from _event_lines(cols, base_ns, pid, tid, layout)
    if metadata and not layout.metadata_first:
        yield ",\n".join(metadata) + ",\n"
    chunk: list[str] = []
    span_cat, span_name, op_count = json_string(SPAN_CATEGORY), json_string(SPAN_NAME), _key(Arg.OP_COUNT)
    if layout.metadata_first:
        chunk.append(
            f'  {{"ph": "X", "cat": {span_cat}, "name": {span_name}, "pid": "Spans", '
            f'"tid": "PyTorch Profiler", "ts": {span_ts}, "dur": {span_dur}, "args": {{{op_count}0}}}}'
        )
    else:
        chunk.append(
            f'  {{"ph": "X", "cat": {span_cat}, "ts": {span_ts}, "dur": {span_dur}, "pid": "Spans", '
            f'"tid": "PyTorch Profiler", "name": {span_name}, "args": {{{op_count}0}}}}'
        )
    chunk.append(
        _metadata_event_text(
            PROCESS_SORT_INDEX, span_ts, '"Spans"', 0, "sort_index", str(SPANS_SORT_INDEX), layout=layout
        )
    )
    for name, pid_text, tid_text, ts in (
        (ITERATION_START_NAME, '"Traces"', '"Trace PyTorch Profiler"', span_ts),
        (WINDOW_END_NAME, '""', '""', window_ts),
    ):
        head = (
            f'"ph": "i", "s": "g", "name": "{name}"'
            if layout.metadata_first
            else f'"name": "{name}", "ph": "i", "s": "g"'
        )
        chunk.append(f'  {{{head}, "pid": {pid_text}, "tid": {tid_text}, "ts": {ts}}}')
    yield ",\n".join(chunk) + "\n"
    tail = f'  ],\n  "traceName": {json_string(trace_name)}'
    if not layout.time_keys_first:
        tail = ",\n".join([tail, *(key.rstrip(",") for key in time_keys)])
    yield tail + "\n}\n"


def write_chrome_trace(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    gzip_level: int | None = None,
    layout: KinetoLayout | None = None,
) -> str:
    """Write ``trace`` as Kineto-shaped Chrome trace JSON at ``path``, atomically.

    A path ending in ``.gz`` is gzip-compressed. The path is checked before any
    work is done; on any error nothing is left at ``path`` (an existing file is
    kept as it was). ``layout`` defaults to the installed torch's. Returns the
    path written.
    """
    path = check_writable_path(path)
    started = time.perf_counter()
    with atomic_writer(path, binary=True, gzip_level=gzip_level) as out:
        for chunk in _trace_chunks(trace, path, layout):
            out.write(chunk.encode() if isinstance(chunk, str) else chunk)
    log.debug(
        "chrome_trace_written",
        path=path,
        events=len(trace.events),
        seconds=round(time.perf_counter() - started, 3),
    )
    return path


class ChromeTraceExporter(Exporter):
    """Writes Kineto-shaped Chrome trace JSON (``.json``, or gzip for ``.json.gz``).

    Options: ``gzip_level`` (0-9) for ``.gz`` paths.
    """

    name = EXPORTER_NAME
    suffixes = (".json", ".json.gz")

    def export(self, trace: Trace, path: str, **options: Any) -> str:
        unknown = sorted(set(options) - set(VALID_OPTIONS))
        if unknown:
            raise TypeError(
                f"unknown option(s) {unknown} for the {EXPORTER_NAME!r} exporter; "
                f"valid options: {list(VALID_OPTIONS)}"
            )
        check_export_suffix(EXPORTER_NAME, path)  # t.parquet is refused, pointing to "parquet"
        return write_chrome_trace(trace, path, gzip_level=options.get("gzip_level"))


# -------------------------------------------------------------------- hooks


@hookimpl(trylast=True)
def polyprof_make_exporter(config: ProfileConfig, name: str) -> Exporter | None:
    return ChromeTraceExporter() if name == EXPORTER_NAME else None


@hookimpl(trylast=True)
def polyprof_capabilities() -> Capabilities:
    return Capabilities(exporters=(EXPORTER_NAME,))


# Its own names only: the layout and time helpers it uses are polyprof.base.kineto_format's.
__all__ = [
    "ChromeTraceExporter",
    "chrome_trace_bytes",
    "render_chrome_trace",
    "write_chrome_trace",
]
