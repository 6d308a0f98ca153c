"""``CsvExporter``: one CSV row per event of a polyprof trace.

Columns are built whole with numpy (one array per column, strings formatted
once per unique value of an interned field), then handed to ``csv.writer``.
Times are exact: microseconds are formatted from integer nanoseconds, never
through a float (an epoch timestamp in µs with three decimals has 19 digits,
more than a float64 holds).

The file is written atomically: to a temporary file in the same directory,
then renamed over the target, so a reader never sees half a file.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from polyprof.plugin import DeviceType, EventBatch, EventKind, Exporter, Trace

#: Where times are measured from: the trace's start, or the Unix epoch.
TIME_ORIGINS = ("trace", "epoch")


def _category_lookup() -> np.ndarray:
    """EventKind value -> category string ("cpu_op", "kernel", ...), for every int8."""
    lut = np.array([f"kind_{v}" for v in range(-128, 128)], dtype=object)
    for kind in EventKind:
        lut[int(kind) + 128] = kind.name.lower()
    return lut


def _device_type_lookup() -> np.ndarray:
    """torch DeviceType value -> its name ("CPU", "CUDA", ...), for every int8."""
    lut = np.array([str(v) for v in range(-128, 128)], dtype=object)
    for device in DeviceType:
        lut[int(device) + 128] = device.name
    return lut


_CATEGORY = _category_lookup()
_DEVICE_TYPE = _device_type_lookup()


def format_us(ns: np.ndarray) -> np.ndarray:
    """Integer nanoseconds -> exact microsecond strings with three decimals ("-0.001", "12.345")."""
    ns = np.asarray(ns, dtype=np.int64)
    if ns.size == 0:
        return np.empty(0, dtype=object)
    magnitude = np.abs(ns)
    whole = (magnitude // 1000).astype(str)
    frac = np.char.zfill((magnitude % 1000).astype(str), 3)
    text = np.char.add(np.char.add(whole, "."), frac)
    return np.where(ns < 0, np.char.add("-", text), text).astype(object)


def _interned(formatter: Callable[[Any], str]) -> Callable[[EventBatch, str, int], np.ndarray]:
    """A column of an interned field, formatting each unique value once."""

    def column(batch: EventBatch, field: str, origin_ns: int) -> np.ndarray:
        table = batch.table(field)
        texts = np.array([formatter(value) for value in table] + [""], dtype=object)  # -1 reads ""
        return texts[batch[field]]

    return column


def _shapes_text(shapes: Any) -> str:
    return str([list(shape) for shape in shapes])  # torch's table spelling: [[2, 3], [3, 4]]


def _stack_text(frames: Any) -> str:
    return ";".join(frames)


def _integer(batch: EventBatch, field: str, origin_ns: int) -> np.ndarray:
    return batch[field]


def _column_specs() -> dict[str, tuple[str, Callable[[EventBatch, int], np.ndarray]]]:
    """Column name -> (description, function of (events, origin_ns) giving the column)."""

    def field_column(
        field: str, reader: Callable[[EventBatch, str, int], np.ndarray]
    ) -> Callable[[EventBatch, int], np.ndarray]:
        return lambda batch, origin_ns: reader(batch, field, origin_ns)

    text = _interned(str)
    return {
        "name": ("event name", field_column("name", text)),
        "category": (
            "event kind: cpu_op, user_annotation, kernel, memory, ...",
            lambda b, o: _CATEGORY[b["kind"].astype(np.int64) + 128],
        ),
        "start_us": ("start, µs from the time origin", lambda b, o: format_us(b["start_ns"] - o)),
        "dur_us": ("duration, µs", lambda b, o: format_us(b["dur_ns"])),
        "end_us": ("end, µs from the time origin", lambda b, o: format_us(b["start_ns"] + b["dur_ns"] - o)),
        "pid": ("process id (device index for device events)", field_column("pid", _integer)),
        "tid": ("OS thread id (stream for device events)", field_column("tid", _integer)),
        "thread": ("torch's sequential thread id", field_column("thread", _integer)),
        "device_type": (
            "CPU, CUDA, XPU, ...",
            lambda b, o: _DEVICE_TYPE[b["device_type"].astype(np.int64) + 128],
        ),
        "device_index": ("device ordinal", field_column("device_index", _integer)),
        "stream": ("device stream or queue id", field_column("stream", _integer)),
        "correlation_id": ("event id", field_column("correlation_id", _integer)),
        "external_id": ("Kineto External id", field_column("external_id", _integer)),
        "sequence_nr": ("autograd sequence number", field_column("sequence_nr", _integer)),
        "input_shapes": ("input shapes (record_shapes)", field_column("shapes", _interned(_shapes_text))),
        "flops": ("estimated FLOPs (with_flops)", field_column("flops", _integer)),
        "nbytes": ("memory events: bytes (negative = freed)", field_column("nbytes", _integer)),
        "module": ("module hierarchy (with_modules)", field_column("module", text)),
        "overload": ("operator overload name", field_column("overload", text)),
        "stack": (
            "Python stack, innermost first (with_stack)",
            field_column("stack", _interned(_stack_text)),
        ),
    }


#: Every column this exporter can write, with what it holds.
COLUMNS: Mapping[str, tuple[str, Callable[[EventBatch, int], np.ndarray]]] = _column_specs()
#: Columns written when none are asked for.
DEFAULT_COLUMNS: tuple[str, ...] = (
    "name",
    "category",
    "start_us",
    "dur_us",
    "pid",
    "tid",
    "thread",
    "device_type",
    "device_index",
    "correlation_id",
    "input_shapes",
)


def check_columns(columns: Iterable[str] | str) -> tuple[str, ...]:
    """Validate a column selection ("all", a comma string or names); unknown names name the valid ones."""
    if isinstance(columns, str):
        if columns.strip() == "all":
            return tuple(COLUMNS)
        columns = [c.strip() for c in columns.split(",") if c.strip()]
    chosen = tuple(columns)
    unknown = [c for c in chosen if c not in COLUMNS]
    if unknown or not chosen:
        problem = f"unknown CSV columns {unknown}" if unknown else "no CSV columns chosen"
        raise ValueError(f"{problem}; valid columns: {', '.join(COLUMNS)} (or 'all')")
    return chosen


class CsvExporter(Exporter):
    """Writes a trace as CSV, one row per event, sorted by start time.

    ``export(trace, path, columns=..., time_origin=...)``: ``columns`` picks
    and orders the columns (default ``DEFAULT_COLUMNS``; ``"all"`` for every
    one in ``COLUMNS``); ``time_origin`` is ``"trace"`` (µs since the trace
    started, the default) or ``"epoch"`` (µs since the Unix epoch). A path
    ending in ``.gz`` is gzip-compressed.
    """

    name = "csv"
    suffixes = (".csv", ".csv.gz")

    def __init__(self, columns: Iterable[str] | str | None = None, time_origin: str = "trace") -> None:
        self.columns = DEFAULT_COLUMNS if columns is None else check_columns(columns)
        self.time_origin = self._check_origin(time_origin)

    @staticmethod
    def _check_origin(time_origin: str) -> str:
        if time_origin not in TIME_ORIGINS:
            raise ValueError(f"unknown time_origin {time_origin!r}; valid: {', '.join(TIME_ORIGINS)}")
        return time_origin

    def export(self, trace: Trace, path: str, **options: Any) -> str:
        unknown = sorted(set(options) - {"columns", "time_origin"})
        if unknown:
            raise TypeError(
                f"CsvExporter.export got unknown options {unknown}; valid options: columns, time_origin"
            )
        if not isinstance(trace, Trace):
            raise TypeError(f"CsvExporter.export needs a polyprof.plugin.Trace, not {type(trace).__name__}")
        columns = self.columns if options.get("columns") is None else check_columns(options["columns"])
        origin = self._check_origin(options.get("time_origin", self.time_origin))
        target = os.fspath(path)
        rows = self.rows(trace, columns, origin)
        _write_atomically(target, columns, rows)
        return target

    @staticmethod
    def rows(trace: Trace, columns: Sequence[str], time_origin: str = "trace") -> Iterable[tuple[Any, ...]]:
        """The data rows (without the header), events ordered by start time."""
        events = trace.events
        origin_ns = trace.start_ns if time_origin == "trace" else 0
        order = np.argsort(events["start_ns"], kind="stable")
        built = [COLUMNS[name][1](events, origin_ns)[order].tolist() for name in columns]
        return zip(*built, strict=True)


def _write_atomically(target: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    directory = os.path.dirname(os.path.abspath(target))
    if os.path.isdir(target):
        raise IsADirectoryError(f"CSV export path {target!r} is a directory; give a file name ending in .csv")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {target!r}: directory {directory!r} does not exist")
    temp = os.path.join(directory, f".{os.path.basename(target)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temp, "xb") as raw:  # "x": a fresh file, created with the user's umask
            if target.endswith(".gz"):
                inner_name = os.path.basename(target)[: -len(".gz")]
                with gzip.GzipFile(filename=inner_name, fileobj=raw, mode="wb", mtime=0) as compressed:
                    _write_csv(compressed, header, rows)
            else:
                _write_csv(raw, header, rows)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def _write_csv(binary: Any, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    text = io.TextIOWrapper(binary, encoding="utf-8", newline="")
    try:
        writer = csv.writer(text)
        writer.writerow(header)
        writer.writerows(rows)
        text.flush()
    finally:
        text.detach()  # leave closing the binary file to its owner
