"""The compiled column builder against the Python one (``polyprof convert``, JSON to Parquet).

``polyprof.native.native_columns`` reads a Chrome trace's JSON bytes straight into the Parquet trace's
columns; ``polyprof.formats.columnar.table_from_chrome`` builds them from the document orjson parses. For
every file the compiled builder accepts, both tables must be equal, metadata included, and the
Parquet files written from them byte for byte the same; what it refuses goes to the Python builder,
so a conversion gives the same table, or the same one-line error, either way.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from polyprof.base.errors import PolyprofError  # noqa: E402
from polyprof.cli.cli_convert import convert_file  # noqa: E402
from polyprof.formats import columnar  # noqa: E402
from polyprof.formats.chrome_reader import document_from_bytes  # noqa: E402
from polyprof.native import native_columns  # noqa: E402


@pytest.fixture(scope="module")
def builder() -> Any:
    """The compiled builder; where a C++ compiler is found, a failed build fails the tests."""
    if shutil.which(native_columns.compiler_command()[0]) is None:
        pytest.skip("no C++ compiler here: only the Python builder")
    module = native_columns.builder("native")
    if not columnar.native_builder_agrees(module):
        pytest.skip(f"orjson {orjson.__version__} writes floats otherwise: convert uses the Python builder")
    return module


def python_table(data: bytes) -> Any:
    """The table the Python builder makes of a file holding ``data`` (what convert did before)."""
    return columnar.table_from_chrome(document_from_bytes("trace.json", [bytearray(data)]))


def native_table(module: Any, data: bytes) -> Any | None:
    return columnar._native_table(module, bytearray(data))


def assert_same(module: Any, data: bytes) -> Any:
    """The compiled builder accepts ``data`` and gives what the Python one gives; returns the table."""
    ours = native_table(module, data)
    reason = module.columns(data)
    assert ours is not None, f"refused: {reason if isinstance(reason, str) else 'outside the events'}"
    theirs = python_table(data)
    assert ours.schema.equals(theirs.schema, check_metadata=True)
    for name in columnar.COLUMNS:
        assert ours.column(name).to_pylist() == theirs.column(name).to_pylist(), name
    assert ours.equals(theirs, check_metadata=True)
    return ours


def convert_in_both(tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """``convert_file`` with each builder: the Parquet bytes, or the error's text."""
    outcomes = []
    for chosen in ("native", "python"):
        monkeypatch.setenv(native_columns.MODE_VARIABLE, chosen)
        destination = tmp_path / f"{source.name}.{chosen}.parquet"
        try:
            convert_file(str(source), str(destination))
        except (PolyprofError, OSError) as exc:
            assert not destination.exists()  # atomic: nothing half-written
            outcomes.append(f"{type(exc).__name__}: {exc}")
        else:
            outcomes.append(destination.read_bytes())
    return outcomes[0], outcomes[1]


# --------------------------------------------------------------- generated documents

# Text with what escapes and UTF-8 make awkward: quotes, backslashes, control characters, DEL,
# U+2028, accents, CJK, emoji (surrogate pairs once escaped), and the typed keys' names.
awkward_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(list('"\\/\b\f\n\r\t\x00\x01\x1f\x7f\u2028éß中😀 aZ:,{}[]')),
        st.characters(blacklist_categories=("Cs",)),
    ),
    max_size=8,
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-(2**53) - 3, max_value=2**53 + 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-3, max_value=1e-3, allow_nan=False),
    awkward_text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(awkward_text, inner, max_size=4)),
    max_leaves=12,
)
event_keys = st.sampled_from(
    ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args", "s", "bp", "tts", "cname", "id2"]
)
typed_values = st.one_of(
    st.sampled_from(["X", "i", "M", "s", "f", "C", "cpu_op", "kernel", "aten::add", "Spans", "ü", ""]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=2**53 - 2, max_value=2**53 + 2),
    st.floats(min_value=-1e17, max_value=1e17, allow_nan=False),
    json_values,
)
events = st.dictionaries(st.one_of(event_keys, awkward_text), typed_values, max_size=10)
documents = st.fixed_dictionaries(
    {"traceEvents": st.lists(events, max_size=12)},
    optional={
        "schemaVersion": st.just(1),
        "deviceProperties": st.lists(st.dictionaries(awkward_text, json_scalars, max_size=3), max_size=2),
        "distributedInfo": st.fixed_dictionaries(
            {"backend": st.just("nccl"), "rank": st.integers(0, 7), "world_size": st.just(8)}
        ),
        "traceName": awkward_text,
        "baseTimeNanoseconds": st.integers(0, 2**62),
    },
)


def spelled(doc: Any, style: str) -> bytes:
    """``doc`` as JSON text in one of the spellings trace writers use."""
    if style == "orjson":
        return orjson.dumps(doc)
    if style == "ascii":  # \\uXXXX escapes for everything past ASCII, surrogate pairs included
        return json.dumps(doc).encode()
    if style == "indented":
        return json.dumps(doc, indent=2, ensure_ascii=False).encode()
    if style == "kineto":  # one event a line, ", " and ": " as torch's writer spells them
        events = ",\n".join(json.dumps(event, ensure_ascii=False) for event in doc["traceEvents"])
        head = {key: value for key, value in doc.items() if key != "traceEvents"}
        head_text = json.dumps(head, ensure_ascii=False)[1:-1]
        return (
            "{" + head_text + (", " if head_text else "") + '"traceEvents": [\n' + events + "\n]}"
        ).encode()
    if style == "array":  # the bare-array form of a Chrome trace
        return ("\r\n\t " + json.dumps(doc["traceEvents"], separators=(",", ":")) + " \n").encode()
    raise AssertionError(style)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents, style=st.sampled_from(["orjson", "ascii", "indented", "kineto", "array"]))
def test_any_document_gives_the_python_builders_table(builder: Any, doc: dict[str, Any], style: str) -> None:
    assert_same(builder, spelled(doc, style))


@settings(max_examples=examples(150), deadline=None)
@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=50))
def test_floats_are_written_as_orjson_writes_them(builder: Any, values: list[float]) -> None:
    doc = {"traceEvents": [{"ph": "C", "args": {"v": values}, "ts": values[0], "s": values[-1]}]}
    table = assert_same(builder, json.dumps(doc).encode())  # Python's repr, not orjson's spelling
    assert table.column("args")[0].as_py() == orjson.dumps({"v": values}).decode()


def test_random_doubles_of_every_magnitude_are_written_as_orjson_writes_them(builder: Any) -> None:
    rng = random.Random(20261127)
    values = []
    while len(values) < 20000:
        (value,) = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))
        if value == value and abs(value) != float("inf"):
            values.append(value)
    values += [10.0**k for k in range(-12, 24)] + [1.5 * 10.0**k for k in range(-12, 24)]
    values += [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -0.0, 0.0, 2.0**53, 2.0**53 + 2]
    values += [1e16 - 2, 9999999999999998.0, 0.00001, 0.000099999, 1e-6, 123456789.125]
    doc = {"traceEvents": [{"ph": "X", "args": {"v": values}}]}
    for style in ("orjson", "ascii"):
        table = assert_same(builder, spelled(doc, style))
        assert table.column("args")[0].as_py() == orjson.dumps({"v": values}).decode()


# --------------------------------------------------------------- awkward files, by hand

KINETO_LIKE = b"""{
  "schemaVersion": 1,
  "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150000000000}],
  "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 16},
  "traceEvents": [
  {"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "ts": 0.000, "args": {"name": "python"}},
  {"ph": "M", "name": "thread_name", "pid": "Spans", "tid": "PyTorch Profiler", "args": {"name": "x"}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 4242, "tid": 4243, "ts": 1000.000,
   "dur": 12.461, "args": {"External id": 1, "Record function id": 0, "Input Dims": [[4, 8], [16, 8], []],
   "Input type": ["float", "float", ""], "Concrete Inputs": ["", "", "1.5e-07"], "Ev Idx": 0}},
  {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "pid": 0, "tid": 7, "ts": 1005.000, "dur": 20.0,
   "args": {"grid": [1, 2, 3], "blocks per SM": 0.5, "warps per SM": 2.0, "est. achieved occupancy %": 0}},
  {"ph": "s", "id": 1, "pid": 4242, "tid": 4243, "ts": 1003.000, "cat": "ac2g", "name": "ac2g"},
  {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": 1005.000, "cat": "ac2g", "name": "ac2g", "bp": "e"},
  {"ph": "s", "id": "0x1f", "pid": 4242, "tid": 4243, "ts": 1.0, "cat": "fwdbwd", "name": "fwdbwd"},
  {"ph": "i", "s": "t", "name": "[memory]", "pid": 4242, "tid": 4243, "ts": 1010.5,
   "args": {"Total Reserved": 2097152, "Bytes": -512, "Device Type": 0, "Addr": 94812319237632}},
  {"ph": "C", "name": "GPU 0 Util", "pid": 0, "ts": 1100.0, "args": {"GPU Utilization": 0.97}},
  {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces", "tid": "Trace",
   "ts": 999.0},
  {"ph": "X", "name": "caf\\u00e9 \\ud83d\\ude00 \\/ \\\\ \\" \\u0001 \\u2028", "cat": "user_annotation",
   "pid": -0, "tid": 1e3, "ts": -0.0, "dur": 1E-7, "args": null},
  {"ph": "X", "name": "\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80", "ts": 9007199254740993,
   "dur": 9007199254740992, "pid": 9223372036854775807, "tid": -9223372036854775808, "id": 1.5,
   "args": "text"},
  {"ph": 5, "cat": null, "name": ["a"], "pid": true, "tid": {"a": 1}, "ts": "late", "dur": false,
   "id": null, "args": []},
  {},
  {"args": {}, "extra": {"nested": {"deeper": [[[{"x": [1, {"y": [2.5e300, -1.25e-300]}]}]]]}}},
  {"name": "", "ph": "", "cat": "", "args": ""},
  {"p\\u0068": "X", "n\\u0061me": "escaped keys", "\\u0073": "t"}
  ],
  "traceName": "rank3.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1795000000000000000
}
"""


def test_a_kineto_like_trace_with_every_event_kind(builder: Any) -> None:
    table = assert_same(builder, KINETO_LIKE)
    assert table.num_rows == 17
    rows = table.to_pylist()
    assert rows[10]["name"] == 'café 😀 / \\ " \x01 \u2028'
    assert (
        rows[12]["extra"]
        == '{"ph":5,"cat":null,"name":["a"],"pid":true,"tid":{"a":1},"ts":"late","dur":false,"id":null}'
    )


@pytest.mark.parametrize(
    "text",
    [
        b'{"traceEvents": []}',
        b"[]",
        b' [ { } , {"ph":"X"} ] ',
        b'{"a": {"traceEvents": [1]}, "traceEvents": [{"ph": "i"}], "b": "]}\\"[{"}',
        b'{"traceEvents": [{"ph": "i"}], "a": 1, "a": 2}',  # duplicates outside the events: orjson's
        b'{"traceEvent\\u0073": [{"name": "escaped key"}]}',
        b'{"traceEvents": [{"args": {"k": 1, "K": 2, "k\\u0020": 3}}]}',
        b'{"traceEvents": [{"args": {' + b",".join(b'"k%d": %d' % (i, i) for i in range(100)) + b"}}]}",
        b'{"traceEvents": [{"ts": 1e-320, "dur": 4.9e-324, "args": [1e308, -2.5e-308]}]}',
        b'{"traceEvents": [{"id": -9223372036854775808, "pid": 0, "tid": -0, "ts": 0, "dur": -0}]}',
        b'{"traceEvents": [{"ts": -9007199254740992, "dur": -9007199254740993}]}',
    ],
)
def test_awkward_but_accepted_files(builder: Any, text: bytes) -> None:
    assert_same(builder, text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b'{"traceEvents": [{"ph": "X", "ph": "i"}]}', "duplicate key"),
        (b'{"traceEvents": [{"s": 1, "s": 2}]}', "duplicate key"),
        (b'{"traceEvents": [{"args": {"a": 1, "\\u0061": 2}}]}', "duplicate key"),
        (
            b'{"traceEvents": [{"args": {' + b",".join(b'"k%d": 1' % (i % 40) for i in range(41)) + b"}}]}",
            "duplicate",
        ),
        (b'{"traceEvents": [{"pid": 9223372036854775808}]}', "past int64"),
        (b'{"traceEvents": [{"args": 18446744073709551616}]}', "past int64"),  # orjson: a float
        (b'{"traceEvents": [{"args": [18446744073709551615]}]}', "past int64"),  # orjson: an int
        (b'{"traceEvents": [{"tid": -9999999999999999999}]}', "past int64"),
        (b'{"traceEvents": [{"ts": 1e400}]}', "range"),
        (b'{"traceEvents": [{"ts": 1e-400}]}', "range"),
        (b'{"traceEvents": [{"name": "\\ud800"}]}', "surrogate"),
        (b'{"traceEvents": [{"name": "\\udc00x"}]}', "surrogate"),
        (b'{"traceEvents": [{"name": "\xff"}]}', "UTF-8"),
        (b'{"traceEvents": [{"name": "\xed\xa0\x80"}]}', "UTF-8"),
        (b'{"traceEvents": [{"name": "a\nb"}]}', "control character"),
        (b'{"traceEvents": [{"ts": NaN}]}', "invalid JSON"),
        (b'{"traceEvents": [{"ts": 01}]}', "leading zero"),
        (b'{"traceEvents": [{"ts": 1.}]}', "decimal point"),
        (b'{"traceEvents": [{"ph": "X"},]}', "not an object"),  # a trailing comma
        (b'{"traceEvents": [1, 2]}', "not an object"),
        (b'{"traceEvents": {"ph": "X"}}', "not an array"),
        (b'{"traceEvents": [], "traceEvents": []}', "twice"),
        (b'{"other": 1}', "no traceEvents"),
        (b'"a string"', "not an object"),
        (b'{"traceEvents": [{"args": ' + b"[" * 70 + b"]" * 70 + b"}]}", "nested too deeply"),
        (b'{"traceEvents": [{"ph": "X"}', "ends"),
    ],
)
def test_what_the_compiled_builder_refuses_goes_to_the_python_builder(
    builder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: bytes, why: str
) -> None:
    reason = builder.columns(text)
    assert isinstance(reason, str) and why in reason
    source = tmp_path / "trace.json"
    source.write_bytes(text)
    ours, theirs = convert_in_both(tmp_path, source, monkeypatch)
    assert ours == theirs


@pytest.mark.parametrize(
    "text",
    [
        b'\xef\xbb\xbf{"traceEvents": []}',  # a BOM: orjson refuses it, Python's parser names it
        b'{"traceEvents": []} x',  # content after the document
        b'{"traceEvents": [], "a": [1,}',  # invalid outside the events
        b'{"traceEvents": [], "a": NaN}',  # only Python's parser reads it
        b'{"traceEvents": [{"ph": "X"}], "big": 123456789012345678901234567890}',
        b"   ",
        b"",
    ],
)
def test_what_is_wrong_outside_the_events_is_left_to_the_python_path(
    builder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: bytes
) -> None:
    source = tmp_path / "trace.json"
    source.write_bytes(text)
    ours, theirs = convert_in_both(tmp_path, source, monkeypatch)
    assert ours == theirs


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_convert_writes_the_same_file_with_either_builder(
    builder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    source = tmp_path / name
    source.write_bytes(gzip.compress(KINETO_LIKE) if name.endswith(".gz") else KINETO_LIKE)
    ours, theirs = convert_in_both(tmp_path, source, monkeypatch)
    assert isinstance(ours, bytes) and ours == theirs
    assert columnar.read_trace_document(tmp_path / f"{name}.native.parquet") == orjson.loads(KINETO_LIKE)


def test_a_large_generated_trace_gives_the_same_file(builder: Any, tmp_path: Path, monkeypatch) -> None:
    rng = random.Random(7)
    lines = []
    for n in range(20000):
        kind = rng.choice(["X", "X", "X", "i", "s", "f", "C", "M"])
        args = {
            "External id": n,
            "Input Dims": [[rng.randint(1, 64), 8]],
            "scale": rng.random() * 10 ** rng.randint(-9, 18),
        }
        event = {
            "ph": kind,
            "cat": rng.choice(["cpu_op", "kernel", "ac2g"]),
            "name": f"op{rng.randint(0, 50)}é",
            "pid": rng.choice([4242, "Spans"]),
            "tid": rng.randint(0, 9),
            "ts": round(rng.random() * 1e6, 3),
            "dur": round(rng.random() * 100, 3),
            "args": args,
        }
        if kind in "sf":
            event["id"] = rng.choice([n, f"0x{n:x}"])
            event["bp"] = "e"
        if kind == "i":
            event["s"] = "t"
        lines.append(json.dumps(event))
    source = tmp_path / "big.json"
    source.write_text('{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(lines) + "\n]}")
    ours, theirs = convert_in_both(tmp_path, source, monkeypatch)
    assert isinstance(ours, bytes) and ours == theirs


def test_a_column_past_int32_offsets_becomes_string_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """More than 2 GiB of text in one column comes with int64 offsets; it is split as pyarrow splits
    such a column (too big to make here, so the chunk size is made small)."""
    texts = ["a", None, "bcd", "", "efghij", "k", None, "lmnopqrs", "t"]
    data = "".join(t or "" for t in texts).encode()
    ends = [0]
    for text in texts:
        ends.append(ends[-1] + len(text or ""))
    valid = sum(1 << row for row, text in enumerate(texts) if text is not None)
    part = (
        struct.pack(f"<{len(ends)}q", *ends),
        data,
        valid.to_bytes(2, "little"),
        texts.count(None),
        True,
    )
    monkeypatch.setattr(columnar, "_MAX_STRING_CHUNK", 7)
    column = columnar._native_array(pa, "name", len(texts), part)
    assert column.type == pa.string() and column.num_chunks > 1
    assert all(sum(len(t) for t in chunk.to_pylist() if t) <= 8 for chunk in column.chunks)
    assert column.to_pylist() == texts


# --------------------------------------------------------------- choosing and building


def test_python_chooses_the_python_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native_columns.MODE_VARIABLE, "python")
    assert native_columns.builder() is None


def test_an_unknown_choice_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native_columns.MODE_VARIABLE, "fastest")
    with pytest.raises(PolyprofError, match="POLYPROF_COLUMN_BUILDER='fastest' is not a column builder"):
        native_columns.builder()


def test_without_a_compiler_auto_converts_in_python_and_native_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYPROF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(native_columns, "_refused", {})
    assert native_columns.builder("auto") is None
    assert native_columns.failure() is None, "a missing compiler was remembered for hosts that have one"
    monkeypatch.setattr(native_columns, "_refused", {})
    with pytest.raises(native_columns.NativeColumnsUnavailable, match="no C\\+\\+ compiler"):
        native_columns.builder("native")
    source = tmp_path / "t.json"
    source.write_bytes(KINETO_LIKE)
    monkeypatch.setenv(native_columns.MODE_VARIABLE, "auto")
    convert_file(str(source), str(tmp_path / "t.parquet"))
    assert columnar.read_trace_document(tmp_path / "t.parquet") == orjson.loads(KINETO_LIKE)


def test_a_failed_build_is_remembered_and_not_retried_by_auto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYPROF_CACHE_DIR", str(tmp_path / "cache"))
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\necho 'fake-cxx: no luck' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setattr(native_columns, "_refused", {})
    assert native_columns.builder("auto") is None
    assert "exit 3" in (native_columns.failure() or "") and "no luck" in (native_columns.failure() or "")
    calls = []
    monkeypatch.setattr(native_columns, "build", lambda where=None: calls.append(where))
    monkeypatch.setattr(native_columns, "_refused", {})
    assert native_columns.builder("auto") is None
    assert calls == []


def test_the_build_lands_in_the_cache_and_loads_in_a_fresh_process_without_torch(tmp_path: Path) -> None:
    env = dict(os.environ, POLYPROF_CACHE_DIR=str(tmp_path / "cache"), POLYPROF_COLUMN_BUILDER="native")
    code = (
        "import sys; from polyprof import native_columns as n; m = n.builder(); "
        "print(m.__file__, 'torch' in sys.modules)"
    )

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0 and "no C++ compiler" in done.stderr:
            pytest.skip("no C++ compiler here")
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    first = run()
    path = Path(first.split()[0])
    assert first.split()[1] == "False"  # the builder needs no torch
    assert path.is_file() and path.parent.parent == tmp_path / "cache" / "chrome-columns"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    built_at = path.stat().st_mtime_ns
    assert run() == first and path.stat().st_mtime_ns == built_at  # found, not built again
