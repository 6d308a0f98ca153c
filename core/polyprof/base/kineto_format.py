"""The Chrome trace format as torch's Kineto writes it: one definition for polyprof's writer and reader.

The "chrome" exporter (``polyprof.runtime.chrome_trace``) writes this format
and ``polyprof report`` (``polyprof.formats.chrome_reader``) reads it back; tracers
that need Kineto's names (activity types, categories) take them from here
too. This module holds:

* the categories (``cat``) of each ``EventKind`` and their reverse, the
  device-specific ones ("<device>_runtime", ...), the device lanes' names, and
  which kinds sit on a device lane;
* the flow categories (``fwdbwd``, ``ac2g``) and their ``flow_type`` codes;
* the names of the args keys (``Arg``) and which of them the writer generates
  from columns (``GENERATED_ARG_KEYS``);
* Kineto's time encoding (``baseTimeNanoseconds`` on a trimonth boundary,
  microseconds with three decimals: ``format_us`` / ``us_to_ns``);
* the layout of each torch release's writer (``KinetoLayout``);
* the ``args`` column of ``polyprof.base.events``: what a tracer puts there and how
  it becomes JSON (``encode_args_table``).

The ``args`` column
-------------------
Each event's extra args, written after the keys the exporter generates from
the columns (``External id``, ``correlation``, ...). A tracer puts one of these
in the column's table:

* a mapping of str keys to JSON values (str, int, float, bool, None, lists or
  tuples, dicts): the way for tracers. Only the exporter turns it into JSON,
  with Kineto's separators (``", "``, ``": "``). NaN and infinities (not JSON)
  are written ``null``; other values are written as their ``str``.
  ``polyprof.base.events.intern_structured_column`` interns such values.
* ``KinetoArgsText``: Kineto's own text for the event (what
  ``_KinetoEvent``/activity ``metadata_json()`` returns), made by
  ``kineto_args_column``, which checks it once and repairs what Kineto wrote
  broken. It is written as Kineto wrote it, so polyprof's args are torch's
  byte for byte.
* a str holding a JSON object body (``'"Input Dims": [[2, 3]]'``): accepted
  from tracers written before the structured form, checked and repaired as
  ``kineto_args_column`` does it, each time a trace is written. New tracers put
  mappings.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import orjson

from polyprof.base import torch_support
from polyprof.base.activity import DEVICES
from polyprof.base.events import HOST_KINDS, DeviceType, EventKind, intern_column
from polyprof.base.log import get_logger

log = get_logger(__name__)

# ------------------------------------------------------------- categories

#: Kineto's category (``cat``, and ``FunctionEvent.activity_type``) of each kind whose category
#: does not depend on the device; runtime, driver and sync calls are "<device>_<suffix>".
CATEGORY_BY_KIND: dict[EventKind, str] = {
    EventKind.CPU_OP: "cpu_op",
    EventKind.USER_ANNOTATION: "user_annotation",
    EventKind.PYTHON_FUNCTION: "python_function",
    EventKind.MEMORY: "cpu_instant_event",
    EventKind.OUT_OF_MEMORY: "cpu_instant_event",
    EventKind.KERNEL: "kernel",
    EventKind.GPU_MEMCPY: "gpu_memcpy",
    EventKind.GPU_MEMSET: "gpu_memset",
    EventKind.GPU_USER_ANNOTATION: "gpu_user_annotation",
    EventKind.OVERHEAD: "overhead",
}
#: Kinds whose category is "<device prefix>_<suffix>" (cuda_runtime, xpu_sync, ...).
DEVICE_CATEGORY_SUFFIX: dict[EventKind, str] = {
    EventKind.RUNTIME: "runtime",
    EventKind.DRIVER: "driver",
    EventKind.SYNC: "sync",
}
#: DeviceType -> (prefix of its categories such as "cuda_runtime", name of its lanes: "CUDA 0"),
#: from ``polyprof.base.activity.DEVICES`` (ROCm's HIP keeps the cuda_* categories).
DEVICE_NAMES: dict[int, tuple[str, str]] = {
    int(d.device_type): (d.category_prefix, d.lane_name) for d in DEVICES
}
#: The device assumed where nothing names one (a runtime call without device activity): the
#: first of ``DEVICES``, CUDA.
DEFAULT_DEVICE_TYPE = int(DEVICES[0].device_type)
#: The ``process_labels`` of CUDA and HIP lanes: "GPU 0" (other devices: their lane name).
GPU_LANE_LABEL = "GPU"
GPU_LANE_NAMES = frozenset(d.lane_name for d in DEVICES if d.lane_label == GPU_LANE_LABEL)

#: Kinds drawn on a device lane: pid = device index, tid = stream / queue.
DEVICE_KINDS = frozenset(
    {
        EventKind.KERNEL,
        EventKind.GPU_MEMCPY,
        EventKind.GPU_MEMSET,
        EventKind.GPU_USER_ANNOTATION,
        EventKind.SYNC,
    }
)
#: Categories of the host events torch's collector lists in ``events()`` (its writer files them so).
HOST_CATEGORIES = frozenset(CATEGORY_BY_KIND[kind] for kind in HOST_KINDS if kind in CATEGORY_BY_KIND)
#: Kineto's older spelling of "cpu_op", still read.
LEGACY_CATEGORIES: dict[str, EventKind] = {"operator": EventKind.CPU_OP}


def device_names(device_type: int) -> tuple[str, str]:
    """(category prefix, lane name) of a DeviceType value; CUDA's for one Kineto has no name for."""
    return DEVICE_NAMES.get(int(device_type), DEVICE_NAMES[DEFAULT_DEVICE_TYPE])


def category_of(kind: EventKind, device_type: int = DEFAULT_DEVICE_TYPE) -> str | None:
    """The ``cat`` Kineto writes for ``kind`` (``device_type`` names the device of runtime calls);
    None for counter rows, which have none."""
    suffix = DEVICE_CATEGORY_SUFFIX.get(kind)
    if suffix is not None:
        return f"{device_names(device_type)[0]}_{suffix}"
    return CATEGORY_BY_KIND.get(kind)


def kind_by_activity_type(device_type: int) -> dict[str, EventKind]:
    """Kineto's activity type -> kind, for the rows of one device (``"cuda_runtime"`` -> RUNTIME, ...)."""
    kinds = DEVICE_KINDS | set(DEVICE_CATEGORY_SUFFIX) | {EventKind.OVERHEAD}
    return {category_of(kind, device_type) or "": kind for kind in EventKind if kind in kinds}


#: Category -> kind, for the categories that name no device.
KIND_BY_CATEGORY: dict[str, EventKind] = {
    # "cpu_instant_event" reads as MEMORY; the reader tells out-of-memory instants by their name
    **{cat: kind for kind, cat in reversed(CATEGORY_BY_KIND.items())},
    **LEGACY_CATEGORIES,
}
#: Category prefix -> DeviceType (the first device with that prefix: "cuda" is CUDA, not HIP).
DEVICE_BY_PREFIX: dict[str, DeviceType] = {}
#: First word of a device lane's ``process_name`` or ``process_labels`` -> DeviceType (a label
#: several devices share, "GPU", is the first one's: CUDA).
DEVICE_BY_LANE_LABEL: dict[str, DeviceType] = {}
for _row in DEVICES:
    DEVICE_BY_PREFIX.setdefault(_row.category_prefix, _row.device_type)
    DEVICE_BY_LANE_LABEL.setdefault(_row.lane_name, _row.device_type)
    DEVICE_BY_LANE_LABEL.setdefault(_row.lane_label, _row.device_type)
del _row


def kind_of_category(category: Any) -> tuple[EventKind, DeviceType] | None:
    """(kind, device type) of a ``cat``; None when it is not one of Kineto's event categories."""
    if not isinstance(category, str):
        return None
    kind = KIND_BY_CATEGORY.get(category)
    if kind is not None:
        return kind, DeviceType.CPU
    for kind, suffix in DEVICE_CATEGORY_SUFFIX.items():
        if category.endswith("_" + suffix):
            return kind, DEVICE_BY_PREFIX.get(category[: -len(suffix) - 1], DeviceType(DEFAULT_DEVICE_TYPE))
    return None


#: Names torch's collector gives its memory events; Kineto writes both as "cpu_instant_event".
MEMORY_EVENT_NAME = "[memory]"
OUT_OF_MEMORY_EVENT_NAME = "[OutOfMemory]"

#: Metadata events (``"ph": "M"``) that name and order the processes (lanes) and threads.
PROCESS_NAME = "process_name"
PROCESS_LABELS = "process_labels"
PROCESS_SORT_INDEX = "process_sort_index"
THREAD_NAME = "thread_name"
THREAD_SORT_INDEX = "thread_sort_index"

#: The top-level key of a trace ``polyprof merge`` wrote: the ranks it holds and their sources.
MERGE_KEY = "polyprofMerge"

#: The profiler span (category "Trace") and the global instants around the events.
SPAN_CATEGORY = "Trace"
SPAN_NAME = "PyTorch Profiler (0)"
ITERATION_START_NAME = "Iteration Start: PyTorch Profiler"
WINDOW_END_NAME = "Record Window End"

# ------------------------------------------------------------------ flows

FLOW_FWDBWD = 1
FLOW_AC2G = 2
#: ``flow_type`` column value -> the flow's ``cat`` (and ``name``).
FLOW_CATEGORY_BY_TYPE: dict[int, str] = {FLOW_FWDBWD: "fwdbwd", FLOW_AC2G: "ac2g"}
FLOW_TYPE_BY_CATEGORY: dict[str, int] = {cat: code for code, cat in FLOW_CATEGORY_BY_TYPE.items()}

# ------------------------------------------------------------- args keys


class Arg:
    """The args keys Kineto writes (and polyprof's writer and reader use)."""

    EXTERNAL_ID = "External id"
    RECORD_FUNCTION_ID = "Record function id"
    SEQUENCE_NUMBER = "Sequence number"
    FWD_THREAD_ID = "Fwd thread id"
    INPUT_DIMS = "Input Dims"
    CALL_STACK = "Call stack"
    EV_IDX = "Ev Idx"
    FINISHED = "finished"
    TOTAL_RESERVED = "Total Reserved"
    TOTAL_ALLOCATED = "Total Allocated"
    BYTES = "Bytes"
    DEVICE_ID = "Device Id"
    DEVICE_TYPE = "Device Type"
    ADDR = "Addr"
    PYTHON_THREAD = "Python thread"
    PYTHON_PARENT_ID = "Python parent id"
    PYTHON_ID = "Python id"
    DEVICE = "device"
    STREAM = "stream"
    CORRELATION = "correlation"
    OP_COUNT = "Op count"
    #: polyprof's: the text of args that were not JSON and could not be repaired, kept as one string.
    INVALID_JSON = "Args (invalid JSON)"


#: Keys the writer generates from columns, by kind of event: host events (ops, annotations,
#: memory, Python), device activity, and runtime / driver calls. A reader leaves them out of
#: the args it keeps (the columns hold them), so that writing again does not repeat them.
GENERATED_ARG_KEYS: dict[str, tuple[str, ...]] = {
    "host": (Arg.EXTERNAL_ID,),
    "device": (Arg.EXTERNAL_ID, Arg.DEVICE, Arg.STREAM, Arg.CORRELATION),
    "call": (Arg.EXTERNAL_ID, Arg.CORRELATION),
}
#: Keys of a memory event's standard args, in Kineto's order.
MEMORY_ARG_KEYS = (
    Arg.TOTAL_RESERVED,
    Arg.TOTAL_ALLOCATED,
    Arg.BYTES,
    Arg.DEVICE_ID,
    Arg.DEVICE_TYPE,
    Arg.ADDR,
    Arg.FINISHED,
    Arg.EV_IDX,
)
#: Keys of an out-of-memory event's standard args, in Kineto's order.
OUT_OF_MEMORY_ARG_KEYS = (
    Arg.DEVICE_TYPE,
    Arg.DEVICE_ID,
    Arg.BYTES,
    Arg.TOTAL_ALLOCATED,
    Arg.TOTAL_RESERVED,
    Arg.EV_IDX,
)
#: Kinds that carry an "Ev Idx" (host events recorded by torch's collector), by numbering group:
#: torch numbers ops and annotations first, then memory events, then Python functions.
EV_IDX_GROUP: dict[EventKind, int] = {
    EventKind.CPU_OP: 0,
    EventKind.USER_ANNOTATION: 0,
    EventKind.MEMORY: 1,
    EventKind.OUT_OF_MEMORY: 1,
    EventKind.PYTHON_FUNCTION: 2,
}
#: The args key of a counter row that names no series (a Chrome counter event needs one).
DEFAULT_COUNTER_SERIES = "value"

# ------------------------------------------------------------------- time

#: libkineto's ChromeTraceBaseTime interval (about three months), in seconds.
TRIMONTH_SECONDS = 7889238


def trimonth_base_ns(unix_ns: int) -> int:
    """Kineto's ``baseTimeNanoseconds``: ``unix_ns`` floored to a 7889238-second boundary."""
    seconds = unix_ns // 1_000_000_000
    return (seconds // TRIMONTH_SECONDS) * TRIMONTH_SECONDS * 1_000_000_000


def format_us(ns: int) -> str:
    """Nanoseconds as Kineto writes microseconds: ``"12.345"`` (always three decimals)."""
    ns = max(ns, 0)
    return f"{ns // 1000}.{ns % 1000:03d}"


def us_to_ns(values: Any) -> np.ndarray:
    """Microsecond values parsed as doubles -> int64 nanoseconds, exactly (``format_us`` reversed).

    ``ts`` like ``4462594455467.860`` has 16 significant digits: the parsed
    double is the nearest one to the decimal, but ``x * 1000`` rounds again
    and can land on the wrong nanosecond. Splitting the product into an exact
    sum of two doubles (Dekker's two-product, with 1000 exactly representable)
    recovers the nearest integer without that second rounding. Exact for
    values below 2**43 µs (101 days: every ``ts`` relative to a trimonth
    base), where neighbouring doubles are less than 1 ns apart.

    Larger values (old Kineto's absolute epoch microseconds, about 1.7e15) are
    past 2**53 once in nanoseconds, where doubles are 256 ns apart: their
    whole microseconds and their fraction are converted apart, in integers.
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
    small = np.abs(x) < 2.0**43
    if small.all():
        return nearest.astype(np.int64)
    large = np.where(small, 0.0, x)
    whole = np.floor(large)  # exact below 2**53, and its fraction x - whole too
    exact = whole.astype(np.int64) * 1000 + np.rint((large - whole) * 1000.0).astype(np.int64)
    return np.where(small, nearest.astype(np.int64), exact)


# ----------------------------------------------------------------- layout


@attrs.frozen
class KinetoLayout:
    """Where the Chrome traces of torch releases differ: their Kineto writers moved things.

    Defaults are the newest layout. Viewers read every layout alike; polyprof
    writes the installed torch's so that tools comparing files see no change.
    """

    #: torch 2.8+ (kineto 445bc4f5; measured on 2.8.0, 2.9.1, 2.10.0): ``displayTimeUnit`` and
    #: ``baseTimeNanoseconds`` before ``traceEvents``; 2.6 and 2.7 write them last, after ``traceName``.
    time_keys_first: bool = True
    #: torch 2.12+ (kineto 520b0564, c51fcfea): process/thread metadata events come before the
    #: events, and every event starts with ``"ph"``; earlier releases put them after the events
    #: and start metadata events and global instants with ``"name"``.
    metadata_first: bool = True
    #: torch 2.12.1+ (kineto 628e1d0f; measured: 2.12.1 has it, 2.11.0 not): the top level has
    #: ``host_name``.
    host_name: bool = True
    #: torch 2.8+: ops recorded with an overload name are written ``aten::add.Tensor``; 2.7 records
    #: overload names (``capture_overload_names``) but writes plain ``aten::add``.
    overload_in_names: bool = True
    #: torch 2.7 only: every op, annotation and Python function carries ``"finished": true`` in its
    #: args (2.6 and 2.8+ do not; measured on 2.6.0, 2.7.1, 2.8.0).
    finished_in_op_args: bool = False
    #: torch 2.14+ (measured: 2.14.1 and 2.15.0 do it, 2.13.0 not): double quotes in the names of
    #: its host events (Python functions such as ``profiler_bad"file.py(1): f``, ops, annotations)
    #: become single quotes before Kineto writes them. Before, Kineto writes them raw, which leaves
    #: the whole file invalid JSON; polyprof writes them escaped there (``trace_name``).
    single_quotes_in_names: bool = True


NEWEST_LAYOUT = KinetoLayout()


def kineto_layout() -> KinetoLayout:
    """The installed torch's layout; the newest when torch is not loaded (e.g. ``polyprof report``)."""
    if "torch" not in sys.modules:
        return NEWEST_LAYOUT
    try:
        features = torch_support.installed()
    except (ImportError, AttributeError):  # a torch without its profiler: nothing to match
        return NEWEST_LAYOUT
    return KinetoLayout(
        time_keys_first=features.at_least(2, 8),
        metadata_first=features.at_least(2, 12),
        host_name=features.at_least(2, 12, 1),
        overload_in_names=features.at_least(2, 8),
        finished_in_op_args=features.at_least(2, 7) and not features.at_least(2, 8),
        single_quotes_in_names=features.at_least(2, 14),
    )


def trace_name(name: str, layout: KinetoLayout = NEWEST_LAYOUT) -> str:
    """An event's name as torch's Kineto writes it in a Chrome trace.

    Kineto's writer turns backslashes into ``/`` and drops newlines (every
    supported release, measured on 2.6.0, 2.13.0, 2.14.1 and 2.15.0); torch
    2.14+ turns double quotes into single quotes
    (``KinetoLayout.single_quotes_in_names``). Only the trace's names change:
    ``events()``, ``key_averages()`` and tables keep the names as recorded, as
    torch's do.

    One rule is not followed, on purpose: Kineto 7ae1ce85 (January 2025, so
    torch 2.7+; measured on 2.13.0, 2.14.1 and 2.15.0, not on 2.6.0) writes any
    name that still has a character outside printable ASCII (a tab, ``é``,
    ``中``) as ``unknown``. Such a name is kept here, JSON-escaped, as torch
    wrote it before, rather than lost (docs/torch-versions.md).
    """
    if "\\" in name or "\n" in name:
        name = name.replace("\\", "/").replace("\n", "")
    if layout.single_quotes_in_names and '"' in name:
        name = name.replace('"', "'")
    return name


# ------------------------------------------------------------------- args


def json_string(text: str) -> str:
    """``text`` as a JSON string literal (UTF-8 kept; lone surrogates escaped)."""
    try:
        return orjson.dumps(text).decode()
    except TypeError:  # lone surrogates, which orjson refuses
        return json.dumps(text)


@attrs.frozen
class KinetoArgsText:
    """One event's args as Kineto's own writer words them: JSON object members, no braces.

    Made by ``kineto_args_column``, which checked the text; the exporter writes
    it as is. ``mapping()`` decodes it.
    """

    #: e.g. ``'"Input Dims": [[2, 3]], "Ev Idx": 4'``
    body: str

    def mapping(self) -> dict[str, Any]:
        """The args as a dict (a new one on every call)."""
        return orjson.loads("{" + self.body + "}")


#: torch ends almost every fragment with a running ``"Ev Idx": N``, so the
#: fragments of repeated ops differ only in trailing digits. Checking one
#: fragment per "shape" (trailing digits replaced by ``0``) is enough: a run of
#: digits ending a fragment is a valid number whatever its value.
_DIGITS = "0123456789"


def _shape(fragment: str) -> str:
    """The fragment with its trailing digits, if any, replaced by one ``0``."""
    stripped = fragment.rstrip(_DIGITS)
    return stripped + "0" if len(stripped) != len(fragment) else fragment


def _is_object_body(fragment: str) -> bool:
    try:
        obj = orjson.loads("{" + fragment + "}")
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict)


def checked_args_texts(texts: Sequence[Any]) -> list[str | None]:
    """Each text as a JSON object body that parses: kept, repaired, or quarantined; None for no args.

    Kineto writes its args text unchecked. Most of it is valid JSON; the rest
    (stray quotes or backslashes in Python frames or string inputs) would make
    a whole file unreadable, so it is repaired as Kineto repairs names
    (backslash -> ``/``, newlines dropped) or, failing that, kept as one string
    under ``Arg.INVALID_JSON``. Blank and non-str values are no args.
    """
    # Whitespace around a fragment is harmless JSON; a blank one is no fragment.
    cleaned: list[str | None] = [t if isinstance(t, str) and t and not t.isspace() else None for t in texts]
    shapes = {_shape(t) for t in cleaned if t is not None}
    if not shapes:
        return cleaned
    try:  # one C-speed parse for the common case where everything is valid
        orjson.loads("[{" + "},{".join(shapes) + "}]")
        return cleaned
    except orjson.JSONDecodeError:
        pass
    bad_shapes = {shape for shape in shapes if not _is_object_body(shape)}
    repaired = 0
    for i, text in enumerate(cleaned):
        if text is None or _shape(text) not in bad_shapes:
            continue
        sanitized = text.replace("\\", "/").replace("\n", "")
        if _is_object_body(sanitized):
            cleaned[i] = sanitized
        else:
            cleaned[i] = f"{json_string(Arg.INVALID_JSON)}: {json_string(text)}"
        repaired += 1
    log.warning("kineto_invalid_args", repaired=repaired, unique_fragments=len(cleaned))
    return cleaned


def kineto_args_column(texts: Iterable[str | None], count: int = -1) -> tuple[np.ndarray, tuple]:
    """The ``args`` column (indices, table) of Kineto's own args texts, one per event.

    Each text is what Kineto's writer prints between an event's args braces
    (``metadata_json()``); None, blank or empty means no args (index -1). Texts
    are checked once here (``checked_args_texts``) and become
    ``KinetoArgsText`` values, which the exporter writes as they are.
    ``count``: the number of texts, when known (faster).
    """
    indices, table = intern_column(texts, empty=None, count=count)
    checked = checked_args_texts(table)
    if all(text is not None for text in checked):
        return indices, tuple(map(KinetoArgsText, checked))  # type: ignore[arg-type]
    remap = np.full(len(checked) + 1, -1, dtype=np.int32)  # the last slot: index -1 stays -1
    kept: list[KinetoArgsText] = []
    for i, text in enumerate(checked):
        if text is not None:
            remap[i] = len(kept)
            kept.append(KinetoArgsText(text))
    return remap[indices], tuple(kept)


_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, default=str).encode
_ENCODE_ASCII = json.JSONEncoder(ensure_ascii=True, allow_nan=False, default=str).encode


def _json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as None, tuples as lists and keys as str (the slow path)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def encode_args(args: Mapping[str, Any]) -> str | None:
    """A mapping of args as a JSON object body with Kineto's separators; None when it is empty."""
    if not args:
        return None
    if type(args) is not dict:
        args = dict(args)
    try:
        text = _ENCODE(args)
    except (ValueError, TypeError):  # NaN, infinities or keys JSON has no form for
        args = _json_safe(args)
        text = _ENCODE(args)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:  # lone surrogates: a UTF-8 file cannot hold them raw
            text = _ENCODE_ASCII(args)
    return text[1:-1]


def args_mapping(value: Any) -> dict[str, Any]:
    """One ``args`` table value as a dict (a new one), whichever form the tracer gave; {} for none."""
    if isinstance(value, KinetoArgsText):
        return value.mapping()
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        text = checked_args_texts([value])[0]
        return orjson.loads("{" + text + "}") if text is not None else {}
    return {}


#: What the ``args`` column's table may hold, for messages.
ARGS_VALUE_FORMS = (
    "a mapping of str to JSON values, a KinetoArgsText, or (older tracers) a JSON object body str"
)


def encode_args_table(table: Sequence[Any]) -> list[str | None]:
    """The JSON object body of each value of an ``args`` table (None: no args), for the writer.

    Mappings are encoded (``encode_args``), ``KinetoArgsText`` taken as is,
    and str bodies from older tracers checked and repaired
    (``checked_args_texts``). Other values are left out, with a warning.
    """
    out: list[str | None] = [None] * len(table)
    legacy: list[int] = []
    skipped: dict[str, int] = {}
    for i, value in enumerate(table):
        if type(value) is KinetoArgsText:
            out[i] = value.body
        elif isinstance(value, Mapping):
            out[i] = encode_args(value)
        elif isinstance(value, str):
            legacy.append(i)
        elif value is not None:
            name = type(value).__name__
            skipped[name] = skipped.get(name, 0) + 1
    if legacy:
        for i, text in zip(legacy, checked_args_texts([table[i] for i in legacy]), strict=True):
            out[i] = text
    if skipped:
        log.warning("trace_args_values_skipped", types=skipped, valid=ARGS_VALUE_FORMS)
    return out


__all__ = [
    "ARGS_VALUE_FORMS",
    "CATEGORY_BY_KIND",
    "DEFAULT_COUNTER_SERIES",
    "DEFAULT_DEVICE_TYPE",
    "DEVICE_BY_LANE_LABEL",
    "DEVICE_BY_PREFIX",
    "DEVICE_CATEGORY_SUFFIX",
    "DEVICE_KINDS",
    "DEVICE_NAMES",
    "EV_IDX_GROUP",
    "FLOW_AC2G",
    "FLOW_CATEGORY_BY_TYPE",
    "FLOW_FWDBWD",
    "FLOW_TYPE_BY_CATEGORY",
    "GENERATED_ARG_KEYS",
    "HOST_CATEGORIES",
    "KIND_BY_CATEGORY",
    "MEMORY_EVENT_NAME",
    "MERGE_KEY",
    "NEWEST_LAYOUT",
    "OUT_OF_MEMORY_EVENT_NAME",
    "PROCESS_LABELS",
    "PROCESS_NAME",
    "PROCESS_SORT_INDEX",
    "SPAN_CATEGORY",
    "THREAD_NAME",
    "THREAD_SORT_INDEX",
    "WINDOW_END_NAME",
    "Arg",
    "KinetoArgsText",
    "KinetoLayout",
    "args_mapping",
    "category_of",
    "checked_args_texts",
    "device_names",
    "encode_args",
    "encode_args_table",
    "format_us",
    "json_string",
    "kind_by_activity_type",
    "kind_of_category",
    "kineto_args_column",
    "kineto_layout",
    "trace_name",
    "trimonth_base_ns",
    "us_to_ns",
]
