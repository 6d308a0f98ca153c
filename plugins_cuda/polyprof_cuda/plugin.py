"""The ``cuda`` plugin: registered through the ``polyprof`` entry-point group.

With a CUDA build of torch, ``ProfilerActivity.CUDA`` comes from torch's own collector result
(``polyprof_cuda.kineto``): torch's Kineto owns CUPTI and polyprof never calls it. Otherwise CUDA
is unavailable (``polyprof_cuda.mode``): ``polyprof plugins`` shows why, and asking for it warns
and profiles the rest. With ``POLYPROF_CUDA_NVML_INTERVAL_MS`` set, CUDA sessions also get the
NVML sampler's GPU counters (``polyprof_cuda.nvml``).
"""

from __future__ import annotations

import sys

from polyprof.plugin import Capabilities, ProfileConfig, ProfilerActivity, Tracer, hookimpl
from polyprof_cuda import kineto, mode, nvml


@hookimpl
def polyprof_capabilities() -> Capabilities:
    chosen = mode.current_mode()
    if chosen.kind is None:
        return Capabilities(activities={ProfilerActivity.CUDA}, unavailable_reason=chosen.detail)
    if "torch" not in sys.modules:
        # Listing plugins never imports torch (seconds): the driver's files and
        # CUDA_VISIBLE_DEVICES answer for now; a profile imports torch and asks it.
        provisional = "whether torch sees a GPU (torch.cuda.is_available())"
        reason = mode.driver_reason()
        if reason is not None:
            return Capabilities(
                activities={ProfilerActivity.CUDA}, unavailable_reason=reason, provisional=provisional
            )
        return Capabilities(activities={ProfilerActivity.CUDA}, mode=chosen.detail, provisional=provisional)
    # torch is loaded (so is its CUDA runtime): ask it whether it can record CUDA, as
    # torch.profiler.supported_activities() does, so default activities match torch's
    reason = kineto.kineto_mode_reason()
    if reason is not None:
        return Capabilities(activities={ProfilerActivity.CUDA}, unavailable_reason=reason)
    return Capabilities(activities={ProfilerActivity.CUDA}, mode=chosen.detail)


@hookimpl
def polyprof_torch_collector_activities(config: ProfileConfig) -> list[str] | None:
    if ProfilerActivity.CUDA not in config.activities or mode.current_mode().kind is None:
        return None
    # torch.profiler asks torch.cuda.is_available() the same way before recording CUDA
    return ["CUDA"] if kineto.kineto_mode_reason() is None else None


@hookimpl
def polyprof_make_tracers(config: ProfileConfig) -> list[Tracer]:
    if ProfilerActivity.CUDA not in config.activities or mode.current_mode().kind is None:
        return []
    if kineto.kineto_mode_reason() is not None:  # capabilities said so already
        return []
    tracers: list[Tracer] = [kineto.KinetoCudaTracer()]
    # GPU counters only on request (POLYPROF_CUDA_NVML_INTERVAL_MS), beside the device activity.
    sampler = nvml.sampler_from_environment()
    if sampler is not None:
        tracers.append(sampler)
    return tracers
