"""The many-rank report as one self-contained HTML page with plots (``polyprof report DIR --format html``).

The page has no script and loads nothing: styles are inline and the plots are SVG drawn here, so it
opens anywhere, offline, and can be attached to a bug report. Every name from a trace is escaped.

Plots: each rank's step time (mean, with a whisker from its fastest to its slowest step; stragglers
in orange; a dashed line at the median rank's mean), and the ops with the most self CPU time (mean
over ranks, whisker from the least to the most of any rank). Tables: the ops and device activity
across ranks, and the steps per rank, as in the text report.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Sequence

from polyprof.analysis.table import format_time
from polyprof.ranks.rank_report import (
    KERNELS_HEADER,
    OPS_HEADER,
    OVERLAP_HEADER,
    STEPS_HEADER,
    RankReport,
    kernel_rows,
    op_rows,
    overlap_rows,
    ranks_text,
    step_percentiles_text,
    step_rows,
    stragglers_named,
)

_BAR = "#4e79a7"
_STRAGGLER = "#f28e2b"
_WHISKER = "#333"
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { padding: 0.2em 0.6em; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.name { font-family: ui-monospace, monospace; min-width: 18em; max-width: 40em; overflow-wrap: anywhere; }
.skipped { color: #a33; } .note { color: #555; font-size: 0.9em; }
svg text { font-size: 11px; font-family: system-ui, sans-serif; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _step_plot(report: RankReport) -> str:
    steps = report.steps
    if not steps:
        return (
            '<p class="note">No steps: the traces have no ProfilerStep#N '
            "(profile with a schedule and call step()).</p>"
        )
    width, height, left, bottom, top = 760, 260, 60, 40, 20
    top_value = max(s.max_us for s in steps) * 1.1 or 1.0
    slot = (width - left - 10) / len(steps)
    bar = max(1.0, slot * 0.7)

    def y(value: float) -> float:
        return top + (height - top - bottom) * (1 - value / top_value)

    parts = [
        f'<svg id="step-times" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
    ]
    parts.append("<title>Step time per rank</title>")
    for tick in range(5):
        value = top_value * tick / 4
        parts.append(
            f'<line x1="{left}" x2="{width - 10}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#eee"/>'
            f'<text x="{left - 4}" y="{y(value) + 4:.1f}" text-anchor="end">{_e(format_time(value))}</text>'
        )
    for i, s in enumerate(steps):
        x = left + i * slot + (slot - bar) / 2
        color = _STRAGGLER if s.rank in report.stragglers else _BAR
        parts.append(
            f'<rect class="rank-bar" data-rank="{s.rank}" x="{x:.1f}" y="{y(s.mean_us):.1f}" '
            f'width="{bar:.1f}" '
            f'height="{y(0) - y(s.mean_us):.1f}" fill="{color}"><title>rank {s.rank}: mean '
            f"{_e(format_time(s.mean_us))}, {s.steps} steps</title></rect>"
        )
        middle = x + bar / 2
        parts.append(
            f'<line x1="{middle:.1f}" x2="{middle:.1f}" y1="{y(s.min_us):.1f}" y2="{y(s.max_us):.1f}" '
            f'stroke="{_WHISKER}"/>'
        )
        if len(steps) <= 64:
            parts.append(
                f'<text x="{middle:.1f}" y="{height - bottom + 14}" text-anchor="middle">{s.rank}</text>'
            )
    median = statistics.median(s.mean_us for s in steps)
    parts.append(
        f'<line x1="{left}" x2="{width - 10}" y1="{y(median):.1f}" y2="{y(median):.1f}" stroke="#999" '
        'stroke-dasharray="4 3"/>'
    )
    parts.append(f'<text x="{(left + width) / 2}" y="{height - 4}" text-anchor="middle">rank</text>')
    parts.append("</svg>")
    return "".join(parts)


def _ops_plot(report: RankReport, count: int) -> str:
    ops = report.ops[:count]
    if not ops:
        return '<p class="note">No ops.</p>'
    label_width, width, row = 300, 760, 18
    height = row * len(ops) + 30
    top_value = max(op.self_us.max for op in ops) * 1.05 or 1.0

    def x(value: float) -> float:
        return label_width + (width - label_width - 20) * value / top_value

    parts = [
        f'<svg id="top-ops" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
    ]
    parts.append("<title>Self CPU time of the top ops across ranks</title>")
    for i, op in enumerate(ops):
        yy = 10 + i * row
        name = op.name if len(op.name) <= 45 else op.name[:42] + "..."
        parts.append(f'<text x="{label_width - 6}" y="{yy + 12}" text-anchor="end">{_e(name)}</text>')
        parts.append(
            f'<rect class="op-bar" x="{label_width}" y="{yy + 2}" '
            f'width="{x(op.self_us.mean) - label_width:.1f}" height="{row - 6}" fill="{_BAR}">'
            f"<title>{_e(op.name)}: mean {_e(format_time(op.self_us.mean))}, "
            f"min {_e(format_time(op.self_us.min))}, max {_e(format_time(op.self_us.max))}</title></rect>"
        )
        middle = yy + 2 + (row - 6) / 2
        parts.append(
            f'<line x1="{x(op.self_us.min):.1f}" x2="{x(op.self_us.max):.1f}" y1="{middle:.1f}" '
            f'y2="{middle:.1f}" stroke="{_WHISKER}"/>'
        )
    parts.append(
        f'<text x="{width - 20}" y="{height - 4}" text-anchor="end">self CPU per rank: mean, min to max '
        f"(max {_e(format_time(top_value / 1.05))})</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], table_id: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=name' if i == 0 else ''}>{_e(c)}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render_html(report: RankReport, *, row_limit: int = 20) -> str:
    rank_set = report.rank_set
    events = sum(r.events for r in rank_set.ranks)
    ranks = ranks_text(len(rank_set.ranks))  # "1 rank", "4 ranks"
    run = (
        f"world size {rank_set.world_size}, backend {rank_set.backend}"
        if rank_set.ranks_from_traces
        else "numbered in file name order (no distributedInfo)"
    )
    limit = len(report.ops) if row_limit < 0 else min(row_limit, len(report.ops))
    sections = [
        f"<h1>polyprof report: {ranks}</h1>",
        f'<p id="summary">{ranks} ({_e(run)}), {events:,} events.</p>',
    ]
    if rank_set.skipped:
        items = "".join(f"<li>{_e(s.path)}: {_e(s.reason)}</li>" for s in rank_set.skipped)
        sections.append(f'<ul class="skipped">{items}</ul>')
    sections.append("<h2>Step time per rank</h2>")
    sections.append(_step_plot(report))
    if report.steps:
        at_least = f"ratio at least {1 + report.straggler_threshold:.2f}"
        sections.append(
            f'<p id="stragglers">Stragglers ({_e(at_least)}): {_e(stragglers_named(report))}.</p>'
        )
        sections.append(f"<p>Step time over all ranks: {_e(step_percentiles_text(report))}.</p>")
        sections.append(_table(STEPS_HEADER, step_rows(report), "steps"))
    if report.overlap:
        sections.append("<h2>GPU kernels per rank: computation and communication</h2>")
        sections.append(_table(OVERLAP_HEADER, overlap_rows(report), "overlap"))
    sections.append(f"<h2>Ops across ranks, by mean self CPU time ({limit} of {len(report.ops)})</h2>")
    sections.append(_ops_plot(report, min(limit, 15)))
    sections.append(_table(OPS_HEADER, op_rows(report, limit), "ops"))
    if report.kernels:
        sections.append("<h2>Device activity across ranks, by mean total time</h2>")
        sections.append(_table(KERNELS_HEADER, kernel_rows(report, row_limit), "kernels"))
    body = "\n".join(sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>polyprof report: {ranks}</title><style>{_STYLE}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


__all__ = ["render_html"]
