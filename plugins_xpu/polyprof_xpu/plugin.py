"""The ``xpu`` entry point: Capabilities and the XPU tracer for polyprof's plugin manager.

One owner of PTI per process (``polyprof_xpu.kineto``): with an XPU build of
torch, torch's Kineto owns PTI, so the XPU rows come from torch's collector
result and polyprof never calls PTI; otherwise polyprof's own PTI tracer,
where ``polyprof_xpu.probe`` (in a child process, once per process) finds it
can run. Importing this module arranges the Level Zero tracing environment
(``polyprof_xpu.env``), which both need.
"""

from __future__ import annotations

import sys
from typing import Any

from polyprof import torch_support
from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity
from polyprof.components import Capabilities, Tracer
from polyprof.config import ProfileConfig
from polyprof.hookspecs import hookimpl

from polyprof_xpu import env, kineto, probe

log = get_logger(__name__)

#: What the plugin found and did to the environment when it loaded.
TRACING_ENVIRONMENT = env.configure()


def availability() -> dict[str, Any]:
    """The probe's finding, or ``IPEX_ZE_TRACING``'s veto (read at each call, so it can change after import)."""
    disabled = env.ipex_disabled_reason()
    if disabled:
        return {"available": False, "code": "disabled", "reason": disabled}
    return probe.run_in_child()


def current_mode() -> kineto.XpuMode:
    return kineto.choose_mode(torch_support.installed_build())


@hookimpl
def polyprof_capabilities() -> Capabilities:
    disabled = env.ipex_disabled_reason()
    mode = current_mode()
    if mode.kind == "kineto" and not disabled:
        # torch's Kineto owns PTI here: never probe it. With torch loaded, ask it whether it can
        # record XPU, as torch.profiler.supported_activities() does.
        reason = kineto.device_reason() if "torch" in sys.modules else None
        if reason is not None:
            return Capabilities(activities={ProfilerActivity.XPU}, unavailable_reason=reason)
        return Capabilities(activities={ProfilerActivity.XPU}, mode=mode.detail)
    finding = availability()
    return Capabilities(
        activities={ProfilerActivity.XPU},
        unavailable_reason=None if finding.get("available") else (finding.get("reason") or "unavailable"),
        mode=mode.detail if finding.get("available") else None,
    )


@hookimpl
def polyprof_torch_collector_activities(config: ProfileConfig) -> list[str] | None:
    if ProfilerActivity.XPU not in config.activities or current_mode().kind != "kineto":
        return None
    return ["XPU"] if kineto.device_reason() is None else None


@hookimpl
def polyprof_make_tracers(config: ProfileConfig) -> list[Tracer]:
    if ProfilerActivity.XPU not in config.activities:
        return []
    if current_mode().kind == "kineto":
        if kineto.device_reason() is not None:  # capabilities said so already
            return []
        return [kineto.KinetoXpuTracer()]
    finding = availability()
    if not finding.get("available"):
        return []
    from polyprof_xpu.tracer import XpuTracer

    return [XpuTracer(config, finding)]
