"""With a CPU build of torch, CUDA is unavailable with a reason and everything else is profiled.

As torch.profiler on a CPU build: polyprof-cuda records CUDA only through torch's Kineto. The
build is faked (``torch_support.installed_build``), so these hold whatever torch is installed;
the sessions run torch's real CPU collector.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import pytest

from polyprof.base import torch_support
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import EventKind

torch = pytest.importorskip("torch")

import polyprof  # noqa: E402
from polyprof.base.user_warnings import ActivityUnavailableWarning  # noqa: E402
from polyprof.testing import make_plugin_manager_for_tests  # noqa: E402
from polyprof_cuda import kineto, plugin  # noqa: E402

CPU_BUILD = torch_support.TorchBuild("2.13.0+cpu")
REASON = "torch 2.13.0+cpu is not a CUDA build"


@pytest.fixture(autouse=True)
def cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_support, "installed_build", lambda: CPU_BUILD)

    def not_asked() -> str | None:
        raise AssertionError("torch's device check is for a CUDA build only")

    monkeypatch.setattr(kineto, "kineto_mode_reason", not_asked)


def _plugin_manager():
    return make_plugin_manager_for_tests(("cuda", plugin), builtins=True)


def _workload() -> None:
    a = torch.ones(16, 16)
    torch.mm(a, a).relu()


def test_the_plugin_is_unavailable_with_the_reason_and_makes_nothing() -> None:
    caps = plugin.polyprof_capabilities()
    assert caps.activities == frozenset({ProfilerActivity.CUDA})
    assert caps.unavailable_reason is not None and caps.unavailable_reason.startswith(REASON)
    assert "install a CUDA build of torch" in caps.unavailable_reason
    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA})
    assert plugin.polyprof_make_tracers(config) == []
    assert plugin.polyprof_torch_collector_activities(config) is None
    assert _plugin_manager().plugin_info("cuda").status == "unavailable"


def test_profile_with_cuda_warns_and_profiles_cpu_only() -> None:
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with (
        pytest.warns(ActivityUnavailableWarning, match=re.escape(REASON)),
        polyprof.profile(activities=activities, plugin_manager=_plugin_manager()) as prof,
    ):
        _workload()
    averages = prof.key_averages()
    assert "aten::mm" in {e.key for e in averages}
    assert all(e.device_time_total == 0 for e in averages)
    table = averages.table(sort_by="cpu_time_total", row_limit=5)
    assert "Self CPU" in table and "CUDA" not in table
    kinds = {EventKind(k) for k in prof.trace.events["kind"].tolist()}
    assert EventKind.CPU_OP in kinds and not kinds & {EventKind.KERNEL, EventKind.RUNTIME}
    assert prof.trace.config.torch_activities == frozenset()


def test_legacy_profile_use_cuda_warns_and_profiles_cpu_only() -> None:
    from polyprof.frontends import legacy

    with (
        pytest.warns(ActivityUnavailableWarning, match=re.escape(REASON)),
        legacy.profile(use_cuda=True, plugin_manager=_plugin_manager()) as prof,
    ):
        _workload()
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    assert "CUDA" not in prof.key_averages().table(row_limit=3)


def test_a_cuda_only_request_is_a_clear_error_not_a_crash() -> None:
    from polyprof.base.errors import ActivityUnavailableError

    with pytest.raises(ActivityUnavailableError, match="CUDA"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with polyprof.profile(activities=[ProfilerActivity.CUDA], plugin_manager=_plugin_manager()):
            _workload()


@pytest.mark.slow
@pytest.mark.skipif(torch.version.cuda is not None, reason="the installed torch is a CUDA build")
def test_polyprof_plugins_lists_cuda_as_unavailable_with_the_reason() -> None:
    """The real command, with the installed CPU build of torch (the fixture does not reach a child)."""
    out = subprocess.run(
        [sys.executable, "-m", "polyprof", "plugins", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    (cuda,) = [p for p in json.loads(out.stdout) if p["name"] == "cuda"]
    assert cuda["distribution"] == "polyprof-cuda" and cuda["status"] == "unavailable"
    assert f"torch {torch.__version__} is not a CUDA build" in json.dumps(cuda)
