"""The ``xpu`` entry point: Capabilities and the XPU tracer for polyprof's plugin manager.

Importing this module arranges the Level Zero tracing environment
(``polyprof_xpu.env``); whether XPU tracing can run is found out by
``polyprof_xpu.probe`` in a child process, once per process.
"""

from __future__ import annotations

from typing import Any

from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity
from polyprof.components import Capabilities, Tracer
from polyprof.config import ProfileConfig
from polyprof.hookspecs import hookimpl

from polyprof_xpu import env, probe

log = get_logger(__name__)

#: What the plugin found and did to the environment when it loaded.
TRACING_ENVIRONMENT = env.configure()


def availability() -> dict[str, Any]:
    """The probe's finding, or ``IPEX_ZE_TRACING``'s veto (read at each call, so it can change after import)."""
    disabled = env.ipex_disabled_reason()
    if disabled:
        return {"available": False, "code": "disabled", "reason": disabled}
    return probe.run_in_child()


@hookimpl
def polyprof_capabilities() -> Capabilities:
    finding = availability()
    return Capabilities(
        activities={ProfilerActivity.XPU},
        unavailable_reason=None if finding.get("available") else (finding.get("reason") or "unavailable"),
    )


@hookimpl
def polyprof_make_tracers(config: ProfileConfig) -> list[Tracer]:
    if ProfilerActivity.XPU not in config.activities:
        return []
    finding = availability()
    if not finding.get("available"):
        return []
    from polyprof_xpu.tracer import XpuTracer

    return [XpuTracer(config, finding)]
