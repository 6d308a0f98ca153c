"""Chrome trace JSON as typed columns: the Parquet trace format, and the codec both ways.

A Parquet trace holds one Chrome trace (polyprof's, torch's or any Kineto trace). Each row is one
element of ``traceEvents``, in the file's order; the columns are:

=============  ==========  ==========================================================================
column         type        what it holds
=============  ==========  ==========================================================================
``ph``         string      the event's phase (``X``, ``i``, ``M``, ``s``, ``f``, ``C``, ...)
``cat``        string      its category (``cpu_op``, ``kernel``, ``gpu_memcpy``, ...)
``name``       string      its name
``pid``        int64       its process, when a number
``pid_label``  string      its process, when a string (Kineto's ``"Spans"``, ``"Traces"``)
``tid``        int64       its thread or stream, when a number
``tid_label``  string      its thread, when a string
``ts``         float64     its start in µs as the JSON has it (relative to ``baseTimeNanoseconds``
                           where the trace has one)
``dur``        float64     its duration in µs
``id``         int64       a flow event's id, when a number
``id_label``   string      a flow event's id, when a string
``args``       string      its ``args``, as JSON text
``extra``      string      every other key of the event (``s``, ``bp``, ...), as a JSON object
=============  ==========  ==========================================================================

A key whose value does not fit its column (a ``pid`` that is a float, a ``ts`` that is a string, a
``name`` that is null, an integer past what a double holds exactly) goes to ``extra`` instead, so no
value is lost or changed: ``chrome_from_table(table_from_chrome(doc)) == doc`` for every document
whose ``traceEvents`` is a list of objects (tests/test_columnar.py checks it with hypothesis).
Numbers keep their value; ``5`` may come back as ``5.0``, which JSON readers take as the same.
What only Python's own JSON parser reads (NaN and infinities, integers past 64 bits, lone
surrogates: ``chrome_reader.StdlibParsedDocument``) is written back with Python's encoder, so it
too comes back (a NaN ``ts`` comes back as NaN, which is never equal to itself).

The other top-level keys (``schemaVersion``, ``deviceProperties``, ``distributedInfo``,
``baseTimeNanoseconds``, ``traceName``, ...) are kept, in order, as one JSON object in the file's
key-value metadata (``polyprof.chrome_top_level``), beside ``polyprof.format`` and, for a rank of a
distributed job, ``polyprof.rank`` and ``polyprof.world_size``. DuckDB, pandas, polars and Spark read
the columns directly; ``read_trace_document`` gives back the Chrome document.

A trace file's format is told by its name (``trace_suffix``: ``.json``, ``.json.gz`` or
``.parquet``, any case); ``sources_of`` lists the trace files among paths and directories, as every
trace command (``polyprof convert``, ``report``, ``merge``) reads them.

pyarrow is needed for the Parquet side (``pip install 'polyprof[analysis]'``); the rest of polyprof
never imports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from polyprof.base.errors import PolyprofError
from polyprof.base.fileio import atomic_writer, check_writable_path
from polyprof.base.log import get_logger
from polyprof.formats.chrome_reader import (
    StdlibParsedDocument,
    TraceFileError,
    document_from_bytes,
    load_chrome_trace,
    read_trace_bytes,
)
from polyprof.native import native_columns

log = get_logger(__name__)

#: The value of ``polyprof.format`` in the files' metadata; bumped when a column changes meaning.
FORMAT = "polyprof-chrome-columns/1"
FORMAT_KEY = b"polyprof.format"
TOP_LEVEL_KEY = b"polyprof.chrome_top_level"
#: How many top-level keys come before ``traceEvents``, so that it goes back where it was.
EVENTS_POSITION_KEY = b"polyprof.trace_events_position"
RANK_KEY = b"polyprof.rank"
WORLD_SIZE_KEY = b"polyprof.world_size"
PARQUET_SUFFIX = ".parquet"
JSON_SUFFIXES = (".json", ".json.gz")
#: The trace files read, and the suffixes ``polyprof convert`` writes.
TRACE_SUFFIXES = (*JSON_SUFFIXES, PARQUET_SUFFIX)
#: zstd: traces are repetitive text; it gives files several times smaller than snappy at similar speed.
DEFAULT_COMPRESSION = "zstd"
COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "brotli", "none")

#: Keys that are numbers or strings: (key, number column, string column).
_INT_OR_LABEL_KEYS = (("pid", "pid_label"), ("tid", "tid_label"), ("id", "id_label"))
COLUMNS = (
    "ph",
    "cat",
    "name",
    "pid",
    "pid_label",
    "tid",
    "tid_label",
    "ts",
    "dur",
    "id",
    "id_label",
    "args",
    "extra",
)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Integers a double holds exactly: a ``ts`` or ``dur`` beyond this goes to ``extra``.
_EXACT_IN_DOUBLE = 2**53


class ParquetUnavailableError(PolyprofError, ImportError):
    """pyarrow is not installed."""


class TraceDirectoryError(PolyprofError, ValueError):
    """A directory of traces cannot be listed."""


def pyarrow_modules() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or a ``ParquetUnavailableError`` saying how to install them."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError as exc:
        raise ParquetUnavailableError(
            "Parquet traces need pyarrow, which is not installed: pip install 'polyprof[analysis]' "
            f"(or pip install pyarrow) ({exc})"
        ) from exc
    return pyarrow, pyarrow.parquet


def _is_int64(value: Any) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def _is_time(value: Any) -> bool:
    kind = type(value)
    return kind is float or (kind is int and -_EXACT_IN_DOUBLE <= value <= _EXACT_IN_DOUBLE)


def _orjson_text(value: Any) -> str:
    return orjson.dumps(value).decode()


def _stdlib_text(value: Any) -> str:
    # ASCII escapes keep lone surrogates valid in a UTF-8 column; NaN and Infinity as Python writes them
    return json.dumps(value, allow_nan=True, separators=(",", ":"))


def _encoder_for(doc: Mapping[str, Any]) -> Callable[[Any], str]:
    return _stdlib_text if isinstance(doc, StdlibParsedDocument) else _orjson_text


class _Decoder:
    """JSON text to values; remembers whether any needed Python's parser (what ``_stdlib_text`` wrote)."""

    def __init__(self) -> None:
        self.used_stdlib = False

    def __call__(self, text: str | bytes) -> Any:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            self.used_stdlib = True
            return json.loads(text)  # NaN, integers past 64 bits, escaped lone surrogates


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate, which only Python's parser reads
        return False
    return True


def _columns_of(
    events: list[Any], dumps: Callable[[Any], str] = _orjson_text, *, stdlib_parsed: bool = False
) -> dict[str, list[Any]]:
    """The column lists of ``events``: each key in its typed column when its value fits, else in extra.

    ``stdlib_parsed``: strings may hold lone surrogates, which no UTF-8 column holds; those go to extra.
    """
    n = len(events)
    columns: dict[str, list[Any]] = {name: [None] * n for name in COLUMNS}
    ph, cat, name = columns["ph"], columns["cat"], columns["name"]
    ts, dur, args, extra = columns["ts"], columns["dur"], columns["args"], columns["extra"]
    numbers = {key: columns[key] for key, _ in _INT_OR_LABEL_KEYS}
    labels = {key: columns[label] for key, label in _INT_OR_LABEL_KEYS}
    strings = {"ph": ph, "cat": cat, "name": name}
    times = {"ts": ts, "dur": dur}
    for row, event in enumerate(events):
        if type(event) is not dict:
            raise ValueError(f"traceEvents[{row}] is not a JSON object but {type(event).__name__}")
        rest: dict[str, Any] | None = None
        for key, value in event.items():
            column = strings.get(key)
            if column is not None:
                if type(value) is str and (not stdlib_parsed or _is_utf8(value)):
                    column[row] = value
                    continue
            elif key in times:
                if _is_time(value):
                    times[key][row] = float(value)
                    continue
            elif key in numbers:
                if _is_int64(value):
                    numbers[key][row] = value
                    continue
                if type(value) is str and (not stdlib_parsed or _is_utf8(value)):
                    labels[key][row] = value
                    continue
            elif key == "args":
                args[row] = dumps(value)
                continue
            if rest is None:
                rest = {}
            rest[key] = value
        if rest is not None:
            extra[row] = dumps(rest)
    return columns


def _schema(pa: Any) -> Any:
    text = pa.string()
    return pa.schema(
        [
            ("ph", text),
            ("cat", text),
            ("name", text),
            ("pid", pa.int64()),
            ("pid_label", text),
            ("tid", pa.int64()),
            ("tid_label", text),
            ("ts", pa.float64()),
            ("dur", pa.float64()),
            ("id", pa.int64()),
            ("id_label", text),
            ("args", text),
            ("extra", text),
        ]
    )


def _rank_facts(top_level: Mapping[str, Any]) -> dict[bytes, bytes]:
    info = top_level.get("distributedInfo")
    if not isinstance(info, Mapping):
        return {}
    facts = {}
    for key, field in ((RANK_KEY, "rank"), (WORLD_SIZE_KEY, "world_size")):
        if _is_int64(info.get(field)):
            facts[key] = str(info[field]).encode()
    return facts


def table_from_chrome(doc: Mapping[str, Any]) -> Any:
    """The Arrow table of a parsed Chrome trace document (see the module notes)."""
    pa, _ = pyarrow_modules()
    if not isinstance(doc, Mapping):
        raise ValueError(f"a Chrome trace is a JSON object, not {type(doc).__name__}")
    events = doc.get("traceEvents", [])
    if not isinstance(events, list):
        raise ValueError(f"traceEvents is not a list but {type(events).__name__}")
    dumps = _encoder_for(doc)
    columns = _columns_of(events, dumps, stdlib_parsed=dumps is _stdlib_text)
    return _with_top_level(pa, pa.Table.from_pydict(columns, schema=_schema(pa)), doc, dumps)


def _with_top_level(pa: Any, table: Any, doc: Mapping[str, Any], dumps: Callable[[Any], str]) -> Any:
    """``table`` with the metadata of ``doc``'s other top-level keys (``traceEvents`` is not read)."""
    keys = list(doc)
    top_level = {key: value for key, value in doc.items() if key != "traceEvents"}
    position = keys.index("traceEvents") if "traceEvents" in doc else len(keys)
    metadata = {
        FORMAT_KEY: FORMAT.encode(),
        TOP_LEVEL_KEY: dumps(top_level).encode(),
        EVENTS_POSITION_KEY: str(position).encode(),
        **_rank_facts(top_level),
    }
    return table.replace_schema_metadata(metadata)


#: The most bytes of text one chunk of an Arrow string column holds (its offsets are int32).
_MAX_STRING_CHUNK = 2**31 - 1
#: The Arrow type of each number column, as ``native_columns`` gives them.
_NUMBER_TYPES = {"pid": "int64", "tid": "int64", "id": "int64", "ts": "float64", "dur": "float64"}


def _native_array(pa: Any, name: str, rows: int, part: tuple[Any, ...]) -> Any:
    kind = _NUMBER_TYPES.get(name)
    if kind is not None:
        values, validity, nulls = part
        buffers = [None if validity is None else pa.py_buffer(validity), pa.py_buffer(values)]
        return pa.Array.from_buffers(getattr(pa, kind)(), rows, buffers, nulls)
    offsets, data, validity, nulls, wide = part
    buffers = [
        None if validity is None else pa.py_buffer(validity),
        pa.py_buffer(offsets),
        pa.py_buffer(data),
    ]
    if not wide:
        return pa.Array.from_buffers(pa.string(), rows, buffers, nulls)
    # more than 2 GiB of text in one column: string chunks, each under 2 GiB, as pyarrow makes them
    import numpy as np

    array = pa.Array.from_buffers(pa.large_string(), rows, buffers, nulls)
    ends = np.frombuffer(offsets, dtype=np.int64)
    chunks, start = [], 0
    while start < rows:
        stop = int(np.searchsorted(ends, ends[start] + _MAX_STRING_CHUNK, side="right")) - 1
        stop = max(stop, start + 1)
        chunks.append(array.slice(start, stop - start).cast(pa.string()))
        start = stop
    return pa.chunked_array(chunks, type=pa.string())


def _native_table(module: Any, data: bytes | bytearray) -> Any | None:
    """The table of a trace's JSON bytes by the compiled builder, or None where it refuses them.

    The builder gives the events' columns and where ``traceEvents`` lies; the top-level keys are
    parsed by orjson from the bytes with ``traceEvents`` emptied, which also checks those bytes
    as ``orjson.loads`` of the whole file would.
    """
    pa, _ = pyarrow_modules()
    found = module.columns(data)
    if isinstance(found, str):
        log.debug("chrome_columns_refused", reason=found)
        return None
    rows, begin, end, parts = found
    try:
        outer = orjson.loads(bytes(data[:begin]) + b"[]" + bytes(data[end:]))
    except orjson.JSONDecodeError:
        return None  # invalid outside the events, or what only Python's parser reads
    if type(outer) is list:
        outer = {"traceEvents": outer}
    if type(outer) is not dict or outer.get("traceEvents") != []:
        return None
    arrays = [_native_array(pa, name, rows, part) for name, part in zip(COLUMNS, parts, strict=True)]
    return _with_top_level(pa, pa.Table.from_arrays(arrays, schema=_schema(pa)), outer, _orjson_text)


#: Numbers whose JSON spelling differs between orjson releases (3.9 writes 1e16, later ones 1e+16).
_FLOAT_PROBE = (
    b'{"traceEvents": [{"ph": "i", "args": {"v": '
    b"[1e16, 1e-7, 0.1, 1e21, 1.5e300, 5e-324, -0.0, 2.5e-308, 123456789.125]}}]}"
)
_agreement: dict[int, bool] = {}


def native_builder_agrees(module: Any) -> bool:
    """Whether ``module`` writes numbers in args as the installed orjson does (asked once per module).

    The compiled builder spells floats as the orjson releases it was written against; an older
    orjson spells some otherwise, and the Python builder's files follow the installed orjson. Where
    the two differ the compiled builder is not used, so that both ways give the same files.
    """
    known = _agreement.get(id(module))
    if known is None:
        native = _native_table(module, bytearray(_FLOAT_PROBE))
        ours = None if native is None else native.column("args").to_pylist()
        theirs = table_from_chrome(orjson.loads(_FLOAT_PROBE)).column("args").to_pylist()
        known = _agreement[id(module)] = ours == theirs
        if not known:
            log.info(
                "chrome_columns_not_used", reason="the installed orjson writes floats otherwise", ours=ours
            )
    return known


def json_trace_table(path: str | os.PathLike[str]) -> Any:
    """The Arrow table of a Chrome trace JSON file (``.json`` or ``.json.gz``): ``table_from_chrome``
    of its document, built from its bytes by the compiled builder (``polyprof.native.native_columns``)
    where there is one, else from the document orjson parses.

    :raises TraceFileError: the file is not a readable Chrome trace (one line, naming it).
    """
    path = os.fspath(path)
    pyarrow_modules()  # before reading gigabytes of JSON
    holder = [read_trace_bytes(path)]
    module = native_columns.builder()
    if module is not None and native_builder_agrees(module):
        table = _native_table(module, holder[0])
        if table is not None:
            return table
    doc = document_from_bytes(path, holder)
    try:
        return table_from_chrome(doc)
    except (ValueError, TypeError) as exc:  # an event not an object, nesting orjson cannot write, ...
        raise TraceFileError(path, f"not a Chrome trace: {exc}") from exc


def top_level_of(metadata: dict[bytes, bytes]) -> dict[str, Any]:
    """The top-level keys a Parquet trace's metadata holds (``ValueError`` when they are not an object)."""
    top = _Decoder()(metadata.get(TOP_LEVEL_KEY, b"{}"))
    if not isinstance(top, dict):
        raise ValueError(f"its top-level keys are not a JSON object but {type(top).__name__}")
    return top


#: What each column holds, by kind: a file whose column holds another kind (a ``ts`` of text) is not
#: a trace this module wrote, and its values would fail every reader (DuckDB's, the merge's).
_COLUMN_KINDS = {
    **dict.fromkeys(("ph", "cat", "name", "pid_label", "tid_label", "id_label", "args", "extra"), "text"),
    **dict.fromkeys(("pid", "tid", "id"), "integers"),
    **dict.fromkeys(("ts", "dur"), "numbers"),
}


def _holds(kind: str, arrow_type: Any) -> bool:
    pa, _ = pyarrow_modules()
    types = pa.types
    if types.is_null(arrow_type):  # a column with no value at all
        return True
    if kind == "text":
        return bool(types.is_string(arrow_type) or types.is_large_string(arrow_type))
    if kind == "integers":
        return bool(types.is_integer(arrow_type))
    return bool(types.is_integer(arrow_type) or types.is_floating(arrow_type))


def check_column_types(schema: Any, where: str) -> None:
    """``ValueError`` naming the first column of ``schema`` (an Arrow schema, or some of its fields)
    that holds another kind of value than a Parquet trace's (a ``ts`` column of text); columns that
    are missing are not checked here."""
    for field in schema:
        kind = _COLUMN_KINDS.get(field.name)
        if kind is not None and not _holds(kind, field.type):
            raise ValueError(f"{where}: its column {field.name!r} holds {field.type}, not {kind}")


def _check_format(table: Any, where: str) -> dict[bytes, bytes]:
    metadata = table.schema.metadata or {}
    found = metadata.get(FORMAT_KEY)
    if found is None:
        raise ValueError(
            f"{where} is not a polyprof Parquet trace (its metadata has no {FORMAT_KEY.decode()!r}; "
            f"polyprof convert or the 'parquet' exporter writes one)"
        )
    if found.decode(errors="replace") != FORMAT:
        raise ValueError(
            f"{where} is in format {found.decode(errors='replace')!r}; this polyprof reads {FORMAT!r}"
        )
    check_column_types(table.schema, where)
    return dict(metadata)


def chrome_from_table(table: Any, *, where: str = "the table") -> dict[str, Any]:
    """The Chrome trace document of a table that ``table_from_chrome`` made (or read back from Parquet).

    :raises ValueError: the table is not a polyprof Parquet trace, or a value in it is damaged.
    """
    try:
        return _document_of(table, where)
    except (TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} holds a damaged value: {type(exc).__name__}: {exc}") from exc


def _document_of(table: Any, where: str) -> dict[str, Any]:
    metadata = _check_format(table, where)
    loads = _Decoder()
    doc = loads(metadata.get(TOP_LEVEL_KEY, b"{}"))
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: its top-level keys are not a JSON object but {type(doc).__name__}")
    missing = [name for name in COLUMNS if name not in table.column_names]
    if missing:
        raise ValueError(f"{where} lacks the columns {missing}; a polyprof Parquet trace has {list(COLUMNS)}")
    data = {name: table.column(name).to_pylist() for name in COLUMNS}
    rows = zip(*(data[name] for name in COLUMNS), strict=True)
    events: list[dict[str, Any]] = []
    for ph, cat, name, pid, pid_label, tid, tid_label, ts, dur, id_, id_label, args, extra in rows:
        event: dict[str, Any] = {}
        if ph is not None:
            event["ph"] = ph
        if cat is not None:
            event["cat"] = cat
        if name is not None:
            event["name"] = name
        for number, label, key in ((pid, pid_label, "pid"), (tid, tid_label, "tid")):
            if number is not None:
                event[key] = number
            elif label is not None:
                event[key] = label
        if ts is not None:
            event["ts"] = ts
        if dur is not None:
            event["dur"] = dur
        if id_ is not None:
            event["id"] = id_
        elif id_label is not None:
            event["id"] = id_label
        if extra is not None:
            event.update(loads(extra))
        if args is not None:
            event["args"] = loads(args)
        events.append(event)
    try:
        position = int(metadata.get(EVENTS_POSITION_KEY, b"-1"))
    except ValueError:
        position = -1
    items = list(doc.items())
    if not 0 <= position <= len(items):
        position = len(items)
    ordered = [*items[:position], ("traceEvents", events), *items[position:]]
    pa, _ = pyarrow_modules()
    special_times = any(
        pa.compute.any(pa.compute.invert(pa.compute.is_finite(table.column(name)))).as_py()
        for name in ("ts", "dur")
    )
    # orjson would write NaN and infinities as null: such a document is written with Python's encoder
    return StdlibParsedDocument(ordered) if loads.used_stdlib or special_times else dict(ordered)


def check_compression(compression: str) -> str:
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
    return compression


def write_parquet_table(
    table: Any, path: str | os.PathLike[str], *, compression: str = DEFAULT_COMPRESSION
) -> str:
    """Write ``table`` as Parquet at ``path``, atomically (nothing is left at ``path`` on an error)."""
    _, pq = pyarrow_modules()
    check_compression(compression)
    path = check_writable_path(path)
    with atomic_writer(path, binary=True) as out:
        pq.write_table(table, out, compression=None if compression == "none" else compression)
    return path


def write_parquet_trace(doc: Mapping[str, Any], path: str | os.PathLike[str], **options: Any) -> str:
    """Write a parsed Chrome trace document as a Parquet trace at ``path``."""
    return write_parquet_table(table_from_chrome(doc), path, **options)


def is_parquet_path(path: str | os.PathLike[str]) -> bool:
    return os.fspath(path).lower().endswith(PARQUET_SUFFIX)


def is_json_trace_path(path: str | os.PathLike[str]) -> bool:
    return os.fspath(path).lower().endswith(JSON_SUFFIXES)


def trace_suffix(path: str) -> str | None:
    """``.json``, ``.json.gz`` or ``.parquet`` when ``path`` ends in one (any case), else None."""
    lowered = path.lower()
    for suffix in (".json.gz", ".json", ".parquet"):
        if lowered.endswith(suffix):
            return suffix
    return None


def sources_of(paths: list[str]) -> list[str]:
    """The trace files named: files as given, directories' trace files (not recursive), sorted."""
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                listed = os.listdir(path)
            except OSError as exc:
                raise TraceDirectoryError(
                    f"cannot list the directory {path!r}: {exc.strerror or exc}"
                ) from exc
            names = sorted(n for n in listed if trace_suffix(n) and not n.startswith("."))
            found.extend(os.path.join(path, n) for n in names)
        else:
            found.append(path)
    return found


def read_parquet_table(path: str | os.PathLike[str], columns: list[str] | None = None) -> Any:
    """The table of a Parquet trace; a one-line ``TraceFileError`` naming the file when it is not one."""
    pa, pq = pyarrow_modules()
    path = os.fspath(path)
    try:
        table = pq.read_table(path, columns=columns)
        _check_format(table, path)
    except FileNotFoundError:
        raise TraceFileError(path, "no such file") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if message.startswith(path):
            message = message[len(path) :].lstrip(": ")
        raise TraceFileError(path, f"not a readable polyprof Parquet trace: {message}") from exc
    return table


def read_trace_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The Chrome trace document of a ``.json``, ``.json.gz`` or ``.parquet`` trace file."""
    path = os.fspath(path)
    if is_parquet_path(path):
        table = read_parquet_table(path)
        try:
            return chrome_from_table(table, where=path)
        except ValueError as exc:
            raise TraceFileError(path, f"not a readable polyprof Parquet trace: {exc}") from exc
    return load_chrome_trace(path)


def write_json_trace(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> str:
    """Write a Chrome trace document as JSON (gzip for ``.gz``), atomically."""
    path = check_writable_path(path)
    text = _stdlib_text(doc).encode() if isinstance(doc, StdlibParsedDocument) else orjson.dumps(doc)
    with atomic_writer(path, binary=True) as out:
        out.write(text)
    return path


__all__ = [
    "COLUMNS",
    "DEFAULT_COMPRESSION",
    "FORMAT",
    "TRACE_SUFFIXES",
    "ParquetUnavailableError",
    "TraceDirectoryError",
    "check_column_types",
    "check_compression",
    "chrome_from_table",
    "is_json_trace_path",
    "is_parquet_path",
    "json_trace_table",
    "pyarrow_modules",
    "read_parquet_table",
    "read_trace_document",
    "sources_of",
    "table_from_chrome",
    "top_level_of",
    "trace_suffix",
    "write_json_trace",
    "write_parquet_table",
    "write_parquet_trace",
]
