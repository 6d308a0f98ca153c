"""torch's ``FunctionEvent`` semantics for a finished trace, column-wise.

``EventTree.from_trace(trace, use_device=...)`` computes, with numpy and no
Python loop per event, what torch 2.13's ``profile._parse_kineto_results``
followed by ``EventList._build_tree`` computes one Python object at a time
(75-120 µs per event):

1. **Rows.** Every event except torch's utility names (``_filter_name``:
   ``[memory]``, ``[OutOfMemory]``, ``profiler::_record_function_*``,
   ``aten::is_leaf``, ``aten::output_nr``, ``aten::_version``) becomes a row,
   then one synthetic top-level row per memory record that no CPU-side row's
   interval covered, then one per out-of-memory record (ids continue after the
   largest correlation id). Rows are sorted by ``[start_us, -end_us]``, stably.
2. **Names.** ``key`` is the name demangled (``torch._C._demangle``, names
   longer than one character; see ``rewrite_name``) with ``ProfilerStep#N``
   rewritten to ``ProfilerStep*``; ``trace_name`` keeps ``ProfilerStep#N``.
3. **Times.** ``start_us = (start_ns - trace.start_ns) / 1000`` in float64,
   exactly torch's ``rel_ns / 1000``; elapsed is ``end_us - start_us``.
4. **Memory.** A CPU-side row gets every memory record (any thread) whose time
   lies in ``[start_ns, end_ns]`` (``MemRecordsAcc.in_interval``): cumulative
   sums over the records sorted by time plus two ``searchsorted``.
   Attributes only event views need (ids, flows, sequence numbers, ...) are
   ``LAZY_COLUMNS``, read on first use, so a table never decodes the columns
   a tracer deferred.
5. **Device work.** Device rows (kernel, memcpy, memset on CUDA, XPU or
   PrivateUse1) whose ``linked_correlation_id`` names a synchronous CPU row's
   id become that row's kernels; CPU-side rows with a link (runtime calls) take
   the launching row's thread. Synchronization rows are never device time nor
   kernels, and overhead rows are host rows (Kineto's ``deviceTypeFromActivity``).
   Unlinked runtime, driver and overhead rows carry a tracer's own record id
   (CUPTI/PTI correlation id), which can equal a torch op id: those rows launch
   what links to that id only when torch's collector produced them and the
   installed release's rules say so (``_foreign_id_launchers``).
6. **Parents** (``_populate_cpu_children``): per thread, over synchronous CPU
   rows in row order, torch's stack walk makes row ``e``'s parent the nearest
   earlier row ``x`` with ``end[x] >= end[e]`` and ``end[x] > start[e]``;
   ``_previous_reaching`` finds it by pointer doubling over candidate links,
   so partially overlapping ranges get torch's answer too.
7. **Duplicates** (``_remove_dup_nodes``): a row whose parent has the same key
   and no other child is removed; the chain's top row takes the bottom row's
   children and kernels.
8. **Backward stacks** (``_set_backward_stacktraces``): rows under a backward
   function (scope 1) take the stack of the first forward row with the same
   ``(sequence_nr, thread)`` as that function's ``(sequence_nr, fwd_thread)``.
9. **Totals.** Self times and device totals are sums over children in row
   order, computed the way CPython's ``sum`` computes them (sequential before
   3.12, Neumaier-compensated from 3.12), so every float is bit-identical to
   torch's and tables print the same digits.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from polyprof.base import torch_support
from polyprof.base.activity import DEVICES, USE_DEVICES, use_device_for_activities
from polyprof.base.events import (
    API_CALL_KINDS,
    FIELDS,
    DeviceType,
    EventBatch,
    EventKind,
    Interner,
    kind_codes,
)
from polyprof.base.log import get_logger
from polyprof.base.trace import Trace

if TYPE_CHECKING:
    from polyprof.base.config import ProfileConfig

log = get_logger(__name__)

__all__ = [
    "FILTERED_NAMES",
    "LAZY_COLUMNS",
    "MEMORY_EVENT_NAME",
    "OUT_OF_MEMORY_EVENT_NAME",
    "VALID_USE_DEVICES",
    "EventTree",
    "MergedTrace",
    "PostProcessingRules",
    "filter_stack_entry",
    "nesting_parents",
    "post_processing_rules",
    "python_sum_by_segment",
    "rewrite_name",
    "tree_for",
    "use_device_for",
]

MEMORY_EVENT_NAME = "[memory]"
OUT_OF_MEMORY_EVENT_NAME = "[OutOfMemory]"

#: Names torch's ``_filter_name`` drops from its results.
FILTERED_NAMES: frozenset[str] = frozenset(
    {
        MEMORY_EVENT_NAME,
        OUT_OF_MEMORY_EVENT_NAME,
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)

#: Stack frames torch's ``_filter_stack_entry`` drops: (file part, function part).
_FILTERED_STACK_ENTRIES: tuple[tuple[str, str], ...] = (
    ("autograd/__init__", "_make_grads"),
    ("autograd/__init__", "backward"),
    ("torch/tensor", "backward"),
    ("_internal/common_utils", "prof_callable"),
    ("_internal/common_utils", "prof_func_call"),
    ("_internal/common_utils", "prof_meth_call"),
)

#: Memory records counted as CPU memory / device memory (torch's two lists).
_CPU_MEMORY_DEVICES = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)
#: The device ones are ``PostProcessingRules.device_memory_devices``: per torch release, from
#: ``polyprof.base.activity.DEVICES``' ``device_memory_since``.
#: Device rows that become kernels of the CPU row that launched them (``Device.kernels``).
_KERNEL_DEVICES = tuple(d.device_type for d in DEVICES if d.kernels)
#: Device rows whose own elapsed time is their device time (``Device.timed``).
_TIMED_DEVICES = tuple(d.device_type for d in DEVICES if d.timed)
#: Kinds Kineto records on the host whatever device a tracer tags them with (torch counts them as CPU events).
_HOST_CALL_KINDS = (*API_CALL_KINDS, EventKind.OVERHEAD)
#: Kinds whose ``correlation_id`` is a device tracer's record id (CUPTI/PTI), not a torch op id.
_TRACER_ID_KINDS = (*API_CALL_KINDS, EventKind.OVERHEAD, EventKind.SYNC)
#: Kinds that are never device time: a sync is the host waiting for the device, not device work.
_NOT_DEVICE_WORK_KINDS = (EventKind.SYNC,)
#: Kinds whose torch ``device_index`` is the process id (Kineto's CPU "device").
_CPU_SIDE_KINDS = (EventKind.CPU_OP, EventKind.USER_ANNOTATION, EventKind.PYTHON_FUNCTION)
_USER_ANNOTATION_KINDS = (EventKind.USER_ANNOTATION, EventKind.GPU_USER_ANNOTATION)
#: torch's RecordScope.BACKWARD_FUNCTION.
_BACKWARD_SCOPE = 1

#: ``use_device`` values torch accepts (``polyprof.base.activity.USE_DEVICES``), and None.
VALID_USE_DEVICES: tuple[str | None, ...] = (None, *USE_DEVICES)

#: From 3.12 CPython's ``sum`` of floats is Neumaier-compensated.
_COMPENSATED_SUM = sys.version_info >= (3, 12)
#: Segments longer than this are summed by CPython's own ``sum`` (see ``python_sum_by_segment``).
_LONG_SEGMENT = 48


# ------------------------------------------------------------------ torch version rules


@attrs.frozen
class PostProcessingRules:
    """What differs, between supported torch releases, in torch's Python post-processing.

    ``for_torch(2, N)`` gives one release's rules; ``post_processing_rules()``
    those of the torch installed here. docs/torch-versions.md lists every
    difference with the release that introduced it, including the torch bugs
    polyprof does not copy (device time of XPU and HPU rows, see there).
    """

    #: The torch minor these rules copy, e.g. ``(2, 13)``.
    torch_minor: tuple[int, int]
    #: 2.7: events carry overload names: the table may get an Overload Name column and
    #: ``key_averages`` may group by them (2.6 has neither).
    overload_names: bool
    #: The devices whose memory records count as device memory in this release: those whose
    #: ``polyprof.base.activity.Device.device_memory_since`` it has reached (XPU's from 2.8). The
    #: others' count as neither CPU nor device memory. A tuple (``np.isin`` reads its items).
    device_memory_devices: tuple[DeviceType, ...]
    #: 2.8: the table's memory units are ``GB MB KB B`` (before: ``Gb Mb Kb b``).
    memory_units: tuple[str, str, str, str]
    #: Before 2.11: an op's memory window is ``[start_ns / 1000 * 1000, end_ns / 1000 * 1000]``
    #: computed in floats (``MemRecordsAcc.in_interval`` took microseconds), so its bounds are
    #: rounded to the nearest double (256 ns steps at today's epoch times).
    memory_window_through_us: bool
    #: 2.14 only: rows whose activity is "overhead" never launch device work (2.15 replaced
    #: this test with ``launcher_needs_external_id``).
    overhead_launches_nothing: bool
    #: 2.15: only rows with a non-zero external id launch device work.
    launcher_needs_external_id: bool
    #: 2.14: ``key_averages`` leaves python_function rows out unless ``include_python_functions``.
    key_averages_skips_python_functions: bool

    @classmethod
    def for_torch(cls, major: int, minor: int, *, overload_names: bool | None = None) -> PostProcessingRules:
        """The rules of torch ``major.minor``; releases past the newest known one get the newest rules.

        :param overload_names: what the installed torch says (its ``_KinetoEvent.overload_name``
            accessor); None decides by the version.
        """
        at_least = functools.partial(_version_at_least, (major, minor))
        return cls(
            torch_minor=(major, minor),
            overload_names=at_least(2, 7) if overload_names is None else overload_names,
            device_memory_devices=tuple(
                d.device_type
                for d in DEVICES
                if d.device_memory_since is not None and at_least(*d.device_memory_since)
            ),
            memory_units=("GB", "MB", "KB", "B") if at_least(2, 8) else ("Gb", "Mb", "Kb", "b"),
            memory_window_through_us=not at_least(2, 11),
            overhead_launches_nothing=(major, minor) == (2, 14),
            launcher_needs_external_id=at_least(2, 15),
            key_averages_skips_python_functions=at_least(2, 14),
        )

    @classmethod
    def newest(cls) -> PostProcessingRules:
        """The rules of the newest supported torch."""
        return cls.for_torch(*torch_support.SUPPORTED_MAX)


def _version_at_least(version: tuple[int, int], major: int, minor: int) -> bool:
    return version >= (major, minor)


@functools.lru_cache(maxsize=8)
def _rules_for(major: int, minor: int, overload_names: bool | None) -> PostProcessingRules:
    return PostProcessingRules.for_torch(major, minor, overload_names=overload_names)


@functools.lru_cache(maxsize=1)
def _installed_torch_version() -> tuple[int, int] | None:
    """The installed torch's minor from its distribution metadata (never imports torch)."""
    import importlib.metadata

    try:
        text = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        return torch_support.parse_version(text)[:2]
    except ValueError:
        log.warning("torch_version_unreadable", version=text, using="newest post-processing rules")
        return None


def post_processing_rules() -> PostProcessingRules:
    """The post-processing rules of the torch installed here.

    When torch is already imported its features are asked (``torch_support``);
    otherwise (``polyprof report`` on a saved trace) the installed version is
    read from package metadata, so torch is not imported just for that.
    Without torch, the newest supported release's rules apply: saved traces
    do not record which torch wrote them.
    """
    if sys.modules.get("torch") is not None:
        try:
            features = torch_support.installed()
        except (ImportError, AttributeError):
            features = None
        if features is not None:
            return _rules_for(*features.minor, features.has_accessor("overload_name"))
    version = _installed_torch_version()
    if version is None:
        return _rules_for(*torch_support.SUPPORTED_MAX, None)
    return _rules_for(*version, None)


def use_device_for(config: ProfileConfig) -> str | None:
    """torch's ``use_device`` for the recorded activities (CUDA > XPU > MTIA > HPU > PrivateUse1)."""
    return use_device_for_activities(config.activities)


# ------------------------------------------------------------------ names


@functools.lru_cache(maxsize=1)
def _torch_demangler() -> Callable[[str], str]:
    try:
        from torch._C import _demangle
    except ImportError:
        return lambda name: name
    return _demangle


def _demangle(name: str) -> str:
    # torch demangles every name; importing torch only for that takes seconds, so
    # without torch loaded only C++ symbols (``_Z...``) are worth the import.
    if "torch" not in sys.modules and not name.startswith("_Z"):
        return name
    try:
        return _torch_demangler()(name)
    except TypeError:  # a lone surrogate (JSON's "\ud800"): no symbol, and torch's binding cannot take it
        return name


def rewrite_name(name: str, *, with_wildcard: bool) -> str:
    """torch's ``_rewrite_name``: demangle, and with ``with_wildcard`` fold ``ProfilerStep#N``.

    Demangling uses ``torch._C._demangle`` (identity without torch). When torch
    is not imported yet, only names that look like C++ symbols (``_Z...``) are
    passed to it, so reading a saved trace never pays torch's import for
    ordinary names.
    """
    if len(name) > 1:  # torch leaves one-letter names alone ('t' would demangle to 'unsigned short')
        name = _demangle(name)
    if with_wildcard and name.startswith("ProfilerStep#"):
        return "ProfilerStep*"
    return name


def filter_stack_entry(entry: str) -> bool:
    """torch's ``_filter_stack_entry``: False for autograd/test-harness frames."""
    return all(not (file in entry and func in entry) for file, func in _FILTERED_STACK_ENTRIES)


def _gather(batch: EventBatch, field: str, rows: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``batch[field][rows]`` as a new writable array (absent columns are not materialized in full)."""
    spec = FIELDS[field]
    dtype = spec.dtype if dtype is None else dtype
    if batch.has(field):  # a deferred column is decoded here, once
        return batch[field][rows].astype(dtype, copy=False)  # fancy indexing already copied
    return np.full(len(rows), spec.default, dtype=dtype)


def _host_aware_device_type(batch: EventBatch, idx: np.ndarray) -> np.ndarray:
    """``device_type`` of rows ``idx``, with runtime/driver calls and overhead counted as CPU events.

    API calls and the tracer's own overhead happen on the host: torch counts
    them as CPU events even when a tracer or a trace file tags them with the
    device they concern.
    """
    device_type = _gather(batch, "device_type", idx)
    host_call = np.isin(_gather(batch, "kind", idx), kind_codes(_HOST_CALL_KINDS))
    return np.where(host_call, np.int8(DeviceType.CPU), device_type).astype(device_type.dtype)


def _torch_order(start_us: np.ndarray, end_us: np.ndarray) -> np.ndarray:
    """The permutation of torch's stable sort by ``[start, -end]``.

    Events mostly arrive sorted by start, where a stable argsort is nearly free;
    only runs of equal starts need the ``-end`` key.
    """
    order = np.argsort(start_us, kind="stable")
    sorted_start = start_us[order]
    tie = np.r_[False, sorted_start[1:] == sorted_start[:-1]]
    if not tie.any():
        return order
    in_run = tie | np.r_[tie[1:], False]
    run = np.cumsum(~tie)[in_run]
    positions = np.flatnonzero(in_run)
    members = order[positions]
    order[positions] = members[np.lexsort((-end_us[members], run))]
    return order


def _lookup(table_map: Sequence[int], column: np.ndarray) -> np.ndarray:
    """Map an interned column through ``table_map`` (index -1 -> -1)."""
    lut = np.asarray([*table_map, -1], dtype=np.int32)
    return lut[column]


# ------------------------------------------------------------------ sums


def python_sum_by_segment(segments: np.ndarray, values: np.ndarray, n_segments: int) -> np.ndarray:
    """Per segment, what CPython's ``sum(values_of_segment)`` returns.

    ``values`` must be in the order the Python code would add them (row order).
    Before 3.12 ``sum`` adds sequentially from 0, which is ``np.bincount``
    (sequential per bin). From 3.12 it is Neumaier-compensated: short segments
    run that algorithm vectorized one position at a time, long ones (a step
    with thousands of ops) go through CPython's ``sum`` itself.
    """
    segments = np.asarray(segments, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if not _COMPENSATED_SUM:
        return np.bincount(segments, weights=values, minlength=n_segments)
    return _neumaier_by_segment(segments, values, n_segments)


def _neumaier_by_segment(segments: np.ndarray, values: np.ndarray, n_segments: int) -> np.ndarray:
    out = np.zeros(n_segments, dtype=np.float64)
    if not len(values):
        return out
    order = np.argsort(segments, kind="stable")
    seg = segments[order]
    val = values[order]
    starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
    lengths = np.diff(np.r_[starts, len(seg)])
    long = lengths > _LONG_SEGMENT
    for start, length in zip(starts[long].tolist(), lengths[long].tolist(), strict=True):
        out[seg[start]] = sum(val[start : start + length].tolist())
    short = np.repeat(~long, lengths)
    rank = np.arange(len(seg)) - np.repeat(starts, lengths)
    seg, val, rank = seg[short], val[short], rank[short]
    if not len(seg):
        return out
    by_rank = np.argsort(rank, kind="stable")
    seg, val = seg[by_rank], val[by_rank]
    bounds = np.searchsorted(rank[by_rank], np.arange(rank.max() + 2))
    total = np.zeros(n_segments, dtype=np.float64)
    comp = np.zeros(n_segments, dtype=np.float64)
    for r in range(len(bounds) - 1):
        ids = seg[bounds[r] : bounds[r + 1]]
        x = val[bounds[r] : bounds[r + 1]]
        acc = total[ids]
        t = acc + x
        comp[ids] += np.where(np.abs(acc) >= np.abs(x), (acc - t) + x, (x - t) + acc)
        total[ids] = t
    fix = (comp != 0) & np.isfinite(comp)
    total[fix] += comp[fix]
    touched = np.unique(seg)
    out[touched] = total[touched]
    return out


def _int_sum_by_segment(segments: np.ndarray, values: np.ndarray, n_segments: int) -> np.ndarray:
    """Exact integer sums per segment (``np.bincount`` would go through float64)."""
    out = np.zeros(n_segments, dtype=np.int64)
    np.add.at(out, segments, values.astype(np.int64, copy=False))
    return out


# ------------------------------------------------------------------ parents


def _previous_reaching(end: np.ndarray, threshold: np.ndarray, group_start: np.ndarray) -> np.ndarray:
    """For each position p, the largest q in [group_start[p], p) with end[q] >= threshold[p], else -1.

    Pointer doubling over candidate links: ``cand[p]`` starts at ``p - 1``;
    while it does not reach, p jumps to its candidate's candidate. Every row
    strictly between ``cand[q]`` and ``q`` ends before ``threshold[q]``, which
    is at most ``threshold[p]`` whenever ``q`` failed p, so a jump never skips
    an answer; links double along unresolved chains, and a resolved row links
    straight to its own answer. Rounds: about log2(siblings) plus the depth a
    row climbs after a deep subtree.
    """
    m = len(end)
    cand = np.arange(m, dtype=np.int64) - 1
    cand[np.arange(m) <= group_start] = -1
    active = np.flatnonzero(cand >= 0)
    active = active[end[cand[active]] < threshold[active]]
    while len(active):
        cand[active] = cand[cand[active]]
        active = active[cand[active] >= 0]
        active = active[end[cand[active]] < threshold[active]]
    return cand


def _populate_parents(
    start_us: np.ndarray, end_us: np.ndarray, thread: np.ndarray, eligible: np.ndarray
) -> np.ndarray:
    """torch's ``_populate_cpu_children`` for rows already in ``[start, -end]`` order.

    torch walks each thread's rows with a stack, popping every open row that
    ends before the new row's end or at/before its start. An earlier row
    survives until row ``e`` iff no row in between ends after it and it ends
    after the last start; so ``e``'s parent is the nearest earlier row of the
    thread with ``end >= end[e]`` and ``end > start[e]``.
    """
    n = len(start_us)
    parent = np.full(n, -1, dtype=np.int64)
    rows = np.flatnonzero(eligible)
    if len(rows) < 2:
        return parent
    rows = rows[np.argsort(thread[rows], kind="stable")]  # grouped by thread, row order inside
    th = thread[rows]
    s = start_us[rows]
    e = end_us[rows]
    threshold = np.where(e > s, e, np.nextafter(s, np.inf))
    first = np.r_[True, th[1:] != th[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(rows)), 0))
    found = _previous_reaching(e, threshold, group_start)
    has = found >= 0
    parent[rows[has]] = rows[found[has]]
    return parent


def nesting_parents(start: np.ndarray, end: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """torch's parent of each row (``_populate_cpu_children``), rows given in ``[start, -end]`` order.

    ``start`` and ``end`` are integers (nanoseconds); ``lane`` groups the rows that nest (a thread).
    Returns each row's parent row, or -1. The many-rank report (``polyprof.ranks.rank_analysis``) uses
    it on the rows DuckDB sorts, so its self times are those of ``EventTree``.
    """
    n = len(start)
    if n < 2:
        return np.full(n, -1, dtype=np.int64)
    threshold = np.where(end > start, end, start + 1)  # a row of no length is no one's parent
    first = np.r_[True, lane[1:] != lane[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    return _previous_reaching(end, threshold, group_start)


def _chain_top(link: np.ndarray) -> np.ndarray:
    """Follow ``link`` (i -> link[i], fixed points are tops) to its fixed point, by pointer doubling."""
    top = link.copy()
    while True:
        nxt = top[top]
        if np.array_equal(nxt, top):
            return top
        top = nxt


def _csr(parent: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Children lists in row order: (indptr, children)."""
    has = np.flatnonzero(parent >= 0)
    order = np.argsort(parent[has], kind="stable")
    children = has[order]
    counts = np.bincount(parent[has], minlength=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, children.astype(np.int64)


def _levels(parent: np.ndarray, indptr: np.ndarray, children: np.ndarray) -> list[np.ndarray]:
    """Rows by depth (roots first), each level in row order."""
    n = len(parent)
    depth = np.zeros(n, dtype=np.int64)
    level = np.flatnonzero(parent < 0)
    d = 0
    while len(level):
        depth[level] = d
        starts, ends = indptr[level], indptr[level + 1]
        counts = ends - starts
        total = int(counts.sum())
        if total == 0:
            break
        offsets = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)
        level = children[offsets]
        d += 1
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(d + 2))
    return [order[bounds[i] : bounds[i + 1]] for i in range(d + 1) if bounds[i + 1] > bounds[i]]


def _pair_codes(
    a_left: np.ndarray, b_left: np.ndarray, a_right: np.ndarray, b_right: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Encode (a, b) pairs from two sides as comparable int64 codes."""
    _, a_inv = np.unique(np.concatenate([a_left, a_right]), return_inverse=True)
    b_all, b_inv = np.unique(np.concatenate([b_left, b_right]), return_inverse=True)
    codes = a_inv.astype(np.int64) * len(b_all) + b_inv
    return codes[: len(a_left)], codes[len(a_left) :]


# ------------------------------------------------------------------ the tree


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.setflags(write=False)
    return arr


#: Per-row attributes only ``FunctionEvent`` views read; computed on first use
#: (``EventTree.column``) so a table never decodes the columns a tracer deferred.
LAZY_COLUMNS: tuple[str, ...] = (
    "event_id",
    "sequence_nr",
    "fwd_thread",
    "scope",
    "device_index",
    "device_resource_id",
    "linked_correlation_id",
    "external_id",
    "flow_id",
    "flow_type",
    "flow_start",
    "python_id",
    "python_parent_id",
)
#: Kinds Kineto gives no "External id" unless they are linked to a CPU op.
_NO_EXTERNAL_ID_KINDS = (
    EventKind.KERNEL,
    EventKind.GPU_MEMCPY,
    EventKind.GPU_MEMSET,
    EventKind.RUNTIME,
    EventKind.DRIVER,
)


@attrs.frozen(eq=False)
class EventTree:
    """torch's event list after ``_build_tree``, one numpy array per attribute.

    Rows are in torch's ``prof.events()`` order. Interned columns index the
    matching table (``-1`` = empty: ``[]`` shapes, ``[]`` stack, ``""``
    overload, ``None`` trace name). Attributes only event views need
    (``LAZY_COLUMNS``: ids, flows, sequence numbers, ...) come from
    ``column(name)``, decoded on first use. Read-only; safe across threads.
    """

    #: The ``use_device`` the device totals were computed for (None: all 0, as in torch).
    use_device: str | None
    #: Per row: index of the trace (in ``EventTree.concat`` order; 0 for one trace) and of the event in it.
    trace_index: np.ndarray = attrs.field(converter=_frozen, repr=False)
    source: np.ndarray = attrs.field(converter=_frozen, repr=False)
    #: True for torch's synthetic top-level ``[memory]`` / ``[OutOfMemory]`` rows.
    synthetic: np.ndarray = attrs.field(converter=_frozen, repr=False)
    #: For synthetic rows, their order of creation (their id is the largest event id + 1 + this).
    synthetic_rank: np.ndarray = attrs.field(converter=_frozen, repr=False)
    key: np.ndarray = attrs.field(converter=_frozen, repr=False)
    keys: tuple[str, ...] = attrs.field(repr=False)
    trace_name: np.ndarray = attrs.field(converter=_frozen, repr=False)
    trace_names: tuple[str, ...] = attrs.field(repr=False)
    kind: np.ndarray = attrs.field(converter=_frozen, repr=False)
    start_us: np.ndarray = attrs.field(converter=_frozen, repr=False)
    end_us: np.ndarray = attrs.field(converter=_frozen, repr=False)
    #: torch's thread id (a runtime call takes the thread of the op that launched it).
    thread: np.ndarray = attrs.field(converter=_frozen, repr=False)
    is_async: np.ndarray = attrs.field(converter=_frozen, repr=False)
    is_user_annotation: np.ndarray = attrs.field(converter=_frozen, repr=False)
    device_type: np.ndarray = attrs.field(converter=_frozen, repr=False)
    flops: np.ndarray = attrs.field(converter=_frozen, repr=False)
    input_shapes: np.ndarray = attrs.field(converter=_frozen, repr=False)
    shapes: tuple[tuple, ...] = attrs.field(repr=False)
    #: Stacks after torch's frame filter and backward-stack propagation.
    stack: np.ndarray = attrs.field(converter=_frozen, repr=False)
    stacks: tuple[tuple[str, ...], ...] = attrs.field(repr=False)
    overload: np.ndarray = attrs.field(converter=_frozen, repr=False)
    overloads: tuple[str, ...] = attrs.field(repr=False)
    parent: np.ndarray = attrs.field(converter=_frozen, repr=False)
    #: Children per row (CSR, row order): ``children[children_indptr[r]:children_indptr[r + 1]]``.
    children_indptr: np.ndarray = attrs.field(converter=_frozen, repr=False)
    children: np.ndarray = attrs.field(converter=_frozen, repr=False)
    #: Kernels per row (CSR, torch's order): rows of the device events each op launched.
    kernel_indptr: np.ndarray = attrs.field(converter=_frozen, repr=False)
    kernel_rows: np.ndarray = attrs.field(converter=_frozen, repr=False)
    cpu_time_total: np.ndarray = attrs.field(converter=_frozen, repr=False)
    self_cpu_time_total: np.ndarray = attrs.field(converter=_frozen, repr=False)
    cpu_memory_usage: np.ndarray = attrs.field(converter=_frozen, repr=False)
    device_memory_usage: np.ndarray = attrs.field(converter=_frozen, repr=False)
    self_cpu_memory_usage: np.ndarray = attrs.field(converter=_frozen, repr=False)
    self_device_memory_usage: np.ndarray = attrs.field(converter=_frozen, repr=False)
    device_time_total: np.ndarray = attrs.field(converter=_frozen, repr=False)
    self_device_time_total: np.ndarray = attrs.field(converter=_frozen, repr=False)
    #: Where lazy columns come from: the trace's batch, or the trees this one concatenates.
    batch: EventBatch | None = attrs.field(default=None, repr=False)
    parts: tuple[EventTree, ...] = attrs.field(default=(), repr=False)
    _lazy: dict[str, np.ndarray] = attrs.field(factory=dict, init=False, repr=False)
    _lazy_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def __len__(self) -> int:
        return len(self.source)

    @property
    def count(self) -> np.ndarray:
        """FunctionEvent.count: 1 per row."""
        return np.ones(len(self), dtype=np.int64)

    @property
    def elapsed_us(self) -> np.ndarray:
        return self.end_us - self.start_us

    @property
    def kernel_durations(self) -> np.ndarray:
        return self.end_us[self.kernel_rows] - self.start_us[self.kernel_rows]

    def children_of(self, row: int) -> np.ndarray:
        return self.children[self.children_indptr[row] : self.children_indptr[row + 1]]

    def kernels_of(self, row: int) -> np.ndarray:
        return self.kernel_rows[self.kernel_indptr[row] : self.kernel_indptr[row + 1]]

    def column(self, name: str) -> np.ndarray:
        """A lazy per-row column (one of ``LAZY_COLUMNS``), computed once.

        :raises KeyError: ``name`` is not a lazy column.
        """
        if name not in LAZY_COLUMNS:
            raise KeyError(f"{name!r} is not a lazy EventTree column; lazy columns: {list(LAZY_COLUMNS)}")
        cached = self._lazy.get(name)
        if cached is not None:
            return cached
        with self._lazy_lock:
            cached = self._lazy.get(name)
            if cached is None:
                if self.parts:
                    values = np.concatenate([part.column(name) for part in self.parts])
                elif self.batch is not None:
                    values = _row_column(
                        name,
                        self.batch,
                        self.source,
                        self.synthetic,
                        self.synthetic_rank,
                        self.thread,
                        self.kind,
                    )
                else:
                    raise ValueError("this EventTree has neither a batch nor parts to read lazy columns from")
                cached = self._lazy[name] = _frozen(values)
            return cached

    # -------------------------------------------------------------- build

    @classmethod
    def from_trace(
        cls, trace: Trace, *, use_device: str | None, rules: PostProcessingRules | None = None
    ) -> EventTree:
        """Build the tree of ``trace`` as torch would for ``use_device``.

        :param use_device: torch's ``use_device`` (``"cuda"``, ``"xpu"``, ...);
            None makes every device time 0, as in torch.
        :param rules: the torch release to copy; by default the installed one
            (``post_processing_rules()``).
        :raises ValueError: an event has a negative ``linked_correlation_id``.
        """
        if use_device is not None and not isinstance(use_device, str):
            raise TypeError(f"use_device must be a str or None, not {use_device!r}")
        if rules is None:
            rules = post_processing_rules()
        elif not isinstance(rules, PostProcessingRules):
            raise TypeError(f"rules must be a PostProcessingRules or None, not {rules!r}")
        started = time.perf_counter()
        tree = _Builder(trace, use_device, rules).build()
        log.debug(
            "event_tree_built",
            events=len(trace.events),
            rows=len(tree),
            use_device=use_device,
            torch_rules=rules.torch_minor,
            seconds=round(time.perf_counter() - started, 4),
        )
        return tree

    @classmethod
    def concat(cls, trees: Sequence[EventTree]) -> EventTree:
        """Trees one after another (torch's ``acc_events`` lists), re-indexed; tables merged."""
        if not trees:
            raise ValueError("EventTree.concat needs at least one tree")
        if len(trees) == 1:
            return trees[0]
        devices = {t.use_device for t in trees}
        if len(devices) != 1:
            raise ValueError(
                f"cannot concatenate trees built for different use_device values {sorted(map(str, devices))}"
            )
        offsets = np.cumsum([0, *(len(t) for t in trees)])
        trace_offsets = np.cumsum([0, *(int(t.trace_index.max(initial=0)) + 1 for t in trees)])
        fields: dict[str, Any] = {"use_device": trees[0].use_device, "batch": None, "parts": tuple(trees)}
        for name, table in (
            ("key", "keys"),
            ("trace_name", "trace_names"),
            ("input_shapes", "shapes"),
            ("stack", "stacks"),
            ("overload", "overloads"),
        ):
            interner = Interner()
            parts = []
            for t in trees:
                remap = list(map(interner.__getitem__, getattr(t, table)))
                parts.append(_lookup(remap, getattr(t, name)))
            fields[name] = np.concatenate(parts)
            fields[table] = interner.table()
        fields["parent"] = np.concatenate(
            [np.where(t.parent >= 0, t.parent + off, -1) for t, off in zip(trees, offsets[:-1], strict=True)]
        )
        fields["children"] = np.concatenate(
            [t.children + off for t, off in zip(trees, offsets[:-1], strict=True)]
        )
        fields["kernel_rows"] = np.concatenate(
            [t.kernel_rows + off for t, off in zip(trees, offsets[:-1], strict=True)]
        )
        fields["trace_index"] = np.concatenate(
            [t.trace_index + off for t, off in zip(trees, trace_offsets[:-1], strict=True)]
        )
        for name in ("children_indptr", "kernel_indptr"):
            base = np.cumsum([0, *(int(getattr(t, name)[-1]) for t in trees)])
            fields[name] = np.concatenate(
                [np.zeros(1, np.int64)]
                + [getattr(t, name)[1:] + b for t, b in zip(trees, base[:-1], strict=True)]
            )
        for field in attrs.fields(cls):
            if field.init and field.name not in fields:
                fields[field.name] = np.concatenate([getattr(t, field.name) for t in trees])
        return cls(**fields)


def _row_column(
    name: str,
    batch: EventBatch,
    source: np.ndarray,
    synthetic: np.ndarray,
    synthetic_rank: np.ndarray,
    thread: np.ndarray,
    kind: np.ndarray,
) -> np.ndarray:
    """One lazy column for rows ``source`` of ``batch``, with torch's values for synthetic rows."""
    syn = synthetic
    if name == "event_id":
        values = _gather(batch, "correlation_id", source)
        names = batch.table("name")
        kept = ~np.array([nm in FILTERED_NAMES for nm in names] + [False], dtype=bool)[batch["name"]]
        # torch numbers its memory rows after the largest id among the events it kept
        largest = int(batch["correlation_id"][kept].max(initial=0)) if syn.any() else 0
        values[syn] = max(0, largest) + 1 + synthetic_rank[syn]
        return values
    if name in ("device_index", "device_resource_id"):
        tid = _gather(batch, "tid", source)
        if name == "device_resource_id":
            return np.where(syn, thread, tid)  # torch: device_resource_id defaults to the thread
        # Kineto reports the process id as the "device" of CPU-side events, except for the Python
        # frames of a thread torch never saw run (tid 0): it knows neither their process nor thread.
        cpu_side = np.isin(kind, _CPU_SIDE_KINDS) & (tid != 0)
        values = np.where(
            cpu_side, _gather(batch, "pid", source), _gather(batch, "device_index", source, np.int64)
        )
        values[syn] = 0
        return values
    if name == "fwd_thread":
        return np.where(syn, thread, _gather(batch, "fwd_thread", source))
    if name == "external_id":
        return _external_ids(batch, source, syn, kind)
    synthetic_value = {"sequence_nr": -1, "python_id": -1, "python_parent_id": -1}.get(name, 0)
    values = _gather(batch, name, source)
    values[syn] = synthetic_value
    return values


def _external_ids(
    batch: EventBatch, source: np.ndarray, synthetic: np.ndarray, kind: np.ndarray | None = None
) -> np.ndarray:
    """torch's ``FunctionEvent.external_id`` of rows ``source`` (0 for synthetic rows).

    Without a recorded column it is Kineto's: the linked op's id for linked
    rows, 0 for device and API rows, else the row's own correlation id.
    """
    if batch.has("external_id"):
        values = _gather(batch, "external_id", source)
    else:
        kind = _gather(batch, "kind", source) if kind is None else kind
        linked = _gather(batch, "linked_correlation_id", source)
        own = np.where(np.isin(kind, _NO_EXTERNAL_ID_KINDS), 0, _gather(batch, "correlation_id", source))
        values = np.where(linked > 0, linked, own)
    return np.where(synthetic, 0, values)


def _foreign_id_launchers(
    batch: EventBatch,
    source: np.ndarray,
    kind: np.ndarray,
    event_id: np.ndarray,
    launcher: np.ndarray,
    looked_up: np.ndarray,
) -> np.ndarray:
    """Launcher rows whose id is a device tracer's record id that merely equals a linked op id.

    An unlinked runtime, driver, overhead or sync row's ``correlation_id`` is
    CUPTI's or PTI's counter, and torch op ids are another small counter, so
    the two meet by accident: such a row would take the kernels of the op
    with the same number (torch 2.15 stopped this with ``external_id``). Rows
    copied from torch's collector result carry Kineto's ``activity_type``, and
    there the installed release's own rules decide, so polyprof's results
    on torch's events stay torch's. Rows without one come from polyprof's own
    CUPTI/PTI decoders or from a saved Chrome trace: they never launch. The
    ``activity_type`` column is read only for rows whose id some link names.
    """
    candidates = np.flatnonzero(launcher & np.isin(kind, kind_codes(_TRACER_ID_KINDS)))
    if not len(candidates):
        return candidates
    candidates = candidates[np.isin(event_id[candidates], looked_up)]
    if not len(candidates) or not batch.has("activity_type"):
        return candidates
    from_torch_collector = _gather(batch, "activity_type", source[candidates]) >= 0
    return candidates[~from_torch_collector]


#: Below this many ns, ``ns / 1000`` is left to Python (see ``_through_us``).
_EXACT_NUMPY_NS = 10**9


def _through_us(ns: np.ndarray) -> np.ndarray:
    """Python's ``ns / 1000 * 1000`` (int true division, then a float product) for int64 ``ns``.

    ``q + r / 1000`` (``q, r = divmod(ns, 1000)``) is the correctly rounded
    quotient when ``q`` is large enough that the rounding of ``r / 1000``
    cannot cross a halfway point of the sum; smaller values go through Python.
    """
    q, r = np.divmod(ns, 1000)
    us = q.astype(np.float64) + r / 1000.0
    small = np.flatnonzero(np.abs(ns) < _EXACT_NUMPY_NS)
    if len(small):
        us[small] = [v / 1000 for v in ns[small].tolist()]
    return us * 1000.0


def _window_through_us(first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer bounds equivalent to torch < 2.11's float ones for ``bisect`` over int ns.

    ``bisect_left(ints, x)`` = first int >= ceil(x); ``bisect_right(ints, y)`` = first int > floor(y).
    """
    return np.ceil(_through_us(first)).astype(np.int64), np.floor(_through_us(last)).astype(np.int64)


class _Builder:
    """One ``EventTree.from_trace`` computation, in steps named after torch's."""

    def __init__(self, trace: Trace, use_device: str | None, rules: PostProcessingRules) -> None:
        self.trace = trace
        self.batch = trace.events
        self.use_device = use_device
        self.rules = rules

    def build(self) -> EventTree:
        b = self.batch
        names = b.table("name")
        name_col = b["name"]
        filtered = np.array([nm in FILTERED_NAMES for nm in names] + [False], dtype=bool)
        start_ns = b["start_ns"]
        end_ns = start_ns + b["dur_ns"]
        origin = int(self.trace.start_ns)

        memory = self._memory(names, name_col, start_ns, end_ns, filtered)
        kept, mem_free, oom = memory["kept"], memory["unconsumed"], memory["oom"]
        source = np.concatenate([kept, mem_free, oom]).astype(np.int64)
        n_kept = len(kept)
        synthetic = np.zeros(len(source), dtype=bool)
        synthetic[n_kept:] = True

        rel_start = (start_ns[source] - origin).astype(np.float64) / 1000.0
        rel_end = (end_ns[source] - origin).astype(np.float64) / 1000.0
        rel_end[n_kept:] = rel_start[n_kept:]  # memory rows have no duration

        device_type = _host_aware_device_type(b, source)
        device_type[n_kept:] = DeviceType.CPU
        is_async = _gather(b, "is_async", source)
        is_async[n_kept:] = False
        thread = _gather(b, "thread", source)
        synthetic_rank = np.full(len(source), -1, dtype=np.int64)
        synthetic_rank[n_kept:] = np.arange(len(source) - n_kept)
        kernel_owner, kernel_row, thread = self._link_device_rows(
            source, device_type, is_async, synthetic, thread
        )

        # torch: all_function_events.sort(key=[start, -end]) (stable)
        order = _torch_order(rel_start, rel_end)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        source, synthetic = source[order], synthetic[order]
        start_us, end_us = rel_start[order], rel_end[order]
        device_type, is_async, thread = device_type[order], is_async[order], thread[order]
        synthetic_rank = synthetic_rank[order]
        cpu_mem, dev_mem = memory["cpu"][order], memory["device"][order]
        kernel_owner, kernel_row = inverse[kernel_owner], inverse[kernel_row]
        by_owner = np.argsort(kernel_owner, kind="stable")  # keeps event order within an owner
        kernel_owner, kernel_row = kernel_owner[by_owner], kernel_row[by_owner]

        keys = Interner()
        key = _lookup([keys[rewrite_name(nm, with_wildcard=True)] for nm in names], name_col[source])
        for name_id in np.unique(name_col[source[synthetic]]).tolist():
            # torch names its memory rows with the raw event name, not rewritten
            key[synthetic & (name_col[source] == name_id)] = keys[names[name_id]]

        cpu_sync = (device_type == DeviceType.CPU) & ~is_async
        parent = _populate_parents(start_us, end_us, thread, cpu_sync)
        keep, parent, kernel_owner, kernel_row = self._remove_dup_nodes(key, parent, kernel_owner, kernel_row)

        rows = np.flatnonzero(keep)
        remap = np.full(len(keep), -1, dtype=np.int64)
        remap[rows] = np.arange(len(rows))
        parent = np.where(parent[rows] >= 0, remap[np.maximum(parent[rows], 0)], -1)
        kernel_owner, kernel_row = remap[kernel_owner], remap[kernel_row]
        columns = {
            "source": source[rows],
            "synthetic": synthetic[rows],
            "synthetic_rank": synthetic_rank[rows],
            "key": key[rows],
            "start_us": start_us[rows],
            "end_us": end_us[rows],
            "device_type": device_type[rows],
            "is_async": is_async[rows],
            "thread": thread[rows],
            "cpu_mem": cpu_mem[rows],
            "dev_mem": dev_mem[rows],
        }
        return self._finish(columns, keys.table(), names, parent, kernel_owner, kernel_row)

    # ---------------------------------------------------- memory records

    def _memory(
        self,
        names: tuple,
        name_col: np.ndarray,
        start_ns: np.ndarray,
        end_ns: np.ndarray,
        filtered: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Kept rows, memory attribution (``MemRecordsAcc.in_interval``), leftover records."""
        b = self.batch
        n = len(b)
        mem_id = names.index(MEMORY_EVENT_NAME) if MEMORY_EVENT_NAME in names else -2
        oom_id = names.index(OUT_OF_MEMORY_EVENT_NAME) if OUT_OF_MEMORY_EVENT_NAME in names else -2
        # Rows torch writes to its trace but lists in no events() never enter the tree.
        kept = np.flatnonzero(~filtered[name_col] & ~b["trace_only"])
        mem = np.flatnonzero(name_col == mem_id)
        oom = np.flatnonzero(name_col == oom_id)

        device_memory_devices = self.rules.device_memory_devices

        def split(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            dt = _host_aware_device_type(b, idx)
            nbytes = _gather(b, "nbytes", idx)
            cpu = np.where(np.isin(dt, _CPU_MEMORY_DEVICES), nbytes, 0)
            dev = np.where(np.isin(dt, device_memory_devices), nbytes, 0)
            return cpu.astype(np.int64), dev.astype(np.int64)

        kept_cpu = np.zeros(len(kept), dtype=np.int64)
        kept_dev = np.zeros(len(kept), dtype=np.int64)
        unconsumed = mem
        if len(mem):
            by_time = np.argsort(start_ns[mem], kind="stable")  # torch sorts (start_ns, index)
            mem_sorted = mem[by_time]
            times = start_ns[mem_sorted]
            cpu_bytes, dev_bytes = split(mem_sorted)
            cum_cpu = np.r_[0, np.cumsum(cpu_bytes)]
            cum_dev = np.r_[0, np.cumsum(dev_bytes)]
            on_cpu = np.flatnonzero(_host_aware_device_type(b, kept) == DeviceType.CPU)
            rows = kept[on_cpu]
            first, last = start_ns[rows], end_ns[rows]
            if self.rules.memory_window_through_us:
                # torch < 2.11 compares each record's int ns with the float ``ns / 1000 * 1000``
                first, last = _window_through_us(first, last)
            lo = np.searchsorted(times, first, side="left")
            hi = np.maximum(np.searchsorted(times, last, side="right"), lo)
            kept_cpu[on_cpu] = cum_cpu[hi] - cum_cpu[lo]
            kept_dev[on_cpu] = cum_dev[hi] - cum_dev[lo]
            cover = np.bincount(lo, minlength=len(mem) + 1) - np.bincount(hi, minlength=len(mem) + 1)
            consumed_sorted = np.cumsum(cover)[: len(mem)] > 0
            consumed = np.zeros(n, dtype=bool)
            consumed[mem_sorted[consumed_sorted]] = True
            unconsumed = mem[~consumed[mem]]
        syn_cpu, syn_dev = split(np.concatenate([unconsumed, oom]).astype(np.int64))
        return {
            "kept": kept,
            "unconsumed": unconsumed,
            "oom": oom,
            "cpu": np.concatenate([kept_cpu, syn_cpu]),
            "device": np.concatenate([kept_dev, syn_dev]),
        }

    # ------------------------------------------------------ device links

    def _link_device_rows(
        self,
        source: np.ndarray,
        device_type: np.ndarray,
        is_async: np.ndarray,
        synthetic: np.ndarray,
        thread: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Kernels of each launching CPU row, and the thread of linked CPU-side rows.

        torch: for each frontend row (no link, CPU, synchronous) whose id some
        rows link to, device rows become its kernels (in event order) and
        CPU-side rows take its thread (the last such frontend row wins).
        Correlation ids are read only when some event has a link.
        """
        empty = np.zeros(0, dtype=np.int64)
        if not self.batch.has("linked_correlation_id"):
            return empty, empty, thread
        linked = np.where(synthetic, 0, _gather(self.batch, "linked_correlation_id", source))
        if (linked < 0).any():
            bad = int(linked[linked < 0][0])
            raise ValueError(
                f"event has a negative linked_correlation_id ({bad}); it must be 0 (none) or a CPU op's id"
            )
        linked_rows = np.flatnonzero(linked > 0)
        if not len(linked_rows):
            return empty, empty, thread
        event_id = _gather(self.batch, "correlation_id", source)
        kind = _gather(self.batch, "kind", source)
        launcher = (linked == 0) & (device_type == DeviceType.CPU) & ~is_async & ~synthetic
        if self.rules.overhead_launches_nothing:
            launcher &= kind != EventKind.OVERHEAD
        if self.rules.launcher_needs_external_id:
            launcher &= _external_ids(self.batch, source, synthetic) != 0
        foreign = _foreign_id_launchers(self.batch, source, kind, event_id, launcher, linked[linked_rows])
        launcher[foreign] = False
        frontend = np.flatnonzero(launcher)
        frontend = frontend[np.argsort(event_id[frontend], kind="stable")]
        ids = event_id[frontend]
        lo = np.searchsorted(ids, linked[linked_rows], side="left")
        hi = np.searchsorted(ids, linked[linked_rows], side="right")
        matched = hi > lo
        thread = thread.copy()
        cpu_side = matched & (device_type[linked_rows] == DeviceType.CPU)
        thread[linked_rows[cpu_side]] = thread[frontend[hi[cpu_side] - 1]]
        is_kernel = matched & np.isin(device_type[linked_rows], _KERNEL_DEVICES)
        is_kernel &= ~np.isin(kind[linked_rows], kind_codes(_NOT_DEVICE_WORK_KINDS))
        k_rows, k_lo, k_hi = linked_rows[is_kernel], lo[is_kernel], hi[is_kernel]
        counts = k_hi - k_lo
        kernel_row = np.repeat(k_rows, counts)
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        kernel_owner = frontend[np.repeat(k_lo, counts) + within]
        order = np.lexsort((kernel_row, kernel_owner))
        return kernel_owner[order], kernel_row[order], thread

    # -------------------------------------------------- duplicate chains

    @staticmethod
    def _remove_dup_nodes(
        key: np.ndarray, parent: np.ndarray, kernel_owner: np.ndarray, kernel_row: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """torch's ``_remove_dup_nodes``: collapse same-key single-child chains into their top."""
        n = len(key)
        has_parent = parent >= 0
        n_children = np.bincount(parent[has_parent], minlength=n)
        safe_parent = np.where(has_parent, parent, 0)
        collapse = has_parent & (key[safe_parent] == key) & (n_children[safe_parent] == 1)
        if not collapse.any():
            return np.ones(n, dtype=bool), parent, kernel_owner, kernel_row
        top = _chain_top(np.where(collapse, parent, np.arange(n)))
        has_collapsing_child = np.zeros(n, dtype=bool)
        has_collapsing_child[parent[collapse]] = True
        bottom = np.flatnonzero(collapse & ~has_collapsing_child)
        # The top row ends up with the bottom row's children and kernels.
        kernel_source = np.arange(n)
        kernel_source[top[bottom]] = bottom
        keep = ~collapse
        new_parent = np.where(has_parent, top[safe_parent], -1)
        owner_of_source = np.full(n, -1, dtype=np.int64)
        survivors = np.flatnonzero(keep)
        owner_of_source[kernel_source[survivors]] = survivors
        new_owner = owner_of_source[kernel_owner] if len(kernel_owner) else kernel_owner
        kept_kernels = new_owner >= 0
        kernel_owner, kernel_row = new_owner[kept_kernels], kernel_row[kept_kernels]
        order = np.argsort(kernel_owner, kind="stable")  # kernel order within an owner is kept
        return keep, new_parent, kernel_owner[order], kernel_row[order]

    # ------------------------------------------------------------ finish

    def _finish(
        self,
        col: dict[str, np.ndarray],
        keys: tuple[str, ...],
        names: tuple,
        parent: np.ndarray,
        kernel_owner: np.ndarray,
        kernel_row: np.ndarray,
    ) -> EventTree:
        b = self.batch
        src = col["source"]
        syn = col["synthetic"]
        n = len(src)
        kind = _gather(b, "kind", src)
        thread = col["thread"]
        is_user_annotation = np.isin(kind, _USER_ANNOTATION_KINDS) & ~syn

        trace_names = Interner()
        trace_name = _lookup(
            [trace_names[rewrite_name(nm, with_wildcard=False)] for nm in names], _gather(b, "name", src)
        )
        trace_name[syn] = -1

        shapes_table = b.table("shapes")
        input_shapes = _gather(b, "shapes", src)
        input_shapes[syn] = -1
        overloads = b.table("overload")
        overload = _gather(b, "overload", src)
        overload[syn] = -1

        indptr, children = _csr(parent, n)
        kernel_counts = np.bincount(kernel_owner, minlength=n) if len(kernel_owner) else np.zeros(n, np.int64)
        kernel_indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(kernel_counts, out=kernel_indptr[1:])

        start_us, end_us = col["start_us"], col["end_us"]
        device_type = col["device_type"]
        is_async = col["is_async"]
        on_cpu = device_type == DeviceType.CPU
        counted = on_cpu & ~is_async  # rows with "self" metrics (others report 0)
        elapsed = end_us - start_us
        cpu_time_total = np.where(on_cpu, elapsed, 0.0)
        child_parent = parent[children]
        child_time = python_sum_by_segment(child_parent, cpu_time_total[children], n)
        self_cpu = np.where(counted, cpu_time_total - child_time, 0.0)
        cpu_mem, dev_mem = col["cpu_mem"], col["dev_mem"]
        self_cpu_mem = np.where(counted, cpu_mem - _int_sum_by_segment(child_parent, cpu_mem[children], n), 0)
        self_dev_mem = np.where(counted, dev_mem - _int_sum_by_segment(child_parent, dev_mem[children], n), 0)

        levels: list[np.ndarray] | None = None
        if self.use_device:
            levels = _levels(parent, indptr, children)
            timed_device = np.isin(device_type, _TIMED_DEVICES) & ~is_async
            timed_device &= ~np.isin(kind, kind_codes(_NOT_DEVICE_WORK_KINDS))
            device_total, self_device = _device_times(
                levels,
                parent,
                elapsed,
                device_type,
                is_async,
                timed_device,
                kernel_owner,
                elapsed[kernel_row],
                n,
            )
        else:
            device_total = np.zeros(n, dtype=np.float64)
            self_device = np.zeros(n, dtype=np.float64)

        stacks, stack = _filtered_stacks(b.table("stack"), _gather(b, "stack", src))
        stack[syn] = -1
        if len(stacks):
            if levels is None:
                levels = _levels(parent, indptr, children)
            lazy = {
                name: _row_column(name, b, src, syn, col["synthetic_rank"], thread, kind)
                for name in ("scope", "sequence_nr", "fwd_thread")
            }
            stack = _backward_stacks(
                levels, parent, lazy["scope"], lazy["sequence_nr"], thread, lazy["fwd_thread"], stack
            )

        flops = _gather(b, "flops", src)
        flops[syn] = 0
        return EventTree(
            use_device=self.use_device,
            trace_index=np.zeros(n, dtype=np.int32),
            source=src,
            synthetic=syn,
            synthetic_rank=col["synthetic_rank"],
            key=col["key"],
            keys=keys,
            trace_name=trace_name,
            trace_names=trace_names.table(),
            kind=kind,
            start_us=start_us,
            end_us=end_us,
            thread=thread,
            is_async=is_async,
            is_user_annotation=is_user_annotation,
            device_type=device_type,
            flops=flops,
            input_shapes=input_shapes,
            shapes=tuple(shapes_table),
            stack=stack,
            stacks=stacks,
            overload=overload,
            overloads=tuple(overloads),
            parent=parent,
            children_indptr=indptr,
            children=children,
            kernel_indptr=kernel_indptr,
            kernel_rows=kernel_row.astype(np.int64),
            cpu_time_total=cpu_time_total,
            self_cpu_time_total=self_cpu,
            cpu_memory_usage=cpu_mem,
            device_memory_usage=dev_mem,
            self_cpu_memory_usage=self_cpu_mem.astype(np.int64),
            self_device_memory_usage=self_dev_mem.astype(np.int64),
            device_time_total=device_total,
            self_device_time_total=self_device,
            batch=b,
        )


def _device_times(
    levels: list[np.ndarray],
    parent: np.ndarray,
    elapsed: np.ndarray,
    device_type: np.ndarray,
    is_async: np.ndarray,
    timed_device: np.ndarray,
    kernel_owner: np.ndarray,
    kernel_duration: np.ndarray,
    n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """torch's ``device_time_total`` (own kernels + children's totals, recursively) and its self part.

    ``timed_device``: device rows whose own elapsed time is their device time.
    """
    on_cpu = device_type == DeviceType.CPU
    own_kernels = python_sum_by_segment(kernel_owner, kernel_duration, n)
    total = np.where(timed_device, elapsed, 0.0)
    children_total = np.zeros(n, dtype=np.float64)
    cpu_rows = on_cpu & ~is_async
    for level in reversed(levels):  # deepest first: children are done before their parent
        rows = level[cpu_rows[level]]
        total[rows] = own_kernels[rows] + children_total[rows]
        kids = level[parent[level] >= 0]
        if len(kids):
            parents, segment = np.unique(parent[kids], return_inverse=True)
            children_total[parents] = python_sum_by_segment(segment, total[kids], len(parents))
    self_total = np.where(cpu_rows, total - children_total, total)
    return total, self_total


def _filtered_stacks(table: Sequence[tuple], column: np.ndarray) -> tuple[tuple, np.ndarray]:
    """Stacks with torch's filtered frames removed; an emptied stack reads as none (-1)."""
    frames = set().union(*table) if table else set()
    dropped = {frame for frame in frames if not filter_stack_entry(frame)}  # each distinct frame once
    if not dropped:
        return tuple(table), column.astype(np.int32, copy=True)
    interner = Interner()
    remap = []
    for stack in table:
        kept = stack if dropped.isdisjoint(stack) else tuple(f for f in stack if f not in dropped)
        remap.append(interner[kept] if kept else -1)
    return interner.table(), _lookup(remap, column)


def _backward_stacks(
    levels: list[np.ndarray],
    parent: np.ndarray,
    scope: np.ndarray,
    sequence_nr: np.ndarray,
    thread: np.ndarray,
    fwd_thread: np.ndarray,
    stack: np.ndarray,
) -> np.ndarray:
    """torch's ``_set_backward_stacktraces``: rows under a backward function get its forward op's stack."""
    n = len(parent)
    backward = np.full(n, -1, dtype=np.int64)  # nearest ancestor-or-self with backward scope
    for level in levels:
        above = np.where(parent[level] >= 0, backward[np.maximum(parent[level], 0)], -1)
        backward[level] = np.where(scope[level] == _BACKWARD_SCOPE, level, above)
    under = np.flatnonzero(backward >= 0)
    if not len(under):
        return stack
    forward = np.flatnonzero(backward < 0)
    fn = backward[under]
    stack = stack.copy()
    if not len(forward):
        stack[under] = -1
        return stack
    fwd_codes, query_codes = _pair_codes(
        sequence_nr[forward], thread[forward], sequence_nr[fn], fwd_thread[fn]
    )
    unique_codes, first = np.unique(fwd_codes, return_index=True)  # first row per (sequence_nr, thread)
    pos = np.searchsorted(unique_codes, query_codes)
    clipped = np.minimum(pos, len(unique_codes) - 1)
    found = (pos < len(unique_codes)) & (unique_codes[clipped] == query_codes)
    stack[under] = np.where(found, stack[forward[first[clipped]]], -1)
    return stack


# ------------------------------------------------------------- whole traces


def _trace_tuple(traces: Iterable[Trace]) -> tuple[Trace, ...]:
    # Typed: mypy's attrs plugin cannot bind tuple's type variable for converter=tuple.
    return tuple(traces)


@attrs.frozen(eq=False)
class MergedTrace(Trace):
    """Several cycles' traces as one (torch's ``acc_events``): their events, newest cycle first.

    torch lists accumulated events cycle by cycle, each cycle's times relative
    to its own start, so the tree of a merged trace is the concatenation of its
    cycles' trees (``tree_for``), not a tree of the merged events.
    """

    #: The cycles' traces in the order of ``events`` (newest first); each row's
    #: ``trace_index`` in the merged trace's tree names one of them.
    cycles: tuple[Trace, ...] = attrs.field(default=(), converter=_trace_tuple)


def tree_for(trace: Trace, use_device: str | None) -> EventTree:
    """The tree of ``trace`` for ``use_device``; a ``MergedTrace``'s is its cycles' trees concatenated.

    Built on each call: whoever needs it again keeps it (``ProfileResults`` does,
    and hands it to the aggregators it asks).
    """
    if isinstance(trace, MergedTrace) and trace.cycles:
        return EventTree.concat([EventTree.from_trace(c, use_device=use_device) for c in trace.cycles])
    return EventTree.from_trace(trace, use_device=use_device)
