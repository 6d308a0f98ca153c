"""The rows of one torch profiler result a decoder reads, and their fields as numpy columns.

Two readers stand behind one interface: polyprof's compiled reader
(``polyprof.native.native_reader``), which reads torch's C++ events without a Python
object per event, and the pure-Python one, which calls the ``_KinetoEvent``
accessors of ``result.events()``. Both give the same columns (the tests
compare them on every supported torch). A field the compiled reader lacks is
read through the accessors.
"""

from __future__ import annotations

import sys
import threading
from operator import methodcaller
from types import ModuleType
from typing import Any

import numpy as np

from polyprof.base import torch_support
from polyprof.base._memory import release_free_heap
from polyprof.base.events import intern_column, intern_structured_column
from polyprof.base.log import get_logger

log = get_logger(__name__)

#: What a name torch cannot hand over as UTF-8 becomes (a torch bug: names read from freed memory).
UNDECODABLE_NAME = "<undecodable name>"


def accessor(events: list[Any], name: str) -> Any:
    """``event.name()`` as a function of the event.

    The unbound pybind method skips methodcaller's attribute lookup per call:
    about a quarter of the cost of a pass over 200k events.
    """
    if events:
        method = getattr(type(events[0]), name, None)
        if method is not None:
            return method
    return methodcaller(name)


def accessor_column(events: list[Any], name: str, dtype: str) -> np.ndarray:
    """One accessor over every event; zeros where the installed torch lacks the accessor."""
    if not torch_support.installed().has_accessor(name):
        return np.zeros(len(events), dtype=dtype)
    try:
        return np.fromiter(map(accessor(events, name), events), dtype=dtype, count=len(events))
    except OverflowError:
        if dtype != "int64":
            raise
        # Some ids come back as unsigned 64-bit values (e.g. an unset thread id,
        # 2**64 - 1); keep their bits, so they read as negative int64.
        values = np.fromiter(map(accessor(events, name), events), dtype="uint64", count=len(events))
        return values.view(np.int64)


def safe_text(which: str) -> Any:
    """``event.<which>()``, or ``UNDECODABLE_NAME`` where torch's text is not valid UTF-8."""

    def read(event: Any) -> str:
        try:
            return getattr(event, which)()
        except UnicodeDecodeError:
            return UNDECODABLE_NAME

    return read


class _Shared:
    """What a ``ResultRows`` and every ``take`` of it share about one result: torch's event
    wrappers (one ``forget_events`` lets go of them for all) and the thread freeing its Kineto
    trace (``close`` waits for it)."""

    def __init__(self) -> None:
        self.every: list[Any] | None = None
        self.trace_release: threading.Thread | None = None


def _sole_owner_refcount() -> int:
    """What ``sys.getrefcount`` says, in ``close``'s code shape, of an object only a local holds.

    Measured rather than assumed: CPython 3.14 passes locals as borrowed references, which
    changes the count by one.
    """
    probe = [object()]
    result = probe.pop()
    return sys.getrefcount(result)


#: None where counts say nothing about other holders (free-threaded builds share them out).
SOLE_OWNER_REFCOUNT: int | None = (
    None if getattr(sys, "_is_gil_enabled", lambda: True)() is False else _sole_owner_refcount()
)


def _start(thread: threading.Thread) -> bool:
    """Start ``thread``; False where the interpreter refuses new threads (it is shutting down)."""
    try:
        thread.start()
    except RuntimeError:
        return False
    return True


def _is_raw_result(result: Any) -> bool:
    """Whether ``result`` is torch's own ``_ProfilerResult`` (tests hand stand-ins, read in Python)."""
    try:
        from torch._C._autograd import _ProfilerResult
    except ImportError:
        return False
    return isinstance(result, _ProfilerResult)


#: The names of the freeing threads.
RESULT_RELEASE = "polyprof-result-release"
TRACE_RELEASE = "polyprof-trace-release"


def _release(reader: ModuleType, result: Any) -> None:
    try:
        reader.release(result)
    except Exception as exc:  # noqa: BLE001 - the result is then freed through Python, as usual
        log.warning("kineto_result_release_failed", reason=repr(exc))
    del result
    release_free_heap()


def _release_trace(reader: ModuleType, result: Any) -> None:
    try:
        reader.release_trace(result)
    except Exception as exc:  # noqa: BLE001 - the trace is then freed with the result, as usual
        log.warning("kineto_trace_release_failed", reason=repr(exc))


class ResultRows:
    """Some rows of one raw result: all of them, or those at ``indices``, in that order.

    ``events()`` (the pybind wrappers, ~330 bytes each) is fetched on first
    need and kept until ``forget_events()``; the compiled reader needs none.
    """

    def __init__(
        self,
        result: Any,
        reader: ModuleType | None,
        indices: np.ndarray | None = None,
        shared: _Shared | None = None,
    ) -> None:
        self.result = result
        self._reader = reader if reader is not None and _is_raw_result(result) else None
        self._native_fields: frozenset[str] = frozenset()
        self._native_fields = self._native(lambda reader: frozenset(reader.field_names())) or frozenset()
        self._indices = None if indices is None else np.ascontiguousarray(indices, dtype=np.int64)
        self._events: list[Any] | None = None
        self._shared = shared or _Shared()
        if self._indices is not None:
            self.count = len(self._indices)
        else:
            count = self._native(lambda reader: int(reader.event_count(result)))
            self.count = len(self._fetch_all()) if count is None else count

    def _native(self, read: Any) -> Any:
        """``read(reader)`` with the compiled reader, or None (then and from now on, Python) when it
        has none or fails: a reader at odds with this torch must not cost the profile."""
        if self._reader is None:
            return None
        try:
            return read(self._reader)
        except IndexError:
            raise  # a row outside the result: the caller's mistake, not the reader's
        except Exception as exc:  # noqa: BLE001 - the Python reader gives the same values
            log.warning("kineto_reader_failed_falling_back_to_python", reason=repr(exc))
            self._reader = None
            self._native_fields = frozenset()
            return None

    @property
    def native(self) -> bool:
        return self._reader is not None

    def _fetch_all(self) -> list[Any]:
        if self._shared.every is None:
            self._shared.every = self.result.events()
        return self._shared.every

    def events(self) -> list[Any]:
        """torch's event wrappers of these rows."""
        if self._events is None:
            every = self._fetch_all()
            self._events = every if self._indices is None else [every[i] for i in self._indices.tolist()]
        return self._events

    def has_accessor(self, name: str) -> bool:
        """Whether these rows' events have ``name()`` (stand-ins in tests may have fewer than torch)."""
        if self.native:
            return torch_support.installed().has_accessor(name)
        events = self.events()
        return bool(events) and hasattr(events[0], name)

    def forget_events(self) -> None:
        """Let go of the wrappers (of every ``take`` of the same rows too; subsets their
        ``events()`` handed out stay the caller's); the next ``events()`` fetches them again."""
        self._events = self._shared.every = None

    def close(self) -> bool:
        """Let go of torch's result; these rows read nothing afterwards. True if a thread frees it.

        Where these rows hold the last reference and the compiled module can, torch's
        result is freed on a thread of its own without the GIL, so the caller goes on
        meanwhile (deallocating it through Python holds the GIL for about 0.5 us per
        event), and that thread then returns the freed heap to the OS. Otherwise it is
        freed now, as the last reference goes.
        """
        self.wait_for_kineto_trace_release()  # that thread holds the result while it runs
        result, self.result = self.result, None
        self.forget_events()
        reader = self._reader
        self._reader = None
        if (
            reader is None
            or SOLE_OWNER_REFCOUNT is None
            or sys.getrefcount(result) != SOLE_OWNER_REFCOUNT  # someone else can still reach it
            or not getattr(reader, "can_release", bool)()
        ):
            return False
        # Not a daemon (explicitly: a thread inherits its creator's flag, and the export runs on a
        # daemon thread): the interpreter waits for the free before it tears torch down.
        return _start(
            threading.Thread(target=_release, args=(reader, result), name=RESULT_RELEASE, daemon=False)
        )

    def release_kineto_trace(self) -> bool:
        """Free the Kineto trace inside torch's result now, on a thread of its own; True if started.

        About half of what the result holds (700 MB at 1M events) is Kineto's copy of
        the events for its own writer; the rows' fields never point into it, so they stay
        readable. Only for a caller that knows nothing will call ``result.save()`` or
        ``trace_activities()`` on this result again (those would crash); needs the compiled module.
        """
        reader = self._reader
        if (
            reader is None
            or self._shared.trace_release is not None
            or not getattr(reader, "can_release", bool)()
        ):
            return False
        thread = threading.Thread(
            target=_release_trace, args=(reader, self.result), name=TRACE_RELEASE, daemon=False
        )
        if not _start(thread):
            return False
        self._shared.trace_release = thread
        return True

    def wait_for_kineto_trace_release(self) -> None:
        """Return once the thread ``release_kineto_trace`` started has freed the trace."""
        if self._shared.trace_release is not None:
            self._shared.trace_release.join()
            self._shared.trace_release = None

    def take(self, indices: np.ndarray) -> ResultRows:
        """The rows at ``indices`` of these rows."""
        indices = np.asarray(indices, dtype=np.int64)
        picked = indices if self._indices is None else self._indices[indices]
        return ResultRows(self.result, self._reader, picked, self._shared)

    def column(self, name: str, dtype: str) -> np.ndarray:
        """``event.<name>()`` of every row as ``dtype``; zeros where the installed torch lacks it."""
        if not torch_support.installed().has_accessor(name):
            return np.zeros(self.count, dtype=dtype)
        values = self._native_column(name) if name in self._native_fields else None
        if values is None:
            return accessor_column(self.events(), name, dtype)
        return values if dtype == "int64" else values.astype(dtype)

    def _native_column(self, field: str) -> np.ndarray | None:
        values = np.empty(self.count, dtype=np.int64)

        def fill(reader: ModuleType) -> np.ndarray:
            reader.fill(self.result, field, self._indices, values)
            return values

        return self._native(fill)

    def structured(self, name: str) -> tuple[np.ndarray, tuple]:
        """``event.<name>()`` of every row as ``intern_structured_column`` interns it (empty: -1).

        The compiled reader interns the texts (``metadata_json``, ``activity_type``) itself and
        sees that the mappings (``extra_meta``, ``typed_metadata``) are empty, as they are on
        host rows; anything else is read through the accessors.
        """
        if self._reader is not None:
            if name in ("metadata_json", "activity_type"):
                indices, table, _ = self.names(name, empty="", fallback=False)
                if indices is not None:
                    return indices, table
            elif f"{name}_size" in self._native_fields:
                sizes = self._native_column(f"{name}_size")
                if sizes is not None and not sizes.any():
                    return np.full(self.count, -1, dtype=np.int32), ()
        events = self.events()
        return intern_structured_column(map(accessor(events, name), events))

    def names(
        self, which: str = "name", *, empty: str | None = None, fallback: bool = True
    ) -> tuple[Any, tuple, int]:
        """``which`` ("name", "overload_name", ...) of every row, interned as ``intern_column`` does
        (``empty``: the text that gets index -1): (indices, table, how many rows had a text torch
        could not hand over as UTF-8, each now ``UNDECODABLE_NAME``). Without ``fallback``, indices
        are None where the compiled reader cannot read ``which``."""
        if self._reader is not None and (which == "name" or torch_support.installed().has_accessor(which)):
            indices = np.empty(self.count, dtype=np.int32)

            def intern(reader: ModuleType) -> Any:
                try:
                    return reader.intern_texts(self.result, which, self._indices, indices, UNDECODABLE_NAME)
                except ValueError:
                    return False  # this build cannot read ``which``: the accessors can

            interned = self._native(intern)
            if interned:
                table, undecodable = interned
                table = tuple(table)
                if empty is not None and empty in table:
                    at = table.index(empty)
                    indices = np.where(indices == at, -1, indices - (indices > at)).astype(np.int32)
                    table = table[:at] + table[at + 1 :]
                return indices, table, int(undecodable)
        if not fallback:
            return None, (), 0
        events = self.events()
        try:
            indices, table = intern_column(
                map(accessor(events, which), events), empty=empty, count=self.count
            )
            return indices, table, 0
        except UnicodeDecodeError:
            indices, table = intern_column(map(safe_text(which), events), empty=empty, count=self.count)
            bad = int((indices == table.index(UNDECODABLE_NAME)).sum())
            return indices, table, bad


__all__ = ["UNDECODABLE_NAME", "ResultRows", "accessor", "accessor_column", "safe_text"]
