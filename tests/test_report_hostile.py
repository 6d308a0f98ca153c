"""``polyprof report`` on hostile files (issue 11, fault 7).

A trace file is input from anywhere: a gzip bomb, a device, a FIFO, JSON nested
past any parser's stack, times that are NaN or beyond int64 nanoseconds, names
carrying terminal escape sequences. Each gives either a table whose numbers are
those of the file's usable events (the rest skipped and counted in a note) or
exit 2 with one line on stderr, never a traceback, unbounded memory or raw
control characters on the terminal.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof.base.kineto_format import encode_args
from polyprof.base.terminal import terminal_safe
from polyprof.cli.cli_report import EXIT_BAD_INPUT
from polyprof.formats.chrome_reader import DEFAULT_MAX_BYTES, MAX_BYTES_ENV, read_chrome_trace
from report_cli import CliResult, report_runner

REPO_ROOT = Path(__file__).resolve().parents[1]
PREFIX = "polyprof report: error: "
NOTE = "polyprof report: note: "
#: Base time of torch's traces (a trimonth boundary).
BASE_NS = 1_790_857_026_000_000_000
#: What no line of the report may carry raw: C0 (but newline), DEL, C1, bidi controls.
RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


@pytest.fixture
def report(monkeypatch, capsys) -> Callable[..., CliResult]:
    """Run ``polyprof report ARGS`` in-process through ``polyprof.cli.main``."""
    return report_runner(monkeypatch, capsys)


def assert_one_line_error(result: CliResult, path: Any, problem: str) -> None:
    assert result.code == EXIT_BAD_INPUT == 2, result
    assert result.out == ""
    assert result.err.count("\n") == 1, result.err
    assert result.err.startswith(f"{PREFIX}{path}: "), result.err
    assert problem in result.err, result.err
    assert "Traceback" not in result.err


def op(name: Any, ts: Any, dur: Any, **fields: Any) -> dict[str, Any]:
    """A ``cpu_op`` complete event on thread (1, 1)."""
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, **fields}


def write_trace(path: Path, events: list[Any], **top: Any) -> Path:
    """A trace file; NaN, Infinity and integers past 64 bits written as the stdlib writes them."""
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE_NS, "traceEvents": events, **top}))
    return path


# ------------------------------------------------------------------ sizes


def gzip_bomb(path: Path, decompressed: int, prefix: bytes = b'{"traceEvents": [], "pad": "') -> Path:
    """A gzip file of ``decompressed`` bytes of JSON (mostly one string of zeros), ~1000x smaller."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip container
    zeros = b"0" * 2**20
    parts = [compressor.compress(prefix)]
    parts += [compressor.compress(zeros) for _ in range(decompressed // len(zeros))]
    parts += [compressor.compress(b'"}'), compressor.flush()]
    path.write_bytes(b"".join(parts))
    return path


_PEAK_CHILD = """
import resource, sys
from polyprof import cli
from polyprof.cli.cli_report import add_report_command
if add_report_command not in cli.SUBCOMMANDS:
    cli.SUBCOMMANDS.append(add_report_command)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
code = cli.main(["report", sys.argv[1]])
grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(f"{code} {grown_kib}", file=sys.__stdout__)
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="resource.getrusage is POSIX")
def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    # 256 MiB of JSON in a 250 KiB file: before the fix, read whole and parsed (peak ~+770 MiB).
    bomb = gzip_bomb(tmp_path / "bomb.json.gz", 256 * 2**20)
    assert bomb.stat().st_size < 2**20
    env = {k: v for k, v in os.environ.items() if k != MAX_BYTES_ENV}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, str(bomb)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO_ROOT,
    )
    code, grown_kib = map(int, done.stdout.split())
    assert code == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"{PREFIX}{bomb}: ") and "gzip bomb" in done.stderr
    # What is read stops at 64 MiB (the bomb check's floor): well under what the file inflates to.
    assert grown_kib < 160 * 1024, f"peak memory grew by {grown_kib} KiB"


def test_decompressed_size_over_the_limit_names_the_variable(tmp_path, report, monkeypatch):
    events = [op(f"aten::op{i}", float(i), 1.0) for i in range(200)]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    assert report(path).code == 0
    monkeypatch.setenv(MAX_BYTES_ENV, "5000")  # more than the file, less than its JSON
    assert path.stat().st_size < 5000
    assert_one_line_error(
        report(path),
        path,
        f"the gzip data decompress to more than the 4.9 KiB polyprof reads ({MAX_BYTES_ENV}=5000)",
    )
    assert f"set {MAX_BYTES_ENV} to a larger number of bytes" in report(path).err


def test_plain_file_over_the_limit_is_refused_before_reading(tmp_path, report, monkeypatch):
    path = write_trace(tmp_path / "t.json", [op("aten::mm", 1.0, 2.0)])
    monkeypatch.setenv(MAX_BYTES_ENV, "100")
    assert_one_line_error(
        report(path), path, f"the file is {path.stat().st_size} bytes, more than the 100 bytes"
    )
    monkeypatch.setenv(MAX_BYTES_ENV, str(path.stat().st_size))  # the limit itself is allowed
    assert report(path).code == 0


@pytest.mark.parametrize("value", ["lots", "0", "-5", "1.5e9"])
def test_bad_limit_value_is_one_line_naming_the_variable(tmp_path, report, monkeypatch, value):
    path = write_trace(tmp_path / "t.json", [op("aten::mm", 1.0, 2.0)])
    monkeypatch.setenv(MAX_BYTES_ENV, value)
    result = report(path)
    assert result.code == 2 and result.out == "" and result.err.count("\n") == 1
    assert result.err == (
        f"{PREFIX}{MAX_BYTES_ENV} must be a whole number of bytes above 0 (default {DEFAULT_MAX_BYTES}); "
        f"got {value!r}\n"
    )


def test_running_out_of_memory_is_one_line(tmp_path, report, monkeypatch):
    path = write_trace(tmp_path / "t.json", GOOD)

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr("polyprof.cli.cli_report.read_chrome_trace", exhausted)
    assert_one_line_error(report(path), path, "not enough memory to read this trace")


# ------------------------------------------------------------- not files


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_character_device_is_refused_without_reading_it(report, monkeypatch):
    # Before the fix: read until memory ran out (MemoryError traceback). The small limit keeps a
    # regression that reads the device from eating the machine's memory.
    monkeypatch.setenv(MAX_BYTES_ENV, str(2**20))
    assert_one_line_error(report("/dev/zero"), "/dev/zero", "is a character device, not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path, report):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)

    def unblock() -> None:  # before the fix, open() waits for a writer: be that writer, then leave
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader waiting: the report did not open it
            pass

    rescue = threading.Timer(5.0, unblock)
    rescue.start()
    try:
        result = report(fifo)
    finally:
        rescue.cancel()
    assert_one_line_error(result, fifo, "is a named pipe (FIFO), not a regular file")


# ---------------------------------------------------------------- nesting


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("make_text", "problem"),
    [
        # past orjson's 1024 levels; before the fix the stdlib retry ended in a RecursionError traceback
        (
            lambda: '{"traceEvents": ' + _nested(100_000) + "}",
            "JSON nested too deeply (more than 1024 levels",
        ),
        # NaN first sends the parse to the stdlib, which runs out of stack
        (
            lambda: '{"x": NaN, "traceEvents": ' + _nested(100_000) + "}",
            "JSON nested too deeply (past Python's recursion limit)",
        ),
        # within orjson's limit, past Python's when the reader walks it
        (
            lambda: json.dumps({"traceEvents": [op("aten::mm", 1.0, 2.0, args={"x": 0})]}).replace(
                '"x": 0', '"x": ' + _nested(1000)
            ),
            "JSON nested too deeply (a value past Python's recursion limit)",
        ),
    ],
    ids=["orjson limit", "stdlib parser", "value in args"],
)
def test_deep_nesting_is_one_line(tmp_path, report, make_text, problem):
    path = tmp_path / "deep.json"
    path.write_text(make_text())
    assert_one_line_error(report(path), path, problem)


def test_args_nested_past_orjsons_writer_are_kept(tmp_path, report):
    # orjson writes 254 levels at most: before the fix this was a TypeError traceback.
    text = json.dumps({"traceEvents": [op("aten::mm", 1.0, 2.0, args={"x": 0})]})
    path = tmp_path / "t.json"
    path.write_text(text.replace('"x": 0', '"x": ' + _nested(300)))
    result = report(path)
    assert result.code == 0, result.err
    assert "aten::mm" in result.out
    trace = read_chrome_trace(path)
    (args,) = trace.events.tables["args"]
    assert args == {"x": json.loads(_nested(300))}
    assert encode_args(args) == f'"x": {_nested(300)}'  # what writing the trace again puts there


# ------------------------------------------------------------------ values

GOOD = [op("aten::mm", 10.0, 40.0), op("aten::add", 20.0, 5.5), op("aten::mm", 60.0, 4.0)]
BAD_TIMES: dict[str, tuple[dict[str, Any], str]] = {
    "NaN ts": (op("aten::bad", float("nan"), 1.0), "with a NaN ts or dur"),
    "NaN dur": (op("aten::bad", 30.0, float("nan")), "with a NaN ts or dur"),
    "infinite dur": (op("aten::bad", 30.0, float("inf")), "with an infinite ts or dur"),
    "infinite ts": (op("aten::bad", float("-inf"), 1.0), "with an infinite ts or dur"),
    "negative dur": (op("aten::bad", 30.0, -5.0), "with a negative dur"),
    "huge ts": (op("aten::bad", 1e300, 1.0), "with a ts or dur beyond the int64 nanosecond range"),
    "huge dur": (op("aten::bad", 30.0, 1e16), "with a ts or dur beyond the int64 nanosecond range"),
    "huge integer dur": (op("aten::bad", 30.0, 10**30), "with a ts or dur beyond the int64 nanosecond range"),
    "400-digit ts": (op("aten::bad", 10**400, 1.0), "with a ts or dur beyond the int64 nanosecond range"),
    "text dur": (op("aten::bad", 30.0, "5"), "with a dur that is not a number"),
    "null dur": (op("aten::bad", 30.0, None), "with a dur that is not a number"),
    "boolean ts": (op("aten::bad", True, 1.0), "with a ts that is not a number"),
}


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("case", list(BAD_TIMES))
def test_bad_times_are_skipped_counted_and_leave_the_rest_right(tmp_path, report, case):
    bad, what = BAD_TIMES[case]
    clean = report(write_trace(tmp_path / "clean.json", GOOD))
    # the bad event inside aten::mm's interval: had it been kept, its time would come off mm's self time
    result = report(write_trace(tmp_path / "bad.json", [GOOD[0], bad, *GOOD[1:]]))
    assert result.code == 0, result.err
    assert result.out == clean.out  # every number of the good events as without the bad one
    assert "aten::bad" not in result.out
    assert result.err == f"{NOTE}chrome trace: skipped 1 events with values that cannot be used (1 {what})\n"


def test_bad_times_are_counted_per_kind(tmp_path, report):
    events = [*GOOD, *(bad for bad, _ in BAD_TIMES.values())]
    result = report(write_trace(tmp_path / "bad.json", events))
    assert result.code == 0
    note = result.err.removeprefix(NOTE)
    assert note.startswith(f"chrome trace: skipped {len(BAD_TIMES)} events with values that cannot be used (")
    counts = {what: int(n) for n, what in re.findall(r"(\d+) (with [^,)]+)", note)}
    assert counts == {
        "with a ts or dur beyond the int64 nanosecond range": 4,
        "with a NaN ts or dur": 2,
        "with an infinite ts or dur": 2,
        "with a dur that is not a number": 2,
        "with a negative dur": 1,
        "with a ts that is not a number": 1,
    }


def test_bad_span_and_counter_times_do_not_reach_the_trace(tmp_path):
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "ts": float("nan"), "dur": 1e300}
    counters = [
        {"ph": "C", "name": "util", "pid": 1, "ts": ts, "args": {"v": 1.0}}
        for ts in (5.0, float("nan"), 1e300)
    ]
    trace = read_chrome_trace(write_trace(tmp_path / "t.json", [span, *GOOD, *counters]))
    assert trace.start_ns == BASE_NS + 10_000 and trace.end_ns == BASE_NS + 64_000  # from the events
    (note,) = trace.notes
    assert note == (
        "chrome trace: skipped 2 events with values that cannot be used "
        "(1 with a NaN ts or dur, 1 with a ts or dur beyond the int64 nanosecond range)"
    )
    assert len(trace.events) == len(GOOD) + 1  # one counter row left


def test_memory_events_on_devices_polyprof_does_not_know_are_skipped(tmp_path, report):
    args = {"Device Type": 13, "Device Id": 0, "Bytes": 512}  # 13: torch's MPS
    memory = {**op("[memory]", 15.0, 0.0), "ph": "i", "cat": "cpu_instant_event", "args": args}
    result = report(write_trace(tmp_path / "mps.json", [*GOOD, memory], profile_memory=1))
    assert result.code == 0, result.err
    assert "with a memory Device Type polyprof does not know" in result.err


# ------------------------------------------------------------------- names

EVIL_NAMES = {
    "clear screen": "evil\x1b[2J",
    "window title": "t\x1b]0;pwned\x07",
    "C1 CSI": "c1\x9b31m",
    "newline": "two\nlines",
    "carriage return": "over\rwrite",
    "right-to-left override": "abc\u202edef",
    "delete": "del\x7f",
}


def test_terminal_safe_escapes_controls_and_keeps_unicode():
    assert terminal_safe("evil\x1b[2J\x07") == "evil\\x1b[2J\\x07"
    assert terminal_safe("a\nb\tc\x9b\x7f") == "a\\x0ab\\x09c\\x9b\\x7f"
    assert terminal_safe("x\u202ey\u2066z\u2028") == "x\\u202ey\\u2066z\\u2028"
    for text in ("aten::add", "café ☃ 日本語 👩\u200d💻", "C:\\path\\x1b", ""):
        assert terminal_safe(text) == text


def test_names_are_escaped_in_the_table_and_columns_line_up(tmp_path, report):
    events = [op(name, 10.0 * i, 2.0) for i, name in enumerate(EVIL_NAMES.values())]
    events.append(op("café ☃ 日本語", 100.0, 1.0))
    result = report(write_trace(tmp_path / "evil.json", events))
    assert result.code == 0, result.err
    assert not RAW_CONTROLS.search(result.out), result.out  # before the fix, ESC and BEL reached the terminal
    for name in EVIL_NAMES.values():
        assert terminal_safe(name) in result.out
    assert "café ☃ 日本語" in result.out
    table = result.out.splitlines()
    rule = table[0]
    assert all(len(line) == len(rule) for line in table[:-1] if line.startswith(("-", " ")))


def test_file_text_in_notes_and_errors_is_escaped(tmp_path, report):
    odd = {"ph": "X", "cat": "tool\x1b[31m", "name": "x", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}
    result = report(write_trace(tmp_path / "cat.json", [*GOOD, odd]))
    assert result.code == 0
    assert "1 tool\\x1b[31m" in result.err and not RAW_CONTROLS.search(result.err.replace("\n", ""))
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"a\x1b]0;x\x07": 1}))
    assert_one_line_error(report(path), path, 'no "traceEvents" key (top-level keys: a\\x1b]0;x\\x07)')


# --------------------------------------------------- other hostile content

HOSTILE_TRACES: dict[str, tuple[list[Any], dict[str, Any]]] = {
    # before the fix each of these ended in a traceback
    "list pid with a flow": (
        [
            op("aten::mm", 1.0, 2.0, pid=[1]),
            {"ph": "s", "cat": "fwdbwd", "id": 1, "pid": [1], "tid": 1, "ts": 1.0},
        ],
        {},
    ),
    "Input Dims of numbers": ([op("aten::mm", 1.0, 2.0, args={"Input Dims": [1, "a"]})], {}),
    "ids that are lists": ([op("aten::mm", 1.0, 2.0, tid=[[1, 2]], args={"Python thread": [[1, 2]]})], {}),
    "negative External id": (
        [
            op("aten::mm", 1.0, 20.0, args={"External id": 1}),
            {**op("cudaLaunchKernel", 2.0, 1.0), "cat": "cuda_runtime", "args": {"External id": -2}},
        ],
        {},
    ),
    "deviceProperties not a list": ([op("aten::mm", 1.0, 2.0)], {"deviceProperties": 5}),
    "args integer past the double range": ([op("aten::mm", 1.0, 2.0, args={"x": 10**400})], {}),
    "memory row of a device polyprof does not know": (
        [
            {
                **op("alloc", 1.0, 0.0),
                "ph": "i",
                "cat": "cpu_instant_event",
                "args": {"Device Type": 13, "Bytes": 4},
            },
            op("aten::mm", 1.0, 2.0),
        ],
        {"profile_memory": 1},
    ),
    "GPU annotation without kernels": (
        [{**op("step", 1.0, 5.0), "cat": "gpu_user_annotation", "pid": 2, "tid": 7}],
        {},
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_TRACES))
def test_hostile_content_gives_a_table_or_one_line(tmp_path, report, case):
    events, top = HOSTILE_TRACES[case]
    path = write_trace(tmp_path / "t.json", events, **top)
    result = report(path)
    if result.code == 2:
        assert_one_line_error(result, path, "")
    else:
        assert result.code == 0, result.err
        assert "aten::mm" in result.out


# fmt: off
_ODD_VALUES = st.sampled_from([
    None, True, "x", "\x1b[2J", [], {}, [[1, 2]], [1, "a"], {"a": 1}, float("nan"), float("inf"), -1, 0,
    2.5, -2.5, 10**30, 1e300, 2**63, -(2**63), 13, "CUDA 0",
])
_CATEGORIES = st.sampled_from([
    "cpu_op", "kernel", "cuda_runtime", "gpu_memcpy", "cpu_instant_event", "user_annotation",
    "gpu_user_annotation", "python_function", "Trace", "fwdbwd", "ac2g", "cuda_sync", None,
])
_ARG_KEYS = [
    "External id", "correlation", "device", "stream", "Input Dims", "Python parent id", "Bytes",
    "Device Id", "Device Type", "Call stack", "Sequence number", "labels", "name",
]
# fmt: on


@st.composite
def _hostile_event(draw: Any) -> Any:
    event = {
        "ph": draw(st.sampled_from(["X", "X", "i", "C", "M", "s", "f"]) | _ODD_VALUES),
        "cat": draw(_CATEGORIES | _ODD_VALUES),
        "name": draw(
            st.sampled_from(["aten::mm", "aten::add.Tensor", "process_name", "[memory]"]) | _ODD_VALUES
        ),
        "pid": draw(st.sampled_from([1, 2]) | _ODD_VALUES),
        "tid": draw(st.sampled_from([1, 7]) | _ODD_VALUES),
        "ts": draw(st.floats(0, 100) | _ODD_VALUES),
        "dur": draw(st.floats(0, 50) | _ODD_VALUES),
        "id": draw(st.sampled_from([1, 2]) | _ODD_VALUES),
        "args": draw(
            st.dictionaries(st.sampled_from(_ARG_KEYS), st.sampled_from([1, 2, 11, [[2, 3]]]) | _ODD_VALUES)
            | _ODD_VALUES
        ),
    }
    return {key: value for key, value in event.items() if value is not None or draw(st.booleans())}


@pytest.mark.filterwarnings("error")
@settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=st.lists(_hostile_event(), min_size=1, max_size=12))
def test_any_hostile_events_give_a_table_or_one_line(tmp_path, report, events):
    path = write_trace(tmp_path / "fuzz.json", events)
    result = report(path)
    assert result.code in (0, 2), result
    assert "Traceback" not in result.err and "Warning" not in result.err
    assert not RAW_CONTROLS.search(result.out)
    assert not RAW_CONTROLS.search(result.err.replace("\n", ""))
    if result.code == 2:
        assert result.err.count("\n") == 1 and result.err.startswith(PREFIX), result.err
