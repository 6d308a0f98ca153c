"""Parquet traces against Chrome JSON: size, write time and read time (issue 13, item 2).

For each size of ``--sizes``, one child process profiles N tiny ops (``torch.add`` on 1-element
tensors) with torch.profiler and writes torch's Chrome trace; then, on that file, it measures:

* size: the JSON, the same gzip-compressed (``polyprof convert`` to ``.json.gz``, gzip level 6),
  and the Parquet trace (zstd, the default);
* write: the JSON (``write_json_trace`` of the parsed document, orjson), the ``.json.gz``, and the
  Parquet trace (``write_parquet_trace``: document to columns, then the file);
* convert: ``polyprof convert`` JSON to Parquet, whole (read, columns, write);
* read: JSON parsed (``load_chrome_trace``), Parquet into the same document
  (``read_trace_document``), Parquet columns only (``pyarrow.parquet.read_table``);
* query: total ``dur`` per name, by DuckDB on the Parquet file against the JSON parsed and summed
  in Python (the least any JSON tool pays: the parse).

Each number is the median of ``--reps`` repetitions in that child. Prints a table and writes
``--json``.

Usage:
    python benchmarks/bench_columnar.py --sizes 10000,200000,1000000 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

CHILD = r"""
import atexit, json, os, shutil, statistics, sys, tempfile, time
import torch
from torch.profiler import profile, ProfilerActivity
import pyarrow.parquet as pq
import duckdb
from polyprof.formats import columnar
from polyprof.formats.chrome_reader import load_chrome_trace
from polyprof.cli.cli_convert import convert_file

torch.set_num_threads(1)
n_ops, reps = int(sys.argv[1]), int(sys.argv[2])
folder = tempfile.mkdtemp()
atexit.register(shutil.rmtree, folder, ignore_errors=True)
source = os.path.join(folder, "torch.json")
a, b = torch.ones(1), torch.ones(1)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(n_ops):
        torch.add(a, b)
prof.export_chrome_trace(source)
del prof

def timed(work):
    times = []
    for _ in range(reps):
        started = time.perf_counter(); work(); times.append(time.perf_counter() - started)
    return statistics.median(times)

doc = load_chrome_trace(source)
out = {"events": len(doc["traceEvents"])}
paths = {name: os.path.join(folder, "out" + suffix)
         for name, suffix in (("json", ".json"), ("json.gz", ".json.gz"), ("parquet", ".parquet"))}
out["write_json_s"] = timed(lambda: columnar.write_json_trace(doc, paths["json"]))
out["write_json_gz_s"] = timed(lambda: columnar.write_json_trace(doc, paths["json.gz"]))
out["write_parquet_s"] = timed(lambda: columnar.write_parquet_trace(doc, paths["parquet"]))
out["convert_json_to_parquet_s"] = timed(lambda: convert_file(source, paths["parquet"]))
for name, path in (("torch_json", source), *paths.items()):
    out[f"bytes_{name.replace('.', '_')}"] = os.path.getsize(path)
out["read_json_s"] = timed(lambda: load_chrome_trace(source))
out["read_parquet_document_s"] = timed(lambda: columnar.read_trace_document(paths["parquet"]))
out["read_parquet_columns_s"] = timed(lambda: pq.read_table(paths["parquet"]))

def python_sum():
    totals = {}
    for event in load_chrome_trace(source)["traceEvents"]:
        if "dur" in event:
            totals[event.get("name")] = totals.get(event.get("name"), 0.0) + event["dur"]
    return totals
query = f"select name, sum(dur) from read_parquet('{paths['parquet']}') where dur is not null group by name"
connection = duckdb.connect()
out["query_json_python_s"] = timed(python_sum)
out["query_parquet_duckdb_s"] = timed(lambda: connection.sql(query).fetchall())
ours = dict(connection.sql(query).fetchall())
theirs = python_sum()
assert ours.keys() == theirs.keys()
assert all(abs(ours[k] - theirs[k]) <= 1e-6 * abs(theirs[k]) + 1e-9 for k in ours)
print(json.dumps(out))
"""


def run_child(n_ops: int, reps: int) -> dict:
    env = dict(os.environ, KINETO_LOG_LEVEL="5")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(n_ops), str(reps)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"child for {n_ops} ops failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(results: dict[int, dict]) -> None:
    rows = (
        ("events", "events", 1, "{:.0f}"),
        ("JSON (torch's file), MB", "bytes_torch_json", 1e-6, "{:.2f}"),
        ("JSON (orjson), MB", "bytes_json", 1e-6, "{:.2f}"),
        ("JSON gzip, MB", "bytes_json_gz", 1e-6, "{:.2f}"),
        ("Parquet zstd, MB", "bytes_parquet", 1e-6, "{:.2f}"),
        ("write JSON, s", "write_json_s", 1, "{:.3f}"),
        ("write JSON gzip, s", "write_json_gz_s", 1, "{:.3f}"),
        ("write Parquet, s", "write_parquet_s", 1, "{:.3f}"),
        ("convert JSON file to Parquet, s", "convert_json_to_parquet_s", 1, "{:.3f}"),
        ("read JSON, s", "read_json_s", 1, "{:.3f}"),
        ("read Parquet into the document, s", "read_parquet_document_s", 1, "{:.3f}"),
        ("read Parquet columns, s", "read_parquet_columns_s", 1, "{:.3f}"),
        ("dur per name: JSON + Python, s", "query_json_python_s", 1, "{:.3f}"),
        ("dur per name: DuckDB on Parquet, s", "query_parquet_duckdb_s", 1, "{:.3f}"),
    )
    sizes = sorted(results)
    print(f"{'':38}" + "".join(f"{size:>14,}" for size in sizes))
    for label, key, scale, fmt in rows:
        print(f"{label:38}" + "".join(f"{fmt.format(results[s][key] * scale):>14}" for s in sizes))
    for size in sizes:
        r = results[size]
        smaller = r["bytes_torch_json"] / r["bytes_parquet"]
        smaller_than_gzip = r["bytes_json_gz"] / r["bytes_parquet"]
        read = r["read_json_s"] / r["read_parquet_columns_s"]
        query = r["query_json_python_s"] / r["query_parquet_duckdb_s"]
        print(
            f"{size:>9,} events: Parquet {smaller:.0f}x smaller than torch's JSON, {smaller_than_gzip:.1f}x "
            f"smaller than gzip JSON; columns read {read:.0f}x faster than JSON parses; "
            f"the DuckDB query {query:.0f}x faster"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,200000", help="comma-separated op counts")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each measurement (median)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    for size in sizes:
        print(f"{size} ops ...", file=sys.stderr, flush=True)
        results[size] = run_child(size, args.reps)
    print_table(results)
    if args.json:
        import torch

        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "reps": args.reps,
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": {str(k): v for k, v in results.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
