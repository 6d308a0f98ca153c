"""A recording's results: ``ProfileResults``.

``ProfileResults`` is what a profiler frontend holds after recording: its
traces (several with ``acc_events``, newest first in ``events()`` as in torch),
``use_device`` and the session's aggregators. Every ``key_averages()`` table
takes one route (``polyprof.analysis.event_list.average_by_key``): ``prof.key_averages()``,
``prof.events().key_averages()`` and the key averages of any list of a
recording's events ask the session's aggregator named ``key_averages``,
handing it the recording's trace, its ``EventTree`` and the rows to summarise;
without a session (a saved trace, a list built by hand) the same rows go to
``polyprof.analysis.averages.summarize``, which the built-in aggregator wraps.

The objects users read live in their own modules: ``FunctionEvent`` and
``FunctionEventAvg`` (``polyprof.analysis.function_events``), ``EventList``,
``average_by_key`` and ``wrap_key_averages`` (``polyprof.analysis.event_list``) and the
installed torch's surface (``polyprof.analysis.torch_event_surface``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

# event_list is used through its module (as ``lists``: ``ProfileResults.event_list`` is a method).
from polyprof.analysis import event_list as lists
from polyprof.analysis.function_events import EventStore
from polyprof.analysis.tree import EventTree, MergedTrace, tree_for
from polyprof.base.events import concat

if TYPE_CHECKING:
    from polyprof.analysis.averages import Aggregator
    from polyprof.analysis.event_list import EventList
    from polyprof.analysis.function_events import FunctionEventAvg
    from polyprof.base.trace import Trace

__all__ = ["ProfileResults"]


def _trace_tuple(traces: Iterable[Trace]) -> tuple[Trace, ...]:
    return tuple(traces)


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
    #: ``key_averages()`` of these results (``polyprof.analysis.averages.summarize`` when there is none).
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
        self, rows: np.ndarray | None = None, *, list_type: type[EventList] = lists.EventList
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

        With several cycles it is a ``polyprof.analysis.tree.MergedTrace``, whose tree
        (``polyprof.analysis.tree.tree_for``) is the concatenation of the cycles' trees,
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
        lists.check_stack_n(group_by_stack_n)
        store = self._event_store()
        return lists.average_by_key(
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
