"""structlog as a library: never configured here, never printing to stdout.

Every module does ``log = get_logger(__name__)``. Unless the application
configured structlog itself, events go through the stdlib ``logging`` logger of
the same name, so a program that never set up logging sees nothing on its
stdout (only warnings and errors reach stderr via logging's last resort).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog


def get_logger(name: str, **initial_values: Any) -> Any:
    """A structlog logger bound to the stdlib logger ``name``."""
    if structlog.is_configured():
        return structlog.get_logger(name, **initial_values)
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=True),
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        **initial_values,
    )
