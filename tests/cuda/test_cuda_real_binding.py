"""End to end through the REAL cupti-python trampolines, with test doubles below them (cupti.md §5 tier 4).

Two small C libraries (native/) are compiled here with gcc, once per test session:

* ``libcuda.so.1``: a stub driver, just enough for cupti-python and cuda-bindings to
  initialise (``cuDriverGetVersion`` from ``$FAKE_CUDA_VER``, ``cuInit``,
  ``cuDeviceGetCount`` from ``$FAKE_CUDA_DEVICES``, ``cuGetProcAddress[_v2]``);
* ``libcupti.so.13``: a CUPTI test double exporting the calls polyprof-cuda makes. It
  keeps the callbacks cupti-python's C trampolines register, records what it is asked
  (enable/disable, filters, flushes, subscribe/unsubscribe) and, on flush, hands queued
  records to those trampolines in buffers the client's request callback supplied --
  on the flushing thread, or on a native thread Python never saw.

The child process (real_binding_child.py) runs under ``LD_PRELOAD`` of the fake
libcupti (cuda-pathfinder adopts an already loaded libcupti.so.13) and
``LD_LIBRARY_PATH`` of the stub driver. It profiles torch custom ops whose bodies
queue a runtime API record and the kernel or copy it launched, laid out with
cupti-python's own numpy dtypes, so the bytes are what cupti-python expects. Nothing
in polyprof is patched: the plugin is found through its entry point and its status
is "loaded". What this cannot show: a real driver's and CUPTI's behaviour (timing,
buffer sizes, lock order); that needs a GPU (tests/gpu).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("cupti.cupti", reason="cupti-python is not installed (pip install cupti-python)")
pytest.importorskip("torch")

HERE = Path(__file__).parent
NATIVE = HERE / "native"
CHILD = HERE / "real_binding_child.py"
CUDA_LAUNCH_KERNEL, CUDA_GET_DEVICE = 211, 17  # runtime cbids (cudaLaunchKernel_v7000, cudaGetDevice_v3020)


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory) -> Path:
    """The directory holding the compiled stub libcuda.so.1 and fake libcupti.so.13."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc) to build the CUPTI test doubles")
    out = tmp_path_factory.mktemp("fake-cuda")
    builds = [
        ("fake_libcuda.c", "libcuda.so.1", ["-ldl"]),
        ("fake_libcupti.c", "libcupti.so.13", ["-lpthread"]),
    ]
    for source, soname, libs in builds:
        cmd = [gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(out / soname)]
        cmd += [f"-Wl,-soname,{soname}", str(NATIVE / source), *libs]
        built = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        assert built.returncode == 0, f"building {soname} failed:\n{built.stderr}"
    return out


def run_child(fake_libs: Path, scenario: str, tmp_path: Path, **env: str) -> dict:
    child_env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("POLYPROF_DISABLE_PLUGIN_AUTOLOAD", "POLYPROF_PLUGINS", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD")
    }
    child_env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(fake_libs), os.environ.get("LD_LIBRARY_PATH")])
    )
    child_env["LD_PRELOAD"] = str(fake_libs / "libcupti.so.13")
    child_env["FAKE_CUDA_VER"] = "13000"
    child_env.update(env)
    target = tmp_path / f"{scenario}.json"
    done = subprocess.run(
        [sys.executable, str(CHILD), scenario, str(target)],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    result = json.loads(target.read_text())
    assert result["fake_loaded"], "the child did not get the fake libcupti"
    return result


@pytest.fixture(scope="module")
def session(fake_libs, tmp_path_factory) -> dict:
    return run_child(fake_libs, "session", tmp_path_factory.mktemp("session"))


# ------------------------------------------------------------------ the session


def test_plugin_loads_and_records_without_warnings(session):
    assert session["plugin"] == {"status": "loaded", "reason": None, "distribution": "polyprof-cuda"}
    assert session["warnings"] == []
    assert session["notes"] == [], "accounting must balance: every delivered record is in the trace"


def test_every_device_record_reaches_the_trace_with_its_name(session):
    # 3 gemm in the main thread, 1 outer + its inner gemm, 2 gemm on the worker thread, 1 upload.
    assert Counter(session["device_rows"]) == {
        "gemm_kernel": 6,
        "outer_kernel": 1,
        "Memcpy HtoD (Pageable -> Device)": 1,
    }
    assert Counter(session["runtime_rows"]) == {"cudaLaunchKernel": 7, "cudaMemcpyAsync": 1}
    assert session["records_queued"] == 16  # 8 API calls + 8 device records, all delivered and decoded


def test_kineto_source_filter_reaches_cupti(session):
    """cudaGetDevice is switched off at the source, so CUPTI never records it."""
    assert f"runtime_cbid {CUDA_GET_DEVICE} 0" in session["call_log"]
    assert session["filtered_call_recorded"] == 0


def test_self_cuda_and_cuda_total_per_op(session):
    ops = session["ops"]
    # gemm: 3 x 10 us in the main thread + 80 us inside outer; the worker thread's gemm ops are
    # not CPU-profiled (torch's profiler records the profiling thread only), so theirs stay unattributed.
    assert ops["pfake::gemm"] == {"count": 4, "self_device_us": 110.0, "device_us": 110.0}
    assert ops["pfake::outer"] == {"count": 1, "self_device_us": 40.0, "device_us": 120.0}
    assert ops["pfake::upload"] == {"count": 1, "self_device_us": 3.0, "device_us": 3.0}
    assert ops["gemm_kernel"]["count"] == 6 and ops["gemm_kernel"]["device_us"] == 110.0 + 30.0
    assert ops["aten::add"]["self_device_us"] == 0.0


def test_table_has_the_cuda_columns(session):
    table = session["table"]
    header = table.splitlines()[1]
    for column in ("Self CPU", "Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg", "# of Calls"):
        assert column in header
    assert table.rstrip().endswith("Self CUDA time total: 183.000us")
    rows = {
        line.split()[0]: line.split()
        for line in table.splitlines()[3:]
        if line.strip() and not line.startswith("-")
    }
    assert rows["pfake::gemm"][6] == "110.000us"  # Self CUDA


def test_api_rows_carry_the_os_thread_of_each_launching_thread(session):
    # The fake stamps thread ids the way CUPTI does for the type the plugin chose (gettid for SYSTEM).
    assert "thread_id_type 1" in session["call_log"]
    assert session["runtime_tids"] == sorted(session["python_tids"])


def test_buffers_arrive_from_a_native_thread_and_from_the_stopping_thread(session):
    assert session["native_delivery_rc"] == 0
    native, at_stop = session["deliveries"]
    assert native not in session["python_tids"], "the first delivery must come from a thread Python never saw"
    assert at_stop == session["main_tid"], "stop's forced flush delivers on the thread that stops"
    assert session["pending_before_stop"] == 8 and session["pending_after_stop"] == 0


def test_stop_order_is_forced_flush_then_disable_then_unsubscribe(session):
    log = session["call_log"]
    assert log[0] == "subscribe polyprof-cuda -> 0"
    assert log.index("thread_id_type 1") < log.index("register_callbacks") < log.index("enable 10")
    flush = max(i for i, line in enumerate(log) if line == "flush 1")
    first_disable = min(i for i, line in enumerate(log) if line.startswith("disable "))
    assert flush < first_disable and log[flush + 1].startswith("deliver ")
    enabled = {line.split()[1] for line in log if line.startswith("enable ")}
    disabled = {line.split()[1] for line in log[first_disable:] if line.startswith("disable ")}
    assert enabled == disabled and {"10", "1", "2", "5", "4"} <= enabled
    assert log[-1] == "unsubscribe"


def test_chrome_trace_kernels_carry_kineto_args_and_flows(session):
    kernels = session["chrome_kernels"]
    assert len(kernels) == 7
    for k in kernels:
        args = k["args"]
        assert args["grid"] == [128, 1, 1] and args["block"] == [256, 1, 1]
        assert args["registers per thread"] == 32 and args["shared memory"] == 1024 + 4096
        assert args["stream"] == 7 and args["device"] == 0
        assert args["queued"] == session["queued"][str(args["correlation"])]
    attributed = [k for k in kernels if "External id" in k["args"]]
    assert len(attributed) == 5  # the worker thread's 2 have no CPU op to link to
    assert Counter(session["chrome_flows"]) == {"s": 8, "f": 8}


# ------------------------------------------------------------ other outcomes


def test_another_subscriber_is_named_and_profiling_goes_on_cpu_only(fake_libs, tmp_path):
    result = run_child(fake_libs, "conflict", tmp_path)
    (warning,) = [w for w in result["warnings"] if "CudaTracingUnavailableWarning" in w]
    assert "Nsight Systems" in warning and "CPU-only" in warning
    assert "aten::relu" in result["ops"]
    assert any("Nsight Systems" in n for n in result["notes"])
    assert [line for line in result["call_log"] if not line.startswith("subscribe")] == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"FAKE_CUDA_VER": "12040"}, "driver is too old"),
        ({"FAKE_CUDA_DEVICES": "0"}, "no CUDA device visible"),
    ],
)
def test_probe_through_the_real_binding(fake_libs, tmp_path, env, expected):
    reason = run_child(fake_libs, "probe", tmp_path, **env)["reason"]
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason
