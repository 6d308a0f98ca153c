"""One profiler on one workload, in its own process: the child of tests/gpu/test_cuda_vs_torch.py.

    python tests/gpu/gpu_child.py run --profiler {torch,polyprof} --workload NAME --out DIR [...]
    python tests/gpu/gpu_child.py coexist --out DIR [...]
    python tests/gpu/gpu_child.py soak --seconds S --out DIR [...]

Prints one line ``GPU_CHILD_RESULT <json>`` at the end (anything else on
stdout is noise from torch). A workload that cannot run here (torch.compile
without a working Triton or C compiler; CUDA graphs or streams on the CPU)
prints ``{"skip": reason}`` instead, before any profiler has started.

``run``, after warming the workload up:

* overhead: ``--overhead-reps`` repetitions of ``--overhead-steps`` steps,
  unprofiled and profiled alternately (a fresh ``profile()`` each; the loop
  and the final synchronize are timed, after one untimed profiled repetition
  that pays the profiler's one-time start-up), and each profile's ``start()``
  and ``stop()``;
* comparison: ``--reps`` recordings, each with
  ``schedule(wait=0, warmup=1, active=--steps)``, summarised in
  ``on_trace_ready`` (``gpu_compare.summarize_profile``); the last one also
  exports its Chrome trace to ``DIR/<profiler>_<workload>/trace.json``;
* the same recording read both ways (torch.profiler's children, unless
  ``--no-reading``): in ``on_trace_ready``, after torch's own summary and
  trace, polyprof reads torch's raw result of that recording
  (``gpu_compare.polyprof_reading``) and summarises it; the last one's
  Chrome trace goes to ``DIR/torch_<workload>/polyprof_reading.json``.

``--no-overhead`` leaves the overhead loops out (the second torch.profiler
child of a workload, run only to measure torch's spread from one process to
the next).

``--device cpu`` runs the same code on the CPU with CPU activity only, so the
plumbing can be checked on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import math
import os
import resource
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_compare import (
    device_name,
    exact_flow_mismatches,
    export_polyprof_trace,
    polyprof_reading,
    summarize_profile,
    trace_device_rows,
    trace_flows,
)

MARKER = "GPU_CHILD_RESULT "
#: Multiplies every tensor dimension (--scale): small values keep a CPU check of the plumbing fast.
SCALE = 1.0
#: The profiler this child compares ("torch" or "polyprof"), set before a workload is built.
PROFILER: str | None = None
WORKLOADS = ("eager", "item_sync", "cuda_graph", "compiled", "two_streams")


def _d(n: int) -> int:
    """A tensor dimension, scaled."""
    return max(4, int(n * SCALE))


class Unsupported(Exception):
    """The workload cannot run here (a skip, not a failure)."""


# ---------------------------------------------------------------- workloads
# Each builder returns step(), a callable running one training/inference step; it raises
# Unsupported when the environment cannot run the workload.


def _mlp(torch: Any, device: str, width: int = 1024) -> Any:
    torch.manual_seed(0)
    width = _d(width)
    return torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width),
        torch.nn.GELU(),
        torch.nn.Linear(4 * width, width),
        torch.nn.LayerNorm(width),
    ).to(device)


def build_eager(torch: Any, device: str) -> Callable[[], None]:
    """Eager forward and backward of an MLP, then an SGD step (foreach kernels)."""
    model = _mlp(torch, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(_d(256), _d(1024), device=device)

    def step() -> None:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def build_item_sync(torch: Any, device: str) -> Callable[[], None]:
    """A host batch copied to the device, a forward pass and two ``.item()`` (device-to-host copy
    and a stream synchronize each) per step, as a training loop that logs its loss does."""
    model = _mlp(torch, device, width=512)
    host = torch.randn(_d(128), _d(512))
    if device == "cuda":
        host = host.pin_memory()

    def step() -> None:
        with torch.no_grad():
            y = model(host.to(device, non_blocking=True))
            loss = y.square().mean().item()
            positive = (y > 0).sum().item()
        assert loss >= 0 and positive >= 0

    return step


def build_cuda_graph(torch: Any, device: str) -> Callable[[], None]:
    """A forward pass captured once in a CUDA graph (outside the profiler), replayed each step
    after copying new data into its static input.

    Before the capture, an empty session of the profiler under test runs, as
    torch documents for profiling CUDA graphs (``torch.profiler._utils.
    _init_for_cuda_graphs``: CUPTI must be initialised before a graph is made,
    or its kernels may be missing later); POLYPROF_GPU_GRAPH_PREINIT=0 leaves
    that out (graph captured before any profiler ran)."""
    if device != "cuda":
        raise Unsupported("CUDA graphs need a CUDA device")
    if PROFILER is not None and os.environ.get("POLYPROF_GPU_GRAPH_PREINIT", "1") != "0":
        profile, activity_cls, _ = profiler_api(PROFILER)
        with profile(activities=activities_for(activity_cls, device)):
            pass
    model = _mlp(torch, device, width=512)
    static_x = torch.randn(_d(128), _d(512), device=device)
    source = torch.randn(_d(128), _d(512), device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):  # warm-up before capture, as the docs ask
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y = model(static_x)
    torch.cuda.synchronize()

    def step() -> None:
        static_x.copy_(source)
        graph.replay()
        static_y.add_(1.0)  # an eager kernel after the replay, on the same stream

    return step


def build_compiled(torch: Any, device: str) -> Callable[[], None]:
    """A torch.compile'd function (Inductor: Triton kernels on CUDA) called each step.

    The first call compiles; any failure there (no Triton, no C compiler) is
    Unsupported, reported before a profiler starts."""
    if device != "cuda":
        raise Unsupported("the compiled workload is checked on CUDA only (Triton kernels)")

    def fn(x: Any, w: Any, b: Any) -> Any:
        h = torch.nn.functional.gelu(x @ w + b)
        return (h * torch.sigmoid(h)).sum(dim=-1).softmax(dim=0)

    compiled = torch.compile(fn)
    x = torch.randn(_d(256), _d(1024), device=device)
    w = torch.randn(_d(1024), _d(1024), device=device) / 32
    b = torch.randn(_d(1024), device=device)
    try:
        compiled(x, w, b)
        torch.cuda.synchronize()
    except Exception as exc:
        raise Unsupported(
            f"torch.compile (Inductor) cannot compile here: {type(exc).__name__}: {exc}"[:600]
        ) from exc

    def step() -> None:
        compiled(x, w, b)

    return step


def build_two_streams(torch: Any, device: str) -> Callable[[], None]:
    """Matrix products on the current stream and a side stream, joined each step."""
    if device != "cuda":
        raise Unsupported("two streams need a CUDA device")
    torch.manual_seed(0)
    n = _d(1024)
    a1, w1 = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a2, w2 = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    side = torch.cuda.Stream()

    def step() -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b = torch.relu(a2 @ w2)
        c = torch.tanh(a1 @ w1)
        main.wait_stream(side)
        b.record_stream(main)
        (c + b).sum()

    return step


BUILDERS: dict[str, Callable[[Any, str], Callable[[], None]]] = {
    "eager": build_eager,
    "item_sync": build_item_sync,
    "cuda_graph": build_cuda_graph,
    "compiled": build_compiled,
    "two_streams": build_two_streams,
}


# ---------------------------------------------------------------- profilers


def profiler_api(which: str) -> tuple[Any, Any, Any]:
    """(profile, ProfilerActivity, schedule) of ``which``: "torch" or "polyprof"."""
    if which == "torch":
        from torch.profiler import ProfilerActivity, profile, schedule
    elif which == "polyprof":
        from polyprof import ProfilerActivity, profile, schedule
    else:
        raise ValueError(f"unknown profiler {which!r}")
    return profile, ProfilerActivity, schedule


def activities_for(activity_cls: Any, device: str) -> list[Any]:
    return [activity_cls.CPU, activity_cls.CUDA] if device == "cuda" else [activity_cls.CPU]


def make_sync(torch: Any, device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def warm_up(step: Callable[[], None], sync: Callable[[], None], *, min_steps: int, min_seconds: float) -> int:
    """Run ``step`` at least ``min_steps`` times and ``min_seconds`` long (GPU clocks ramp up)."""
    n, start = 0, time.perf_counter()
    while n < min_steps or time.perf_counter() - start < min_seconds:
        step()
        n += 1
    sync()
    return n


def timed_loop(step: Callable[[], None], sync: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return time.perf_counter() - start


def measure_overhead(
    profile: Any,
    activities: list[Any],
    step: Callable[[], None],
    sync: Callable[[], None],
    *,
    reps: int,
    steps: int,
) -> dict[str, Any]:
    """Unprofiled and profiled loops alternately (order flipped every repetition).

    Repetition i's two loops run one after the other, so ``profiled_s[i] -
    baseline_s[i]`` is the time the profiler added to it (``gpu_compare.added_times``).
    Also times each profile's ``start()`` and ``stop()`` (``start_s``, ``stop_s``:
    the profiles after the first in this process) and the first one's start
    (``first_start_s``: the one-time set-up, CUPTI and imports, outside the loops).
    """
    starts: list[float] = []
    stops: list[float] = []

    def profiled() -> float:
        prof = profile(activities=activities)
        began = time.perf_counter()
        prof.start()
        starts.append(time.perf_counter() - began)
        try:
            seconds = timed_loop(step, sync, steps)
        finally:
            began = time.perf_counter()
            prof.stop()
            stops.append(time.perf_counter() - began)
        prof.key_averages()  # results complete (post-processing untimed) before the next loop
        del prof
        gc.collect()
        return seconds

    def unprofiled() -> float:
        gc.collect()
        return timed_loop(step, sync, steps)

    profiled()  # untimed: the profiler's one-time start-up (CUPTI, imports)
    first_start_s, first_stop_s = starts.pop(), stops.pop()
    baseline_s, profiled_s = [], []
    for rep in range(reps):
        order = (unprofiled, profiled) if rep % 2 == 0 else (profiled, unprofiled)
        for run in order:
            (baseline_s if run is unprofiled else profiled_s).append(run())
    return {
        "baseline_s": baseline_s,
        "profiled_s": profiled_s,
        "steps": steps,
        "start_s": starts,
        "stop_s": stops,
        "first_start_s": first_start_s,
        "first_stop_s": first_stop_s,
    }


def record(
    profile: Any,
    activities: list[Any],
    schedule: Any,
    step: Callable[[], None],
    *,
    steps: int,
    trace_path: str | None,
    device: str,
    read_both_ways: bool = False,
    reading_trace_path: str | None = None,
) -> dict[str, Any]:
    """One recording of ``steps`` active steps after one warm-up step, summarised in on_trace_ready.

    ``read_both_ways`` (torch.profiler only): polyprof also reads torch's raw result of the
    recording (``reading``; its Chrome trace to ``reading_trace_path``), after torch's own trace.
    """
    got: dict[str, Any] = {}
    summary_device = "CUDA" if device == "cuda" else "CPU"

    def on_trace_ready(prof: Any) -> None:
        started = time.perf_counter()
        got["summary"] = summarize_profile(prof, device=summary_device)
        got["summary_s"] = time.perf_counter() - started
        if trace_path is not None:
            started = time.perf_counter()
            prof.export_chrome_trace(trace_path)
            got["export_s"] = time.perf_counter() - started
        if read_both_ways:
            started = time.perf_counter()
            results, trace = polyprof_reading(prof.profiler.kineto_results, summary_device)
            got["reading"] = summarize_profile(results, device=summary_device)
            if reading_trace_path is not None:
                export_polyprof_trace(trace, reading_trace_path)
            got["reading_s"] = time.perf_counter() - started
        got["ready_calls"] = got.get("ready_calls", 0) + 1

    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=on_trace_ready,
    ) as prof:
        for _ in range(steps + 1):
            step()
            prof.step()
    if got.get("ready_calls") != 1:
        raise RuntimeError(
            f"on_trace_ready was called {got.get('ready_calls', 0)} times for one cycle, not once"
        )
    return got


# ---------------------------------------------------------------- modes


def warning_lines(caught: list[warnings.WarningMessage]) -> list[str]:
    """Each distinct warning as ``module.Category: message`` (polyprof's own start with "polyprof")."""
    return sorted({f"{w.category.__module__}.{w.category.__name__}: {w.message}" for w in caught})


def facts(torch: Any, device: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def run_mode(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = args.device
    global PROFILER
    PROFILER = args.profiler
    try:
        step = BUILDERS[args.workload](torch, device)
    except Unsupported as exc:
        return {"skip": str(exc)}
    sync = make_sync(torch, device)
    warmed = warm_up(step, sync, min_steps=args.warmup_steps, min_seconds=args.warmup_s)
    profile, activity_cls, schedule = profiler_api(args.profiler)
    activities = activities_for(activity_cls, device)
    out_dir = Path(args.out) / f"{args.profiler}_{args.workload}"
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path = out_dir / "trace.json"
    result: dict[str, Any] = {"profiler": args.profiler, "workload": args.workload, "device": device}
    result["facts"] = facts(torch, device)
    result["warmup_steps"] = warmed
    if args.workload == "cuda_graph":
        result["graph_preinit"] = os.environ.get("POLYPROF_GPU_GRAPH_PREINIT", "1") != "0"
    read_both_ways = args.profiler == "torch" and not args.no_reading
    reading_path = out_dir / "polyprof_reading.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not args.no_overhead:
            result["overhead"] = measure_overhead(
                profile, activities, step, sync, reps=args.overhead_reps, steps=args.overhead_steps
            )
        recordings = [
            record(
                profile,
                activities,
                schedule,
                step,
                steps=args.steps,
                trace_path=str(trace_path) if rep == args.reps - 1 else None,
                device=device,
                read_both_ways=read_both_ways,
                reading_trace_path=str(reading_path) if rep == args.reps - 1 else None,
            )
            for rep in range(args.reps)
        ]
    result["warnings"] = warning_lines(caught)
    result["summaries"] = [r["summary"] for r in recordings]
    result["steps"] = args.steps
    result["export_s"] = recordings[-1].get("export_s")
    result["trace"] = str(trace_path)
    result["trace_rows"] = trace_device_rows(trace_path)
    flows = trace_flows(trace_path)
    if read_both_ways:
        reading_flows = trace_flows(reading_path)
        result["reading"] = {
            "summaries": [r["reading"] for r in recordings],
            "seconds": [r["reading_s"] for r in recordings],
            "trace": str(reading_path),
            "trace_rows": trace_device_rows(reading_path),
            "flows": {k: v for k, v in reading_flows.items() if k != "exact"},
            # one recording's flow events, written by torch and by polyprof: what differs
            "flow_mismatches": exact_flow_mismatches(reading_flows, flows),
        }
    result["flows"] = {k: v for k, v in flows.items() if k != "exact"}
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def coexist_mode(args: argparse.Namespace) -> dict[str, Any]:
    """torch.profiler, polyprof, torch.profiler, polyprof one after the other in this process: each
    must record the same device rows (the two no longer fight over CUPTI)."""
    import torch

    device = args.device
    step = build_eager(torch, device)
    sync = make_sync(torch, device)
    warm_up(step, sync, min_steps=args.warmup_steps, min_seconds=args.warmup_s)
    runs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for which in ("torch", "polyprof", "torch", "polyprof"):
            profile, activity_cls, schedule = profiler_api(which)
            got = record(
                profile,
                activities_for(activity_cls, device),
                schedule,
                step,
                steps=args.steps,
                trace_path=None,
                device=device,
            )
            summary = got["summary"]
            runs.append(
                {"profiler": which, "device_rows": summary["device_rows"], "op_counts": summary["op_counts"]}
            )
    return {"runs": runs, "warnings": warning_lines(caught)}


def soak_mode(args: argparse.Namespace) -> dict[str, Any]:
    """Profiled training steps with a repeating schedule for ``--seconds``; every trace counted,
    exported and read back."""
    import torch

    device = args.device
    torch.manual_seed(0)
    model = _mlp(torch, device, width=512)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    host = torch.randn(_d(64), _d(512))
    sync = make_sync(torch, device)
    profile, activity_cls, schedule = profiler_api(args.profiler)
    trace_path = Path(args.out) / "soak_trace.json"
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    traces: list[dict[str, Any]] = []
    losses: list[float] = []

    def step() -> None:
        y = model(host.to(device))
        loss = y.square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # logs the loss: a sync every step

    def on_trace_ready(prof: Any) -> None:
        started = time.perf_counter()
        events = prof.events()
        device_rows = sum(1 for e in events if device_name(e.device_type) == "CUDA")
        prof.export_chrome_trace(str(trace_path))
        rows = trace_device_rows(trace_path)
        traces.append(
            {
                "events": len(events),
                "device_rows": device_rows,
                "trace_device_rows": rows["kernels"],
                "handler_s": time.perf_counter() - started,
            }
        )

    warm_up(step, sync, min_steps=args.warmup_steps, min_seconds=args.warmup_s)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    steps, started = 0, time.perf_counter()
    with profile(
        activities=activities_for(activity_cls, device),
        schedule=schedule(wait=2, warmup=1, active=3, repeat=0),
        on_trace_ready=on_trace_ready,
    ) as prof:
        while time.perf_counter() - started < args.seconds:
            step()
            prof.step()
            steps += 1
    elapsed = time.perf_counter() - started
    want = "device_rows" if device == "cuda" else "events"
    return {
        "profiler": args.profiler,
        "seconds": elapsed,
        "steps": steps,
        "traces": len(traces),
        "empty_traces": [
            i
            for i, t in enumerate(traces)
            if t[want] == 0 or (device == "cuda" and t["trace_device_rows"] == 0)
        ],
        "device_rows_min": min((t["device_rows"] for t in traces), default=0),
        "device_rows_max": max((t["device_rows"] for t in traces), default=0),
        "events_min": min((t["events"] for t in traces), default=0),
        "events_max": max((t["events"] for t in traces), default=0),
        "handler_s_max": max((t["handler_s"] for t in traces), default=0.0),
        "max_rss_mb_start": rss_start,
        "max_rss_mb_end": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "losses_finite": all(math.isfinite(v) for v in losses),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("mode", choices=("run", "coexist", "soak"))
    parser.add_argument("--profiler", choices=("torch", "polyprof"), default="polyprof")
    parser.add_argument("--workload", choices=WORKLOADS, default="eager")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=50, help="active steps per recording")
    parser.add_argument("--reps", type=int, default=3, help="recordings (per-key medians are compared)")
    parser.add_argument("--overhead-reps", type=int, default=7)
    parser.add_argument("--overhead-steps", type=int, default=50)
    parser.add_argument("--no-overhead", action="store_true", help="leave the overhead loops out")
    parser.add_argument(
        "--no-reading", action="store_true", help="torch.profiler: polyprof does not read its recordings too"
    )
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=300.0, help="soak: how long to run")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every tensor dimension")
    parser.add_argument(
        "--hang-dump-s", type=float, default=0.0, help="dump all stacks after this (0: never)"
    )
    args = parser.parse_args(argv)
    global SCALE
    SCALE = args.scale
    if args.hang_dump_s > 0:
        faulthandler.dump_traceback_later(args.hang_dump_s, exit=False)
    try:
        mode = {"run": run_mode, "coexist": coexist_mode, "soak": soak_mode}[args.mode]
        result = mode(args)
    except Exception:  # noqa: BLE001 - reported to the parent with the traceback
        result = {"error": traceback.format_exc()}
    sys.stdout.flush()
    print(MARKER + json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
