"""Many ranks: polyprof convert, report and merge against HolisticTraceAnalysis (issue 13, item 7).

Makes a synthetic distributed run: ``--ranks`` Kineto traces of ``--events`` events each, written as
torch writes them (``distributedInfo``, ``deviceProperties``, ``baseTimeNanoseconds``, µs with three
decimals). Each rank runs ``--steps`` steps (``ProfilerStep#N``); a step is ``aten::linear`` >
``aten::addmm`` > ``cudaLaunchKernel`` with its kernel on stream 7, many times, then an NCCL
all-reduce (op, launch and kernel on stream 20). Durations vary by rank and step; the last rank is
30% slower (a straggler).

Then, each in a child process whose whole process tree's memory is sampled every 50 ms:

* ``polyprof convert DIR -o PARQUET --to parquet``;
* ``polyprof report PARQUET --format json --memory-limit 2GB`` (DuckDB);
* ``polyprof merge PARQUET -o merged.json``;
* HolisticTraceAnalysis: ``TraceAnalysis(trace_dir=DIR)`` (its parser, a process pool) and the
  closest it has to the report's op table: per rank and op name, count and total duration of the
  CPU ops with pandas, then mean, min, max and std over ranks.

Reports seconds and peak memory (the sum of the RSS of the process and its children), and the
ratios. ``--hta-memory-cap GB`` stops HTA when its tree passes that much (so a run HTA cannot hold is
recorded as such instead of exhausting the machine). ``--gzip`` writes the traces as ``.json.gz``.

``--convert-only`` times ``polyprof convert`` alone, as seconds per rank (the whole command, its start
and imports included, divided by the ranks), ``--reps`` times for each variant and each ``--cpus`` set
(``taskset -c``), all interleaved so that background load hits each alike:

* ``compiled``: this checkout, the compiled column builder (``POLYPROF_COLUMN_BUILDER=native``; built
  before the first timed run);
* ``python``: this checkout, the Python builder (``POLYPROF_COLUMN_BUILDER=python``);
* ``baseline``: the source tree ``--baseline DIR`` (its ``core`` and ``plugins``, e.g. from ``git
  archive``), as it converts.

Every variant's Parquet files are checked to be byte for byte the same as the first variant's.

Usage:
    python benchmarks/bench_ranks.py --ranks 64 --events 200000 --json out.json
    python benchmarks/bench_ranks.py --ranks 256 --events 200000 --gzip --hta-memory-cap 20
    mkdir /tmp/base && git archive HEAD core plugins | tar -x -C /tmp/base
    python benchmarks/bench_ranks.py --ranks 16 --events 200000 --convert-only --reps 3 \
        --cpus 0 --cpus 0,1 --baseline /tmp/base --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import psutil
from machine import cpu_model

BASE_NS = 1_795_000_000_000_000_000
HOST_PID, THREAD, GPU_PID, COMPUTE_STREAM, COMM_STREAM = 4242, 4243, 0, 7, 20


def _x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, args: str) -> str:
    """A complete event as Kineto writes it: µs with three decimals."""
    return (
        f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid}, '
        f'"ts": {ts:.3f}, "dur": {dur:.3f}, "args": {{{args}}}}}'
    )


def _m(name: str, pid: int, tid: int, key: str, value: str) -> str:
    head = f'"ph": "M", "name": "{name}", "pid": {pid}, "tid": {tid}, "ts": 0.000'
    return f'{{{head}, "args": {{"{key}": {value}}}}}'


GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def rank_trace_text(rank: int, ranks: int, events: int, steps: int) -> str:
    """One rank's trace as Kineto writes it (see the module notes)."""
    rng = np.random.default_rng(rank)
    groups_per_step = max(1, (events // steps - 6) // 4)
    slow = 1.3 if rank == ranks - 1 else 1.0
    lines = [
        _m("process_name", HOST_PID, 0, "name", '"python"'),
        _m("process_name", GPU_PID, 0, "name", '"CUDA 0"'),
        _m("thread_name", HOST_PID, THREAD, "name", f'"thread {THREAD} (python)"'),
    ]
    t = 1000.0  # µs
    gpu = t
    external = correlation = 0
    for step in range(steps):
        jitter = rng.uniform(0.95, 1.05, size=groups_per_step) * slow
        step_start = t
        body = []
        for g in range(groups_per_step):
            external += 1
            correlation += 1
            launch_dur = 4.0 * jitter[g]
            addmm_dur = 6.0 * jitter[g] + launch_dur
            linear_dur = 3.0 * jitter[g] + addmm_dur
            kernel_start = max(gpu, t + 5.0)
            kernel_dur = 20.0 * jitter[g]
            gpu = kernel_start + kernel_dur + 1.0
            ids = f'"External id": {external}, "Record function id": 0'
            launch = f'"External id": {external}, "cbid": 211, "correlation": {correlation}'
            on_gpu = f'"External id": {external}, "correlation": {correlation}, "device": 0'
            body.append(_x("cpu_op", "aten::linear", HOST_PID, THREAD, t, linear_dur, ids))
            body.append(_x("cpu_op", "aten::addmm", HOST_PID, THREAD, t + 1.0, addmm_dur, ids))
            body.append(_x("cuda_runtime", "cudaLaunchKernel", HOST_PID, THREAD, t + 3.0, launch_dur, launch))
            body.append(
                _x(
                    "kernel",
                    GEMM,
                    GPU_PID,
                    COMPUTE_STREAM,
                    kernel_start,
                    kernel_dur,
                    f'{on_gpu}, "stream": 7',
                )
            )
            t += linear_dur + 1.0
        external += 1
        correlation += 1
        nccl_dur = 30.0 * slow
        comm_start = max(gpu, t + 5.0)
        ids = f'"External id": {external}, "Record function id": 0'
        launch = f'"External id": {external}, "correlation": {correlation}'
        on_gpu = (
            f'"External id": {external}, "correlation": {correlation}, "device": 0, "stream": {COMM_STREAM}'
        )
        body.append(_x("cpu_op", "nccl:all_reduce", HOST_PID, THREAD, t, 12.0, ids))
        body.append(_x("cuda_runtime", "cudaLaunchKernel", HOST_PID, THREAD, t + 2.0, 5.0, launch))
        body.append(_x("kernel", ALL_REDUCE, GPU_PID, COMM_STREAM, comm_start, nccl_dur, on_gpu))
        t += 13.0
        gpu = comm_start + nccl_dur
        step_args = f'"External id": {external + 10_000_000}, "Record function id": 0'
        lines.append(
            _x(
                "user_annotation",
                f"ProfilerStep#{step}",
                HOST_PID,
                THREAD,
                step_start - 0.5,
                t - step_start + 1.0,
                step_args,
            )
        )
        lines.extend(body)
        t += 2.0
    head = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
    }
    tail = f'"traceName": "rank{rank}.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": {BASE_NS}'
    return json.dumps(head)[:-1] + ', "traceEvents": [\n' + ",\n".join(lines) + f"\n], {tail}}}\n"


def make_run(folder: str, ranks: int, events: int, steps: int, use_gzip: bool) -> int:
    os.makedirs(folder, exist_ok=True)
    total = 0
    for rank in range(ranks):
        text = rank_trace_text(rank, ranks, events, steps)
        total += text.count('"ph"')
        name = os.path.join(folder, f"rank{rank:04d}.pt.trace.json")
        if use_gzip:
            with gzip.open(name + ".gz", "wt", compresslevel=1) as f:
                f.write(text)
        else:
            with open(name, "w") as f:
                f.write(text)
    return total


HTA_CHILD = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
import pandas as pd
from hta.trace_analysis import TraceAnalysis
started = time.perf_counter()
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
loaded = time.perf_counter()
per_rank = []
for rank in analyzer.t.get_ranks():
    df = analyzer.t.get_trace(rank)
    cpu = df[df["stream"] < 0] if "stream" in df.columns else df
    g = cpu.groupby("name")["dur"].agg(["count", "sum"]).reset_index()
    g["rank"] = rank
    per_rank.append(g)
table = pd.concat(per_rank, ignore_index=True)
stats = table.groupby("name")["sum"].agg(["mean", "min", "max", "std"])
stats["slowest_rank"] = table.loc[table.groupby("name")["sum"].idxmax()].set_index("name")["rank"]
done = time.perf_counter()
print(f"{loaded - started:.3f} {done - loaded:.3f} {len(stats)}")
"""


def run_measured(cmd: list[str], cap_bytes: float | None = None) -> dict[str, Any]:
    """Run ``cmd``; its seconds and the peak of its process tree's RSS (sampled every 50 ms)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    capped = False
    root = psutil.Process(proc.pid)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak, capped
        while not stop.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in tree if p.is_running())
            except psutil.Error:
                rss = 0
            peak = max(peak, rss)
            if cap_bytes is not None and rss > cap_bytes:
                capped = True
                for p in reversed([root, *root.children(recursive=True)]):
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                return
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    stop.set()
    sampler.join()
    result = {
        "seconds": time.perf_counter() - started,
        "peak_rss_mb": peak / 2**20,
        "returncode": proc.returncode,
        "stdout_tail": out[-2000:],
        "stderr_tail": err[-2000:],
    }
    if capped:
        result["stopped_at_cap_gb"] = cap_bytes / 2**30 if cap_bytes else None
    return result


CONVERT_VARIANTS = ("compiled", "python", "baseline")


def convert_command(variant: str, baseline: str | None, traces: str, out: str) -> tuple[list[str], dict]:
    """The ``polyprof convert`` command line and environment of one variant."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # import from bytecode, as installed packages do
    if variant == "baseline":
        if baseline is None:
            raise SystemExit("the baseline variant needs --baseline DIR")
        root = os.path.abspath(baseline)
        paths = [os.path.join(root, "core"), os.path.join(root, "plugins"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    else:
        env["POLYPROF_COLUMN_BUILDER"] = "native" if variant == "compiled" else "python"
    return [sys.executable, "-m", "polyprof", "convert", traces, "-o", out, "--to", "parquet"], env


def time_converts(args: argparse.Namespace, traces: str, work: str) -> dict[str, Any]:
    """``--convert-only``: each variant under each CPU set, ``--reps`` rounds, interleaved."""
    variants = args.variants.split(",")
    cpu_sets = args.cpus or [None]
    outputs = {variant: os.path.join(work, f"parquet-{variant}") for variant in variants}
    # one untimed run of each: builds the compiled builder, fills the page cache, checks the outputs
    for variant in variants:
        command, env = convert_command(variant, args.baseline, traces, outputs[variant])
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{variant} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    first = variants[0]
    names = sorted(os.listdir(outputs[first]))
    for variant in variants[1:]:
        if sorted(os.listdir(outputs[variant])) != names:
            raise RuntimeError(f"{variant} wrote other files than {first}")
        _, mismatch, errors = filecmp.cmpfiles(outputs[first], outputs[variant], names, shallow=False)
        if mismatch or errors:
            raise RuntimeError(f"{variant}'s Parquet files differ from {first}'s: {mismatch + errors}")
    seconds: dict[str, dict[str, list[float]]] = {
        cpus or "all": {variant: [] for variant in variants} for cpus in cpu_sets
    }
    for rep in range(args.reps):
        for cpus in cpu_sets:
            for variant in variants:
                shutil.rmtree(outputs[variant], ignore_errors=True)
                command, env = convert_command(variant, args.baseline, traces, outputs[variant])
                if cpus is not None:
                    command = ["taskset", "-c", cpus, *command]
                started = time.perf_counter()
                done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
                elapsed = time.perf_counter() - started
                if done.returncode != 0:
                    raise RuntimeError(f"{variant} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
                seconds[cpus or "all"][variant].append(elapsed)
                print(
                    f"round {rep + 1}, cpus {cpus or 'all'}, {variant}: {elapsed:.2f} s, "
                    f"{elapsed / args.ranks:.3f} s a rank",
                    flush=True,
                )
    summary: dict[str, Any] = {}
    for cpus, by_variant in seconds.items():
        medians = {variant: statistics.median(times) for variant, times in by_variant.items()}
        summary[cpus] = {
            "seconds": by_variant,
            "median_s": medians,
            "median_s_per_rank": {variant: m / args.ranks for variant, m in medians.items()},
            "per_round_ratio_to_first": {
                variant: [t / f for t, f in zip(times, by_variant[first], strict=True)]
                for variant, times in by_variant.items()
            },
        }
        line = ", ".join(f"{variant} {m / args.ranks:.3f}" for variant, m in medians.items())
        print(f"cpus {cpus}: median s a rank: {line}", flush=True)
    return summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=200_000, help="events per rank")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--gzip", action="store_true", help="write the traces as .json.gz")
    parser.add_argument("--skip-hta", action="store_true")
    parser.add_argument("--skip-merge", action="store_true")
    parser.add_argument("--hta-memory-cap", type=float, default=None, metavar="GB")
    parser.add_argument(
        "--workdir", default=None, help="where the traces go (default: a temporary directory)"
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--convert-only", action="store_true", help="time polyprof convert alone")
    parser.add_argument("--reps", type=int, default=3, help="--convert-only: rounds of each variant")
    parser.add_argument(
        "--variants",
        default="compiled,python",
        help=f"--convert-only: comma-separated, of {', '.join(CONVERT_VARIANTS)} (the first: reference)",
    )
    parser.add_argument(
        "--baseline", metavar="DIR", help="--convert-only: the baseline variant's source tree"
    )
    parser.add_argument(
        "--cpus",
        action="append",
        metavar="LIST",
        help="--convert-only: run pinned to these CPUs (taskset -c LIST); repeat for several sets",
    )
    args = parser.parse_args(argv)
    if args.baseline and "baseline" not in args.variants.split(","):
        args.variants += ",baseline"

    work = args.workdir or tempfile.mkdtemp(prefix="polyprof-bench-ranks-")
    traces, parquet = os.path.join(work, "traces"), os.path.join(work, "parquet")
    results: dict[str, Any] = {}
    try:
        started = time.perf_counter()
        results["events_total"] = make_run(traces, args.ranks, args.events, args.steps, args.gzip)
        results["generate_s"] = time.perf_counter() - started
        results["trace_bytes"] = sum(os.path.getsize(os.path.join(traces, n)) for n in os.listdir(traces))
        gigabytes = results["trace_bytes"] / 1e9
        print(f"made {args.ranks} ranks, {results['events_total']:,} events, {gigabytes:.2f} GB", flush=True)
        polyprof = [sys.executable, "-m", "polyprof"]
        if args.convert_only:
            results["convert_per_rank"] = time_converts(args, traces, work)
            return _write_results(args, results)
        results["convert"] = run_measured([*polyprof, "convert", traces, "-o", parquet, "--to", "parquet"])
        print("convert", {k: v for k, v in results["convert"].items() if "tail" not in k}, flush=True)
        results["parquet_bytes"] = sum(os.path.getsize(os.path.join(parquet, n)) for n in os.listdir(parquet))
        results["report"] = run_measured(
            [*polyprof, "report", parquet, "--format", "json", "--memory-limit", "2GB"]
        )
        print("report", {k: v for k, v in results["report"].items() if "tail" not in k}, flush=True)
        if not args.skip_merge:
            merged = os.path.join(work, "merged.json")
            results["merge"] = run_measured([*polyprof, "merge", parquet, "-o", merged])
            results["merged_bytes"] = os.path.getsize(merged) if os.path.exists(merged) else None
            if os.path.exists(merged):
                os.remove(merged)
            print("merge", {k: v for k, v in results["merge"].items() if "tail" not in k}, flush=True)
        if not args.skip_hta:
            cap = args.hta_memory_cap * 2**30 if args.hta_memory_cap else None
            results["hta"] = run_measured([sys.executable, "-c", HTA_CHILD, traces], cap)
            print("hta", {k: v for k, v in results["hta"].items() if "tail" not in k}, flush=True)
            hta, report = results["hta"], results["report"]
            if hta["returncode"] == 0:
                results["report_speedup_vs_hta"] = hta["seconds"] / report["seconds"]
                results["report_memory_vs_hta"] = report["peak_rss_mb"] / hta["peak_rss_mb"]
                print(
                    f"report: {results['report_speedup_vs_hta']:.1f}x faster than HTA, "
                    f"{results['report_memory_vs_hta']:.3f} of its memory",
                    flush=True,
                )
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return _write_results(args, results)


def _write_results(args: argparse.Namespace, results: dict[str, Any]) -> int:
    if args.json:
        import duckdb
        import pyarrow

        results["meta"] = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip(),
            "args": vars(args),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "load_average": os.getloadavg(),
            "memory_gb": psutil.virtual_memory().total / 2**30,
            "duckdb": duckdb.__version__,
            "pyarrow": pyarrow.__version__,
        }
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
