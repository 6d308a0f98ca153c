"""Reading Chrome trace JSON files (ours or torch's) back into polyprof.

``load_chrome_trace(path)`` returns the parsed document of a ``.json`` or
``.json.gz`` file and fails with a one-line ``TraceFileError`` naming the path
and what is wrong with it. Files come from anywhere, so it reads only regular
files, at most ``POLYPROF_REPORT_MAX_BYTES`` of JSON (gzip decompressed as a
stream, with a check for gzip bombs), and JSON nested as deep as orjson allows.
``trace_from_chrome(doc)`` rebuilds a ``Trace`` from the document's complete
(``X``) and instant (``i``) events, the reverse of the "chrome" exporter, so
``polyprof report`` can summarise a saved trace. Counter events (``C``) come
back as ``EventKind.COUNTER`` rows, one per series, kept for the trace only
(``trace_only``: never in ``events()`` or tables).

Times come back exactly to the nanosecond: ``ts`` has three decimals relative
to ``baseTimeNanoseconds``, and the conversion from the parsed double to
integer nanoseconds is done without rounding error (see ``us_to_ns``).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import stat
import sys
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import numpy as np
import orjson

from polyprof.base.activity import DEVICES, ProfilerActivity
from polyprof.base.attribution import _OpIndex
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import PolyprofError
from polyprof.base.events import (
    API_CALL_KINDS,
    DeviceType,
    EventBatch,
    EventKind,
    concat,
    intern_column,
    intern_structured_column,
    kind_codes,
)
from polyprof.base.kineto_format import (
    DEFAULT_DEVICE_TYPE,
    DEVICE_BY_LANE_LABEL,
    DEVICE_KINDS,
    FLOW_TYPE_BY_CATEGORY,
    GENERATED_ARG_KEYS,
    OUT_OF_MEMORY_EVENT_NAME,
    PROCESS_LABELS,
    PROCESS_NAME,
    SPAN_CATEGORY,
    WINDOW_END_NAME,
    Arg,
    kind_of_category,
    us_to_ns,
)
from polyprof.base.log import get_logger
from polyprof.base.trace import CHROME_TRACE_RESERVED_KEYS, CONFIG_FLAG_KEYS, Trace

log = get_logger(__name__)

SOURCE = "chrome_trace"

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_BYTES_ENV",
    "StdlibParsedDocument",
    "TraceFileError",
    "document_from_bytes",
    "is_async_work_name",
    "load_chrome_trace",
    "max_bytes_from_env",
    "read_chrome_trace",
    "read_trace_bytes",
    "trace_from_chrome",
    "us_to_ns",
]


class TraceFileError(PolyprofError, ValueError):
    """A file is not a readable Chrome trace. ``str(err)`` is ``"<path>: <problem>"``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


# ------------------------------------------------------------------ loading

_GZIP_MAGIC = b"\x1f\x8b"
#: Environment variable that sets how many bytes a trace may hold (plain, or once decompressed).
MAX_BYTES_ENV = "POLYPROF_REPORT_MAX_BYTES"
#: Default of ``MAX_BYTES_ENV``: real traces reach 1-2 GiB of JSON; parsing takes several times that.
DEFAULT_MAX_BYTES = 4 * 2**30
#: Traces compress 7-30x (Kineto's and polyprof's, with stacks); a gzip bomb some 1000x. Past
#: ``_RATIO_FLOOR`` bytes of output, more than this many bytes per compressed byte is refused.
_MAX_GZIP_RATIO = 200
_RATIO_FLOOR = 64 * 2**20
_CHUNK = 16 * 2**20
#: orjson's nesting limit; a Chrome trace nests a handful of levels.
_MAX_JSON_DEPTH = 1024
_NOT_REGULAR = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
)


def max_bytes_from_env() -> int:
    """The byte limit ``MAX_BYTES_ENV`` sets, else ``DEFAULT_MAX_BYTES``.

    :raises ValueError: the variable is set but is not a whole number of bytes above 0.
    """
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(
            f"{MAX_BYTES_ENV} must be a whole number of bytes above 0 (default {DEFAULT_MAX_BYTES}); "
            f"got {text!r}"
        )
    return value


def _size_text(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def _too_big(what: str, limit: int) -> str:
    return (
        f"{what} more than the {_size_text(limit)} polyprof reads ({MAX_BYTES_ENV}={limit}); "
        f"set {MAX_BYTES_ENV} to a larger number of bytes to read it"
    )


def _file_kind(mode: int) -> str | None:
    """What a file that is not a regular file is, e.g. ``"a character device"``; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    return next((kind for is_kind, kind in _NOT_REGULAR if is_kind(mode)), "not a regular file")


def _not_regular(path: str, kind: str) -> TraceFileError:
    if kind == "a directory":
        return TraceFileError(path, "is a directory, not a trace file")
    return TraceFileError(path, f"is {kind}, not a regular file; save the trace to a file and read that")


def _read_bytes(path: str, limit: int) -> tuple[bytearray, bool]:
    """The file's bytes (gzip data decompressed) and whether they were compressed.

    Refuses what is not a regular file and more than ``limit`` bytes. Reads in
    chunks, so neither a file that grows nor a gzip bomb takes more than about
    ``limit`` bytes of memory; the compressed bytes are never held whole.
    """
    try:
        # Checked before opening: opening a FIFO for reading waits for a writer.
        kind = _file_kind(os.stat(path).st_mode)
        if kind is not None:
            raise _not_regular(path, kind)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            kind = _file_kind(info.st_mode)  # replaced since the check
            if kind is not None:
                raise _not_regular(path, kind)
            if info.st_size > limit:
                raise TraceFileError(path, _too_big(f"the file is {_size_text(info.st_size)},", limit))
            if f.read(2) == _GZIP_MAGIC:
                f.seek(0)
                return _gunzip(path, f, max(info.st_size, 1), limit), True
            f.seek(0)
            return _read_capped(path, f, limit, "the file holds", expected_size=info.st_size), False
    except FileNotFoundError:
        raise TraceFileError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceFileError(path, "is a directory, not a trace file") from None
    except PermissionError:
        raise TraceFileError(path, "permission denied") from None
    except OSError as exc:
        raise TraceFileError(path, f"cannot read the file ({exc.strerror or exc})") from None


def _read_capped(
    path: str, stream: Any, limit: int, what: str, compressed_size: int = 0, expected_size: int = 0
) -> bytearray:
    data = bytearray(expected_size)  # read in place: appending chunks copies the bytes again
    got = 0
    with memoryview(data) as view:
        while got < expected_size and (count := stream.readinto(view[got:])):
            got += count
    del data[got:]  # the file shrank since its size was read
    while chunk := stream.read(_CHUNK):  # or grew
        data += chunk
        if len(data) > limit:
            raise TraceFileError(path, _too_big(what, limit))
        if compressed_size and len(data) > max(_RATIO_FLOOR, _MAX_GZIP_RATIO * compressed_size):
            raise TraceFileError(
                path,
                f"the {_size_text(compressed_size)} of gzip data decompress to more than "
                f"{_MAX_GZIP_RATIO} times their size, which no trace does (a gzip bomb?); "
                "to read it anyway, decompress it yourself and pass the .json file",
            )
    return data


def _gunzip(path: str, raw: Any, compressed_size: int, limit: int) -> bytearray:
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            return _read_capped(path, unzipped, limit, "the gzip data decompress to", compressed_size)
    except EOFError:
        raise TraceFileError(
            path, "truncated gzip data: the file ends before its compressed stream does"
        ) from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFileError(path, f"corrupt gzip data ({exc})") from None


def _shortened(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in "..." when cut (file content in messages)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _depth_error(path: str, detail: str) -> TraceFileError:
    return TraceFileError(path, f"JSON nested too deeply ({detail}); a Chrome trace nests a few levels")


def _parse_json(path: str, data: bytes | bytearray) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in exc.msg:  # the stdlib parser would recurse until it fails
            raise _depth_error(
                path, f"more than {_MAX_JSON_DEPTH} levels at line {exc.lineno}, column {exc.colno}"
            ) from None
    # orjson refuses what the stdlib parser accepts (integers beyond 64 bits,
    # NaN) and its messages are terse: ask the stdlib for a verdict and position.
    text = data.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except RecursionError:
        raise _depth_error(path, "past Python's recursion limit") from None
    except json.JSONDecodeError as exc:
        # a string that never closes runs to the end of the text: cut there too (the stdlib
        # reports where the string began)
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            raise TraceFileError(
                path, f"truncated JSON: the document ends (line {exc.lineno}) before it is complete"
            ) from None
        raise TraceFileError(
            path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    return StdlibParsedDocument(parsed) if isinstance(parsed, dict) else parsed


class StdlibParsedDocument(dict[str, Any]):
    """A document orjson could not parse, read by the stdlib parser instead.

    It may hold what orjson neither reads nor writes: NaN and infinities, integers past 64 bits,
    lone surrogates in strings. Writers that must give every value back (``polyprof.formats.columnar``)
    write such a document with the stdlib encoder.
    """


def load_chrome_trace(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> dict[str, Any]:
    """Parse a Chrome trace file (``.json`` or gzip-compressed ``.json.gz``).

    Returns the top-level object; a file holding a bare array of events (the
    other Chrome trace form) comes back as ``{"traceEvents": [...]}``. Raises
    ``TraceFileError`` for a missing file, a directory or other file that is
    not a regular one (a device, a FIFO), an empty, truncated or corrupt file,
    more than ``max_bytes`` of JSON (default: ``max_bytes_from_env()``), gzip
    data that inflates like a gzip bomb, invalid or absurdly nested JSON, or
    JSON that is not a trace.
    """
    path = os.fspath(path)
    holder = [read_trace_bytes(path, max_bytes=max_bytes)]
    return document_from_bytes(path, holder)


def read_trace_bytes(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> bytearray:
    """The JSON bytes of a trace file (gzip data decompressed), checked as ``load_chrome_trace`` does
    before it parses: a regular file, within ``max_bytes``, not empty."""
    path = os.fspath(path)
    limit = max_bytes_from_env() if max_bytes is None else max_bytes
    data, compressed = _read_bytes(path, limit)
    if not data or data.isspace():  # isspace: no copy, unlike strip()
        raise TraceFileError(path, "the compressed file holds no data" if compressed else "the file is empty")
    return data


def document_from_bytes(path: str, holder: list[bytearray]) -> dict[str, Any]:
    """The Chrome trace document of the bytes ``read_trace_bytes`` gave, which ``holder`` holds alone
    and gives up (emptied) once they are parsed, since the document takes several times their size.
    ``TraceFileError`` naming ``path`` as ``load_chrome_trace`` raises them."""
    doc = _parse_json(path, holder[0])
    holder.clear()
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict):
        raise TraceFileError(
            path,
            f"not a Chrome trace: the top level is a {type(doc).__name__}, expected an object with "
            '"traceEvents" or an array of events',
        )
    if "traceEvents" not in doc:
        keys = ", ".join(_shortened(key, 40) for key in sorted(map(str, doc))[:8]) or "none"
        raise TraceFileError(path, f'not a Chrome trace: no "traceEvents" key (top-level keys: {keys})')
    if not isinstance(doc["traceEvents"], list):
        raise TraceFileError(
            path, f'not a Chrome trace: "traceEvents" is a {type(doc["traceEvents"]).__name__}, not a list'
        )
    return doc


def read_chrome_trace(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> Trace:
    """``trace_from_chrome(load_chrome_trace(path, max_bytes=max_bytes))``."""
    doc = load_chrome_trace(path, max_bytes=max_bytes)
    try:
        return trace_from_chrome(doc)
    except RecursionError:  # an args value or name nested deeper than Python follows
        raise _depth_error(os.fspath(path), "a value past Python's recursion limit") from None


# -------------------------------------------------------------- conversion


#: The activity that recorded a device's rows (``polyprof.base.activity.DEVICES``; HIP's is CUDA).
_ACTIVITY_BY_DEVICE: dict[DeviceType, ProfilerActivity] = {d.device_type: d.activity for d in DEVICES}
#: Number types a parsed ``ts``/``dur`` may have (Decimal: ``json.load(parse_float=Decimal)``).
_NUMBER = (int, float, Decimal)
_SKELETON_KEYS = CHROME_TRACE_RESERVED_KEYS | {"trace_id", "host_name", *CONFIG_FLAG_KEYS}


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int(value: Any, default: int = 0) -> int:
    """A parsed JSON value as an int64, or ``default`` when it is not one."""
    if isinstance(value, (bool, int)):
        number = int(value)
    elif (
        isinstance(value, (float, Decimal)) and value == value and value not in (float("inf"), float("-inf"))
    ):
        if value != int(value):
            return default
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            return default
    else:
        return default
    return number if _INT64_MIN <= number <= _INT64_MAX else default


def _is_shape_list(value: Any) -> bool:
    """Whether ``Input Dims`` is what torch writes: a non-empty list with a list per input."""
    return type(value) is list and bool(value) and all(type(dims) is list for dims in value)


def _as_tuple(value: Any) -> Any:
    """Parsed ``Input Dims`` as hashable nested tuples (interned shapes)."""
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    if isinstance(value, dict):  # not a shape; keep it hashable
        return _json_text(value)
    return value


#: An op name with the overload torch's writer appends under capture_overload_names: "aten::add.Tensor".
_OVERLOADED_OP = re.compile(r"([A-Za-z_]\w*::\w+)\.(\w+)")


def _split_overloads(names: list[str], ops: np.ndarray) -> list[str | None] | None:
    """Ops' overload names split off ``names`` (in place), as ``events()`` has them; None if none.

    torch's ``FunctionEvent`` keeps ``name`` ("aten::add") and ``overload_name``
    ("Tensor") apart; only its trace joins them.
    """
    overloads: list[str | None] = [None] * len(names)
    found = False
    for i in np.flatnonzero(ops).tolist():
        match = _OVERLOADED_OP.fullmatch(names[i])
        if match is not None:
            names[i], overloads[i] = match.group(1), match.group(2)
            found = True
    return overloads if found else None


def _device_lanes(events: list[Any]) -> dict[int, int]:
    """Device lane pid -> DeviceType, from the lane's name or label ("CUDA 0", "XPU 1", "GPU 0")."""
    lanes: dict[int, int] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "M" or not isinstance(ev.get("pid"), int):
            continue
        if ev.get("name") not in (PROCESS_NAME, PROCESS_LABELS):
            continue
        args = ev.get("args")
        label = args.get("name", args.get("labels")) if isinstance(args, dict) else None
        if not isinstance(label, str):
            continue
        device = DEVICE_BY_LANE_LABEL.get(label.split(" ", 1)[0])
        if device is not None and ev["pid"] not in lanes:
            lanes[ev["pid"]] = int(device)
    return lanes


def _flow_index(events: list[Any]) -> dict[tuple[Any, Any, Any], tuple[int, int, bool]]:
    """(pid, tid, ts) of a flow's slice -> (flow id, flow type, starts here)."""
    flows: dict[tuple[Any, Any, Any], tuple[int, int, bool]] = {}
    for ev in events:
        if not isinstance(ev, dict):
            continue
        ph = ev.get("ph")
        if ph not in ("s", "f"):
            continue
        category, key = ev.get("cat"), _flow_key(ev)
        flow_type = FLOW_TYPE_BY_CATEGORY.get(category) if isinstance(category, str) else None
        if flow_type is not None and key is not None:
            flows[key] = (_int(ev.get("id")), flow_type, ph == "s")
    return flows


def _flow_key(ev: dict[str, Any]) -> tuple[Any, Any, Any] | None:
    """The (pid, tid, ts) that ties a flow to its slice; None when one of them is a list or object."""
    key = (ev.get("pid"), ev.get("tid"), ev.get("ts"))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _thread_ids(pid: np.ndarray, tid: np.ndarray, ts_us: np.ndarray, host: np.ndarray) -> np.ndarray:
    """torch-like sequential thread ids of the host events: 1, 2, ... per (pid, tid), 0 elsewhere.

    torch nests each thread's rows in a stack of their own and numbers threads from 1 as they first
    record; a trace keeps only the OS ids, so each (process, thread) pair is numbered in the order
    of its first event (ties by pid, tid). Python events take their thread's id like the ops beside
    them (torch's own events do), not the "Python thread" arg, an index of the Python tracer's own.
    """
    thread = np.zeros(len(pid), dtype=np.int64)
    rows = np.flatnonzero(host)
    if not len(rows):
        return thread
    pairs, lane = np.unique(np.stack([pid[rows], tid[rows]]), axis=1, return_inverse=True)
    lane = lane.reshape(-1)
    first = np.full(pairs.shape[1], np.inf)
    np.minimum.at(first, lane, ts_us[rows])
    order = np.lexsort((pairs[1], pairs[0], first))
    number = np.empty(len(order), dtype=np.int64)
    number[order] = np.arange(1, len(order) + 1)
    thread[rows] = number[lane]
    return thread


#: c10d's ``Work`` records its collective as a range named ``<backend>:<collective>`` (the
#: profiling title: ``gloo:all_reduce``, ``nccl:send 0->1``, ...) that it marks async, because
#: another thread may end it; torch's tree leaves async rows out of every stack and gives them no
#: self time. A trace does not keep the mark, so the names of c10d's backends stand for it.
_ASYNC_WORK_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:")


def is_async_work_name(name: str) -> bool:
    """Whether a ``user_annotation`` of this name is one of c10d's async collective ranges."""
    return name.startswith(_ASYNC_WORK_PREFIXES)


def _async_work(codes: np.ndarray, table: Sequence[str], kind: np.ndarray) -> np.ndarray:
    """Which events are c10d's async collective ranges (see ``_ASYNC_WORK_PREFIXES``): each distinct
    name asked once."""
    titled = np.fromiter(map(is_async_work_name, table), dtype=bool, count=len(table))
    return (kind == int(EventKind.USER_ANNOTATION)) & titled[codes]


def _ints(values: list[Any], default: int) -> np.ndarray:
    """An int64 column from parsed JSON values; odd ones (null, text, floats) one by one."""
    try:
        column = np.array(values)  # not dtype=int64: that truncates floats and parses text
    except (ValueError, OverflowError):  # lists of different lengths
        column = None
    if column is None or column.dtype.kind != "i" or column.shape != (len(values),):
        column = np.array([_int(v, default) for v in values], dtype=np.int64)
    return column.astype(np.int64, copy=False)


class _Selection(NamedTuple):
    """What ``_select_events`` finds in the ``traceEvents`` list."""

    #: The X/i events of known categories whose ts (and dur, if any) are numbers.
    events: list[dict[str, Any]]
    kinds: list[int]
    devices: list[int]
    #: Events left out, by category (or "non-object entries").
    skipped: Counter[str]
    #: Events of known categories left out for an unusable value, by what is wrong.
    bad_values: Counter[str]
    #: The profiler span ``(ts, dur)``, None when absent.
    span: Any
    #: The ``Record Window End`` time, None when absent.
    window_end: Any
    #: The counter (``C``) events.
    counters: list[dict[str, Any]]


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def _category_label(category: Any) -> str:
    """An unknown category as the note names it: short, and never a whole container's text."""
    if isinstance(category, (str, int, float)):
        return _shortened(str(category), 40)
    return f"non-text category ({type(category).__name__})"


def _select_events(raw_events: list[Any]) -> _Selection:
    """The X/i events of known categories with numeric times, their kinds and device types."""
    selected: list[dict[str, Any]] = []
    counters: list[dict[str, Any]] = []
    kinds: list[int] = []
    devices: list[int] = []
    skipped: Counter[str] = Counter()
    bad_values: Counter[str] = Counter()
    span: Any = None
    window_end: Any = None
    by_category: dict[Any, tuple[EventKind, DeviceType] | None] = {}
    oom = (EventKind.OUT_OF_MEMORY, DeviceType.CPU)
    for ev in raw_events:
        if type(ev) is not dict:
            skipped["non-object entries"] += 1
            continue
        phase = ev.get("ph")
        if phase not in ("X", "i", "I"):
            if phase == "C":
                counters.append(ev)
            continue
        category = ev.get("cat")
        if category is None:  # global markers: "Iteration Start: ...", "Record Window End"
            if ev.get("name") == WINDOW_END_NAME:
                window_end = ev.get("ts")
            continue
        if category == SPAN_CATEGORY:
            span = (ev.get("ts"), ev.get("dur"))
            continue
        try:
            kind_device = by_category[category]
        except KeyError:
            kind_device = by_category[category] = kind_of_category(category)
        except TypeError:  # an unhashable "cat"
            kind_device = None
        if kind_device is None:
            skipped[_category_label(category)] += 1
            continue
        ts, dur = ev.get("ts"), ev.get("dur", 0.0)  # no dur: an instant
        if type(ts) is not float and not _is_number(ts):  # type(): the common case without a call
            bad_values[_NON_NUMERIC_TS] += 1
            continue
        if type(dur) is not float and not _is_number(dur):
            bad_values[_NON_NUMERIC_DUR] += 1
            continue
        if kind_device[0] == EventKind.MEMORY:
            if ev.get("name") == OUT_OF_MEMORY_EVENT_NAME:
                kind_device = oom
            args = ev.get("args")
            if type(args) is dict and _int(args.get(Arg.DEVICE_TYPE), 0) not in _DEVICE_TYPE_VALUES:
                bad_values[_UNKNOWN_DEVICE_TYPE] += 1  # torch's MPS, XLA, ...: no polyprof DeviceType
                continue
        selected.append(ev)
        kinds.append(int(kind_device[0]))
        devices.append(int(kind_device[1]))
    return _Selection(selected, kinds, devices, skipped, bad_values, span, window_end, counters)


#: Why an event's times cannot be used, as the note says it; ``_time_problems`` gives the index.
_TIME_PROBLEMS = (
    "",
    "a NaN ts or dur",
    "an infinite ts or dur",
    "a negative dur",
    "a ts or dur beyond the int64 nanosecond range",
)
_NAN, _INFINITE, _NEGATIVE, _BEYOND = 1, 2, 3, 4
_NON_NUMERIC_TS = "a ts that is not a number"
_NON_NUMERIC_DUR = "a dur that is not a number"
_UNKNOWN_DEVICE_TYPE = "a memory Device Type polyprof does not know"
_DEVICE_TYPE_VALUES = frozenset(int(device) for device in DeviceType)
#: Largest absolute ns time or duration kept: inside int64 (2**63 ~ 9.223e18) with room for the
#: rounding of doubles and the sums later steps make (start + dur + slack).
_MAX_ABS_NS = 9.2e18


def _float_column(values: list[Any]) -> np.ndarray:
    """Parsed JSON numbers (int, float, Decimal) as float64; integers past the double range as +-max."""
    try:
        return np.asarray(values, dtype=np.float64)
    except (OverflowError, ValueError, TypeError):
        return np.array([_float(v) for v in values], dtype=np.float64)


def _float(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer of 309+ digits (the stdlib parser reads those): finite, but
        return sys.float_info.max if value > 0 else -sys.float_info.max  # beyond any time, not "infinite"
    except (ValueError, TypeError):  # Decimal("sNaN")
        return float("nan")


def _time_problems(ts_us: np.ndarray, dur_us: np.ndarray, base_ns: int) -> np.ndarray:
    """Per event, the index into ``_TIME_PROBLEMS`` of what makes its ``ts``/``dur`` unusable; 0: none.

    Unchecked, NaN and out-of-range doubles become arbitrary int64 nanoseconds and a
    negative duration a wrong self time, all without a word.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        ts_ns, dur_ns = ts_us * 1e3, dur_us * 1e3
        start = ts_ns + float(base_ns)
        in_range = (
            (np.abs(ts_ns) <= _MAX_ABS_NS)
            & (np.abs(dur_ns) <= _MAX_ABS_NS)
            & (np.abs(start) <= _MAX_ABS_NS)
            & (np.abs(start + dur_ns) <= _MAX_ABS_NS)
        )
        problem = np.where(in_range, 0, _BEYOND).astype(np.int8)
        problem[dur_us < 0] = _NEGATIVE
        problem[np.isinf(ts_us) | np.isinf(dur_us)] = _INFINITE
        problem[np.isnan(ts_us) | np.isnan(dur_us)] = _NAN
    return problem


def _count_problems(problem: np.ndarray, into: Counter[str]) -> np.ndarray:
    """Add the problems' counts to ``into``; returns the mask of events without one."""
    for code, count in enumerate(np.bincount(problem, minlength=len(_TIME_PROBLEMS)).tolist()):
        if code and count:
            into[_TIME_PROBLEMS[code]] += count
    return problem == 0


def _usable_time(ts: Any, dur: Any, base_ns: int) -> bool:
    """Whether one ``ts`` (and ``dur``; None: no duration) is a number usable as a time."""
    if not _is_number(ts) or not (dur is None or _is_number(dur)):
        return False
    ts_us = _float_column([ts])
    dur_us = _float_column([0 if dur is None else dur])
    return not _time_problems(ts_us, dur_us, base_ns)[0]


def _counter_rows(
    counters: list[dict[str, Any]], base_ns: int, lanes: Mapping[int, int], bad_values: Counter[str]
) -> EventBatch | None:
    """One ``COUNTER`` row per numeric series of each counter event; None when there are none.

    A counter in a device's process (named "CUDA 0", "GPU 1", ...) gets that
    device's type and index; others stay on the CPU. Series whose value is not
    a number (Perfetto skips those too) are left out; counter events whose
    ``ts`` is not a usable time are counted in ``bad_values`` and left out.
    """
    timed: list[dict[str, Any]] = []
    for ev in counters:
        if type(ev.get("args")) is dict:
            if _is_number(ev.get("ts")):
                timed.append(ev)
            else:
                bad_values[_NON_NUMERIC_TS] += 1
    if timed:
        ts_us = _float_column([ev["ts"] for ev in timed])
        usable = _count_problems(_time_problems(ts_us, np.zeros(len(timed)), base_ns), bad_values)
        timed = list(itertools.compress(timed, usable.tolist()))
    names: list[str] = []
    series: list[str] = []
    values: list[float] = []
    ts: list[Any] = []
    pids: list[int] = []
    tids: list[int] = []
    for ev in timed:
        args, when = ev["args"], ev["ts"]
        name = ev.get("name")
        name = name if isinstance(name, str) else ("" if name is None else str(name))
        pid, tid = _int(ev.get("pid"), 0), _int(ev.get("tid"), 0)
        for key, value in args.items():
            if not _is_number(value):
                continue
            names.append(name)
            series.append(str(key))
            values.append(_float(value))
            ts.append(when)
            pids.append(pid)
            tids.append(tid)
    if not names:
        return None
    pid_column = np.asarray(pids, dtype=np.int64)
    device_type = np.array([lanes.get(p, int(DeviceType.CPU)) for p in pids], dtype=np.int64)
    columns: dict[str, Any] = {
        "kind": np.full(len(names), int(EventKind.COUNTER), dtype=np.int8),
        "start_ns": us_to_ns(ts) + base_ns,
        "dur_ns": np.zeros(len(names), dtype=np.int64),
        "pid": pid_column,
        "tid": np.asarray(tids, dtype=np.int64),
        "device_type": device_type,
        "device_index": np.where(device_type != int(DeviceType.CPU), pid_column, -1),
        "counter_value": np.asarray(values, dtype=np.float64),
        "trace_only": np.ones(len(names), dtype=bool),
    }
    tables: dict[str, tuple[Any, ...]] = {}
    columns["name"], tables["name"] = intern_column(names)
    columns["counter_series"], tables["counter_series"] = intern_column(series)
    return EventBatch.build(SOURCE, columns, tables)


def trace_from_chrome(doc: Mapping[str, Any]) -> Trace:
    """Rebuild a ``Trace`` from a parsed Chrome trace (``load_chrome_trace``'s result).

    Complete and instant events of Kineto's categories become events (kind from
    ``cat``; times back to Unix ns with ``baseTimeNanoseconds``; ``External id``,
    ``Input Dims``, ``Sequence number``, ``Fwd thread id``, memory fields,
    Python ids and the rest of ``args`` kept). Metadata, flows, spans and events
    of unknown categories are not events; how many were skipped is in ``notes``.
    So are events whose values cannot be used: a ``ts`` or ``dur`` that is not a
    number, NaN, infinite, a negative ``dur``, times beyond int64 nanoseconds, and
    memory events of a device type polyprof does not know. They are left out, so
    that the totals of the rest stay right, and counted by kind in a note.
    Columns are built one list comprehension per field, not one dict per event.
    """
    raw_events = doc.get("traceEvents")
    if not isinstance(raw_events, list):
        raise ValueError('not a Chrome trace: "traceEvents" is missing or not a list')
    base_ns = _int(doc.get("baseTimeNanoseconds"), 0)
    selection = _select_events(raw_events)
    events, kind_list, device_list = selection.events, selection.kinds, selection.devices
    bad_values = selection.bad_values
    ts_us = _float_column([ev["ts"] for ev in events])
    dur_us = _float_column([ev.get("dur", 0) for ev in events])
    usable = _count_problems(_time_problems(ts_us, dur_us, base_ns), bad_values)
    if not usable.all():
        kept = usable.tolist()
        events = list(itertools.compress(events, kept))
        kind_list = list(itertools.compress(kind_list, kept))
        device_list = list(itertools.compress(device_list, kept))
        ts_us, dur_us = ts_us[usable], dur_us[usable]
    n = len(events)
    kind = np.asarray(kind_list, dtype=np.int64)
    device_type = np.asarray(device_list, dtype=np.int64)
    on_device = np.isin(kind, kind_codes(DEVICE_KINDS))
    host = ~on_device & ~np.isin(kind, kind_codes(API_CALL_KINDS))
    memory = np.isin(kind, [int(EventKind.MEMORY), int(EventKind.OUT_OF_MEMORY)])

    empty: dict[str, Any] = {}
    args = [a if type(a := ev.get("args")) is dict else empty for ev in events]

    def arg(key: str, default: int) -> np.ndarray:
        return _ints([a.get(key, default) for a in args], default)

    pid = _ints([ev.get("pid", 0) for ev in events], 0)
    tid = _ints([ev.get("tid", 0) for ev in events], 0)
    ext = arg(Arg.EXTERNAL_ID, 0)
    correlation_arg = arg(Arg.CORRELATION, 0)
    # Kineto writes a range's GPU span with the range's id as its "External id" alone; torch
    # hands that id over as the span's correlation id, where polyprof keeps it (nothing launched it)
    gpu_annotation = kind == int(EventKind.GPU_USER_ANNOTATION)
    correlation_arg = np.where(gpu_annotation & (correlation_arg == 0), ext, correlation_arg)
    ext_link = np.where(gpu_annotation, 0, np.maximum(ext, 0))

    # Device lanes: the "device"/"stream" args, else the lane (pid/tid); the
    # device type from the category, else from the lane's process name.
    device_index = np.zeros(n, dtype=np.int64)
    stream = np.full(n, -1, dtype=np.int64)
    lanes: dict[int, int] | None = None
    if on_device.any():
        device_index = np.where(
            on_device, _ints([a.get(Arg.DEVICE, p) for a, p in zip(args, pid.tolist())], 0), 0
        )
        stream = np.where(
            on_device, _ints([a.get(Arg.STREAM, t) for a, t in zip(args, tid.tolist())], -1), -1
        )
        lanes = _device_lanes(raw_events)
        unnamed = on_device & (device_type == int(DeviceType.CPU))
        lane_type = np.array([lanes.get(p, DEFAULT_DEVICE_TYPE) for p in pid.tolist()], dtype=np.int64)
        device_type = np.where(unnamed, lane_type, device_type)
    if memory.any():
        device_index = np.where(memory, arg(Arg.DEVICE_ID, -1), device_index)
        device_type = np.where(memory, arg(Arg.DEVICE_TYPE, int(DeviceType.CPU)), device_type)

    parents = [a.get(Arg.PYTHON_PARENT_ID, -1) for a in args]
    columns: dict[str, Any] = {
        "kind": kind.astype(np.int8),
        "pid": pid,
        "tid": tid,
        "thread": _thread_ids(pid, tid, ts_us, ~on_device),
        "device_type": device_type,
        "device_index": device_index,
        "correlation_id": np.where(host, ext, correlation_arg),
        "external_id": ext,
        "sequence_nr": arg(Arg.SEQUENCE_NUMBER, -1),
        "fwd_thread": arg(Arg.FWD_THREAD_ID, 0),
        "nbytes": arg(Arg.BYTES, 0),
        "total_allocated": arg(Arg.TOTAL_ALLOCATED, 0),
        "total_reserved": arg(Arg.TOTAL_RESERVED, 0),
        "addr": arg(Arg.ADDR, 0),
        "python_id": arg(Arg.PYTHON_ID, -1),
        "python_parent_id": _ints([-1 if p is None else p for p in parents], -1),
        "stream": stream,
    }
    tables: dict[str, tuple[Any, ...]] = {}
    names = [nm if type(nm := ev.get("name")) is str else ("" if nm is None else str(nm)) for ev in events]
    overloads = _split_overloads(names, kind == int(EventKind.CPU_OP))
    columns["name"], tables["name"] = intern_column(names)
    columns["is_async"] = _async_work(columns["name"], tables["name"], kind)
    if overloads is not None:
        columns["overload"], tables["overload"] = intern_column(overloads)
    columns["shapes"], tables["shapes"] = intern_column(
        [_as_tuple(d) if _is_shape_list(d := a.get(Arg.INPUT_DIMS)) else None for a in args]
    )
    columns["stack"], tables["stack"] = intern_column(
        [
            tuple(f for f in c.split(";") if f) if type(c := a.get(Arg.CALL_STACK)) is str and c else None
            for a in args
        ]
    )
    columns["args"], tables["args"] = intern_structured_column(_kept_args(args, on_device, host))

    flows = _flow_index(raw_events)
    if flows:
        try:
            found = [flows.get((ev.get("pid"), ev.get("tid"), ev.get("ts"))) for ev in events]
        except TypeError:  # a pid or tid that is a list or object: rare, so not on the fast path
            found = [None if (key := _flow_key(ev)) is None else flows.get(key) for ev in events]
        columns["flow_id"] = [f[0] if f else 0 for f in found]
        columns["flow_type"] = [f[1] if f else 0 for f in found]
        columns["flow_start"] = [f[2] if f else False for f in found]

    start_ns = us_to_ns(ts_us) + base_ns
    dur_ns = us_to_ns(dur_us)
    dur_ns = np.where(memory, 0, dur_ns)  # instants have no duration
    if gpu_annotation.any():  # undo Kineto's "1 ns earlier, 2 ns longer"
        start_ns = np.where(gpu_annotation, start_ns + 1, start_ns)
        dur_ns = np.where(gpu_annotation, np.maximum(dur_ns - 2, 0), dur_ns)
    columns["start_ns"] = start_ns
    columns["dur_ns"] = dur_ns
    columns["linked_correlation_id"] = _checked_links(  # ids are positive; the tree refuses others
        kind, pid, tid, start_ns, dur_ns, ext_link, np.maximum(correlation_arg, 0), host, on_device
    )
    batch = EventBatch.build(SOURCE, columns, tables)
    counter_batch = (
        _counter_rows(
            selection.counters, base_ns, _device_lanes(raw_events) if lanes is None else lanes, bad_values
        )
        if selection.counters
        else None
    )
    if counter_batch is not None:
        batch = concat([batch, counter_batch], SOURCE)

    properties = doc.get("deviceProperties")
    properties = properties if isinstance(properties, list) else []
    return Trace(
        events=batch,
        config=_config_from(doc, kind, device_type),
        start_ns=_start_ns(selection.span, base_ns, start_ns),
        end_ns=_end_ns(selection.span, selection.window_end, base_ns, start_ns, dur_ns),
        pid=_host_pid(kind, pid),
        hostname=str(doc.get("host_name", "") or ""),
        trace_id=str(doc.get("trace_id", "") or ""),
        metadata_json={str(k): _json_text(v) for k, v in doc.items() if k not in _SKELETON_KEYS},
        device_properties=tuple(p for p in properties if isinstance(p, dict)),
        notes=_skip_notes(selection.skipped, bad_values),
    )


#: How many kinds of skipped events a note lists by name.
_LISTED_KINDS = 10


def _listed(counts: Counter[str]) -> str:
    common = counts.most_common(_LISTED_KINDS)
    listed = ", ".join(f"{count} {what}" for what, count in common)
    if len(counts) > len(common):
        rest = sum(counts.values()) - sum(count for _, count in common)
        listed += f", and {rest} more of {len(counts) - len(common)} other kinds"
    return listed


def _skip_notes(skipped: Counter[str], bad_values: Counter[str]) -> tuple[str, ...]:
    notes = []
    if skipped:
        notes.append(f"chrome trace: skipped events of unknown categories ({_listed(skipped)})")
    if bad_values:
        notes.append(
            f"chrome trace: skipped {sum(bad_values.values())} events with values that cannot be used "
            f"({_listed(Counter({f'with {what}': n for what, n in bad_values.items()}))})"
        )
    return tuple(notes)


def _json_text(value: Any) -> str:
    """``value`` as JSON text; the stdlib writes what orjson refuses (nesting past 254, huge ints)."""
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:
        return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)  # as orjson writes


#: Device kinds that Kineto links through their API call's correlation id.
_LAUNCHED_KINDS = kind_codes({EventKind.KERNEL, EventKind.GPU_MEMCPY, EventKind.GPU_MEMSET, EventKind.SYNC})


def _checked_links(
    kind: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    start_ns: np.ndarray,
    dur_ns: np.ndarray,
    ext: np.ndarray,
    correlation: np.ndarray,
    host: np.ndarray,
    on_device: np.ndarray,
) -> np.ndarray:
    """Each non-host row's ``External id`` where it really names the op that launched it, else 0.

    Some Kineto releases wrote a row's own CUPTI correlation id as its
    ``External id`` when nothing linked it (HTA's sample traces have
    thousands; today's Kineto leaves the key out), and those ids meet torch's
    op ids by accident: taken at face value, a copy issued in ``aten::copy_``
    would count as the Self CUDA of an ``aten::detach`` seconds earlier. torch
    links an API call to the innermost op (not a ``record_function`` range)
    open on the calling thread, so an API call whose ``External id`` is its own
    correlation id keeps it only when that innermost op has this id; a kernel,
    copy, fill or sync with such an id keeps it only when its API call (same
    correlation id) kept the same link. Every other ``External id`` is a link.
    """
    linked = np.where(host, 0, ext)
    if not (linked > 0).any():
        return linked
    calls = np.flatnonzero(~host & ~on_device & (linked > 0) & (linked == correlation))
    if len(calls):
        ops = np.flatnonzero(host & (kind == int(EventKind.CPU_OP)) & (ext > 0))
        # one lane per (process, thread): _OpIndex keys ops by a single thread number
        pairs = np.stack([np.r_[pid[ops], pid[calls]], np.r_[tid[ops], tid[calls]]], axis=1)
        _, lane = np.unique(pairs, axis=0, return_inverse=True)
        lane = lane.reshape(-1).astype(np.int64)
        op_lane, call_lane = lane[: len(ops)], lane[len(ops) :]
        index = _OpIndex(op_lane, start_ns[ops], start_ns[ops] + dur_ns[ops], ext[ops])
        call_start = start_ns[calls]
        innermost = index.innermost_containing(call_lane, call_start, call_start)
        linked[calls[innermost != linked[calls]]] = 0
    launched = np.flatnonzero(
        on_device & np.isin(kind, _LAUNCHED_KINDS) & (linked > 0) & (linked == correlation)
    )
    if len(launched):
        # A device row whose External id is its own correlation id keeps it only where its API
        # call (same correlation id) kept the same link; where two calls share one, a linked
        # call sorts first.
        api = np.flatnonzero(~host & ~on_device & (correlation > 0))
        api = api[np.lexsort((linked[api] == 0, correlation[api]))]
        vouched = np.zeros(len(launched), dtype=bool)
        if len(api):
            pos = np.minimum(np.searchsorted(correlation[api], correlation[launched]), len(api) - 1)
            call = api[pos]
            vouched = (correlation[call] == correlation[launched]) & (linked[call] == linked[launched])
        linked[launched[~vouched]] = 0
    return linked


def _kept_args(args: list[dict[str, Any]], on_device: np.ndarray, host: np.ndarray) -> list[dict[str, Any]]:
    """Each event's args minus the keys the exporter writes from columns ({} when none is left)."""
    drop_host = frozenset(GENERATED_ARG_KEYS["host"])
    drop_device = frozenset(GENERATED_ARG_KEYS["device"])
    drop_call = frozenset(GENERATED_ARG_KEYS["call"])
    drops = [
        drop_device if d else (drop_host if h else drop_call)
        for d, h in zip(on_device.tolist(), host.tolist())
    ]
    return [{k: v for k, v in a.items() if k not in drop} if a else a for a, drop in zip(args, drops)]


def _config_from(doc: Mapping[str, Any], kinds: np.ndarray, device_types: np.ndarray) -> ProfileConfig:
    activities = {ProfilerActivity.CPU}
    on_device = np.isin(kinds, kind_codes(DEVICE_KINDS | API_CALL_KINDS))
    by_value = {int(device): activity for device, activity in _ACTIVITY_BY_DEVICE.items()}
    for dt in np.unique(device_types[on_device]).tolist():
        if dt in by_value:
            activities.add(by_value[dt])

    def flag(key: str) -> bool:
        return _int(doc.get(key), 0) == 1

    # CONFIG_FLAG_KEYS spelled out, so that mypy checks each against its ProfileConfig field
    return ProfileConfig(
        activities=activities,
        trace_id=str(doc.get("trace_id", "") or ""),
        profile_memory=flag("profile_memory"),
        with_stack=flag("with_stack"),
        record_shapes=flag("record_shapes"),
        with_modules=flag("with_modules"),
        with_flops=flag("with_flops"),
    )


def _start_ns(span: tuple[Any, Any] | None, base_ns: int, starts: np.ndarray) -> int:
    if span is not None and _usable_time(span[0], None, base_ns):
        return int(us_to_ns([span[0]])[0]) + base_ns
    return int(starts.min()) if len(starts) else base_ns


def _end_ns(
    span: tuple[Any, Any] | None, window_end: Any, base_ns: int, starts: np.ndarray, durs: np.ndarray
) -> int:
    if span is not None and span[1] is not None and _usable_time(span[0], span[1], base_ns):
        return int(us_to_ns([span[0]])[0] + us_to_ns([span[1]])[0]) + base_ns
    if _usable_time(window_end, None, base_ns):
        return int(us_to_ns([window_end])[0]) + base_ns
    return int((starts + durs).max()) if len(starts) else base_ns


def _host_pid(kinds: np.ndarray, pids: np.ndarray) -> int:
    host = ~np.isin(kinds, kind_codes(DEVICE_KINDS | {EventKind.OVERHEAD}))
    if not host.any():
        return 0
    values, counts = np.unique(pids[host], return_counts=True)
    return int(values[np.argmax(counts)])
