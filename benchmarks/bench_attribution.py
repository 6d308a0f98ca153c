"""Throughput of device attribution (``polyprof.base.attribution.link_launches``) on synthetic data.

torch has no counterpart to compare with on a machine without a GPU (its CUDA
linking happens inside Kineto), so this reports absolute time for a size that
matters: N torch ops on 4 threads (half of them nested in the other half),
N launch calls at random times and threads, and N kernels.

Usage: python benchmarks/bench_attribution.py [--ops 200000] [--reps 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from polyprof.base.attribution import link_launches
from polyprof.base.events import DeviceType, EventBatch, EventKind


def synthetic(n: int, threads: int = 4, seed: int = 0) -> tuple[EventBatch, EventBatch]:
    rng = np.random.default_rng(seed)
    per_thread = n // threads
    tid = np.repeat(np.arange(threads), per_thread)
    slot = np.tile(np.arange(per_thread), threads)
    # Pairs: an op of 900 ns, and one of 500 ns nested 100 ns into it.
    child = slot % 2 == 1
    start = (slot - child) * 1000 + np.where(child, 100, 0)
    dur = np.where(child, 500, 900)
    m = len(tid)
    cpu = EventBatch.build(
        "torch_cpu",
        {
            "kind": np.full(m, int(EventKind.CPU_OP), np.int8),
            "name": np.full(m, -1, np.int32),
            "start_ns": start,
            "dur_ns": dur,
            "tid": tid,
            "correlation_id": np.arange(1, m + 1),
        },
    )
    launch_start = rng.integers(0, per_thread * 1000, m)
    corr = np.arange(1, m + 1)
    device = EventBatch.build(
        "cupti",
        {
            "kind": np.r_[
                np.full(m, int(EventKind.RUNTIME), np.int8), np.full(m, int(EventKind.KERNEL), np.int8)
            ],
            "name": np.full(2 * m, -1, np.int32),
            "start_ns": np.r_[launch_start, launch_start + 5000],
            "dur_ns": np.r_[np.full(m, 50), np.full(m, 3000)],
            "tid": np.r_[rng.integers(0, threads, m), np.zeros(m, np.int64)],
            "correlation_id": np.r_[corr, corr],
            "device_type": np.full(2 * m, int(DeviceType.CUDA), np.int8),
        },
    )
    return cpu, device


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=200_000, help="torch ops (and launches, and kernels)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    cpu, device = synthetic(args.ops)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        linked = link_launches([cpu, device])[1]
        times.append(time.perf_counter() - t0)
    share = float((linked["linked_correlation_id"] > 0).mean())
    print(
        f"link_launches: {len(cpu)} ops, {len(device)} launch + kernel rows: "
        f"median {sorted(times)[len(times) // 2]:.3f} s over {args.reps} runs "
        f"({share:.0%} of rows attributed)"
    )


if __name__ == "__main__":
    main()
