"""Post-processing against torch.profiler, in the same run, as ratios (issue 12's targets).

Workloads: N tiny ops (``torch.add`` on 1-element tensors, one ``aten::add`` event each) at each size of
``--sizes``, and a small conv net (forward + backward, ``--steps`` steps). Each measurement runs in a fresh
child process per profiler (so peak RSS is that profiler's own); torch and polyprof children are
interleaved so background load hits both alike. Each child reports:

* loop overhead: profiled loop time / unprofiled loop time, in the same child;
* exit-to-table: from the end of the with-block's body to the printed table, split into torch's
  ``_disable_profiler()`` (timed by a wrapper the child installs on ``torch._C._autograd`` and
  ``torch.autograd.profiler`` before profiling; both profilers look the function up there when they
  stop, so the wrapper adds one ``perf_counter`` pair and changes nothing else) and the rest, which for
  polyprof is its own part;
* export: the first Chrome export after the profile (fresh: deferred columns still to decode) and, for
  polyprof, a second one (warm); torch's result can be saved only once, so both are compared with
  torch's one export. Both children's warm-up exports a 1-op profile first, so neither measurement
  carries the process's one-time start of the exporter (its imports and the first run of its code);
  that warm-up export is reported on its own (``export_first_in_process_s``);
* peak RSS of the child (``ru_maxrss``), after the table and after both exports.

The parent prints medians, ratios, a linear fit of each time against events with its residuals, and
the targets as pass/fail lines (never assertions), writes everything to ``--json`` and draws the
log-log scaling plot to ``--plot`` (matplotlib: ``pip install -e .[bench]``). ``--where SIZE`` adds one
polyprof child under cProfile (every thread) and reports where its own time goes. ``--at COMMIT`` measures
that commit's ``core`` and ``plugins`` (extracted to a temporary folder that the children import first)
instead of the checkout, which others may be editing during the run. ``--reader`` chooses how polyprof
reads torch's result (``POLYPROF_KINETO_READER``): its compiled reader (default; built once before the
first child, outside every measurement) or the pure-Python fallback.

Usage:
    python benchmarks/bench_postprocessing.py --at HEAD --json out.json --plot docs/images/scaling.png
    python benchmarks/bench_postprocessing.py --sizes 10000,200000,5000000 --torch-max-size 1000000
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from child_workloads import WORKLOADS

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SIZES = (10_000, 50_000, 200_000, 1_000_000)
PROFILERS = ("torch", "polyprof")
# The JSON's layout; bump when a key changes meaning so readers of old files can tell.
# 2: the warm-up exports too, so export_fresh_s no longer carries the process's first export, which
# export_first_in_process_s reports.
RESULT_SCHEMA = "polyprof-bench-postprocessing/2"

CHILD = (
    r"""
import cProfile, io, json, os, pstats, resource, sys, tempfile, threading, time
import torch
import torch._C._autograd as torch_c_autograd
import torch.autograd.profiler as torch_autograd_profiler

torch.set_num_threads(1)
which, workload, n_ops, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

# Time torch's _disable_profiler where both profilers look it up at stop time.
disable_calls = []
original_disable = torch_c_autograd._disable_profiler
def timed_disable(*args, **kwargs):
    started = time.perf_counter()
    try:
        return original_disable(*args, **kwargs)
    finally:
        disable_calls.append(time.perf_counter() - started)
torch_c_autograd._disable_profiler = timed_disable
torch_autograd_profiler._disable_profiler = timed_disable

"""
    + WORKLOADS
    + r"""

# Warm-up: one-time initialisation of torch, of the profiler and of its exporter (imports, the first
# run of their code), in both children alike. The warm-up's export is timed: what a process's first
# export costs on top (export_first_in_process_s, a 1-op profile).
body()
with profile(activities=[ProfilerActivity.CPU]) as p:
    torch.add(torch.ones(1), torch.ones(1))
p.key_averages().table()
with tempfile.TemporaryDirectory() as folder:
    t0 = time.perf_counter(); p.export_chrome_trace(os.path.join(folder, "warm-up.json"))
    export_first_in_process = time.perf_counter() - t0
del p

# cProfile mode: one profiler per thread (the bus and export threads start after this), plus the main
# thread's own around each phase.
thread_profilers = []
def profile_new_thread(*_):
    prof = cProfile.Profile()
    thread_profilers.append((threading.current_thread().name, prof))
    prof.enable()
if mode == "cprofile":
    threading.setprofile(profile_new_thread)
main_profilers = {}
def phase(name, on):
    if mode != "cprofile":
        return
    if on:
        main_profilers[name] = cProfile.Profile(); main_profilers[name].enable()
    else:
        main_profilers[name].disable()

t0 = time.perf_counter(); body(); unprofiled = time.perf_counter() - t0
with profile(activities=[ProfilerActivity.CPU]) as prof:
    t0 = time.perf_counter(); body(); profiled = time.perf_counter() - t0
    del disable_calls[:]
    phase("exit_to_table", True)
    t_end = time.perf_counter()
t_exit = time.perf_counter()
table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
sys.stderr.write(table[:200])
t_table = time.perf_counter()
phase("exit_to_table", False)
if len(disable_calls) != 1:
    raise SystemExit(f"expected one timed _disable_profiler call at exit, saw {len(disable_calls)}")
peak_after_table = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

exports = []
with tempfile.TemporaryDirectory() as folder:
    # torch's result can be saved once ("Trace is already saved"): its one export is the comparison.
    for attempt in ("fresh", "warm") if which == "polyprof" else ("fresh",):
        path = os.path.join(folder, attempt + ".json")
        phase("export_" + attempt, True)
        t0 = time.perf_counter(); prof.export_chrome_trace(path); exports.append(time.perf_counter() - t0)
        phase("export_" + attempt, False)
        trace_bytes = os.path.getsize(path)
        os.remove(path)

result = {"unprofiled_s": unprofiled, "profiled_loop_s": profiled,
          "disable_s": disable_calls[0], "exit_s": t_exit - t_end, "table_s": t_table - t_exit,
          "exit_to_table_s": t_table - t_end,
          "export_fresh_s": exports[0], "trace_bytes": trace_bytes,
          "export_first_in_process_s": export_first_in_process,
          "peak_rss_after_table_mb": peak_after_table,
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
if len(exports) > 1:
    result["export_warm_s"] = exports[1]
if mode == "cprofile":
    threading.setprofile(None)
    stats = []
    def top(label, prof, limit=40):
        prof.disable()
        st = pstats.Stats(prof)
        rows = sorted(st.stats.items(), key=lambda kv: kv[1][3], reverse=True)[:limit]
        for (filename, line, func), (cc, nc, tt, ct, callers) in rows:
            where = filename.rsplit("site-packages/", 1)[-1].rsplit("/work/main/", 1)[-1]
            stats.append({"profile": label, "function": f"{where}:{line}({func})",
                          "calls": nc, "tottime_s": tt, "cumtime_s": ct})
    for name, prof in main_profilers.items():
        top("main thread, " + name, prof)
    for index, (name, prof) in enumerate(thread_profilers):  # each export starts its own thread
        top(f"thread {name} (#{index + 1} started)", prof)
    result["cprofile"] = stats
print(json.dumps(result))
"""
)


def child_env(source: str | None) -> dict[str, str]:
    """The environment of a child process; ``source``: a snapshot's folder, imported first."""
    env = dict(os.environ)
    # Installed packages import from bytecode: where the environment forbids writing it, every lazy
    # import (the exporter's, at the first export) would compile its source inside a measurement.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "polyprof-bench-pycache"))
    if source:
        # sys.path wins over the editable install's finder, so the snapshot's packages are the ones imported.
        paths = [os.path.join(source, "core"), os.path.join(source, "plugins"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def run_child(
    which: str, workload: str, n_ops: int, mode: str = "time", source: str | None = None
) -> dict[str, Any]:
    """One fresh child process: ``which`` profiler, ``workload`` of ``n_ops``; its JSON result.

    ``source``: a folder holding a snapshot's ``core`` and ``plugins``, imported instead of the checkout.
    """
    env = dict(child_env(source), KINETO_LOG_LEVEL="5")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, which, workload, str(n_ops), mode],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"{which}/{workload}/{n_ops} failed (exit {out.returncode}):\n{out.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# --- pure functions (tests/test_benchmarks.py runs them on synthetic numbers) -----------------------

METRICS = (
    "unprofiled_s",
    "profiled_loop_s",
    "loop_overhead",
    "disable_s",
    "after_disable_s",
    "exit_s",
    "table_s",
    "exit_to_table_s",
    "export_fresh_s",
    "export_warm_s",
    "export_first_in_process_s",
    "trace_bytes",
    "peak_rss_after_table_mb",
    "peak_rss_mb",
)


def summarise(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Median of each metric over a profiler's runs at one size (derived metrics computed per run).

    A metric the runs lack (torch has no warm export) is left out.
    """
    if not runs:
        raise ValueError("no runs to summarise")
    derived = [
        dict(
            run,
            loop_overhead=run["profiled_loop_s"] / run["unprofiled_s"],
            after_disable_s=run["exit_to_table_s"] - run["disable_s"],
        )
        for run in runs
    ]
    return {
        metric: statistics.median(run[metric] for run in derived)
        for metric in METRICS
        if metric in derived[0]
    }


def _weighted_line(xs: Sequence[float], ys: Sequence[float], weights: Sequence[float]) -> tuple[float, float]:
    """Weighted least squares ``y = intercept + slope * x``: (slope, intercept)."""
    total = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, xs)) / total
    mean_y = sum(w * y for w, y in zip(weights, ys)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs))
    slope = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(weights, xs, ys)) / sxx
    return slope, mean_y - slope * mean_x


def fit_linear(sizes: Sequence[float], times: Sequence[float]) -> dict[str, Any]:
    """``time = intercept + slope * size`` fitted to relative error, and the log-log slope (1 is linear).

    The sizes span decades, so a plain least-squares line would follow the largest size only: each point
    is weighted by 1/time², and each residual is relative to the measured time.
    """
    if len(sizes) != len(times):
        raise ValueError(f"{len(sizes)} sizes but {len(times)} times")
    if len(set(sizes)) < 2:
        raise ValueError("a fit needs at least two distinct sizes")
    if min(times) <= 0 or min(sizes) <= 0:
        raise ValueError("sizes and times must be positive")
    slope, intercept = _weighted_line(sizes, times, [1 / t**2 for t in times])
    relative = [(t - (intercept + slope * n)) / t for n, t in zip(sizes, times)]
    log_slope, _ = _weighted_line(
        [math.log(n) for n in sizes], [math.log(t) for t in times], [1.0] * len(sizes)
    )
    return {
        "sizes": list(sizes),
        "times_s": list(times),
        "slope_s_per_million": slope * 1e6,
        "intercept_s": intercept,
        "relative_residuals": relative,
        "log_log_slope": log_slope,
    }


# Scale target: a log-log slope above this means cost grows faster than events.
LINEAR_LOG_SLOPE_LIMIT = 1.1
# Loop overhead "no worse than torch's": run-to-run noise of the profiled loop is a few percent.
LOOP_OVERHEAD_NOISE = 1.05


def _target(name: str, size: int | str, ratio: float, limit: float, detail: str) -> dict[str, Any]:
    return {
        "target": name,
        "size": size,
        "ratio": ratio,
        "limit": limit,
        "met": ratio <= limit,
        "detail": detail,
    }


def evaluate_targets(
    summaries: dict[str, dict[int | str, dict[str, float]]], fits: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Issue 12's targets as records ``{target, size, ratio, limit, met, detail}``, from the medians.

    ``summaries[profiler][size]`` is a ``summarise`` result (size ``"convnet"`` for the conv net); a size
    torch did not run at gets no ratio targets. ``fits`` maps a series name to a ``fit_linear`` result.
    """
    targets: list[dict[str, Any]] = []
    poly, torch = summaries.get("polyprof", {}), summaries.get("torch", {})
    for size in sorted(poly, key=lambda s: (isinstance(s, str), s)):
        p = poly[size]
        t = torch.get(size)
        if t is None:
            continue
        if isinstance(size, int):
            targets.append(
                _target(
                    "polyprof's own exit-to-table <= 30% of torch's _disable_profiler()",
                    size,
                    p["after_disable_s"] / t["disable_s"],
                    0.30,
                    f"{p['after_disable_s']:.3f} s / {t['disable_s']:.3f} s",
                )
            )
        # torch saves its result once: both of polyprof's exports are held to torch's one.
        torch_export = t["export_fresh_s"]
        for kind in ("fresh", "warm"):
            mine = p[f"export_{kind}_s"]
            targets.append(
                _target(
                    f"export ({kind}) <= torch",
                    size,
                    mine / torch_export,
                    1.0,
                    f"{mine:.3f} s / {torch_export:.3f} s",
                )
            )
        if isinstance(size, int) and size >= 200_000:
            limit = 0.40 if size >= 1_000_000 else 0.50
            targets.append(
                _target(
                    f"peak RSS <= {limit:.0%} of torch's",
                    size,
                    p["peak_rss_mb"] / t["peak_rss_mb"],
                    limit,
                    f"{p['peak_rss_mb']:.0f} MB / {t['peak_rss_mb']:.0f} MB",
                )
            )
        targets.append(
            _target(
                "loop overhead <= torch's (5% noise band)",
                size,
                p["loop_overhead"] / t["loop_overhead"],
                LOOP_OVERHEAD_NOISE,
                f"{p['loop_overhead']:.3f}x / {t['loop_overhead']:.3f}x unprofiled",
            )
        )
    for series, fit in fits.items():
        if series.startswith("polyprof "):
            sizes = fit["sizes"]
            targets.append(
                _target(
                    f"{series} linear in events (log-log slope <= {LINEAR_LOG_SLOPE_LIMIT})",
                    f"{min(sizes)}-{max(sizes)}",
                    fit["log_log_slope"],
                    LINEAR_LOG_SLOPE_LIMIT,
                    "residuals " + ", ".join(f"{r:+.0%}" for r in fit["relative_residuals"]),
                )
            )
    return targets


# Series fitted and plotted: (name, profiler, metric).
SERIES = (
    ("torch exit-to-table", "torch", "exit_to_table_s"),
    ("torch _disable_profiler()", "torch", "disable_s"),
    ("polyprof exit-to-table", "polyprof", "exit_to_table_s"),
    ("polyprof own part of exit-to-table", "polyprof", "after_disable_s"),
    ("torch export (one save)", "torch", "export_fresh_s"),
    ("polyprof export (fresh)", "polyprof", "export_fresh_s"),
    ("polyprof export (warm)", "polyprof", "export_warm_s"),
)


def fit_series(summaries: dict[str, dict[int | str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """``fit_linear`` of each of ``SERIES`` over the integer sizes its profiler ran at (two or more)."""
    fits = {}
    for name, profiler, metric in SERIES:
        sizes = sorted(s for s in summaries.get(profiler, {}) if isinstance(s, int))
        if len(sizes) >= 2:
            fits[name] = fit_linear(sizes, [summaries[profiler][s][metric] for s in sizes])
    return fits


def build_result(
    meta: dict[str, Any],
    runs: dict[str, dict[int | str, list[dict[str, float]]]],
    summaries: dict[str, dict[int | str, dict[str, float]]],
    fits: dict[str, dict[str, Any]],
    targets: list[dict[str, Any]],
    where: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The machine-readable result; sizes become strings (JSON object keys)."""
    return {
        "schema": RESULT_SCHEMA,
        "meta": meta,
        "runs": {p: {str(s): r for s, r in by_size.items()} for p, by_size in runs.items()},
        "medians": {p: {str(s): m for s, m in by_size.items()} for p, by_size in summaries.items()},
        "fits": fits,
        "targets": targets,
        "where_the_time_goes": where,
    }


def format_targets(targets: list[dict[str, Any]]) -> list[str]:
    """One ``PASS``/``FAIL`` line per target."""
    return [
        f"{'PASS' if t['met'] else 'FAIL'}  {t['target']} at {t['size']}: "
        f"{t['ratio']:.3f} (limit {t['limit']}; {t['detail']})"
        for t in targets
    ]


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated positive event counts, e.g. ``10000,200000`` or ``10k,1M``."""
    sizes = []
    for part in text.split(","):
        word = part.strip().lower()
        scale = {"k": 1_000, "m": 1_000_000}.get(word[-1:], 1)
        digits = word[:-1] if scale != 1 else word
        try:
            size = int(float(digits) * scale)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--sizes: {part!r} is not a number of events (valid: 10000, 50k, 1M, comma-separated)"
            ) from None
        if size <= 0:
            raise argparse.ArgumentTypeError(f"--sizes: {part!r} must be positive")
        sizes.append(size)
    return sorted(set(sizes))


def write_plot(path: str, summaries: dict[str, dict[int | str, dict[str, float]]], title: str) -> None:
    """Log-log time against events for exit-to-table and export, both profilers."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=90, sharey=True)
    styles = {"torch": ("tab:red", "o"), "polyprof": ("tab:blue", "s")}
    panels = (("end of with-block to printed table", "exit"), ("Chrome export", "export"))
    for ax, (panel_title, prefix) in zip(axes, panels):
        for name, profiler, metric in SERIES:
            if not metric.startswith(prefix) and not (
                prefix == "exit" and metric in ("disable_s", "after_disable_s")
            ):
                continue
            sizes = sorted(s for s in summaries.get(profiler, {}) if isinstance(s, int))
            if not sizes:
                continue
            color, marker = styles[profiler]
            dashed = metric in ("disable_s", "after_disable_s", "export_warm_s")
            ax.plot(
                sizes,
                [summaries[profiler][s][metric] for s in sizes],
                color=color,
                marker=marker,
                linestyle="--" if dashed else "-",
                label=name,
            )
        torch_sizes = sorted(s for s in summaries.get("torch", {}) if isinstance(s, int))
        if prefix == "exit" and torch_sizes:
            ax.plot(
                torch_sizes,
                [0.30 * summaries["torch"][s]["disable_s"] for s in torch_sizes],
                color="grey",
                linestyle=":",
                label="target for polyprof's own part: 30% of torch's _disable_profiler()",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("events (torch.add ops)")
        ax.set_title(panel_title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("seconds (median)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def summarise_where(
    cprofile_rows: list[dict[str, Any]], per_profile: int = 40
) -> dict[str, list[dict[str, Any]]]:
    """The cProfile child's rows grouped by profile (phase or thread), the top ``per_profile`` by cumtime."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in cprofile_rows:
        grouped.setdefault(row["profile"], []).append(row)
    return {
        label: sorted(rows, key=lambda r: r["cumtime_s"], reverse=True)[:per_profile]
        for label, rows in grouped.items()
    }


# --- the run ----------------------------------------------------------------------------------------


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], capture_output=True, text=True, check=False, cwd=REPOSITORY)
    return out.stdout.strip()


def _uncommitted_source_changes() -> list[str]:
    return _git("status", "--porcelain", "--", "core", "plugins").splitlines()


def snapshot_source(commit: str, folder: str) -> str:
    """Extract ``commit``'s ``core`` and ``plugins`` into ``folder``; the full commit id.

    Others may edit the checkout while a run takes minutes; a snapshot keeps every child on one commit.
    """
    full = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if not full:
        raise SystemExit(
            f"--at: {commit!r} is not a commit of this repository (valid: a hash, branch or tag)"
        )
    archive = subprocess.run(
        ["git", "archive", full, "core", "plugins"], capture_output=True, check=True, cwd=REPOSITORY
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+, 3.11.4+
            tar.extractall(folder, filter="data")
        else:
            tar.extractall(folder)  # our own repository's archive
    return full


def _machine_meta(snapshot_commit: str | None) -> dict[str, Any]:
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # Measured: the snapshot (--at), or the checkout at HEAD plus the changes listed below.
        "commit": snapshot_commit or _git("rev-parse", "HEAD"),
        "source": "snapshot" if snapshot_commit else "checkout",
        "uncommitted_changes_at_start": [] if snapshot_commit else _uncommitted_source_changes(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": list(os.getloadavg()),
    }


def _measure(
    sizes: list[int],
    steps: int,
    reps: int,
    reps_large: int,
    torch_max_size: int | None,
    source: str | None,
    log: Callable[[str], None],
) -> dict[str, dict[int | str, list[dict[str, float]]]]:
    runs: dict[str, dict[int | str, list[dict[str, float]]]] = {p: {} for p in PROFILERS}
    plan: list[tuple[str, int | str, int, int]] = [("convnet", "convnet", steps, reps)]
    plan += [("tiny", size, size, reps_large if size >= 1_000_000 else reps) for size in sizes]
    for workload, key, n, count in plan:
        for rep in range(count):
            # Interleave the two profilers so background load affects both alike.
            for which in PROFILERS:
                if which == "torch" and isinstance(key, int) and torch_max_size and key > torch_max_size:
                    continue
                log(f"{which} {workload} {n} (run {rep + 1}/{count}) ...")
                runs[which].setdefault(key, []).append(run_child(which, workload, n, source=source))
    return runs


def _print_table(summaries: dict[str, dict[int | str, dict[str, float]]]) -> None:
    rows = (
        ("loop overhead (x unprofiled)", "loop_overhead", 1.0),
        ("exit-to-table (s)", "exit_to_table_s", 1.0),
        ("  _disable_profiler() (s)", "disable_s", 1.0),
        ("  after it (s)", "after_disable_s", 1.0),
        ("export fresh (s; torch: its one)", "export_fresh_s", 1.0),
        ("export warm (s)", "export_warm_s", 1.0),
        ("first export in process (s; 1 op)", "export_first_in_process_s", 1.0),
        ("trace size (MB)", "trace_bytes", 1e-6),
        ("peak RSS (MB)", "peak_rss_mb", 1.0),
    )
    print(f"{'size':>9} {'metric':30} {'torch':>10} {'polyprof':>10} {'polyprof/torch':>15}")
    for size in sorted(summaries["polyprof"], key=lambda s: (isinstance(s, int), s)):
        t = summaries["torch"].get(size)
        p = summaries["polyprof"][size]
        for label, metric, scale in rows:
            pv = p[metric] * scale
            tv = t[metric] * scale if t and metric in t else math.nan
            ratio = pv / tv if t and tv else math.nan
            print(f"{size!s:>9} {label:30} {tv:10.3f} {pv:10.3f} {ratio:15.3f}")


def read_result(path: str) -> tuple[dict[str, Any], dict[str, dict[int | str, list[dict[str, float]]]], Any]:
    """An earlier ``--json`` result's meta, runs (sizes back to ints) and cProfile summary."""
    with open(path) as f:
        result = json.load(f)
    if result.get("schema") != RESULT_SCHEMA:
        raise SystemExit(
            f"--from-json: {path} is not a {RESULT_SCHEMA} result (schema {result.get('schema')!r})"
        )
    runs = {
        profiler: {int(size) if size.isdigit() else size: r for size, r in by_size.items()}
        for profiler, by_size in result["runs"].items()
    }
    return result["meta"], runs, result["where_the_time_goes"]


def _run(
    args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[dict[str, Any], dict[str, dict[int | str, list[dict[str, float]]]], Any]:
    with tempfile.TemporaryDirectory(prefix="polyprof-bench-") as folder:
        source = folder if args.at else None
        meta = _machine_meta(snapshot_source(args.at, folder) if args.at else None)
        meta["reader"] = args.reader
        os.environ["POLYPROF_KINETO_READER"] = args.reader  # the children inherit it
        if args.reader == "native":
            build_reader(source, log)
        load = meta["load_average_before"]
        log(
            f"{meta['source']} {meta['commit'][:10]}, torch {meta['torch']}, reader {args.reader}, "
            f"load {load}"
        )
        runs = _measure(args.sizes, args.steps, args.reps, args.reps_large, args.torch_max_size, source, log)
        meta["load_average_after"] = list(os.getloadavg())
        if not args.at:
            meta["uncommitted_changes_at_end"] = _uncommitted_source_changes()
        where = None
        if args.where:
            log(f"polyprof tiny {args.where} under cProfile ...")
            child = run_child("polyprof", "tiny", args.where, mode="cprofile", source=source)
            where = {"size": args.where, "by_profile": summarise_where(child.pop("cprofile")), "wall": child}
    return meta, runs, where


def build_reader(source: str | None, log: Callable[[str], None]) -> None:
    """Build polyprof's compiled reader for this torch before any child is timed (once per torch)."""
    env = child_env(source)
    log("building polyprof's compiled reader (once per torch build) ...")
    code = (
        "import sys, torch; from polyprof import native_reader; "
        "sys.exit(0 if native_reader.build().built else 1)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"--reader native: the compiled reader did not build:\n{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=list(DEFAULT_SIZES),
        help="events (tiny ops) per size, comma-separated; default 10k,50k,200k,1M (5M and 10M need "
        "about 25 and 50 GB for torch: see --torch-max-size)",
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps of the conv net")
    parser.add_argument("--reps", type=int, default=3, help="child processes per profiler and size (median)")
    parser.add_argument("--reps-large", type=int, default=1, help="the same, for sizes of 1M events and more")
    parser.add_argument("--torch-max-size", type=int, help="run torch only up to this many events")
    parser.add_argument("--where", type=int, metavar="SIZE", help="also cProfile one polyprof child at SIZE")
    parser.add_argument(
        "--at",
        metavar="COMMIT",
        help="measure this commit's core and plugins (a snapshot) instead of the checkout as it is",
    )
    parser.add_argument(
        "--from-json",
        metavar="FILE",
        help="measure nothing: re-read an earlier --json result's runs; fit, evaluate and plot them again",
    )
    parser.add_argument(
        "--reader",
        choices=("native", "python"),
        default="native",
        help="how polyprof reads torch's result: its compiled reader (default) or the pure-Python one",
    )
    parser.add_argument("--json", help="write the machine-readable result here")
    parser.add_argument("--plot", help="write the log-log scaling plot (PNG) here")
    args = parser.parse_args(argv)
    for name in ("steps", "reps", "reps_large"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.from_json:
        meta, runs, where = read_result(args.from_json)
    else:
        meta, runs, where = _run(args, log)
    summaries = {p: {size: summarise(r) for size, r in by_size.items()} for p, by_size in runs.items()}
    fits = fit_series(summaries)
    targets = evaluate_targets(summaries, fits)

    _print_table(summaries)
    print()
    for name, fit in fits.items():
        residuals = ", ".join(f"{r:+.0%}" for r in fit["relative_residuals"])
        print(
            f"fit {name:36} {fit['slope_s_per_million']:8.3f} s/M events + {fit['intercept_s']:7.3f} s, "
            f"log-log slope {fit['log_log_slope']:.2f}, residuals {residuals}"
        )
    print()
    print("\n".join(format_targets(targets)))
    if where:
        print(f"\nwhere polyprof's time goes at {where['size']} events (cProfile, inflated; top by cumtime):")
        for label, rows in where["by_profile"].items():
            print(f"  {label}")
            for row in rows[:15]:
                print(
                    f"    {row['cumtime_s']:8.3f} {row['tottime_s']:8.3f} {row['calls']:>9} {row['function']}"
                )
    print(f"\nload average before {meta['load_average_before']}, after {meta['load_average_after']}")

    result = build_result(meta, runs, summaries, fits, targets, where)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        write_plot(
            args.plot, summaries, f"torch {meta['torch']}, commit {meta['commit'][:10]}, {meta['date']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
