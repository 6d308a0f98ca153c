"""The time a profiler adds to a loop on the CPU, and its start, against torch.profiler's: as ratios.

Workloads (child_workloads.py): (a) ``--ops`` calls of ``torch.add`` on 1-element tensors (100,000) and
(b) ``--steps`` training steps of a small MLP (2,000: forward, loss, backward, SGD step). Each workload
runs in its own child process (``torch.set_num_threads(1)``, CPU activity only), ``--children`` times,
with torch.profiler and polyprof in the same process. A child repeats, ``--reps`` times, one loop over
the workload in each of three conditions: unprofiled, under ``torch.profiler.profile`` and under
``polyprof.profile``; the order of the three runs through all six permutations in turn, so each
condition comes before and after each other equally often and slow drifts of the machine hit all
three alike. Before the repetitions the child runs the workload once unprofiled and once under each
profiler, untimed: the first profile in a process pays one-time set-up (imports, Kineto's
initialisation), part of it shared by both profilers. That first start is measured on its own, in a
fresh process per profiler (torch imported and one op run first), ``--children`` times each,
alternating: the profiler's import, ``profile(...)``, ``__enter__`` and ``__exit__`` of a one-op
profile. Before each loop the child collects garbage and
waits until the process is idle (its CPU time advancing less than 2 ms in 20 ms, at most 2 s), so
that what a profiler leaves running after its exit (freeing its result on a thread, say) is not
charged to the next loop.

Each repetition gives, per profiler:

* ``loop_s``: the workload's loop alone, between the profile's ``__enter__`` and ``__exit__``, and
  ``loop_cpu_s``: the CPU time all threads of the process spent meanwhile (what other processes on a
  shared machine take does not count in it, a profiler's own threads do);
* added time: that loop minus the same repetition's unprofiled loop (the two ran next to each other),
  in wall time and in CPU time;
* ``create_s`` (``profile(...)``), ``start_s`` (``__enter__``), ``stop_s`` (``__exit__``).

Reported: medians over all repetitions of all children, the added time per loop and per step with
its spread (interquartile range), and the ratios polyprof / torch of the median added time and of
the median start; the first profile's times. A ratio at or below 1 means polyprof costs no more
than torch.profiler. The JSON
goes to ``--json`` (default ``benchmarks/results/overhead-<date>.json``; ``--quick`` writes none
unless asked). ``--quick`` is a small run to check that it works (a few seconds of loops), not a
measurement. ``--at COMMIT`` measures that commit's ``core`` and ``plugins`` instead of the
checkout, which others may be editing during the run; ``--reader`` as in bench_postprocessing.py
(the compiled reader is built before the first child, outside every measurement).

Usage:
    python benchmarks/bench_overhead.py                  # 100,000 adds, 2,000 MLP steps, 24 repetitions
    python benchmarks/bench_overhead.py --quick          # a check of the harness, in about a minute
    python benchmarks/bench_overhead.py --at HEAD --children 3
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench_postprocessing import _machine_meta, build_reader, child_env, snapshot_source
from child_workloads import BODIES

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPOSITORY, "benchmarks", "results")
#: The conditions a child alternates; "none" is the unprofiled loop.
CONDITIONS = ("none", "torch", "polyprof")
PROFILERS = ("torch", "polyprof")
#: Every order of the three conditions; repetition r runs ORDERS[r % 6].
ORDERS = tuple(itertools.permutations(CONDITIONS))
RESULT_SCHEMA = "polyprof-bench-overhead/1"
QUICK = {"ops": 5_000, "steps": 100, "reps": 6}

CHILD = (
    r"""
import gc, json, resource, sys, time
import torch
torch.set_num_threads(1)
workload, n_ops, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
orders = json.loads(sys.argv[4])
from torch.profiler import profile as torch_profile, ProfilerActivity as TorchActivity
import polyprof
PROFILES = {
    "torch": (torch_profile, [TorchActivity.CPU]),
    "polyprof": (polyprof.profile, [polyprof.ProfilerActivity.CPU]),
}
"""
    + BODIES
    + r"""

settle_timeouts = 0
def cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

def settle():
    # Garbage collected, and no thread of this process busy (what a profiler left running after exit).
    global settle_timeouts
    gc.collect()
    deadline = time.perf_counter() + 2.0
    while True:
        before = cpu_s()
        time.sleep(0.02)
        if cpu_s() - before < 0.002:
            return
        if time.perf_counter() > deadline:
            settle_timeouts += 1
            return

def loop():
    # The body alone: wall time, and the CPU time of every thread of this process meanwhile.
    cpu, began = time.process_time(), time.perf_counter()
    body()
    return {"loop_s": time.perf_counter() - began, "loop_cpu_s": time.process_time() - cpu}

def run(condition):
    settle()
    clock = time.perf_counter
    if condition == "none":
        return loop()
    make, activities = PROFILES[condition]
    t0 = clock()
    prof = make(activities=activities)
    t1 = clock()
    prof.__enter__()
    t2 = clock()
    looped = loop()
    t3 = clock()
    prof.__exit__(None, None, None)
    t4 = clock()
    del prof
    return {"create_s": t1 - t0, "start_s": t2 - t1, "stop_s": t4 - t3, **looped}

for condition in ("none", "torch", "polyprof"):
    run(condition)  # warm-up: the workload's first run, each profiler's first in the process
repetitions = []
for rep in range(reps):
    order = orders[rep % len(orders)]
    repetitions.append({"order": order, **{condition: run(condition) for condition in order}})
print(json.dumps({"workload": workload, "n": n_ops, "reps": repetitions, "settle_timeouts": settle_timeouts}))
"""
)

#: A fresh process's first profile: torch imported and one op run, then the profiler's import, the
#: profile's creation, ``__enter__`` and ``__exit__`` around one op.
FIRST_CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
which = sys.argv[1]
torch.add(torch.ones(1), torch.ones(1))
clock = time.perf_counter
t0 = clock()
if which == "torch":
    from torch.profiler import profile, ProfilerActivity
else:
    from polyprof import profile, ProfilerActivity
t1 = clock()
prof = profile(activities=[ProfilerActivity.CPU])
t2 = clock()
prof.__enter__()
t3 = clock()
torch.add(torch.ones(1), torch.ones(1))
t4 = clock()
prof.__exit__(None, None, None)
t5 = clock()
print(json.dumps({"profiler": which, "import_s": t1 - t0, "create_s": t2 - t1, "start_s": t3 - t2,
                  "stop_s": t5 - t4}))
"""


def _child(code: str, *args: str, source: str | None) -> dict[str, Any]:
    env = dict(child_env(source), KINETO_LOG_LEVEL="5")
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_child(workload: str, n: int, reps: int, source: str | None) -> dict[str, Any]:
    """One child process: ``reps`` repetitions of ``workload`` (``n`` ops or steps); its JSON result."""
    return _child(CHILD, workload, str(n), str(reps), json.dumps(ORDERS), source=source)


def run_first_child(which: str, source: str | None) -> dict[str, Any]:
    """One fresh process's first profile under ``which`` profiler (``FIRST_CHILD``)."""
    return _child(FIRST_CHILD, which, source=source)


# --- pure functions (tests/test_bench_overhead.py runs them on synthetic numbers) -------------------


def added_times(reps: Sequence[Mapping[str, Any]], profiler: str, key: str = "loop_s") -> list[float]:
    """Per repetition, ``profiler``'s loop minus the same repetition's unprofiled loop (seconds of wall
    time; ``key="loop_cpu_s"``: of the process's CPU time)."""
    return [rep[profiler][key] - rep["none"][key] for rep in reps]


def interquartile_range(values: Sequence[float]) -> float:
    """The spread of the middle half (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    quartiles = statistics.quantiles(values, n=4, method="inclusive")
    return quartiles[2] - quartiles[0]


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else float("nan")


def summarise(children: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The numbers of one workload over all its children's repetitions (pooled).

    Per profiler: medians of the loop, the added time (per loop and per step), start, create and
    stop; the added time's interquartile range. Then the ratios polyprof / torch of the median added
    time, start, create + start and stop.
    """
    if not children or not all(child["reps"] for child in children):
        raise ValueError("no repetitions to summarise")
    reps = [rep for child in children for rep in child["reps"]]
    steps = children[0]["n"]
    out: dict[str, Any] = {
        "n": steps,
        "repetitions": len(reps),
        "children": len(children),
        "unprofiled_loop_s": statistics.median(rep["none"]["loop_s"] for rep in reps),
        "settle_timeouts": sum(child.get("settle_timeouts", 0) for child in children),
    }
    for which in PROFILERS:
        added = added_times(reps, which)
        median_added = statistics.median(added)
        added_cpu = added_times(reps, which, "loop_cpu_s")
        out[which] = {
            "loop_s": statistics.median(rep[which]["loop_s"] for rep in reps),
            "added_s": median_added,
            "added_per_step_us": 1e6 * median_added / steps,
            "added_iqr_s": interquartile_range(added),
            "added_cpu_s": statistics.median(added_cpu),
            "added_cpu_iqr_s": interquartile_range(added_cpu),
            "create_s": statistics.median(rep[which]["create_s"] for rep in reps),
            "start_s": statistics.median(rep[which]["start_s"] for rep in reps),
            "create_and_start_s": statistics.median(
                rep[which]["create_s"] + rep[which]["start_s"] for rep in reps
            ),
            "stop_s": statistics.median(rep[which]["stop_s"] for rep in reps),
        }
    ours, theirs = out["polyprof"], out["torch"]
    out["ratios"] = {
        "added": _ratio(ours["added_s"], theirs["added_s"]),
        "added_cpu": _ratio(ours["added_cpu_s"], theirs["added_cpu_s"]),
        "start": _ratio(ours["start_s"], theirs["start_s"]),
        "create_and_start": _ratio(ours["create_and_start_s"], theirs["create_and_start_s"]),
        "stop": _ratio(ours["stop_s"], theirs["stop_s"]),
    }
    return out


FIRST_KEYS = ("import_s", "create_s", "start_s", "stop_s")


def summarise_first(firsts: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per profiler, the median of each of a fresh process's first-profile times (``FIRST_CHILD``)."""
    out = {}
    for which in PROFILERS:
        runs = [f for f in firsts if f["profiler"] == which]
        if runs:
            out[which] = {key: statistics.median(r[key] for r in runs) for key in FIRST_KEYS}
    return out


#: The printed rows: label, key in a profiler's summary, scale to the unit in the label.
ROWS = (
    ("profiled loop (ms)", "loop_s", 1e3),
    ("added per loop (ms)", "added_s", 1e3),
    ("added per step (us)", "added_per_step_us", 1.0),
    ("added, interquartile range (ms)", "added_iqr_s", 1e3),
    ("added CPU time per loop (ms)", "added_cpu_s", 1e3),
    ("added CPU time, IQR (ms)", "added_cpu_iqr_s", 1e3),
    ("start: __enter__ (ms)", "start_s", 1e3),
    ("create: profile(...) (ms)", "create_s", 1e3),
    ("stop: __exit__ (ms)", "stop_s", 1e3),
)


def format_summaries(
    summaries: Mapping[str, Mapping[str, Any]], first: Mapping[str, Mapping[str, float]] | None = None
) -> list[str]:
    """The table the benchmark prints (then a fresh process's first profile), and one ratio line per
    workload."""
    lines = [f"{'workload':9} {'metric':34} {'torch':>10} {'polyprof':>10} {'polyprof/torch':>15}"]
    for workload, s in summaries.items():
        lines.append(
            f"{workload:9} {'unprofiled loop (ms)':34} {1e3 * s['unprofiled_loop_s']:10.2f} "
            f"({s['n']} steps, {s['repetitions']} repetitions in {s['children']} children)"
        )
        for label, key, scale in ROWS:
            t, p = s["torch"][key] * scale, s["polyprof"][key] * scale
            lines.append(f"{workload:9} {label:34} {t:10.3f} {p:10.3f} {_ratio(p, t):15.3f}")
    if first and set(first) == set(PROFILERS):
        for key in FIRST_KEYS:
            t, p = 1e3 * first["torch"][key], 1e3 * first["polyprof"][key]
            label = f"first profile: {key[:-2]} (ms)"
            lines.append(f"{'fresh':9} {label:34} {t:10.3f} {p:10.3f} {_ratio(p, t):15.3f}")
    lines.append("")
    for workload, s in summaries.items():
        r = s["ratios"]
        lines.append(
            f"RATIO {workload}: added time polyprof/torch {r['added']:.3f} (CPU time {r['added_cpu']:.3f}), "
            f"start {r['start']:.3f}, "
            f"create+start {r['create_and_start']:.3f}, stop {r['stop']:.3f}"
            + (
                f" ({s['settle_timeouts']} loops started before the process was idle)"
                if s["settle_timeouts"]
                else ""
            )
        )
    return lines


def build_result(
    meta: Mapping[str, Any],
    settings: Mapping[str, Any],
    children: Mapping[str, Sequence[Mapping[str, Any]]],
    summaries: Mapping[str, Mapping[str, Any]],
    firsts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The JSON the benchmark writes: what ran, every child's raw numbers, the summaries."""
    return {
        "schema": RESULT_SCHEMA,
        "meta": dict(meta),
        "settings": dict(settings),
        "summaries": {w: dict(s) for w, s in summaries.items()},
        "first_profile": summarise_first(firsts),
        "children": {w: list(c) for w, c in children.items()},
        "first_profile_children": list(firsts),
    }


def default_json_path(today: datetime.date | None = None) -> str:
    day = (today or datetime.datetime.now(datetime.timezone.utc).date()).isoformat()
    return os.path.join(RESULTS, f"overhead-{day}.json")


# --- the run --------------------------------------------------------------------------------------


def _measure(
    args: argparse.Namespace, source: str | None, log: Callable[[str], None]
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    children: dict[str, list[dict[str, Any]]] = {"tiny": [], "mlp": []}
    firsts: list[dict[str, Any]] = []
    for index in range(args.children):
        for workload, n in (("tiny", args.ops), ("mlp", args.steps)):
            log(f"{workload} {n}: child {index + 1}/{args.children}, {args.reps} repetitions ...")
            children[workload].append(run_child(workload, n, args.reps, source))
        log(f"first profile in a fresh process: child {index + 1}/{args.children} of each profiler ...")
        for which in PROFILERS if index % 2 == 0 else PROFILERS[::-1]:
            firsts.append(run_first_child(which, source))
    return children, firsts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=100_000, help="torch.add calls per loop (workload a)")
    parser.add_argument("--steps", type=int, default=2_000, help="MLP training steps per loop (workload b)")
    parser.add_argument(
        "--reps", type=int, default=24, help="repetitions per child (a multiple of 6 is balanced)"
    )
    parser.add_argument("--children", type=int, default=1, help="child processes per workload")
    parser.add_argument("--quick", action="store_true", help="a small run that checks the harness")
    parser.add_argument("--at", metavar="COMMIT", help="measure this commit's core and plugins (a snapshot)")
    parser.add_argument("--reader", choices=("native", "python"), default="native")
    parser.add_argument(
        "--json", help="where the result goes (default benchmarks/results/overhead-<date>.json)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    for name in ("ops", "steps", "reps", "children"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    json_path = args.json or (None if args.quick else default_json_path())

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="polyprof-bench-") as folder:
        source = folder if args.at else None
        meta = _machine_meta(snapshot_source(args.at, folder) if args.at else None)
        meta["reader"] = args.reader
        os.environ["POLYPROF_KINETO_READER"] = args.reader  # the children inherit it
        if args.reader == "native":
            build_reader(source, log)
        children, firsts = _measure(args, source, log)
    meta["load_average_after"] = list(os.getloadavg())
    summaries = {workload: summarise(runs) for workload, runs in children.items()}
    print("\n".join(format_summaries(summaries, summarise_first(firsts))))
    print(f"\nload average before {meta['load_average_before']}, after {meta['load_average_after']}")
    if json_path:
        settings = {
            k: getattr(args, k) for k in ("ops", "steps", "reps", "children", "quick", "at", "reader")
        }
        with open(json_path, "w") as f:
            json.dump(build_result(meta, settings, children, summaries, firsts), f, indent=1)
        log(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
