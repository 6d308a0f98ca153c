"""The compiled formatter of Chrome trace lines against the f-strings it stands in for.

Where polyprof's compiled module is built (native/chrome_lines.cpp, in the compiled
reader's module), the exporter writes its standard op lines through it; the f-strings
stay as the fallback. Both must write the same characters for every trace, which these
tests check on hypothesis traces, on every event form and chunking, and on the values
at the edges of int64. The byte-for-byte guards against torch's own writer
(test_differential.py, test_kineto_format.py) run on whichever path the run has.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof.base.events import EventKind
from polyprof.native import native_reader
from polyprof.runtime import chrome_trace
from polyprof.runtime.chrome_trace import render_chrome_trace
from test_chrome_trace import batch_from_rows, event_rows, every_args_form_rows, make_trace

pytest.importorskip("torch")

LITERAL, INTEGER, MILLIS, TABLE = 0, 1, 2, 3


HAS_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is not None
#: The layouts whose op lines differ: the newest, and torch 2.7's (``"finished": true`` in the args,
#: plain names without overloads).
LAYOUTS = {
    "newest": chrome_trace.NEWEST_LAYOUT,
    "torch-2.7": chrome_trace.KinetoLayout(
        time_keys_first=False,
        metadata_first=False,
        host_name=False,
        overload_in_names=False,
        finished_in_op_args=True,
    ),
}


@pytest.fixture(scope="module")
def format_rows() -> Any:
    if not HAS_COMPILER:
        pytest.skip("no C++ compiler here: the export writes with the f-strings only")
    return native_reader.reader("native").format_rows


def rendered(trace: Any, formatter: Any, chunk_events: int | None = None, layout: Any = None) -> str:
    """The trace's text with ``formatter`` (None: the f-strings only), that chunk size and layout."""
    with mock.patch.object(chrome_trace, "_line_formatter", lambda: formatter):
        if chunk_events is None:
            return "".join(render_chrome_trace(trace, "x.json", layout))
        with mock.patch.object(chrome_trace, "CHUNK_EVENTS", chunk_events):
            return "".join(render_chrome_trace(trace, "x.json", layout))


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
    flows=st.lists(
        st.tuples(st.integers(0, 24), st.integers(1, 2**40), st.booleans(), st.sampled_from([1, 2])),
        max_size=6,
    ),
    overloads=st.lists(st.sampled_from(["", "Tensor", "out"]), max_size=25),
    layout=st.sampled_from(sorted(LAYOUTS)),
)
def test_compiled_lines_are_the_f_strings_lines(
    format_rows: Any,
    rows: list[dict[str, Any]],
    chunk_events: int,
    stacks: list[tuple[str, ...]],
    flows: list[tuple[int, int, bool, int]],
    overloads: list[str],
    layout: str,
) -> None:
    for row, stack, overload in zip(rows, stacks, overloads):
        if row["kind"] in (int(EventKind.CPU_OP), int(EventKind.USER_ANNOTATION)):
            row.update(stack=stack, overload=overload)
    for at, flow_id, starts, flow_type in flows:  # fwdbwd (1) and ac2g (2)
        if at < len(rows) and row_takes_flow(rows[at]):
            rows[at].update(flow_id=flow_id, flow_type=flow_type, flow_start=starts)
    trace = make_trace(batch_from_rows(rows))
    expected = rendered(trace, None, chunk_events, LAYOUTS[layout])
    assert rendered(trace, format_rows, chunk_events, LAYOUTS[layout]) == expected


def row_takes_flow(row: dict[str, Any]) -> bool:
    return row["kind"] in (int(EventKind.CPU_OP), int(EventKind.USER_ANNOTATION))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("chunk_events", [1, 2, 3, 5, 20_000])
def test_every_event_form_alike(format_rows: Any, chunk_events: int, layout: str) -> None:
    trace = make_trace(batch_from_rows(every_args_form_rows()))
    with_formatter = rendered(trace, format_rows, chunk_events, LAYOUTS[layout])
    assert with_formatter == rendered(trace, None, chunk_events, LAYOUTS[layout])


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


def test_a_formatter_that_fails_leaves_the_lines_to_the_f_strings(format_rows: Any) -> None:
    calls = []

    def failing(count: int, segments: list) -> bytes:
        calls.append(count)
        raise RuntimeError("a column changed while its rows were written")

    trace = make_trace(batch_from_rows(op_rows(50, correlation_id=1)))
    assert rendered(trace, failing, chunk_events=20) == rendered(trace, None, chunk_events=20)
    assert calls == [20]  # the first failure leaves the rest of the export to the f-strings


def test_the_formatter_follows_the_reader_choice_and_never_builds(
    monkeypatch: pytest.MonkeyPatch, format_rows: Any
) -> None:
    monkeypatch.setenv(native_reader.MODE_VARIABLE, "python")
    assert chrome_trace._line_formatter() is None
    monkeypatch.setenv(native_reader.MODE_VARIABLE, "auto")
    assert chrome_trace._line_formatter() is not None
    monkeypatch.setenv(native_reader.MODE_VARIABLE, "fastest")  # a bad choice: the f-strings
    assert chrome_trace._line_formatter() is None
    for mode in ("native", "auto"):
        monkeypatch.setenv(native_reader.MODE_VARIABLE, mode)
        monkeypatch.setattr(native_reader, "build", lambda **_: pytest.fail("the export built the module"))
        monkeypatch.setattr(
            native_reader, "_start_background_build", lambda _: pytest.fail("it started a build")
        )
        monkeypatch.setattr(native_reader, "_loaded", {})
        monkeypatch.setattr(
            native_reader.BuildState, "of", classmethod(lambda cls, spec: cls(spec.folder(), False, None))
        )
        assert chrome_trace._line_formatter() is None  # not built: the f-strings


def test_writing_a_trace_never_imports_torch(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from polyprof.base.events import EventKind\n"
        "from polyprof.runtime.chrome_trace import write_chrome_trace\n"
        "from polyprof.testing import make_event_batch, make_trace\n"
        "assert 'torch' not in sys.modules, 'imported before writing'\n"
        "rows = [{'kind': int(EventKind.CPU_OP), 'name': 'op', 'start_ns': 10**9, 'dur_ns': 5}]\n"
        f"write_chrome_trace(make_trace(make_event_batch(rows)), {str(tmp_path / 't.json')!r})\n"
        "assert 'torch' not in sys.modules, 'imported by the export'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
