"""The ``xpu`` entry point: Capabilities and the XPU tracer for polyprof's plugin manager.

XPU is recorded only through torch's Kineto (``polyprof_xpu.mode``): with an
XPU build of torch the XPU rows come from torch's collector result
(``polyprof_xpu.kineto``) and polyprof never calls Intel PTI; with any other
torch XPU is unavailable, with the reason. Importing this module arranges the
Level Zero tracing environment torch's PTI needs (``polyprof_xpu.env``).
"""

from __future__ import annotations

import sys

from polyprof.plugin import Capabilities, ProfileConfig, ProfilerActivity, Tracer, hookimpl, installed_build
from polyprof_xpu import env, kineto, mode

#: What the plugin found and did to the environment when it loaded.
TRACING_ENVIRONMENT = env.configure()


def current_mode() -> mode.XpuMode:
    return mode.choose_mode(installed_build())


def unavailable_reason(*, ask_torch: bool = True) -> str | None:
    """Why XPU cannot be recorded now, else None.

    In this order: torch's build; ``IPEX_ZE_TRACING`` (read at each call, so it
    can change after import); with ``ask_torch``, whether torch sees an XPU and
    its Kineto records it, as ``torch.profiler.supported_activities()`` asks.
    """
    chosen = current_mode()
    if chosen.kind is None:
        return chosen.detail
    disabled = env.ipex_disabled_reason()
    if disabled is not None:
        return disabled
    return kineto.device_reason() if ask_torch else None


@hookimpl
def polyprof_capabilities() -> Capabilities:
    # Ask torch about the device only when it is loaded: listing plugins never imports torch.
    ask_torch = "torch" in sys.modules
    reason = unavailable_reason(ask_torch=ask_torch)
    if reason is not None:  # the build, IPEX_ZE_TRACING, or torch's own answer: never provisional
        return Capabilities(activities={ProfilerActivity.XPU}, unavailable_reason=reason)
    # Without torch, an XPU build is a provisional answer: a profile imports torch and asks it.
    provisional = None if ask_torch else "whether torch sees an XPU (torch.xpu.is_available())"
    return Capabilities(
        activities={ProfilerActivity.XPU}, mode=current_mode().detail, provisional=provisional
    )


@hookimpl
def polyprof_torch_collector_activities(config: ProfileConfig) -> list[str] | None:
    if ProfilerActivity.XPU not in config.activities or unavailable_reason() is not None:
        return None
    return ["XPU"]


@hookimpl
def polyprof_make_tracers(config: ProfileConfig) -> list[Tracer]:
    if ProfilerActivity.XPU not in config.activities or unavailable_reason() is not None:
        return []  # capabilities said why
    return [kineto.KinetoXpuTracer()]
