"""The many-rank report: statistics across ranks from the engine's per-rank rows, as text or JSON.

``build_rank_report(rank_set, rows)`` turns ``RankRows`` (``polyprof.ranks.rank_analysis``) into:

* **ops across ranks**: per op name, how many ranks ran it, calls, and the mean, minimum, maximum
  and standard deviation over ranks of its self CPU time and its CPU total (a rank that never ran
  the op counts as 0; the standard deviation is the population one, over the ranks of the run),
  and the slowest rank (the largest CPU total; the lowest rank on a tie);
* **kernels across ranks** (device activity): the same over each kernel's total time;
* **steps**: each rank's ``ProfilerStep#N`` durations (count, mean, median, min, max) and its
  step-time ratio: for every step it ran that another rank ran too, its duration over the median
  of the durations of the ranks that ran it, then the median of those ratios over its steps;
* **stragglers**: ranks whose step-time ratio is at least ``1 + threshold``
  (``DEFAULT_STRAGGLER_THRESHOLD``: 10% slower than the median rank, step by step);
* **the step-time distribution**: percentiles of all ranks' step durations;
* **compute/communication overlap** of each rank with GPU kernels (``RankOverlap``).

``render_text`` prints it, with the trace's text (names, file names, reasons) made safe for a
terminal as the single-trace report makes it (``polyprof.base.terminal.terminal_safe``);
``report_json`` gives it as plain data (``polyprof report --format json``), exactly.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from polyprof.analysis.table import format_time
from polyprof.base.terminal import terminal_safe
from polyprof.ranks.rank_analysis import RankOverlap, RankRows
from polyprof.ranks.rank_set import NoTracesError, RankSet, Skipped

#: A rank is a straggler when its step-time ratio is at least 1 + this.
DEFAULT_STRAGGLER_THRESHOLD = 0.10
PERCENTILES = (50, 90, 99)


@attrs.frozen
class Spread:
    """A quantity over the ranks of the run."""

    mean: float
    min: float
    max: float
    stddev: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(
            mean=statistics.fmean(values),
            min=min(values),
            max=max(values),
            stddev=statistics.pstdev(values) if len(values) > 1 else 0.0,
        )


@attrs.frozen
class OpAcrossRanks:
    name: str
    ranks: int
    calls: int
    self_us: Spread
    total_us: Spread
    slowest_rank: int


@attrs.frozen
class KernelAcrossRanks:
    name: str
    category: str
    ranks: int
    calls: int
    total_us: Spread
    slowest_rank: int


@attrs.frozen
class RankSteps:
    rank: int
    steps: int
    mean_us: float
    median_us: float
    min_us: float
    max_us: float
    #: The median over its steps of (its step time / the step's median over ranks); None without any.
    ratio: float | None


@attrs.frozen
class RankReport:
    rank_set: RankSet
    ops: tuple[OpAcrossRanks, ...]
    kernels: tuple[KernelAcrossRanks, ...]
    steps: tuple[RankSteps, ...]
    straggler_threshold: float
    stragglers: tuple[int, ...]
    #: Percentile -> step duration in µs over every rank's steps; empty without steps.
    step_percentiles: tuple[tuple[int, float], ...]
    #: Compute/communication overlap of each rank with GPU kernels.
    overlap: tuple[RankOverlap, ...] = ()


def _across(
    rows: Iterable[Any], ranks: Sequence[int], key: Any, value_names: Sequence[str]
) -> dict[Any, tuple[dict[int, Any], dict[str, list[float]]]]:
    grouped: dict[Any, dict[int, Any]] = defaultdict(dict)
    for row in rows:
        grouped[key(row)][row.rank] = row
    out = {}
    for k, by_rank in grouped.items():
        values = {
            name: [float(getattr(by_rank[r], name)) if r in by_rank else 0.0 for r in ranks]
            for name in value_names
        }
        out[k] = (by_rank, values)
    return out


def _slowest(ranks: Sequence[int], totals: Sequence[float]) -> int:
    return min((-total, rank) for rank, total in zip(ranks, totals, strict=True))[1]


def _percentile(sorted_values: Sequence[float], p: int) -> float:
    """Linear interpolation between closest ranks (numpy's default, the 'linear' method)."""
    position = (len(sorted_values) - 1) * p / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _rank_steps(rows: RankRows, ranks: Sequence[int]) -> tuple[RankSteps, ...]:
    by_rank: dict[int, dict[int, float]] = defaultdict(dict)
    for step in rows.steps:
        by_rank[step.rank][step.step] = step.duration_us
    # each step's median over the ranks that recorded it (two or more), so a rank without steps
    # leaves the others' ratios alone
    ranks_of_step: dict[int, list[float]] = defaultdict(list)
    for r in ranks:
        for s, duration in by_rank.get(r, {}).items():
            ranks_of_step[s].append(duration)
    medians = {s: statistics.median(values) for s, values in ranks_of_step.items() if len(values) > 1}
    out = []
    for rank in ranks:
        durations = by_rank.get(rank)
        if not durations:
            continue
        ratios = [durations[s] / medians[s] for s in sorted(durations) if medians.get(s, 0) > 0]
        values = list(durations.values())
        out.append(
            RankSteps(
                rank=rank,
                steps=len(values),
                mean_us=statistics.fmean(values),
                median_us=statistics.median(values),
                min_us=min(values),
                max_us=max(values),
                ratio=statistics.median(ratios) if ratios else None,
            )
        )
    return tuple(out)


def _nothing_analysed(failed: Sequence[Skipped], skipped: Sequence[Skipped]) -> str:
    """Why no rank is left: the one reason once when every rank failed for it (out of memory), and
    the traces left out before the analysis, which the error is the only place to name."""
    reasons = {s.reason for s in failed}
    if len(reasons) == 1:
        traces = ", ".join(s.path for s in failed)
        message = f"none of the {ranks_text(len(failed))} could be analysed: {reasons.pop()} ({traces})"
    else:
        message = "no rank could be analysed: " + "; ".join(f"{s.path}: {s.reason}" for s in failed)
    if skipped:
        message += "; also skipped: " + "; ".join(f"{s.path}: {s.reason}" for s in skipped)
    return message


def build_rank_report(
    rank_set: RankSet, rows: RankRows, *, straggler_threshold: float = DEFAULT_STRAGGLER_THRESHOLD
) -> RankReport:
    if not straggler_threshold >= 0:
        raise ValueError(f"the straggler threshold must be 0 or more, not {straggler_threshold!r}")
    failed = dict(rows.failed)
    skipped_when_read = rank_set.skipped
    if failed:  # named with the other traces left out, and out of every statistic
        rank_set = attrs.evolve(
            rank_set,
            ranks=tuple(r for r in rank_set.ranks if r.rank not in failed),
            skipped=rank_set.skipped + tuple(failed.values()),
        )
    if not rank_set.ranks:
        raise NoTracesError(_nothing_analysed(tuple(failed.values()), skipped_when_read))
    ranks = [r.rank for r in rank_set.ranks]
    ops = []
    for name, (by_rank, values) in _across(
        rows.ops, ranks, lambda r: r.name, ("self_us", "total_us")
    ).items():
        ops.append(
            OpAcrossRanks(
                name=name,
                ranks=len(by_rank),
                calls=sum(r.calls for r in by_rank.values()),
                self_us=Spread.of(values["self_us"]),
                total_us=Spread.of(values["total_us"]),
                slowest_rank=_slowest(ranks, values["total_us"]),
            )
        )
    ops.sort(key=lambda op: (-op.self_us.mean, op.name))
    kernels = []
    kernel_groups = _across(rows.kernels, ranks, lambda r: (r.name, r.category), ("total_us",))
    for (name, category), (by_rank, values) in kernel_groups.items():
        kernels.append(
            KernelAcrossRanks(
                name=name,
                category=category,
                ranks=len(by_rank),
                calls=sum(r.calls for r in by_rank.values()),
                total_us=Spread.of(values["total_us"]),
                slowest_rank=_slowest(ranks, values["total_us"]),
            )
        )
    kernels.sort(key=lambda k: (-k.total_us.mean, k.name, k.category))
    steps = _rank_steps(rows, ranks)
    stragglers = tuple(s.rank for s in steps if s.ratio is not None and s.ratio >= 1 + straggler_threshold)
    durations = sorted(step.duration_us for step in rows.steps)
    percentiles = tuple((p, _percentile(durations, p)) for p in PERCENTILES) if durations else ()
    return RankReport(
        rank_set=rank_set,
        ops=tuple(ops),
        kernels=tuple(kernels),
        steps=steps,
        straggler_threshold=straggler_threshold,
        stragglers=stragglers,
        step_percentiles=percentiles,
        overlap=rows.overlap,
    )


# ------------------------------------------------------------------ output


def report_json(report: RankReport) -> dict[str, Any]:
    """The report as plain data: every number, times in microseconds."""
    rank_set = report.rank_set
    return {
        "world_size": rank_set.world_size,
        "backend": rank_set.backend,
        "ranks_from_traces": rank_set.ranks_from_traces,
        "ranks": [attrs.asdict(r) for r in rank_set.ranks],
        "skipped": [attrs.asdict(s) for s in rank_set.skipped],
        "ops": [attrs.asdict(op) for op in report.ops],
        "kernels": [attrs.asdict(k) for k in report.kernels],
        "steps": [attrs.asdict(s) for s in report.steps],
        "straggler_threshold": report.straggler_threshold,
        "stragglers": list(report.stragglers),
        "step_percentiles_us": {f"p{p}": v for p, v in report.step_percentiles},
        "overlap": [{**attrs.asdict(o), "overlap": o.overlap} for o in report.overlap],
    }


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """A text table between rules: the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-" * len(line(header))
    return [rule, line(header), rule, *(line(r) for r in rows), rule]


def short_name(name: str, width: int = 50) -> str:
    """``name`` cut to ``width`` characters, ending in ``...`` when cut."""
    return name if len(name) <= width else name[: width - 3] + "..."


OPS_HEADER = (
    "Name",
    "Ranks",
    "Calls",
    "Self CPU mean",
    "min",
    "max",
    "stddev",
    "CPU total mean",
    "max",
    "Slowest rank",
)
KERNELS_HEADER = ("Name", "Category", "Ranks", "Calls", "Total mean", "min", "max", "stddev", "Slowest rank")
STEPS_HEADER = ("Rank", "Steps", "Mean", "Median", "Min", "Max", "Ratio")
OVERLAP_HEADER = ("Rank", "Computation", "Communication", "Overlapped", "Overlap")


def _limited(rows: Sequence[Any], row_limit: int) -> Sequence[Any]:
    return rows if row_limit < 0 else rows[:row_limit]


def op_rows(report: RankReport, row_limit: int, name: Callable[[str], str] = str) -> list[list[str]]:
    """The cells of the ops table (text and HTML alike), ``row_limit`` rows (-1: all)."""
    return [
        [
            name(op.name),
            str(op.ranks),
            str(op.calls),
            format_time(op.self_us.mean),
            format_time(op.self_us.min),
            format_time(op.self_us.max),
            format_time(op.self_us.stddev),
            format_time(op.total_us.mean),
            format_time(op.total_us.max),
            str(op.slowest_rank),
        ]
        for op in _limited(report.ops, row_limit)
    ]


def kernel_rows(report: RankReport, row_limit: int, name: Callable[[str], str] = str) -> list[list[str]]:
    """The cells of the device-activity table, ``row_limit`` rows (-1: all); ``name`` is applied to
    the trace's text in it (the name and the category)."""
    return [
        [
            name(k.name),
            name(k.category),
            str(k.ranks),
            str(k.calls),
            format_time(k.total_us.mean),
            format_time(k.total_us.min),
            format_time(k.total_us.max),
            format_time(k.total_us.stddev),
            str(k.slowest_rank),
        ]
        for k in _limited(report.kernels, row_limit)
    ]


def step_rows(report: RankReport) -> list[list[str]]:
    """The cells of the steps table."""
    return [
        [
            str(s.rank),
            str(s.steps),
            format_time(s.mean_us),
            format_time(s.median_us),
            format_time(s.min_us),
            format_time(s.max_us),
            "-" if s.ratio is None else f"{s.ratio:.3f}",
        ]
        for s in report.steps
    ]


def stragglers_named(report: RankReport) -> str:
    """``rank 3 (1.28x), ...``, or ``none``."""
    named = ", ".join(
        f"rank {s.rank} ({s.ratio:.2f}x)" for s in report.steps if s.rank in report.stragglers and s.ratio
    )
    return named or "none"


def step_percentiles_text(report: RankReport) -> str:
    return ", ".join(f"p{p} {format_time(v)}" for p, v in report.step_percentiles)


def overlap_rows(report: RankReport) -> list[list[str]]:
    return [
        [
            str(o.rank),
            format_time(o.compute_us),
            format_time(o.communication_us),
            format_time(o.overlapped_us),
            "-" if o.overlap is None else f"{o.overlap:.1%}",
        ]
        for o in report.overlap
    ]


def ranks_text(count: int) -> str:
    """``1 rank``, ``4 ranks``."""
    return f"{count} rank" if count == 1 else f"{count} ranks"


def _shown(name: str) -> str:
    """A name from a trace as a text table cell: terminal controls escaped, then shortened."""
    return short_name(terminal_safe(name))


def render_text(report: RankReport, *, row_limit: int = 20) -> str:
    """The report as text for a terminal: every text from the traces goes through ``terminal_safe``."""
    rank_set = report.rank_set
    ranks = rank_set.ranks
    events = sum(r.events for r in ranks)
    if rank_set.ranks_from_traces:
        run = f"world size {rank_set.world_size}, backend {terminal_safe(str(rank_set.backend))}"
    else:
        run = "numbered in file name order: the traces carry no distributedInfo"
    lines = [f"{ranks_text(len(ranks))} ({run}), {events:,} events"]
    for s in rank_set.skipped:
        lines.append(f"skipped {terminal_safe(s.path)}: {terminal_safe(s.reason)}")
    limit = len(report.ops) if row_limit < 0 else min(row_limit, len(report.ops))
    lines += ["", f"Ops across ranks, by mean self CPU time ({limit} of {len(report.ops)}):"]
    lines += text_table(OPS_HEADER, op_rows(report, limit, _shown))
    if report.kernels:
        klimit = len(report.kernels) if row_limit < 0 else min(row_limit, len(report.kernels))
        lines += [
            "",
            f"Device activity across ranks, by mean total time ({klimit} of {len(report.kernels)}):",
        ]
        lines += text_table(KERNELS_HEADER, kernel_rows(report, klimit, _shown), left=2)
    if report.overlap:
        lines += ["", "GPU kernels per rank: computation, communication (nccl/rccl), and both at once:"]
        lines += text_table(OVERLAP_HEADER, overlap_rows(report), left=0)
    if report.steps:
        lines += ["", "Steps (ProfilerStep#N) per rank; ratio: step by step against the median rank:"]
        lines += text_table(STEPS_HEADER, step_rows(report), left=0)
        lines.append(f"Step time over all ranks: {step_percentiles_text(report)}")
        lines.append(
            f"Stragglers (ratio >= {1 + report.straggler_threshold:.2f}): {stragglers_named(report)}"
        )
    else:
        lines += ["", "Steps: none (no ProfilerStep#N annotations: profile with a schedule and call step())"]
    return "\n".join(lines) + "\n"


__all__ = [
    "DEFAULT_STRAGGLER_THRESHOLD",
    "KERNELS_HEADER",
    "OPS_HEADER",
    "OVERLAP_HEADER",
    "STEPS_HEADER",
    "KernelAcrossRanks",
    "OpAcrossRanks",
    "RankReport",
    "RankSteps",
    "Spread",
    "build_rank_report",
    "kernel_rows",
    "op_rows",
    "overlap_rows",
    "ranks_text",
    "render_text",
    "report_json",
    "short_name",
    "step_percentiles_text",
    "step_rows",
    "stragglers_named",
    "text_table",
]
