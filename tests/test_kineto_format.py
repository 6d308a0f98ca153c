"""polyprof.base.kineto_format: the one definition of the Chrome / Kineto trace format.

The writer (the "chrome" exporter) and the reader (``polyprof report``) both
take the format from this module; these tests write traces, read them back
and check that every category, device, flow and args key round-trips, that no
other module keeps its own copy of the tables, and that the ``args`` column
holds structured values that only the exporter turns into JSON.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

from polyprof.base import events as events_module
from polyprof.base import kineto_format
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import (
    FIELDS,
    DeviceType,
    EventBatch,
    EventKind,
    Interner,
    intern_column,
    intern_structured_column,
)
from polyprof.base.kineto_format import (
    Arg,
    KinetoArgsText,
    args_mapping,
    encode_args,
    encode_args_table,
    kind_of_category,
    kineto_args_column,
)
from polyprof.base.trace import Trace
from polyprof.formats.chrome_reader import read_chrome_trace
from polyprof.runtime.chrome_trace import render_chrome_trace, write_chrome_trace

ROOT = Path(__file__).resolve().parents[1]
BASE = 1_790_857_026_000_000_000
T0 = BASE + 4_458_382_328_507_564
PID, TID = 7703, 7704


# ------------------------------------------------------------------ helpers


def batch_of(rows: list[dict[str, Any]]) -> EventBatch:
    fields = sorted({key for row in rows for key in row} | {"kind", "name", "start_ns", "dur_ns"})
    columns: dict[str, Any] = {}
    tables: dict[str, tuple] = {}
    for field in fields:
        spec = FIELDS[field]
        values = [row.get(field) for row in rows]
        if field == "args":
            columns[field], tables[field] = intern_structured_column(values)
        elif spec.interned:
            columns[field], tables[field] = intern_column(values)
        else:
            columns[field] = np.asarray([spec.default if v is None else v for v in values], dtype=spec.dtype)
    return EventBatch.build("test", columns, tables)


def trace_of(batch: EventBatch) -> Trace:
    return Trace(
        events=batch,
        config=ProfileConfig(activities={ProfilerActivity.CPU}),
        start_ns=T0,
        end_ns=T0 + 10_000_000,
        pid=PID,
        hostname="testhost",
        trace_id="0123456789ABCDEF0123456789ABCDEF",
    )


def text_of(batch: EventBatch) -> str:
    return "".join(render_chrome_trace(trace_of(batch), "t.json", kineto_format.NEWEST_LAYOUT))


#: torch's names of its memory instants (Kineto files both under one category; the name tells them apart).
SPECIAL_NAMES = {
    EventKind.MEMORY: kineto_format.MEMORY_EVENT_NAME,
    EventKind.OUT_OF_MEMORY: kineto_format.OUT_OF_MEMORY_EVENT_NAME,
}


def row(kind: EventKind, i: int, **extra: Any) -> dict[str, Any]:
    return {
        "kind": int(kind),
        "name": SPECIAL_NAMES.get(kind, f"{kind.name.lower()}_{i}"),
        "start_ns": T0 + 1000 * i,
        "dur_ns": 0 if kind in (EventKind.MEMORY, EventKind.OUT_OF_MEMORY) else 500,
        "pid": PID,
        "tid": TID,
        **extra,
    }


#: Every device Kineto names, with a device index of its own.
DEVICES = [DeviceType(device) for device in kineto_format.DEVICE_NAMES]


def every_kind_rows() -> list[dict[str, Any]]:
    """One event of every host kind, and every device kind and API call on every device."""
    rows = []
    for kind in (
        EventKind.CPU_OP,
        EventKind.USER_ANNOTATION,
        EventKind.PYTHON_FUNCTION,
        EventKind.MEMORY,
        EventKind.OUT_OF_MEMORY,
        EventKind.OVERHEAD,
    ):
        rows.append(row(kind, len(rows), correlation_id=len(rows) + 1))
    for index, device in enumerate(DEVICES):
        for kind in sorted(kineto_format.DEVICE_KINDS | set(kineto_format.DEVICE_CATEGORY_SUFFIX)):
            corr = 1000 + len(rows)
            on_device = kind in kineto_format.DEVICE_KINDS
            rows.append(
                row(
                    kind,
                    len(rows),
                    device_type=int(device),
                    device_index=index if on_device else 0,
                    stream=7 if on_device else -1,
                    correlation_id=corr,
                    linked_correlation_id=1,
                )
            )
    return rows


# ------------------------------------------------- writer and reader share one format


def test_every_category_the_writer_writes_reads_back_as_its_kind_and_device(tmp_path: Path) -> None:
    rows = every_kind_rows()
    path = write_chrome_trace(
        trace_of(batch_of(rows)), tmp_path / "t.json", layout=kineto_format.NEWEST_LAYOUT
    )
    doc = json.loads(Path(path).read_text())
    written = [
        ev
        for ev in doc["traceEvents"]
        if ev.get("ph") in ("X", "i")
        and ev.get("cat", kineto_format.SPAN_CATEGORY) != kineto_format.SPAN_CATEGORY
    ]
    assert len(written) == len(rows)
    for ev, sent in zip(written, rows, strict=True):
        kind = EventKind(sent["kind"])
        device = sent.get("device_type", int(DeviceType.CPU))
        assert ev["cat"] == kineto_format.category_of(kind, device)
        read_kind, read_device = kind_of_category(ev["cat"])
        expected_kind = EventKind.MEMORY if kind == EventKind.OUT_OF_MEMORY else kind
        assert read_kind == expected_kind, ev["cat"]
        if kind in kineto_format.DEVICE_CATEGORY_SUFFIX:
            prefix = kineto_format.device_names(device)[0]
            assert read_device == kineto_format.DEVICE_BY_PREFIX[prefix]

    back = read_chrome_trace(path).events
    assert back["kind"].tolist() == [r["kind"] for r in rows]
    on_lane = np.isin(back["kind"], events_module.kind_codes(kineto_format.DEVICE_KINDS - {EventKind.SYNC}))
    # device activity reads back on its own device (the lane's name says which; HIP shares CUDA's prefix)
    assert back["device_type"][on_lane].tolist() == [
        r["device_type"]
        for r in rows
        if EventKind(r["kind"]) in kineto_format.DEVICE_KINDS - {EventKind.SYNC}
    ]


def test_every_standard_args_key_is_the_formats_and_reads_back_into_its_column(tmp_path: Path) -> None:
    rows = every_kind_rows()
    for r in rows:
        if r["kind"] == int(EventKind.CPU_OP):
            r.update(sequence_nr=3, fwd_thread=2, shapes=((2, 3),), stack=("a.py(1): f",))
        if r["kind"] == int(EventKind.MEMORY):
            r.update(nbytes=64, total_allocated=128, total_reserved=256, addr=99, device_index=-1)
        if r["kind"] == int(EventKind.PYTHON_FUNCTION):
            r.update(python_id=5, python_parent_id=4, thread=1)
    path = write_chrome_trace(
        trace_of(batch_of(rows)), tmp_path / "t.json", layout=kineto_format.NEWEST_LAYOUT
    )
    doc = json.loads(Path(path).read_text())
    keys_written = {
        key
        for ev in doc["traceEvents"]
        if ev.get("ph") in ("X", "i")
        and ev.get("cat", kineto_format.SPAN_CATEGORY) != kineto_format.SPAN_CATEGORY
        for key in ev.get("args", {})
    }
    format_keys = {value for name, value in vars(Arg).items() if name.isupper()}
    assert keys_written <= format_keys, keys_written - format_keys
    back = read_chrome_trace(path).events
    cpu_op = back["kind"] == int(EventKind.CPU_OP)
    assert back["sequence_nr"][cpu_op].tolist() == [3]
    assert back["fwd_thread"][cpu_op].tolist() == [2]
    assert back.values("shapes")[int(np.flatnonzero(cpu_op)[0])] == ((2, 3),)
    memory = back["kind"] == int(EventKind.MEMORY)
    assert back["nbytes"][memory].tolist() == [64]
    assert back["total_reserved"][memory].tolist() == [256]
    python = back["kind"] == int(EventKind.PYTHON_FUNCTION)
    assert (back["python_id"][python].tolist(), back["python_parent_id"][python].tolist()) == ([5], [4])
    # the keys generated from columns alone are not kept twice (as args and as columns)
    generated = {key for keys in kineto_format.GENERATED_ARG_KEYS.values() for key in keys}
    assert not generated & {key for args in back.table("args") for key in args}


def test_structured_args_round_trip_through_writer_and_reader_byte_for_byte(tmp_path: Path) -> None:
    args = {"Concrete Inputs": ["", "1"], "Input type": ["float", "Scalar"], "x": 1.5, "ok": True, "n": None}
    rows = [
        row(EventKind.CPU_OP, 0, correlation_id=1, args=args),
        row(
            EventKind.KERNEL, 1, device_type=int(DeviceType.CUDA), correlation_id=9, args={"grid": [1, 2, 3]}
        ),
    ]
    first = write_chrome_trace(
        trace_of(batch_of(rows)), tmp_path / "a.json", layout=kineto_format.NEWEST_LAYOUT
    )
    back = read_chrome_trace(first)
    assert back.events.values("args") == [args, {"grid": [1, 2, 3]}]
    again = tmp_path / "b.json"
    write_chrome_trace(attrs_evolve_events(trace_of(batch_of(rows)), back.events), again)
    args_lines = [
        line for line in Path(first).read_text().splitlines() if '"args"' in line and "cpu_op" in line
    ]
    assert args_lines
    assert all(line in Path(again).read_text() for line in args_lines)


def attrs_evolve_events(trace: Trace, batch: EventBatch) -> Trace:
    import attrs

    return attrs.evolve(trace, events=batch)


def test_flow_categories_and_lane_labels_are_the_formats(tmp_path: Path) -> None:
    rows = [
        row(EventKind.RUNTIME, 0, correlation_id=5),
        row(EventKind.KERNEL, 1, device_type=int(DeviceType.XPU), device_index=1, stream=3, correlation_id=5),
    ]
    path = write_chrome_trace(
        trace_of(batch_of(rows)), tmp_path / "t.json", layout=kineto_format.NEWEST_LAYOUT
    )
    doc = json.loads(Path(path).read_text())
    flows = {ev["cat"] for ev in doc["traceEvents"] if ev.get("ph") in ("s", "f")}
    assert flows == {kineto_format.FLOW_CATEGORY_BY_TYPE[kineto_format.FLOW_AC2G]}
    labels = {
        ev["args"]["labels"].split(" ")[0]
        for ev in doc["traceEvents"]
        if ev.get("name") == kineto_format.PROCESS_LABELS and ev["pid"] == 1
    }
    assert {kineto_format.DEVICE_BY_LANE_LABEL[label] for label in labels} == {DeviceType.XPU}
    back = read_chrome_trace(path).events
    assert back["flow_type"].tolist() == [kineto_format.FLOW_AC2G] * 2
    assert back["device_type"].tolist()[1] == int(DeviceType.XPU)


# --------------------------------------------------------- one definition only


#: Modules that write, read or record the format (and so once held copies of its tables).
FORMAT_USERS = [
    ROOT / "core/polyprof/runtime/chrome_trace.py",
    ROOT / "core/polyprof/formats/chrome_reader.py",
    ROOT / "core/polyprof/runtime/torch_cpu.py",
    ROOT / "core/polyprof/base/events.py",
    ROOT / "core/polyprof/analysis/tree.py",
]


def _format_names() -> set[str]:
    """Every category, flow category and multi-word args key of the format."""
    categories = set(kineto_format.KIND_BY_CATEGORY)
    for device in kineto_format.DEVICE_NAMES:
        categories |= set(kineto_format.kind_by_activity_type(device))
    categories |= set(kineto_format.FLOW_TYPE_BY_CATEGORY)
    keys = {
        value for name, value in vars(Arg).items() if name.isupper() and (" " in value or value[0].isupper())
    }
    return categories | keys


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module's code (docstrings left out)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


@pytest.mark.parametrize("path", FORMAT_USERS, ids=lambda p: p.name)
def test_no_category_or_args_key_is_spelled_outside_the_format_module(path: Path) -> None:
    names = _format_names()
    found = [(line, text) for line, text in _code_strings(path) if text in names]
    assert not found, (
        f"{path.name} spells format names itself (take them from polyprof.base.kineto_format): {found}"
    )


def test_the_gpu_plugins_activity_types_are_the_formats() -> None:
    cuda = pytest.importorskip("polyprof_cuda.kineto")
    xpu = pytest.importorskip("polyprof_xpu.kineto")
    assert cuda.KIND_BY_ACTIVITY_TYPE == kineto_format.kind_by_activity_type(DeviceType.CUDA)
    assert xpu.KIND_BY_ACTIVITY_TYPE == kineto_format.kind_by_activity_type(DeviceType.XPU)


def test_torch_results_host_activity_types_are_the_formats() -> None:
    from polyprof.runtime import torch_result

    assert torch_result.HOST_ACTIVITY_TYPES == kineto_format.HOST_CATEGORIES


@pytest.mark.parametrize("path", FORMAT_USERS, ids=lambda p: p.name)
def test_only_events_defines_an_interner(path: Path) -> None:
    tree = ast.parse(path.read_text())
    classes = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and "intern" in node.name.lower()
    ]
    assert classes == (["Interner"] if path.name == "events.py" else []), classes


# ------------------------------------------------------------------ the args column


def test_kineto_text_is_checked_once_and_written_as_torch_wrote_it() -> None:
    texts = [
        '"Record function id": 0, "Input Dims": [[2, 3]], "Ev Idx": 4',
        None,
        "   ",
        '"Record function id": 0, "Input Dims": [[2, 3]], "Ev Idx": 4',
        '"Call stack": "C:\\Users\\x.py(3): g;", "Ev Idx": 5',
        '"Call stack": "we"ird.py(1): h;", "Ev Idx": 6',
    ]
    indices, table = kineto_args_column(iter(texts), len(texts))
    assert indices.tolist() == [0, -1, -1, 0, 1, 2]
    assert all(type(value) is KinetoArgsText for value in table)
    assert table[0].body == texts[0]  # verbatim: Kineto's spacing kept
    assert table[1].mapping() == {"Call stack": "C:/Users/x.py(3): g;", "Ev Idx": 5}  # repaired
    assert table[2].mapping() == {Arg.INVALID_JSON: texts[5]}  # quarantined as one string
    assert encode_args_table(table) == [texts[0], table[1].body, table[2].body]


def test_writer_takes_kineto_text_verbatim_and_checks_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    text = '"Record function id": 0, "Concrete Inputs": ["", "1."], "Ev Idx": 17'
    indices, table = kineto_args_column([text])
    batch = batch_of([row(EventKind.CPU_OP, 0, correlation_id=3)])
    batch = EventBatch.build("test", {**batch.columns, "args": indices}, {**batch.tables, "args": table})

    def must_not_check(texts: Any) -> Any:
        raise AssertionError("the writer checked KinetoArgsText again")

    monkeypatch.setattr(kineto_format, "checked_args_texts", must_not_check)
    assert f'"args": {{"External id": 3, {text}}}' in text_of(batch)


def test_encode_args_uses_kinetos_separators_and_writes_only_json() -> None:
    assert encode_args({"Input Dims": [[2, 3], []], "Ev Idx": 4}) == '"Input Dims": [[2, 3], []], "Ev Idx": 4'
    assert encode_args({"shape": ((1, 2),)}) == '"shape": [[1, 2]]'
    assert encode_args({"x": math.nan, "y": [math.inf], "z": 1.5}) == '"x": null, "y": [null], "z": 1.5'
    assert encode_args({1: "a", "name": "é"}) == '"1": "a", "name": "é"'
    assert encode_args({"frame": "bad \ud800 surrogate"}) == '"frame": "bad \\ud800 surrogate"'
    assert encode_args({"obj": object}) == f'"obj": {json.dumps(str(object))}'
    assert encode_args({}) is None


def test_a_json_string_from_an_older_tracer_is_still_accepted_and_repaired() -> None:
    table = ('"a": 1', '"Call stack": "we"ird.py(1): h;"', "")
    with structlog.testing.capture_logs() as logs:
        assert encode_args_table(table) == [
            '"a": 1',
            f'"{Arg.INVALID_JSON}": "\\"Call stack\\": \\"we\\"ird.py(1): h;\\""',
            None,
        ]
    assert any(entry["event"] == "kineto_invalid_args" for entry in logs)


def test_args_of_another_type_are_left_out_with_a_warning_naming_the_valid_forms() -> None:
    with structlog.testing.capture_logs() as logs:
        assert encode_args_table((42, {"a": 1})) == [None, '"a": 1']
    (entry,) = [e for e in logs if e["event"] == "trace_args_values_skipped"]
    assert entry["types"] == {"int": 1}
    assert "mapping" in entry["valid"] and "KinetoArgsText" in entry["valid"]


def test_args_mapping_reads_every_form() -> None:
    assert args_mapping(KinetoArgsText('"a": 1')) == {"a": 1}
    assert args_mapping({"a": 1}) == {"a": 1}
    assert args_mapping('"a": 1') == {"a": 1}
    assert args_mapping(None) == {}


def test_torch_tracer_puts_structured_args_in_the_column() -> None:
    torch = pytest.importorskip("torch")
    import polyprof

    with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.add(torch.ones(2), torch.ones(2))
    table = prof.trace().events.table("args") if callable(prof.trace) else prof.trace.events.table("args")
    assert table
    assert all(isinstance(value, (KinetoArgsText, dict)) for value in table), {type(v) for v in table}


# ------------------------------------------------------------------ the interner


def test_intern_column_drops_the_empty_value_and_keeps_first_seen_order() -> None:
    indices, table = intern_column(iter(["b", "", "a", "b", ""]), empty="", count=5)
    assert (indices.tolist(), table) == ([0, -1, 1, 0, -1], ("b", "a"))
    indices, table = intern_column([(), (1,), ()], empty=())
    assert (indices.tolist(), table) == ([-1, 0, -1], ((1,),))
    assert intern_column([])[0].dtype == np.int32


def test_the_interner_adds_unseen_values_through_getitem() -> None:
    interner = Interner()
    assert list(map(interner.__getitem__, ["x", "y", "x"])) == [0, 1, 0]
    assert interner.table() == ("x", "y")


def test_the_tree_and_the_torch_tracer_use_the_shared_interner() -> None:
    from polyprof.analysis import tree
    from polyprof.runtime import torch_cpu

    assert tree.Interner is Interner
    assert not hasattr(torch_cpu, "_Interner") and not hasattr(tree, "_Interner")


def test_category_by_kind_has_one_home() -> None:
    # polyprof.base.events no longer imports it (issue 25: that tied events and kineto_format into a
    # circle); its old path warns until 0.3.0 (polyprof._compat, tests/test_module_jobs.py).
    assert "CATEGORY_BY_KIND" not in vars(events_module)
    assert "CATEGORY_BY_KIND" in vars(kineto_format)
