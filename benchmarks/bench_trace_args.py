"""Trace args end to end: decode, Chrome trace export and ``polyprof report``'s reader, with args.

``bench_profilers.py`` records without shapes, so its traces carry no Kineto
args. This one records N tiny ops with ``record_shapes=True`` (every op then
has torch's args: input dims, types, strides, concrete inputs, ``Ev Idx``) and
reports, each in a fresh child process (median of ``--reps``):

* first export: the deferred decode of torch's args and the trace written,
* second export: the writer alone (the columns are decoded by then),
* read back: ``polyprof.formats.chrome_reader.read_chrome_trace`` of that file,
* interning: ``polyprof.base.events.intern_column`` over N op names (the tracers' hot path).

Usage: python benchmarks/bench_trace_args.py [--ops 200000] [--reps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, sys, tempfile, time
import torch
torch.set_num_threads(1)
from polyprof import profile, ProfilerActivity
from polyprof.formats.chrome_reader import read_chrome_trace
from polyprof.base.events import intern_column

n_ops = int(sys.argv[1])
a = torch.ones(1); b = torch.ones(1)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as warm:
    torch.add(a, b)
warm.key_averages().table()
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for _ in range(n_ops):
        torch.add(a, b)
prof.key_averages().table(row_limit=5)
folder = tempfile.mkdtemp()
first, second = os.path.join(folder, "first.json"), os.path.join(folder, "second.json")
t0 = time.perf_counter(); prof.export_chrome_trace(first); first_s = time.perf_counter() - t0
t0 = time.perf_counter(); prof.export_chrome_trace(second); second_s = time.perf_counter() - t0
t0 = time.perf_counter(); trace = read_chrome_trace(first); read_s = time.perf_counter() - t0
names = [f"aten::op{i % 97}" for i in range(n_ops)]
t0 = time.perf_counter(); intern_column(names); intern_s = time.perf_counter() - t0
print(json.dumps({"first_export_s": first_s, "second_export_s": second_s, "read_s": read_s,
                  "intern_s": intern_s, "events_read": len(trace.events),
                  "trace_bytes": os.path.getsize(first)}))
"""


def run_child(n_ops: int) -> dict:
    env = dict(os.environ, KINETO_LOG_LEVEL="5")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n_ops)], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=200_000, help="tiny ops recorded with shapes")
    parser.add_argument("--reps", type=int, default=3, help="child processes (median)")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    runs = [run_child(args.ops) for _ in range(args.reps)]
    for key in ("first_export_s", "second_export_s", "read_s", "intern_s", "trace_bytes", "events_read"):
        print(f"{key:18} {statistics.median(r[key] for r in runs):14.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
