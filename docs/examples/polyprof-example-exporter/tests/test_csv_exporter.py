"""Tests for the example CSV exporter, written the way a plugin author would.

Run from this directory: ``python -m pytest tests``. No torch, no GPU: the
trace is built from event dicts with ``polyprof.testing``.
"""

from __future__ import annotations

import csv
import gzip
import os

import pytest
from polyprof.plugin import EventKind
from polyprof.testing import make_event_batch, make_plugin_manager_for_tests, make_trace

import polyprof_example_exporter
from polyprof_example_exporter import COLUMNS, CsvExporter

T0 = 1_700_000_000_000_000_000  # an epoch timestamp in ns


@pytest.fixture
def trace():
    batch = make_event_batch(
        [
            {
                "name": "aten::mm",
                "start_ns": T0 + 2_500,
                "dur_ns": 1_234,
                "thread": 1,
                "shapes": [[2, 3], [3, 4]],
            },
            {
                "name": "outer",
                "kind": EventKind.USER_ANNOTATION,
                "start_ns": T0,
                "dur_ns": 10_000,
                "thread": 1,
            },
            {"name": "[memory]", "kind": EventKind.MEMORY, "start_ns": T0 + 7, "nbytes": -64},
        ]
    )
    return make_trace(batch, start_ns=T0)


def read_rows(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_plugin_registers_and_builds_the_exporter(trace, tmp_path):
    pm = make_plugin_manager_for_tests(polyprof_example_exporter)
    assert pm.plugin_info("polyprof_example_exporter").status == "loaded"
    assert pm.exporter_names() == ["csv"]
    exporter = pm.make_exporter(trace.config, "csv")
    assert isinstance(exporter, CsvExporter)
    out = exporter.export(trace, str(tmp_path / "ops.csv"))
    rows = read_rows(out)
    assert [r["name"] for r in rows] == ["outer", "[memory]", "aten::mm"]  # sorted by start
    assert [r["category"] for r in rows] == ["user_annotation", "memory", "cpu_op"]
    assert [r["start_us"] for r in rows] == ["0.000", "0.007", "2.500"]
    assert rows[2]["dur_us"] == "1.234"
    assert rows[2]["input_shapes"] == "[[2, 3], [3, 4]]"
    assert rows[0]["input_shapes"] == ""


def test_epoch_times_are_exact_and_gzip_works(trace, tmp_path):
    out = CsvExporter().export(
        trace, str(tmp_path / "ops.csv.gz"), time_origin="epoch", columns="name,start_us"
    )
    rows = read_rows(out)
    assert rows[2] == {"name": "aten::mm", "start_us": "1700000000000002.500"}


def test_all_columns_and_bad_choices(trace, tmp_path):
    out = CsvExporter(columns="all").export(trace, str(tmp_path / "all.csv"))
    assert list(read_rows(out)[0]) == list(COLUMNS)
    with pytest.raises(ValueError, match="valid columns: name, category"):
        CsvExporter(columns=["name", "nope"])
    with pytest.raises(ValueError, match="valid: trace, epoch"):
        CsvExporter(time_origin="monotonic")


def test_failed_export_leaves_no_file(trace, tmp_path):
    target = tmp_path / "ops.csv"
    target.write_text("previous\n")

    class Boom(Exception):
        pass

    def broken_rows(*args):
        yield ("ok",) * len(CsvExporter().columns)
        raise Boom

    exporter = CsvExporter()
    exporter.rows = broken_rows  # fail half-way through writing
    with pytest.raises(Boom):
        exporter.export(trace, str(target))
    assert target.read_text() == "previous\n"
    assert os.listdir(tmp_path) == ["ops.csv"]


def test_empty_trace_writes_only_the_header(tmp_path):
    out = CsvExporter().export(make_trace(), str(tmp_path / "empty.csv"))
    with open(out, newline="", encoding="utf-8") as f:
        assert list(csv.reader(f)) == [list(CsvExporter().columns)]
