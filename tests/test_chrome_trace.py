"""The "chrome" exporter and the Chrome trace reader.

* Differential against torch: the same raw ``_ProfilerResult`` is written by
  torch's Kineto writer (``result.save``) and by polyprof (``decode_result`` +
  ``Trace`` + our exporter); the files must agree event for event.
* Round trip (hypothesis): random event batches survive export -> load ->
  ``trace_from_chrome`` to the nanosecond.
* Atomic writing, ``.json.gz``, reader errors, and the structure that Perfetto,
  chrome://tracing and HTA need (checked by hand: the ``perfetto`` wheel cannot
  read JSON without a native trace processor binary).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof.analysis.tree import EventTree
from polyprof.base import kineto_format
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.events import (
    FIELDS,
    DeviceType,
    EventBatch,
    EventKind,
    intern_column,
    intern_structured_column,
)
from polyprof.base.fileio import OutputDirectoryMissing, OutputPermissionError
from polyprof.base.kineto_format import us_to_ns
from polyprof.base.trace import CHROME_TRACE_RESERVED_KEYS, Trace
from polyprof.formats.chrome_reader import (
    TraceFileError,
    load_chrome_trace,
    read_chrome_trace,
    trace_from_chrome,
)
from polyprof.hooks.components import Capabilities, Exporter
from polyprof.runtime import chrome_trace
from polyprof.runtime.chrome_trace import (
    ChromeTraceExporter,
    format_us,
    render_chrome_trace,
    trimonth_base_ns,
    write_chrome_trace,
)
from polyprof.testing import make_plugin_manager_for_tests

#: torch's base time in reference/torch_profiler.md §3 (a trimonth boundary).
BASE = 1_790_857_026_000_000_000
T0 = BASE + 4_458_382_328_507_564  # a realistic offset: 51 days into the trimonth
PID = 7703
TID = 7704
HTA_RANK = re.compile(r'"rank":\s+(\d+)')
TIME_FIELD = re.compile(r'"(ts|dur)": ([^,}\s]+)')
METADATA_EVENT_NAMES = {
    "process_name",
    "process_labels",
    "process_sort_index",
    "thread_name",
    "thread_sort_index",
}


# ------------------------------------------------------------------ helpers


#: The real layout probe (the autouse fixture below replaces it for the writer's own tests).
INSTALLED_KINETO_LAYOUT = chrome_trace.kineto_layout


@pytest.fixture(autouse=True)
def newest_layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests of the writer itself check the newest Kineto layout, whatever torch is installed;
    the differential tests check the installed torch's."""
    if "torch_run" not in request.fixturenames and not getattr(request.function, "installed_layout", False):
        monkeypatch.setattr(chrome_trace, "kineto_layout", lambda: chrome_trace.NEWEST_LAYOUT)


def installed_layout(test: Callable[..., None]) -> Callable[..., None]:
    """Mark a test that writes traces in the installed torch's layout (like the differential ones)."""
    test.installed_layout = True  # type: ignore[attr-defined]
    return test


def batch_from_rows(rows: list[dict[str, Any]], source: str = "test") -> EventBatch:
    """An EventBatch from dict rows; interned fields are given as values."""
    fields = sorted({key for row in rows for key in row} | {"kind", "name", "start_ns", "dur_ns"})
    columns: dict[str, Any] = {}
    tables: dict[str, tuple] = {}
    for field in fields:
        spec = FIELDS[field]
        if field == "args":  # mappings (unhashable), KinetoArgsText or older tracers' str
            columns[field], tables[field] = intern_structured_column([row.get(field) for row in rows])
        elif spec.interned:  # a missing value is "no value" (-1); an empty one is kept as given
            columns[field], tables[field] = intern_column([row.get(field) for row in rows], empty=None)
        else:
            columns[field] = np.asarray([row.get(field, spec.default) for row in rows], dtype=spec.dtype)
    return EventBatch.build(source, columns, tables)


def make_trace(batch: EventBatch, **overrides: Any) -> Trace:
    values: dict[str, Any] = {
        "events": batch,
        "config": ProfileConfig(activities={ProfilerActivity.CPU}),
        "start_ns": T0,
        "end_ns": T0 + 10_000_000,
        "pid": PID,
        "hostname": "testhost",
        "trace_id": "0123456789ABCDEF0123456789ABCDEF",
    }
    values.update(overrides)
    return Trace(**values)


def export(trace: Trace, path: Path, **options: Any) -> dict[str, Any]:
    """Export with the plugin's exporter and parse the file exactly (Decimal floats)."""
    written = ChromeTraceExporter().export(trace, str(path), **options)
    assert written == str(path)
    return load_exact(path)


def load_exact(path: Path | str) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw, parse_float=Decimal)


def load_torch_file(path: Path) -> dict[str, Any]:
    """torch's own file, parsed exactly; bytes that are not UTF-8 are replaced.

    torch 2.6 to 2.13 sometimes hand out Python frame names from freed memory
    (issue 9, item 4.10); its writer copies them as they are.
    """
    return json.loads(Path(path).read_bytes().decode(errors="replace"), parse_float=Decimal)


def ns_of(value: Decimal) -> int:
    """A ``ts``/``dur`` value (µs, 3 decimals) as integer nanoseconds."""
    return int(value * 1000)


def events_of(doc: Mapping[str, Any], ph: str | Iterable[str]) -> list[dict[str, Any]]:
    phases = {ph} if isinstance(ph, str) else set(ph)
    return [e for e in doc["traceEvents"] if e.get("ph") in phases]


def by_name(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in events_of(doc, ("X", "i")) if e.get("cat") not in (None, "Trace")}


def check_viewer_structure(doc: Mapping[str, Any], text: str) -> None:
    """What Perfetto / chrome://tracing / HTA rely on (reference/ecosystem.md §2-3)."""
    assert isinstance(doc["traceEvents"], list)
    assert doc["schemaVersion"] == 1 and doc["displayTimeUnit"] == "ms"
    assert isinstance(doc["baseTimeNanoseconds"], int)
    assert isinstance(doc["deviceProperties"], list)
    for field, value in TIME_FIELD.findall(text):
        assert re.fullmatch(r"\d+\.\d{3}", value), f"{field} {value!r} is not µs with 3 decimals"
    slices: dict[tuple[Any, Any], list[tuple[int, int]]] = defaultdict(list)
    slice_starts: set[tuple[Any, Any, Decimal]] = set()
    flows: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for ev in doc["traceEvents"]:
        ph = ev["ph"]
        assert ph in ("X", "i", "M", "s", "f"), ev
        assert isinstance(ev["name"], str) and "ts" in ev and "pid" in ev and "tid" in ev, ev
        if ph == "M":
            assert ev["name"] in METADATA_EVENT_NAMES, ev
            assert len(ev["args"]) == 1, ev
        elif ph == "X":
            assert isinstance(ev["cat"], str) and ev["dur"] >= 0 and ev["ts"] >= 0, ev
            if ev["cat"] == "Trace":
                assert (ev["pid"], ev["tid"]) == ("Spans", "PyTorch Profiler")
                continue
            assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
            start = ns_of(ev["ts"])
            if ev["cat"] != "python_function":  # torch's Python tracer clocks do not nest with ops'
                slices[(ev["pid"], ev["tid"])].append((start, start + ns_of(ev["dur"])))
            slice_starts.add((ev["pid"], ev["tid"], ev["ts"]))
            if ev["cat"] == "kernel":  # HTA finds GPU kernels by args.stream
                assert isinstance(ev["args"]["stream"], int) and "correlation" in ev["args"], ev
        elif ph == "i":
            assert ev["s"] in ("t", "g"), ev
        else:
            assert ev["cat"] == ev["name"] and ev["cat"] in ("fwdbwd", "ac2g"), ev
            assert (ev.get("bp") == "e") == (ph == "f"), ev
            flows[(ev["cat"], ev["id"])][ph] += 1
    for ev in events_of(doc, ("s", "f")):  # flows bind to the slice starting there
        assert (ev["pid"], ev["tid"], ev["ts"]) in slice_starts, ev
    for key, count in flows.items():
        assert count["s"] == 1 and count["f"] >= 1, (key, count)
    for lane, intervals in slices.items():  # strict nesting per thread/stream
        open_ends: list[int] = []
        for start, end in sorted(intervals, key=lambda iv: (iv[0], -iv[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"overlapping slices on lane {lane}"
            open_ends.append(end)


# -------------------------------------------------------------- time rules


def test_trimonth_base_is_kinetos_boundary() -> None:
    assert BASE % (kineto_format.TRIMONTH_SECONDS * 10**9) == 0
    assert trimonth_base_ns(BASE) == BASE
    assert trimonth_base_ns(T0) == BASE
    assert trimonth_base_ns(BASE - 1) == BASE - kineto_format.TRIMONTH_SECONDS * 10**9
    assert trimonth_base_ns(BASE + kineto_format.TRIMONTH_SECONDS * 10**9 - 1) == BASE


def test_trimonth_base_matches_torch_python_writer() -> None:
    export_module = pytest.importorskip("torch.profiler._chrome_trace_export")
    for _ in range(3):  # a boundary could pass between the two reads
        ours, theirs = trimonth_base_ns(time.time_ns()), export_module._trimester_base_ns()
        if ours == theirs:
            return
    assert ours == theirs


@pytest.mark.parametrize(
    ("ns", "text"),
    [(0, "0.000"), (1, "0.001"), (999, "0.999"), (1000, "1.000"), (1234567, "1234.567"), (-5, "0.000")],
)
def test_format_us(ns: int, text: str) -> None:
    assert format_us(ns) == text


def test_timestamps_are_exact_three_decimal_microseconds(tmp_path: Path) -> None:
    last_ns_of_trimonth = BASE + kineto_format.TRIMONTH_SECONDS * 10**9 - 1
    batch = batch_from_rows(
        [
            {
                "name": "late",
                "start_ns": last_ns_of_trimonth - 123_553,
                "dur_ns": 123_553,
                "pid": PID,
                "tid": TID,
            },
            {"name": "tiny", "start_ns": T0, "dur_ns": 1, "pid": PID, "tid": TID},
        ]
    )
    path = tmp_path / "t.json"
    write_chrome_trace(make_trace(batch, end_ns=last_ns_of_trimonth), path)
    text = path.read_text()
    assert '"ts": 7889237999876.446, "dur": 123.553' in text
    assert '"ts": 4458382328507.564, "dur": 0.001' in text
    doc = load_chrome_trace(path)
    assert doc["baseTimeNanoseconds"] == BASE
    ts = [e["ts"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    assert (us_to_ns(ts) + BASE).tolist() == [last_ns_of_trimonth - 123_553, T0]


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(min_value=0, max_value=2**43 * 1000 - 1))
def test_us_to_ns_is_exact_for_three_decimal_values(ns: int) -> None:
    # Below 2**43 µs (101 days, more than a trimonth) doubles are closer than 1 ns apart.
    parsed = float(f"{ns // 1000}.{ns % 1000:03d}")
    assert int(us_to_ns([parsed])[0]) == ns


def test_us_to_ns_fixes_what_naive_rounding_gets_wrong() -> None:
    values = np.arange(T0 - BASE, T0 - BASE + 20_000, dtype=np.int64)  # where torch's ts live
    parsed = [float(f"{v // 1000}.{v % 1000:03d}") for v in values.tolist()]
    naive = np.rint(np.asarray(parsed) * 1000).astype(np.int64)
    assert (naive != values).any(), "these magnitudes must exercise double rounding"
    assert (us_to_ns(parsed) == values).all()


# ------------------------------------------------------ synthetic GPU trace


def gpu_shaped_trace() -> Trace:
    """A CPU op launching a CUDA kernel and an XPU kernel, with every device kind."""
    cuda, xpu = int(DeviceType.CUDA), int(DeviceType.XPU)
    t = T0
    rows = [
        {
            "kind": EventKind.USER_ANNOTATION,
            "name": "ProfilerStep#3",
            "start_ns": t,
            "dur_ns": 90_000,
            "pid": PID,
            "tid": TID,
            "correlation_id": 1,
        },
        {
            "kind": EventKind.CPU_OP,
            "name": "aten::mm",
            "start_ns": t + 1_000,
            "dur_ns": 20_000,
            "pid": PID,
            "tid": TID,
            "correlation_id": 2,
            "sequence_nr": 5,
            "fwd_thread": 0,
            "shapes": ((4, 8), (8, 2)),
        },
        {
            "kind": EventKind.RUNTIME,
            "name": "cudaLaunchKernel",
            "start_ns": t + 2_000,
            "dur_ns": 5_000,
            "pid": PID,
            "tid": TID,
            "correlation_id": 42,
            "linked_correlation_id": 2,
            "args": '"cbid": 211',
        },
        {
            "kind": EventKind.KERNEL,
            "name": "ampere_sgemm_64x64_nn",
            "start_ns": t + 30_000,
            "dur_ns": 8_000,
            "device_type": cuda,
            "device_index": 0,
            "stream": 7,
            "correlation_id": 42,
            "linked_correlation_id": 2,
            "args": '"grid": [1, 2, 1], "block": [128, 1, 1]',
        },
        {
            "kind": EventKind.GPU_MEMCPY,
            "name": "Memcpy HtoD (Pageable -> Device)",
            "start_ns": t + 40_000,
            "dur_ns": 3_000,
            "device_type": cuda,
            "device_index": 0,
            "stream": 7,
            "correlation_id": 43,
            "linked_correlation_id": 2,
            "nbytes": 4096,
        },
        {
            "kind": EventKind.GPU_MEMSET,
            "name": "Memset (Device)",
            "start_ns": t + 44_000,
            "dur_ns": 1_000,
            "device_type": cuda,
            "device_index": 0,
            "stream": 9,
            "correlation_id": 44,
        },
        {
            "kind": EventKind.GPU_USER_ANNOTATION,
            "name": "ProfilerStep#3",
            "start_ns": t + 30_000,
            "dur_ns": 15_000,
            "device_type": cuda,
            "device_index": 0,
            "stream": 8,
            "correlation_id": 1,
        },
        {
            "kind": EventKind.SYNC,
            "name": "Stream Sync",
            "start_ns": t + 50_000,
            "dur_ns": 2_000,
            "device_type": cuda,
            "device_index": 0,
            "stream": 10,
            "correlation_id": 45,
        },
        {
            "kind": EventKind.DRIVER,
            "name": "cuLaunchKernel",
            "start_ns": t + 60_000,
            "dur_ns": 1_000,
            "pid": PID,
            "tid": TID,
            "correlation_id": 46,
            "device_type": cuda,
        },
        {
            "kind": EventKind.RUNTIME,
            "name": "urEnqueueKernelLaunch",
            "start_ns": t + 62_000,
            "dur_ns": 2_000,
            "pid": PID,
            "tid": TID,
            "correlation_id": 77,
            "linked_correlation_id": 2,
        },
        {
            "kind": EventKind.KERNEL,
            "name": "gemm_kernel",
            "start_ns": t + 70_000,
            "dur_ns": 4_000,
            "device_type": xpu,
            "device_index": 1,
            "stream": 3,
            "correlation_id": 77,
            "linked_correlation_id": 2,
        },
        {
            "kind": EventKind.OVERHEAD,
            "name": "Instrumentation",
            "start_ns": t + 80_000,
            "dur_ns": 500,
            "pid": PID,
            "tid": TID,
        },
    ]
    return make_trace(
        batch_from_rows(rows),
        config=ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA, ProfilerActivity.XPU}),
        metadata_json={"distributedInfo": '{"backend":"nccl","rank":3,"world_size":4}'},
        device_properties=({"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 85_000_000_000},),
    )


def test_device_events_follow_kineto(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    doc = export(gpu_shaped_trace(), path)
    check_viewer_structure(doc, path.read_text())
    ev = {(e["cat"], e["name"]): e for e in events_of(doc, "X") if e["cat"] != "Trace"}
    kernel = ev[("kernel", "ampere_sgemm_64x64_nn")]
    assert (kernel["pid"], kernel["tid"]) == (0, 7)
    assert kernel["args"] == {
        "External id": 2,
        "device": 0,
        "stream": 7,
        "correlation": 42,
        "grid": [1, 2, 1],
        "block": [128, 1, 1],
    }
    launch = ev[("cuda_runtime", "cudaLaunchKernel")]
    assert (launch["pid"], launch["tid"]) == (PID, TID)
    assert launch["args"] == {"External id": 2, "correlation": 42, "cbid": 211}
    assert ev[("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)")]["args"]["stream"] == 7
    memset = ev[("gpu_memset", "Memset (Device)")]
    assert "External id" not in memset["args"], "no launching op: Kineto leaves External id out"
    assert ev[("cuda_sync", "Stream Sync")]["tid"] == 10
    assert ev[("cuda_driver", "cuLaunchKernel")]["pid"] == PID
    # The XPU runtime call is named after the device of the kernel it launched.
    assert ev[("xpu_runtime", "urEnqueueKernelLaunch")]["args"]["correlation"] == 77
    assert (ev[("kernel", "gemm_kernel")]["pid"], ev[("kernel", "gemm_kernel")]["tid"]) == (1, 3)
    overhead = ev[("overhead", "Instrumentation")]
    assert (overhead["pid"], overhead["tid"]) == (-1, 0)
    # Kineto draws GPU user annotations 1 ns earlier and 2 ns longer.
    annotation = ev[("gpu_user_annotation", "ProfilerStep#3")]
    assert ns_of(annotation["ts"]) == T0 + 30_000 - 1 - BASE and ns_of(annotation["dur"]) == 15_002
    # Kineto writes the range's id alone (HTA drops a span that carries a "correlation")
    assert annotation["args"] == {"External id": 1}
    op = ev[("cpu_op", "aten::mm")]
    assert op["args"] == {
        "External id": 2,
        "Record function id": 0,
        "Sequence number": 5,
        "Fwd thread id": 0,
        "Input Dims": [[4, 8], [8, 2]],
        "Ev Idx": 1,
    }
    assert ev[("user_annotation", "ProfilerStep#3")]["args"] == {
        "External id": 1,
        "Record function id": 0,
        "Ev Idx": 0,
    }
    flows = {(f["ph"], f["id"]): f for f in events_of(doc, ("s", "f"))}
    assert set(flows) == {("s", 42), ("f", 42), ("s", 77), ("f", 77)}, "memcpy 43 has no runtime call"
    assert (flows[("s", 42)]["pid"], flows[("s", 42)]["tid"], flows[("s", 42)]["ts"]) == (
        PID,
        TID,
        launch["ts"],
    )
    assert (flows[("f", 42)]["pid"], flows[("f", 42)]["tid"], flows[("f", 42)]["bp"]) == (0, 7, "e")
    assert flows[("f", 42)]["cat"] == "ac2g"
    meta = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events_of(doc, "M")}
    assert meta[("process_name", 0, 0)] == {"name": "CUDA 0"}
    assert meta[("process_labels", 0, 0)] == {"labels": "GPU 0"}
    assert meta[("process_sort_index", 0, 0)] == {"sort_index": 5_000_000}
    assert meta[("process_name", 1, 0)] == {"name": "XPU 1"}
    assert meta[("thread_name", 0, 7)] == {"name": "stream 7"}
    assert meta[("thread_name", 1, 3)] == {"name": "stream 3"}
    assert meta[("process_name", PID, 0)] == {"name": "python"}
    assert meta[("process_labels", PID, 0)] == {"labels": "CPU"}
    assert meta[("thread_name", PID, TID)] == {"name": f"thread {TID} (python)"}
    assert meta[("process_name", -1, 0)] == {"name": "Overhead"}
    # HTA: rank from distributedInfo with a space after the colon; device properties kept.
    assert HTA_RANK.findall(path.read_text()) == ["3"]
    assert doc["distributedInfo"] == {"backend": "nccl", "rank": 3, "world_size": 4}
    assert doc["deviceProperties"] == [{"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 85_000_000_000}]


def test_top_level_keys_and_metadata(tmp_path: Path) -> None:
    batch = batch_from_rows([{"name": "aten::add", "start_ns": T0, "dur_ns": 10, "pid": PID, "tid": TID}])
    config = ProfileConfig(
        activities={ProfilerActivity.CPU},
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
        with_flops=True,
        with_modules=True,
    )
    trace = make_trace(
        batch,
        config=config,
        trace_id="",
        metadata_json={
            "custom": '{"a": [1, 2.5], "b": null}',
            "not_json": "{oops",
            "traceEvents": "[]",
            "profile_memory": "1",
        },
    )
    path = tmp_path / "meta.json"
    doc = export(trace, path)
    assert list(doc) == [
        "schemaVersion",
        "deviceProperties",
        "trace_id",
        "profile_memory",
        "with_stack",
        "record_shapes",
        "with_modules",
        "with_flops",
        "custom",
        "not_json",
        "host_name",
        "displayTimeUnit",
        "baseTimeNanoseconds",
        "traceEvents",
        "traceName",
    ]
    assert re.fullmatch(r"[0-9A-F]{32}", doc["trace_id"]), "torch always writes a trace id"
    assert [
        doc[k] for k in ("profile_memory", "with_stack", "record_shapes", "with_modules", "with_flops")
    ] == [1] * 5
    assert doc["custom"] == {"a": [1, Decimal("2.5")], "b": None}
    assert doc["not_json"] == "{oops", "invalid raw JSON is kept as a string, not written raw"
    assert isinstance(doc["traceEvents"], list) and doc["traceName"] == str(path)
    assert doc["host_name"] == "testhost" and doc["displayTimeUnit"] == "ms"
    assert path.read_text().endswith(f'"traceName": {json.dumps(str(path))}\n}}\n')


@pytest.mark.parametrize(
    ("layout", "top_level", "metadata_last"),
    [
        # torch 2.6 to 2.10: time keys after traceName, metadata events after the events.
        (
            chrome_trace.KinetoLayout(time_keys_first=False, metadata_first=False, host_name=False),
            [
                "schemaVersion",
                "deviceProperties",
                "trace_id",
                "traceEvents",
                "traceName",
                "displayTimeUnit",
                "baseTimeNanoseconds",
            ],
            True,
        ),
        # torch 2.11: time keys before traceEvents.
        (
            chrome_trace.KinetoLayout(time_keys_first=True, metadata_first=False, host_name=False),
            [
                "schemaVersion",
                "deviceProperties",
                "trace_id",
                "displayTimeUnit",
                "baseTimeNanoseconds",
                "traceEvents",
                "traceName",
            ],
            True,
        ),
        # torch 2.12: metadata events first, "ph" first in every event.
        (
            chrome_trace.KinetoLayout(time_keys_first=True, metadata_first=True, host_name=False),
            [
                "schemaVersion",
                "deviceProperties",
                "trace_id",
                "displayTimeUnit",
                "baseTimeNanoseconds",
                "traceEvents",
                "traceName",
            ],
            False,
        ),
        # torch 2.13+: host_name.
        (
            chrome_trace.NEWEST_LAYOUT,
            [
                "schemaVersion",
                "deviceProperties",
                "trace_id",
                "host_name",
                "displayTimeUnit",
                "baseTimeNanoseconds",
                "traceEvents",
                "traceName",
            ],
            False,
        ),
    ],
)
def test_layout_of_each_torch_release(
    tmp_path: Path, layout: chrome_trace.KinetoLayout, top_level: list[str], metadata_last: bool
) -> None:
    batch = batch_from_rows(
        [{"name": "aten::mm", "start_ns": T0 + 10, "dur_ns": 5, "pid": PID, "tid": TID, "correlation_id": 1}]
    )
    path = tmp_path / "layout.json"
    write_chrome_trace(make_trace(batch), path, layout=layout)
    text = path.read_text()
    doc = load_exact(path)
    check_viewer_structure(doc, text)
    assert list(doc) == top_level
    kinds = [ev["ph"] for ev in doc["traceEvents"]]
    first_event = kinds.index("X")
    assert (kinds.index("M") > first_event) == metadata_last
    first_key = "ph" if layout.metadata_first else "name"
    for ev in doc["traceEvents"]:
        if ev["ph"] == "M" or ev.get("s") == "g":
            assert next(iter(ev)) == first_key, ev
    span = next(ev for ev in doc["traceEvents"] if ev.get("cat") == "Trace")
    expected_span_keys = (
        ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
        if layout.metadata_first
        else ["ph", "cat", "ts", "dur", "pid", "tid", "name", "args"]
    )
    assert list(span) == expected_span_keys


def test_layout_without_torch_loaded_is_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    """``polyprof report`` re-exports saved traces without importing torch: newest layout, no import."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert INSTALLED_KINETO_LAYOUT() == chrome_trace.NEWEST_LAYOUT
    assert "torch" not in sys.modules


def test_names_and_paths_are_json_escaped(tmp_path: Path) -> None:
    names = ['say "hi"', "back\\slash", "new\nline\ttab", "ünïcödé ✓", "ctl\x01\x1f", "</script>", ""]
    rows = [
        {"name": n, "start_ns": T0 + i * 100, "dur_ns": 50, "pid": PID, "tid": TID}
        for i, n in enumerate(names)
    ]
    directory = tmp_path / 'we"ird dir'
    directory.mkdir()
    path = directory / "t.json"
    doc = export(make_trace(batch_from_rows(rows)), path)
    # as torch's writer words them (backslash -> "/", no newline; 2.14+: '"' -> "'"), always JSON;
    # names with a tab, non-ASCII or control characters are kept, where torch 2.7+ writes "unknown"
    # (a deliberate difference: kineto_format.trace_name)
    written = [e["name"] for e in events_of(doc, "X") if e["cat"] == "cpu_op"]
    assert written == ["say 'hi'", "back/slash", "newline\ttab", *names[3:]]
    assert doc["traceName"] == str(path)
    # torch 2.6 to 2.13 write the quotes raw (not JSON); polyprof escapes them
    before_2_14 = chrome_trace.KinetoLayout(single_quotes_in_names=False)
    write_chrome_trace(make_trace(batch_from_rows(rows)), str(path), layout=before_2_14)
    written = [e["name"] for e in events_of(load_exact(path), "X") if e["cat"] == "cpu_op"]
    assert written == ['say "hi"', "back/slash", "newline\ttab", *names[3:]]


def test_broken_args_fragments_never_break_the_file(tmp_path: Path) -> None:
    rows = [
        {
            "name": "ok",
            "start_ns": T0,
            "dur_ns": 5,
            "pid": PID,
            "tid": TID,
            "correlation_id": 1,
            "args": '"Call stack": "a.py(1): f;", "Ev Idx": 0',
        },
        {
            "name": "windows_path",
            "start_ns": T0 + 10,
            "dur_ns": 5,
            "pid": PID,
            "tid": TID,
            "correlation_id": 2,
            "args": '"Call stack": "C:\\Users\\x.py(3): g;", "Ev Idx": 1',
        },
        {
            "name": "quote_in_frame",
            "start_ns": T0 + 20,
            "dur_ns": 5,
            "pid": PID,
            "tid": TID,
            "correlation_id": 3,
            "args": '"Call stack": "we"ird.py(1): h;", "Ev Idx": 2',
        },
        {
            "name": "blank",
            "start_ns": T0 + 30,
            "dur_ns": 5,
            "pid": PID,
            "tid": TID,
            "correlation_id": 4,
            "args": "   ",
        },
    ]
    path = tmp_path / "t.json"
    doc = export(make_trace(batch_from_rows(rows)), path)
    args = {name: ev["args"] for name, ev in by_name(doc).items()}
    assert args["ok"] == {"External id": 1, "Call stack": "a.py(1): f;", "Ev Idx": 0}
    assert args["windows_path"] == {"External id": 2, "Call stack": "C:/Users/x.py(3): g;", "Ev Idx": 1}
    assert args["quote_in_frame"] == {
        "External id": 3,
        "Args (invalid JSON)": '"Call stack": "we"ird.py(1): h;", "Ev Idx": 2',
    }
    assert args["blank"] == {"External id": 4, "Record function id": 0, "Ev Idx": 3}


def test_memory_and_python_events_without_fragments(tmp_path: Path) -> None:
    rows = [
        {
            "kind": EventKind.PYTHON_FUNCTION,
            "name": "a.py(1): <module>",
            "start_ns": T0,
            "dur_ns": 900,
            "pid": PID,
            "tid": TID,
            "python_id": 1,
            "python_parent_id": -1,
            "stack": (),
        },
        {
            "kind": EventKind.PYTHON_FUNCTION,
            "name": "a.py(2): f",
            "start_ns": T0 + 10,
            "dur_ns": 100,
            "pid": PID,
            "tid": TID,
            "python_id": 2,
            "python_parent_id": 1,
            "stack": ("a.py(1): <module>",),
        },
        {
            "kind": EventKind.CPU_OP,
            "name": "aten::empty",
            "start_ns": T0 + 20,
            "dur_ns": 50,
            "pid": PID,
            "tid": TID,
            "correlation_id": 9,
        },
        {
            "kind": EventKind.MEMORY,
            "name": "[memory]",
            "start_ns": T0 + 30,
            "pid": PID,
            "tid": TID,
            "nbytes": -512,
            "total_allocated": 1024,
            "total_reserved": 2048,
            "addr": 140000,
            "device_index": -1,
        },
        {
            "kind": EventKind.OUT_OF_MEMORY,
            "name": "[OutOfMemory]",
            "start_ns": T0 + 40,
            "pid": PID,
            "tid": TID,
            "nbytes": 1 << 40,
            "device_index": 0,
            "device_type": int(DeviceType.CUDA),
        },
    ]
    path = tmp_path / "t.json"
    doc = export(make_trace(batch_from_rows(rows)), path)
    check_viewer_structure(doc, path.read_text())
    ev = by_name(doc)
    assert ev["a.py(1): <module>"]["args"] == {
        "Python thread": 0,
        "Python parent id": None,
        "Python id": 1,
        "Ev Idx": 3,
    }
    assert ev["a.py(2): f"]["args"] == {
        "Python thread": 0,
        "Python parent id": 1,
        "Python id": 2,
        "Call stack": "a.py(1): <module>;",
        "Ev Idx": 4,
    }
    memory = ev["[memory]"]
    assert (memory["ph"], memory["cat"], memory["s"], "dur" in memory) == (
        "i",
        "cpu_instant_event",
        "t",
        False,
    )
    assert memory["args"] == {
        "Total Reserved": 2048,
        "Total Allocated": 1024,
        "Bytes": -512,
        "Device Id": -1,
        "Device Type": 0,
        "Addr": 140000,
        "finished": False,
        "Ev Idx": 1,
    }
    assert ev["[OutOfMemory]"]["args"] == {
        "Device Type": 1,
        "Device Id": 0,
        "Bytes": 1 << 40,
        "Total Allocated": 0,
        "Total Reserved": 0,
        "Ev Idx": 2,
    }
    assert ev["aten::empty"]["args"]["Ev Idx"] == 0, "ops first, then memory, then Python (torch's numbering)"


def test_chunked_output_is_one_valid_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [
        {"name": f"op{i}", "start_ns": T0 + i * 10, "dur_ns": 5, "pid": PID, "tid": TID} for i in range(10)
    ]
    trace = make_trace(batch_from_rows(rows))
    whole = "".join(render_chrome_trace(trace, "x.json"))
    monkeypatch.setattr(chrome_trace, "CHUNK_EVENTS", 3)
    chunks = list(render_chrome_trace(trace, "x.json"))
    assert len(chunks) > 5 and "".join(chunks) == whole
    assert [e["name"] for e in json.loads(whole)["traceEvents"] if e.get("cat") == "cpu_op"] == [
        f"op{i}" for i in range(10)
    ]


def test_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    doc = export(make_trace(EventBatch.empty()), path)
    check_viewer_structure(doc, path.read_text())
    assert [e["name"] for e in doc["traceEvents"]] == [
        "process_name",
        "process_labels",
        "process_sort_index",
        "PyTorch Profiler (0)",
        "process_sort_index",
        "Iteration Start: PyTorch Profiler",
        "Record Window End",
    ]
    span = doc["traceEvents"][3]
    assert ns_of(span["ts"]) == T0 - BASE and ns_of(span["dur"]) == 10_000_000


def test_unknown_kind_is_a_clear_error(tmp_path: Path) -> None:
    batch = EventBatch.build("t", {"kind": [99], "name": [-1], "start_ns": [T0], "dur_ns": [1]})
    with pytest.raises(ValueError, match=r"unknown kind values \[99\]; valid kinds: CPU_OP=0"):
        write_chrome_trace(make_trace(batch), tmp_path / "t.json")
    assert os.listdir(tmp_path) == []


def test_distributed_info_from_an_initialised_process_group(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed with no process group yet")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        path = tmp_path / "rank.json"
        doc = export(make_trace(batch_from_rows([{"name": "x", "start_ns": T0, "dur_ns": 1}])), path)
    finally:
        dist.destroy_process_group()
    info = doc["distributedInfo"]
    assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", 0, 1)
    assert HTA_RANK.findall(path.read_text()) == ["0"]
    assert list(doc).index("distributedInfo") == list(doc).index("host_name") - 1


# ----------------------------------------------------- exporter and plugin


def test_plugin_hooks_build_the_exporter() -> None:
    pm = make_plugin_manager_for_tests(("chrome_trace", chrome_trace))
    config = ProfileConfig(activities={ProfilerActivity.CPU})
    exporter = pm.make_exporter(config, "chrome")
    assert isinstance(exporter, ChromeTraceExporter) and isinstance(exporter, Exporter)
    assert exporter.name == "chrome" and exporter.suffixes == (".json", ".json.gz")
    assert chrome_trace.polyprof_make_exporter(config=config, name="stacks") is None
    assert chrome_trace.polyprof_capabilities() == Capabilities(exporters=("chrome",))
    assert chrome_trace.polyprof_make_exporter.polyprof_impl["trylast"] is True


def test_unknown_option_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['indent'\].*valid options: \['gzip_level'\]"):
        ChromeTraceExporter().export(make_trace(EventBatch.empty()), str(tmp_path / "t.json"), indent=2)
    assert os.listdir(tmp_path) == []


def test_gzip_output_matches_plain_output(tmp_path: Path) -> None:
    trace = gpu_shaped_trace()
    plain = export(trace, tmp_path / "t.json")
    path = tmp_path / "t.json.gz"
    compressed = export(trace, path, gzip_level=1)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert compressed.pop("traceName") == str(path) and plain.pop("traceName") == str(tmp_path / "t.json")
    assert compressed == plain
    assert load_chrome_trace(path)["traceEvents"] == load_chrome_trace(tmp_path / "t.json")["traceEvents"]


def test_export_to_missing_directory_fails_first_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = []
    monkeypatch.setattr(chrome_trace, "render_chrome_trace", lambda *a: rendered.append(1) or iter(()))
    with pytest.raises(OutputDirectoryMissing, match=r"directory '.*/no_such_dir' does not exist"):
        ChromeTraceExporter().export(gpu_shaped_trace(), str(tmp_path / "no_such_dir" / "t.json"))
    assert rendered == [], "the path is checked before any work is done"
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_export_to_read_only_directory_fails_clearly_and_leaves_nothing(
    readonly_dir: tuple[str, str], run_unprivileged
) -> None:
    _, readonly = readonly_dir
    target = os.path.join(readonly, "t.json")
    trace = gpu_shaped_trace()

    def attempt() -> str:
        try:
            ChromeTraceExporter().export(trace, target)
        except OutputPermissionError as exc:
            return str(exc)
        return "no error"

    assert run_unprivileged(attempt) == (
        f"cannot write {target!r}: no write permission for directory {readonly!r}"
    )
    assert os.listdir(readonly) == []


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_failure_mid_export_keeps_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    path = tmp_path / f"t{suffix}"
    export(gpu_shaped_trace(), path)
    before = path.read_bytes()

    def failing_lines(*args: Any) -> list[str]:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(chrome_trace, "_event_lines", failing_lines)
    with pytest.raises(RuntimeError, match="disk on fire"):
        ChromeTraceExporter().export(make_trace(batch_from_rows([{"name": "x", "start_ns": T0}])), str(path))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [path.name], "no temporary file left behind"


# ------------------------------------------------------------ reader errors


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture
def good_trace_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "good.json"
    write_chrome_trace(gpu_shaped_trace(), path)
    return path.read_bytes()


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda d, good: d / "missing.json", "no such file"),
        (lambda d, good: d, "is a directory, not a trace file"),
        (lambda d, good: _write(d / "empty.json", b""), "the file is empty"),
        (lambda d, good: _write(d / "cut.json", good[: len(good) // 2]), "truncated JSON"),
        (lambda d, good: _write(d / "cut.json.gz", gzip.compress(good)[:200]), "truncated gzip data"),
        (
            lambda d, good: _write(
                d / "bad.json.gz", (lambda z: z[:10] + b"\xff" * 40 + z[50:])(gzip.compress(good))
            ),
            "corrupt gzip data",
        ),
        (lambda d, good: _write(d / "junk.json", b"{this is not json}"), "invalid JSON at line 1, column 2"),
        (lambda d, good: _write(d / "other.json", b'{"name": "x", "version": 2}'), 'no "traceEvents" key'),
        (lambda d, good: _write(d / "dict.json", b'{"traceEvents": {"a": 1}}'), '"traceEvents" is a dict'),
        (lambda d, good: _write(d / "num.json", b"42"), "the top level is a int"),
    ],
    ids=[
        "missing",
        "directory",
        "empty",
        "truncated",
        "truncated-gz",
        "corrupt-gz",
        "not-json",
        "no-events",
        "events-not-list",
        "number",
    ],
)
def test_reader_errors_are_one_clear_line(
    tmp_path: Path, good_trace_bytes: bytes, make: Callable[[Path, bytes], Path], problem: str
) -> None:
    path = make(tmp_path, good_trace_bytes)
    with pytest.raises(TraceFileError) as info:
        load_chrome_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and problem in message, message
    assert "\n" not in message and info.value.path == str(path)
    assert isinstance(info.value, ValueError)


def test_reader_accepts_bare_event_arrays(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "array.json",
        b'[{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1.5, "dur": 2, "pid": 1, "tid": 2}]',
    )
    trace = trace_from_chrome(load_chrome_trace(path))
    assert trace.events.values("name") == ["a"]
    assert trace.events["start_ns"].tolist() == [1500] and trace.events["dur_ns"].tolist() == [2000]


def test_reader_keeps_metadata_and_skips_unknown_categories(tmp_path: Path) -> None:
    trace = gpu_shaped_trace()
    path = tmp_path / "t.json"
    write_chrome_trace(trace, path)
    doc = load_chrome_trace(path)
    doc["traceEvents"].append(
        {"ph": "X", "cat": "cuda_profiler_range", "name": "r", "ts": 1.0, "dur": 1.0, "pid": 0, "tid": 0}
    )
    back = trace_from_chrome(doc)
    assert back.notes == ("chrome trace: skipped events of unknown categories (1 cuda_profiler_range)",)
    assert (back.start_ns, back.end_ns, back.pid) == (trace.start_ns, trace.end_ns, PID)
    assert (back.hostname, back.trace_id) == (trace.hostname, trace.trace_id)
    assert json.loads(back.metadata_json["distributedInfo"]) == {
        "backend": "nccl",
        "rank": 3,
        "world_size": 4,
    }
    assert back.device_properties == trace.device_properties
    assert back.config.activities == {ProfilerActivity.CPU, ProfilerActivity.CUDA, ProfilerActivity.XPU}
    assert len(back.events) == len(trace.events)


# -------------------------------------------------------------- round trip

#: Counter samples carry no ids or durations to round-trip; their own tests are at the end.
KINDS = [k for k in EventKind if k != EventKind.COUNTER]
DEVICE_KINDS = {
    EventKind.KERNEL,
    EventKind.GPU_MEMCPY,
    EventKind.GPU_MEMSET,
    EventKind.GPU_USER_ANNOTATION,
    EventKind.SYNC,
}
INSTANT_KINDS = {EventKind.MEMORY, EventKind.OUT_OF_MEMORY}
HOST_OP_KINDS = {EventKind.CPU_OP, EventKind.USER_ANNOTATION}

names_strategy = st.text(min_size=1, max_size=12).filter(lambda s: s != "[OutOfMemory]")
shapes_strategy = st.lists(st.lists(st.integers(0, 4096), max_size=4).map(tuple), max_size=3).map(tuple)


@st.composite
def event_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 25))
    rows = []
    for _ in range(n):
        kind = draw(st.sampled_from(KINDS))
        row: dict[str, Any] = {
            "kind": int(kind),
            "name": "[OutOfMemory]" if kind == EventKind.OUT_OF_MEMORY else draw(names_strategy),
            "start_ns": draw(st.integers(BASE + 2, BASE + kineto_format.TRIMONTH_SECONDS * 10**9 - 10**10)),
            "dur_ns": 0 if kind in INSTANT_KINDS else draw(st.integers(0, 10**10)),
            "pid": draw(st.integers(1, 2**22)),
            "tid": draw(st.integers(0, 2**40)),
        }
        # Kineto writes no "External id" for memory, Python and overhead events (torch gives them none).
        if kind not in INSTANT_KINDS | {EventKind.PYTHON_FUNCTION, EventKind.OVERHEAD}:
            row["correlation_id"] = draw(st.integers(0, 2**40))
        if kind in HOST_OP_KINDS:
            row["sequence_nr"] = draw(st.integers(-1, 10**6))
            row["fwd_thread"] = draw(st.integers(0, 64)) if row["sequence_nr"] >= 0 else 0
            row["shapes"] = draw(shapes_strategy)
        if kind in DEVICE_KINDS:
            row["device_index"] = draw(st.integers(0, 7))
            # One device type per index: a lane (pid) is one device.
            row["device_type"] = int(DeviceType.XPU if row["device_index"] % 2 else DeviceType.CUDA)
            row["stream"] = draw(st.integers(0, 2**20))
        # torch hands a range's GPU span over with the range's id as its correlation id, unlinked
        if (kind in DEVICE_KINDS or kind in (EventKind.RUNTIME, EventKind.DRIVER)) and (
            kind != EventKind.GPU_USER_ANNOTATION
        ):
            row["linked_correlation_id"] = draw(st.integers(0, 2**40))
        if kind in INSTANT_KINDS:
            row["nbytes"] = draw(st.integers(-(2**40), 2**40))
            row["total_allocated"] = draw(st.integers(0, 2**40))
            row["device_index"] = draw(st.integers(-1, 7))
        if kind == EventKind.PYTHON_FUNCTION:
            row["python_id"] = draw(st.integers(0, 10**6))
            row["python_parent_id"] = draw(st.integers(-1, 10**6))
        rows.append(row)
    return rows


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=event_rows(), gz=st.booleans())
def test_round_trip_keeps_every_column(rows: list[dict[str, Any]], gz: bool) -> None:
    batch = batch_from_rows(rows)
    trace = make_trace(
        batch, start_ns=min(r["start_ns"] for r in rows), end_ns=max(r["start_ns"] for r in rows)
    )
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "t.json.gz" if gz else "t.json")
        write_chrome_trace(trace, path)
        back = trace_from_chrome(load_chrome_trace(path)).events
    assert len(back) == len(batch)
    for field in ("kind", "start_ns", "dur_ns", "correlation_id"):
        assert back[field].tolist() == batch[field].tolist(), field
    # A link comes back; one equal to the row's own correlation id may come back as 0 where the
    # innermost op of the call's thread is not that op (random rows rarely have one).
    pairs = zip(batch["linked_correlation_id"].tolist(), back["linked_correlation_id"].tolist(), strict=True)
    for (was, now), own in zip(pairs, batch["correlation_id"].tolist(), strict=True):
        # only an id equal to the row's own correlation id is in doubt (old Kineto's unlinked rows)
        assert now == was if was != own else now in (was, 0)
    # names come back as torch's writer words them (kineto_format.trace_name)
    assert back.values("name") == [kineto_format.trace_name(n) for n in batch.values("name")]
    kinds = [EventKind(k) for k in batch["kind"].tolist()]
    for i, kind in enumerate(kinds):
        row = rows[i]
        if kind in DEVICE_KINDS:
            assert (back["device_index"][i], back["stream"][i], back["tid"][i]) == (
                row["device_index"],
                row["stream"],
                row["stream"],
            )
            assert back["device_type"][i] == row["device_type"]
        elif kind != EventKind.OVERHEAD:
            assert (back["pid"][i], back["tid"][i]) == (row["pid"], row["tid"])
        if kind in HOST_OP_KINDS:
            assert back["sequence_nr"][i] == row["sequence_nr"]
            assert back["fwd_thread"][i] == row["fwd_thread"]
            assert back.values("shapes", ())[i] == row["shapes"]
        if kind in INSTANT_KINDS:
            assert (back["nbytes"][i], back["total_allocated"][i], back["device_index"][i]) == (
                row["nbytes"],
                row["total_allocated"],
                row["device_index"],
            )
        if kind == EventKind.PYTHON_FUNCTION:
            assert (back["python_id"][i], back["python_parent_id"][i]) == (
                row["python_id"],
                row["python_parent_id"],
            )


# ------------------------------------------------------- chunked rendering


def every_args_form_rows() -> list[dict[str, Any]]:
    """Events of every args template, interleaved so that small chunks mix them, with flows across chunks."""
    cuda = int(DeviceType.CUDA)
    host = {"pid": PID, "tid": TID}
    device = {"device_type": cuda, "device_index": 0, "stream": 7}
    kinds_and_extras: list[tuple[EventKind, dict[str, Any]]] = [
        (EventKind.CPU_OP, {"correlation_id": 1, "args": '"Call stack": "a.py(1): f;", "Ev Idx": 0'}),
        (EventKind.MEMORY, {"nbytes": 64, "total_allocated": 64, "addr": 7, "device_index": -1}),
        (
            EventKind.CPU_OP,
            {"correlation_id": 2, "sequence_nr": 3, "shapes": ((2, 2),), "stack": ("a.py(2): g",)},
        ),
        (EventKind.USER_ANNOTATION, {"correlation_id": 0}),
        (
            EventKind.PYTHON_FUNCTION,
            {"python_id": 1, "python_parent_id": -1, "stack": ("a.py(1): <module>",)},
        ),
        (EventKind.RUNTIME, {"correlation_id": 42, "linked_correlation_id": 2, "args": '"cbid": 211'}),
        (EventKind.OUT_OF_MEMORY, {"nbytes": 1 << 40, "device_index": 0, "device_type": cuda}),
        (
            EventKind.KERNEL,
            {**device, "correlation_id": 42, "linked_correlation_id": 2, "args": '"grid": [1]'},
        ),
        (EventKind.OVERHEAD, {}),
        (EventKind.GPU_MEMCPY, {**device, "correlation_id": 43}),
        (EventKind.MEMORY, {"nbytes": -64, "args": '"Bytes": -64'}),
        (EventKind.PYTHON_FUNCTION, {"args": '"Python id": 9'}),
        (EventKind.DRIVER, {"correlation_id": 44, "device_type": cuda}),
        (EventKind.OVERHEAD, {"args": '"note": "x"'}),
        (EventKind.GPU_USER_ANNOTATION, {**device, "stream": 8, "correlation_id": 1}),
        (EventKind.SYNC, {**device, "correlation_id": 45}),
        (EventKind.CPU_OP, {"correlation_id": 5, "flow_id": 9, "flow_type": 1, "flow_start": True}),
        (EventKind.CPU_OP, {"correlation_id": 6, "sequence_nr": 4, "fwd_thread": TID}),
        (EventKind.CPU_OP, {"correlation_id": 7, "flow_id": 9, "flow_type": 1, "flow_start": False}),
    ]
    rows = []
    for i, (kind, extra) in enumerate(kinds_and_extras):
        on_host = kind not in DEVICE_KINDS
        instant = kind in INSTANT_KINDS
        row = {"kind": kind, "name": f"{kind.name.lower()}_{i}", "start_ns": T0 + i * 1_000}
        row.update({"dur_ns": 0 if instant else 500, **(host if on_host else {}), **extra})
        rows.append(row)
    return rows


@pytest.mark.parametrize("chunk_events", [1, 2, 3, 5, 8])
def test_chunked_rendering_matches_one_chunk_for_every_event_form(
    monkeypatch: pytest.MonkeyPatch, chunk_events: int
) -> None:
    rows = every_args_form_rows()
    trace = make_trace(batch_from_rows(rows))
    whole = list(render_chrome_trace(trace, "x.json"))
    assert chrome_trace.CHUNK_EVENTS >= len(rows)
    monkeypatch.setattr(chrome_trace, "CHUNK_EVENTS", chunk_events)
    chunks = list(render_chrome_trace(trace, "x.json"))
    assert "".join(chunks) == "".join(whole)
    event_chunks = -(-len(rows) // chunk_events)
    assert len(chunks) == len(whole) - 1 + event_chunks, "one text chunk per CHUNK_EVENTS events"
    # The fixture must reach every template, instants and flows, or the comparison proves little.
    doc = json.loads("".join(chunks))
    check_viewer_structure(doc, "".join(chunks))
    recorded = [e for e in doc["traceEvents"] if e.get("cat") not in (None, "Trace")]
    assert {e["cat"] for e in recorded} >= {
        "cpu_op",
        "user_annotation",
        "python_function",
        "cpu_instant_event",
        "cuda_runtime",
        "cuda_driver",
        "kernel",
        "gpu_memcpy",
        "gpu_user_annotation",
        "cuda_sync",
        "overhead",
    }
    assert Counter((e["ph"], e["cat"]) for e in events_of(doc, ("s", "f"))) == {
        ("s", "fwdbwd"): 1,
        ("f", "fwdbwd"): 1,
        ("s", "ac2g"): 1,
        ("f", "ac2g"): 1,
    }
    args = {e["name"]: e.get("args") for e in recorded}
    assert args["cpu_op_0"] == {"External id": 1, "Call stack": "a.py(1): f;", "Ev Idx": 0}
    assert args["memory_10"] == {"Bytes": -64}
    assert args["overhead_8"] is None and args["overhead_13"] == {"note": "x"}
    assert args["kernel_7"] == {"External id": 2, "device": 0, "stream": 7, "correlation": 42, "grid": [1]}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=event_rows(), chunk_events=st.integers(1, 6))
def test_chunked_rendering_matches_one_chunk(rows: list[dict[str, Any]], chunk_events: int) -> None:
    trace = make_trace(batch_from_rows(rows))
    whole = "".join(render_chrome_trace(trace, "x.json"))
    default = chrome_trace.CHUNK_EVENTS
    chrome_trace.CHUNK_EVENTS = chunk_events  # not monkeypatch: hypothesis reruns the body
    try:
        chunked = "".join(render_chrome_trace(trace, "x.json"))
    finally:
        chrome_trace.CHUNK_EVENTS = default
    assert chunked == whole


def _render_peak_bytes(trace: Trace, chunk_events: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Peak traced memory while rendering ``trace`` and dropping each chunk (as a file write does)."""
    import tracemalloc

    monkeypatch.setattr(chrome_trace, "CHUNK_EVENTS", chunk_events)
    tracemalloc.start()
    try:
        for _ in render_chrome_trace(trace, "x.json"):
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_render_memory_is_bounded_by_the_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-event strings exist one chunk at a time: a smaller chunk gives a much smaller peak."""
    n = 20_000
    index = np.arange(n, dtype=np.int64)
    batch = EventBatch.build(
        "test",
        {
            "kind": np.zeros(n, dtype=np.int8),
            "name": index % 50,
            "start_ns": T0 + index * 1_000,
            "dur_ns": np.full(n, 500, dtype=np.int64),
            "pid": np.full(n, PID, dtype=np.int64),
            "tid": np.full(n, TID, dtype=np.int64),
            "correlation_id": index + 1,
        },
        {"name": tuple(f"aten::op_{i}" for i in range(50))},
    )
    trace = make_trace(batch)
    one_chunk = _render_peak_bytes(trace, n, monkeypatch)
    small_chunks = _render_peak_bytes(trace, n // 20, monkeypatch)
    # Whole-trace numpy columns stay (~100 bytes an event); the strings (~700 bytes an event) do not.
    assert small_chunks < 0.5 * one_chunk, (small_chunks, one_chunk)


# ------------------------------------------------- differential vs torch

VARIANTS: dict[str, dict[str, Any]] = {
    # No args fragment: our generated args must equal Kineto's.
    "plain": {},
    "shapes_memory_flops": {"record_shapes": True, "profile_memory": True, "with_flops": True},
    # torch records no memory events with profile_all_threads (pytorch/pytorch#192290).
    "all_threads": {"record_shapes": True, "profile_all_threads": True},
    "stack_verbose": {"record_shapes": True, "profile_memory": True, "with_stack": True, "verbose": True},
    # torch 2.11+ (_ExperimentalConfig.capture_overload_names): ops named "aten::add.Tensor".
    "overloads": {"record_shapes": True, "capture_overload_names": True},
    # Every flag at once, as the README's example and issue 9 ran it.
    "everything": {
        "record_shapes": True,
        "profile_memory": True,
        "with_flops": True,
        "with_stack": True,
        "verbose": True,
        "capture_overload_names": True,
    },
}
#: Categories each variant must produce (so a comparison of empty sets cannot pass).
VARIANT_CATEGORIES = {
    "plain": {"cpu_op", "user_annotation"},
    "shapes_memory_flops": {"cpu_op", "user_annotation", "cpu_instant_event"},
    "all_threads": {"cpu_op", "user_annotation"},
    "stack_verbose": {"cpu_op", "user_annotation", "cpu_instant_event", "python_function"},
    "overloads": {"cpu_op", "user_annotation"},
    "everything": {"cpu_op", "user_annotation", "cpu_instant_event", "python_function"},
}
#: _ExperimentalConfig fields of the variants (the rest are profile() arguments).
EXPERIMENTAL_FLAGS = ("verbose", "profile_all_threads", "capture_overload_names")


def _torch_workload(torch: Any, with_worker: bool) -> None:
    from torch.profiler import record_function

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with record_function("forward_block"):
        loss = model(x).sum()
    with record_function("backward_block"):
        loss.backward()
    torch.ones(3).add(torch.ones(3)).add_(1)  # overloads: aten::add.Tensor, aten::add_.Tensor
    if with_worker:
        worker = threading.Thread(target=lambda: torch.ones(4).mul(3).sum())
        worker.start()
        worker.join()


class _SavedOnce:
    """A ``_ProfilerResult`` that torch has already written to ``path``; ``save`` copies that file."""

    def __init__(self, result: Any, path: Path) -> None:
        self._result = result
        self._path = path

    def save(self, path: str) -> None:
        Path(path).write_bytes(self._path.read_bytes())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


@pytest.fixture(scope="module", params=list(VARIANTS))
def torch_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One torch.profiler run, written by torch and by polyprof from the same raw result."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity as TorchActivity
    from torch.profiler import profile

    from polyprof.base import torch_support
    from polyprof.runtime.torch_cpu import decode_result

    flags = dict(VARIANTS[request.param])
    experimental = {name: flags.pop(name) for name in EXPERIMENTAL_FLAGS if name in flags}
    lacking = sorted(set(experimental) - torch_support.installed().experimental_fields)
    if request.param != "everything" and lacking:
        pytest.skip(f"torch {torch.__version__} has no _ExperimentalConfig {', '.join(lacking)}")
    experimental = {name: value for name, value in experimental.items() if name not in lacking}
    all_threads = experimental.get("profile_all_threads", False)
    directory = tmp_path_factory.mktemp(request.param)
    with profile(
        activities=[TorchActivity.CPU],
        experimental_config=torch_support.make_experimental_config(**experimental),
        **flags,
    ) as prof:
        _torch_workload(torch, with_worker=all_threads)
    end_ns = time.time_ns()
    result = prof.profiler.kineto_results
    torch_path = directory / "torch.json"
    result.save(str(torch_path))
    # torch writes a result once; where polyprof reads the args back from torch's own
    # writer (torch without trace_activities), it gets the file torch just wrote.
    result = _SavedOnce(result, torch_path)
    config = ProfileConfig(activities={ProfilerActivity.CPU}, **experimental, **flags)
    batch, facts = decode_result(result, config)
    trace = Trace(
        events=batch,
        config=config,
        start_ns=facts["start_ns"],
        end_ns=end_ns,
        pid=os.getpid(),
        hostname=socket.gethostname(),
    )
    ours_path = directory / "ours.json"
    write_chrome_trace(trace, ours_path, layout=chrome_trace.kineto_layout())
    torch_doc = load_torch_file(torch_path)
    return {
        "torch": torch_doc,
        "torch_path": torch_path,
        "ours": load_exact(ours_path),
        "ours_text": ours_path.read_text(),
        "batch": batch,
        "trace": trace,
        "config": config,
        "variant": request.param,
    }


def _event_key(ev: Mapping[str, Any]) -> tuple:
    return (ev["ph"], ev.get("cat"), ev["name"], ev["ts"], ev.get("dur"), ev["pid"], ev["tid"])


def _recorded(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """X and i events except the profiler span and global markers (their times are clock reads at stop)."""
    return [e for e in events_of(doc, ("X", "i")) if e.get("cat") not in (None, "Trace")]


#: Kineto's CUDA builds without a GPU file their error log lines under this key; not a trace property.
KINETO_LOG_KEY = "ERROR"


def _top_level_layout(doc: Mapping[str, Any]) -> list[str]:
    """Top-level keys in order, each metadata key as "<metadata>" (torch's come out of a hash map)."""
    layout: list[str] = []
    for key in doc:
        if key == KINETO_LOG_KEY:
            continue
        key = key if key in CHROME_TRACE_RESERVED_KEYS else "<metadata>"
        if key != "<metadata>" or layout[-1:] != ["<metadata>"]:
            layout.append(key)
    return layout


def test_differential_top_level_keys(torch_run: dict[str, Any]) -> None:
    theirs, ours = list(torch_run["torch"]), list(torch_run["ours"])
    for keys in (theirs, ours):
        assert keys[:2] == ["schemaVersion", "deviceProperties"]
        assert {"displayTimeUnit", "baseTimeNanoseconds", "traceEvents", "traceName"} <= set(keys)
    # The installed torch's order (the time keys moved before traceEvents in 2.11).
    assert _top_level_layout(torch_run["ours"]) == _top_level_layout(torch_run["torch"])
    # torch's metadata keys come out of a hash map: same set, order free (host_name from 2.13 on).
    assert set(ours) == set(theirs) - {KINETO_LOG_KEY}
    assert torch_run["ours"]["baseTimeNanoseconds"] == torch_run["torch"]["baseTimeNanoseconds"]
    for flag in ("profile_memory", "record_shapes", "with_flops", "with_stack"):
        assert torch_run["ours"].get(flag) == torch_run["torch"].get(flag)


def test_differential_events_times_and_lanes(torch_run: dict[str, Any]) -> None:
    theirs = Counter(map(_event_key, _recorded(torch_run["torch"])))
    ours = Counter(map(_event_key, _recorded(torch_run["ours"])))
    assert sum(theirs.values()) > 20
    assert ours == theirs, {"only torch": theirs - ours, "only ours": ours - theirs}


def test_differential_args(torch_run: dict[str, Any]) -> None:
    def args_by_event(doc: Mapping[str, Any]) -> Counter:
        return Counter(
            (_event_key(e), json.dumps(e.get("args"), sort_keys=True, default=str)) for e in _recorded(doc)
        )

    theirs, ours = args_by_event(torch_run["torch"]), args_by_event(torch_run["ours"])
    assert ours == theirs, {"only torch": list(theirs - ours)[:3], "only ours": list(ours - theirs)[:3]}
    assert {e["cat"] for e in _recorded(torch_run["ours"])} == VARIANT_CATEGORIES[torch_run["variant"]]
    if torch_run["variant"] == "all_threads":
        assert len({e["tid"] for e in _recorded(torch_run["ours"])}) == 2, "main thread and worker"


def test_differential_flows_and_span(torch_run: dict[str, Any]) -> None:
    def flows(doc: Mapping[str, Any]) -> Counter:
        return Counter(tuple(sorted(e.items())) for e in events_of(doc, ("s", "f")))

    theirs, ours = flows(torch_run["torch"]), flows(torch_run["ours"])
    assert sum(theirs.values()) >= 2, "the backward pass must give fwdbwd flows"
    assert ours == theirs

    def markers(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        return {
            e["name"]: e
            for e in doc["traceEvents"]
            if e.get("cat") == "Trace" or (e["ph"] == "i" and "cat" not in e)
        }

    theirs_m, ours_m = markers(torch_run["torch"]), markers(torch_run["ours"])
    assert (
        set(ours_m)
        == set(theirs_m)
        == {"PyTorch Profiler (0)", "Iteration Start: PyTorch Profiler", "Record Window End"}
    )
    span, their_span = ours_m["PyTorch Profiler (0)"], theirs_m["PyTorch Profiler (0)"]
    assert span["ts"] == their_span["ts"] and span["args"] == their_span["args"]
    assert (span["pid"], span["tid"]) == (their_span["pid"], their_span["tid"])
    # Both spans end when collection stopped; ours reads the clock after torch's.
    assert span["dur"] >= their_span["dur"]
    assert ours_m["Iteration Start: PyTorch Profiler"] == theirs_m["Iteration Start: PyTorch Profiler"]
    last_end = max(e["ts"] + e.get("dur", 0) for e in _recorded(torch_run["ours"]))
    assert ours_m["Record Window End"]["ts"] >= last_end


def test_differential_event_key_order(torch_run: dict[str, Any]) -> None:
    """Every kind of event lists its keys in the installed torch's order (Kineto 2.12 put "ph" first)."""

    def orders(doc: Mapping[str, Any]) -> dict[tuple, set[tuple[str, ...]]]:
        found: dict[tuple, set[tuple[str, ...]]] = defaultdict(set)
        for ev in doc["traceEvents"]:
            found[(ev["ph"], ev.get("cat"), ev["name"] if ev["ph"] in ("M", "i") else None)].add(tuple(ev))
        return found

    theirs, ours = orders(torch_run["torch"]), orders(torch_run["ours"])
    assert set(ours) == set(theirs)
    for kind, key_orders in ours.items():
        assert key_orders <= theirs[kind], kind


def test_differential_metadata_events_placement(torch_run: dict[str, Any]) -> None:
    """Process/thread metadata before the events (torch 2.12+) or after them (before 2.12), as torch does."""

    def metadata_first(doc: Mapping[str, Any]) -> bool:
        kinds = [(e["ph"], e.get("cat")) for e in doc["traceEvents"]]
        first_event = next(i for i, (ph, cat) in enumerate(kinds) if ph == "X" and cat != "Trace")
        return kinds.index(("M", None)) < first_event

    assert metadata_first(torch_run["ours"]) == metadata_first(torch_run["torch"])


def test_differential_names_keep_overloads(torch_run: dict[str, Any]) -> None:
    names = {e["name"] for e in _recorded(torch_run["ours"]) if e["cat"] == "cpu_op"}
    assert names == {e["name"] for e in _recorded(torch_run["torch"]) if e["cat"] == "cpu_op"}
    if torch_run["config"].capture_overload_names and chrome_trace.kineto_layout().overload_in_names:
        assert {"aten::add.Tensor", "aten::add_.Tensor"} <= names
        # events() keeps torch's split: the overload is its own attribute, not part of the name.
        overloads = dict(zip(torch_run["batch"].values("name"), torch_run["batch"].values("overload", "")))
        assert overloads["aten::add"] == "Tensor" and overloads["aten::add_"] == "Tensor"
    else:
        assert not any("." in name for name in names), names


def test_differential_metadata_events(torch_run: dict[str, Any]) -> None:
    def kinds(doc: Mapping[str, Any]) -> set:
        return {
            (e["name"], e["pid"], e["tid"], json.dumps(e["args"], default=str)) for e in events_of(doc, "M")
        }

    ours, theirs = kinds(torch_run["ours"]), kinds(torch_run["torch"])
    assert ours <= theirs, ours - theirs
    # Kineto also names threads it saw but that recorded nothing (the Python
    # tracer knows every Python thread); events are all we have.
    busy = {(e["pid"], e["tid"]) for e in _recorded(torch_run["torch"])}
    for name, pid, tid, _ in theirs - ours:
        assert name in ("thread_name", "thread_sort_index") and (pid, tid) not in busy, (name, pid, tid)


def test_our_output_has_what_viewers_need(torch_run: dict[str, Any]) -> None:
    check_viewer_structure(torch_run["ours"], torch_run["ours_text"])


def test_reader_reads_torchs_file_back_to_the_raw_events(torch_run: dict[str, Any]) -> None:
    """torch's own file -> our reader gives what decode_result read from the raw result."""
    batch: EventBatch = torch_run["batch"]
    back = read_chrome_trace(torch_run["torch_path"]).events
    with_shapes = torch_run["variant"] != "plain"

    def rows(b: EventBatch) -> Counter:
        columns = [
            b.values("name"),
            b["kind"].tolist(),
            b["start_ns"].tolist(),
            b["dur_ns"].tolist(),
            b["tid"].tolist(),
            b["correlation_id"].tolist(),
        ]
        ops = np.isin(b["kind"], [int(EventKind.CPU_OP), int(EventKind.USER_ANNOTATION)])
        columns.append(np.where(ops, b["sequence_nr"], -1).tolist())
        columns.append(b.values("shapes", ()) if with_shapes else [()] * len(b))
        return Counter(zip(*columns))

    instants = np.isin(batch["kind"], [int(EventKind.MEMORY), int(EventKind.OUT_OF_MEMORY)])
    expected = rows(batch)
    if instants.any():  # torch's writer gives instants no duration; events() gives them 0 too
        assert (batch["dur_ns"][instants] == 0).all()
    got = rows(back)
    assert got == expected, {"missing": list(expected - got)[:3], "extra": list(got - expected)[:3]}
    memory = np.flatnonzero(instants)
    if len(memory):
        assert sorted(back["nbytes"][back["kind"] == int(EventKind.MEMORY)].tolist()) == sorted(
            batch["nbytes"][memory].tolist()
        )


def test_our_file_round_trips_through_the_reader(torch_run: dict[str, Any]) -> None:
    batch: EventBatch = torch_run["batch"]
    back = trace_from_chrome(torch_run["ours"]).events  # parsed with Decimal floats
    assert back.values("name") == batch.values("name")
    for field in ("kind", "start_ns", "dur_ns", "tid", "correlation_id"):
        assert back[field].tolist() == batch[field].tolist(), field


@installed_layout
def test_names_torch_cannot_write_are_fine_here(tmp_path: Path) -> None:
    """torch before 2.14 writes a quote in a record_function name unescaped (not JSON); we escape it.

    torch 2.14+ writes a valid file by rewriting the name (quotes to apostrophes); Kineto turns
    backslashes to slashes on every release. We write the name as the installed torch does.
    """
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity as TorchActivity
    from torch.profiler import profile, record_function

    from polyprof.runtime.torch_cpu import decode_result

    name = 'block "one" \\ two'
    with profile(activities=[TorchActivity.CPU]) as prof:
        with record_function(name):
            torch.ones(2).add(1)
    result = prof.profiler.kineto_results
    result.save(str(tmp_path / "torch.json"))
    try:
        theirs = load_chrome_trace(tmp_path / "torch.json")
    except TraceFileError as exc:
        assert "invalid JSON" in str(exc)
    else:
        assert "block 'one' / two" in {e["name"] for e in events_of(theirs, "X")}
    config = ProfileConfig(activities={ProfilerActivity.CPU})
    batch, facts = decode_result(result, config)
    trace = Trace(
        events=batch, config=config, start_ns=facts["start_ns"], end_ns=time.time_ns(), pid=os.getpid()
    )
    doc = export(trace, tmp_path / "ours.json")
    ours = {e["name"] for e in events_of(doc, "X")}
    layout = chrome_trace.kineto_layout()
    assert ("block 'one' / two" if layout.single_quotes_in_names else 'block "one" / two') in ours


def test_valid_fragments_not_ending_in_digits_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_repair(fragment: str) -> bool:
        raise AssertionError(f"valid fragment sent to the repair path: {fragment!r}")

    monkeypatch.setattr(kineto_format, "_is_object_body", must_not_repair)
    table = ('"grid": [1, 1, 1], "block": [128, 1, 1]', '"kind": "Memcpy HtoD"', '"Ev Idx": 12', '"x": 1.5')
    assert kineto_format.checked_args_texts(table) == list(table)


def test_ac2g_flow_starts_at_a_driver_launch_when_no_runtime_call_has_its_id(tmp_path: Path) -> None:
    cuda = int(DeviceType.CUDA)

    def host(kind: EventKind, name: str, corr: int, start: int) -> dict:
        return {
            "kind": kind,
            "name": name,
            "start_ns": T0 + start,
            "dur_ns": 100,
            "pid": PID,
            "tid": TID,
            "correlation_id": corr,
            "device_type": cuda,
        }

    def kernel(name: str, corr: int, start: int) -> dict:
        return {
            "kind": EventKind.KERNEL,
            "name": name,
            "start_ns": T0 + start,
            "dur_ns": 500,
            "correlation_id": corr,
            "device_type": cuda,
            "stream": 7,
        }

    rows = [
        host(EventKind.DRIVER, "cuLaunchKernel", 50, 0),  # driver API launch, no runtime call (as Triton)
        kernel("k_driver", 50, 1_000),
        host(EventKind.RUNTIME, "cudaLaunchKernel", 60, 2_000),
        host(EventKind.DRIVER, "cuLaunchKernel", 60, 2_010),  # same id: the runtime call starts the flow
        kernel("k_runtime", 60, 3_000),
    ]
    doc = export(make_trace(batch_from_rows(rows)), tmp_path / "t.json")
    starts = {f["id"]: f for f in events_of(doc, "s")}
    assert set(starts) == {50, 60} and {f["id"] for f in events_of(doc, "f")} == {50, 60}
    assert ns_of(starts[50]["ts"]) == T0 - BASE
    assert ns_of(starts[60]["ts"]) == T0 + 2_000 - BASE, "the runtime call, not the driver call it made"


# ------------------------------------- end to end: polyprof.profile vs torch.profiler


def _shape_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """What the trace schema is made of: top-level layout and keys, event kinds, their key
    orders and args keys, and the op names (with overloads)."""
    recorded = _recorded(doc)
    args_keys: dict[str, set[str]] = defaultdict(set)
    key_orders: dict[tuple, set[tuple[str, ...]]] = defaultdict(set)
    for ev in doc["traceEvents"]:
        key_orders[(ev["ph"], ev.get("cat"))].add(tuple(ev))
    for ev in recorded:
        args_keys[ev["cat"]].update(ev.get("args", {}))
    return {
        "layout": _top_level_layout(doc),
        "keys": set(doc) - {KINETO_LOG_KEY},
        "types": {k: type(v).__name__ for k, v in doc.items() if k != KINETO_LOG_KEY},
        "kinds": set(key_orders),
        "key_orders": dict(key_orders),
        "args_keys": dict(args_keys),
        "ops": Counter(e["name"] for e in recorded if e["cat"] in ("cpu_op", "user_annotation")),
    }


@installed_layout
def test_end_to_end_trace_shape_matches_torchs(tmp_path: Path) -> None:
    """The same workload under torch.profiler (its own export) and polyprof.profile, every flag on."""
    torch = pytest.importorskip("torch")
    import torch.profiler as tp

    import polyprof
    from polyprof.base import torch_support

    fields = torch_support.installed().experimental_fields
    flags = {"verbose": True, "capture_overload_names": "capture_overload_names" in fields}
    options = {"record_shapes": True, "profile_memory": True, "with_flops": True, "with_stack": False}
    shapes = {}
    for name, profile_cls, activity in (
        ("torch", tp.profile, tp.ProfilerActivity.CPU),
        ("ours", polyprof.profile, polyprof.ProfilerActivity.CPU),
    ):
        with profile_cls(
            activities=[activity],
            experimental_config=torch_support.make_experimental_config(**flags),
            **options,
        ) as prof:
            _torch_workload(torch, with_worker=False)
        path = tmp_path / f"{name}.json"
        prof.export_chrome_trace(str(path))
        shapes[name] = _shape_of(load_torch_file(path))
    theirs, ours = shapes["torch"], shapes["ours"]
    assert {"cpu_op", "user_annotation", "cpu_instant_event"} <= {cat for _, cat in theirs["kinds"]}
    for part in ("layout", "keys", "types", "kinds", "args_keys", "ops"):
        assert ours[part] == theirs[part], part
    for kind, orders in ours["key_orders"].items():
        assert orders <= theirs["key_orders"][kind], kind
    if flags["capture_overload_names"] and chrome_trace.kineto_layout().overload_in_names:
        assert ours["ops"]["aten::add.Tensor"] == 1  # torch 2.7 records overloads but writes plain names


def test_python_functions_torch_lists_only_in_its_trace_stay_out_of_events(torch_run: dict[str, Any]) -> None:
    """torch < 2.12 writes python_function events to its trace but lists none in ``events()``.

    polyprof's trace has them (the differential tests compare them with torch's); they are
    ``trace_only`` rows, which the tree behind ``events()`` and every table leaves out.
    """
    from polyprof.base import torch_support

    batch: EventBatch = torch_run["batch"]
    python = batch["kind"] == int(EventKind.PYTHON_FUNCTION)
    if not torch_run["config"].with_stack:
        assert not python.any()
        return
    assert python.any()
    lists_python_functions = torch_support.installed().has_accessor("is_python_function")
    assert (batch["trace_only"][python] == (not lists_python_functions)).all()
    assert not batch["trace_only"][~python].any()
    tree = EventTree.from_trace(torch_run["trace"], use_device=None)
    in_tree = np.isin(batch["kind"][tree.source[~tree.synthetic]], int(EventKind.PYTHON_FUNCTION))
    assert in_tree.any() == lists_python_functions


# ------------------------------------------------------------------- counters


#: An op beside the counters.
MM_ROW = {
    "kind": int(EventKind.CPU_OP),
    "name": "aten::mm",
    "start_ns": T0 + 1_000,
    "dur_ns": 5_000,
    "pid": PID,
    "tid": TID,
}


def counter_row(name: str, series: str | None, value: float, offset_ns: int, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "kind": int(EventKind.COUNTER),
        "name": name,
        "start_ns": T0 + offset_ns,
        "counter_value": value,
        "trace_only": True,
        "pid": 0,
        "tid": 0,
        "device_index": 0,
        "device_type": int(DeviceType.CUDA),
    }
    if series is not None:
        row["counter_series"] = series
    row.update(extra)
    return row


def test_counter_rows_become_chrome_counter_events(tmp_path: Path) -> None:
    rows = [
        MM_ROW,
        counter_row("GPU Utilization", "%", 37.0, 2_500),
        counter_row("GPU Power", "W", 250.125, 2_500),
        counter_row("GPU Power", "W", float("nan"), 3_000),
        counter_row("GPU Memory Used", "MiB", 1.5e20, 3_000),
        counter_row("GPU Memory Used", None, 7.0, 4_000, pid=2, device_index=2),
    ]
    doc = export(make_trace(batch_from_rows(rows)), tmp_path / "t.json")
    counters = events_of(doc, "C")
    assert [(e["name"], e["pid"], e["tid"], ns_of(e["ts"]) - (T0 - BASE), e["args"]) for e in counters] == [
        ("GPU Utilization", 0, 0, 2_500, {"%": 37}),
        ("GPU Power", 0, 0, 2_500, {"W": Decimal("250.125")}),
        ("GPU Power", 0, 0, 3_000, {"W": None}),  # NaN is not JSON: Perfetto skips a null sample
        ("GPU Memory Used", 0, 0, 3_000, {"MiB": Decimal("1.5e+20")}),
        ("GPU Memory Used", 2, 0, 4_000, {kineto_format.DEFAULT_COUNTER_SERIES: 7}),
    ]
    assert all(next(iter(e)) == "ph" and "cat" not in e and "dur" not in e for e in counters)
    names = {(e["pid"], e["args"]["name"]) for e in events_of(doc, "M") if e["name"] == "process_name"}
    # Device processes are named for their counters even without device activity; no stream lanes.
    assert {(0, "CUDA 0"), (2, "CUDA 2")} <= names
    assert not [e for e in events_of(doc, "M") if e["name"] == "thread_name" and e["pid"] in (0, 2)]
    assert [e["name"] for e in events_of(doc, "X") if e.get("cat") == "cpu_op"] == ["aten::mm"]


def test_a_cpu_activity_filter_keeps_counters(tmp_path: Path) -> None:
    rows = [
        MM_ROW,
        counter_row("GPU Utilization", "%", 50.0, 2_000),
    ]
    only_annotations = {ProfilerActivity.CPU: frozenset({"USER_ANNOTATION"})}
    config = ProfileConfig(activities={ProfilerActivity.CPU}, activity_filters=only_annotations)
    doc = export(make_trace(batch_from_rows(rows), config=config), tmp_path / "t.json")
    assert [e["name"] for e in events_of(doc, "C")] == ["GPU Utilization"]
    assert not [e for e in events_of(doc, "X") if e.get("cat") == "cpu_op"]


def test_counter_events_read_back_as_trace_only_counter_rows(tmp_path: Path) -> None:
    rows = [
        {**MM_ROW, "correlation_id": 1},
        counter_row("GPU Utilization", "%", 37.0, 2_500),
        counter_row("GPU Power", "W", 250.125, 2_501, pid=1, device_index=1),
    ]
    trace = make_trace(batch_from_rows(rows))
    path = tmp_path / "t.json"
    write_chrome_trace(trace, str(path))
    back = read_chrome_trace(str(path))
    events = back.events
    counters = np.flatnonzero(events["kind"] == int(EventKind.COUNTER))
    assert [events.values("name")[i] for i in counters] == ["GPU Utilization", "GPU Power"]
    assert [events.values("counter_series")[i] for i in counters] == ["%", "W"]
    assert events["counter_value"][counters].tolist() == [37.0, 250.125]
    assert events["start_ns"][counters].tolist() == [T0 + 2_500, T0 + 2_501]
    assert events["pid"][counters].tolist() == events["device_index"][counters].tolist() == [0, 1]
    assert set(events["device_type"][counters].tolist()) == {int(DeviceType.CUDA)}
    assert events["trace_only"][counters].all()
    assert back.notes == ()  # counters are not "unknown categories"
    tree = EventTree.from_trace(back, use_device=None)
    assert not np.isin(tree.source[~tree.synthetic], counters).any(), "events() leaves counters out"
    # ... and a second trip writes the same counter events.
    again = tmp_path / "again.json"
    write_chrome_trace(back, str(again))
    assert events_of(load_exact(again), "C") == events_of(load_exact(path), "C")


def test_counters_of_other_writers_read_back_one_row_per_numeric_series() -> None:
    # HTA's generate_trace_with_counters writes {name: value} counters on a rank's lanes; chrome://tracing
    # counters may carry several series (stacked), and an "id" ("ctr id: 1" in Perfetto).
    doc = {
        "baseTimeNanoseconds": BASE,
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "CUDA 1"}},
            {"ph": "C", "name": "Queue Length", "pid": 1, "tid": 7, "ts": 1.5, "args": {"Queue Length": 3}},
            {
                "ph": "C",
                "name": "ctr",
                "id": "1",
                "pid": PID,
                "ts": 2.25,
                "args": {"cats": 1, "dogs": 2.5, "label": "not a number"},
            },
            {"ph": "C", "name": "no args", "pid": PID, "ts": 3},
            {"ph": "C", "name": "no ts", "pid": PID, "args": {"v": 1}},
        ],
    }
    events = trace_from_chrome(doc).events
    rows = [
        (n, s, v, t - BASE, p, tid, dt, di, only)
        for n, s, v, t, p, tid, dt, di, only in zip(
            events.values("name"),
            events.values("counter_series"),
            events["counter_value"].tolist(),
            events["start_ns"].tolist(),
            events["pid"].tolist(),
            events["tid"].tolist(),
            events["device_type"].tolist(),
            events["device_index"].tolist(),
            events["trace_only"].tolist(),
        )
    ]
    assert rows == [
        ("Queue Length", "Queue Length", 3.0, 1_500, 1, 7, int(DeviceType.CUDA), 1, True),
        ("ctr", "cats", 1.0, 2_250, PID, 0, int(DeviceType.CPU), -1, True),
        ("ctr", "dogs", 2.5, 2_250, PID, 0, int(DeviceType.CPU), -1, True),
    ]
    assert set(events["kind"].tolist()) == {int(EventKind.COUNTER)}
