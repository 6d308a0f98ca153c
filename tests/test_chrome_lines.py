"""The compiled formatter of Chrome trace lines against the f-strings it stands in for.

Where polyprof's compiled module is built (native/chrome_lines.cpp, in the compiled
reader's module), the exporter writes its standard op lines through it; the f-strings
stay as the fallback. Both must write the same characters for every trace, which these
tests check on hypothesis traces, on every event form and chunking, and on the values
at the edges of int64. The byte-for-byte guards against torch's own writer
(test_differential.py, test_kineto_format.py) run on whichever path the run has.
"""

from __future__ import annotations

import sys
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof import native_reader
from polyprof.events import EventKind
from polyprof_builtins import chrome_trace
from polyprof_builtins.chrome_trace import render_chrome_trace
from test_chrome_trace import batch_from_rows, event_rows, every_args_form_rows, make_trace

pytest.importorskip("torch")

LITERAL, INTEGER, MILLIS, TABLE = 0, 1, 2, 3


@pytest.fixture(scope="module")
def format_rows() -> Any:
    module = native_reader.reader("auto")
    if module is None:
        pytest.skip(
            "polyprof's compiled module is not built here (no compiler, or POLYPROF_KINETO_READER=python)"
        )
    return module.format_rows


def rendered(trace: Any, formatter: Any, chunk_events: int | None = None) -> str:
    """The trace's text with ``formatter`` (None: the f-strings only) and, if given, that chunk size."""
    with mock.patch.object(chrome_trace, "_line_formatter", lambda: formatter):
        if chunk_events is None:
            return "".join(render_chrome_trace(trace, "x.json"))
        with mock.patch.object(chrome_trace, "CHUNK_EVENTS", chunk_events):
            return "".join(render_chrome_trace(trace, "x.json"))


def op_rows(n: int, **fields: Any) -> list[dict[str, Any]]:
    return [
        {
            "kind": int(EventKind.CPU_OP),
            "name": "aten::add",
            "start_ns": 10**9 + 1_000 * i,
            "dur_ns": 700,
            **fields,
        }
        for i in range(n)
    ]


# ------------------------------------------------------------------ the formatter itself


def test_integers_are_written_as_python_writes_them(format_rows: Any) -> None:
    values = np.array([0, 7, -1, 10, 99, 100, -(2**63), 2**63 - 1, 123456789012345678], dtype=np.int64)
    text = format_rows(len(values), [(INTEGER, values, None, None), (LITERAL, b"|", None, None)])
    assert text.decode() == "".join(f"{v}|" for v in values.tolist())


def test_milliseconds_tables_and_masks(format_rows: Any) -> None:
    millis = np.array([0, 5, 42, 999], dtype=np.int64)
    index = np.array([1, 0, 2, 1], dtype=np.int64)
    mask = np.array([True, False, True, True])
    segments = [
        (MILLIS, millis, None, None),
        (TABLE, index, [b"a", "é".encode(), b""], mask),
        (LITERAL, b";", None, None),
    ]
    assert format_rows(4, segments).decode() == "000é;005;042;999é;"


def test_no_rows_is_empty(format_rows: Any) -> None:
    assert format_rows(0, [(INTEGER, np.zeros(0, dtype=np.int64), None, None)]) == b""


@pytest.mark.parametrize(
    ("segment", "error", "message"),
    [
        (
            (TABLE, np.array([3], dtype=np.int64), [b"x"], None),
            IndexError,
            "table index 3 is outside a table of 1",
        ),
        ((TABLE, np.array([-1], dtype=np.int64), [b"x"], None), IndexError, "table index -1"),
        ((MILLIS, np.array([1000], dtype=np.int64), None, None), IndexError, "three-digit value is 1000"),
        (
            (INTEGER, np.array([1], dtype=np.int32), None, None),
            ValueError,
            "contiguous one-dimensional array of 1 int64",
        ),
        ((INTEGER, np.array([1, 2], dtype=np.int64), None, None), ValueError, "array of 1 int64"),
        ((INTEGER, np.array([1], dtype=np.int64), None, np.array([1], dtype=np.int64)), ValueError, "1 bool"),
        ((9, b"", None, None), ValueError, r"kind is 0 \(literal\).* not 9"),
    ],
)
def test_bad_segments_are_refused_naming_the_problem(
    format_rows: Any, segment: tuple, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        format_rows(1, [segment])


def test_strided_columns_are_refused(format_rows: Any) -> None:
    with pytest.raises(ValueError, match="contiguous"):
        format_rows(2, [(INTEGER, np.arange(4, dtype=np.int64)[::2], None, None)])


# ------------------------------------------------------------------ against the f-strings


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=event_rows(),
    chunk_events=st.integers(1, 8),
    stacks=st.lists(st.sampled_from([(), ("a.py(1): f",), ("b.py(2): g", "é.py(3): h")]), max_size=25),
    flows=st.lists(st.tuples(st.integers(0, 24), st.integers(1, 2**40), st.booleans()), max_size=6),
)
def test_compiled_lines_are_the_f_strings_lines(
    format_rows: Any,
    rows: list[dict[str, Any]],
    chunk_events: int,
    stacks: list[tuple[str, ...]],
    flows: list[tuple[int, int, bool]],
) -> None:
    for row, stack in zip(rows, stacks):
        if row["kind"] in (int(EventKind.CPU_OP), int(EventKind.USER_ANNOTATION)):
            row["stack"] = stack
    for at, flow_id, starts in flows:
        if at < len(rows) and row_takes_flow(rows[at]):
            rows[at].update(flow_id=flow_id, flow_type=1, flow_start=starts)
    trace = make_trace(batch_from_rows(rows))
    expected = rendered(trace, None, chunk_events)
    assert rendered(trace, format_rows, chunk_events) == expected


def row_takes_flow(row: dict[str, Any]) -> bool:
    return row["kind"] in (int(EventKind.CPU_OP), int(EventKind.USER_ANNOTATION))


@pytest.mark.parametrize("chunk_events", [1, 2, 3, 5, 20_000])
def test_every_event_form_alike(format_rows: Any, chunk_events: int) -> None:
    trace = make_trace(batch_from_rows(every_args_form_rows()))
    assert rendered(trace, format_rows, chunk_events) == rendered(trace, None, chunk_events)


def test_edge_values_alike(format_rows: Any) -> None:
    rows = op_rows(6, pid=-3, tid=2**62, correlation_id=2**62 + 5, sequence_nr=0, fwd_thread=-(2**40))
    rows[1].update(correlation_id=0, sequence_nr=-1)
    rows[2].update(name='quote " back \\ é \u2028', overload="Tensor")
    rows[3].update(dur_ns=0, start_ns=10**9)
    rows[4].update(shapes=((1, 2), ()), name="")
    trace = make_trace(batch_from_rows(rows))
    text = rendered(trace, format_rows)
    assert text == rendered(trace, None)
    assert '"pid": -3, "tid": 4611686018427387904' in text


def test_the_compiled_formatter_writes_the_op_lines(format_rows: Any) -> None:
    """Not vacuous: the exporter hands the standard op lines to the formatter."""
    calls = []

    def counting(count: int, segments: list) -> bytes:
        calls.append(count)
        return format_rows(count, segments)

    trace = make_trace(batch_from_rows(op_rows(50, correlation_id=1)))
    assert rendered(trace, counting, chunk_events=20) == rendered(trace, None, chunk_events=20)
    assert calls == [20, 20, 10]


def test_a_value_that_cannot_be_handed_over_falls_back_to_the_f_strings(format_rows: Any) -> None:
    assert chrome_trace._exact_int64(np.array([2**63 - 1], dtype=np.uint64)).tolist() == [2**63 - 1]
    with pytest.raises(chrome_trace._NotFormattable):
        chrome_trace._exact_int64(np.array([2**63], dtype=np.uint64))
    with pytest.raises(chrome_trace._NotFormattable):
        chrome_trace._exact_int64(np.array([1.5]))

    def refusing(count: int, segments: list) -> bytes:
        raise chrome_trace._NotFormattable("a value it cannot write")

    trace = make_trace(batch_from_rows(op_rows(5)))
    assert rendered(trace, refusing) == rendered(trace, None)


def test_the_formatter_follows_the_reader_choice(monkeypatch: pytest.MonkeyPatch, format_rows: Any) -> None:
    monkeypatch.setenv(native_reader.MODE_VARIABLE, "python")
    assert chrome_trace._line_formatter() is None
    monkeypatch.setenv(native_reader.MODE_VARIABLE, "auto")
    assert chrome_trace._line_formatter() is not None
    monkeypatch.setenv(native_reader.MODE_VARIABLE, "fastest")  # a bad choice: the f-strings, a warning
    assert chrome_trace._line_formatter() is None


def test_no_torch_is_imported_to_write_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    assert chrome_trace._line_formatter() is None
    assert "torch" not in sys.modules
