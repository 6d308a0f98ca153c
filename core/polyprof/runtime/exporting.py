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
(``polyprof.base.fileio``) has not renamed anything into place yet. A file that
was there before is never removed (one that writes in place may have
changed it; the atomic ones have not). If the
abandoned write does finish later, while the process still runs, its
complete file stays (it is the user's data) and the late finish is logged as
``export_finished_after_deadline``.

Before anything is written, the two trace formats polyprof reads back are
held to their names (``check_export_suffix``): ``parquet`` writes only a
``.parquet`` path (``polyprof convert`` and ``polyprof report`` tell a Parquet
trace by that suffix alone), and ``chrome`` (``export_chrome_trace``) writes any
name but a ``.parquet`` one, as torch's does. A path that breaks this is refused
with an ``ExportSuffixError`` naming the name to use. Every other format writes
any name: its exporter's ``suffixes`` only suggest one.

Ctrl-C (``KeyboardInterrupt``, or any other exception raised in the waiting
thread) stops the export instead: the write is cancelled
(``polyprof.base.fileio.WriteCancellation``), so an exporter that writes through
``polyprof.base.fileio.atomic_writer`` stops at its next write, removes its
temporary file and never renames it into place: the destination keeps what it
held before (or stays absent). The caller waits up to ``EXPORT_CANCEL_WAIT_S``
for that cleanup, then the interrupt propagates; when the exporter reached a
write within the wait, no thread is left writing while the interpreter exits.
An exporter that writes in another way, or reaches no write within the wait,
is abandoned as at the deadline; if it ends later, that is logged as
``export_finished_after_interrupt`` with its ``outcome`` (``cancelled``:
nothing renamed into place; ``finished``: its file stays; ``failed``). A
second Ctrl-C ends the wait, never the cancellation.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from polyprof.base.errors import PolyprofError
from polyprof.base.fileio import WriteCancellation, WriteCancelled, cancellable_writes
from polyprof.base.log import get_logger

if TYPE_CHECKING:
    from polyprof.base.trace import Trace
    from polyprof.hooks.components import Exporter

log = get_logger(__name__)

#: Environment variable that sets every export's deadline, in seconds ("inf": none).
EXPORT_TIMEOUT_ENV = "POLYPROF_EXPORT_TIMEOUT_S"
#: The default deadline's fixed part.
EXPORT_TIMEOUT_BASE_S = 300.0
#: The default deadline's part per event: the built-in Chrome exporter measured 3 to 22 µs per event
#: (gzip and plain JSON, 250k events, on 2 busy cores).
EXPORT_TIMEOUT_PER_EVENT_S = 100e-6
#: How long an interrupted export waits for its cancelled write to remove its temporary file.
EXPORT_CANCEL_WAIT_S = 5.0

#: The trace formats polyprof reads back (``polyprof convert``, ``polyprof report``) and their suffixes:
#: neither writes a file under the other's suffix.
TRACE_FORMAT_SUFFIXES: Final[Mapping[str, tuple[str, ...]]] = types.MappingProxyType(
    {"chrome": (".json", ".json.gz"), "parquet": (".parquet",)}
)
#: Trace formats that write only their own suffixes: the readers know a Parquet trace by its name alone.
OWN_SUFFIX_FORMATS: Final = frozenset({"parquet"})

__all__ = [
    "EXPORT_CANCEL_WAIT_S",
    "EXPORT_TIMEOUT_ENV",
    "OWN_SUFFIX_FORMATS",
    "TRACE_FORMAT_SUFFIXES",
    "ExportSuffixError",
    "ExportTimeoutError",
    "check_export_suffix",
    "export_timeout_s",
    "export_trace",
]


class ExportTimeoutError(PolyprofError, TimeoutError):
    """An exporter did not finish within its deadline; the message names it, its plugin and the path."""


class ExportSuffixError(PolyprofError, ValueError):
    """The path's suffix does not agree with the export format; the message names the suffixes to use."""


def check_export_suffix(format_name: str, path: str) -> None:
    """Refuse a path whose suffix disagrees with the trace format ``format_name``.

    Only the formats of ``TRACE_FORMAT_SUFFIXES`` are held; an empty path (no file) is never refused.

    :raises ExportSuffixError: the path ends in another trace format's suffix, or (for a format of
        ``OWN_SUFFIX_FORMATS``) in none of its own.
    """
    own = TRACE_FORMAT_SUFFIXES.get(format_name)
    if own is None or not path:
        return
    name = os.path.basename(path)
    lowered = name.lower()
    others = [
        (suffix, other)
        for other, other_suffixes in TRACE_FORMAT_SUFFIXES.items()
        if other != format_name
        for suffix in other_suffixes
        if lowered.endswith(suffix)
    ]
    if not others and (format_name not in OWN_SUFFIX_FORMATS or lowered.endswith(own)):
        return
    writes = f"format={format_name!r} writes {_either(own)} files"
    if format_name == "chrome":
        writes += " (export_chrome_trace and tensorboard_trace_handler write this format)"
    if others:
        suffix, other = max(others, key=lambda found: len(found[0]))
        stem = name[: len(name) - len(suffix)]
        raise ExportSuffixError(
            f"{writes}; {name!r} ends in {suffix}, which format={other!r} writes: name it {stem}{own[0]} or "
            f"write it with export({name!r}, format={other!r})"
        )
    raise ExportSuffixError(f"{writes}; {name!r} ends in none of them: name it {name}{own[0]}")


def _either(suffixes: tuple[str, ...]) -> str:
    unique = list(dict.fromkeys(suffixes))
    return unique[0] if len(unique) == 1 else f"{', '.join(unique[:-1])} or {unique[-1]}"


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

    For example ``'chrome' (polyprof.runtime.chrome_trace.ChromeTraceExporter, plugin 'chrome_trace')``.
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
    cancellation: WriteCancellation = attrs.Factory(WriteCancellation)
    lock: threading.Lock = attrs.Factory(threading.Lock)
    done: bool = False
    abandoned: bool = False
    #: The caller was interrupted (Ctrl-C) and cancelled the write, rather than reaching the deadline.
    interrupted: bool = False
    #: Set when the worker thread is through. Waited on instead of ``Thread.join``: up to Python 3.12, a
    #: join interrupted by Ctrl-C marks the thread stopped, and every later join returns at once.
    finished: threading.Event = attrs.Factory(threading.Event)
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
    :raises ExportSuffixError: the path's suffix disagrees with the trace format; nothing is written.
    :raises ExportTimeoutError: the deadline passed; the write is abandoned (see the module notes).
    """
    check_export_suffix(getattr(exporter, "name", ""), path)
    timeout_s = export_timeout_s(trace)
    write = _Write(path=path, existed=bool(path) and os.path.lexists(path))
    context = contextvars.copy_context()  # the caller's structlog context and the like

    def export() -> Any:
        with cancellable_writes(write.cancellation):
            return exporter.export(trace, path, **options)

    def run() -> None:
        cancelled = False
        try:
            write.result = context.run(export)
        except WriteCancelled:
            cancelled = True
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            write.error = exc
        try:
            with write.lock:
                write.done = True
                abandoned = write.abandoned
            _log_late_end(write, cancelled, abandoned, exporter_origin(exporter, plugin_manager))
        finally:
            write.finished.set()

    # A daemon: an abandoned write must not keep the process from exiting.
    worker = threading.Thread(
        target=run, name=f"polyprof-export-{getattr(exporter, 'name', '?')}", daemon=True
    )
    try:
        worker.start()  # in the try: start() waits for the thread, which may be writing already
        write.finished.wait(timeout_s)
    except BaseException:  # an interrupt (Ctrl-C) while waiting: the export stops, the interrupt goes on
        _cancel(write)
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


def _cancel(write: _Write) -> None:
    """Stop ``write``: its atomic writes rename nothing from now on; wait a little for their cleanup.

    An exporter still running after the wait (one that does not write through ``atomic_writer``,
    or reached no write) is abandoned (``_abandon``).
    """
    write.interrupted = True
    try:
        write.cancellation.cancel()  # sets the flag before it blocks: a second Ctrl-C cannot undo it
        write.finished.wait(EXPORT_CANCEL_WAIT_S)
    finally:  # a second Ctrl-C ends the wait, not the cleanup
        _abandon(write)


def _log_late_end(write: _Write, cancelled: bool, abandoned: bool, origin: str) -> None:
    """Log how a write ended once nobody waits for it: what the caller was told is not the whole story."""
    if not abandoned:
        if cancelled:
            log.info("export_cancelled", exporter=origin, path=write.path)
        return
    if write.interrupted:  # Ctrl-C's wait was over: the caller saw the interrupt, not this
        outcome = "cancelled" if cancelled else "finished" if write.error is None else "failed"
        log.warning(
            "export_finished_after_interrupt",
            exporter=origin,
            path=write.path,
            outcome=outcome,
            error=None if write.error is None else repr(write.error),
        )
        return
    log.warning(
        "export_finished_after_deadline",
        exporter=origin,
        path=write.path,
        error=None if write.error is None else repr(write.error),
    )


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
