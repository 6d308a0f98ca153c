"""``polyprof report TRACE``: torch's key_averages table from a saved Chrome trace.

* Differential against torch: one workload profiled by ``torch.profiler``
  (plain, shapes + memory, FLOPs, a schedule with ``ProfilerStep``), written by
  torch's own ``export_chrome_trace`` as ``.json`` and ``.json.gz``; the report
  must print torch's ``prof.key_averages().table()`` text for that profile.
* polyprof's own traces (``polyprof.profile`` + ``export_chrome_trace``).
* Options (sort, row limit, time unit, grouping, top-level) against their
  documented meaning, with hypothesis over sort keys and limits.
* Every unusable input gives one line on stderr and exit 2; no torch needed.

The command is reached through ``polyprof.cli.main`` with ``SUBCOMMANDS``
patched to include it, so argparse's exit codes and the handler's are the
ones the installed command gives.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof.analysis.table import VALID_SORT_KEYS
from polyprof.cli.cli_report import (
    EXIT_BAD_INPUT,
    SORT_CHOICES,
    ReportOptions,
    default_sort_key,
    load_report_results,
    render_report,
)
from report_cli import CliResult, report_runner

REPO_ROOT = Path(__file__).resolve().parents[1]
PREFIX = "polyprof report: error: "
#: Base time of torch's traces (a trimonth boundary), for hand-written traces.
BASE_NS = 1_790_857_026_000_000_000
_TIME_CELL = re.compile(r"^(-?\d+\.\d{3})(us|ms|s)$")
_US_PER_UNIT = {"us": 1.0, "ms": 1e3, "s": 1e6}


@pytest.fixture
def report(monkeypatch, capsys) -> Callable[..., CliResult]:
    """Run ``polyprof report ARGS`` in-process through ``polyprof.cli.main``."""
    return report_runner(monkeypatch, capsys)


def data_rows(table: str) -> list[list[str]]:
    """The cells of each event row of a table (between the header rule and the closing rule)."""
    lines = table.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("---")]
    assert len(rules) >= 3, table
    return [re.split(r"\s{2,}", line.strip()) for line in lines[rules[1] + 1 : rules[-1]]]


def header_cells(table: str) -> list[str]:
    lines = table.splitlines()
    first_rule = next(i for i, line in enumerate(lines) if line.startswith("---"))
    return re.split(r"\s{2,}", lines[first_rule + 1].strip())


def time_us(cell: str) -> float:
    match = _TIME_CELL.match(cell)
    assert match, cell
    return float(match.group(1)) * _US_PER_UNIT[match.group(2)]


# ------------------------------------------------------------------ workloads


def _train_steps(
    torch: Any, record_function: Any, steps: int, on_step: Callable[[], None] | None = None
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(8, 32)
    for _ in range(steps):
        with record_function("forward"):
            loss = model(x).sum()
        with record_function("backward"):
            loss.backward()
        if on_step is not None:
            on_step()


#: name -> torch.profiler.profile keyword arguments.
TORCH_VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "shapes_memory": {"record_shapes": True, "profile_memory": True},
    "flops": {"with_flops": True},
}


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Each variant profiled once by torch; its own export as .json and .json.gz, and the profile."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    root = tmp_path_factory.mktemp("torch_traces")
    runs: dict[str, dict[str, Any]] = {}
    for name, kwargs in TORCH_VARIANTS.items():
        with profile(activities=[ProfilerActivity.CPU], **kwargs) as prof:
            _train_steps(torch, record_function, steps=3)
        paths = {suffix: root / f"{name}{suffix}" for suffix in (".json", ".json.gz")}
        prof.export_chrome_trace(str(paths[".json"]))  # torch saves a profile once
        # What torch's own ".gz" export writes: the same JSON, gzip-compressed (the schedule run
        # below has torch write its .json.gz itself).
        paths[".json.gz"].write_bytes(gzip.compress(paths[".json"].read_bytes()))
        runs[name] = {"prof": prof, "paths": paths}

    # A schedule: the trace of the last active cycle, written by on_trace_ready as torch's users do.
    scheduled = root / "scheduled.json.gz"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2),
        on_trace_ready=lambda p: p.export_chrome_trace(str(scheduled)),
        record_shapes=True,
    ) as prof:
        _train_steps(torch, record_function, steps=4, on_step=prof.step)
    runs["schedule"] = {"prof": prof, "paths": {".json.gz": scheduled}}
    return runs


@pytest.fixture(scope="module")
def polyprof_run(tmp_path_factory) -> dict[str, Any]:
    """The workload profiled by polyprof, exported by polyprof's chrome exporter."""
    torch = pytest.importorskip("torch")
    import polyprof

    root = tmp_path_factory.mktemp("polyprof_traces")
    with polyprof.profile(
        activities=[polyprof.ProfilerActivity.CPU], record_shapes=True, profile_memory=True
    ) as prof:
        _train_steps(torch, polyprof.record_function, steps=3)
    paths = {suffix: root / f"polyprof{suffix}" for suffix in (".json", ".json.gz")}
    for path in paths.values():
        prof.export_chrome_trace(path)
    return {"prof": prof, "paths": paths}


# ---------------------------------------------------- differential: torch's table


TORCH_CASES = [
    (variant, suffix) for variant in ("plain", "shapes_memory") for suffix in (".json", ".json.gz")
] + [("schedule", ".json.gz")]


@pytest.mark.parametrize(("variant", "suffix"), TORCH_CASES)
@pytest.mark.parametrize(
    ("cli_args", "table_kwargs", "group"),
    [
        ((), {"sort_by": "cpu_time_total"}, False),
        (("--sort-by", "none", "--row-limit", "-1"), {"sort_by": None, "row_limit": -1}, False),
        (
            ("--sort-by", "self_cpu_time_total", "--group-by-input-shape"),
            {"sort_by": "self_cpu_time_total"},
            True,
        ),
        (
            ("--top-level-only", "--time-unit", "ms"),
            {"sort_by": "cpu_time_total", "top_level_events_only": True, "time_unit": "ms"},
            False,
        ),
    ],
    ids=["default", "unsorted-all", "grouped", "top-level-ms"],
)
def test_report_of_torchs_trace_prints_torchs_table(
    torch_runs, report, variant, suffix, cli_args, table_kwargs, group
):
    run = torch_runs[variant]
    result = report(run["paths"][suffix], *cli_args)
    assert result.code == 0, result.err
    assert result.err == ""
    expected = run["prof"].key_averages(group_by_input_shape=group).table(**table_kwargs)
    assert result.out == expected


@pytest.mark.parametrize("variant", ["plain", "shapes_memory", "schedule"])
def test_names_counts_times_and_memory_match_torchs_key_averages(torch_runs, variant):
    """Field by field, so a mismatch names the op and the field."""
    run = torch_runs[variant]
    path = next(iter(run["paths"].values()))
    group = variant != "plain"
    ours = load_report_results(str(path)).key_averages(group_by_input_shape=group)
    theirs = run["prof"].key_averages(group_by_input_shape=group)

    def by_key(averages: Any) -> dict[tuple[str, str], Any]:
        return {(avg.key, str(avg.input_shapes)): avg for avg in averages}

    ours_by_key, theirs_by_key = by_key(ours), by_key(theirs)
    assert list(ours_by_key) == list(theirs_by_key)  # same keys, same first-seen order
    for key, theirs_avg in theirs_by_key.items():
        ours_avg = ours_by_key[key]
        assert ours_avg.count == theirs_avg.count, key
        # ts/dur carry nanoseconds: times agree to the float, within the trace's 1 ns rounding at worst.
        for field in ("cpu_time_total", "self_cpu_time_total"):
            assert getattr(ours_avg, field) == pytest.approx(getattr(theirs_avg, field), abs=1e-3), (
                key,
                field,
            )
        for field in ("cpu_memory_usage", "self_cpu_memory_usage"):
            assert getattr(ours_avg, field) == getattr(theirs_avg, field), (key, field)
    names = {key for key, _ in ours_by_key}
    assert {"forward", "backward", "aten::addmm"} <= names
    assert any(name.startswith("autograd::engine::evaluate_function: ") for name in names)
    if variant == "schedule":
        assert "ProfilerStep*" in names
    if variant == "shapes_memory":
        assert any(avg.cpu_memory_usage != 0 for avg in ours)


def test_flops_are_not_in_traces_and_the_report_says_so(torch_runs, report):
    run = torch_runs["flops"]
    result = report(run["paths"][".json"], "--sort-by", "none", "--row-limit", "-1")
    assert result.code == 0
    assert "FLOPs" not in result.out
    assert "FLOPs" in run["prof"].key_averages().table()  # torch had them from the live profile
    assert result.err.count("\n") == 1 and result.err.startswith("polyprof report: note: ")
    assert "with_flops" in result.err
    # Names and counts still agree with torch's key_averages, row for row (long names are cut).
    rows, theirs = data_rows(result.out), list(run["prof"].key_averages())
    assert [int(row[-1]) for row in rows] == [avg.count for avg in theirs]
    assert all(avg.key.startswith(row[0].removesuffix("...")) for row, avg in zip(rows, theirs, strict=True))


# ------------------------------------------------------------- polyprof's traces


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
@pytest.mark.parametrize("group", [False, True])
def test_report_of_polyprofs_trace_prints_polyprofs_table(polyprof_run, report, suffix, group):
    args = ["--sort-by", "cpu_time_total"] + (["--group-by-input-shape"] if group else [])
    result = report(polyprof_run["paths"][suffix], *args)
    assert result.code == 0, result.err
    expected = polyprof_run["prof"].key_averages(group_by_input_shape=group).table(sort_by="cpu_time_total")
    assert result.out == expected
    assert ("Input Shapes" in header_cells(result.out)) is group
    assert {"CPU Mem", "Self CPU Mem"} <= set(header_cells(result.out))


def test_polyprof_and_torch_traces_of_one_kind_give_the_same_table_layout(polyprof_run, torch_runs, report):
    ours = report(polyprof_run["paths"][".json.gz"])
    theirs = report(torch_runs["shapes_memory"]["paths"][".json.gz"])
    assert header_cells(ours.out) == header_cells(theirs.out)


# ------------------------------------------------------------------- options


@pytest.fixture(scope="module")
def plain_results(torch_runs):
    return load_report_results(str(torch_runs["plain"]["paths"][".json"]))


def test_default_sort_is_cpu_time_total_without_device_time(torch_runs, report, plain_results):
    path = torch_runs["plain"]["paths"][".json"]
    assert report(path).out == report(path, "--sort-by", "cpu_time_total").out
    assert default_sort_key(plain_results.key_averages()) == "cpu_time_total"
    totals = [time_us(row[4]) for row in data_rows(report(path).out)]
    assert totals == sorted(totals, reverse=True)


def test_group_by_input_shape_adds_the_input_shapes_column(torch_runs, report):
    path = torch_runs["shapes_memory"]["paths"][".json"]
    plain, grouped = report(path), report(path, "--group-by-input-shape", "--row-limit", "-1")
    assert "Input Shapes" not in header_cells(plain.out)
    assert header_cells(grouped.out)[-1] == "Input Shapes"
    shapes = {row[-1] for row in data_rows(grouped.out)}
    # The two Linear layers' addmm calls (bias, input, weight.t(), beta, alpha), torch's shapes text.
    assert {"[[16], [8, 32], [32, 16], [], []]", "[[4], [8, 16], [16, 4], [], []]"} <= shapes, shapes
    # Grouping splits names into (name, shapes) rows.
    assert len(data_rows(grouped.out)) > len(data_rows(report(path, "--row-limit", "-1").out))


@settings(
    max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sort_key=st.sampled_from(["count", "cpu_time_total", "self_cpu_time_total", "cpu_time"]),
    row_limit=st.integers(min_value=-1, max_value=40),
    time_unit=st.sampled_from([None, "s", "ms", "us"]),
)
def test_rows_are_limited_and_sorted_descending(plain_results, sort_key, row_limit, time_unit):
    """torch's meaning of sort_by/row_limit/time_unit, read back from the printed table."""
    options = ReportOptions(sort_by=sort_key, row_limit=row_limit, time_unit=time_unit)
    table = render_report(plain_results, options)
    n_keys = len(plain_results.key_averages())
    rows = data_rows(table)
    if row_limit == 0:  # torch prints the frame without rows
        assert "\n\n" not in table and table.count("\n") == 5
    assert len(rows) == (n_keys if row_limit == -1 else min(row_limit, n_keys))
    column = {"count": -1, "cpu_time_total": 4, "self_cpu_time_total": 2, "cpu_time": 5}[sort_key]
    values = [float(row[column]) if sort_key == "count" else time_us(row[column]) for row in rows]
    assert values == sorted(values, reverse=True)
    if time_unit is not None:
        time_cells = [cell for row in rows for cell in row[1:6] if not cell.endswith("%")]
        time_cells.append(table.splitlines()[-1].rsplit(" ", 1)[1])  # the "Self CPU time total" footer
        assert {_TIME_CELL.match(cell).group(2) for cell in time_cells} == {time_unit}, time_cells


def test_top_level_only_keeps_ops_without_a_parent(torch_runs, report):
    result = report(torch_runs["plain"]["paths"][".json"], "--top-level-only", "--row-limit", "-1")
    assert "This report only display top-level ops statistics" in result.out
    names = {row[0] for row in data_rows(result.out)}
    assert {"forward", "backward"} <= names
    assert not names & {"aten::addmm", "aten::linear", "aten::relu"}


def test_report_options_are_validated():
    with pytest.raises(ValueError, match=r"unknown sort key 'wall_time'.*cpu_time_total"):
        ReportOptions(sort_by="wall_time")
    with pytest.raises(ValueError, match="row_limit"):
        ReportOptions(row_limit=-2)
    with pytest.raises(ValueError, match="time_unit"):
        ReportOptions(time_unit="ns")
    assert set(VALID_SORT_KEYS) < set(SORT_CHOICES)


# ------------------------------------------------------------ device traces


def _complete(cat: str, name: str, lane: tuple[int, int], ts: float, dur: float, **args: Any) -> dict:
    """A complete ("X") event on lane (pid, tid); ``args`` keys use "_" for spaces."""
    pid, tid = lane
    return {
        "ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
        "args": {key.replace("_", " "): value for key, value in args.items()},
    }  # fmt: skip


def device_trace(path: Path, device: str) -> Path:
    """A Kineto-shaped trace of two ops launching one kernel each on ``device`` ("cuda" or "xpu")."""
    lane = {"cuda": "CUDA", "xpu": "XPU"}[device]
    host, stream = (100, 100), (1, 7)
    runtime = f"{device}_runtime"
    events = [
        {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": f"{lane} 1"}},
        _complete("cpu_op", "aten::mm", host, 10.0, 50.0, External_id=1),
        _complete("cpu_op", "aten::add", host, 70.0, 20.0, External_id=2),
        _complete(runtime, "LaunchKernel", host, 20.0, 5.0, External_id=1, correlation=11),
        _complete(runtime, "LaunchKernel", host, 75.0, 5.0, External_id=2, correlation=12),
        _complete(
            "kernel", "gemm_kernel", stream, 30.0, 400.0, External_id=1, correlation=11, device=1, stream=7
        ),
        _complete(
            "kernel", "add_kernel", stream, 440.0, 3.5, External_id=2, correlation=12, device=1, stream=7
        ),
    ]
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE_NS, "traceEvents": events}))
    return path


@pytest.mark.parametrize("device", ["cuda", "xpu"])
def test_device_traces_get_device_columns_and_sort_by_device_time(tmp_path, report, device):
    path = device_trace(tmp_path / f"{device}.json", device)
    result = report(path)
    assert result.code == 0, result.err
    dev = device.upper()
    assert {f"Self {dev}", f"Self {dev} %", f"{dev} total", f"{dev} time avg"} <= set(
        header_cells(result.out)
    )
    assert f"Self {dev} time total: " in result.out
    assert result.out == report(path, "--sort-by", "device_time_total").out
    assert result.out == report(path, "--sort-by", f"{device}_time_total").out
    rows = {row[0]: row for row in data_rows(result.out)}
    assert rows["gemm_kernel"][6] == "400.000us" and rows["add_kernel"][6] == "3.500us"
    assert data_rows(result.out)[0][0] == "aten::mm"  # the op whose kernel ran longest


def test_runtime_calls_count_as_cpu_time_of_the_launching_op(tmp_path, report):
    rows = {row[0]: row for row in data_rows(report(device_trace(tmp_path / "c.json", "cuda")).out)}
    assert rows["LaunchKernel"][2] == "10.000us" and rows["LaunchKernel"][6] == "0.000us"
    assert rows["aten::mm"][2] == "45.000us"  # self CPU: 50 us minus the 5 us launch
    assert rows["aten::mm"][8] == "400.000us"  # CUDA total: its kernel only


def test_unknown_categories_are_noted_on_stderr(tmp_path, report):
    doc = json.loads(device_trace(tmp_path / "d.json", "cuda").read_text())
    doc["traceEvents"].append(
        {"ph": "X", "cat": "my_tool", "name": "x", "pid": 100, "tid": 100, "ts": 1, "dur": 1}
    )
    path = tmp_path / "extra.json"
    path.write_text(json.dumps(doc))
    result = report(path)
    assert result.code == 0
    assert result.err.startswith("polyprof report: note: ") and "1 my_tool" in result.err


# -------------------------------------------------------------------- errors


def _truncated(source: Path, target: Path, *, mid_string: bool = False) -> Path:
    """The first half of ``source`` (gzip: of its compressed bytes), as a killed writer leaves it.

    JSON is cut after a complete event, or inside a string with ``mid_string``.
    """
    data = source.read_bytes()
    cut = len(data) // 2
    if source.suffix == ".json":
        cut = data.rindex(b'"name": "', 0, cut) + 11 if mid_string else data.rindex(b"},", 0, cut) + 2
    target.write_bytes(data[:cut])
    return target


ERROR_CASES: dict[str, tuple[Callable[[Path, dict[str, Any]], Path], str]] = {
    "truncated json": (
        lambda d, runs: _truncated(runs["plain"]["paths"][".json"], d / "cut.json"),
        "truncated JSON",
    ),
    "json cut inside a string": (
        lambda d, runs: _truncated(runs["plain"]["paths"][".json"], d / "cut2.json", mid_string=True),
        "JSON",
    ),
    "truncated gzip": (
        lambda d, runs: _truncated(runs["plain"]["paths"][".json.gz"], d / "cut.json.gz"),
        "truncated gzip",
    ),
    "gzip garbage": (
        lambda d, runs: _write(d / "garbage.json.gz", b"\x1f\x8b" + os.urandom(64)),
        "gzip",
    ),
    "json without traceEvents": (
        lambda d, runs: _write(d / "other.json", b'{"schemaVersion": 1, "events": []}'),
        'no "traceEvents"',
    ),
    "not json": (lambda d, runs: _write(d / "notes.json", b"these are my notes\n"), "invalid JSON"),
    "empty file": (lambda d, runs: _write(d / "empty.json", b""), "empty"),
    "no profiler events": (
        lambda d, runs: _write(d / "meta.json", b'{"traceEvents": [{"ph": "M", "name": "process_name"}]}'),
        "no profiler events",
    ),
    # a directory is a run of many ranks: tests/test_rank_report.py (an empty one is an error too)
    "missing file": (lambda d, runs: d / "never-written.json", "no such file"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_unusable_files_give_one_line_and_exit_2(tmp_path, torch_runs, report, case):
    make, problem = ERROR_CASES[case]
    path = make(tmp_path, torch_runs)
    result = report(path)
    assert result.code == EXIT_BAD_INPUT == 2
    assert result.out == ""
    assert result.err.count("\n") == 1, result.err
    assert result.err.startswith(f"{PREFIX}{path}: ")
    assert problem in result.err
    assert "Traceback" not in result.err


def test_unknown_sort_key_lists_the_valid_keys(torch_runs, report):
    result = report(torch_runs["plain"]["paths"][".json"], "--sort-by", "wall_time")
    assert result.code == 2 and result.out == ""
    assert "invalid choice: 'wall_time'" in result.err
    assert all(f"'{key}'" in result.err for key in VALID_SORT_KEYS)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("--row-limit", "-2"), "--row-limit: must be >= 0, or -1"),
        (("--row-limit", "ten"), "--row-limit: not a whole number"),
        (("--time-unit", "ns"), "--time-unit: invalid choice: 'ns'"),
    ],
)
def test_bad_options_exit_2(torch_runs, report, args, problem):
    result = report(torch_runs["plain"]["paths"][".json"], *args)
    assert result.code == 2 and result.out == ""
    assert problem in result.err


# ------------------------------------------------------------- without torch

_RUN_REPORT = """
import sys
{block}
from polyprof import cli
from polyprof.cli.cli_report import add_report_command
if add_report_command not in cli.SUBCOMMANDS:
    cli.SUBCOMMANDS.append(add_report_command)
code = cli.main(["report", *sys.argv[1:]])
{after}
raise SystemExit(code)
"""
_BLOCK_TORCH = """
sys.modules["torch"] = None  # import torch now raises ImportError, as on a machine without it
try:
    import torch
except ImportError:
    pass
else:
    raise AssertionError("torch is still importable")
"""


def _run_subprocess(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize("source", ["torch", "polyprof"])
def test_report_works_without_torch(torch_runs, polyprof_run, report, source):
    path = (torch_runs["shapes_memory"] if source == "torch" else polyprof_run)["paths"][".json.gz"]
    code = _RUN_REPORT.format(block=_BLOCK_TORCH, after="")
    done = _run_subprocess(code, str(path), "--group-by-input-shape")
    assert done.returncode == 0, done.stderr
    assert done.stdout == report(path, "--group-by-input-shape").out
    broken = _run_subprocess(code, str(path) + ".missing")
    assert broken.returncode == 2
    assert broken.stderr == f"{PREFIX}{path}.missing: no such file\n"


def test_report_does_not_import_torch_even_when_installed(torch_runs):
    pytest.importorskip("torch")
    after = 'assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))[:3]'
    done = _run_subprocess(
        _RUN_REPORT.format(block="", after=after), str(torch_runs["plain"]["paths"][".json"])
    )
    assert done.returncode == 0, done.stderr


def test_help_names_the_sort_keys(report):
    result = report("--help")
    assert result.code == 0
    assert "--group-by-input-shape" in result.out and "--top-level-only" in result.out
    assert all(key in " ".join(result.out.split()) for key in VALID_SORT_KEYS)


@pytest.mark.parametrize("source", ["torch", "polyprof"])
def test_gzip_and_plain_files_give_the_same_report(torch_runs, polyprof_run, report, source):
    paths = (torch_runs["shapes_memory"] if source == "torch" else polyprof_run)["paths"]
    assert paths[".json.gz"].read_bytes()[:2] == b"\x1f\x8b"
    assert report(paths[".json"]).out == report(paths[".json.gz"]).out
