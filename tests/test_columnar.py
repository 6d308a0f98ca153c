"""Parquet traces: the Chrome document as columns and back, the "parquet" exporter, ``polyprof convert``."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from polyprof.cli import main as cli_main  # noqa: E402
from polyprof.formats import columnar  # noqa: E402
from polyprof.formats.chrome_reader import TraceFileError, load_chrome_trace  # noqa: E402

# --------------------------------------------------------------- documents

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
# The typed keys, often with values of their column's type and sometimes not, and other keys.
event_keys = st.sampled_from(
    ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args", "s", "bp", "tts", "cname"]
)
typed_values = st.one_of(
    st.sampled_from(["X", "i", "M", "s", "f", "C", "cpu_op", "kernel", "aten::add", "Spans"]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(min_value=-1e15, max_value=1e15, allow_nan=False),
    json_values,
)
events = st.dictionaries(st.one_of(event_keys, st.text(max_size=5)), typed_values, max_size=10)
documents = st.fixed_dictionaries(
    {"traceEvents": st.lists(events, max_size=12)},
    optional={
        "schemaVersion": st.just(1),
        "deviceProperties": st.lists(
            st.dictionaries(st.text(max_size=4), json_scalars, max_size=3), max_size=2
        ),
        "distributedInfo": st.fixed_dictionaries(
            {"backend": st.just("gloo"), "rank": st.integers(0, 7), "world_size": st.just(8)}
        ),
        "traceName": st.text(max_size=10),
        "baseTimeNanoseconds": st.integers(0, 2**62),
    },
)


def as_parsed_json(doc: Any) -> Any:
    """``doc`` as a JSON reader gives it back (what a file on disk holds)."""
    return orjson.loads(orjson.dumps(doc))


@settings(max_examples=300, deadline=None)
@given(documents)
def test_any_chrome_document_comes_back_from_its_columns(doc: dict[str, Any]) -> None:
    doc = as_parsed_json(doc)
    back = columnar.chrome_from_table(columnar.table_from_chrome(doc))
    assert back == doc
    assert list(back) == list(doc)  # top-level keys in their order, traceEvents where it was
    for ours, theirs in zip(back["traceEvents"], doc["traceEvents"], strict=True):
        # bool is an int to Python's ==: types must come back too (True is not 1 in JSON)
        assert {k: type(v) for k, v in ours.items() if not isinstance(v, (int, float))} == {
            k: type(v) for k, v in theirs.items() if not isinstance(v, (int, float))
        }
        assert {k for k, v in ours.items() if isinstance(v, bool)} == {
            k for k, v in theirs.items() if isinstance(v, bool)
        }


@settings(max_examples=25, deadline=None)
@given(doc=documents)
def test_any_chrome_document_comes_back_from_a_parquet_file(tmp_path_factory, doc: dict[str, Any]) -> None:
    doc = as_parsed_json(doc)
    path = tmp_path_factory.mktemp("pq") / "t.parquet"
    columnar.write_parquet_trace(doc, path)
    assert columnar.read_trace_document(path) == doc
    assert orjson.loads(orjson.dumps(columnar.read_trace_document(path))) == doc


def test_columns_are_typed_and_values_that_do_not_fit_go_to_extra() -> None:
    doc = {
        "schemaVersion": 1,
        "traceEvents": [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::add",
                "pid": 7,
                "tid": 9,
                "ts": 1.5,
                "dur": 2,
                "args": {"External id": 3},
            },
            {"ph": "M", "name": "process_name", "pid": "Spans", "tid": "PyTorch Profiler", "args": {}},
            {"ph": "i", "s": "t", "name": None, "pid": 1.5, "ts": "late", "id": True},
        ],
        "distributedInfo": {"backend": "gloo", "rank": 3, "world_size": 4},
    }
    table = columnar.table_from_chrome(doc)
    assert table.schema.field("pid").type == pa.int64() and table.schema.field("ts").type == pa.float64()
    rows = table.to_pylist()
    assert rows[0]["pid"] == 7 and rows[0]["ts"] == 1.5 and rows[0]["dur"] == 2.0 and rows[0]["extra"] is None
    assert json.loads(rows[0]["args"]) == {"External id": 3}
    assert (rows[1]["pid"], rows[1]["pid_label"], rows[1]["tid_label"]) == (None, "Spans", "PyTorch Profiler")
    assert json.loads(rows[2]["extra"]) == {"s": "t", "name": None, "pid": 1.5, "ts": "late", "id": True}
    metadata = table.schema.metadata
    assert metadata[b"polyprof.format"] == columnar.FORMAT.encode()
    assert (metadata[b"polyprof.rank"], metadata[b"polyprof.world_size"]) == (b"3", b"4")
    assert columnar.chrome_from_table(table) == doc


def test_duckdb_reads_the_columns_without_polyprof(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": float(i), "dur": d}
            for i, (n, d) in enumerate([("a", 1.0), ("b", 2.5), ("a", 3.0)])
        ]
    }
    path = columnar.write_parquet_trace(doc, tmp_path / "t.parquet")
    rows = duckdb.sql(f"select name, sum(dur) from '{path}' group by name order by name").fetchall()
    assert rows == [("a", 4.0), ("b", 2.5)]


# ------------------------------------------------------------ real traces


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict[str, Path]:
    """A small profile exported by torch.profiler and by polyprof (Chrome JSON), and polyprof's Parquet."""
    torch = pytest.importorskip("torch")
    import polyprof

    folder = tmp_path_factory.mktemp("profiles")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    with torch.profiler.profile(record_shapes=True) as torch_prof:
        model(x).sum().backward()
    torch_prof.export_chrome_trace(str(folder / "torch.json"))
    with polyprof.profile(record_shapes=True) as prof:
        model(x).sum().backward()
    prof.export_chrome_trace(str(folder / "polyprof.json"))
    prof.export(str(folder / "polyprof.parquet"), format="parquet")
    return {
        "torch": folder / "torch.json",
        "polyprof": folder / "polyprof.json",
        "parquet": folder / "polyprof.parquet",
    }


def test_the_parquet_exporter_holds_the_chrome_exporters_trace(profiles: dict[str, Path]) -> None:
    from_parquet = columnar.read_trace_document(profiles["parquet"])
    from_json = load_chrome_trace(profiles["polyprof"])
    assert from_parquet.pop("traceName") == str(profiles["parquet"])
    assert from_json.pop("traceName") == str(profiles["polyprof"])
    assert from_parquet == from_json


@pytest.mark.parametrize("source", ["torch", "polyprof"])
def test_convert_to_parquet_and_back_gives_the_trace_again(
    profiles: dict[str, Path], tmp_path: Path, capsys, source: str
) -> None:
    parquet, back = tmp_path / "t.parquet", tmp_path / "back.json.gz"
    assert cli_main(["convert", str(profiles[source]), str(parquet)]) == 0
    assert cli_main(["convert", str(parquet), str(back)]) == 0
    assert capsys.readouterr().out.split() == [str(parquet), str(back)]
    with gzip.open(back) as f:
        assert json.load(f) == json.loads(profiles[source].read_text())


def test_report_reads_a_parquet_trace_as_its_json(profiles: dict[str, Path], capsys) -> None:
    assert cli_main(["report", str(profiles["polyprof"])]) == 0
    from_json = capsys.readouterr().out
    assert cli_main(["report", str(profiles["parquet"])]) == 0
    assert capsys.readouterr().out == from_json


def test_convert_a_directory_skips_bad_files_by_name_and_writes_the_rest(
    profiles: dict[str, Path], tmp_path: Path, capsys
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    good = profiles["torch"].read_bytes()
    (traces / "rank0.json").write_bytes(good)
    (traces / "rank1.json.gz").write_bytes(gzip.compress(good))
    (traces / "rank2.json").write_bytes(good[: len(good) // 2])  # truncated
    (traces / "rank3.json").write_text('{"traceEvents": 5}')  # not a trace
    (traces / "rank4.parquet").write_bytes(b"PAR1 not really")
    (traces / "notes.txt").write_text("not a trace name: not looked at")
    out = tmp_path / "out"
    assert cli_main(["convert", str(traces), "-o", str(out), "--to", "parquet"]) == 1
    captured = capsys.readouterr()
    assert sorted(os.listdir(out)) == ["rank0.parquet", "rank1.parquet"]
    for name in ("rank2.json", "rank3.json", "rank4.parquet"):
        assert f"skipped {traces / name}: " in captured.err
    assert "2 of 5 traces written" in captured.err
    assert columnar.read_trace_document(out / "rank1.parquet") == json.loads(good)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["a.json", "b.csv"], "cannot tell the format to write from 'b.csv'"),
        (["a.json"], "give SOURCE DESTINATION (1 paths given)"),
        (["a.json", "b.parquet", "--to", "json"], "--to goes with -o DIR"),
        (["same.parquet", "same.parquet"], "would be converted onto itself"),
        (["missing.json", "b.parquet"], "missing.json"),
        (["a.txt", "b.parquet"], "not a trace file name: it must end in .json, .json.gz, .parquet"),
    ],
)
def test_bad_conversions_are_named(
    tmp_path: Path, capsys, monkeypatch, argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli_main(["convert", *argv]) != 0
    assert message in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_a_parquet_file_not_written_by_polyprof_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"name": ["a"]}), path)
    with pytest.raises(
        TraceFileError, match=r"other.parquet: not a readable polyprof Parquet trace: .*polyprof.format"
    ):
        columnar.read_trace_document(path)


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="traceEvents\\[1\\] is not a JSON object"):
        columnar.write_parquet_trace({"traceEvents": [{}, 3]}, tmp_path / "t.parquet")
    assert os.listdir(tmp_path) == []


def test_what_only_pythons_parser_reads_comes_back_too(tmp_path: Path, capsys) -> None:
    """NaN, infinities, integers past 64 bits and lone surrogates: orjson reads and writes none of them."""
    source = tmp_path / "odd.json"
    source.write_text(
        '{"traceEvents": [{"ph": "X", "name": "a\\ud800", "ts": NaN, "dur": 1, '
        '"args": {"big": 18446744073709551616, "inf": Infinity, "s": "\\udfff"}}], "note": -Infinity}'
    )
    parquet, back = tmp_path / "odd.parquet", tmp_path / "back.json"
    assert cli_main(["convert", str(source), str(parquet)]) == 0
    assert cli_main(["convert", str(parquet), str(back)]) == 0
    expected, got = json.loads(source.read_text()), json.loads(back.read_text())
    event, want = got["traceEvents"][0], expected["traceEvents"][0]
    assert math.isnan(event.pop("ts")) and math.isnan(want.pop("ts"))  # NaN is never equal to itself
    assert event == want and got["note"] == float("-inf")
    assert event["name"] == "a\ud800" and event["args"]["big"] == 2**64


def test_two_sources_with_one_destination_are_not_written_over_each_other(
    profiles: dict[str, Path], tmp_path: Path, capsys
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    good = profiles["torch"].read_bytes()
    (traces / "a.json").write_bytes(good)
    (traces / "a.json.gz").write_bytes(gzip.compress(good))
    assert cli_main(["convert", str(traces), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    destination = tmp_path / "out" / "a.parquet"
    assert f"skipped {traces / 'a.json.gz'}: its destination {destination} is {traces / 'a.json'}'s" in err
    assert "1 of 2 traces written" in err


def test_a_damaged_polyprof_parquet_file_is_named_and_the_others_converted(
    profiles: dict[str, Path], tmp_path: Path, capsys
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    table = pq.read_table(profiles["parquet"])
    damaged = table.set_column(
        table.column_names.index("extra"), "extra", pa.array(["[1, 2]"] * table.num_rows, type=pa.string())
    )
    pq.write_table(damaged, traces / "a.parquet")
    pq.write_table(table.drop_columns(["args"]), traces / "b.parquet")
    (traces / "c.parquet").write_bytes(profiles["parquet"].read_bytes())
    assert cli_main(["convert", str(traces), "-o", str(tmp_path / "out"), "--to", "json"]) == 1
    err = capsys.readouterr().err
    assert f"skipped {traces / 'a.parquet'}: not a readable polyprof Parquet trace" in err
    assert f"skipped {traces / 'b.parquet'}: " in err and "lacks the columns ['args']" in err
    assert sorted(os.listdir(tmp_path / "out")) == ["c.json"]
    assert cli_main(["report", str(traces / "a.parquet")]) != 0
    assert "not a readable polyprof Parquet trace" in capsys.readouterr().err
