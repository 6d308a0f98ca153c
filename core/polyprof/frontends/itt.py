"""Intel ITT (VTune) annotations with ``torch.profiler.itt``'s API and ``emit_itt``.

``polyprof.itt`` mirrors ``torch.profiler.itt``: ``is_available``,
``range_push``, ``range_pop``, ``mark`` and the ``range`` context manager all
delegate to torch's built-in ITT binding (``torch._C._itt``), so the ranges
land in torch's ITT domain ``PyTorch`` exactly as torch's own calls do.
``polyprof.emit_itt`` is ``torch.autograd.profiler.emit_itt``: inside it every
operator becomes an ITT task, through torch's collector in ITT mode.

Without a collector attached (no VTune, no ``INTEL_LIBITTNOTIFY64``) all ITT
calls are cheap no-ops. Importing this module does not import torch; torch is
imported at the first call.

To replay a *recorded* polyprof trace into VTune instead, use the ``itt``
exporter (``prof.export(path, format="itt")``, see ``polyprof_builtins.itt_export``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Literal

from polyprof.base.log import get_logger
from polyprof.runtime.recording import RecordingInProgressError, recording_gate

log = get_logger(__name__)

__all__ = ["emit_itt", "is_available", "mark", "range", "range_pop", "range_push"]

_ALREADY_ENABLED = "Profiler is already enabled on this thread. "
_NOT_INSTALLED = (
    "ITT functions not installed. Are you sure you have a ITT build? "
    "(polyprof.itt delegates to torch's ITT binding torch._C._itt, which {why}; "
    "to annotate without it, use the ittapi package or the 'itt' exporter)"
)


def _torch_itt() -> Any:
    """torch's ITT binding, or raise the error torch's stub raises, naming why."""
    try:
        import torch._C
    except ImportError as exc:
        raise RuntimeError(
            _NOT_INSTALLED.format(why=f"cannot be imported: torch is not installed ({exc})")
        ) from exc
    binding = getattr(torch._C, "_itt", None)
    if binding is None:
        raise RuntimeError(_NOT_INSTALLED.format(why=f"this torch build ({torch.__version__}) lacks"))
    return binding


def is_available() -> bool:
    """True when torch was built with ITT (as ``torch.profiler.itt.is_available``).

    This says that ITT calls are compiled in, not that a collector (VTune) is
    attached. False when torch is missing or was built without ITT.
    """
    try:
        binding = _torch_itt()
    except RuntimeError:
        return False
    return bool(binding.is_available())


def range_push(msg: str) -> Any:
    """Begin a nested ITT range (task) called ``msg`` on this thread; returns what torch returns.

    :raises RuntimeError: torch has no ITT.
    """
    return _torch_itt().rangePush(msg)


def range_pop() -> Any:
    """End the innermost ITT range of this thread; returns what torch returns.

    :raises RuntimeError: torch has no ITT.
    """
    return _torch_itt().rangePop()


def mark(msg: str) -> Any:
    """An instantaneous ITT event called ``msg`` (a task that begins and ends at once).

    :raises RuntimeError: torch has no ITT.
    """
    return _torch_itt().mark(msg)


@contextlib.contextmanager
def range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:  # noqa: A001 - torch's name
    """Context manager (and decorator) around an ITT range named ``msg.format(*args, **kwargs)``.

    The range is popped even when the body raises.
    """
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()


class emit_itt:  # noqa: N801 - torch's name
    """Make every operator emit an ITT range while active (``torch.autograd.profiler.emit_itt``).

    Use it when running under Intel VTune Profiler::

        with polyprof.emit_itt():
            model(x)

    Operators are reported by torch's own collector in ITT mode, in torch's
    ``PyTorch`` domain; ``record_shapes=True`` appends the input shapes to each
    range's name, as torch does.

    torch's collector holds one profiler per thread: entering this while a
    ``polyprof.profile`` or ``torch.profiler.profile`` records on this thread
    raises ``RuntimeError("Profiler is already enabled on this thread. ...")``,
    and starting such a profile inside it raises too. Like every polyprof
    recording it also refuses to start while a ``polyprof.profile`` records on
    another thread (torch's collector keeps one session per process), and under
    ``polyprof run`` the whole-script profile steps aside for it. Entering the same object
    while it is active raises ``RuntimeError("ITT annotation context manager is
    not reentrant")``. Unlike torch's, an object may be entered again after it
    has exited.

    :param enabled: ``False`` makes it a no-op.
    :param record_shapes: add input shapes to the ranges' names.
    """

    def __init__(self, enabled: bool = True, record_shapes: bool = False) -> None:
        self.enabled = enabled
        self.record_shapes = record_shapes
        self.entered = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"polyprof.emit_itt(enabled={self.enabled!r}, record_shapes={self.record_shapes!r}, "
            f"entered={self.entered!r})"
        )

    def __enter__(self) -> emit_itt | None:
        if not self.enabled:
            return None
        with self._lock:
            if self.entered:
                raise RuntimeError("ITT annotation context manager is not reentrant")
            self.entered = True
        try:
            self._start()
        except BaseException:
            self.entered = False
            raise
        return self

    def __exit__(self, exc_type: object, exc_val: object, exc_tb: object) -> Literal[False]:
        if not self.enabled or not self.entered:
            return False
        try:
            self._stop()
        finally:
            self.entered = False
        return False

    def _start(self) -> None:
        _torch_itt()  # clear error when torch has no ITT
        import torch
        from torch._C._autograd import _enable_profiler
        from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

        config = ProfilerConfig(
            ProfilerState.ITT, self.record_shapes, False, False, False, False, _ExperimentalConfig()
        )
        # The gate every polyprof recording passes: it refuses to run beside another polyprof
        # profile, and lets `polyprof run`'s whole-script profile step aside first.
        try:
            recording_gate.acquire(self)
        except RecordingInProgressError as exc:
            prefix = _ALREADY_ENABLED if torch.autograd._profiler_enabled() else ""
            raise RuntimeError(f"{prefix}polyprof.emit_itt cannot start: {exc}") from None
        if torch.autograd._profiler_enabled():  # a torch profiler polyprof does not know of
            recording_gate.release(self)
            kind = torch._C._autograd._profiler_type()
            raise RuntimeError(
                f"{_ALREADY_ENABLED}polyprof.emit_itt cannot start while another profiler ({kind}) "
                "records on this thread, e.g. torch.profiler.profile: torch's collector runs one "
                "profiler per thread. Stop that profiler first."
            )
        _set_python_profiler_flag(True)
        try:
            _enable_profiler(config, set())
        except BaseException:
            _set_python_profiler_flag(False)
            recording_gate.release(self)
            raise
        log.debug("emit_itt_started", record_shapes=self.record_shapes)

    def _stop(self) -> None:
        from torch._C._autograd import _disable_profiler

        try:
            _disable_profiler()
        finally:
            _set_python_profiler_flag(False)
            recording_gate.release(self)
        log.debug("emit_itt_stopped")


def _set_python_profiler_flag(enabled: bool) -> None:
    """Keep torch's Python-side "a profiler is on" flag in step, as torch's emit_itt does.

    dynamo and inductor read ``torch.autograd.profiler._is_profiler_enabled`` to
    add their own annotations; it is private, so tolerate its absence.
    """
    import torch.autograd.profiler as autograd_profiler

    hook = getattr(autograd_profiler, "_run_on_profiler_start" if enabled else "_run_on_profiler_stop", None)
    if hook is not None:
        hook()
