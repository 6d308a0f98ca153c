"""Chrome trace export: torch.profiler's C++ writer vs polyprof's, in the same run, as ratios.

Workloads (as in ``bench_profilers.py``): N tiny ops (``torch.add`` on 1-element
tensors) and a small conv net (forward + backward, 20 steps), on the CPU with
one thread. Each profiler records in its own child process, then exports the
same recording twice:

* fresh: the first export. For polyprof it includes decoding the columns only
  traces need (deferred at the end of the with-block: thread ids, flows,
  Kineto's args), which a table never reads;
* warm: the second export, the writer alone.

torch's export is ``prof.export_chrome_trace`` of ``torch.profiler.profile``
(Kineto's C++ writer; torch's post-processing ran at the end of the
with-block, and it writes a result only once, so one export stands for both). The printed ratios are
torch / polyprof: above 1 means polyprof is faster; the JSON also has polyprof / torch
(``fresh_of_torch``, ``warm_of_torch``: the share of torch's time polyprof takes), the median of the
per-round ratios. ``--shapes`` records with ``record_shapes=True`` (every op then carries Kineto's args).

The children run round by round: in each round, for each ``--cpus`` set (``taskset -c``; none: every
CPU), a torch child and a polyprof child, one after the other (their order alternates by round), so
background load hits both alike. Every child's numbers are kept in the JSON.

Usage: python benchmarks/bench_export.py [--sizes convnet,50000,200000] [--reps 3] [--shapes]
       [--cpus 0 --cpus 0,1] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

from child_workloads import WORKLOADS
from machine import cpu_model

CHILD = (
    r"""
import json, os, sys, tempfile, time
import torch
torch.set_num_threads(1)
which, workload, n_ops, shapes = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
"""
    + WORKLOADS
    + r"""
folder = tempfile.mkdtemp()
# warm-up: one-time initialisation of torch and of the profiler, an export included
with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as warm:
    torch.add(torch.ones(1), torch.ones(1))
warm.key_averages().table()
warm.export_chrome_trace(os.path.join(folder, "warmup.json"))
with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
    body()
prof.key_averages().table(row_limit=5)
times = []
# torch writes a result once ("Trace is already saved"): its one export is both columns
for name in ("fresh.json", "warm.json")[: 1 if which == "torch" else 2]:
    path = os.path.join(folder, name)
    t0 = time.perf_counter(); prof.export_chrome_trace(path); times.append(time.perf_counter() - t0)
events = len(json.load(open(path))["traceEvents"])
print(json.dumps({"fresh_s": times[0], "warm_s": times[-1], "trace_events": events,
                  "trace_bytes": os.path.getsize(path)}))
"""
)


def run_child(
    which: str, workload: str, n: int, shapes: bool, pythonpath: str | None = None, cpus: str | None = None
) -> dict:
    env = dict(os.environ, KINETO_LOG_LEVEL="5")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # import from bytecode, as installed packages do
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    pin = ["taskset", "-c", cpus] if cpus else []
    out = subprocess.run(
        [*pin, sys.executable, "-c", CHILD, which, workload, str(n), "1" if shapes else "0"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{which}/{workload}/{n} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_ratio(ours: list[float], theirs: list[float]) -> float:
    return statistics.median(o / t for o, t in zip(ours, theirs, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="convnet,50000,200000", help="convnet and/or op counts")
    parser.add_argument("--reps", type=int, default=3, help="child processes per profiler and size")
    parser.add_argument("--steps", type=int, default=20, help="conv net steps")
    parser.add_argument("--shapes", action="store_true", help="record_shapes=True")
    parser.add_argument(
        "--baseline",
        help="also run polyprof from this source tree (folders core and plugins, e.g. from "
        "`git archive`), as the 'before' columns",
    )
    parser.add_argument(
        "--cpus",
        action="append",
        metavar="LIST",
        help="run the children pinned to these CPUs (taskset -c LIST); repeat for several sets",
    )
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    results = []
    baseline_path = None
    if args.baseline:
        root = os.path.abspath(args.baseline)
        baseline_path = os.pathsep.join(os.path.join(root, part) for part in ("core", "plugins"))
    load_before = os.getloadavg()
    head = f"{'workload':>10} {'cpus':>6} {'torch s':>9} {'fresh s':>9} {'warm s':>9} {'fresh ratio':>12}"
    head += f" {'warm ratio':>11}"
    if baseline_path:
        head += f" {'before fresh':>13} {'before warm':>12} {'ratio':>6} {'ratio':>6}"
    print(head)
    for size in args.sizes.split(","):
        workload, n = ("convnet", args.steps) if size == "convnet" else ("tiny", int(size))
        runs: dict[str | None, dict[str, list[dict]]] = {
            cpus: {"torch": [], "polyprof": [], "before": []} for cpus in args.cpus or [None]
        }
        for rep in range(args.reps):
            for cpus, by_profiler in runs.items():
                order = ["torch", "polyprof"] if rep % 2 == 0 else ["polyprof", "torch"]
                if baseline_path:
                    order.append("before")
                for which in order:
                    path = baseline_path if which == "before" else None
                    profiler = "torch" if which == "torch" else "polyprof"
                    by_profiler[which].append(run_child(profiler, workload, n, args.shapes, path, cpus))
        for cpus, by_profiler in runs.items():
            torch_runs, poly_runs = by_profiler["torch"], by_profiler["polyprof"]
            torch_times = [r["fresh_s"] for r in torch_runs]
            torch_s = statistics.median(torch_times)
            fresh_s = statistics.median(r["fresh_s"] for r in poly_runs)
            warm_s = statistics.median(r["warm_s"] for r in poly_runs)
            row = {
                "workload": size,
                "cpus": cpus or "all",
                "shapes": args.shapes,
                "trace_events": poly_runs[0]["trace_events"],
                "torch_s": torch_s,
                "polyprof_fresh_s": fresh_s,
                "polyprof_warm_s": warm_s,
                "ratio_fresh": torch_s / fresh_s,
                "ratio_warm": torch_s / warm_s,
                "fresh_of_torch": _median_ratio([r["fresh_s"] for r in poly_runs], torch_times),
                "warm_of_torch": _median_ratio([r["warm_s"] for r in poly_runs], torch_times),
                "children": {which: found for which, found in by_profiler.items() if found},
            }
            line = (
                f"{size:>10} {cpus or 'all':>6} {torch_s:9.4f} {fresh_s:9.4f} {warm_s:9.4f} "
                f"{row['ratio_fresh']:12.2f} {row['ratio_warm']:11.2f}"
            )
            if baseline_path:
                before = by_profiler["before"]
                row["before_fresh_s"] = statistics.median(r["fresh_s"] for r in before)
                row["before_warm_s"] = statistics.median(r["warm_s"] for r in before)
                line += (
                    f" {row['before_fresh_s']:13.4f} {row['before_warm_s']:12.4f}"
                    f" {torch_s / row['before_fresh_s']:6.2f} {torch_s / row['before_warm_s']:6.2f}"
                )
            results.append(row)
            print(line, flush=True)
    if args.json:
        import torch

        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip(),
            "argv": sys.argv[1:] if argv is None else argv,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
