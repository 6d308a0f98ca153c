"""What the registry knows about each plugin: its status, why, and what it provides.

One ``PluginInfo`` per plugin seen, whatever became of it: ``loaded``,
``failed`` (import, registration or ``polyprof_capabilities`` raised; the
traceback is kept), ``unavailable`` (it said it cannot run here) or
``blocked`` (autoload, the allow-list, or an entry-point name conflict).
``polyprof plugins`` prints them; activity resolution reads them.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import attrs

from polyprof.hooks.components import Capabilities

__all__ = ["PLUGIN_STATUSES", "PluginInfo", "PluginStatus"]

PluginStatus = Literal["loaded", "failed", "unavailable", "blocked"]
PLUGIN_STATUSES: Final[tuple[str, ...]] = ("loaded", "failed", "unavailable", "blocked")


@attrs.frozen
class PluginInfo:
    """What the registry knows about one plugin; shown by ``polyprof plugins``."""

    #: Entry-point name (or the name an in-code plugin was registered under).
    name: str
    #: The module (entry-point value) or class that implements the plugin.
    module: str
    #: Distribution that installed it; None for plugins registered in code.
    distribution: str | None
    version: str | None
    #: One of ``PLUGIN_STATUSES``.
    status: PluginStatus = attrs.field(validator=attrs.validators.in_(PLUGIN_STATUSES))
    #: Why it is not loaded (None when loaded).
    reason: str | None = None
    #: Formatted traceback of the failure, when one was caught.
    traceback: str | None = None
    #: What it provides; None when it never got far enough to say.
    capabilities: Capabilities | None = None
    #: Hook names it implements (empty unless it was registered).
    hooks: tuple[str, ...] = ()
    #: Part of the ``polyprof`` distribution itself (always loaded).
    builtin: bool = False
    #: Other distributions that declare the same entry-point name (a conflict: it fails closed).
    conflicts_with: tuple[str, ...] = ()

    @property
    def loaded(self) -> bool:
        return self.status == "loaded"

    @property
    def display_status(self) -> str:
        """``loaded`` (with the plugin's mode, if it says one), or the status and its reason on one line."""
        provisional = " (provisional)" if self.provisional else ""
        if self.status == "loaded":
            mode = self.capabilities.mode if self.capabilities is not None else None
            return (f"loaded, {mode}" if mode else "loaded") + provisional
        if not self.reason:
            return self.status + provisional
        return f"{self.status}{provisional}: {' '.join(self.reason.split())}"

    @property
    def provisional(self) -> str | None:
        """What would confirm the status, when the plugin answered without asking torch."""
        return self.capabilities.provisional if self.capabilities is not None else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``polyprof plugins --json``)."""
        caps = self.capabilities
        return {
            "name": self.name,
            "module": self.module,
            "distribution": self.distribution,
            "version": self.version,
            "builtin": self.builtin,
            "status": self.status,
            "reason": self.reason,
            "display_status": self.display_status,
            "traceback": self.traceback,
            "capabilities": None
            if caps is None
            else {
                "activities": sorted(a.name for a in caps.activities),
                "exporters": list(caps.exporters),
                "aggregators": list(caps.aggregators),
                "unavailable_reason": caps.unavailable_reason,
                "mode": caps.mode,
                "provisional": caps.provisional,
            },
            "hooks": list(self.hooks),
            "conflicts_with": list(self.conflicts_with),
        }
