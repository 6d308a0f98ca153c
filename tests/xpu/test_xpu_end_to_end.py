"""The whole tracer inside polyprof.profile and polyprof.legacy.profile, with the fake PTI.

A custom torch op stands in for an XPU op: while it runs (inside its CPU op
interval, on the profiled thread) it makes the fake PTI record a SYCL runtime
call, a Level Zero driver call and the device work they launched, as a real
XPU op would. The records travel through the plugin's real callbacks, outbox,
bus and decoder, then the core's attribution gives the op its XPU time.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings

import pytest
from conftest import UUID0, UUID1, FakePti

torch = pytest.importorskip("torch")
import polyprof
from polyprof import ProfilerActivity

_FAKE: list[FakePti] = []
_CORR = [1000]
KERNEL_NS = (3000, 5000)  # device 0 kernel, device 1 kernel: 8 us per call


@torch.library.custom_op("polyprof_xpu_test::launch", mutates_args=())
def launch(x: torch.Tensor) -> torch.Tensor:
    fake = _FAKE[-1]
    now, tid, pid = time.time_ns(), threading.get_native_id(), os.getpid()
    for dev, (uuid, dur) in enumerate(zip((UUID0, UUID1), KERNEL_NS, strict=True)):
        _CORR[0] += 1
        corr = _CORR[0]
        at = now + dev * 2000  # one launch after the other, as on a real thread
        fake.fakePtiAddApi(6, at, at + 400, 3, 0, pid, tid, corr)  # urEnqueueKernelLaunch
        fake.fakePtiAddApi(3, at + 100, at + 300, 1, 1, pid, tid, corr)  # zeCommandListAppendLaunchKernel
        fake.fakePtiAddKernel(
            now + 10_000,
            now + 10_000 + dur,
            corr,
            tid,
            uuid,
            7 + dev,
            0xA0 + dev,
            fake.name(f"gemm_dev{dev}"),
            corr,
        )
    _CORR[0] += 1
    fake.fakePtiAddApi(6, now + 4500, now + 4900, 3, 1, pid, tid, _CORR[0])  # urEnqueueUSMMemcpy
    fake.fakePtiAddMemcpy(now + 20_000, now + 21_000, _CORR[0], tid, UUID0, 7, 0xA0, 6, 1, 2, 1 << 20)
    _CORR[0] += 1
    fake.fakePtiAddApi(6, now + 5000, now + 5200, 3, 2, pid, tid, _CORR[0])  # urEnqueueUSMFill
    fake.fakePtiAddMemfill(now + 22_000, now + 22_500, _CORR[0], tid, UUID1, 8, 0xA1, 2, 4096, 0)
    return x.clone()


@launch.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@pytest.fixture
def fake(fake_pti: FakePti):
    _FAKE.append(fake_pti)
    yield fake_pti
    _FAKE.pop()


def _run(prof_cm, calls: int = 3):
    x = torch.ones(8)
    with prof_cm as prof:
        for _ in range(calls):
            launch(x)
    return prof


def _row(prof, key: str):
    return next(e for e in prof.key_averages() if e.key == key)


def test_profile_cpu_and_xpu_gives_per_op_xpu_time(fake) -> None:
    prof = _run(polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]))
    table = prof.key_averages().table(sort_by="self_xpu_time_total", row_limit=20)
    for column in ("Self XPU", "Self XPU %", "XPU total", "XPU time avg"):
        assert column in table
    assert "Self XPU time total:" in table
    op = _row(prof, "polyprof_xpu_test::launch")
    assert op.count == 3
    per_call_ns = sum(KERNEL_NS) + 1000 + 500  # two kernels, the copy, the fill
    assert op.device_time_total == pytest.approx(3 * per_call_ns / 1000)
    assert op.self_device_time_total == pytest.approx(3 * per_call_ns / 1000)
    assert _row(prof, "gemm_dev1").device_time_total == pytest.approx(3 * KERNEL_NS[1] / 1000)
    assert _row(prof, "urEnqueueKernelLaunch").count == 6


def test_chrome_trace_is_kineto_shaped_for_xpu(fake, tmp_path) -> None:
    prof = _run(polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]), calls=2)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    cats = {e["cat"] for e in events}
    assert {"kernel", "gpu_memcpy", "gpu_memset", "xpu_runtime", "xpu_driver"} <= cats
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert {e["pid"] for e in kernels} == {0, 1}  # one process per device
    assert all("stream" in e["args"] for e in events if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert {(e["pid"], e["args"]["stream"]) for e in kernels} == {(0, 7), (1, 8)}
    assert all(e["args"].get("External id") for e in kernels)
    flows = [e for e in trace["traceEvents"] if e.get("cat") == "ac2g"]
    assert flows, "runtime -> kernel flows"
    assert [p["id"] for p in trace["deviceProperties"]] == [0, 1]


def test_legacy_profile_use_xpu(fake) -> None:
    prof = _run(polyprof.legacy.profile(use_xpu=True))
    table = prof.table(sort_by="self_xpu_time_total")
    assert "Self XPU" in table and "XPU total" in table and "XPU time avg" in table
    op = next(e for e in prof.key_averages() if e.key == "polyprof_xpu_test::launch")
    assert op.self_device_time_total > 0


def test_small_buffers_foreign_thread_delivery_and_accounting(fake, xpu_env) -> None:
    """Buffers filled and completed on a non-Python thread mid-recording; every record reaches the trace."""
    xpu_env.setenv("POLYPROF_XPU_BUFFER_BYTES", "1024")
    x = torch.ones(8)
    with polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]) as prof:
        launch(x)
        assert fake.fakePtiFlushOnThread() == 0  # PTI delivering full buffers from its own thread
        for _ in range(3):
            launch(x)  # ~1 KB of records per call: a 1 KiB buffer each
    assert fake.counter("buffers_delivered") >= 4
    assert _row(prof, "gemm_dev0").count == 4
    assert _row(prof, "urEnqueueKernelLaunch").count == 8
    notes = prof.trace.notes
    assert not [n for n in notes if n.startswith("XPU")], notes


def test_ipex_ze_tracing_0_profiles_cpu_only_with_a_warning(fake, xpu_env) -> None:
    xpu_env.setenv("IPEX_ZE_TRACING", "0")
    with pytest.warns(UserWarning, match="IPEX_ZE_TRACING=0"):
        prof = _run(polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]), calls=1)
    keys = {e.key for e in prof.key_averages()}
    assert "polyprof_xpu_test::launch" in keys and "gemm_dev0" not in keys
    assert "Self XPU" not in prof.key_averages().table()


def test_refused_kernel_view_warns_and_notes(fake, xpu_env) -> None:
    # The probe passes (it enables the kernel view too, so refuse a view only the tracer enables).
    xpu_env.setenv("FAKE_PTI_REFUSE_KIND", str(11))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        prof = _run(polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]), calls=1)
    assert [n for n in prof.trace.notes if "DEVICE_SYNCHRONIZATION could not be enabled" in n]
    assert _row(prof, "gemm_dev0").count == 1


def test_bad_buffer_size_is_a_clear_error(fake, xpu_env) -> None:
    xpu_env.setenv("POLYPROF_XPU_BUFFER_BYTES", "12")
    with pytest.raises(ValueError, match=r"POLYPROF_XPU_BUFFER_BYTES='12' is not valid: .* >= 192"):
        polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU]).start()


def test_pti_refusing_in_the_profiled_process_warns_and_profiles_cpu_only(fake, xpu_env, monkeypatch) -> None:
    # The probe (a child process) passed; here ptiViewSetCallbacks fails. No crash: a warning that
    # points at this line, CPU results, and a trace note.
    from polyprof_xpu import tracer as xpu_tracer

    from polyprof.registry import make_plugin_manager

    pm = make_plugin_manager()  # probes now, while PTI still works
    assert pm.provider_of(ProfilerActivity.XPU) is not None
    monkeypatch.setattr(xpu_tracer.router(), "installed_in", set())
    xpu_env.setenv("FAKE_PTI_REFUSE_CALLBACKS", "1")
    try:
        with pytest.warns(xpu_tracer.XpuTracingUnavailableWarning, match="could not start tracing") as caught:
            prof = _run(
                polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU], plugin_manager=pm),
                calls=2,
            )
    finally:
        pm.close()
    assert caught[0].filename == __file__
    assert _row(prof, "polyprof_xpu_test::launch").count == 2
    assert "gemm_dev0" not in {e.key for e in prof.key_averages()}
    assert [n for n in prof.trace.notes if n.startswith("XPU: nothing recorded: Intel PTI could not start")]
