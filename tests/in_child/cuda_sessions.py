"""A session in polyprof-cuda's Kineto mode, run in its own process by
tests/cuda/test_cuda_kineto_mode.py (torch's CPU build keeps Kineto device state once asked
for CUDA)."""

from __future__ import annotations

import pytest
from polyprof.activity import ProfilerActivity
from polyprof_cuda import kineto, mode


@pytest.fixture
def cuda_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA build of torch with a device, as the plugin sees it (no GPU here)."""
    from polyprof import torch_support

    mode.forget_cached_mode()
    build = torch_support.TorchBuild("2.11.0+cu130", cuda="13.0")
    monkeypatch.setattr(torch_support, "installed_build", lambda: build)
    monkeypatch.setattr(kineto, "kineto_mode_reason", lambda: None)

    def no_cupti() -> str | None:
        raise AssertionError("CUPTI must not be probed where torch's Kineto owns it")

    from polyprof_cuda import probe

    monkeypatch.setattr(probe, "unavailable_reason", no_cupti)


def test_a_session_in_kineto_mode_asks_torchs_collector_for_cuda(cuda_build: None) -> None:
    import polyprof
    import torch
    from polyprof.testing import make_plugin_manager_for_tests
    from polyprof_cuda import plugin

    pm = make_plugin_manager_for_tests(("cuda", plugin), builtins=True)
    with polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], plugin_manager=pm) as prof:
        torch.ones(4).add(1)
    assert prof.trace.config.torch_activities == frozenset({"CUDA"})
    assert "aten::add" in prof.trace.events.values("name")
