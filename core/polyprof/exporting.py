"""Running an exporter plugin's ``export()`` with a deadline.

An exporter is third-party code that writes files, often to network storage;
one that hangs must not hang ``prof.export_chrome_trace()``, an
``on_trace_ready`` handler or ``polyprof run`` with it. ``export_trace`` runs
the write on a worker thread and waits for it up to a deadline:

* by default 300 s, plus 100 µs per event (about 30 times what the built-in
  Chrome exporter takes per event) and the recording's own duration (a paced
  replay, such as the ``itt`` exporter's ``pace=True``, takes that long);
* ``POLYPROF_EXPORT_TIMEOUT_S`` replaces it: a number of seconds > 0, or
  ``inf`` for no deadline. Any other value is a ``ValueError`` naming the
  variable.

Past the deadline it raises ``ExportTimeoutError``, naming the exporter, the
plugin that made it and the path. Python cannot stop a thread, so the write
is abandoned, not killed: its thread is a daemon, so the process can still
exit. No partial file is left at the destination: a file that appeared
there during the write (an exporter that writes in place) is removed, since
the exporter never finished it, and an exporter that writes atomically
(``polyprof.fileio``) has not renamed anything into place yet. A file that
was there before is never removed (one that writes in place may have
changed it; the atomic ones have not). If the
abandoned write does finish later, while the process still runs, its
complete file stays (it is the user's data) and the late finish is logged as
``export_finished_after_deadline``.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
import types
from typing import TYPE_CHECKING, Any

import attrs

from polyprof._log import get_logger
from polyprof.errors import PolyprofError

if TYPE_CHECKING:
    from polyprof.components import Exporter
    from polyprof.trace import Trace

log = get_logger(__name__)

#: Environment variable that sets every export's deadline, in seconds ("inf": none).
EXPORT_TIMEOUT_ENV = "POLYPROF_EXPORT_TIMEOUT_S"
#: The default deadline's fixed part.
EXPORT_TIMEOUT_BASE_S = 300.0
#: The default deadline's part per event: the built-in Chrome exporter measured 3 to 22 µs per event
#: (gzip and plain JSON, 250k events, on 2 busy cores).
EXPORT_TIMEOUT_PER_EVENT_S = 100e-6

__all__ = ["EXPORT_TIMEOUT_ENV", "ExportTimeoutError", "export_timeout_s", "export_trace"]


class ExportTimeoutError(PolyprofError, TimeoutError):
    """An exporter did not finish within its deadline; the message names it, its plugin and the path."""


def export_timeout_s(trace: Trace | None = None) -> float | None:
    """The deadline of one export in seconds (None: no deadline).

    ``POLYPROF_EXPORT_TIMEOUT_S`` when set, else the default for ``trace``
    (the fixed part alone without one). Call it without a trace to check the
    variable before a long run.

    :raises ValueError: the variable is set to something other than a number > 0 or ``inf``.
    """
    raw = os.environ.get(EXPORT_TIMEOUT_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not value > 0:  # NaN, zero and negatives
            raise ValueError(
                f"{EXPORT_TIMEOUT_ENV}={raw!r} is not a valid export deadline: set it to a number of seconds "
                "greater than 0 (such as 600), or to 'inf' for no deadline"
            )
        return None if math.isinf(value) else value
    if trace is None:
        return EXPORT_TIMEOUT_BASE_S
    recorded_s = max(0, trace.end_ns - trace.start_ns) / 1e9
    return EXPORT_TIMEOUT_BASE_S + len(trace.events) * EXPORT_TIMEOUT_PER_EVENT_S + recorded_s


def exporter_origin(exporter: Exporter, plugin_manager: Any = None) -> str:
    """How messages name an exporter.

    For example ``'chrome' (polyprof_builtins.chrome_trace.ChromeTraceExporter, plugin 'chrome_trace')``.
    """
    cls = type(exporter)
    name = getattr(exporter, "name", "?")
    where = f"{cls.__module__}.{cls.__qualname__}"
    plugin = _providing_plugin(name, cls.__module__, plugin_manager)
    return f"{name!r} ({where})" if plugin is None else f"{name!r} ({where}, plugin {plugin!r})"


def _providing_plugin(name: str, module: str, plugin_manager: Any) -> str | None:
    """The plugin that made the exporter ``name``, as far as the manager tells.

    The loaded plugin whose capabilities list ``name`` (the last one registered, which
    pluggy asks first), else the one whose module defines the exporter's class.
    """
    if plugin_manager is None:
        return None
    for info in reversed(plugin_manager.plugin_infos()):
        if info.loaded and info.capabilities is not None and name in info.capabilities.exporters:
            return info.name
    for impl in reversed(plugin_manager.hook.polyprof_make_exporter.get_hookimpls()):
        plugin = impl.plugin
        plugin_module = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
        if plugin_module == module:
            return impl.plugin_name
    return None


@attrs.define(eq=False)
class _Write:
    """One export on its worker thread; ``lock`` orders its end against the caller giving up on it."""

    path: str
    existed: bool
    lock: threading.Lock = attrs.Factory(threading.Lock)
    done: bool = False
    abandoned: bool = False
    result: Any = None
    error: BaseException | None = None


def export_trace(
    exporter: Exporter,
    trace: Trace,
    path: str,
    *,
    plugin_manager: Any = None,
    **options: Any,
) -> str:
    """``exporter.export(trace, path, **options)`` within the deadline of ``export_timeout_s(trace)``.

    The exporter's own exceptions come through unchanged.

    :param plugin_manager: the manager that made ``exporter``, to name its plugin in errors.
    :returns: what the exporter returns (the path written).
    :raises ExportTimeoutError: the deadline passed; the write is abandoned (see the module notes).
    """
    timeout_s = export_timeout_s(trace)
    write = _Write(path=path, existed=bool(path) and os.path.lexists(path))
    context = contextvars.copy_context()  # the caller's structlog context and the like

    def run() -> None:
        try:
            write.result = context.run(exporter.export, trace, path, **options)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            write.error = exc
        with write.lock:
            write.done = True
            abandoned = write.abandoned
        if abandoned:
            log.warning(
                "export_finished_after_deadline",
                exporter=exporter_origin(exporter, plugin_manager),
                path=path,
                error=None if write.error is None else repr(write.error),
            )

    # A daemon: an abandoned write must not keep the process from exiting.
    worker = threading.Thread(
        target=run, name=f"polyprof-export-{getattr(exporter, 'name', '?')}", daemon=True
    )
    worker.start()
    try:
        worker.join(timeout_s)
    except BaseException:  # an interrupt (Ctrl-C) while waiting: give up on the write as on the deadline
        _abandon(write)
        raise
    if _abandon(write):
        left = (
            f"the file already at {path!r} is kept (an exporter that writes in place may have changed it)"
            if write.existed
            else f"nothing is left at {path!r}"
        )
        raise ExportTimeoutError(
            f"exporter {exporter_origin(exporter, plugin_manager)} did not finish writing {path!r} within "
            f"{timeout_s:g} s; the write was abandoned and {left}. Set {EXPORT_TIMEOUT_ENV} (seconds, or "
            "'inf') if the exporter needs longer"
        )
    if write.error is not None:
        raise write.error
    return write.result


def _abandon(write: _Write) -> bool:
    """Give up on ``write`` unless it has finished; True when it was abandoned.

    What it left at its destination is removed when nothing was there before: the
    exporter never finished that file.
    """
    with write.lock:
        write.abandoned = not write.done
    if not write.abandoned:
        return False
    if write.existed or not write.path:
        return True
    try:
        os.unlink(write.path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("export_unfinished_file_left", path=write.path, error=str(exc))
    else:
        log.info("export_unfinished_file_removed", path=write.path)
    return True
