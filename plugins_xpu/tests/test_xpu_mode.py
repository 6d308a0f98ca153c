"""Which torch lets polyprof-xpu record XPU: only an XPU build, through its Kineto (polyprof_xpu.mode).

torch's build is faked (``torch_support.installed_build``), so these rules are
checked whatever torch is installed here.
"""

from __future__ import annotations

import pytest

from polyprof.base import torch_support
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.torch_support import TorchBuild
from polyprof_xpu import kineto, mode
from polyprof_xpu import plugin as xpu_plugin

XPU_BUILD = TorchBuild("2.15.0+xpu", xpu="20250301")
CPU_BUILD = TorchBuild("2.13.0+cpu")
CPU_REASON = (
    "torch 2.13.0+cpu is not an XPU build: torch's Kineto cannot record XPU here; install an XPU build "
    "of torch (polyprof-xpu records XPU only through it, see docs/xpu.md)"
)
NO_TORCH_REASON = (
    "torch is not installed: install an XPU build of torch (polyprof-xpu records XPU only through it, "
    "see docs/xpu.md)"
)
XPU_AND_CPU = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.XPU})


def test_an_xpu_build_of_torch_means_kineto_mode() -> None:
    assert mode.choose_mode(XPU_BUILD) == mode.XpuMode(
        mode.KINETO, "via torch's Kineto (torch 2.15.0+xpu, XPU 20250301)"
    )


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (CPU_BUILD, CPU_REASON),
        (None, NO_TORCH_REASON),
        (TorchBuild("2.13.0+cu130", cuda="13.0"), CPU_REASON.replace("2.13.0+cpu", "2.13.0+cu130")),
        (TorchBuild("2.13.0+rocm7.0", hip="7.0"), CPU_REASON.replace("2.13.0+cpu", "2.13.0+rocm7.0")),
    ],
)
def test_any_other_torch_means_xpu_is_unavailable_with_the_fix(build: TorchBuild | None, reason: str) -> None:
    assert mode.choose_mode(build) == mode.XpuMode(None, reason)


@pytest.fixture
def torch_never_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_device_check() -> str | None:
        raise AssertionError("without an XPU build of torch there is no device to ask torch about")

    monkeypatch.setattr(kineto, "device_reason", no_device_check)


@pytest.mark.parametrize(("build", "reason"), [(CPU_BUILD, CPU_REASON), (None, NO_TORCH_REASON)])
def test_without_an_xpu_build_the_plugin_is_unavailable_and_records_nothing(
    build: TorchBuild | None, reason: str, torch_never_asked: None, xpu_env: pytest.MonkeyPatch
) -> None:
    xpu_env.setattr(torch_support, "installed_build", lambda: build)
    caps = xpu_plugin.polyprof_capabilities()
    assert caps.unavailable_reason == reason and caps.mode is None
    assert caps.activities == {ProfilerActivity.XPU}
    assert xpu_plugin.polyprof_torch_collector_activities(XPU_AND_CPU) is None
    assert xpu_plugin.polyprof_make_tracers(XPU_AND_CPU) == []


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("0", "XPU tracing is turned off by IPEX_ZE_TRACING=0 in the environment"),
        ("yes", "IPEX_ZE_TRACING='yes' is not valid; use 1 (trace XPU), 0 (do not) or leave it unset"),
    ],
)
def test_ipex_ze_tracing_turns_an_xpu_build_off(
    value: str, reason: str, torch_never_asked: None, xpu_env: pytest.MonkeyPatch
) -> None:
    xpu_env.setattr(torch_support, "installed_build", lambda: XPU_BUILD)
    xpu_env.setenv("IPEX_ZE_TRACING", value)
    assert xpu_plugin.polyprof_capabilities().unavailable_reason == reason
    assert xpu_plugin.polyprof_torch_collector_activities(XPU_AND_CPU) is None
    assert xpu_plugin.polyprof_make_tracers(XPU_AND_CPU) == []


def test_the_build_is_the_reason_given_before_ipex_ze_tracing(
    torch_never_asked: None, xpu_env: pytest.MonkeyPatch
) -> None:
    """IPEX_ZE_TRACING=1 cannot make a CPU build record XPU: the reason names what to fix."""
    xpu_env.setattr(torch_support, "installed_build", lambda: CPU_BUILD)
    xpu_env.setenv("IPEX_ZE_TRACING", "0")
    assert xpu_plugin.polyprof_capabilities().unavailable_reason == CPU_REASON


def test_listing_plugins_never_imports_torch(run_python) -> None:
    proc = run_python(
        "import sys; import polyprof_xpu.plugin as p; caps = p.polyprof_capabilities();"
        "print('torch' in sys.modules, caps.unavailable_reason is not None or caps.mode is not None)",
        {},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]


def test_an_xpu_build_without_torch_loaded_is_a_provisional_answer(
    torch_never_asked: None, xpu_env: pytest.MonkeyPatch
) -> None:
    """``polyprof plugins`` never imports torch: whether it sees an XPU waits for a profile."""
    import sys

    xpu_env.setattr(torch_support, "installed_build", lambda: XPU_BUILD)
    xpu_env.delitem(sys.modules, "torch", raising=False)
    caps = xpu_plugin.polyprof_capabilities()
    assert caps.unavailable_reason is None and caps.mode is not None
    assert caps.provisional == "whether torch sees an XPU (torch.xpu.is_available())"
    xpu_env.setattr(torch_support, "installed_build", lambda: CPU_BUILD)
    caps = xpu_plugin.polyprof_capabilities()
    assert (caps.unavailable_reason, caps.provisional) == (CPU_REASON, None)  # the build decides: final
