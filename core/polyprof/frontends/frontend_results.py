"""``table()``, ``total_average()`` and ``self_cpu_time_total``, once for the frontends that have them.

torch's ``torch.autograd.profiler.profile`` and its legacy profiler answer
these from their recorded events; so do ``polyprof.legacy.profile`` and the
autograd shim (``polyprof.shim.AutogradProfile``). Each frontend composes the
functions here by naming them in its class body::

    class profile:
        def _finished_events(self, what: str) -> EventList: ...

        table = frontend_results.table
        total_average = frontend_results.total_average
        self_cpu_time_total = frontend_results.self_cpu_time_total

``_finished_events(what)`` returns the frontend's finished events (an
``EventList`` of its recording, so ``key_averages`` takes the one route,
``polyprof.analysis.event_list.average_by_key``) or raises the frontend's own error, naming ``what``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from polyprof.analysis.event_list import EventList
    from polyprof.analysis.function_events import FunctionEventAvg

__all__ = ["FinishedEvents", "self_cpu_time_total", "table", "total_average"]


class FinishedEvents(Protocol):
    """A frontend that can hand over its finished events."""

    def _finished_events(self, what: str) -> EventList:
        """The recorded events; raises the frontend's error (naming ``what``) when there are none."""
        ...


def table(
    self: FinishedEvents,
    sort_by: str | None = None,
    row_limit: int = 100,
    max_src_column_width: int = 75,
    max_name_column_width: int = 55,
    max_shapes_column_width: int = 80,
    header: str | None = None,
    top_level_events_only: bool = False,
) -> str:
    """torch's table of the raw (not averaged) events (see ``polyprof.analysis.table.build_table``)."""
    return self._finished_events("table()").table(
        sort_by=sort_by,
        row_limit=row_limit,
        max_src_column_width=max_src_column_width,
        max_name_column_width=max_name_column_width,
        max_shapes_column_width=max_shapes_column_width,
        header=header,
        top_level_events_only=top_level_events_only,
    )


def total_average(self: FinishedEvents) -> FunctionEventAvg:
    """Every event summed into one ``FunctionEventAvg`` keyed ``"Total"``."""
    return self._finished_events("total_average()").total_average()


def _self_cpu_time_total(self: FinishedEvents) -> float:
    return self._finished_events("self_cpu_time_total").self_cpu_time_total


self_cpu_time_total = property(_self_cpu_time_total, doc="The sum of the events' self CPU time (µs).")
