"""The old name of ``polyprof.log``, kept importable for plugins written against it.

Plugins import ``get_logger`` from ``polyprof.log`` (docs/plugin-author-guide.md,
"The plugin contract"); polyprof's own modules may still import it from here.
"""

from __future__ import annotations

from polyprof.log import get_logger

__all__ = ["get_logger"]
