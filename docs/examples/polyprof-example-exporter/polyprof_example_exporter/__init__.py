"""polyprof-example-exporter: a third-party polyprof plugin adding a "csv" exporter.

This module is the plugin: the entry point in pyproject.toml names it, and
polyprof registers it with pluggy, which finds the functions marked
``@hookimpl`` below (``polyprof.plugin``, the namespace every name a
plugin uses comes from). Hooks only build components; the work happens
in ``CsvExporter.export``.

Once installed, the profiler finds it by name::

    with polyprof.profile() as prof:
        model(inputs)
    prof.export("ops.csv", format="csv")

or, given any finished ``polyprof.plugin.Trace``::

    from polyprof.hooks.registry import make_plugin_manager

    with make_plugin_manager() as pm:
        pm.make_exporter(trace.config, "csv").export(trace, "ops.csv")

Settings may come from the session's ``ProfileConfig.options``:
``csv.columns`` (a comma string, a list, or "all") and ``csv.time_origin``
("trace" or "epoch").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polyprof.plugin import Capabilities, hookimpl

from polyprof_example_exporter.csv_exporter import COLUMNS, DEFAULT_COLUMNS, CsvExporter

if TYPE_CHECKING:
    from polyprof.plugin import ProfileConfig

__version__ = "0.1.0"

#: The name users pass to pick this exporter.
EXPORTER_NAME = "csv"


@hookimpl
def polyprof_capabilities() -> Capabilities:
    """Declare the exporter, so `polyprof plugins` lists it and errors can name it."""
    return Capabilities(exporters=(EXPORTER_NAME,))


@hookimpl
def polyprof_make_exporter(config: ProfileConfig | None, name: str) -> CsvExporter | None:
    """Build the exporter when asked for ours; None lets other plugins answer."""
    if name != EXPORTER_NAME:
        return None
    options: Any = getattr(config, "options", None) or {}
    return CsvExporter(
        columns=options.get("csv.columns"),
        time_origin=options.get("csv.time_origin", "trace"),
    )


__all__ = ["COLUMNS", "DEFAULT_COLUMNS", "EXPORTER_NAME", "CsvExporter", "__version__"]
