"""Fixtures for tests/gpu: running gpu_child.py, where traces and results go, the machine's facts.

Environment (all optional):

* ``POLYPROF_GPU_RESULTS``: the JSON-lines file the measurements are appended to (default
  ``$OUT/gpu_results.jsonl`` when ``OUT`` is set, else ``<tmp>/polyprof_gpu_results.jsonl``);
* ``POLYPROF_GPU_TRACE_DIR``: where the children write their Chrome traces (default: pytest's tmp);
* ``POLYPROF_GPU_STEPS`` (50), ``POLYPROF_GPU_REPS`` (3), ``POLYPROF_GPU_OVERHEAD_REPS`` (7),
  ``POLYPROF_GPU_OVERHEAD_STEPS`` (50): the sizes of each child's recordings (gpu_child.py);
* ``POLYPROF_GPU_CHILD_TIMEOUT_S`` (600): a child running longer counts as hung;
* ``POLYPROF_GPU_SOAK_S`` (300): the soak's duration (test_gpu_soak.py);
* ``POLYPROF_GPU_GRAPH_PREINIT=0``: capture the CUDA graph before any profiler ran (by default an
  empty session of the profiler under test runs first, as torch documents for CUDA graphs);
* ``POLYPROF_GPU_TORCH_AGAIN=0``: no second torch.profiler child per workload (torch's own spread
  is then measured from its recordings in one process only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_compare import find_child_result, results_path, write_result

CHILD = Path(__file__).resolve().parent / "gpu_child.py"


def _tail(text: Any, n: int = 6000) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return (text or "")[-n:]


def run_child(args: list[str], *, timeout: float) -> dict[str, Any]:
    """Run gpu_child.py with ``args``; its result, or the test fails with what it printed.

    The child dumps every thread's stack 20 s before ``timeout`` (faulthandler), so
    a hang shows where it hangs in the failure message.
    """
    cmd = [sys.executable, str(CHILD), *args, "--hang-dump-s", str(max(timeout - 20, 1))]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"hang: {' '.join(args[:5])} did not finish within {timeout:.0f} s\n"
            f"--- stdout ---\n{_tail(exc.stdout, 2000)}\n--- stderr (stacks) ---\n{_tail(exc.stderr)}",
            pytrace=False,
        )
    result = find_child_result(proc.stdout)
    if result is None:
        pytest.fail(
            f"{' '.join(args[:5])} gave no result (exit status {proc.returncode})\n"
            f"--- stdout ---\n{_tail(proc.stdout, 2000)}\n--- stderr ---\n{_tail(proc.stderr)}",
            pytrace=False,
        )
    if "error" in result:
        stderr = _tail(proc.stderr, 3000)
        command = " ".join(args[:5])
        pytest.fail(f"{command} failed:\n{result['error']}\n--- stderr ---\n{stderr}", pytrace=False)
    result["stderr_tail"] = _tail(proc.stderr, 2000)
    return result


@pytest.fixture(scope="session")
def child() -> Callable[..., dict[str, Any]]:
    """``child(args, timeout=...)``: gpu_child.py's result (``run_child``)."""
    return run_child


@pytest.fixture(scope="session")
def trace_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the children write their traces: $POLYPROF_GPU_TRACE_DIR, else pytest's tmp."""
    configured = os.environ.get("POLYPROF_GPU_TRACE_DIR")
    if configured:
        root = Path(configured)
        root.mkdir(parents=True, exist_ok=True)
        return root
    return tmp_path_factory.mktemp("gpu-traces")


def machine_facts() -> dict[str, Any]:
    """GPU, driver, torch and CUDA versions as nvidia-smi and torch give them (no CUDA context made)."""
    import torch

    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    for name in ("polyprof", "polyprof_cuda", "triton", "hta", "pandas"):
        try:
            module = __import__(name)
            facts[name] = getattr(module, "__version__", "installed")
        except Exception as exc:  # noqa: BLE001 - a fact, whatever happened
            facts[name] = f"not importable: {type(exc).__name__}"
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "name,driver_version,memory.total,clocks.max.sm"
        out = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        facts["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
        first = out.stdout.strip().splitlines()[0].split(", ") if out.stdout.strip() else []
        if len(first) >= 2:
            facts["gpu"], facts["driver"] = first[0], first[1]
    return facts


@pytest.fixture(scope="session")
def record_result() -> Callable[[dict[str, Any]], None]:
    """``record_result(record)``: append one JSON line to the results file (the machine's facts go
    first, once per session)."""
    written: list[bool] = []

    def record(entry: dict[str, Any]) -> None:
        if not written:
            write_result({"record": "machine", **machine_facts()})
            written.append(True)
        write_result(entry)

    return record


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"polyprof GPU results: {results_path()}"]
