"""The real no-driver path: this machine (and CI) has no libcuda.so.1 and no GPU.

These tests use the real cupti-python, which imports fine and then raises on
every call; polyprof-cuda must report itself unavailable, warn when CUDA is
asked for, and profile CPU only. The reason text is checked only for the
cause it names, not word for word.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("cupti.cupti", reason="cupti-python is not installed")

import polyprof
from polyprof import ProfilerActivity
from polyprof.events import EventKind
from polyprof.session import ActivityUnavailableWarning
from polyprof_cuda import probe
from polyprof_cuda.cupti_api import CuptiApi, classify_exception
from polyprof_cuda.tracer import CudaTracingUnavailableWarning, CuptiTracer


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    _driver_present(), reason="an NVIDIA driver is installed: not the no-driver path"
)

torch = pytest.importorskip("torch")


def _workload() -> None:
    a = torch.ones(16, 16)
    torch.mm(a, a).relu()


def test_probe_names_the_missing_driver():
    reason = probe.unavailable_reason()
    assert reason is not None and "no NVIDIA driver" in reason and "libcuda.so.1" in reason


def test_every_cupti_call_fails_cleanly_and_is_classified():
    api = CuptiApi()
    for call in (
        api.get_timestamp,
        lambda: api.subscribe("x"),
        api.dropped_records,
        lambda: api.flush_all(True),
    ):
        with pytest.raises(RuntimeError) as info:
            call()
        assert api.classify(info.value).code == "NO_DRIVER"


def test_polyprof_plugins_lists_the_plugin_as_unavailable_with_its_reason():
    out = subprocess.run(
        [sys.executable, "-m", "polyprof", "plugins", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    (cuda,) = [p for p in json.loads(out.stdout) if p["name"] == "cuda"]
    assert cuda["distribution"] == "polyprof-cuda"
    assert cuda["status"] == "unavailable"
    assert "no NVIDIA driver" in json.dumps(cuda)


def test_profile_with_cuda_warns_and_profiles_cpu_only():
    with pytest.warns(ActivityUnavailableWarning, match="no NVIDIA driver"):
        with polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _workload()
    averages = prof.key_averages()
    assert "aten::mm" in {e.key for e in averages}
    assert all(e.device_time_total == 0 for e in averages)
    table = averages.table(sort_by="cpu_time_total", row_limit=5)
    assert "Self CPU" in table and "CUDA" not in table
    kinds = {EventKind(k) for k in prof.trace.events["kind"].tolist()}
    assert EventKind.CPU_OP in kinds and not kinds & {EventKind.KERNEL, EventKind.RUNTIME}


def test_legacy_profile_use_cuda_warns_and_profiles_cpu_only():
    from polyprof import legacy

    with pytest.warns(ActivityUnavailableWarning, match="no NVIDIA driver"):
        with legacy.profile(use_cuda=True) as prof:
            _workload()
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    assert "CUDA" not in prof.key_averages().table(row_limit=3)


def test_cuda_only_request_is_a_clear_error_not_a_crash():
    from polyprof.errors import ActivityUnavailableError

    with pytest.raises(ActivityUnavailableError, match="CUDA"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with polyprof.profile(activities=[ProfilerActivity.CUDA]):
            _workload()


def test_tracer_started_anyway_warns_and_records_nothing():
    tracer = CuptiTracer(None, CuptiApi())
    with pytest.warns(CudaTracingUnavailableWarning, match="no NVIDIA driver"):
        tracer.start()
    tracer.stop()
    assert tracer.outbox.closed and tracer.outbox.empty()
    assert any("no NVIDIA driver" in n for n in tracer.trace_metadata()["notes"])


# ------------------------------------------------- classification (cupti.md §2.3)


class NotSupportedError(RuntimeError):
    """Same name and base as cupti._internal.utils.NotSupportedError (a private class)."""


class FakeApi(CuptiApi):
    def __init__(self, *, module_error=None, timestamp_error=None, devices=1, driver=True):
        super().__init__()
        self.module_error, self.timestamp_error, self.devices = module_error, timestamp_error, devices
        self.driver = driver
        self.imported = False

    def binding_installed(self):
        return self.module_error is None

    def driver_present(self):
        return self.driver

    @property
    def module(self):
        self.imported = True
        if self.module_error is not None:
            raise self.module_error
        return super().module

    def get_timestamp(self):
        if self.timestamp_error is not None:
            raise self.timestamp_error
        return 1

    def device_count(self):
        return self.devices


@pytest.mark.parametrize(
    ("api", "expected"),
    [
        (
            FakeApi(module_error=ModuleNotFoundError("No module named 'cupti'")),
            "cupti-python is not installed",
        ),
        (
            FakeApi(timestamp_error=NotSupportedError("CUDA driver is not found (libcuda.so.1: ...)")),
            "no NVIDIA driver",
        ),
        (
            FakeApi(timestamp_error=NotSupportedError("only CUDA 13.0 or later driver is supported")),
            "driver is too old",
        ),
        (
            FakeApi(timestamp_error=RuntimeError("Failed to dlopen libcupti (libcupti.so.12: cannot open)")),
            "libcupti not found",
        ),
        (FakeApi(devices=0), "no CUDA device visible"),
        (FakeApi(driver=False), "no NVIDIA driver (libcuda.so.1 not found)"),
        (FakeApi(driver=False, module_error=ModuleNotFoundError("cupti")), "cupti-python is not installed"),
        (FakeApi(), None),
    ],
)
def test_probe_reasons(api, expected):
    reason = probe.unavailable_reason(api)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


def test_probe_without_a_driver_never_imports_cupti_python():
    api = FakeApi(driver=False)
    assert probe.unavailable_reason(api) == "no NVIDIA driver (libcuda.so.1 not found)"
    assert not api.imported


def test_real_probe_without_a_driver_answers_without_importing_cupti_python():
    """In a fresh interpreter: the plugin's status says why, and cupti-python stays unimported."""
    code = (
        "import json, sys\n"
        "from polyprof_cuda import plugin\n"
        "reason = plugin.polyprof_capabilities().unavailable_reason\n"
        "print(json.dumps([reason, sorted(m for m in sys.modules if m == 'cupti' or m.startswith(('cupti.', 'cuda.')))]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    reason, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert reason == "no NVIDIA driver (libcuda.so.1 not found)"
    assert imported == []


def test_driver_present_is_a_plain_dlopen():
    assert CuptiApi().driver_present() is False  # this module only runs where there is no driver
    assert CuptiApi().binding_installed() is True


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ("ERROR_NOT_INITIALIZED", "driver older than"),
        ("ERROR_INSUFFICIENT_PRIVILEGES", "permission"),
        ("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED", "another CUPTI client"),
        ("ERROR_UNKNOWN", "ERROR_UNKNOWN"),
    ],
)
def test_cupti_errors_are_classified_by_result(result, expected):
    from cupti import cupti as C

    failure = classify_exception(C.cuptiError(int(getattr(C.Result, result))))
    assert failure.code == result and expected in failure.reason


def test_plugin_reports_unavailable_and_makes_no_tracer_without_cupti(monkeypatch):
    from polyprof.config import ProfileConfig
    from polyprof_cuda import plugin

    monkeypatch.setattr(probe, "unavailable_reason", lambda api=None: "cupti-python is not installed")
    caps = plugin.polyprof_capabilities()
    assert caps.activities == frozenset({ProfilerActivity.CUDA})
    assert caps.unavailable_reason == "cupti-python is not installed"
    assert plugin.polyprof_make_tracers(ProfileConfig(activities=frozenset({ProfilerActivity.CUDA}))) == []
