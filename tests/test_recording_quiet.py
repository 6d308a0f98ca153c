"""While a profile records, polyprof stays out of the program's way.

Recording CUDA must cost what torch's recording costs: no polyprof thread wakes
more than 10 times a second (each wake takes the GIL from a thread launching
kernels), and no polyprof Python runs on the program's thread between the
profile's start and its stop. Wake-ups are read from Linux's per-thread context
switch counters (``/proc/self/task/TID/status``); CUDA is requested on torch's CPU
build through the ``gpu_present`` fixture, so the profile takes the path recording
CUDA takes, with polyprof-cuda's tracer attached.
"""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import polyprof  # noqa: E402
from polyprof.base.events import EventKind  # noqa: E402

TASKS = Path("/proc/self/task")
#: The most wake-ups a second any polyprof thread may have while a profile records.
MOST_WAKEUPS_PER_S = 10
#: How long each check lets the program run under the profile.
WINDOW_S = 1.0
ACTIVITIES = [polyprof.ProfilerActivity.CPU, polyprof.ProfilerActivity.CUDA]
#: Where polyprof's own Python lives (core, built-in plugins, polyprof-cuda).
OWN_PACKAGES = ("polyprof", "polyprof_builtins", "polyprof_cuda")


def _context_switches() -> dict[int, int]:
    """Each thread's voluntary and involuntary context switches so far, by native thread id."""
    counts = {}
    for task in TASKS.iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        counts[int(task.name)] = int(fields["voluntary_ctxt_switches"]) + int(
            fields["nonvoluntary_ctxt_switches"]
        )
    return counts


def _busy_program(seconds: float) -> int:
    """Small torch ops on this thread for ``seconds``: many short launches, as a training loop makes."""
    a = torch.ones(32, 32)
    ops = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.mm(a, a).add_(1)
        ops += 2
    return ops


def _wakeups_while_recording(pm: Any) -> tuple[dict[str, int], float, Any]:
    """Wake-ups of every thread but this one during ``WINDOW_S`` of recording; the elapsed time."""
    with polyprof.profile(activities=ACTIVITIES, plugin_manager=pm):
        _busy_program(0.05)  # the first profile's one-time work (imports, the reader's choice)
    with polyprof.profile(activities=ACTIVITIES, plugin_manager=pm) as prof:
        names = {t.native_id: t.name for t in threading.enumerate() if t is not threading.current_thread()}
        before = _context_switches()
        started = time.monotonic()
        _busy_program(WINDOW_S)
        elapsed = time.monotonic() - started
        after = _context_switches()
    wakeups = {
        f"{names[tid]} ({tid})": after[tid] - before[tid] for tid in names if tid in before and tid in after
    }
    return wakeups, elapsed, prof


@pytest.mark.skipif(not TASKS.is_dir(), reason="wake-ups are counted from Linux's /proc")
def test_no_polyprof_thread_wakes_more_than_ten_times_a_second_while_recording_cuda(gpu_present: Any) -> None:
    wakeups, elapsed, prof = _wakeups_while_recording(gpu_present)
    assert "CUDA" in prof.trace.config.torch_activities, (
        "CUDA was not recorded: the check would prove nothing"
    )
    # The bus thread starts only at the end of a plain recording; any polyprof thread alive is counted.
    busy = {name: n for name, n in wakeups.items() if n > MOST_WAKEUPS_PER_S * elapsed}
    assert not busy, f"threads that woke more than {MOST_WAKEUPS_PER_S}/s over {elapsed:.2f} s: {busy}"


def _fake_nvml() -> types.ModuleType:
    """The slice of pynvml polyprof-cuda's sampler calls, answering at once for one device."""
    nvml = types.ModuleType("pynvml")
    reading = types.SimpleNamespace(gpu=50, used=2**30)
    for name, answer in {
        "nvmlInit": None,
        "nvmlShutdown": None,
        "nvmlDeviceGetCount": 1,
        "nvmlDeviceGetHandleByIndex": "handle",
        "nvmlDeviceGetHandleByUUID": "handle",
        "nvmlDeviceGetUtilizationRates": reading,
        "nvmlDeviceGetMemoryInfo": reading,
        "nvmlDeviceGetPowerUsage": 100_000,
        "nvmlDeviceGetClockInfo": 1_500,
    }.items():
        setattr(nvml, name, lambda *args, _answer=answer: _answer)
    nvml.NVML_CLOCK_SM = 1
    return nvml


@pytest.mark.skipif(not TASKS.is_dir(), reason="wake-ups are counted from Linux's /proc")
def test_with_gpu_counters_sampled_only_the_sampler_wakes_and_at_its_interval(
    gpu_present: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NVML sampler hands its samples over while recording; nothing else wakes for them."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    monkeypatch.setenv("POLYPROF_CUDA_NVML_INTERVAL_MS", "200")
    monkeypatch.setattr("polyprof_cuda.nvml.HANDOVER_PERIOD_S", 0.1)  # several hand-overs in the window
    wakeups, elapsed, prof = _wakeups_while_recording(gpu_present)
    sampler = {name: n for name, n in wakeups.items() if name.startswith("polyprof-nvml-sampler")}
    assert sampler, f"no sampler thread among {sorted(wakeups)}"
    busy = {name: n for name, n in wakeups.items() if n > MOST_WAKEUPS_PER_S * elapsed}
    assert not busy, f"threads that woke more than {MOST_WAKEUPS_PER_S}/s over {elapsed:.2f} s: {busy}"
    counters = int((prof.trace.events["kind"] == int(EventKind.COUNTER)).sum())
    assert counters > 0, "the sampler's samples did not reach the trace"


def test_no_polyprof_python_runs_on_the_programs_thread_while_recording_cuda(gpu_present: Any) -> None:
    """Nothing of polyprof's runs per op or per launch: its start and stop are the only calls."""
    entered: list[str] = []

    def watch(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.split(".", 1)[0] in OWN_PACKAGES:
                entered.append(f"{module}.{frame.f_code.co_name}")

    with polyprof.profile(activities=ACTIVITIES, plugin_manager=gpu_present):
        _busy_program(0.05)
    with polyprof.profile(activities=ACTIVITIES, plugin_manager=gpu_present) as prof:
        sys.setprofile(watch)
        try:
            ops = _busy_program(0.2)
        finally:
            sys.setprofile(None)
    assert "CUDA" in prof.trace.config.torch_activities
    assert ops > 0
    assert entered == []
