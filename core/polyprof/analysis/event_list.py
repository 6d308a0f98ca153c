"""torch's ``EventList``: a mutable list of events with torch's helpers.

``prof.events()`` returns one that mirrors rows of an ``EventTree`` lazily
(``polyprof.analysis.function_events`` views, made in chunks as it is iterated). While
it still mirrors tree rows it answers ``key_averages`` (through the one route,
``average_by_key``, below), ``total_average``, ``self_cpu_time_total`` and
``export_stacks`` with vectorized code; after arbitrary edits it falls back to
torch's per-object algorithms, with the same results. ``table()`` prints
torch's text (``polyprof.analysis.table``); ``export_chrome_trace`` writes torch's
legacy JSON array (``polyprof.formats.legacy_trace``).

Every ``key_averages()`` table takes one route, ``average_by_key``: the
recording's ``key_averages`` aggregator (``polyprof.analysis.averages.Aggregator``)
when the events belong to a recording with a session, else
``polyprof.analysis.averages.summarize``; ``wrap_key_averages`` turns the
``KeyAveragesSummary`` either returns into torch's ``FunctionEventAvg`` rows.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, MutableSequence, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from polyprof import _compat
from polyprof.analysis.averages import KEY_AVERAGES, KeyAveragesSummary, summarize
from polyprof.analysis.collapsed_stacks import (
    SUPPORTED_METRICS,
    collapsed_stack_lines,
    collapsed_stack_lines_of_objects,
    write_lines,
)
from polyprof.analysis.function_events import (
    AVERAGE_SUMS,
    FLOAT_SUMS,
    INT_ZERO_WHERE,
    EventStore,
    FunctionEvent,
    FunctionEventAvg,
    average_of_row,
)
from polyprof.analysis.table import build_table
from polyprof.analysis.torch_event_surface import torch_event_surface
from polyprof.analysis.tree import EventTree, post_processing_rules, python_sum_by_segment
from polyprof.base.errors import PolyprofDeprecationWarning
from polyprof.formats.legacy_trace import write_legacy_chrome_trace

if TYPE_CHECKING:
    from polyprof.analysis.averages import Aggregator
    from polyprof.base.trace import Trace

__all__ = [
    "SUPPORTED_EXPORT_STACKS_METRICS",
    "EventList",
    "average_by_key",
    "check_stack_n",
    "wrap_key_averages",
]


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


def check_stack_n(group_by_stack_n: Any) -> None:
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
        self._store: EventStore | None = None
        self._rows: np.ndarray | None = None
        self._use_device = use_device
        self._profile_memory = profile_memory
        self._with_flops = with_flops
        self._tree_built = True

    @classmethod
    def _of_store(
        cls,
        store: EventStore,
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
        return cls._of_store(EventStore(tree), rows, profile_memory=profile_memory, with_flops=with_flops)

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

    def _tree_rows(self) -> tuple[EventStore, np.ndarray] | None:
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
    def _iter_views(store: EventStore, rows: np.ndarray) -> Iterator[FunctionEvent]:
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
        """torch's summary table of these events (see ``polyprof.analysis.table.build_table``)."""
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
        check_stack_n(group_by_stack_n)
        located = self._tree_rows()
        if located is not None:
            store, rows = located
            return average_by_key(
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
        total = average_of_row(store, int(rows[-1]))  # the last event's fields
        zeros = np.zeros(len(rows), dtype=np.int64)

        def sequential(values: np.ndarray) -> float:
            return float(np.bincount(zeros, weights=values, minlength=1)[0])

        # The tree already holds 0 wherever torch's properties return 0.
        for name in FLOAT_SUMS:
            # torch adds to an int 0: the sum stays an int while every value added is one
            all_int = bool(INT_ZERO_WHERE[name](tree)[rows].all())
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
        return write_legacy_chrome_trace(self, path, device_name=self._use_device or "cuda")


# ------------------------------------------------------------ the one route


def wrap_key_averages(
    summary: KeyAveragesSummary, *, profile_memory: bool = False, with_flops: bool = False
) -> EventList:
    """A ``KeyAveragesSummary`` as torch's list of ``FunctionEventAvg``."""
    return _wrap_summary(summary, EventStore(summary.tree), profile_memory, with_flops)


def _wrap_summary(
    summary: KeyAveragesSummary, store: EventStore, profile_memory: bool, with_flops: bool
) -> EventList:
    """``summary`` as ``FunctionEventAvg`` rows whose ``cpu_parent`` / ``cpu_children`` are ``store``'s
    (the rows an aggregator built itself, as they are, for one made by ``KeyAveragesSummary.of_rows``)."""
    tree = summary.tree
    if summary.rows is not None:
        return EventList(
            list(summary.rows),
            use_device=tree.use_device,
            profile_memory=profile_memory,
            with_flops=with_flops,
        )
    n_stack = summary.group_by_stack_n
    sums = {name: getattr(summary, name).tolist() for name in (*AVERAGE_SUMS, "flops")}
    considered = summary.group_of_row >= 0
    groups = summary.group_of_row[considered]
    for name in FLOAT_SUMS:
        # torch adds to an int 0: a group's sum stays an int while every value added is one
        floats = ~INT_ZERO_WHERE[name](tree)[considered]
        all_int = np.bincount(groups, weights=floats, minlength=len(summary)) == 0
        values = sums[name]
        for g in np.flatnonzero(all_int).tolist():
            values[g] = 0
    averages = []
    for g, row in enumerate(summary.first_row.tolist()):
        avg = average_of_row(store, row)
        for name, values in sums.items():
            setattr(avg, name, values[g])
        # torch's key_averages blanks what it did not group by.
        if not summary.group_by_input_shape:
            avg.input_shapes = ""
        if not summary.group_by_overload_name and hasattr(avg, "overload_name"):
            avg.overload_name = ""
        avg.stack = (avg.stack or [])[:n_stack] if n_stack > 0 else []
        averages.append(avg)
    return EventList(
        averages, use_device=tree.use_device, profile_memory=profile_memory, with_flops=with_flops
    )


def average_by_key(
    store: EventStore,
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
    otherwise ``polyprof.analysis.averages.summarize`` does (what the built-in returns).

    :param include_python_functions: None: the installed torch's default; the
        aggregator is always given the resolved bool.
    :raises TypeError: the aggregator returned something that is not a
        ``KeyAveragesSummary`` or a sequence of ``FunctionEventAvg``-like rows.
    """
    if include_python_functions is None:
        include_python_functions = not post_processing_rules().key_averages_skips_python_functions
    grouping: dict[str, Any] = {
        "group_by_input_shape": bool(group_by_input_shape),
        "group_by_stack_n": group_by_stack_n,
        "group_by_overload_name": bool(group_by_overload_name),
        "include_python_functions": bool(include_python_functions),
    }
    rows = np.array(rows, dtype=np.int64).reshape(-1)
    rows.setflags(write=False)
    results = store.results
    aggregator: Aggregator | None = (
        (results.aggregators or {}).get(KEY_AVERAGES) if results is not None else None
    )
    if aggregator is None or results is None:
        return _wrap_summary(summarize(store.tree, rows=rows, **grouping), store, profile_memory, with_flops)
    if _takes_tree_and_rows(aggregator):
        result = aggregator.aggregate(results.merged_trace(), tree=store.tree, rows=rows, **grouping)
    else:
        result = _aggregate_the_0_1_way(aggregator, results.merged_trace(), store.tree.use_device, grouping)
    summary = _summary_of(result, aggregator, store.tree, grouping)
    # A summary of another tree (the aggregator built its own) gets views of that tree.
    owner = store if summary.tree is store.tree else EventStore(summary.tree)
    return _wrap_summary(summary, owner, profile_memory, with_flops)


def _summary_of(
    result: object, aggregator: Aggregator, tree: EventTree, grouping: Mapping[str, Any]
) -> KeyAveragesSummary:
    """What ``aggregator`` returned, as the contract's one type: a ``KeyAveragesSummary`` as it is, a
    bare sequence of ``FunctionEventAvg`` rows (the older second form) wrapped by ``of_rows``.

    :raises TypeError: anything else, or a row that lacks a ``FunctionEventAvg`` attribute, naming
        the aggregator.
    """
    if isinstance(result, KeyAveragesSummary):
        return result
    expected = "expected a KeyAveragesSummary or a sequence of FunctionEventAvg"
    name = type(aggregator).__name__
    if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
        raise TypeError(f"the key_averages aggregator {name} returned {type(result).__name__}; {expected}")
    try:
        return KeyAveragesSummary.of_rows(
            tree,
            result,
            group_by_input_shape=grouping["group_by_input_shape"],
            group_by_stack_n=grouping["group_by_stack_n"],
            group_by_overload_name=grouping["group_by_overload_name"],
        )
    except TypeError as exc:
        raise TypeError(f"the key_averages aggregator {name} returned {exc}; {expected}") from None


def _takes_tree_and_rows(aggregator: Aggregator) -> bool:
    """Whether ``aggregate`` takes polyprof 0.2's ``tree=`` and ``rows=`` (or any keyword)."""
    try:
        parameters = inspect.signature(aggregator.aggregate).parameters
    except (TypeError, ValueError):  # a builtin or C callable: assume the current contract
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    return "tree" in parameters and "rows" in parameters


def _aggregate_the_0_1_way(
    aggregator: Aggregator, trace: Trace, use_device: str | None, grouping: Mapping[str, Any]
) -> Any:
    """Call an aggregator written for polyprof 0.1: ``use_device=``, no tree or rows, and
    ``include_python_functions`` only if it names it; warns once per class that this goes away."""
    cls = type(aggregator)
    warnings.warn(
        _compat.AGGREGATOR_0_1_SIGNATURE.format(aggregator=f"{cls.__module__}.{cls.__qualname__}"),
        PolyprofDeprecationWarning,
        stacklevel=2,
    )
    options = dict(grouping)
    if "include_python_functions" not in inspect.signature(aggregator.aggregate).parameters:
        del options["include_python_functions"]
    return aggregator.aggregate(trace, use_device=use_device, **options)
