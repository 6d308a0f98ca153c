"""Cost of polyprof-cuda's NVML sampler on the profiled program, with a fake NVML.

The same workload (small torch ops from a Python loop: the GIL-bound case, where
a sampler thread competes most with the program) runs under ``polyprof.profile``
without the sampler and with it at several intervals; runs alternate, and the
report is the median wall time of each and its ratio to "no sampler".

The fake NVML answers each query at once by default, which measures the Python
side of the sampler: the time its thread holds the GIL per round (4 queries per
device, 2 devices here). ``--call-us`` adds a sleep per query to stand in for the
real ctypes call, which releases the GIL as a sleep does (real NVML queries take
roughly 10 to 100 µs each, depending on the query and the driver).

Usage: python benchmarks/bench_nvml_sampler.py [--ops 100000] [--reps 7] [--intervals 10,100,1000]
       [--call-us 0]
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from typing import Any

import torch

import polyprof
from polyprof.hooks.hookspecs import hookimpl
from polyprof.testing import make_plugin_manager_for_tests
from polyprof_cuda.nvml import NvmlSampler

DEVICES = 2


def fake_nvml(call_s: float) -> types.ModuleType:
    """nvidia-ml-py's functions the sampler calls, answering constant readings after ``call_s``."""

    def query(result: Any) -> Any:
        def call(*_: Any) -> Any:
            if call_s:
                time.sleep(call_s)
            return result

        return call

    module = types.ModuleType("pynvml")
    module.NVML_CLOCK_SM = 1
    module.nvmlInit = query(None)
    module.nvmlShutdown = query(None)
    module.nvmlDeviceGetCount = query(DEVICES)
    module.nvmlDeviceGetHandleByIndex = lambda index: ("handle", index)
    module.nvmlDeviceGetUtilizationRates = query(types.SimpleNamespace(gpu=75, memory=20))
    module.nvmlDeviceGetMemoryInfo = query(
        types.SimpleNamespace(total=80 << 30, free=60 << 30, used=20 << 30)
    )
    module.nvmlDeviceGetPowerUsage = query(300_000)
    module.nvmlDeviceGetClockInfo = query(1980)
    return module


class SamplerPlugin:
    def __init__(self, nvml: types.ModuleType, interval_ms: float) -> None:
        self.nvml = nvml
        self.interval_ms = interval_ms
        self.sampler: NvmlSampler | None = None

    @hookimpl
    def polyprof_make_tracers(self, config: Any) -> list[NvmlSampler]:
        self.sampler = NvmlSampler(self.nvml, self.interval_ms, devices_in_use=lambda: None, environ={})
        return [self.sampler]


def workload(ops: int) -> None:
    x = torch.ones(8)
    for _ in range(ops):
        x = x + 1


def timed_run(ops: int, plugin: SamplerPlugin | None) -> tuple[float, int]:
    """(seconds the workload took under the profiler, sampling rounds)."""
    extra = [("nvml_bench", plugin)] if plugin is not None else []
    pm = make_plugin_manager_for_tests(*extra, builtins=True)
    with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU], plugin_manager=pm):
        began = time.perf_counter()
        workload(ops)
        took = time.perf_counter() - began
    rounds = plugin.sampler.rounds if plugin is not None and plugin.sampler is not None else 0
    return took, rounds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=100_000, help="torch ops in the workload")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--intervals", default="10,100,1000", help="intervals in ms, comma-separated")
    parser.add_argument("--call-us", type=float, default=0.0, help="latency of each fake NVML query (µs)")
    args = parser.parse_args()
    intervals = [float(i) for i in args.intervals.split(",")]
    nvml = fake_nvml(args.call_us / 1e6)

    timed_run(args.ops // 10, None)  # warm-up: imports, torch's first profile
    times: dict[str, list[float]] = {"none": []}
    rounds: dict[str, list[int]] = {}
    for interval in intervals:
        times[f"{interval:g} ms"] = []
        rounds[f"{interval:g} ms"] = []
    for _ in range(args.reps):
        times["none"].append(timed_run(args.ops, None)[0])
        for interval in intervals:
            took, done = timed_run(args.ops, SamplerPlugin(nvml, interval))
            times[f"{interval:g} ms"].append(took)
            rounds[f"{interval:g} ms"].append(done)

    baseline = statistics.median(times["none"])
    print(
        f"workload: {args.ops} torch ops under polyprof.profile (CPU); fake NVML, {DEVICES} devices, "
        f"{args.call_us:g} µs per query; median of {args.reps} runs"
    )
    print(f"{'sampler':>10} {'seconds':>9} {'ratio':>7} {'rounds':>7}")
    print(f"{'none':>10} {baseline:9.4f} {1:7.3f} {'':>7}")
    for interval in intervals:
        key = f"{interval:g} ms"
        median = statistics.median(times[key])
        print(f"{key:>10} {median:9.4f} {median / baseline:7.3f} {statistics.median(rounds[key]):7.0f}")


if __name__ == "__main__":
    main()
