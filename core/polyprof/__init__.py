"""polyprof: a plugin-based profiler for PyTorch workloads.

``polyprof.profile`` takes torch.profiler.profile's arguments and gives its
results (tables, Chrome traces) from columnar post-processing; tracers,
aggregators and exporters are plugins found through the ``polyprof``
entry-point group. ``import polyprof`` does not import torch.
"""

# itt: torch.profiler.itt's API; legacy: polyprof.legacy.profile, the IPEX legacy API.
from polyprof import _compat, itt, legacy
from polyprof._version import __version__
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileArgumentError
from polyprof.base.errors import (
    ActivityUnavailableError,
    PluginLoadError,
    PluginUnavailable,
    PolyprofDeprecationWarning,
    PolyprofError,
    PolyprofWarning,
    ProfilerDisabledError,
)
from polyprof.base.user_warnings import ActivityUnavailableWarning, ProfilerStoppedOutsideWarning
from polyprof.frontends.itt import emit_itt
from polyprof.frontends.profiler import ProfilerNotStartedError, profile, tensorboard_trace_handler
from polyprof.frontends.record import record_function
from polyprof.frontends.schedule import InvalidScheduleError, ProfilerAction, schedule
from polyprof.hooks.hookspecs import hookimpl, hookspec
from polyprof.runtime.exporting import ExportTimeoutError
from polyprof.runtime.recording import RecordingInProgressError

# The old module paths (polyprof.tree, ...) resolve from here on, each with a deprecation warning.
_compat.install()


def __getattr__(name: str):
    import importlib

    # polyprof.shim needs torch; load it on first use so ``import polyprof`` stays torch-free.
    if name == "shim":
        return importlib.import_module("polyprof.shim")
    # ``polyprof.config.ProfileArgumentError`` and the like, after a bare ``import polyprof``: 0.2.0's
    # ``import polyprof`` loaded those modules, so the old attribute paths still resolve (and warn).
    if f"polyprof.{name}" in _compat.MOVED_MODULES:
        return importlib.import_module(f"polyprof.{name}")
    raise AttributeError(f"module 'polyprof' has no attribute {name!r}")


def supported_activities() -> set[ProfilerActivity]:
    """Activities that installed, usable plugins can record here (torch's function of the same name)."""
    from polyprof.base import torch_support
    from polyprof.hooks import activity_resolution
    from polyprof.hooks.registry import shared_plugin_manager

    torch_support.import_installed()  # as torch's own function does: the plugins ask torch itself
    pm = shared_plugin_manager()
    pm.refresh_capabilities()  # what each plugin can do now, as torch's function answers now
    return set(activity_resolution.supported_activities(pm.plugin_infos()))


__all__ = [
    "ActivityUnavailableError",
    "ActivityUnavailableWarning",
    "ExportTimeoutError",
    "InvalidScheduleError",
    "PluginLoadError",
    "PluginUnavailable",
    "PolyprofDeprecationWarning",
    "PolyprofError",
    "PolyprofWarning",
    "ProfileArgumentError",
    "ProfilerAction",
    "ProfilerActivity",
    "ProfilerDisabledError",
    "ProfilerNotStartedError",
    "ProfilerStoppedOutsideWarning",
    "RecordingInProgressError",
    "__version__",
    "emit_itt",
    "hookimpl",
    "hookspec",
    "itt",
    "legacy",
    "profile",
    "record_function",
    "schedule",
    "supported_activities",
    "tensorboard_trace_handler",
]
