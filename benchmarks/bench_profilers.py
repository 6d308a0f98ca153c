"""torch.profiler vs polyprof, in the same run, as ratios.

Workloads: (a) N tiny ops (torch.add on 1-element tensors), (b) a small conv net
(forward + backward). For each profiler, each measurement runs in a fresh child
process (so peak memory is that profiler's own) and reports:

* loop overhead: profiled loop time / unprofiled loop time in the same child,
* exit-to-table: from the end of the with-block's body to the printed table
  (the profiler's __exit__ included),
* export: time to write the Chrome trace,
* peak RSS of the child.

Usage: python benchmarks/bench_profilers.py [--ops 200000] [--reps 3] [--json out.json]

bench_postprocessing.py measures issue 12's targets: the exit split at torch's _disable_profiler(),
fresh and warm export, and scaling over sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from child_workloads import WORKLOADS

CHILD = (
    r"""
import json, resource, sys, time, os, tempfile
import torch
torch.set_num_threads(1)
which, workload, n_ops = sys.argv[1], sys.argv[2], int(sys.argv[3])
"""
    + WORKLOADS
    + r"""

# warm-up: one-time initialisation of torch and of the profiler
body_warm = time.perf_counter(); body(); body_warm = time.perf_counter() - body_warm
with profile(activities=[ProfilerActivity.CPU]) as p:
    torch.add(torch.ones(1), torch.ones(1))
p.key_averages().table()

t0 = time.perf_counter(); body(); unprofiled = time.perf_counter() - t0
with profile(activities=[ProfilerActivity.CPU]) as prof:
    t0 = time.perf_counter(); body(); profiled = time.perf_counter() - t0
    t_end = time.perf_counter()
table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
sys.stderr.write(table[:200])
exit_to_table = time.perf_counter() - t_end
path = os.path.join(tempfile.mkdtemp(), "trace.json")
t0 = time.perf_counter(); prof.export_chrome_trace(path); export = time.perf_counter() - t0
size = os.path.getsize(path)
print(json.dumps({"unprofiled_s": unprofiled, "profiled_loop_s": profiled, "exit_to_table_s": exit_to_table,
                  "export_s": export, "trace_bytes": size,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
)


def run_child(which: str, workload: str, n_ops: int) -> dict:
    env = dict(os.environ, KINETO_LOG_LEVEL="5")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, which, workload, str(n_ops)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{which}/{workload} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=200_000, help="tiny ops in workload (a)")
    parser.add_argument("--steps", type=int, default=20, help="training steps in workload (b)")
    parser.add_argument("--reps", type=int, default=3, help="child processes per measurement (median)")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)

    results: dict = {}
    for workload, n in (("tiny", args.ops), ("convnet", args.steps)):
        # Interleave the two profilers so background load affects both alike.
        for _ in range(args.reps):
            for which in ("torch", "polyprof"):
                results.setdefault((workload, which), []).append(run_child(which, workload, n))

    print(f"{'workload':10} {'metric':28} {'torch':>12} {'polyprof':>12} {'torch/polyprof':>15}")
    for workload in ("tiny", "convnet"):
        t, p = results[(workload, "torch")], results[(workload, "polyprof")]
        rows = [
            ("unprofiled loop (s)", lambda r: r["unprofiled_s"]),
            ("profiled loop (s)", lambda r: r["profiled_loop_s"]),
            ("loop overhead (x unprofiled)", lambda r: r["profiled_loop_s"] / r["unprofiled_s"]),
            ("exit-to-table (s)", lambda r: r["exit_to_table_s"]),
            ("export chrome trace (s)", lambda r: r["export_s"]),
            ("trace size (MB)", lambda r: r["trace_bytes"] / 1e6),
            ("peak RSS (MB)", lambda r: r["peak_rss_mb"]),
        ]
        for label, fn in rows:
            tv = statistics.median(fn(r) for r in t)
            pv = statistics.median(fn(r) for r in p)
            ratio = tv / pv if pv else float("inf")
            print(f"{workload:10} {label:28} {tv:12.3f} {pv:12.3f} {ratio:15.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{w}/{p}": runs for (w, p), runs in results.items()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
