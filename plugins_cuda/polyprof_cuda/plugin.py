"""The ``cuda`` plugin: registered through the ``polyprof`` entry-point group.

One owner of CUPTI per process (``polyprof_cuda.mode``): with a CUDA build of
torch, torch's Kineto owns CUPTI, so ``ProfilerActivity.CUDA`` comes from
torch's own collector result (``polyprof_cuda.kineto``) and polyprof never
calls CUPTI; otherwise polyprof's own CUPTI tracer, where CUPTI can run.
``polyprof plugins`` shows the mode, or why CUDA is unavailable (asking for it
then warns and profiles CPU only). With ``POLYPROF_CUDA_NVML_INTERVAL_MS`` set,
CUDA sessions also get the NVML sampler's GPU counters (``polyprof_cuda.nvml``).
"""

from __future__ import annotations

import sys

from polyprof.activity import ProfilerActivity
from polyprof.components import Capabilities, Tracer
from polyprof.config import ProfileConfig
from polyprof.hookspecs import hookimpl

from polyprof_cuda import kineto, mode, nvml
from polyprof_cuda.tracer import CuptiTracer


@hookimpl
def polyprof_capabilities() -> Capabilities:
    chosen = mode.current_mode()
    if chosen.kind is None:
        return Capabilities(activities={ProfilerActivity.CUDA}, unavailable_reason=chosen.detail)
    if chosen.kind == mode.KINETO and "torch" in sys.modules:
        # torch is loaded (so is its CUDA runtime): ask it whether it can record CUDA, as
        # torch.profiler.supported_activities() does, so default activities match torch's
        reason = kineto.kineto_mode_reason()
        if reason is not None:
            return Capabilities(activities={ProfilerActivity.CUDA}, unavailable_reason=reason)
    return Capabilities(activities={ProfilerActivity.CUDA}, mode=chosen.detail)


@hookimpl
def polyprof_torch_collector_activities(config: ProfileConfig) -> list[str] | None:
    if ProfilerActivity.CUDA not in config.activities or mode.current_mode().kind != mode.KINETO:
        return None
    # torch.profiler asks torch.cuda.is_available() the same way before recording CUDA
    return ["CUDA"] if kineto.kineto_mode_reason() is None else None


@hookimpl
def polyprof_make_tracers(config: ProfileConfig) -> list[Tracer]:
    if ProfilerActivity.CUDA not in config.activities:
        return []
    chosen = mode.current_mode()
    if chosen.kind is None:
        return []
    tracers: list[Tracer]
    if chosen.kind == mode.KINETO:
        if kineto.kineto_mode_reason() is not None:  # capabilities said so already
            return []
        tracers = [kineto.KinetoCudaTracer()]
    else:
        tracers = [CuptiTracer(config)]
    # GPU counters only on request (POLYPROF_CUDA_NVML_INTERVAL_MS), beside the device activity.
    sampler = nvml.sampler_from_environment()
    if sampler is not None:
        tracers.append(sampler)
    return tracers
