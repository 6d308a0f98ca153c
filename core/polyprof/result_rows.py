"""The rows of one torch profiler result a decoder reads, and their fields as numpy columns.

Two readers stand behind one interface: polyprof's compiled reader
(``polyprof.native_reader``), which reads torch's C++ events without a Python
object per event, and the pure-Python one, which calls the ``_KinetoEvent``
accessors of ``result.events()``. Both give the same columns (the tests
compare them on every supported torch). A field the compiled reader lacks is
read through the accessors.
"""

from __future__ import annotations

from operator import methodcaller
from types import ModuleType
from typing import Any

import numpy as np

from polyprof import torch_support
from polyprof.events import intern_column, intern_structured_column

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


def _safe_name(event: Any) -> str:
    try:
        return event.name()
    except UnicodeDecodeError:
        return UNDECODABLE_NAME


def _is_raw_result(result: Any) -> bool:
    """Whether ``result`` is torch's own ``_ProfilerResult`` (tests hand stand-ins, read in Python)."""
    try:
        from torch._C._autograd import _ProfilerResult
    except ImportError:
        return False
    return isinstance(result, _ProfilerResult)


class ResultRows:
    """Some rows of one raw result: all of them, or those at ``indices``, in that order.

    ``events()`` (the pybind wrappers, ~330 bytes each) is fetched on first
    need and kept until ``forget_events()``; the compiled reader needs none.
    """

    def __init__(self, result: Any, reader: ModuleType | None, indices: np.ndarray | None = None) -> None:
        self.result = result
        self._reader = reader if reader is not None and _is_raw_result(result) else None
        self._native_fields = (
            frozenset(self._reader.field_names()) if self._reader is not None else frozenset()
        )
        self._indices = None if indices is None else np.ascontiguousarray(indices, dtype=np.int64)
        self._events: list[Any] | None = None
        self._all_events: list[Any] | None = None
        if self._indices is not None:
            self.count = len(self._indices)
        elif self._reader is not None:
            self.count = int(self._reader.event_count(result))
        else:
            self.count = len(self._fetch_all())

    @property
    def native(self) -> bool:
        return self._reader is not None

    def _fetch_all(self) -> list[Any]:
        if self._all_events is None:
            self._all_events = self.result.events()
        return self._all_events

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
        """Let go of the wrappers; the next ``events()`` fetches them again."""
        self._events = self._all_events = None

    def take(self, indices: np.ndarray) -> ResultRows:
        """The rows at ``indices`` of these rows."""
        indices = np.asarray(indices, dtype=np.int64)
        picked = indices if self._indices is None else self._indices[indices]
        rows = ResultRows(self.result, self._reader, picked)
        if self._all_events is not None:
            rows._all_events = self._all_events
        return rows

    def column(self, name: str, dtype: str) -> np.ndarray:
        """``event.<name>()`` of every row as ``dtype``; zeros where the installed torch lacks it."""
        if not torch_support.installed().has_accessor(name):
            return np.zeros(self.count, dtype=dtype)
        if name not in self._native_fields:
            return accessor_column(self.events(), name, dtype)
        values = self._native_column(name)
        return values if dtype == "int64" else values.astype(dtype)

    def _native_column(self, field: str) -> np.ndarray:
        assert self._reader is not None
        values = np.empty(self.count, dtype=np.int64)
        self._reader.fill(self.result, field, self._indices, values)
        return values

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
            elif f"{name}_size" in self._native_fields and not self._native_column(f"{name}_size").any():
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
            try:
                table, undecodable = self._reader.intern_texts(
                    self.result, which, self._indices, indices, UNDECODABLE_NAME
                )
            except ValueError:
                pass  # this build cannot read ``which``: the accessors can
            else:
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
            indices, table = intern_column(map(_safe_name, events), empty=empty, count=self.count)
            bad = int((indices == table.index(UNDECODABLE_NAME)).sum())
            return indices, table, bad


__all__ = ["UNDECODABLE_NAME", "ResultRows", "accessor", "accessor_column"]
