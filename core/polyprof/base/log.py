"""polyprof's logging, for the core and for plugins: structlog as a library.

Never configured here, never printing to stdout. Every module, a plugin's
included, does ``log = get_logger(__name__)``. The logger decides at each
call where the event goes: when the application configured structlog (or a
test runs ``structlog.testing.capture_logs()``), through that configuration;
otherwise through the stdlib ``logging`` logger of the same name, so a program
that set up nothing sees nothing on its stdout (warnings and errors reach
stderr through logging's last resort).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

_STDLIB_PROCESSORS: list[Any] = [
    structlog.processors.add_log_level,
    structlog.processors.format_exc_info,
    structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=True),
]


def _stdout_safe_configured() -> bool:
    """True when structlog was configured with something other than its stdout default."""
    if not structlog.is_configured():
        return False
    factory = structlog.get_config().get("logger_factory")
    return not isinstance(factory, structlog.PrintLoggerFactory)


class Logger:
    """A structlog-style logger whose destination is chosen per call (made by ``get_logger``)."""

    __slots__ = ("_context", "_name")

    def __init__(self, name: str, context: dict[str, Any]) -> None:
        self._name = name
        self._context = context

    def _target(self) -> Any:
        if _stdout_safe_configured() or _capturing():
            return structlog.get_logger(self._name, **self._context)
        return structlog.wrap_logger(
            logging.getLogger(self._name),
            processors=_STDLIB_PROCESSORS,
            wrapper_class=structlog.stdlib.BoundLogger,
            **self._context,
        )

    def bind(self, **values: Any) -> Logger:
        """A logger that adds ``values`` to every event."""
        return Logger(self._name, {**self._context, **values})

    def debug(self, event: str, **kw: Any) -> None:
        if logging.getLogger(self._name).isEnabledFor(logging.DEBUG) or _capturing():
            self._target().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._target().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._target().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._target().error(event, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        kw.setdefault("exc_info", True)
        self._target().error(event, **kw)


def _capturing() -> bool:
    """True inside ``structlog.testing.capture_logs()``."""
    processors = structlog.get_config().get("processors", ())
    return any(isinstance(p, structlog.testing.LogCapture) for p in processors)


def get_logger(name: str, **initial_values: Any) -> Logger:
    """A logger for module ``name``; safe to create at import time.

    It has structlog's methods ``debug``, ``info``, ``warning``, ``error``,
    ``exception`` (each ``(event, **key_values)``) and ``bind(**key_values)``.
    """
    return Logger(name, dict(initial_values))


__all__ = ["Logger", "get_logger"]
