"""Sessions in polyprof-xpu's Kineto mode, run in their own process by
plugins_xpu/tests/test_xpu_kineto_mode.py (torch's CPU build keeps Kineto device state once asked
for XPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import polyprof
from polyprof.base.activity import ProfilerActivity
from polyprof.testing import make_plugin_manager_for_tests
from polyprof_xpu import kineto
from polyprof_xpu import plugin as xpu_plugin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_xpu_kineto_mode import xpu_build  # noqa: F401 - the fixture, shared

pytestmark = pytest.mark.usefixtures("xpu_build")


@pytest.fixture(autouse=True)
def a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kineto, "device_reason", lambda: None)


def test_the_session_asks_torchs_collector_for_xpu() -> None:
    pm = make_plugin_manager_for_tests(("xpu", xpu_plugin), builtins=True)
    with polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.XPU], plugin_manager=pm) as prof:
        torch.ones(4).add(1)
    assert prof.trace.config.torch_activities == frozenset({"XPU"})
    assert "aten::add" in prof.trace.events.values("name")


def test_the_legacy_profiler_with_use_xpu_reads_xpu_rows_from_torchs_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[object] = []
    decode = kineto.KinetoXpuTracer.decode
    monkeypatch.setattr(
        kineto.KinetoXpuTracer, "decode", lambda self, item: decoded.append(item) or decode(self, item)
    )
    pm = make_plugin_manager_for_tests(("xpu", xpu_plugin), builtins=True)
    with polyprof.legacy.profile(use_xpu=True, plugin_manager=pm) as prof:
        torch.ones(4).add(1)
    assert prof.use_device == "xpu"
    assert len(decoded) == 1  # torch's result, shared with the XPU tracer
    assert "aten::add" in {e.key for e in prof.key_averages()}
