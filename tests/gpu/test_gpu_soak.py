"""Soak: polyprof profiling training steps on a GPU for 5 minutes (skipped without a GPU).

A child process (gpu_child.py soak) runs an MLP training step (host batch
copied in, forward, backward, AdamW, ``loss.item()``) under
``polyprof.profile(activities=[CPU, CUDA], schedule=schedule(wait=2,
warmup=1, active=3), on_trace_ready=...)`` for POLYPROF_GPU_SOAK_S seconds
(300 by default). Every trace is summarised and exported in on_trace_ready.
It must finish without hanging (a timeout of 1.2 x the duration + 120 s;
the child dumps its stacks 20 s before) and every trace must hold CUDA rows, in
``events()`` and in the exported file. Steps, traces, rows per trace and
peak RSS go to the results file. Select it alone with ``-k soak``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_compare import env_float  # noqa: E402

#: steps per schedule cycle: wait 2 + warmup 1 + active 3
CYCLE = 6

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU that torch can use (CUDA)"),
]


def test_soak_profiled_steps_with_a_schedule(child, trace_root, record_result):
    seconds = env_float("POLYPROF_GPU_SOAK_S", 300.0)
    timeout = 1.2 * seconds + 120  # 480 s for the default 300: a hang is reported within 10 minutes
    result = child(
        ["soak", "--profiler", "polyprof", "--seconds", str(seconds), "--out", str(trace_root / "soak")],
        timeout=timeout,
    )
    result.pop("stderr_tail", None)
    record_result({"record": "soak", "requested_s": seconds, **result})
    assert result["steps"] > 0 and result["traces"] > 0, result
    assert result["empty_traces"] == [], f"traces without CUDA rows (indices): {result['empty_traces'][:20]}"
    # one trace per completed cycle, plus the cycle the loop stopped in when it had begun recording
    assert result["steps"] // CYCLE - 1 <= result["traces"] <= result["steps"] // CYCLE + 1, result
    assert result["losses_finite"], "the training diverged: the workload, not the profiler"
