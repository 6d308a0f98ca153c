"""The ``cuda`` plugin: registered through the ``polyprof`` entry-point group.

``polyprof plugins`` lists it with its status; when CUPTI cannot run here
(no cupti-python, no driver, a driver too old, no libcupti, no device) the
status says why, and asking for ``ProfilerActivity.CUDA`` warns and profiles
CPU only. With ``POLYPROF_CUDA_NVML_INTERVAL_MS`` set, CUDA sessions also get
the NVML sampler's GPU counters (``polyprof_cuda.nvml``).
"""

from __future__ import annotations

from polyprof.activity import ProfilerActivity
from polyprof.components import Capabilities, Tracer
from polyprof.config import ProfileConfig
from polyprof.hookspecs import hookimpl

from polyprof_cuda import nvml, probe
from polyprof_cuda.tracer import CuptiTracer


@hookimpl
def polyprof_capabilities() -> Capabilities:
    return Capabilities(activities={ProfilerActivity.CUDA}, unavailable_reason=probe.unavailable_reason())


@hookimpl
def polyprof_make_tracers(config: ProfileConfig) -> list[Tracer]:
    if ProfilerActivity.CUDA not in config.activities or probe.unavailable_reason() is not None:
        return []
    tracers: list[Tracer] = [CuptiTracer(config)]
    # GPU counters only on request (POLYPROF_CUDA_NVML_INTERVAL_MS), beside the device activity.
    sampler = nvml.sampler_from_environment()
    if sampler is not None:
        tracers.append(sampler)
    return tracers
