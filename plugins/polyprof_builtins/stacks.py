"""The built-in ``stacks`` exporter: an adapter over ``polyprof.plugin.collapsed_stack_lines``.

Writes torch's collapsed-stack text (``export_stacks``) for a finished trace:
see ``polyprof.analysis.collapsed_stacks`` (its home) for the format and the metrics. Stacks need
``with_stack=True`` and, as in torch, ``_ExperimentalConfig(verbose=True)``;
without them the file is empty. The file is written atomically; a path ending
in ``.gz`` is gzip-compressed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from polyprof.plugin import (
    Capabilities,
    Exporter,
    atomic_writer,
    collapsed_stack_lines,
    get_logger,
    hookimpl,
    metric_attribute,
    tree_for,
    use_device_for,
)

if TYPE_CHECKING:
    from polyprof.plugin import ProfileConfig, Trace

log = get_logger(__name__)

__all__ = ["NAME", "StacksExporter"]

NAME = "stacks"
_DERIVE: Any = object()


class StacksExporter(Exporter):
    """Writes torch's collapsed-stack text (``export_stacks``)."""

    name = NAME
    suffixes = (".stacks", ".txt")

    def export(
        self,
        trace: Trace,
        path: str,
        *,
        metric: str = "self_cpu_time_total",
        use_device: str | None = _DERIVE,
        **options: Any,
    ) -> str:
        """Write the trace's collapsed stacks to ``path``; returns the path.

        :param metric: one of ``polyprof.analysis.collapsed_stacks.SUPPORTED_METRICS``.
        :param use_device: torch's ``use_device`` for device metrics; by
            default derived from the trace's activities.
        :raises ValueError: unknown metric. :raises TypeError: unknown option.
        """
        if options:
            raise TypeError(
                f"unknown stacks export options {sorted(options)}; valid options: ['metric', 'use_device']"
            )
        metric_attribute(metric)  # fail before any work
        if use_device is _DERIVE:
            use_device = use_device_for(trace.config)
        lines = collapsed_stack_lines(tree_for(trace, use_device), metric)
        with atomic_writer(path) as f:
            f.write("".join(lines))
        written = os.fspath(path)
        log.debug("stacks_exported", path=written, lines=len(lines), metric=metric)
        return written


@hookimpl(trylast=True)
def polyprof_make_exporter(config: ProfileConfig, name: str) -> Exporter | None:
    return StacksExporter() if name == NAME else None


@hookimpl(trylast=True)
def polyprof_capabilities() -> Capabilities:
    return Capabilities(exporters=(NAME,))
