"""torch's ``EventList.key_averages`` over an ``EventTree``, vectorized.

``summarize(tree, rows=...)`` groups rows by torch's key ``(key, node_id,
device_type, is_legacy, is_user_annotation[, overload name][,
str(input_shapes)][, stack[:n]])`` with ``np.unique`` over factorized
columns; groups come out in first-seen order (torch's dict order) and their
sums are ``np.bincount`` sums in row order, which adds exactly as torch's
``FunctionEventAvg.add`` does (``+=`` one event at a time from 0), so every
float matches. Integer sums (memory, FLOPs) are exact int64 sums. From torch
2.14 python_function rows are left out unless ``include_python_functions``
(torch's own rule, followed for the installed torch).

The result is a columnar ``KeyAveragesSummary``: what the built-in
``key_averages`` aggregator (``polyprof_builtins.key_averages``, an adapter
over this function) returns, and what ``polyprof.analysis.event_list.average_by_key``
turns into torch's list of ``FunctionEventAvg`` for every ``key_averages()``
table. An aggregator that builds its own ``FunctionEventAvg`` rows wraps them
in one too (``KeyAveragesSummary.of_rows``), so ``Aggregator.aggregate``, defined
here too, has one return type.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from polyprof.analysis.function_events import AVERAGE_ATTRIBUTES, AVERAGE_SUMS, FLOAT_SUMS
from polyprof.analysis.tree import EventTree, post_processing_rules
from polyprof.base.events import EventKind

if TYPE_CHECKING:
    from collections.abc import Sequence

    from polyprof.analysis.function_events import FunctionEventAvg
    from polyprof.base.trace import Trace

__all__ = ["KEY_AVERAGES", "Aggregator", "KeyAveragesSummary", "summarize"]

#: The name of the aggregator that answers ``key_averages()`` (a plugin may replace the built-in one).
KEY_AVERAGES = "key_averages"


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.setflags(write=False)
    return arr


@attrs.frozen(eq=False)
class KeyAveragesSummary:
    """torch's ``key_averages`` of some rows of ``tree``, column-wise: one entry per group.

    Groups are in first-seen order (the order of the rows summarised); each
    sum column holds, per group, the sum over its rows, added as torch's
    ``FunctionEventAvg.add`` adds. The descriptive fields of a group (shapes,
    overload, stack, device type) are those of its first row. What an aggregator
    named ``key_averages`` returns (``Aggregator``).

    One made by ``of_rows`` carries ``FunctionEventAvg`` rows an aggregator built
    itself (``rows``): its sum columns are theirs, it names no tree row
    (``first_row`` and ``group_of_row`` are all -1) and its ``FunctionEventAvg``
    rows are those rows, as given.
    """

    #: The tree whose rows were summarised (the one the aggregator was given).
    tree: EventTree
    #: Tree row of each group's first event (its descriptive fields come from it).
    first_row: np.ndarray = attrs.field(converter=_frozen, repr=False)
    #: Per tree row (of the rows considered): its group, or -1 when the row was not considered.
    group_of_row: np.ndarray = attrs.field(converter=_frozen, repr=False)
    count: np.ndarray = attrs.field(converter=_frozen, repr=False)
    cpu_time_total: np.ndarray = attrs.field(converter=_frozen, repr=False)
    self_cpu_time_total: np.ndarray = attrs.field(converter=_frozen, repr=False)
    device_time_total: np.ndarray = attrs.field(converter=_frozen, repr=False)
    self_device_time_total: np.ndarray = attrs.field(converter=_frozen, repr=False)
    cpu_memory_usage: np.ndarray = attrs.field(converter=_frozen, repr=False)
    device_memory_usage: np.ndarray = attrs.field(converter=_frozen, repr=False)
    self_cpu_memory_usage: np.ndarray = attrs.field(converter=_frozen, repr=False)
    self_device_memory_usage: np.ndarray = attrs.field(converter=_frozen, repr=False)
    flops: np.ndarray = attrs.field(converter=_frozen, repr=False)
    #: The grouping asked for; what was not grouped by is blanked in the ``FunctionEventAvg`` rows.
    group_by_input_shape: bool = False
    group_by_stack_n: int = 0
    group_by_overload_name: bool = False
    #: The ``FunctionEventAvg`` rows an aggregator built itself (``of_rows``), one per group;
    #: None for a summary of tree rows (``summarize``).
    rows: tuple[FunctionEventAvg, ...] | None = attrs.field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.first_row)

    @property
    def keys(self) -> list[str]:
        """Each group's key."""
        if self.rows is not None:
            return [row.key or "" for row in self.rows]
        return [self.tree.keys[k] for k in self.tree.key[self.first_row].tolist()]

    @classmethod
    def of_rows(
        cls,
        tree: EventTree,
        rows: Sequence[FunctionEventAvg],
        *,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
    ) -> KeyAveragesSummary:
        """``FunctionEventAvg`` rows an aggregator built itself (one per group, in table order), as a
        summary of ``tree`` (the tree it was given) whose columns are the rows' sums.

        :raises TypeError: a row lacks an attribute ``FunctionEventAvg.add`` reads (the message
            names the row's type and what it lacks).
        """
        rows = tuple(rows)
        for row in rows:
            missing = [name for name in AVERAGE_ATTRIBUTES if not hasattr(row, name)]
            if missing:
                raise TypeError(f"a {type(row).__name__} row that lacks {missing}")

        def column(name: str) -> np.ndarray:
            dtype = np.float64 if name in FLOAT_SUMS else np.int64
            return np.asarray([getattr(row, name) or 0 for row in rows], dtype=dtype).reshape(-1)

        none = np.full(len(rows), -1, dtype=np.int64)
        return cls(
            tree=tree,
            first_row=none,
            group_of_row=np.full(len(tree), -1, dtype=np.int64),
            **{name: column(name) for name in (*AVERAGE_SUMS, "flops")},
            group_by_input_shape=bool(group_by_input_shape),
            group_by_stack_n=int(group_by_stack_n),
            group_by_overload_name=bool(group_by_overload_name),
            rows=rows,
        )


class Aggregator(abc.ABC):
    """Summarises a finished recording's events (``key_averages`` is the built-in one).

    The session's aggregator named ``key_averages`` answers every
    ``key_averages()`` table: ``prof.key_averages()``,
    ``prof.events().key_averages()`` (and that of any list of the recording's
    events), the legacy profile's and the autograd shim's. Called on the thread
    that asks for the table, once per table; must not change what it is given.
    Made by the ``polyprof_make_aggregators`` hook.
    """

    name: str = "aggregator"

    @abc.abstractmethod
    def aggregate(
        self, trace: Trace, *, tree: EventTree, rows: np.ndarray, **options: Any
    ) -> KeyAveragesSummary:
        """Summarise ``rows`` of ``tree``.

        :param trace: the recording (several ``acc_events`` cycles come as one
            ``polyprof.analysis.tree.MergedTrace``): configuration, metadata, raw events.
        :param tree: the recording's events with torch's semantics (parents, self
            times, device time for ``tree.use_device``), as ``prof.events()`` lists them.
        :param rows: read-only int64 indices into ``tree``: the events to summarise,
            in the order their groups are first seen.
        :param options: for ``key_averages``, always ``group_by_input_shape`` (bool),
            ``group_by_stack_n`` (int >= 0), ``group_by_overload_name`` (bool) and
            ``include_python_functions`` (bool, resolved for the installed torch).
        :returns: for ``key_averages``, a ``polyprof.analysis.averages.KeyAveragesSummary`` of
            ``tree``: ``polyprof.analysis.averages.summarize`` makes one of tree rows (polyprof
            turns it into ``FunctionEventAvg`` rows that share the events' views);
            ``KeyAveragesSummary.of_rows(tree, rows)`` wraps ``FunctionEventAvg`` rows the
            aggregator built itself, one per group. A bare sequence of such rows (the contract's
            older second form) is still taken and wrapped so; anything else, or a row that lacks
            a ``FunctionEventAvg`` attribute, is a ``TypeError`` naming the aggregator.
        """


def _codes_of_table(table: tuple, column: np.ndarray, as_key: Any, empty: Any) -> np.ndarray:
    """Factorize an interned column by ``as_key(value)`` (``empty`` for -1): equal keys, equal codes."""
    lookup: dict[Any, int] = {as_key(empty): 0}
    codes = [lookup.setdefault(as_key(v), len(lookup)) for v in table]
    return np.asarray([*codes, 0], dtype=np.int64)[column]


def _combine(code: np.ndarray, more: np.ndarray) -> np.ndarray:
    """Pair two code columns into one, kept small by refactorizing (no int64 overflow)."""
    pair = code * (int(more.max(initial=0)) + 1) + more
    return np.unique(pair, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _group_codes(
    tree: EventTree, rows: np.ndarray, by_shapes: bool, stack_n: int, by_overload: bool
) -> np.ndarray:
    code = tree.key[rows].astype(np.int64)
    # node_id (-1) and is_legacy (False) are the same for every polyprof row.
    code = _combine(code, tree.device_type[rows].astype(np.int64) + 128)
    code = _combine(code, tree.is_user_annotation[rows].astype(np.int64))
    if by_overload:
        code = _combine(code, _codes_of_table(tree.overloads, tree.overload[rows], str, ""))
    if by_shapes:
        as_text = lambda shapes: str([list(s) if isinstance(s, tuple) else s for s in shapes])  # noqa: E731
        code = _combine(code, _codes_of_table(tree.shapes, tree.input_shapes[rows], as_text, ()))
    if stack_n > 0:
        prefix = lambda frames: tuple(frames[:stack_n])  # noqa: E731
        code = _combine(code, _codes_of_table(tree.stacks, tree.stack[rows], prefix, ()))
    return code


def _int_sums(group: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    out = np.zeros(n_groups, dtype=np.int64)
    np.add.at(out, group, values.astype(np.int64, copy=False))
    return out


def summarize(
    tree: EventTree,
    *,
    rows: np.ndarray | None = None,
    group_by_input_shape: bool = False,
    group_by_stack_n: int = 0,
    group_by_overload_name: bool = False,
    include_python_functions: bool | None = None,
) -> KeyAveragesSummary:
    """Group ``tree``'s rows (all, or ``rows`` in that order) as torch's ``key_averages``.

    :param include_python_functions: whether python_function rows (``with_stack``) count;
        None: the installed torch's default (left out from torch 2.14, counted before).
    :raises ValueError: ``group_by_stack_n`` is not an int >= 0, or ``rows`` is out of range.
    """
    if isinstance(group_by_stack_n, bool) or not isinstance(group_by_stack_n, (int, np.integer)):
        raise ValueError(f"group_by_stack_n must be an int >= 0, got {group_by_stack_n!r}")
    if group_by_stack_n < 0:
        raise ValueError(f"group_by_stack_n must be an int >= 0, got {group_by_stack_n!r}")
    n = len(tree)
    rows = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
    if len(rows) and (rows.min() < 0 or rows.max() >= n):
        raise ValueError(f"rows must index the tree's {n} rows")
    if include_python_functions is None:
        include_python_functions = not post_processing_rules().key_averages_skips_python_functions
    if not include_python_functions:
        rows = rows[tree.kind[rows] != EventKind.PYTHON_FUNCTION]
    code = _group_codes(
        tree, rows, bool(group_by_input_shape), int(group_by_stack_n), bool(group_by_overload_name)
    )
    _, first_pos, inverse = np.unique(code, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    # np.unique sorts by code; torch's groups are in first-seen order.
    by_first_seen = np.argsort(first_pos, kind="stable")
    rank = np.empty_like(by_first_seen)
    rank[by_first_seen] = np.arange(len(by_first_seen))
    group = rank[inverse]
    n_groups = len(first_pos)

    def float_sums(values: np.ndarray) -> np.ndarray:
        # Sequential per group in row order: torch's ``avg.x += evt.x``.
        return np.bincount(group, weights=values, minlength=n_groups).astype(np.float64)

    group_of_row = np.full(n, -1, dtype=np.int64)
    group_of_row[rows] = group
    return KeyAveragesSummary(
        tree=tree,
        first_row=rows[first_pos[by_first_seen]],
        group_of_row=group_of_row,
        count=np.bincount(group, minlength=n_groups).astype(np.int64),
        cpu_time_total=float_sums(tree.cpu_time_total[rows]),
        self_cpu_time_total=float_sums(tree.self_cpu_time_total[rows]),
        device_time_total=float_sums(tree.device_time_total[rows]),
        self_device_time_total=float_sums(tree.self_device_time_total[rows]),
        cpu_memory_usage=_int_sums(group, tree.cpu_memory_usage[rows], n_groups),
        device_memory_usage=_int_sums(group, tree.device_memory_usage[rows], n_groups),
        self_cpu_memory_usage=_int_sums(group, tree.self_cpu_memory_usage[rows], n_groups),
        self_device_memory_usage=_int_sums(group, tree.self_device_memory_usage[rows], n_groups),
        # torch's synthetic [memory] rows have flops None, which FunctionEventAvg skips.
        flops=_int_sums(group, np.where(tree.synthetic[rows], 0, tree.flops[rows]), n_groups),
        group_by_input_shape=bool(group_by_input_shape),
        group_by_stack_n=int(group_by_stack_n),
        group_by_overload_name=bool(group_by_overload_name),
    )
