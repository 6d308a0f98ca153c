"""XPU rows from torch's own collector result (polyprof_xpu.kineto): mode, hooks, decoding.

No Intel GPU exists here: an XPU build of torch is stood in for by its build record
(``torch_support.installed_build``) and ``torch.xpu.is_available``; torch's CPU build accepts
``ProfilerActivity.XPU`` in its collector and records no device rows, so the session path is
real, and the decoding is fed ``_KinetoEvent`` stand-ins shaped like torch's.
"""

from __future__ import annotations

from typing import Any

import pytest
from polyprof import torch_support
from polyprof.activity import ProfilerActivity
from polyprof.config import ProfileConfig
from polyprof.events import DeviceType, EventKind
from polyprof.torch_result import CollectorResult

torch = pytest.importorskip("torch")
from polyprof_xpu import kineto
from polyprof_xpu import plugin as xpu_plugin

XPU_BUILD = torch_support.TorchBuild("2.15.0+xpu", xpu="20250301")


@pytest.fixture
def xpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_support, "installed_build", lambda: XPU_BUILD)
    monkeypatch.delenv("IPEX_ZE_TRACING", raising=False)


def test_an_xpu_build_of_torch_means_kineto_mode() -> None:
    assert kineto.choose_mode(XPU_BUILD) == kineto.XpuMode(
        "kineto", "via torch's Kineto (torch 2.15.0+xpu, XPU 20250301)"
    )
    cpu = torch_support.TorchBuild("2.13.0+cpu")
    assert kineto.choose_mode(cpu) == kineto.XpuMode("direct", "direct PTI (torch 2.13.0+cpu is not an XPU build)")


def test_in_kineto_mode_pti_is_never_probed(xpu_build: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe() -> dict:
        raise AssertionError("PTI must not be probed where torch's Kineto owns it")

    monkeypatch.setattr(xpu_plugin.probe, "run_in_child", no_probe)
    monkeypatch.setattr(kineto, "device_reason", lambda: None)
    caps = xpu_plugin.polyprof_capabilities()
    assert caps.unavailable_reason is None
    assert caps.mode == "via torch's Kineto (torch 2.15.0+xpu, XPU 20250301)"


def test_the_session_asks_torchs_collector_for_xpu() -> None:
    """In its own process: asking torch's CPU build for XPU leaves Kineto device state behind."""
    from pathlib import Path

    from polyprof.testing import run_pytest_in_child

    path = Path(__file__).resolve().parents[1] / "in_child" / "xpu_sessions.py"
    assert "1 passed" in run_pytest_in_child(str(path))


def test_without_a_device_xpu_is_unavailable_as_torch_says(xpu_build: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kineto, "device_reason", lambda: "torch 2.15.0+xpu sees no XPU device")
    caps = xpu_plugin.polyprof_capabilities()
    assert caps.unavailable_reason == "torch 2.15.0+xpu sees no XPU device"
    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.XPU})
    assert xpu_plugin.polyprof_torch_collector_activities(config) is None
    assert xpu_plugin.polyprof_make_tracers(config) == []


class _Event:
    """A ``_KinetoEvent`` stand-in (2.15's accessors the decoding reads)."""

    def __init__(self, name: str, activity_type: str, on_device: bool, start: int, corr: int, linked: int) -> None:
        from torch._C._autograd import DeviceType as TorchDeviceType

        self._name, self._type, self._start, self._corr, self._linked = name, activity_type, start, corr, linked
        self._device = TorchDeviceType.XPU if on_device else TorchDeviceType.CPU

    def name(self) -> str:
        return self._name

    def activity_type(self) -> str:
        return self._type

    def device_type(self) -> Any:
        return self._device

    def device_index(self) -> int:
        return 0

    def device_resource_id(self) -> int:
        return 3 if int(self._device) else 555

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._start + 1000

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        return self._linked

    def external_id(self) -> int:
        return self._linked

    def start_thread_id(self) -> int:
        return 1

    def is_async(self) -> bool:
        return False

    def is_user_annotation(self) -> bool:
        return False


class _Raw:
    def __init__(self, events: list[_Event]) -> None:
        self._events = events

    def events(self) -> list[_Event]:
        return self._events


def test_xpu_rows_torch_tags_cuda_are_still_xpu_rows() -> None:
    """Releases before Kineto's XPU branch of deviceTypeFromActivity tag XPU kernels CUDA."""
    from torch._C._autograd import DeviceType as TorchDeviceType

    kernel = _Event("gemm_kernel", "kernel", True, 400, 11, 1)
    kernel._device = TorchDeviceType.CUDA
    batch = kineto.decode_xpu_rows(CollectorResult(_Raw([kernel])), pid=77)
    assert batch.values("name") == ["gemm_kernel"]
    assert batch["device_type"].tolist() == [int(DeviceType.XPU)]


def test_the_xpu_rows_of_a_result_and_not_another_devices_kernels() -> None:
    events = [
        _Event("aten::mm", "cpu_op", False, 0, 1, 0),
        _Event("urEnqueueKernelLaunch", "xpu_runtime", False, 100, 11, 1),
        _Event("zeCommandListAppendLaunchKernel", "xpu_driver", False, 150, 12, 1),
        _Event("gemm_kernel", "kernel", True, 400, 11, 1),
        _Event("host_kernel", "kernel", False, 500, 13, 1),  # a CPU-tagged "kernel": no XPU row
        _Event("cudaLaunchKernel", "cuda_runtime", False, 600, 13, 1),
    ]
    batch = kineto.decode_xpu_rows(CollectorResult(_Raw(events)), pid=77)
    got = dict(zip(batch.values("name"), batch["kind"].tolist(), strict=True))
    assert got == {
        "urEnqueueKernelLaunch": EventKind.RUNTIME,
        "zeCommandListAppendLaunchKernel": EventKind.DRIVER,
        "gemm_kernel": EventKind.KERNEL,
    }
    kernel = batch.values("name").index("gemm_kernel")
    assert batch["device_type"][kernel] == DeviceType.XPU
    assert (batch["pid"][kernel], batch["tid"][kernel]) == (0, 3)
    runtime = batch.values("name").index("urEnqueueKernelLaunch")
    assert (batch["pid"][runtime], batch["tid"][runtime]) == (77, 555)
    assert batch["linked_correlation_id"].tolist() == [1, 1, 1]
