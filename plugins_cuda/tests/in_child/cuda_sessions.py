"""A session in polyprof-cuda's Kineto mode, run in its own process by
plugins_cuda/tests/test_cuda_kineto_mode.py (torch's CPU build keeps Kineto device state once asked
for CUDA)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polyprof.base.activity import ProfilerActivity

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_cuda_kineto_mode import cuda_build  # noqa: F401 - the fixture, shared

pytestmark = pytest.mark.usefixtures("cuda_build")


def test_a_session_in_kineto_mode_asks_torchs_collector_for_cuda() -> None:
    import torch

    import polyprof
    from polyprof.testing import make_plugin_manager_for_tests
    from polyprof_cuda import plugin

    pm = make_plugin_manager_for_tests(("cuda", plugin), builtins=True)
    with polyprof.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], plugin_manager=pm
    ) as prof:
        torch.ones(4).add(1)
    assert prof.trace.config.torch_activities == frozenset({"CUDA"})
    assert "aten::add" in prof.trace.events.values("name")
