"""The CPU tracer's decoder on torch's raw result, including torch's rough edges."""

from __future__ import annotations

import numpy as np
import pytest

from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import EventKind
from polyprof.runtime.torch_cpu import decode_result


class FakeKinetoEvent:
    """Answers the accessors the decoder reads, like torch's ``_KinetoEvent``."""

    def __init__(self, name, start, dur, *, thread=1, kind="cpu_op", hidden=False, bad_name=False, corr=1):
        self._name, self._start, self._dur = name, start, dur
        self._thread, self._kind, self._hidden, self._bad, self._corr = thread, kind, hidden, bad_name, corr

    def name(self):
        if self._bad:
            raise UnicodeDecodeError("utf-8", b"\x8f", 0, 1, "invalid start byte")
        return self._name

    def start_ns(self):
        return self._start

    def end_ns(self):
        return self._start + self._dur

    def start_thread_id(self):
        return self._thread

    def end_thread_id(self):
        return self._thread

    def activity_type(self):
        return self._kind

    def is_user_annotation(self):
        return self._kind == "user_annotation"

    def is_python_function(self):
        return self._kind == "python_function"

    def is_async(self):
        return False

    def is_hidden_event(self):
        return self._hidden

    def device_resource_id(self):
        return 4242

    def correlation_id(self):
        return self._corr

    def flow_id(self):
        return 0

    def flow_type(self):
        return 0

    def flow_start(self):
        return False

    def sequence_nr(self):
        return -1

    def fwd_thread_id(self):
        return 0

    def scope(self):
        return 0

    # What FunctionEvent attributes read (deferred), with torch's values for a plain CPU op.
    def python_module_id(self):
        return -1

    def metadata_json(self):
        return ""

    def extra_meta(self):
        return {}

    def typed_metadata(self):
        return {}


class FakeResult:
    def __init__(self, events):
        self._events = events

    def events(self):
        return list(self._events)

    def trace_start_ns(self):
        return 1_000

    def trace_activities(self):
        return []

    def save(self, path):
        """torch's writer, for torch without flow accessors (< 2.13): a trace with no events."""
        with open(path, "w") as file:
            file.write('{"traceEvents": []}')


CONFIG = ProfileConfig(activities={ProfilerActivity.CPU})


def test_basic_columns_and_deferred_columns() -> None:
    result = FakeResult(
        [
            FakeKinetoEvent("outer", 1_000, 500, kind="user_annotation", corr=1),
            FakeKinetoEvent("aten::add", 1_100, 100, corr=2),
        ]
    )
    batch, facts = decode_result(result, CONFIG, pid=7)
    assert facts == {"start_ns": 1_000, "notes": []}
    assert batch.values("name") == ["outer", "aten::add"]
    assert batch["kind"].tolist() == [EventKind.USER_ANNOTATION, EventKind.CPU_OP]
    assert batch["dur_ns"].tolist() == [500, 100]
    assert "correlation_id" not in batch.columns  # deferred until a trace needs it
    assert batch["correlation_id"].tolist() == [1, 2]
    assert batch["tid"].tolist() == [4242, 4242]


def test_unsigned_thread_ids_keep_their_bits() -> None:
    result = FakeResult([FakeKinetoEvent("aten::add", 1_000, 10, thread=2**64 - 1)])
    batch, _ = decode_result(result, CONFIG, pid=7)
    assert batch["thread"].tolist() == [-1]


def test_hidden_events_are_skipped_as_torch_does() -> None:
    """torch drops hidden events from 2.9, where the accessor appears; older torch reads them all."""
    from polyprof.base import torch_support

    result = FakeResult(
        [FakeKinetoEvent("aten::add", 1_000, 10), FakeKinetoEvent("hidden", 1_005, 1, hidden=True, corr=9)]
    )
    batch, _ = decode_result(result, CONFIG, pid=7)
    if torch_support.installed().has_accessor("is_hidden_event"):
        assert batch.values("name") == ["aten::add"]
        assert batch["correlation_id"].tolist() == [1]
    else:
        assert batch.values("name") == ["aten::add", "hidden"]
        assert batch["correlation_id"].tolist() == [1, 9]


def test_undecodable_names_are_marked_not_fatal() -> None:
    result = FakeResult(
        [FakeKinetoEvent("x", 1_000, 10, bad_name=True), FakeKinetoEvent("aten::mul", 1_020, 5)]
    )
    batch, _ = decode_result(result, CONFIG, pid=7)
    assert batch.values("name") == ["<undecodable name>", "aten::mul"]


def test_real_torch_result_round_trip() -> None:
    torch = pytest.importorskip("torch")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(3).add(1)
    result = prof.profiler.kineto_results
    batch, facts = decode_result(result, CONFIG)
    assert facts["start_ns"] == result.trace_start_ns()
    names = batch.values("name")
    assert "aten::add" in names and len(names) == len(result.events())


def test_rerooted_python_frames_are_written_as_torch_writes_a_root_frame() -> None:
    # Kineto's own text for two frames; the second's parent was one of polyprof's bus-thread frames.
    from polyprof.base import torch_support
    from polyprof.base.kineto_format import encode_args_table, kineto_args_column
    from polyprof.runtime.torch_cpu import _with_python_parents

    texts = [
        '"Python parent id": null, "Python id": 12, "Ev Idx": 71',
        '"Python parent id": 40, "Python id": 13, "Ev Idx": 72',
    ]
    indices, table = kineto_args_column(texts)
    indices, table = _with_python_parents(indices, table, np.array([1]), np.array([-1]))
    written = encode_args_table(table)
    assert written[indices[0]] == texts[0]  # untouched: Kineto's text as it was
    if torch_support.installed().at_least(2, 15):  # 2.15 leaves the key out of a root frame
        assert written[indices[1]] == '"Python id": 13, "Ev Idx": 72'
    else:
        assert written[indices[1]] == '"Python parent id": null, "Python id": 13, "Ev Idx": 72'


@pytest.mark.parametrize("eager_limit", [0, 10**9], ids=["deferred", "small-profile"])
def test_small_profiles_decode_every_column_at_the_exit(
    eager_limit: int, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """Up to EAGER_DECODE_EVENTS events the deferred columns are read at the exit, so the first
    export finds them decoded (and torch's result already let go of); above it they wait for it."""
    torch = pytest.importorskip("torch")
    from polyprof import profile
    from polyprof.runtime import torch_cpu

    decodes: list[str] = []
    real = torch_cpu._DeferredDecoder._decode_all
    monkeypatch.setattr(
        torch_cpu._DeferredDecoder,
        "_decode_all",
        lambda self, **kw: decodes.append("decoded") or real(self, **kw),
    )
    monkeypatch.setattr(torch_cpu, "EAGER_DECODE_EVENTS", eager_limit)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(3).add_(1).mul_(2)
    prof.key_averages().table()
    at_exit = list(decodes)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    # torch < 2.13 reads its own writer's file for the flows: never at the exit
    eager = eager_limit > 0 and torch_cpu.torch_support.installed().has_accessor("flow_id")
    assert at_exit == (["decoded"] if eager else [])
    assert decodes == ["decoded"]  # once either way


def test_a_failed_decode_at_the_exit_leaves_the_columns_to_the_export(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    torch = pytest.importorskip("torch")
    from polyprof import profile
    from polyprof.runtime import torch_cpu

    if not torch_cpu.torch_support.installed().has_accessor("flow_id"):
        pytest.skip("torch < 2.13 decodes nothing more at the exit")
    attempts: list[int] = []
    real = torch_cpu._DeferredDecoder._read

    def fails_once(self, rows):
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("a trace-only accessor failed")
        return real(self, rows)

    monkeypatch.setattr(torch_cpu._DeferredDecoder, "_read", fails_once)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(3).add_(1).mul_(2)
    assert "aten::add_" in prof.key_averages().table()  # the table never needed those columns
    path = prof.export_chrome_trace(str(tmp_path / "t.json")) or str(tmp_path / "t.json")
    assert attempts == [1, 1]  # the export decoded them again, from the rows kept
    assert "aten::mul_" in open(path, encoding="utf-8").read()
