"""The documented examples in ``docs/examples/{ipex_legacy,kineto,torch_profiler}``, run for real.

Each example runs through ``python -m polyprof run`` in a subprocess of its own, in a
directory of its own (also its ``TMPDIR``). All of them start at once from one module
fixture, since importing torch dominates each run; each test then reads its own run and
checks what the migration guides and the examples' headers say they print and write, and
that the profiler was polyprof's. Where torch can profile the same ops, it is the oracle
for the names and counts in the table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import attrs
import pytest

torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
EXAMPLE_DIRS = ("ipex_legacy", "kineto", "torch_profiler")
RUN_TIMEOUT_S = 300

#: Run id -> (example path under docs/examples, arguments for the script).
RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "legacy_use_tool": ("ipex_legacy/use_tool.py", ()),
    "legacy_disabled": ("ipex_legacy/disabled.py", ()),
    "legacy_sort_by_id": ("ipex_legacy/sort_by_id.py", ()),
    "legacy_chrome_trace": ("ipex_legacy/chrome_trace.py", ()),
    "legacy_xpu_without_plugin": ("ipex_legacy/xpu_without_plugin.py", ()),
    "kineto_use_tool": ("kineto/use_tool.py", ()),
    "kineto_schedule": ("kineto/schedule_trace_handler.py", ()),
    "kineto_switch_on": ("kineto/contextlib_switch.py", ("--profile",)),
    "kineto_switch_off": ("kineto/contextlib_switch.py", ()),
    "kineto_multi_device": ("kineto/multi_device.py", ()),
    "kineto_xpu_without_plugin": ("kineto/xpu_without_plugin.py", ()),
    "torch_demo_start_stop": ("torch_profiler/demo_start_stop.py", ()),
    "torch_with_record_function": ("torch_profiler/with_record_function.py", ()),
    "torch_schedule_steps": ("torch_profiler/schedule_steps.py", ()),
}

#: torch's table header without device or memory columns.
CPU_COLUMNS = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls"]
#: The ops of the IPEX guides' sample (``torch.nonzero`` and ``torch.unique`` of 1024 floats).
GUIDE_OPS = ("aten::nonzero", "aten::_unique2")
XPU_DEVICE = re.compile(r"""device\(\s*["']xpu|device\s*=\s*["']xpu|torch\.xpu\.""")
PROFILED_BY = re.compile(r"profiled by (polyprof\.[\w.]+)")


@attrs.frozen
class Run:
    """One finished example run."""

    returncode: int
    stdout: str
    stderr: str
    workdir: Path


@attrs.frozen
class Table:
    """A torch-format table parsed from text: its header cells and its rows' cells."""

    columns: list[str]
    rows: list[list[str]]
    footer: str

    @property
    def names(self) -> list[str]:
        return [row[0] for row in self.rows]

    def counts(self) -> dict[str, int]:
        """Name -> ``# of Calls`` summed over the rows with that name."""
        index = self.columns.index("# of Calls")
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row[0]] = counts.get(row[0], 0) + int(row[index])
        return counts


def _cells(line: str) -> list[str]:
    return [cell for cell in re.split(r"\s{2,}", line.strip()) if cell]


def parse_tables(text: str) -> list[Table]:
    """Every table in ``text``: a dashed rule, a header, a rule, rows, a rule, a footer line."""
    lines = text.splitlines()
    tables = []
    i = 0
    while i + 2 < len(lines):
        if lines[i].startswith("---") and lines[i + 2].startswith("---") and lines[i + 1].strip():
            columns = _cells(lines[i + 1])
            j = i + 3
            rows = []
            while j < len(lines) and not lines[j].startswith("---"):
                rows.append(_cells(lines[j]))
                j += 1
            footer = lines[j + 1] if j + 1 < len(lines) else ""
            tables.append(Table(columns, rows, footer))
            i = j + 1
        else:
            i += 1
    return tables


def only_table(text: str) -> Table:
    tables = parse_tables(text)
    assert len(tables) == 1, f"expected one table, found {len(tables)} in:\n{text}"
    return tables[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Start every example at once; wait for all of them."""
    started = {}
    for run_id, (script, args) in RUNS.items():
        workdir = tmp_path_factory.mktemp(run_id)
        process = subprocess.Popen(
            [sys.executable, "-m", "polyprof", "run", str(EXAMPLES / script), *args],
            cwd=workdir,
            env={**os.environ, "TMPDIR": str(workdir)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started[run_id] = (process, workdir)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    finished = {}
    for run_id, (process, workdir) in started.items():
        try:
            stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other, _ in started.values():
                other.kill()
            pytest.fail(f"example run {run_id} did not finish within {RUN_TIMEOUT_S} s")
        finished[run_id] = Run(process.returncode, stdout, stderr, workdir)
    return finished


def ok(runs: dict[str, Run], run_id: str) -> Run:
    run = runs[run_id]
    assert run.returncode == 0, (
        f"{run_id} exited {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    )
    return run


def profiled_by(run: Run) -> str:
    match = PROFILED_BY.search(run.stdout)
    assert match, f"no 'profiled by' line in:\n{run.stdout}"
    return match.group(1)


def torch_key_counts(*, legacy: bool) -> dict[str, int]:
    """torch's own names and counts for the IPEX guides' two ops (the oracle)."""
    profile = torch.autograd.profiler_legacy.profile if legacy else torch.profiler.profile
    if not profile.__module__.startswith("torch"):
        pytest.skip("torch's profiler is shimmed in this process")
    input_tensor = torch.randn(1024, dtype=torch.float32)
    with profile() as prof:
        torch.nonzero(input_tensor)
        torch.unique(input_tensor)
    return {row.key: row.count for row in prof.key_averages()}


def load_kineto_trace(path: Path) -> dict:
    assert path.is_file(), f"{path} was not written"
    trace = json.loads(path.read_text())
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    return trace


def op_names(trace: dict) -> list[str]:
    return [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]


# ------------------------------------------------------------------ the set of examples


def test_every_example_is_run() -> None:
    """A new example file must get a run (and checks) here."""
    on_disk = {
        f"{d}/{p.name}"
        for d in EXAMPLE_DIRS
        for p in (EXAMPLES / d).glob("*.py")
        if not p.name.startswith("_")
    }
    assert on_disk == {script for script, _ in RUNS.values()}


def test_examples_keep_torch_names() -> None:
    """The examples call torch's profiler names (the shims make them polyprof's), not polyprof's."""
    for directory in EXAMPLE_DIRS:
        for path in (EXAMPLES / directory).glob("*.py"):
            code = path.read_text().split('"""', 2)[-1]  # what follows the module docstring
            assert "intel_extension_for_pytorch" not in code, path
            assert "from polyprof import" not in code and "polyprof.profile(" not in code, path
            assert not XPU_DEVICE.search(code), f"{path}: the code still puts tensors on an XPU"


# ------------------------------------------------------------------ IPEX legacy profiler


@pytest.mark.slow
def test_legacy_use_tool_prints_the_averages_table(runs: dict[str, Run]) -> None:
    run = ok(runs, "legacy_use_tool")
    assert profiled_by(run) == "polyprof.shim.LegacyProfile"
    table = only_table(run.stdout)
    assert table.columns == CPU_COLUMNS
    assert table.footer.startswith("Self CPU time total: ")
    assert table.counts() == torch_key_counts(legacy=True)
    assert "the script started its own profiler (polyprof.shim.LegacyProfile)" in run.stderr


@pytest.mark.slow
def test_legacy_disabled_raises_a_clear_error(runs: dict[str, Run]) -> None:
    run = runs["legacy_disabled"]
    assert run.returncode == 1
    assert profiled_by(run) == "polyprof.shim.LegacyProfile"
    assert (
        "polyprof.base.errors.ProfilerDisabledError: key_averages(): "
        "the profiler was disabled (enabled=False)" in run.stderr
    )
    assert "ActivityUnavailableError" not in run.stderr  # use_xpu=True needs no plugin when disabled
    # The script's stdout has no table: the disabled profiler printed nothing. The script started
    # no profiler, so polyprof run profiled it as a whole (table and trace path on stderr).
    assert parse_tables(run.stdout) == []
    assert "polyprof run: profile of" in run.stderr
    assert list((run.workdir / "polyprof-out").glob("disabled.*.pt.trace.json"))


@pytest.mark.slow
def test_legacy_sort_by_id_lists_events_newest_first(runs: dict[str, Run]) -> None:
    run = ok(runs, "legacy_sort_by_id")
    assert profiled_by(run) == "polyprof.shim.LegacyProfile"
    table = only_table(run.stdout)
    assert table.columns == CPU_COLUMNS
    # Raw events, not averages: one row per call, so every count is 1 and the totals match torch's.
    assert all(row[-1] == "1" for row in table.rows)
    assert table.counts() == torch_key_counts(legacy=True)
    # Newest first: the first op called (nonzero) is the last row; unique's top op comes before it.
    names = table.names
    assert names[-1] == "aten::nonzero"
    assert names.index("aten::_unique2") < names.index("aten::nonzero")
    assert names.index("aten::sort") < names.index("aten::_unique2")


@pytest.mark.slow
def test_legacy_chrome_trace_is_a_json_array(runs: dict[str, Run]) -> None:
    run = ok(runs, "legacy_chrome_trace")
    assert profiled_by(run) == "polyprof.shim.LegacyProfile"
    trace = json.loads((run.workdir / "trace_file.json").read_text())
    assert isinstance(trace, list) and trace
    assert all(event["ph"] == "X" and {"name", "ts", "dur", "pid", "tid"} <= event.keys() for event in trace)
    names = [event["name"] for event in trace]
    assert set(GUIDE_OPS) <= set(names)
    assert {name: names.count(name) for name in names} == torch_key_counts(legacy=True)
    # torchinductor_<user> is torch's compile cache dir (in TMPDIR), made when the whole-script
    # profile imports Inductor's config at start, as torch.profiler's start does.
    stray = [
        p
        for p in run.workdir.iterdir()
        if p.name != "trace_file.json" and not p.name.startswith("torchinductor_")
    ]
    assert not stray, "stray files written"


def _xpu_plugin_installed() -> bool:
    try:
        metadata.distribution("polyprof-xpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def check_xpu_without_a_usable_plugin(run: Run) -> None:
    """No polyprof-xpu: the error names it. Installed, but torch here is not an XPU build (or sees no
    XPU device): a warning, CPU only."""
    if not _xpu_plugin_installed():
        assert run.stdout.strip() == (
            "ActivityUnavailableError: ProfilerActivity.XPU needs the polyprof-xpu plugin: "
            "pip install polyprof-xpu"
        )
        return
    assert "XPU profiling is not available here" in run.stderr
    assert "ActivityUnavailableError" not in run.stdout
    table = only_table(run.stdout)
    assert table.columns == CPU_COLUMNS
    assert set(GUIDE_OPS) <= {row[0] for row in table.rows}


@pytest.mark.slow
def test_legacy_use_xpu_without_plugin_names_polyprof_xpu(runs: dict[str, Run]) -> None:
    check_xpu_without_a_usable_plugin(ok(runs, "legacy_xpu_without_plugin"))


# ------------------------------------------------------------------ IPEX Kineto profiler


@pytest.mark.slow
def test_kineto_use_tool_prints_the_averages_table(runs: dict[str, Run]) -> None:
    run = ok(runs, "kineto_use_tool")
    assert profiled_by(run) == "polyprof.shim.TorchProfile"
    table = only_table(run.stdout)
    assert table.columns == CPU_COLUMNS
    assert table.footer.startswith("Self CPU time total: ")
    assert table.counts() == torch_key_counts(legacy=False)


@pytest.mark.slow
def test_kineto_schedule_calls_the_handler_per_cycle(runs: dict[str, Run]) -> None:
    run = ok(runs, "kineto_schedule")
    assert profiled_by(run) == "polyprof.shim.TorchProfile"
    tables = parse_tables(run.stdout)
    assert len(tables) == 2  # repeat=2: one table per recorded cycle
    for table in tables:
        assert table.columns == CPU_COLUMNS
        assert len(table.rows) == 10  # row_limit=10
        assert table.counts()["ProfilerStep*"] == 1  # active=1
    # skip_first=10, then (wait=1, warmup=3, active=1) twice: steps 14 and 19 are saved.
    written = sorted(p.name for p in run.workdir.glob("trace_*.json"))
    assert written == ["trace_15.json", "trace_20.json"]
    for step_num, recorded_step in ((15, 14), (20, 19)):
        trace = load_kineto_trace(run.workdir / f"trace_{step_num}.json")
        names = op_names(trace)
        assert names.count("aten::linear") == 2
        steps = [e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
        assert steps == [f"ProfilerStep#{recorded_step}"]


@pytest.mark.slow
def test_kineto_contextlib_switch_on_profiles(runs: dict[str, Run]) -> None:
    run = ok(runs, "kineto_switch_on")
    assert "profiling was on: profiled by polyprof.shim.TorchProfile" in run.stdout
    (table,) = parse_tables(run.stdout)
    assert table.counts()["ProfilerStep*"] == 2  # active=2
    assert sorted(p.name for p in run.workdir.glob("trace_*.json")) == ["trace_4.json"]
    load_kineto_trace(run.workdir / "trace_4.json")


@pytest.mark.slow
def test_kineto_contextlib_switch_off_runs_without_the_profiler(runs: dict[str, Run]) -> None:
    run = ok(runs, "kineto_switch_off")
    assert run.stdout.strip() == "profiling was off: the script ran under contextlib.nullcontext()"
    assert not list(run.workdir.glob("trace_*.json"))
    # No profiler of its own: polyprof run profiled the whole script (stderr, polyprof-out/).
    (whole,) = parse_tables(run.stderr)
    assert whole.counts()["aten::linear"] == 16  # 8 iterations, 2 linear layers
    (trace_path,) = (run.workdir / "polyprof-out").glob("contextlib_switch.*.pt.trace.json")
    assert op_names(load_kineto_trace(trace_path)).count("aten::linear") == 16


@pytest.mark.slow
def test_kineto_multi_device_writes_a_kineto_trace(runs: dict[str, Run]) -> None:
    run = ok(runs, "kineto_multi_device")
    assert profiled_by(run) == "polyprof.shim.TorchProfile"
    trace = load_kineto_trace(run.workdir / "trace_example_on_multi_device.json")
    assert op_names(trace).count("aten::add") == 2


@pytest.mark.slow
def test_kineto_xpu_without_plugin_names_polyprof_xpu(runs: dict[str, Run]) -> None:
    check_xpu_without_a_usable_plugin(ok(runs, "kineto_xpu_without_plugin"))


# ------------------------------------------------------------------ PyTorch profiler notes


@pytest.mark.slow
def test_torch_demo_start_stop(runs: dict[str, Run]) -> None:
    run = ok(runs, "torch_demo_start_stop")
    assert profiled_by(run) == "polyprof.shim.TorchProfile"
    table = only_table(run.stdout)
    assert table.columns == CPU_COLUMNS
    assert len(table.rows) == 10
    assert {"aten::conv2d", "aten::batch_norm"} <= set(table.names)
    totals = [_microseconds(row[CPU_COLUMNS.index("CPU total")]) for row in table.rows]
    assert totals == sorted(totals, reverse=True)  # sort_by="cpu_time_total"
    trace = load_kineto_trace(run.workdir / "trace.json")
    # record_shapes=True: ops carry their input shapes.
    convs = [e for e in trace["traceEvents"] if e.get("name") == "aten::conv2d"]
    assert convs and convs[0]["args"]["Input Dims"][0] == [5, 3, 224, 224]


@pytest.mark.slow
def test_torch_with_record_function(runs: dict[str, Run]) -> None:
    run = ok(runs, "torch_with_record_function")
    assert profiled_by(run) == "polyprof.shim.TorchProfile"
    table = only_table(run.stdout)
    assert table.columns == CPU_COLUMNS
    first = table.rows[0]
    assert first[0] == "model_inference"
    assert first[CPU_COLUMNS.index("CPU total %")] == "100.00%"
    assert first[-1] == "1"


@pytest.mark.slow
def test_torch_schedule_steps(runs: dict[str, Run]) -> None:
    run = ok(runs, "torch_schedule_steps")
    assert profiled_by(run) == "polyprof.shim.TorchProfile"
    actions = re.findall(r"^step (\d): (\w+)$", run.stdout, re.MULTILINE)
    assert [a for _, a in actions] == ["NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"] * 2
    assert "on_trace_ready at step_num=4: recorded ProfilerStep#2, ProfilerStep#3" in run.stdout
    assert "on_trace_ready at step_num=8: recorded ProfilerStep#6, ProfilerStep#7" in run.stdout
    tables = parse_tables(run.stdout)
    assert len(tables) == 2
    for table in tables:
        assert table.counts()["ProfilerStep*"] == 2
        assert table.counts()["forward"] == 2


def _microseconds(cell: str) -> float:
    for unit, scale in (("us", 1.0), ("ms", 1e3), ("s", 1e6)):
        if cell.endswith(unit):
            return float(cell[: -len(unit)]) * scale
    raise AssertionError(f"not a time: {cell!r}")
