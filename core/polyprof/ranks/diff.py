"""Two runs compared: ``polyprof diff BASELINE CANDIDATE``, per op, per kernel, per step and per rank.

Each side is what ``polyprof report`` reads: a trace (``.json``, ``.json.gz``, ``.parquet``) or a
directory of rank traces. Each side's traces are found and checked by ``polyprof.ranks.rank_set`` and
its per-rank rows computed by ``polyprof.ranks.rank_analysis`` (DuckDB over the Parquet form, one rank
in memory at a time): the rows of the many-rank report, so an op's calls, self and total time are
torch's ``key_averages`` numbers, and a kernel's (categories ``kernel``, ``gpu_memcpy``,
``gpu_memset``) its count and summed duration. ``compare_sides`` then works on those small rows alone.

What is compared
----------------

* **Ranks**: the ranks both sides have. Ranks of one side only (different world sizes) are left out
  of every table, and a note says which.
* **Ops** (CPU): per name, calls, self CPU and CPU total summed over the compared ranks; the change
  is judged on self time. **Kernels** (device activity): per (name, category), calls and total
  duration. When only one side has device activity (a CPU-only run against one with CUDA kernels)
  kernels are not compared, and a note says so; the ops still are.
* **Steps** (``ProfilerStep#N`` spans): the run's time of step N is its longest duration over the
  compared ranks (ranks that synchronise wait for the slowest); the median of those over the steps,
  per side, and with more than one compared rank, the median of each rank's own steps. A side
  without steps leaves the step comparison out, with a note.

The rule (noise made explicit)
------------------------------

A row present on one side only is **added** (candidate only) or **removed** (baseline only). A row
on both sides, with baseline time ``b`` and candidate time ``c``, is **slower** (``c > b``) or
**faster** (``c < b``) when the change ``|c - b|`` exceeds both

* the relative threshold ``t`` (``--threshold``, default 5%) of the smaller time: ``|c - b| >
  t * min(b, c)``; that is, slower when ``c > (1 + t) b``, faster when ``b > (1 + t) c``, so that
  swapping the sides swaps slower and faster exactly; and
* the noise of the row, ``noise_us``; otherwise it is **unchanged**.

For **step times**, which come one per step, the noise is ``k`` (``--noise-factor``, default 3) times
the standard error of the difference of the two medians, ``1.2533 * sqrt(s_b**2 / n_b + s_c**2 /
n_c)``: ``n`` a side's number of steps, ``s`` its robust spread, the median absolute deviation of its
step times scaled by 1.4826 (the standard deviation, for normally distributed times; 1.2533 s /
sqrt(n) is a median's standard error). Medians and MADs ignore a few outlying steps (a warm-up step,
a pause of the machine), and more steps judge more finely (ten steps that jitter by +-10% show a 25%
regression). With one step on a side, its spread is 0 and only the relative threshold applies. The
spread is that of the steps within each run: a shift of a whole run (another job taking the CPU
while it ran, another clock speed) is not noise the rule can see, and counts as a change; compare
runs made on the same kind of machine under the same load.

**Ops and kernels** have no per-step value to take a spread of. When both sides have steps their
times are per step (each side's totals over its own number of steps, so that 12 steps compare with
6), and their noise is the larger of an absolute floor, ``--min-time`` (default 20 µs of change), and
the steps' noise relative to a step applied to the row: ``k * 1.2533 * sqrt((s_b / m_b)**2 / n_b +
(s_c / m_c)**2 / n_c) * min(b, c)``, ``m`` a side's median step time. A row cannot be judged more
finely than the whole step it runs in. Without steps on both sides they are the traces' totals,
judged against the floor alone.

The gate
--------

``gate(diff, limit, only)`` is ``--fail-if-slower``: without names, it fails when the median step
time is slower by more than ``limit`` (``c > (1 + limit) b``) and by more than the steps' noise; it
cannot judge without steps on both sides (``GateError``). With names (``--only``), it fails when one
of the named ops or kernels is slower so (its ``noise_us``), or is new in the candidate with more
than ``min_time_us``; a name found on neither side is a ``GateError`` (a typo would otherwise pass
every build).
"""

from __future__ import annotations

import math
import os
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from polyprof.analysis.table import format_time
from polyprof.base.errors import PolyprofError
from polyprof.base.terminal import terminal_safe
from polyprof.ranks.rank_analysis import RankRows, duckdb_rank_rows
from polyprof.ranks.rank_report import short_name, text_table
from polyprof.ranks.rank_set import NoTracesError, RankSet, Skipped, collect_rank_set, temporary_parquet_dir

#: ``--threshold``: a change smaller than this share of the smaller time is no change.
DEFAULT_THRESHOLD = 0.05
#: ``--noise-factor``: a change must exceed this many standard errors of the medians' difference.
DEFAULT_NOISE_FACTOR = 3.0
#: ``--min-time``: an op's or kernel's change must exceed this many µs.
DEFAULT_MIN_TIME_US = 20.0
#: The MAD times this is the standard deviation of normally distributed values.
MAD_SCALE = 1.4826
#: The standard error of a median of n normally distributed values is this times sd / sqrt(n).
MEDIAN_SE_SCALE = 1.2533

ADDED, REMOVED, SLOWER, FASTER, UNCHANGED = "added", "removed", "slower", "faster", "unchanged"
STATUSES = (SLOWER, FASTER, ADDED, REMOVED, UNCHANGED)
#: The ``--sort-by`` keys: the change (largest first, by size), the ratio (largest first), either
#: side's time (largest first), the name.
SORT_KEYS = ("change", "ratio", "baseline", "candidate", "name")


class GateError(PolyprofError, ValueError):
    """The gate cannot judge: no steps to compare, or a name ``--only`` gives is on neither side."""


@attrs.frozen
class DiffRule:
    """The thresholds of the classification (see the module notes)."""

    threshold: float = DEFAULT_THRESHOLD
    noise_factor: float = DEFAULT_NOISE_FACTOR
    min_time_us: float = DEFAULT_MIN_TIME_US

    def __attrs_post_init__(self) -> None:
        for name in ("threshold", "noise_factor", "min_time_us"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value >= 0 and value != float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")


def robust_spread(values: Sequence[float]) -> float:
    """The median absolute deviation of ``values``, times ``MAD_SCALE``; 0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return MAD_SCALE * statistics.median(abs(v - middle) for v in values)


def classify(baseline: float | None, candidate: float | None, *, threshold: float, noise_us: float) -> str:
    """The status of a row: None is a side the row is not on (see the module notes for the rule)."""
    if baseline is None and candidate is None:
        raise ValueError("a row is on at least one side")
    if baseline is None:
        return ADDED
    if candidate is None:
        return REMOVED
    change = abs(candidate - baseline)
    if change <= threshold * min(baseline, candidate) or change <= noise_us:
        return UNCHANGED
    return SLOWER if candidate > baseline else FASTER


def _ratio(baseline: float | None, candidate: float | None) -> float | None:
    if baseline is None or candidate is None or baseline == 0:
        return None
    return candidate / baseline


@attrs.frozen
class RowDiff:
    """One op or kernel on both sides; ``None`` fields are a side it is not on.

    ``baseline_us``/``candidate_us`` are the compared times: self CPU for an op, total duration for a
    kernel.
    """

    kind: str  # "op" or "kernel"
    name: str
    category: str
    baseline_calls: int | None
    candidate_calls: int | None
    baseline_us: float | None
    candidate_us: float | None
    baseline_total_us: float | None
    candidate_total_us: float | None
    noise_us: float
    status: str

    @property
    def change_us(self) -> float:
        return (self.candidate_us or 0.0) - (self.baseline_us or 0.0)

    @property
    def ratio(self) -> float | None:
        return _ratio(self.baseline_us, self.candidate_us)


@attrs.frozen
class StepDiff:
    """Median step times of the two sides, of the whole run (``rank`` None) or of one rank."""

    rank: int | None
    baseline_steps: int
    candidate_steps: int
    baseline_median_us: float
    candidate_median_us: float
    baseline_spread_us: float
    candidate_spread_us: float
    noise_us: float
    status: str

    @property
    def change_us(self) -> float:
        return self.candidate_median_us - self.baseline_median_us

    @property
    def ratio(self) -> float | None:
        return _ratio(self.baseline_median_us, self.candidate_median_us)


@attrs.frozen
class Side:
    """One side as read: what it is, its ranks, what was left out of it, and its rows."""

    label: str
    paths: tuple[str, ...]
    ranks: tuple[int, ...]
    events: int
    skipped: tuple[Skipped, ...]
    rows: RankRows
    #: The ranks are numbered in file name order: the traces carry no ``distributedInfo``.
    numbered_by_file: bool = False


@attrs.frozen
class RunDiff:
    baseline: Side
    candidate: Side
    rule: DiffRule
    #: The ranks compared: those both sides have.
    ranks: tuple[int, ...]
    ops: tuple[RowDiff, ...]
    kernels: tuple[RowDiff, ...]
    #: The whole run's step times; None when a side has no steps.
    steps: StepDiff | None
    #: Per compared rank, with more than one.
    rank_steps: tuple[StepDiff, ...]
    #: What was not compared, and why.
    notes: tuple[str, ...]
    #: Op and kernel times are per step (each side's totals over its number of steps): both sides
    #: have steps. Otherwise they are the traces' totals.
    per_step: bool = False
    #: Why kernels were not compared (one side has device activity, the other none); None if they were.
    kernels_left_out: str | None = None

    def rows(self) -> tuple[RowDiff, ...]:
        return self.ops + self.kernels


# ------------------------------------------------------------------ reading


def read_side(
    label: str, paths: Sequence[str | os.PathLike[str]], *, memory_limit: str | None = None
) -> Side:
    """One side's per-rank rows, by DuckDB over its traces' Parquet form (temporary copies of JSON ones).

    :raises NoTracesError: no trace of the side could be read (the message names each file and why).
    """
    names = tuple(os.fspath(p) for p in paths)
    with temporary_parquet_dir() as folder:
        try:
            rank_set = collect_rank_set(list(names), folder)
        except NoTracesError as exc:
            raise NoTracesError(f"the {label}: {exc}") from exc
        rows = duckdb_rank_rows(rank_set, memory_limit=memory_limit)
    return side_of(label, names, rank_set, rows)


def side_of(label: str, paths: Sequence[str], rank_set: RankSet, rows: RankRows) -> Side:
    """A side from its rank set and rows; ranks whose analysis failed, and ranks without a single op or
    kernel, join the traces left out.

    :raises NoTracesError: no rank is left.
    """
    failed = dict(rows.failed)
    with_rows = {op.rank for op in rows.ops} | {kernel.rank for kernel in rows.kernels}
    for r in rank_set.ranks:
        if r.rank not in failed and r.rank not in with_rows:
            failed[r.rank] = Skipped(
                r.source, "no profiler events to compare (no cpu_op, kernel or other Kineto event)"
            )
    ranks = tuple(r for r in rank_set.ranks if r.rank not in failed)
    skipped = rank_set.skipped + tuple(failed[r] for r in sorted(failed))
    if not ranks:
        raise NoTracesError(
            f"the {label} has no trace to compare: " + "; ".join(f"{s.path}: {s.reason}" for s in skipped)
        )
    return Side(
        label=label,
        paths=tuple(paths),
        ranks=tuple(r.rank for r in ranks),
        events=sum(r.events for r in ranks),
        skipped=skipped,
        rows=rows,
        numbered_by_file=not rank_set.ranks_from_traces,
    )


def diff_runs(
    baseline: Sequence[str | os.PathLike[str]],
    candidate: Sequence[str | os.PathLike[str]],
    *,
    rule: DiffRule | None = None,
    memory_limit: str | None = None,
) -> RunDiff:
    """The comparison of the traces in ``baseline`` with those in ``candidate`` (files or directories)."""
    return compare_sides(
        read_side("baseline", baseline, memory_limit=memory_limit),
        read_side("candidate", candidate, memory_limit=memory_limit),
        rule or DiffRule(),
    )


# ------------------------------------------------------------------ comparing


@attrs.frozen
class _Sums:
    """One op's or kernel's sums over the compared ranks: the time it is judged on (self time for an
    op, duration for a kernel) and its total time."""

    calls: int = 0
    time_us: float = 0.0
    total_us: float = 0.0

    def plus(self, calls: int, time_us: float, total_us: float) -> _Sums:
        return _Sums(self.calls + calls, self.time_us + time_us, self.total_us + total_us)


def _sum_ops(rows: RankRows, ranks: frozenset[int]) -> dict[tuple[str, str], _Sums]:
    out: dict[tuple[str, str], _Sums] = {}
    for op in rows.ops:
        if op.rank in ranks:
            out[(op.name, "")] = out.get((op.name, ""), _Sums()).plus(op.calls, op.self_us, op.total_us)
    return out


def _sum_kernels(rows: RankRows, ranks: frozenset[int]) -> dict[tuple[str, str], _Sums]:
    out: dict[tuple[str, str], _Sums] = {}
    for k in rows.kernels:
        if k.rank in ranks:
            key = (k.name, k.category)
            out[key] = out.get(key, _Sums()).plus(k.calls, k.total_us, k.total_us)
    return out


def _step_times(rows: RankRows, ranks: frozenset[int]) -> dict[int, dict[int, float]]:
    """Rank -> step number -> duration (µs), of the ``ranks``."""
    by_rank: dict[int, dict[int, float]] = defaultdict(dict)
    for step in sorted(rows.steps, key=lambda s: (s.rank, s.step)):
        if step.rank in ranks:
            by_rank[step.rank][step.step] = step.duration_us
    return by_rank


def run_step_times(by_rank: dict[int, dict[int, float]]) -> list[float]:
    """The run's step times: each step number's longest duration over the ranks that ran it (ranks
    that synchronise wait for the slowest), in step order."""
    longest: dict[int, float] = {}
    for steps in by_rank.values():
        for step, duration in steps.items():
            longest[step] = max(longest.get(step, 0.0), duration)
    return [longest[s] for s in sorted(longest)]


def median_difference_error(spread_b: float, n_b: int, spread_c: float, n_c: int) -> float:
    """The standard error of the difference of two sides' medians, from each side's robust spread
    and number of steps (each median's error is ``MEDIAN_SE_SCALE * spread / sqrt(n)``)."""
    return MEDIAN_SE_SCALE * math.sqrt(spread_b**2 / n_b + spread_c**2 / n_c)


def step_diff(
    rank: int | None, baseline: Sequence[float], candidate: Sequence[float], rule: DiffRule
) -> StepDiff:
    """The step-time comparison of two non-empty lists of step durations (µs)."""
    spread_b, spread_c = robust_spread(baseline), robust_spread(candidate)
    median_b, median_c = statistics.median(baseline), statistics.median(candidate)
    noise = rule.noise_factor * median_difference_error(spread_b, len(baseline), spread_c, len(candidate))
    return StepDiff(
        rank=rank,
        baseline_steps=len(baseline),
        candidate_steps=len(candidate),
        baseline_median_us=median_b,
        candidate_median_us=median_c,
        baseline_spread_us=spread_b,
        candidate_spread_us=spread_c,
        noise_us=noise,
        status=classify(median_b, median_c, threshold=rule.threshold, noise_us=noise),
    )


def _row_diffs(
    kind: str,
    baseline: dict[tuple[str, str], _Sums],
    candidate: dict[tuple[str, str], _Sums],
    rule: DiffRule,
    relative_noise: float,
    steps: tuple[int, int] = (1, 1),
) -> tuple[RowDiff, ...]:
    """Each row of either side; times divided by each side's ``steps`` (its number of steps, or 1)."""
    per_b, per_c = steps
    out = []
    for name, category in sorted(baseline.keys() | candidate.keys()):
        b, c = baseline.get((name, category)), candidate.get((name, category))
        b_us = None if b is None else b.time_us / per_b
        c_us = None if c is None else c.time_us / per_c
        smaller = min(v for v in (b_us, c_us) if v is not None)
        noise = max(rule.min_time_us, relative_noise * smaller)
        out.append(
            RowDiff(
                kind=kind,
                name=name,
                category=category,
                baseline_calls=None if b is None else b.calls,
                candidate_calls=None if c is None else c.calls,
                baseline_us=b_us,
                candidate_us=c_us,
                baseline_total_us=None if b is None else b.total_us / per_b,
                candidate_total_us=None if c is None else c.total_us / per_c,
                noise_us=noise,
                status=classify(b_us, c_us, threshold=rule.threshold, noise_us=noise),
            )
        )
    return tuple(out)


def _ranks_text(ranks: Iterable[int]) -> str:
    listed = sorted(ranks)
    shown = ", ".join(str(r) for r in listed[:8]) + (", ..." if len(listed) > 8 else "")
    return f"rank {shown}" if len(listed) == 1 else f"ranks {shown}"


def _compare_steps(
    baseline: Side, candidate: Side, common: frozenset[int], rule: DiffRule, notes: list[str]
) -> tuple[StepDiff | None, tuple[StepDiff, ...], tuple[int, int]]:
    """The whole run's and each rank's step comparison, and each side's number of steps (0: none)."""
    steps_b, steps_c = _step_times(baseline.rows, common), _step_times(candidate.rows, common)
    all_b, all_c = run_step_times(steps_b), run_step_times(steps_c)
    for side, found in ((baseline, all_b), (candidate, all_c)):
        if common and not found:
            notes.append(
                f"the {side.label} has no steps (ProfilerStep#N): step times not compared, and op and "
                "kernel times are the traces' totals; profile with a schedule and call prof.step()"
            )
    if not (all_b and all_c):
        return None, (), (len(all_b), len(all_c))
    rank_steps = tuple(
        step_diff(r, list(steps_b[r].values()), list(steps_c[r].values()), rule)
        for r in sorted(common)
        if len(common) > 1 and steps_b[r] and steps_c[r]
    )
    return step_diff(None, all_b, all_c, rule), rank_steps, (len(all_b), len(all_c))


def _relative_noise(steps: StepDiff, rule: DiffRule) -> float:
    """The step times' noise as a share of a step: each side's spread relative to its own median."""
    relative_b = steps.baseline_spread_us / steps.baseline_median_us if steps.baseline_median_us else 0.0
    relative_c = steps.candidate_spread_us / steps.candidate_median_us if steps.candidate_median_us else 0.0
    return rule.noise_factor * median_difference_error(
        relative_b, steps.baseline_steps, relative_c, steps.candidate_steps
    )


def compare_sides(baseline: Side, candidate: Side, rule: DiffRule) -> RunDiff:
    """The comparison of two sides' rows under ``rule`` (see the module notes)."""
    notes: list[str] = []
    if set(baseline.paths) == set(candidate.paths):
        notes.append("the baseline and the candidate are the same traces: every row compares with itself")
    for side in (baseline, candidate):
        if side.numbered_by_file and len(side.ranks) > 1:
            # As polyprof report reads them; cycles of one recording (a repeating schedule) look the same.
            notes.append(
                f"the {side.label}'s {len(side.ranks)} traces carry no rank (distributedInfo): read as "
                f"{_ranks_text(side.ranks)} in file name order; if they are cycles of one recording (a "
                "repeating schedule), compare one trace a side"
            )
    common = frozenset(baseline.ranks) & frozenset(candidate.ranks)
    for side, other in ((baseline, candidate), (candidate, baseline)):
        only = set(side.ranks) - set(other.ranks)
        if only:
            notes.append(
                f"{_ranks_text(only)} of the {side.label} ({len(side.ranks)} ranks; the {other.label} has "
                f"{len(other.ranks)}) not compared"
            )
    if not common:
        notes.append("no rank on both sides: nothing compared")
    # steps first: their noise sets the ops' and kernels', and their number makes times per step
    steps, rank_steps, (n_b, n_c) = _compare_steps(baseline, candidate, common, rule, notes)
    relative_noise = 0.0 if steps is None else _relative_noise(steps, rule)
    per_step = steps is not None
    divisors = (n_b, n_c) if per_step else (1, 1)
    ops_b, ops_c = _sum_ops(baseline.rows, common), _sum_ops(candidate.rows, common)
    ops = _row_diffs("op", ops_b, ops_c, rule, relative_noise, divisors)
    kernels_b = _sum_kernels(baseline.rows, common)
    kernels_c = _sum_kernels(candidate.rows, common)
    kernels: tuple[RowDiff, ...] = ()
    kernels_left_out: str | None = None
    if bool(kernels_b) != bool(kernels_c):
        with_kernels, without = (baseline, candidate) if kernels_b else (candidate, baseline)
        kernels_left_out = (
            f"the {with_kernels.label} has device activity (GPU kernels, memcpy, memset), the "
            f"{without.label} has none (a CPU-only profile?)"
        )
        notes.append(f"kernels: {kernels_left_out}; only CPU ops are compared")
    else:
        kernels = _row_diffs("kernel", kernels_b, kernels_c, rule, relative_noise, divisors)
    return RunDiff(
        baseline=baseline,
        candidate=candidate,
        rule=rule,
        ranks=tuple(sorted(common)),
        ops=ops,
        kernels=kernels,
        steps=steps,
        rank_steps=rank_steps,
        notes=tuple(notes),
        per_step=per_step,
        kernels_left_out=kernels_left_out,
    )


# ------------------------------------------------------------------ the gate


@attrs.frozen
class GateResult:
    failed: bool
    #: Why it failed (each slower thing), or what passed.
    reasons: tuple[str, ...]


def _percent(value: float) -> str:
    return f"{value * 100:g}%"


def gate(diff: RunDiff, limit: float, only: Sequence[str] = ()) -> GateResult:
    """``--fail-if-slower limit`` (see the module notes).

    :raises GateError: without ``only``, a side has no steps; with it, a name is on neither side.
    """
    if not only:
        if diff.steps is None:
            raise GateError(
                "--fail-if-slower compares median step times, and "
                + ("no rank is on both sides" if not diff.ranks else "a side has no ProfilerStep#N steps")
                + ": name ops or kernels to judge with --only NAME"
            )
        s = diff.steps
        verdict = _verdict("median step time", s.baseline_median_us, s.candidate_median_us, s.noise_us, limit)
        return GateResult(verdict[0], (verdict[1],))
    wanted = set(only)
    rows = [r for r in diff.rows() if r.name in wanted]
    missing = sorted(wanted - {r.name for r in rows})
    if missing:
        names = ", ".join(terminal_safe(m) for m in missing)
        if diff.kernels_left_out is not None:
            raise GateError(f"--only names no op of either side: {names}; kernels were not compared: "
                            f"{diff.kernels_left_out}")  # fmt: skip
        raise GateError(f"--only names no op or kernel of either side: {names}")
    failed, passed = [], []
    for r in rows:
        what = f"{r.kind} {terminal_safe(r.name)}"
        if r.baseline_us is None and (r.candidate_us or 0.0) > diff.rule.min_time_us:
            failed.append(f"{what}: new in the candidate ({format_time(r.candidate_us or 0.0)})")
        elif r.baseline_us is None:
            passed.append(f"{what}: new in the candidate, within {format_time(diff.rule.min_time_us)}")
        elif r.candidate_us is None:
            passed.append(f"{what}: not in the candidate")
        else:
            slower, reason = _verdict(what, r.baseline_us, r.candidate_us, r.noise_us, limit)
            (failed if slower else passed).append(reason)
    return GateResult(bool(failed), tuple(failed or passed))


def _verdict(what: str, baseline: float, candidate: float, noise_us: float, limit: float) -> tuple[bool, str]:
    """Whether ``candidate`` is slower than ``baseline`` past ``limit`` and ``noise_us``, and a line why."""
    change = candidate - baseline
    percent = _change_percent(_ratio(baseline, candidate))
    text = f"{what}: {format_time(baseline)} -> {format_time(candidate)} ({percent})"
    noise = format_time(noise_us)
    if change > limit * baseline and change > noise_us:
        return True, f"{text}: slower by more than {_percent(limit)} and than the noise ({noise})"
    if change <= 0:
        return False, f"{text}: not slower"
    return False, f"{text}: within {_percent(limit)} or the noise ({noise})"


# ------------------------------------------------------------------ output


def _change_percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def sorted_rows(rows: Sequence[RowDiff], sort_by: str) -> list[RowDiff]:
    """``rows`` by ``sort_by`` (``SORT_KEYS``), largest first; ties by name."""
    keys: dict[str, Callable[[RowDiff], Any]] = {
        "change": lambda r: (-abs(r.change_us), r.name, r.category),
        "ratio": lambda r: (
            -(float("inf") if r.baseline_us in (None, 0) and r.candidate_us else (r.ratio or 0.0)),
            r.name,
            r.category,
        ),
        "baseline": lambda r: (-(r.baseline_us or 0.0), r.name, r.category),
        "candidate": lambda r: (-(r.candidate_us or 0.0), r.name, r.category),
        "name": lambda r: (r.name, r.category),
    }
    if sort_by not in keys:
        raise ValueError(f"unknown sort key {sort_by!r}; choose one of: {', '.join(SORT_KEYS)}")
    return sorted(rows, key=keys[sort_by])


def _side_json(side: Side) -> dict[str, Any]:
    return {
        "paths": list(side.paths),
        "ranks": list(side.ranks),
        "events": side.events,
        "skipped": [attrs.asdict(s) for s in side.skipped],
    }


def _row_json(r: RowDiff) -> dict[str, Any]:
    return {**attrs.asdict(r), "change_us": r.change_us, "ratio": r.ratio}


def _step_json(s: StepDiff) -> dict[str, Any]:
    return {**attrs.asdict(s), "change_us": s.change_us, "ratio": s.ratio}


def diff_json(diff: RunDiff, *, sort_by: str = "change", row_limit: int = -1) -> dict[str, Any]:
    """The comparison as plain data, times in µs; ``row_limit`` rows of ops and of kernels (-1: all)."""

    def limited(rows: Sequence[RowDiff]) -> list[dict[str, Any]]:
        ordered = sorted_rows(rows, sort_by)
        return [_row_json(r) for r in (ordered if row_limit < 0 else ordered[:row_limit])]

    return {
        "baseline": _side_json(diff.baseline),
        "candidate": _side_json(diff.candidate),
        "rule": attrs.asdict(diff.rule),
        "ranks_compared": list(diff.ranks),
        "notes": list(diff.notes),
        "summary": summary(diff),
        "steps": None if diff.steps is None else _step_json(diff.steps),
        "rank_steps": [_step_json(s) for s in diff.rank_steps],
        "ops": limited(diff.ops),
        "kernels": limited(diff.kernels),
    }


def summary(diff: RunDiff) -> dict[str, dict[str, int]]:
    """Per kind (ops, kernels), how many rows have each status."""
    return {
        kind: {status: sum(r.status == status for r in rows) for status in STATUSES}
        for kind, rows in (("ops", diff.ops), ("kernels", diff.kernels))
    }


def _time(us: float | None) -> str:
    return "-" if us is None else format_time(us)


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _signed_time(us: float) -> str:
    return ("+" if us >= 0 else "-") + format_time(abs(us))


def _name(name: str, width: int = 50) -> str:
    return short_name(terminal_safe(name), width)


STEPS_HEADER = ("Steps", "Status", "Baseline", "Candidate", "Change", "Ratio", "Noise", "N base", "N cand")
OPS_HEADER = ("Name", "Status", "Calls base", "Calls cand", "Self base", "Self cand", "Total base",
              "Total cand", "Change", "Ratio")  # fmt: skip
KERNELS_HEADER = ("Name", "Category", "Status", "Calls base", "Calls cand", "Time base", "Time cand",
                  "Change", "Ratio")  # fmt: skip


def _step_cells(s: StepDiff) -> list[str]:
    return [
        "all ranks" if s.rank is None else f"rank {s.rank}",
        s.status,
        format_time(s.baseline_median_us),
        format_time(s.candidate_median_us),
        _signed_time(s.change_us),
        _change_percent(s.ratio),
        format_time(s.noise_us),
        str(s.baseline_steps),
        str(s.candidate_steps),
    ]


def render_diff_text(diff: RunDiff, *, sort_by: str = "change", row_limit: int = 100) -> str:
    """The comparison as text for a terminal; every text from the traces goes through ``terminal_safe``."""
    lines = []
    for side in (diff.baseline, diff.candidate):
        paths = ", ".join(terminal_safe(p) for p in side.paths)
        lines.append(f"{side.label}: {paths} ({len(side.ranks)} ranks, {side.events:,} events)")
    rule = diff.rule
    lines.append(
        f"rule: a change counts past {_percent(rule.threshold)} and the noise ({rule.noise_factor:g} x the "
        f"standard error of the difference of median step times; ops and kernels at least "
        f"{format_time(rule.min_time_us)})"
    )
    for note in diff.notes:
        lines.append(f"note: {note}")
    if diff.steps is not None:
        lines += ["", "Median step time (ProfilerStep#N):"]
        lines += text_table(STEPS_HEADER, [_step_cells(s) for s in (diff.steps, *diff.rank_steps)], left=2)
    per = (
        f" per step (over {diff.steps.baseline_steps} and {diff.steps.candidate_steps} steps)"
        if diff.per_step and diff.steps is not None
        else " over the whole traces"
    )
    for kind, rows, header, cells in (
        (f"Ops (CPU), self time{per}", diff.ops, OPS_HEADER, _op_cells),
        (f"Kernels (device activity), total time{per}", diff.kernels, KERNELS_HEADER, _kernel_cells),
    ):
        if not rows:
            continue
        ordered = sorted_rows(rows, sort_by)
        shown = ordered if row_limit < 0 else ordered[:row_limit]
        counts = summary(diff)["ops" if kind.startswith("Ops") else "kernels"]
        lines += [
            "",
            f"{kind}, by {sort_by} ({len(shown)} of {len(rows)}): "
            + ", ".join(f"{n} {status}" for status, n in counts.items() if n),
        ]
        if shown:
            left = 2 if header is OPS_HEADER else 3
            lines += text_table(header, [cells(r) for r in shown], left=left)
    return "\n".join(lines) + "\n"


def _op_cells(r: RowDiff) -> list[str]:
    return [
        _name(r.name),
        r.status,
        _count(r.baseline_calls),
        _count(r.candidate_calls),
        _time(r.baseline_us),
        _time(r.candidate_us),
        _time(r.baseline_total_us),
        _time(r.candidate_total_us),
        _signed_time(r.change_us),
        _change_percent(r.ratio),
    ]


def _kernel_cells(r: RowDiff) -> list[str]:
    return [
        _name(r.name),
        _name(r.category, 12),
        r.status,
        _count(r.baseline_calls),
        _count(r.candidate_calls),
        _time(r.baseline_us),
        _time(r.candidate_us),
        _signed_time(r.change_us),
        _change_percent(r.ratio),
    ]


__all__ = [
    "ADDED",
    "DEFAULT_MIN_TIME_US",
    "DEFAULT_NOISE_FACTOR",
    "DEFAULT_THRESHOLD",
    "FASTER",
    "MAD_SCALE",
    "MEDIAN_SE_SCALE",
    "REMOVED",
    "SLOWER",
    "SORT_KEYS",
    "STATUSES",
    "UNCHANGED",
    "DiffRule",
    "GateError",
    "GateResult",
    "RowDiff",
    "RunDiff",
    "Side",
    "StepDiff",
    "classify",
    "compare_sides",
    "diff_json",
    "diff_runs",
    "gate",
    "median_difference_error",
    "read_side",
    "render_diff_text",
    "robust_spread",
    "run_step_times",
    "side_of",
    "sorted_rows",
    "step_diff",
    "summary",
]
