"""Reading Chrome trace JSON files (ours or torch's) back into polyprof.

``load_chrome_trace(path)`` returns the parsed document of a ``.json`` or
``.json.gz`` file and fails with a one-line ``TraceFileError`` naming the path
and what is wrong with it. ``trace_from_chrome(doc)`` rebuilds a ``Trace`` from
the document's complete (``X``) and instant (``i``) events, the reverse of the
"chrome" exporter, so ``polyprof report`` can summarise a saved trace. Counter
events (``C``) come back as ``EventKind.COUNTER`` rows, one per series, kept
for the trace only (``trace_only``: never in ``events()`` or tables).

Times come back exactly to the nanosecond: ``ts`` has three decimals relative
to ``baseTimeNanoseconds``, and the conversion from the parsed double to
integer nanoseconds is done without rounding error (see ``us_to_ns``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import numpy as np
import orjson

from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity
from polyprof.config import ProfileConfig
from polyprof.errors import PolyprofError
from polyprof.events import API_CALL_KINDS, DeviceType, EventBatch, EventKind, concat, kind_codes
from polyprof.trace import CHROME_TRACE_RESERVED_KEYS, CONFIG_FLAG_KEYS, Trace

log = get_logger(__name__)

SOURCE = "chrome_trace"

__all__ = ["TraceFileError", "load_chrome_trace", "read_chrome_trace", "trace_from_chrome", "us_to_ns"]


class TraceFileError(PolyprofError, ValueError):
    """A file is not a readable Chrome trace. ``str(err)`` is ``"<path>: <problem>"``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


# ------------------------------------------------------------------ loading

_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: str) -> bytes:
    if os.path.isdir(path):
        raise TraceFileError(path, "is a directory, not a trace file")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TraceFileError(path, "no such file") from None
    except PermissionError:
        raise TraceFileError(path, "permission denied") from None
    except OSError as exc:
        raise TraceFileError(path, f"cannot read the file ({exc.strerror or exc})") from None


def _gunzip(path: str, data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except EOFError:
        raise TraceFileError(
            path, "truncated gzip data: the file ends before its compressed stream does"
        ) from None
    except (OSError, zlib.error) as exc:
        raise TraceFileError(path, f"corrupt gzip data ({exc})") from None


def _parse_json(path: str, data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    # orjson refuses what the stdlib parser accepts (integers beyond 64 bits,
    # NaN) and its messages are terse: ask the stdlib for a verdict and position.
    text = data.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()):
            raise TraceFileError(
                path, f"truncated JSON: the document ends (line {exc.lineno}) before it is complete"
            ) from None
        raise TraceFileError(
            path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None


def load_chrome_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a Chrome trace file (``.json`` or gzip-compressed ``.json.gz``).

    Returns the top-level object; a file holding a bare array of events (the
    other Chrome trace form) comes back as ``{"traceEvents": [...]}``. Raises
    ``TraceFileError`` for a missing file, a directory, an empty, truncated or
    corrupt file, invalid JSON, or JSON that is not a trace.
    """
    path = os.fspath(path)
    data = _read_bytes(path)
    if not data.strip():
        raise TraceFileError(path, "the file is empty")
    if data[:2] == _GZIP_MAGIC:
        data = _gunzip(path, data)
        if not data.strip():
            raise TraceFileError(path, "the compressed file holds no data")
    doc = _parse_json(path, data)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict):
        raise TraceFileError(
            path,
            f"not a Chrome trace: the top level is a {type(doc).__name__}, expected an object with "
            '"traceEvents" or an array of events',
        )
    if "traceEvents" not in doc:
        keys = ", ".join(sorted(map(str, doc))[:8]) or "none"
        raise TraceFileError(path, f'not a Chrome trace: no "traceEvents" key (top-level keys: {keys})')
    if not isinstance(doc["traceEvents"], list):
        raise TraceFileError(
            path, f'not a Chrome trace: "traceEvents" is a {type(doc["traceEvents"]).__name__}, not a list'
        )
    return doc


def read_chrome_trace(path: str | os.PathLike[str]) -> Trace:
    """``trace_from_chrome(load_chrome_trace(path))``."""
    return trace_from_chrome(load_chrome_trace(path))


# -------------------------------------------------------------- conversion


def us_to_ns(values: Any) -> np.ndarray:
    """Microsecond values parsed as doubles -> int64 nanoseconds, exactly.

    ``ts`` like ``4462594455467.860`` has 16 significant digits: the parsed
    double is the nearest one to the decimal, but ``x * 1000`` rounds again
    and can land on the wrong nanosecond. Splitting the product into an exact
    sum of two doubles (Dekker's two-product, with 1000 exactly representable)
    recovers the nearest integer without that second rounding. Exact for
    values below 2**43 µs (101 days: every ``ts`` relative to a trimonth
    base), where neighbouring doubles are less than 1 ns apart.
    """
    x = np.asarray(values, dtype=np.float64)
    product = x * 1000.0
    split = x * 134217729.0  # 2**27 + 1: Veltkamp split of x into hi + lo
    hi = split - (split - x)
    lo = x - hi
    error = (hi * 1000.0 - product) + lo * 1000.0  # product + error == x * 1000 exactly
    nearest = np.rint(product)
    residual = (product - nearest) + error
    nearest = nearest + (residual > 0.5) - (residual < -0.5)
    return nearest.astype(np.int64)


_KIND_BY_CATEGORY: dict[str, EventKind] = {
    "cpu_op": EventKind.CPU_OP,
    "operator": EventKind.CPU_OP,  # older Kineto spelling
    "user_annotation": EventKind.USER_ANNOTATION,
    "python_function": EventKind.PYTHON_FUNCTION,
    "cpu_instant_event": EventKind.MEMORY,
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.GPU_MEMCPY,
    "gpu_memset": EventKind.GPU_MEMSET,
    "gpu_user_annotation": EventKind.GPU_USER_ANNOTATION,
    "overhead": EventKind.OVERHEAD,
}
_KIND_BY_SUFFIX = {"_runtime": EventKind.RUNTIME, "_driver": EventKind.DRIVER, "_sync": EventKind.SYNC}
_DEVICE_BY_PREFIX = {
    "cuda": DeviceType.CUDA,
    "xpu": DeviceType.XPU,
    "privateuse1": DeviceType.PrivateUse1,
    "mtia": DeviceType.MTIA,
    "hpu": DeviceType.HPU,
}
_DEVICE_KINDS = frozenset(
    {
        EventKind.KERNEL,
        EventKind.GPU_MEMCPY,
        EventKind.GPU_MEMSET,
        EventKind.GPU_USER_ANNOTATION,
        EventKind.SYNC,
    }
)
_ACTIVITY_BY_DEVICE = {
    DeviceType.CUDA: ProfilerActivity.CUDA,
    DeviceType.HIP: ProfilerActivity.CUDA,
    DeviceType.XPU: ProfilerActivity.XPU,
    DeviceType.HPU: ProfilerActivity.HPU,
    DeviceType.MTIA: ProfilerActivity.MTIA,
    DeviceType.PrivateUse1: ProfilerActivity.PrivateUse1,
}
_FLOW_TYPES = {"fwdbwd": 1, "ac2g": 2}
#: Number types a parsed ``ts``/``dur`` may have (Decimal: ``json.load(parse_float=Decimal)``).
_NUMBER = (int, float, Decimal)
_OOM_NAME = "[OutOfMemory]"
#: Keys the exporter writes from columns, so they leave the kept args fragment.
_GENERATED_KEYS = {
    "host": ("External id",),
    "device": ("External id", "device", "stream", "correlation"),
    "call": ("External id", "correlation"),
}
_FLAG_KEYS = CONFIG_FLAG_KEYS
_SKELETON_KEYS = CHROME_TRACE_RESERVED_KEYS | {"trace_id", "host_name", *CONFIG_FLAG_KEYS}


def _kind_of(category: Any) -> tuple[EventKind, DeviceType] | None:
    """(kind, device type) of a Chrome trace category, None when not one of Kineto's."""
    if not isinstance(category, str):
        return None
    kind = _KIND_BY_CATEGORY.get(category)
    if kind is not None:
        return kind, DeviceType.CPU
    for suffix, kind in _KIND_BY_SUFFIX.items():
        if category.endswith(suffix):
            device = _DEVICE_BY_PREFIX.get(category[: -len(suffix)], DeviceType.CUDA)
            return kind, device
    return None


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


def _as_tuple(value: Any) -> Any:
    """Parsed ``Input Dims`` as hashable nested tuples (interned shapes)."""
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    if isinstance(value, dict):  # not a shape; keep it hashable
        return orjson.dumps(value, default=str).decode()
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


def _intern(values: list[Any]) -> tuple[list[int], list[Any]]:
    """Indices into a table of unique values (``None`` -> -1), in order of first appearance."""
    lookup: dict[Any, int] = {}
    setdefault = lookup.setdefault
    indices = [-1 if v is None else setdefault(v, len(lookup)) for v in values]
    return indices, list(lookup)


_DEVICE_BY_LANE_LABEL = {
    "CUDA": DeviceType.CUDA,
    "GPU": DeviceType.CUDA,
    "HIP": DeviceType.HIP,
    "XPU": DeviceType.XPU,
    "MTIA": DeviceType.MTIA,
    "HPU": DeviceType.HPU,
    "PrivateUse1": DeviceType.PrivateUse1,
}


def _device_lanes(events: list[Any]) -> dict[int, int]:
    """Device lane pid -> DeviceType, from the lane's name or label ("CUDA 0", "XPU 1", "GPU 0")."""
    lanes: dict[int, int] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "M" or not isinstance(ev.get("pid"), int):
            continue
        if ev.get("name") not in ("process_name", "process_labels"):
            continue
        args = ev.get("args")
        label = args.get("name", args.get("labels")) if isinstance(args, dict) else None
        if not isinstance(label, str):
            continue
        device = _DEVICE_BY_LANE_LABEL.get(label.split(" ", 1)[0])
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
        flow_type = _FLOW_TYPES.get(ev.get("cat"))
        if flow_type is None:
            continue
        flows[(ev.get("pid"), ev.get("tid"), ev.get("ts"))] = (_int(ev.get("id")), flow_type, ph == "s")
    return flows


def _ints(values: list[Any], default: int) -> np.ndarray:
    """An int64 column from parsed JSON values; odd ones (null, text, floats) one by one."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_int(v, default) for v in values], dtype=np.int64)


def _select_events(
    raw_events: list[Any],
) -> tuple[list[dict[str, Any]], list[int], list[int], Counter[str], Any, Any, list[dict[str, Any]]]:
    """The X/i events of known categories, their kinds and device types.

    Also returns the skipped categories, the profiler span ``(ts, dur)``, the
    ``Record Window End`` time and the counter (``C``) events.
    """
    selected: list[dict[str, Any]] = []
    counters: list[dict[str, Any]] = []
    kinds: list[int] = []
    devices: list[int] = []
    skipped: Counter[str] = Counter()
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
            if ev.get("name") == "Record Window End":
                window_end = ev.get("ts")
            continue
        if category == "Trace":
            span = (ev.get("ts"), ev.get("dur"))
            continue
        if not isinstance(ev.get("ts"), _NUMBER):
            skipped["events without a numeric ts"] += 1
            continue
        try:
            kind_device = by_category[category]
        except KeyError:
            kind_device = by_category[category] = _kind_of(category)
        except TypeError:  # an unhashable "cat"
            kind_device = None
        if kind_device is None:
            skipped[str(category)] += 1
            continue
        if kind_device[0] == EventKind.MEMORY and ev.get("name") == _OOM_NAME:
            kind_device = oom
        selected.append(ev)
        kinds.append(int(kind_device[0]))
        devices.append(int(kind_device[1]))
    return selected, kinds, devices, skipped, span, window_end, counters


def _counter_rows(
    counters: list[dict[str, Any]], base_ns: int, lanes: Mapping[int, int]
) -> EventBatch | None:
    """One ``COUNTER`` row per numeric series of each counter event; None when there are none.

    A counter in a device's process (named "CUDA 0", "GPU 1", ...) gets that
    device's type and index; others stay on the CPU. Series whose value is not
    a number (Perfetto skips those too) are left out.
    """
    names: list[str] = []
    series: list[str] = []
    values: list[float] = []
    ts: list[Any] = []
    pids: list[int] = []
    tids: list[int] = []
    for ev in counters:
        args, when = ev.get("args"), ev.get("ts")
        if type(args) is not dict or not isinstance(when, _NUMBER):
            continue
        name = ev.get("name")
        name = name if isinstance(name, str) else ("" if name is None else str(name))
        pid, tid = _int(ev.get("pid"), 0), _int(ev.get("tid"), 0)
        for key, value in args.items():
            if isinstance(value, bool) or not isinstance(value, _NUMBER):
                continue
            names.append(name)
            series.append(str(key))
            values.append(float(value))
            ts.append(when)
            pids.append(pid)
            tids.append(tid)
    if not names:
        return None
    pid = np.asarray(pids, dtype=np.int64)
    device_type = np.array([lanes.get(p, int(DeviceType.CPU)) for p in pids], dtype=np.int64)
    columns: dict[str, Any] = {
        "kind": np.full(len(names), int(EventKind.COUNTER), dtype=np.int8),
        "start_ns": us_to_ns(ts) + base_ns,
        "dur_ns": np.zeros(len(names), dtype=np.int64),
        "pid": pid,
        "tid": np.asarray(tids, dtype=np.int64),
        "device_type": device_type,
        "device_index": np.where(device_type != int(DeviceType.CPU), pid, -1),
        "counter_value": np.asarray(values, dtype=np.float64),
        "trace_only": np.ones(len(names), dtype=bool),
    }
    tables: dict[str, list[Any]] = {}
    columns["name"], tables["name"] = _intern(names)
    columns["counter_series"], tables["counter_series"] = _intern(series)
    return EventBatch.build(SOURCE, columns, tables)


def trace_from_chrome(doc: Mapping[str, Any]) -> Trace:
    """Rebuild a ``Trace`` from a parsed Chrome trace (``load_chrome_trace``'s result).

    Complete and instant events of Kineto's categories become events (kind from
    ``cat``; times back to Unix ns with ``baseTimeNanoseconds``; ``External id``,
    ``Input Dims``, ``Sequence number``, ``Fwd thread id``, memory fields,
    Python ids and the rest of ``args`` kept). Metadata, flows, spans and events
    of unknown categories are not events; how many were skipped is in ``notes``.
    Columns are built one list comprehension per field, not one dict per event.
    """
    raw_events = doc.get("traceEvents")
    if not isinstance(raw_events, list):
        raise ValueError('not a Chrome trace: "traceEvents" is missing or not a list')
    base_ns = _int(doc.get("baseTimeNanoseconds"), 0)
    events, kind_list, device_list, skipped, span, window_end, counters = _select_events(raw_events)
    n = len(events)
    kind = np.asarray(kind_list, dtype=np.int64)
    device_type = np.asarray(device_list, dtype=np.int64)
    on_device = np.isin(kind, [int(k) for k in _DEVICE_KINDS])
    host = ~on_device & ~np.isin(kind, kind_codes(API_CALL_KINDS))
    memory = np.isin(kind, [int(EventKind.MEMORY), int(EventKind.OUT_OF_MEMORY)])

    empty: dict[str, Any] = {}
    args = [a if type(a := ev.get("args")) is dict else empty for ev in events]

    def arg(key: str, default: int) -> np.ndarray:
        return _ints([a.get(key, default) for a in args], default)

    pid = _ints([ev.get("pid", 0) for ev in events], 0)
    tid = _ints([ev.get("tid", 0) for ev in events], 0)
    ext = arg("External id", 0)
    correlation_arg = arg("correlation", 0)

    # Device lanes: the "device"/"stream" args, else the lane (pid/tid); the
    # device type from the category, else from the lane's process name.
    device_index = np.zeros(n, dtype=np.int64)
    stream = np.full(n, -1, dtype=np.int64)
    lanes: dict[int, int] | None = None
    if on_device.any():
        device_index = np.where(
            on_device, _ints([a.get("device", p) for a, p in zip(args, pid.tolist())], 0), 0
        )
        stream = np.where(on_device, _ints([a.get("stream", t) for a, t in zip(args, tid.tolist())], -1), -1)
        lanes = _device_lanes(raw_events)
        unnamed = on_device & (device_type == int(DeviceType.CPU))
        lane_type = np.array([lanes.get(p, int(DeviceType.CUDA)) for p in pid.tolist()], dtype=np.int64)
        device_type = np.where(unnamed, lane_type, device_type)
    if memory.any():
        device_index = np.where(memory, arg("Device Id", -1), device_index)
        device_type = np.where(memory, arg("Device Type", int(DeviceType.CPU)), device_type)

    parents = [a.get("Python parent id", -1) for a in args]
    columns: dict[str, Any] = {
        "kind": kind.astype(np.int8),
        "pid": pid,
        "tid": tid,
        "thread": arg("Python thread", 0),
        "device_type": device_type,
        "device_index": device_index,
        "correlation_id": np.where(host, ext, correlation_arg),
        "external_id": ext,
        "sequence_nr": arg("Sequence number", -1),
        "fwd_thread": arg("Fwd thread id", 0),
        "nbytes": arg("Bytes", 0),
        "total_allocated": arg("Total Allocated", 0),
        "total_reserved": arg("Total Reserved", 0),
        "addr": arg("Addr", 0),
        "python_id": arg("Python id", -1),
        "python_parent_id": _ints([-1 if p is None else p for p in parents], -1),
        "stream": stream,
    }
    tables: dict[str, list[Any]] = {}
    names = [nm if type(nm := ev.get("name")) is str else ("" if nm is None else str(nm)) for ev in events]
    overloads = _split_overloads(names, kind == int(EventKind.CPU_OP))
    columns["name"], tables["name"] = _intern(names)
    if overloads is not None:
        columns["overload"], tables["overload"] = _intern(overloads)
    columns["shapes"], tables["shapes"] = _intern(
        [_as_tuple(d) if type(d := a.get("Input Dims")) is list and d else None for a in args]
    )
    columns["stack"], tables["stack"] = _intern(
        [
            tuple(f for f in c.split(";") if f) if type(c := a.get("Call stack")) is str and c else None
            for a in args
        ]
    )
    columns["args"], tables["args"] = _intern(_kept_fragments(args, on_device, host))

    flows = _flow_index(raw_events)
    if flows:
        found = [flows.get((ev.get("pid"), ev.get("tid"), ev.get("ts"))) for ev in events]
        columns["flow_id"] = [f[0] if f else 0 for f in found]
        columns["flow_type"] = [f[1] if f else 0 for f in found]
        columns["flow_start"] = [f[2] if f else False for f in found]

    start_ns = us_to_ns([ev["ts"] for ev in events]) + base_ns if n else np.zeros(0, dtype=np.int64)
    dur_ns = (
        np.maximum(us_to_ns([d if isinstance(d := ev.get("dur", 0), _NUMBER) else 0 for ev in events]), 0)
        if n
        else np.zeros(0, dtype=np.int64)
    )
    dur_ns = np.where(memory, 0, dur_ns)  # instants have no duration
    gpu_annotation = kind == int(EventKind.GPU_USER_ANNOTATION)
    if gpu_annotation.any():  # undo Kineto's "1 ns earlier, 2 ns longer"
        start_ns = np.where(gpu_annotation, start_ns + 1, start_ns)
        dur_ns = np.where(gpu_annotation, np.maximum(dur_ns - 2, 0), dur_ns)
    columns["start_ns"] = start_ns
    columns["dur_ns"] = dur_ns
    columns["linked_correlation_id"] = _checked_links(
        kind, pid, tid, start_ns, dur_ns, ext, correlation_arg, host, on_device
    )
    batch = EventBatch.build(SOURCE, columns, tables)
    counter_batch = (
        _counter_rows(counters, base_ns, _device_lanes(raw_events) if lanes is None else lanes)
        if counters
        else None
    )
    if counter_batch is not None:
        batch = concat([batch, counter_batch], SOURCE)

    notes: list[str] = []
    if skipped:
        listed = ", ".join(f"{count} {cat}" for cat, count in skipped.most_common())
        notes.append(f"chrome trace: skipped events of unknown categories ({listed})")
    return Trace(
        events=batch,
        config=_config_from(doc, kind, device_type),
        start_ns=_start_ns(span, base_ns, start_ns),
        end_ns=_end_ns(span, window_end, base_ns, start_ns, dur_ns),
        pid=_host_pid(kind, pid),
        hostname=str(doc.get("host_name", "") or ""),
        trace_id=str(doc.get("trace_id", "") or ""),
        metadata_json={
            str(k): orjson.dumps(v, default=str).decode() for k, v in doc.items() if k not in _SKELETON_KEYS
        },
        device_properties=tuple(p for p in (doc.get("deviceProperties") or ()) if isinstance(p, dict)),
        notes=tuple(notes),
    )


#: Device kinds that Kineto links through their API call's correlation id.
_LAUNCHED_KINDS = kind_codes({EventKind.KERNEL, EventKind.GPU_MEMCPY, EventKind.GPU_MEMSET, EventKind.SYNC})
#: Host rows an API call can be linked to (torch pushes their ids as external correlation ids).
_LAUNCHER_KINDS = kind_codes({EventKind.CPU_OP, EventKind.USER_ANNOTATION})
#: How far a call may seem to stick out of the op that holds it: older Kineto truncated ``ts``
#: and ``dur`` to whole microseconds separately, and ops and API calls come from two clocks.
_SLACK_NS = 1_000


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

    torch links an API call to the innermost op open on the calling thread, so a
    true link names an op of the same process and thread whose interval holds
    the call's start. Some Kineto releases wrote a device row's own CUPTI
    correlation id as its ``External id`` when nothing linked it (HTA's sample
    traces have thousands), and those ids meet torch's op ids by accident: taken
    at face value, a copy issued in ``aten::copy_`` would count as the Self CUDA
    of an ``aten::detach`` seconds earlier. So an API call keeps its link only
    when that op holds it; a kernel, copy, fill or sync follows the API call with
    its correlation id, and without one keeps an id that is not its own
    correlation id. GPU annotations and other rows keep theirs.
    """
    linked = np.where(host, 0, ext)
    if not (linked > 0).any():
        return linked
    ops = np.flatnonzero(host & np.isin(kind, _LAUNCHER_KINDS) & (ext > 0))
    ops = ops[np.argsort(ext[ops], kind="stable")]
    op_ids = ext[ops]
    calls = np.flatnonzero(~host & ~on_device & (linked > 0))
    held = np.zeros(len(calls), dtype=bool)
    lo = np.searchsorted(op_ids, linked[calls], side="left")
    hi = np.searchsorted(op_ids, linked[calls], side="right")
    for k in range(int((hi - lo).max()) if len(calls) else 0):  # ops sharing an id: rare, few
        has = lo + k < hi
        op = ops[np.minimum(lo + k, len(ops) - 1)]
        call_start = start_ns[calls]
        held |= (
            has
            & (pid[op] == pid[calls])
            & (tid[op] == tid[calls])
            & (start_ns[op] - _SLACK_NS <= call_start)
            & (call_start <= start_ns[op] + dur_ns[op] + _SLACK_NS)
        )
    linked[calls[~held]] = 0
    launched = np.flatnonzero(on_device & np.isin(kind, _LAUNCHED_KINDS) & (linked > 0))
    if len(launched):
        # Every API call with a correlation id vouches for its device rows, linked or not; where
        # two share one, a linked call sorts first.
        api = np.flatnonzero(~host & ~on_device & (correlation > 0))
        api = api[np.lexsort((linked[api] == 0, correlation[api]))]
        api_corr = correlation[api]
        pos = np.minimum(np.searchsorted(api_corr, correlation[launched]), max(len(api) - 1, 0))
        found = api_corr[pos] == correlation[launched] if len(api) else np.zeros(len(launched), dtype=bool)
        own_id = linked[launched] == correlation[launched]
        if len(api):
            linked[launched] = np.where(found, linked[api[pos]], np.where(own_id, 0, linked[launched]))
        else:
            linked[launched] = np.where(own_id, 0, linked[launched])
    return linked


def _kept_fragments(args: list[dict[str, Any]], on_device: np.ndarray, host: np.ndarray) -> list[str | None]:
    """Each event's args minus the keys the exporter writes from columns, as JSON body text."""
    drop_host = frozenset(_GENERATED_KEYS["host"])
    drop_device = frozenset(_GENERATED_KEYS["device"])
    drop_call = frozenset(_GENERATED_KEYS["call"])
    drops = [
        drop_device if d else (drop_host if h else drop_call)
        for d, h in zip(on_device.tolist(), host.tolist())
    ]
    dumps = orjson.dumps
    kept = [{k: v for k, v in a.items() if k not in drop} if a else None for a, drop in zip(args, drops)]
    return [dumps(k, default=str).decode()[1:-1] if k else None for k in kept]


def _config_from(doc: Mapping[str, Any], kinds: np.ndarray, device_types: np.ndarray) -> ProfileConfig:
    activities = {ProfilerActivity.CPU}
    on_device = np.isin(kinds, kind_codes(_DEVICE_KINDS | API_CALL_KINDS))
    by_value = {int(device): activity for device, activity in _ACTIVITY_BY_DEVICE.items()}
    for dt in np.unique(device_types[on_device]).tolist():
        if dt in by_value:
            activities.add(by_value[dt])
    flags = {flag: _int(doc.get(flag), 0) == 1 for flag in _FLAG_KEYS}
    return ProfileConfig(activities=activities, trace_id=str(doc.get("trace_id", "") or ""), **flags)


def _start_ns(span: tuple[Any, Any] | None, base_ns: int, starts: np.ndarray) -> int:
    if span is not None and isinstance(span[0], _NUMBER):
        return int(us_to_ns([span[0]])[0]) + base_ns
    return int(starts.min()) if len(starts) else base_ns


def _end_ns(
    span: tuple[Any, Any] | None, window_end: Any, base_ns: int, starts: np.ndarray, durs: np.ndarray
) -> int:
    if span is not None and isinstance(span[0], _NUMBER) and isinstance(span[1], _NUMBER):
        return int(us_to_ns([span[0]])[0] + us_to_ns([span[1]])[0]) + base_ns
    if isinstance(window_end, _NUMBER):
        return int(us_to_ns([window_end])[0]) + base_ns
    return int((starts + durs).max()) if len(starts) else base_ns


def _host_pid(kinds: np.ndarray, pids: np.ndarray) -> int:
    host = ~np.isin(kinds, [int(k) for k in _DEVICE_KINDS | {EventKind.OVERHEAD}])
    if not host.any():
        return 0
    values, counts = np.unique(pids[host], return_counts=True)
    return int(values[np.argmax(counts)])
