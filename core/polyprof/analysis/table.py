"""The summary table: ``EventList.table()`` text, identical to the installed torch's.

``build_table(events, ...)`` renders any sequence of objects that carry torch's
attribute names (``key``, ``count``, ``cpu_time_total``, ``self_cpu_time_total``,
``cpu_time``, ``device_time_total``, ``self_device_time_total``, ``device_time``,
the four ``*_memory_usage`` fields, ``input_shapes``, ``stack``, ``flops``,
``overload_name``, ``node_id``, ``is_async``, ``is_user_annotation``,
``device_type``, ``is_legacy``, ``use_device`` and, for
``top_level_events_only``, ``cpu_parent``): polyprof's own result records and
torch's ``FunctionEvent`` / ``FunctionEventAvg`` alike. For the same input the
text is byte for byte what ``torch.autograd.profiler_util._build_table``
prints, quirks included: 13-character headers such as ``CUDA time avg``
overflow their 12-wide column, a name exactly ``W - 3`` long still gets
``...`` appended, ``NaN`` shares when the total is 0, the FLOPs unit follows
the *smallest* positive count, ``row_limit=-1`` prints every row, every line
ends with two spaces and a newline, and an empty list gives ``""``.

The rules that changed between torch releases (``polyprof.analysis.tree.PostProcessingRules``,
docs/torch-versions.md) follow the installed torch, or the ``rules`` given:
the Overload Name column exists from 2.7, memory units are ``GB MB KB B``
from 2.8 (``Gb Mb Kb b`` before).

After the device check and the sort, the layout and the share denominators
are computed once (``plan_table`` -> ``TablePlan``; totals are summed left to
right in display order, as torch does, so the last digit agrees too), then
each printed event becomes a list of cells (``row_cells``) that the plan's
columns render.

Deliberate differences from torch (every supported release unless said):

1. ``flops=None`` counts as 0. torch raises ``TypeError`` for such events (its
   synthetic ``[memory]`` events when both ``profile_memory`` and
   ``with_flops`` are on, or ``sort_by="flops"`` on raw events); here they
   get ``--`` in the FLOPs column and sort as 0.
2. With both a stack and FLOPs, torch appends the headers in the order
   Input Shapes, Source Location, FLOPs but the row values in the order
   shapes, FLOPs, stack, so each value lands under the other's header (and
   extra stack frames go to the right-aligned FLOPs column). We keep torch's
   header order and put every value under its own header.
3. Bad arguments get clear errors instead of torch's:

   * ``sort_by`` that is no attribute of the events raises
     ``InvalidSortKeyError``, a subclass of both ``AttributeError`` (what torch
     raises, so ``except AttributeError`` keeps working) and ``ValueError``,
     whose message names the key and lists the documented keys. torch's
     rewrite of ``cuda``/``xpu``/``privateuse1`` to ``device`` applies first,
     and any other attribute (``key``, ``node_id``, ...) still sorts as in
     torch. A ``sort_by`` that is not a ``str`` raises ``TypeError``.
   * ``time_unit`` outside ``{None, "s", "ms", "us"}`` raises ``ValueError``
     (torch silently falls back to automatic units).
   * ``row_limit`` must be an ``int`` and the ``max_*_column_width`` arguments
     non-negative ints or ``None`` (``TypeError`` / ``ValueError``).
   * These argument checks run even for an empty event list.
4. Inputs on which torch crashes are handled: an ``overload_name`` or
   ``stack`` of ``None`` on some events while others have values reads as
   empty; a missing ``is_user_annotation`` reads as ``False``. A share whose
   denominator is 0 while the value is not (torch's bare ``AssertionError``)
   raises ``TimeShareError``, a subclass of ``AssertionError`` and
   ``ValueError`` with a message that names the event.
5. The events are never modified. torch writes ``self_cpu_percent``,
   ``total_cpu_percent`` and ``total_device_percent`` onto every printed event.
6. ``time_unit`` works on every release; torch's ``table()`` takes it from 2.9.
7. XPU events' self device time counts toward the ``Self XPU`` total on every
   release; torch before 2.11 leaves it out (and cannot print such a table:
   its ``device_time_total`` raises ``AssertionError`` for XPU events).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from polyprof.analysis.tree import PostProcessingRules, post_processing_rules
from polyprof.base.activity import DEVICES
from polyprof.base.errors import PolyprofError
from polyprof.base.events import DeviceType

__all__ = [
    "DEFAULT_COLUMN_WIDTH",
    "FLOPS_UNITS",
    "VALID_SORT_KEYS",
    "VALID_TIME_UNITS",
    "Column",
    "InvalidSortKeyError",
    "TablePlan",
    "TimeShareError",
    "build_table",
    "check_device_data",
    "flops_unit",
    "format_memory",
    "format_time",
    "format_time_share",
    "plan_table",
    "row_cells",
]

#: The sort keys torch documents, plus the ``self_*``/``device_*`` forms and ``flops``.
VALID_SORT_KEYS: tuple[str, ...] = (
    "cpu_time",
    "cuda_time",
    "xpu_time",
    "device_time",
    "cpu_time_total",
    "cuda_time_total",
    "xpu_time_total",
    "device_time_total",
    "self_cpu_time_total",
    "self_cuda_time_total",
    "self_xpu_time_total",
    "self_device_time_total",
    "cpu_memory_usage",
    "cuda_memory_usage",
    "xpu_memory_usage",
    "device_memory_usage",
    "self_cpu_memory_usage",
    "self_cuda_memory_usage",
    "self_xpu_memory_usage",
    "self_device_memory_usage",
    "count",
    "flops",
)

#: Units ``time_unit`` may force; ``None`` picks one per cell.
VALID_TIME_UNITS: tuple[str, ...] = ("s", "ms", "us")

#: FLOPs column units, indexed by ``floor(log10(min positive flops) / 3)`` clamped to 0..5.
FLOPS_UNITS: tuple[str, ...] = ("FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs")

#: Width of every column but Name, Overload Name, Input Shapes and Source Location.
DEFAULT_COLUMN_WIDTH = 12

_SPACING = "  "
_US_PER_S = 1000.0 * 1000.0
_US_PER_MS = 1000.0
_KB = 1024
_MB = 1024 * _KB
_GB = 1024 * _MB
# Device kinds whose events carry device time in Kineto mode (torch's list, by name):
# ``polyprof.base.activity.DEVICES``' ``table_device_time``.
_KINETO_DEVICE_KINDS = frozenset(d.device_type.name for d in DEVICES if d.table_device_time)
_TOP_LEVEL_NOTE = "This report only display top-level ops statistics"


class InvalidSortKeyError(PolyprofError, AttributeError, ValueError):
    """``sort_by`` names no attribute of the events.

    An ``AttributeError`` like torch's, so existing ``except AttributeError``
    code keeps working, and a ``ValueError`` because it is a bad argument.
    """


class TimeShareError(PolyprofError, AssertionError, ValueError):
    """A share of a total of 0 was asked for a non-zero time.

    torch raises a bare ``AssertionError`` here; this one says which event and
    which total, and stays an ``AssertionError`` for code that catches that.
    """


# ---------------------------------------------------------------- cell formatters


def format_time(us: float) -> str:
    """Format a duration given in microseconds as torch does: ``1.500s``, ``2.000ms``, ``3.250us``."""
    if us >= _US_PER_S:
        return f"{us / _US_PER_S:.3f}s"
    if us >= _US_PER_MS:
        return f"{us / _US_PER_MS:.3f}ms"
    return f"{us:.3f}us"


def _format_time_in(us: float, time_unit: str | None) -> str:
    """Format ``us`` in the forced ``time_unit``, or automatically when it is None."""
    if time_unit == "s":
        return f"{us / _US_PER_S:.3f}s"
    if time_unit == "ms":
        return f"{us / _US_PER_MS:.3f}ms"
    if time_unit == "us":
        return f"{us:.3f}us"
    return format_time(us)


def format_time_share(t: float, total: float) -> str:
    """``t`` as a percentage of ``total`` with two decimals; ``NaN`` when both are 0.

    Raises ``TimeShareError`` when ``total`` is 0 but ``t`` is not.
    """
    if total == 0:
        if t != 0:
            raise TimeShareError(f"cannot express {t!r} as a share of a total of 0")
        return "NaN"
    return f"{t * 100.0 / total:.2f}%"


def format_memory(nbytes: int, rules: PostProcessingRules | None = None) -> str:
    """Format a byte count (may be negative) with 1024-based ``GB``/``MB``/``KB`` or plain ``B``.

    The unit names are ``rules.memory_units`` (the installed torch's by default:
    torch before 2.8 writes ``Gb``/``Mb``/``Kb``/``b``).
    """
    gb, mb, kb, b = (rules or post_processing_rules()).memory_units
    if abs(nbytes) >= _GB:
        return f"{nbytes * 1.0 / _GB:.2f} {gb}"
    if abs(nbytes) >= _MB:
        return f"{nbytes * 1.0 / _MB:.2f} {mb}"
    if abs(nbytes) >= _KB:
        return f"{nbytes * 1.0 / _KB:.2f} {kb}"
    return f"{nbytes} {b}"


def flops_unit(min_positive_flops: float) -> tuple[float, str]:
    """The FLOPs column's ``(scale, unit)`` for the smallest positive FLOPs count.

    Cells show ``flops * scale``; the column header is ``"Total " + unit``.
    The unit is the one that keeps the *smallest* count at or above 1, capped at
    ``PFLOPs``: ``flops_unit(3) == (1.0, "FLOPs")``, ``flops_unit(4.2e6) == (1e-06, "MFLOPs")``.
    """
    if not min_positive_flops > 0:
        raise ValueError(f"min_positive_flops must be positive, got {min_positive_flops!r}")
    exponent = max(0, min(math.log10(min_positive_flops) / 3, float(len(FLOPS_UNITS) - 1)))
    thousands = math.floor(exponent)
    return pow(10, thousands * -3.0), FLOPS_UNITS[thousands]


def _format_flops(flops: float | None, scale: float) -> str:
    if flops is None or flops <= 0:
        return "--"
    return f"{flops * scale:8.3f}"


def _truncate_name(name: str, limit: int | None) -> str:
    """Shorten to ``limit - 3`` characters plus ``...``; a name exactly that long still gets ``...``."""
    if limit is not None and len(name) >= limit - 3:
        return name[: limit - 3] + "..."
    return name


def _trim_path(path: str, width: int) -> str:
    """Keep the right end of a source path that is wider than the column, marked with ``...``."""
    if len(path) > width:
        path = path[len(path) - width :]
        if len(path) > 3:
            path = "..." + path[3:]
    return path


# ---------------------------------------------------------------- column plan


@attrs.frozen
class Column:
    """One column: its header, its (minimum) width and its alignment."""

    header: str
    width: int
    #: ``">"`` right-aligns (all columns but Source Location), ``"<"`` left-aligns.
    align: str = ">"

    def render(self, value: Any) -> str:
        """The cell text: ``value`` padded to the width, then the two-space separator.

        Longer values overflow (torch's widths are minimum widths).
        """
        return format(value, f" {self.align}{self.width}") + _SPACING

    @property
    def rule(self) -> str:
        """This column's part of the ``----`` separator line."""
        return "-" * self.width + _SPACING


@attrs.frozen
class TablePlan:
    """Everything about the table's layout that depends on all events, computed once."""

    columns: tuple[Column, ...]
    #: ``max_name_column_width``: where names and overload names are cut.
    name_limit: int | None
    show_overload: bool
    #: ``use_device.upper()`` when device time columns are shown, else None.
    device_name: str | None
    show_memory: bool
    show_device_memory: bool
    show_node_id: bool
    #: Width of Input Shapes (cells are cut to it), or None when the column is absent.
    shapes_width: int | None
    #: Width of Source Location, or None when the column is absent.
    src_width: int | None
    #: Multiplier for FLOPs cells, or None when the FLOPs column is absent.
    flops_scale: float | None
    time_unit: str | None
    #: Denominator of the CPU shares: the sum of self CPU time over all events.
    self_cpu_total: float
    #: Denominator of the device share: self device time of the events that count.
    self_device_total: float
    #: The torch release whose table this is.
    rules: PostProcessingRules = attrs.field(factory=PostProcessingRules.newest)

    @property
    def line_length(self) -> int:
        """Width of the separator line without its two trailing spaces."""
        return sum(column.width + len(_SPACING) for column in self.columns) - len(_SPACING)

    @property
    def rule(self) -> str:
        return "".join(column.rule for column in self.columns)

    def render(self, cells: Sequence[Any]) -> str:
        """One line of the table from one cell per column."""
        return "".join(column.render(cell) for column, cell in zip(self.columns, cells, strict=True))


def _device_kind(device_type: Any) -> str | None:
    """The name of a torch or polyprof ``DeviceType`` (or of its int value)."""
    name = getattr(device_type, "name", None)
    if isinstance(name, str):
        return name
    try:
        return DeviceType(int(device_type)).name
    except (TypeError, ValueError):
        return None


def _counts_toward_device_total(evt: Any) -> bool:
    """torch's rule for the device time footer and the ``Self {DEV} %`` denominator.

    Legacy CPU events carry their own kernel's time; in Kineto mode only the
    device-side events (not user annotations on the device) count.
    """
    kind = _device_kind(evt.device_type)
    if kind == "CPU" and evt.is_legacy:
        return True
    return kind in _KINETO_DEVICE_KINDS and not getattr(evt, "is_user_annotation", False)


def _non_empty(value: Any) -> bool:
    return value is not None and len(value) > 0


def _min_positive_flops(events: Sequence[Any]) -> float | None:
    positive = [evt.flops for evt in events if evt.flops is not None and evt.flops > 0]
    return min(positive) if positive else None


def check_device_data(events: Sequence[Any], use_device: str | None) -> bool:
    """Whether some event has self device time; if so without ``use_device``, torch's ``RuntimeError``."""
    has_device_time = any(evt.self_device_time_total > 0 for evt in events)
    if not use_device and has_device_time:
        raise RuntimeError("use_device is None, but there is device performance data.")
    return has_device_time


def _sequential_sum(values: Iterable[Any]) -> Any:
    """Left-to-right ``+=`` from 0, as torch sums: same rounding, unlike ``sum()`` on Python 3.12+."""
    total: Any = 0
    for value in values:
        total += value
    return total


def plan_table(
    events: Sequence[Any],
    *,
    use_device: str | None,
    max_src_column_width: int | None,
    max_name_column_width: int | None,
    max_shapes_column_width: int | None,
    with_flops: bool,
    profile_memory: bool,
    time_unit: str | None,
    rules: PostProcessingRules | None = None,
) -> TablePlan:
    """Decide the columns, their widths and the share denominators for non-empty ``events``.

    ``events`` must already be in display order (the totals are summed in that
    order, as torch does) and ``use_device`` is that of the first event *before*
    sorting. ``rules`` picks the torch release (default: the installed one).
    Raises ``RuntimeError`` like ``check_device_data``.
    """
    rules = rules or post_processing_rules()
    has_device_time = check_device_data(events, use_device)
    has_device_memory = any(evt.self_device_memory_usage > 0 for evt in events)
    # torch 2.6's table has no Overload Name column (its events have no overload names)
    show_overload = rules.overload_names and any(
        _non_empty(getattr(evt, "overload_name", None)) for evt in events
    )
    has_shapes = any(_non_empty(evt.input_shapes) for evt in events)
    stacks = [evt.stack for evt in events if _non_empty(evt.stack)]

    name_width = max(len(evt.key) for evt in events) + 4
    if max_name_column_width is not None:
        name_width = min(name_width, max_name_column_width)

    device_name = use_device.upper() if has_device_time and use_device else None
    show_device_memory = bool(profile_memory and use_device and has_device_memory)

    columns = [Column("Name", name_width)]
    if show_overload:
        columns.append(Column("Overload Name", name_width))
    fixed_headers = ["Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if device_name is not None:
        dev = device_name
        fixed_headers += [f"Self {dev}", f"Self {dev} %", f"{dev} total", f"{dev} time avg"]
    if profile_memory:
        fixed_headers += ["CPU Mem", "Self CPU Mem"]
        if show_device_memory and use_device:
            fixed_headers += [f"{use_device.upper()} Mem", f"Self {use_device.upper()} Mem"]
    fixed_headers.append("# of Calls")
    show_node_id = any(evt.node_id != -1 for evt in events)
    if show_node_id:
        fixed_headers.append("Node ID")
    columns += [Column(header, DEFAULT_COLUMN_WIDTH) for header in fixed_headers]

    shapes_width = None
    if has_shapes:
        shapes_width = max(len(str(evt.input_shapes)) for evt in events) + 4
        if max_shapes_column_width is not None:
            shapes_width = min(shapes_width, max_shapes_column_width)
        columns.append(Column("Input Shapes", shapes_width))

    src_width = None
    if stacks:
        src_width = max(len(entry) for stack in stacks for entry in stack) + 4
        if max_src_column_width is not None:
            src_width = min(src_width, max_src_column_width)
        columns.append(Column("Source Location", src_width, align="<"))

    flops_scale = None
    min_flops = _min_positive_flops(events) if with_flops else None
    if min_flops is not None:
        flops_scale, unit = flops_unit(min_flops)
        columns.append(Column(f"Total {unit}", DEFAULT_COLUMN_WIDTH))

    return TablePlan(
        columns=tuple(columns),
        name_limit=max_name_column_width,
        show_overload=show_overload,
        device_name=device_name,
        show_memory=profile_memory,
        show_device_memory=show_device_memory,
        show_node_id=show_node_id,
        shapes_width=shapes_width,
        src_width=src_width,
        flops_scale=flops_scale,
        time_unit=time_unit,
        self_cpu_total=_sequential_sum(evt.self_cpu_time_total for evt in events),
        self_device_total=_sequential_sum(
            evt.self_device_time_total for evt in events if _counts_toward_device_total(evt)
        ),
        rules=rules,
    )


# ---------------------------------------------------------------- row rendering


def _share(plan_total: float, t: float, evt: Any, what: str, total_what: str) -> str:
    try:
        return format_time_share(t, plan_total)
    except TimeShareError:
        raise TimeShareError(
            f"event {evt.key!r} has {what} {t!r} but the {total_what} of all events is 0, "
            "so its share cannot be computed"
        ) from None


def row_cells(evt: Any, plan: TablePlan) -> list[Any]:
    """The cells of ``evt``'s first line, one per column of ``plan``, in header order."""
    unit = plan.time_unit
    cells: list[Any] = [_truncate_name(evt.key, plan.name_limit)]
    if plan.show_overload:
        cells.append(_truncate_name(evt.overload_name or "", plan.name_limit))
    cells += [
        _share(plan.self_cpu_total, evt.self_cpu_time_total, evt, "self CPU time", "self CPU time"),
        _format_time_in(evt.self_cpu_time_total, unit),
        # torch prints a plain 0 for async events' CPU total share.
        0
        if evt.is_async
        else _share(plan.self_cpu_total, evt.cpu_time_total, evt, "CPU total time", "self CPU time"),
        _format_time_in(evt.cpu_time_total, unit),
        _format_time_in(evt.cpu_time, unit),
    ]
    if plan.device_name is not None:
        cells += [
            _format_time_in(evt.self_device_time_total, unit),
            _share(
                plan.self_device_total,
                evt.self_device_time_total,
                evt,
                "self device time",
                "counted self device time",
            ),
            _format_time_in(evt.device_time_total, unit),
            _format_time_in(evt.device_time, unit),
        ]
    if plan.show_memory:
        rules = plan.rules
        cells += [format_memory(evt.cpu_memory_usage, rules), format_memory(evt.self_cpu_memory_usage, rules)]
        if plan.show_device_memory:
            cells += [
                format_memory(evt.device_memory_usage, rules),
                format_memory(evt.self_device_memory_usage, rules),
            ]
    cells.append(evt.count)
    if plan.show_node_id:
        cells.append(evt.node_id)
    if plan.shapes_width is not None:
        cells.append(str(evt.input_shapes)[: plan.shapes_width])
    if plan.src_width is not None:
        stack = evt.stack or []
        cells.append(_trim_path(stack[0], plan.src_width) if stack else "")
    if plan.flops_scale is not None:
        cells.append(_format_flops(evt.flops, plan.flops_scale))
    return cells


def _stack_lines(evt: Any, plan: TablePlan) -> list[str]:
    """The extra lines of an event with a Source Location column.

    One line per further stack frame (only the Source Location cell filled),
    then a blank line.
    """
    if plan.src_width is None:
        return []
    n_columns = len(plan.columns)
    src_index = next(i for i, column in enumerate(plan.columns) if column.header == "Source Location")
    lines = []
    for frame in (evt.stack or [])[1:]:
        cells = [""] * n_columns
        cells[src_index] = _trim_path(frame, plan.src_width)
        lines.append(plan.render(cells))
    lines.append(plan.render([""] * n_columns))
    return lines


# ---------------------------------------------------------------- argument checks


def _check_width(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0 or None, got {value}")


def _check_arguments(
    sort_by: Any,
    row_limit: Any,
    time_unit: Any,
    widths: dict[str, int | None],
) -> int:
    """Validate the arguments torch would mishandle; return ``row_limit`` as an int."""
    if sort_by is not None and not isinstance(sort_by, str):
        raise TypeError(
            f"sort_by must be a str or None, got {sort_by!r}; valid keys: {', '.join(VALID_SORT_KEYS)}"
        )
    if time_unit is not None and time_unit not in VALID_TIME_UNITS:
        raise ValueError(
            f"time_unit={time_unit!r} is not valid; choose one of {', '.join(map(repr, VALID_TIME_UNITS))} "
            "or None for automatic units"
        )
    if isinstance(row_limit, bool):
        raise TypeError(f"row_limit must be an int (-1 for all rows), got {row_limit!r}")
    try:
        limit = operator.index(row_limit)
    except TypeError:
        raise TypeError(f"row_limit must be an int (-1 for all rows), got {row_limit!r}") from None
    for name, value in widths.items():
        _check_width(name, value)
    return limit


def _sort_attribute(sort_by: str) -> str:
    """torch's rewrite of the legacy device names to the ``device`` attributes."""
    return sort_by.replace("cuda", "device").replace("xpu", "device").replace("privateuse1", "device")


def _sorted_events(events: list[Any], sort_by: str) -> list[Any]:
    """Events in descending ``sort_by`` order; ties keep their order, as torch's stable sort does."""
    attribute = _sort_attribute(sort_by)

    def key(evt: Any) -> Any:
        try:
            value = getattr(evt, attribute)
        except AttributeError:
            looked_up = f" (looked up as {attribute!r})" if attribute != sort_by else ""
            raise InvalidSortKeyError(
                f"sort_by={sort_by!r}{looked_up} is not an attribute of the events; "
                f"valid keys: {', '.join(VALID_SORT_KEYS)}"
            ) from None
        # difference 1: events without a FLOPs count (torch's [memory] events) sort as 0
        return 0 if value is None and attribute == "flops" else value

    return sorted(events, key=key, reverse=True)


# ---------------------------------------------------------------- the table


def build_table(
    events: Sequence[Any],
    *,
    sort_by: str | None = None,
    header: str | None = None,
    row_limit: int = 100,
    max_src_column_width: int | None = 75,
    max_name_column_width: int | None = 55,
    max_shapes_column_width: int | None = 80,
    with_flops: bool = False,
    profile_memory: bool = False,
    top_level_events_only: bool = False,
    time_unit: str | None = None,
    rules: PostProcessingRules | None = None,
) -> str:
    """Render ``events`` as the installed torch's profiler summary table.

    :param events: objects with torch's ``FunctionEvent``/``FunctionEventAvg`` attribute names.
    :param sort_by: attribute to sort by, descending (``cuda``/``xpu``/``privateuse1`` in the
        name read as ``device``); None keeps the given order.
    :param header: a title printed above the table under a ``===`` line.
    :param row_limit: how many events to print; -1 (any negative) prints all.
    :param max_src_column_width: cap on the Source Location column's width.
    :param max_name_column_width: cap on the Name column's width; longer names are cut.
    :param max_shapes_column_width: cap on the Input Shapes column's width.
    :param with_flops: add the FLOPs column when some event has positive FLOPs.
    :param profile_memory: add the memory columns.
    :param top_level_events_only: print only events whose ``cpu_parent`` is None.
    :param time_unit: ``"s"``, ``"ms"`` or ``"us"`` to force every time cell's unit.
    :param rules: the torch release whose table to print; by default the installed one.
    :returns: the table text, each line ending with a newline; ``""`` for no events.
    :raises InvalidSortKeyError: ``sort_by`` is no attribute of the events.
    :raises RuntimeError: events have device time but the first has no ``use_device``.
    """
    limit = _check_arguments(
        sort_by,
        row_limit,
        time_unit,
        {
            "max_src_column_width": max_src_column_width,
            "max_name_column_width": max_name_column_width,
            "max_shapes_column_width": max_shapes_column_width,
        },
    )
    if rules is not None and not isinstance(rules, PostProcessingRules):
        raise TypeError(f"rules must be a polyprof.analysis.tree.PostProcessingRules or None, got {rules!r}")
    events = list(events)
    if not events:
        return ""
    # torch's order: the device check, then the sort, then the layout and totals over sorted events
    use_device = events[0].use_device
    check_device_data(events, use_device)
    if sort_by is not None:
        events = _sorted_events(events, sort_by)
    plan = plan_table(
        events,
        use_device=use_device,
        max_src_column_width=max_src_column_width,
        max_name_column_width=max_name_column_width,
        max_shapes_column_width=max_shapes_column_width,
        with_flops=with_flops,
        profile_memory=profile_memory,
        time_unit=time_unit,
        rules=rules,
    )

    lines = _title_lines(plan, header, top_level_events_only)
    lines += [plan.rule, plan.render([column.header for column in plan.columns]), plan.rule]
    lines += _body_lines(events, plan, limit, top_level_events_only)
    lines.append(plan.rule)
    lines += _footer_lines(plan)
    return "".join(line + "\n" for line in lines)


def _title_lines(plan: TablePlan, header: str | None, top_level_events_only: bool) -> list[str]:
    lines = []
    if header is not None:
        lines += ["=" * plan.line_length, header]
    if top_level_events_only:
        lines += ["=" * plan.line_length, _TOP_LEVEL_NOTE]
    return lines


def _printed_events(events: list[Any], limit: int, top_level_only: bool) -> list[Any]:
    """The events that get rows: top-level ones if asked, at most ``limit`` (negative: all)."""
    selected: list[Any] = []
    is_shown: Callable[[Any], bool] = (
        (lambda evt: evt.cpu_parent is None) if top_level_only else (lambda evt: True)
    )
    for evt in events:
        if len(selected) == limit:
            break
        if is_shown(evt):
            selected.append(evt)
    return selected


def _body_lines(events: list[Any], plan: TablePlan, limit: int, top_level_only: bool) -> list[str]:
    lines = []
    for evt in _printed_events(events, limit, top_level_only):
        lines.append(plan.render(row_cells(evt, plan)))
        lines += _stack_lines(evt, plan)
    return lines


def _footer_lines(plan: TablePlan) -> list[str]:
    lines = [f"Self CPU time total: {_format_time_in(plan.self_cpu_total, plan.time_unit)}"]
    if plan.device_name is not None:
        lines.append(
            f"Self {plan.device_name} time total: {_format_time_in(plan.self_device_total, plan.time_unit)}"
        )
    return lines
