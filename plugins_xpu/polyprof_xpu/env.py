"""The environment Level Zero tracing needs, arranged when the plugin loads.

torch's Kineto records XPU through Intel PTI, which traces Level Zero:

* ``ZE_ENABLE_TRACING_LAYER=1`` must be in the environment before Level Zero
  starts (``zeInit``) on older loaders and drivers, or PTI answers
  ``PTI_ERROR_TRACING_NOT_INITIALIZED`` (51) and torch cannot enable its XPU
  profiler. The plugin sets it when it loads, unless the user set it; when
  Level Zero is already running in the process it is too late, and the plugin
  warns.
* ``IPEX_ZE_TRACING`` (Intel Extension for PyTorch's switch): ``1`` behaves as
  in IPEX (``ZE_ENABLE_TRACING_LAYER`` is set to 1, even over a user's 0);
  ``0`` turns XPU tracing off (the plugin reports itself unavailable, CPU
  profiling goes on); unset is the default above; anything else is an error
  reported as the plugin's unavailable reason.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import attrs

from polyprof.plugin import get_logger

log = get_logger(__name__)

TRACING_LAYER_ENV = "ZE_ENABLE_TRACING_LAYER"
IPEX_TRACING_ENV = "IPEX_ZE_TRACING"


class TracingLayerTooLateWarning(UserWarning):
    """Level Zero started before polyprof-xpu could enable its tracing layer."""


@attrs.frozen
class TracingEnvironment:
    """What the plugin found and did when it loaded."""

    #: None when XPU tracing may run, else why not (IPEX_ZE_TRACING=0 or a bad value).
    disabled_reason: str | None
    #: The value of ZE_ENABLE_TRACING_LAYER after loading (None: unset).
    tracing_layer: str | None
    #: True when the plugin set ZE_ENABLE_TRACING_LAYER itself.
    set_by_plugin: bool
    #: True when Level Zero was already running, so the setting came too late.
    too_late: bool


def level_zero_started() -> bool:
    """True when Level Zero (or torch's XPU runtime) is already loaded in this process."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                if "libze_loader" in line or "libze_intel_gpu" in line:
                    return True
    except OSError:
        pass
    torch = sys.modules.get("torch")
    xpu = getattr(torch, "xpu", None) if torch is not None else None
    try:
        return bool(xpu is not None and xpu.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without XPU support
        return False


def ipex_disabled_reason(environ: Any = None) -> str | None:
    """Why ``IPEX_ZE_TRACING`` turns XPU tracing off (0 or a bad value), else None. No side effects."""
    env = os.environ if environ is None else environ
    ipex = env.get(IPEX_TRACING_ENV)
    if ipex is None or ipex.strip() in ("", "1"):
        return None
    if ipex.strip() == "0":
        return f"XPU tracing is turned off by {IPEX_TRACING_ENV}=0 in the environment"
    return f"{IPEX_TRACING_ENV}={ipex!r} is not valid; use 1 (trace XPU), 0 (do not) or leave it unset"


def configure(environ: Any = None) -> TracingEnvironment:
    """Apply the rules of the module docstring to ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    disabled = ipex_disabled_reason(env)
    if disabled:
        return TracingEnvironment(disabled, env.get(TRACING_LAYER_ENV), set_by_plugin=False, too_late=False)
    ipex = (env.get(IPEX_TRACING_ENV) or "").strip()
    current = env.get(TRACING_LAYER_ENV)
    # IPEX did setenv(ZE_ENABLE_TRACING_LAYER, "1", overwrite) when IPEX_ZE_TRACING=1.
    wanted = current is None or (ipex == "1" and current != "1")
    if not wanted:
        return TracingEnvironment(None, current, set_by_plugin=False, too_late=False)
    if level_zero_started():
        message = (
            "polyprof-xpu: Level Zero is already running in this process, so setting "
            f"{TRACING_LAYER_ENV}=1 now has no effect; with an older Level Zero loader or driver torch's "
            "XPU profiler then fails with PTI_ERROR_TRACING_NOT_INITIALIZED (51). Set "
            f"{TRACING_LAYER_ENV}=1 in the environment before starting "
            "Python, or import polyprof before using the XPU."
        )
        log.warning("tracing_layer_too_late", env=TRACING_LAYER_ENV)
        warnings.warn(message, TracingLayerTooLateWarning, stacklevel=2)
        env[TRACING_LAYER_ENV] = "1"  # still right for child processes
        return TracingEnvironment(None, "1", set_by_plugin=True, too_late=True)
    env[TRACING_LAYER_ENV] = "1"
    log.debug("tracing_layer_enabled", env=TRACING_LAYER_ENV)
    return TracingEnvironment(None, "1", set_by_plugin=True, too_late=False)
