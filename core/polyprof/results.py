"""A recording's results and the one route to every ``key_averages()`` table.

``ProfileResults`` is what a profiler frontend holds after recording: its
traces (several with ``acc_events``, newest first in ``events()`` as in torch),
``use_device`` and the session's aggregators. Every ``key_averages()`` table
takes one route (``average_by_key``): ``prof.key_averages()``,
``prof.events().key_averages()`` and the key averages of any list of a
recording's events ask the session's aggregator named ``key_averages``,
handing it the recording's trace, its ``EventTree`` and the rows to summarise;
without a session (a saved trace, a list built by hand) the same rows go to
``polyprof.averages.summarize``, which the built-in aggregator wraps.

The objects users read live in their own modules and are importable from here,
as they always were: ``FunctionEvent`` and ``FunctionEventAvg``
(``polyprof.function_events``), ``EventList`` (``polyprof.event_list``) and
the installed torch's surface (``polyprof.torch_event_surface``).
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from polyprof.averages import KEY_AVERAGES, KeyAveragesSummary, summarize
from polyprof.event_list import EventList, check_stack_n
from polyprof.events import concat
from polyprof.function_events import (
    AVERAGE_SUMS,
    FLOAT_SUMS,
    INT_ZERO_WHERE,
    EventStore,
    FormattedTimesMixin,
    FunctionEvent,
    FunctionEventAvg,
    Interval,
    Kernel,
    average_of_row,
)
from polyprof.torch_event_surface import TorchEventSurface, probe_torch_event_surface, torch_event_surface
from polyprof.tree import EventTree, MergedTrace, post_processing_rules, tree_for

if TYPE_CHECKING:
    from polyprof.components import Aggregator
    from polyprof.trace import Trace

__all__ = [
    "EventList",
    "FormattedTimesMixin",
    "FunctionEvent",
    "FunctionEventAvg",
    "Interval",
    "Kernel",
    "ProfileResults",
    "TorchEventSurface",
    "average_by_key",
    "probe_torch_event_surface",
    "torch_event_surface",
    "wrap_key_averages",
]


# ------------------------------------------------------------ the one route


def wrap_key_averages(
    summary: KeyAveragesSummary, *, profile_memory: bool = False, with_flops: bool = False
) -> EventList:
    """A columnar ``KeyAveragesSummary`` as torch's list of ``FunctionEventAvg``."""
    return _wrap_summary(summary, EventStore(summary.tree), profile_memory, with_flops)


def _wrap_summary(
    summary: KeyAveragesSummary, store: EventStore, profile_memory: bool, with_flops: bool
) -> EventList:
    """``summary`` as ``FunctionEventAvg`` rows whose ``cpu_parent`` / ``cpu_children`` are ``store``'s."""
    tree = summary.tree
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


#: What each row of an aggregator's sequence needs (what ``FunctionEventAvg.add`` reads).
_AVERAGE_ATTRIBUTES = ("key", *AVERAGE_SUMS, "flops")


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
    otherwise ``polyprof.averages.summarize`` does (what the built-in returns).

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
    aggregator = (results.aggregators or {}).get(KEY_AVERAGES) if results is not None else None
    if aggregator is None or results is None:
        return _wrap_summary(summarize(store.tree, rows=rows, **grouping), store, profile_memory, with_flops)
    if _takes_tree_and_rows(aggregator):
        result = aggregator.aggregate(results.merged_trace(), tree=store.tree, rows=rows, **grouping)
    else:
        result = _aggregate_the_0_1_way(aggregator, results.merged_trace(), store.tree.use_device, grouping)
    if isinstance(result, KeyAveragesSummary):
        # A summary of another tree (the aggregator built its own) gets views of that tree.
        owner = store if result.tree is store.tree else EventStore(result.tree)
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


def _trace_tuple(traces: Iterable[Trace]) -> tuple[Trace, ...]:
    return tuple(traces)


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
        f"the key_averages aggregator {cls.__module__}.{cls.__qualname__} has polyprof 0.1's "
        "aggregate(trace, use_device=..., group_by_...) signature; polyprof 0.2 passes tree= and "
        "rows= (docs/plugin-author-guide.md, aggregators) and will stop calling the 0.1 form in 0.3",
        DeprecationWarning,
        stacklevel=2,
    )
    options = dict(grouping)
    if "include_python_functions" not in inspect.signature(aggregator.aggregate).parameters:
        del options["include_python_functions"]
    return aggregator.aggregate(trace, use_device=use_device, **options)


# ------------------------------------------------------------ ProfileResults


@attrs.define(eq=False)
class ProfileResults:
    """What a profiler holds after recording: its traces and how to read them.

    With several traces (``acc_events``) ``events()`` lists the newest cycle
    first, each cycle's events in torch's order, as torch does. Every list of
    its events (``events()``, ``event_list(rows)``, their slices) shares one set
    of views, and averages by key through the session's ``key_averages``
    aggregator (``average_by_key``).
    """

    traces: tuple[Trace, ...] = attrs.field(converter=_trace_tuple)
    use_device: str | None = None
    #: The session's aggregators by name; the one named ``key_averages`` answers every
    #: ``key_averages()`` of these results (``polyprof.averages.summarize`` when there is none).
    aggregators: Mapping[str, Aggregator] | None = None
    _events: EventList | None = attrs.field(default=None, init=False)
    _tree: EventTree | None = attrs.field(default=None, init=False)
    _store: EventStore | None = attrs.field(default=None, init=False)
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

    def _event_store(self) -> EventStore:
        with self._lock:
            if self._store is None:
                self._store = EventStore(self.tree(), results=self)
            return self._store

    def event_list(
        self, rows: np.ndarray | None = None, *, list_type: type[EventList] = EventList
    ) -> EventList:
        """A new ``list_type`` (an ``EventList``) of ``rows`` of ``tree()`` (all, in tree order); shares
        ``events()``'s views."""
        return list_type._of_store(
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
        check_stack_n(group_by_stack_n)
        store = self._event_store()
        return average_by_key(
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
