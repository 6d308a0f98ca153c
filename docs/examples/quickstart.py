"""Profile a small conv net with polyprof: print the table, write a Chrome trace."""

from __future__ import annotations

import argparse
import os
import sys

import torch

from polyprof import ProfilerActivity, profile, record_function


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", default="polyprof-out", help="directory for the trace (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 30 * 30, 10),
    )
    inputs = torch.randn(5, 3, 32, 32)

    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_flops=True
    ) as prof:
        with record_function("model_inference"):
            loss = model(inputs).sum()
        with record_function("backward"):
            loss.backward()

    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total", row_limit=10))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.abspath(os.path.join(args.out, "trace.json"))
    prof.export_chrome_trace(path)
    print(f"Chrome trace written to {path} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
