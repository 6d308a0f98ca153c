"""The export's fast paths: what they skip, and that the text they write is Kineto's.

The byte-for-byte guards against torch's own writer are test_chrome_trace.py,
test_differential.py and test_kineto_format.py; these tests pin what the fast
paths leave out: the flow details of events without a flow (deferred decode),
and the separate args strings of ops whose args the line's f-string writes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from polyprof.base.events import EventKind
from polyprof.runtime import chrome_trace
from polyprof.runtime.chrome_trace import NEWEST_LAYOUT, _ArgsText, _Columns, _event_lines, _lanes
from test_chrome_trace import batch_from_rows

torch = pytest.importorskip("torch")
torch_cpu = pytest.importorskip("polyprof.runtime.torch_cpu")
if not torch_cpu.torch_support.installed().has_accessor("flow_id"):
    pytest.skip("the installed torch has no flow accessors", allow_module_level=True)


class FakeEvent:
    """Stands in for ``_KinetoEvent``: flow accessors only, counting the detail calls."""

    calls: dict[str, int]

    def __init__(self, flow: tuple[int, int, bool] = (0, 0, False)) -> None:
        self._flow = flow

    def flow_id(self) -> int:
        return self._flow[0]

    def flow_type(self) -> int:
        FakeEvent.calls["flow_type"] += 1
        return self._flow[1]

    def flow_start(self) -> bool:
        FakeEvent.calls["flow_start"] += 1
        return self._flow[2]


def _rows(events: list[FakeEvent]) -> Any:
    """The fakes as the decoder's rows (a stand-in result is read through its accessors)."""
    from polyprof.runtime.result_rows import ResultRows

    class FakeResult:
        def events(self) -> list[FakeEvent]:
            return events

    return ResultRows(FakeResult(), None)


FLOW_SCALARS = (
    ("flow_id", "flow_id", "int64"),
    ("flow_type", "flow_type", "int8"),
    ("flow_start", "flow_start", "bool"),
)


def test_flow_details_are_read_only_for_events_with_a_flow() -> None:
    FakeEvent.calls = {"flow_type": 0, "flow_start": 0}
    events = [FakeEvent() for _ in range(10)]
    events[3] = FakeEvent((41, 1, True))
    events[7] = FakeEvent((41, 1, False))

    columns = torch_cpu._scalar_columns(_rows(events), FLOW_SCALARS)

    assert FakeEvent.calls == {"flow_type": 2, "flow_start": 2}
    assert columns["flow_id"].tolist() == [0, 0, 0, 41, 0, 0, 0, 41, 0, 0]
    assert columns["flow_type"].tolist() == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    assert columns["flow_start"].tolist() == [False, False, False, True] + [False] * 6
    assert columns["flow_type"].dtype == np.int8 and columns["flow_start"].dtype == np.bool_


def test_flow_details_without_flow_ids_are_read_for_every_event() -> None:
    FakeEvent.calls = {"flow_type": 0, "flow_start": 0}
    events = [FakeEvent((0, 0, False)), FakeEvent((5, 2, True))]

    columns = torch_cpu._scalar_columns(_rows(events), FLOW_SCALARS[1:])

    assert FakeEvent.calls == {"flow_type": 2, "flow_start": 2}
    assert columns["flow_type"].tolist() == [0, 2]


def test_deferred_flows_match_torch_on_a_backward_pass() -> None:
    from polyprof import ProfilerActivity, profile

    model = torch.nn.Linear(4, 2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(torch.randn(3, 4)).sum().backward()
    with torch.autograd.profiler.profile(use_kineto=True) as reference:
        model(torch.randn(3, 4)).sum().backward()
    flows = sorted(
        (e.flow_type(), e.flow_start()) for e in reference.kineto_results.events() if e.flow_id() != 0
    )
    assert flows, "torch drew no fwdbwd flows: the workload no longer tests anything"
    trace = prof._require_results().traces[-1].events
    ours = sorted(
        zip(trace["flow_type"][trace["flow_id"] != 0].tolist(), trace["flow_start"][trace["flow_id"] != 0])
    )
    assert [(t, bool(s)) for t, s in ours] == flows


def op(**fields: Any) -> dict[str, Any]:
    return {"kind": int(EventKind.CPU_OP), "name": "aten::mm", "start_ns": 5_000, "dur_ns": 1_500, **fields}


ROWS = [
    op(correlation_id=5, sequence_nr=3, fwd_thread=7, shapes=((2, 3), (3,)), stack=("a.py(1): f",)),
    op(correlation_id=0, sequence_nr=-1, start_ns=6_000),
    op(correlation_id=9, sequence_nr=-1, start_ns=7_000),
    op(correlation_id=0, sequence_nr=0, fwd_thread=1, start_ns=8_000),
    op(correlation_id=4, args={"note": "torch's fragment"}, start_ns=9_000),
    {"kind": int(EventKind.MEMORY), "name": "[memory]", "start_ns": 9_500, "dur_ns": 0, "nbytes": 64},
]
EXPECTED_ARGS = [
    (
        '{"External id": 5, "Record function id": 0, "Sequence number": 3, "Fwd thread id": 7, '
        '"Input Dims": [[2, 3], [3]], "Call stack": "a.py(1): f;", "Ev Idx": 0}'
    ),
    '{"Record function id": 0, "Ev Idx": 1}',
    '{"External id": 9, "Record function id": 0, "Ev Idx": 2}',
    '{"Record function id": 0, "Sequence number": 0, "Fwd thread id": 1, "Ev Idx": 3}',
    '{"External id": 4, "note": "torch\'s fragment"}',
]


def rendered_lines(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]]) -> tuple[list[str], list]:
    """The event lines of ``rows`` and the ``skip`` masks ``_ArgsText.chunk`` was given."""
    skips: list = []
    chunk = _ArgsText.chunk

    def spy(self: _ArgsText, lo: int, hi: int, skip: np.ndarray | None = None) -> list[str]:
        skips.append(None if skip is None else skip.copy())
        return chunk(self, lo, hi, skip)

    monkeypatch.setattr(_ArgsText, "chunk", spy)
    cols = _Columns(batch_from_rows(rows))
    pid, tid = _lanes(cols)
    text = "".join(
        c if isinstance(c, str) else c.decode() for c in _event_lines(cols, 0, pid, tid, NEWEST_LAYOUT)
    )
    return [line.rstrip(",") for line in text.splitlines()], skips


def test_standard_op_args_are_written_in_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    lines, skips = rendered_lines(monkeypatch, ROWS)

    raw_args = [line[line.index('"args": ') + len('"args": ') : -1] for line in lines[:5]]
    assert raw_args == EXPECTED_ARGS
    assert json.loads(lines[0])["ts"] == 5.0 and json.loads(lines[0])["dur"] == 1.5
    assert all(json.loads(line)["cat"] in ("cpu_op", "cpu_instant_event") for line in lines)
    # the four ops with standard args never had a separate args string made
    assert [mask.tolist() for mask in skips] == [[True, True, True, True, False, False]]


def test_standard_op_args_keep_their_place_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chrome_trace, "CHUNK_EVENTS", 2)
    lines, skips = rendered_lines(monkeypatch, ROWS)

    raw_args = [line[line.index('"args": ') + len('"args": ') : -1] for line in lines[:5]]
    assert raw_args == EXPECTED_ARGS
    # chunks of standard ops only make no args strings at all
    assert [mask.tolist() for mask in skips] == [[False, False]]
