"""Hugging Face Accelerate as a real client of polyprof.

``Accelerator.profile()`` builds ``torch.profiler.profile(...)`` itself, looking
the class up when it profiles; with polyprof's shims installed that is
polyprof's profiler. The Accelerate profiler guide's samples live in
``docs/examples/accelerate/`` (on the CPU, with a ``torch.nn`` ResNet-18); each
is run three ways: through ``python -m polyprof run``, in-process under
``polyprof.shim.shimmed()``, and in-process without the shims (torch's own
profiler, the oracle whose tables polyprof's must match in everything but the times).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from accelerate import Accelerator, ProfileKwargs  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402

from polyprof import shim  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples" / "accelerate"
SCRIPTS = ("execution_time", "memory_consumption", "chrome_trace", "long_running", "flops")
#: Scripts whose stdout is tables, compared with what torch's profiler prints for the same script.
TABLE_SCRIPTS = ("execution_time", "memory_consumption", "long_running", "flops")
#: Small images keep a ResNet-18 forward pass at a few ms (the guide uses 224).
IMAGE_SIZE = "32"
MULTI_CYCLE_WARNING = "Profiler clears events at the end of each cycle"


# --------------------------------------------------------------------------- table parsing


@attrs.frozen
class Table:
    """One table as printed by ``key_averages().table()``: column names and cell texts."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def column(self, name: str) -> list[str]:
        index = self.header.index(name)
        return [row[index] for row in self.rows]


def _column_spans(rule: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"-+", rule)]


def _cut(line: str, spans: list[tuple[int, int]]) -> tuple[str, ...]:
    return tuple(line[a:b].strip() for a, b in spans)


def parse_tables(text: str) -> list[Table]:
    """Every table in ``text``, cut into cells by the spans of its dashed rule lines."""
    lines = text.splitlines()
    tables = []
    i = 0
    is_rule = re.compile(r"^-+(  -+)*\s*$").match
    while i + 2 < len(lines):
        if is_rule(lines[i]) and is_rule(lines[i + 2]):
            spans = _column_spans(lines[i])
            header = _cut(lines[i + 1], spans)
            j = i + 3
            rows = []
            while j < len(lines) and not is_rule(lines[j]):
                rows.append(_cut(lines[j], spans))
                j += 1
            tables.append(Table(header, tuple(rows)))
            i = j + 1
        else:
            i += 1
    return tables


def without_times(table: Table) -> Table:
    """The table less its time columns (which differ from run to run)."""
    keep = [i for i, name in enumerate(table.header) if "CPU" not in name or "Mem" in name]
    return Table(
        tuple(table.header[i] for i in keep), tuple(tuple(row[i] for i in keep) for row in table.rows)
    )


def calls_by_row_key(table: Table) -> dict[tuple[str, str], str]:
    """``# of Calls`` per row, keyed by name and (when grouped by them) input shapes."""
    shapes = table.column("Input Shapes") if "Input Shapes" in table.header else [""] * len(table.rows)
    return dict(zip(zip(table.column("Name"), shapes, strict=True), table.column("# of Calls"), strict=True))


# --------------------------------------------------------------------------- the three ways to run a sample


@attrs.frozen
class Run:
    """What one run of a sample printed and wrote."""

    returncode: int
    stdout: str
    stderr: str
    out_dir: Path

    def check(self) -> Run:
        assert self.returncode == 0, f"exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return self


def _sample_args(out_dir: Path) -> list[str]:
    return ["--image-size", IMAGE_SIZE, "--out", str(out_dir)]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: the tests share a small machine, where spinning OpenMP threads cost seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def polyprof_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every sample run by ``python -m polyprof run``, all started at once (importing torch dominates)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env["OMP_NUM_THREADS"] = "1"
    jobs = {}
    for script in SCRIPTS:
        out_dir = tmp_path_factory.mktemp(f"polyprof-{script}")
        command = [
            sys.executable,
            "-m",
            "polyprof",
            "run",
            str(EXAMPLES / f"{script}.py"),
            *_sample_args(out_dir),
        ]
        process = subprocess.Popen(
            command, cwd=out_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        jobs[script] = (process, out_dir)
    runs = {}
    for script, (process, out_dir) in jobs.items():
        stdout, stderr = process.communicate(timeout=300)
        runs[script] = Run(process.returncode, stdout, stderr, out_dir)
    return runs


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> dict[str, Run]:
    """The table samples run in-process without the shims: torch's own profiler, the oracle."""
    runs = {}
    for script in TABLE_SCRIPTS:
        AcceleratorState._reset_state(reset_partial_state=True)
        with pytest.MonkeyPatch.context() as monkeypatch, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run, namespace = run_in_process(
                script, tmp_path_factory.mktemp(f"torch-{script}"), monkeypatch, False
            )
        assert type(namespace["prof"]) is torch.profiler.profile
        runs[script] = attrs.evolve(run, stderr="\n".join(str(w.message) for w in caught))
    AcceleratorState._reset_state(reset_partial_state=True)
    return runs


@pytest.fixture
def fresh_accelerate_state() -> Iterator[None]:
    """Each in-process Accelerator starts from a clean (process-wide, singleton) state."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def run_in_process(
    script: str, out_dir: Path, monkeypatch: pytest.MonkeyPatch, shimmed: bool = True
) -> tuple[Run, dict]:
    """Run a sample as ``__main__`` in this process (with the shims installed); also return its globals."""
    path = EXAMPLES / f"{script}.py"
    monkeypatch.setattr(sys, "argv", [str(path), *_sample_args(out_dir)])
    monkeypatch.syspath_prepend(str(EXAMPLES))
    stdout = io.StringIO()
    with shim.shimmed() if shimmed else contextlib.nullcontext(), contextlib.redirect_stdout(stdout):
        namespace = runpy.run_path(str(path), run_name="__main__")
    assert not shim.installed()
    return Run(0, stdout.getvalue(), "", out_dir), namespace


# ---------------------------------------------------------------- what each sample must print and write


#: Column names the guide shows (or torch prints for the guide's call), per sample.
GUIDE_COLUMNS = {
    "execution_time": ["Name", "Self CPU", "CPU total", "CPU time avg", "# of Calls"],
    "memory_consumption": ["Name", "CPU Mem", "Self CPU Mem", "# of Calls"],
    "long_running": ["Name", "Self CPU", "# of Calls"],
    "flops": ["Name", "Self CPU", "# of Calls"],
}
#: How many tables each sample prints.
TABLE_COUNT = {"execution_time": 2, "memory_consumption": 1, "long_running": 2, "flops": 1, "chrome_trace": 0}


def check_sample_output(script: str, run: Run) -> None:
    """What the guide says the sample prints and writes, whoever recorded it."""
    tables = parse_tables(run.stdout)
    assert len(tables) == TABLE_COUNT[script], run.stdout
    for table in tables:
        for column in GUIDE_COLUMNS.get(script, []):
            assert column in table.header, (column, table.header)
        assert len(table.rows) == 10, table  # row_limit=10
    if script == "execution_time":
        assert "Input Shapes" not in tables[0].header
        shapes = tables[1].column("Input Shapes")
        assert all(re.fullmatch(r"\[(\[[\d, ]*\](, )?)*\]", s) for s in shapes), shapes
        names = tables[1].column("Name")
        assert len(set(names)) < len(names)  # one operator, several rows: one per input shapes
        assert "Self CPU time total:" in run.stdout
    elif script == "memory_consumption":
        table = tables[0]
        assert table.column("Name")[0] == "aten::empty"  # the guide's top row
        assert table.rows[0][table.header.index("Self CPU Mem")].endswith("MB")
    elif script == "flops":
        (flops_column,) = [name for name in tables[0].header if re.fullmatch(r"Total [KMGTP]?FLOPs", name)]
        by_name = dict(zip(tables[0].column("Name"), tables[0].column(flops_column), strict=True))
        # The guide's 18135613440 conv2d FLOPs at 224x224, scaled by (32/224)^2; addmm does not scale.
        assert float(by_name["aten::conv2d"]) == pytest.approx(18135.613 * (32 / 224) ** 2, abs=5e-4)
        assert by_name["aten::addmm"] == "5.120"
    elif script == "long_running":
        assert sorted(p.name for p in run.out_dir.glob("trace_*.json")) == ["trace_19.json", "trace_28.json"]
        for table in tables:
            calls = dict(zip(table.column("Name"), table.column("# of Calls"), strict=True))
            assert calls.get("ProfilerStep*") == "3"  # active=3 steps per cycle
        for path in run.out_dir.glob("trace_*.json"):
            check_kineto_trace(path)
    elif script == "chrome_trace":
        trace = check_kineto_trace(run.out_dir / "profile_0.json")
        conv_calls = Counter(e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op")
        assert conv_calls["aten::conv2d"] == 20  # ResNet-18 has 20 convolutions
        assert f"trace: {run.out_dir / 'profile_0.json'}" in run.stdout


def check_kineto_trace(path: Path) -> dict:
    """``path`` is a complete Kineto-shaped Chrome trace; returns it."""
    trace = json.loads(path.read_text())
    for key in ("schemaVersion", "deviceProperties", "traceEvents", "displayTimeUnit", "baseTimeNanoseconds"):
        assert key in trace, (key, sorted(trace))
    events = trace["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert ops, "no cpu_op events"
    for event in ops[:50]:
        assert {"name", "pid", "tid", "ts", "dur", "args"} <= event.keys(), event
    assert {e["ph"] for e in events} <= {"X", "M", "i", "s", "f", "C", "b", "e"}
    return trace


# --------------------------------------------------------------------------- the samples


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_sample_through_polyprof_run(script: str, polyprof_runs: dict[str, Run]) -> None:
    run = polyprof_runs[script].check()
    check_sample_output(script, run)
    # polyprof run's own note: the script's profiler was polyprof's (and its whole-script profile stood
    # aside).
    assert "polyprof.shim.TorchProfile" in run.stderr, run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_sample_in_process_with_shims(
    script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_accelerate_state: None
) -> None:
    if script == "long_running":
        with pytest.warns(
            UserWarning, match=MULTI_CYCLE_WARNING
        ):  # as torch warns: 2 cycles, acc_events=False
            run, namespace = run_in_process(script, tmp_path, monkeypatch)
    else:
        run, namespace = run_in_process(script, tmp_path, monkeypatch)
    assert type(namespace["prof"]).__module__.startswith("polyprof")
    check_sample_output(script, run)


@pytest.mark.slow
@pytest.mark.parametrize("script", TABLE_SCRIPTS)
def test_sample_tables_match_torch(
    script: str, polyprof_runs: dict[str, Run], torch_runs: dict[str, Run]
) -> None:
    """polyprof's tables have torch's columns, and the same cells wherever they do not measure time."""
    ours = parse_tables(polyprof_runs[script].check().stdout)
    theirs = parse_tables(torch_runs[script].stdout)
    check_sample_output(script, torch_runs[script])  # the oracle says what the guide says, too
    assert [t.header for t in ours] == [t.header for t in theirs]
    if script in ("memory_consumption", "flops"):
        # Sorted by a measure that is not time: the whole table (less the time columns) is torch's.
        assert [without_times(t) for t in ours] == [without_times(t) for t in theirs]
    else:
        # Sorted by time: the rows differ; each operator's call count does not.
        for mine, torchs in zip(ours, theirs, strict=True):
            mine_calls, torch_calls = calls_by_row_key(mine), calls_by_row_key(torchs)
            common = mine_calls.keys() & torch_calls.keys()
            assert common
            assert {k: mine_calls[k] for k in common} == {k: torch_calls[k] for k in common}
    if script == "long_running":
        assert MULTI_CYCLE_WARNING in torch_runs[script].stderr
        assert MULTI_CYCLE_WARNING in polyprof_runs[script].stderr


# --------------------------------------------------------------------------- ProfileKwargs, option by option


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def profile_tiny_net(kwargs: ProfileKwargs, steps: int = 1) -> object:
    accelerator = Accelerator(cpu=True, kwargs_handlers=[kwargs])
    model = accelerator.prepare(TinyNet())
    inputs = torch.randn(2, 3, 8, 8)
    with accelerator.profile() as prof:
        for _ in range(steps):
            model(inputs)
            if kwargs.schedule_option is not None:
                prof.step()
    return prof


OPTIONS = {
    "record_shapes": {"activities": ["cpu"], "record_shapes": True},
    "profile_memory": {"activities": ["cpu"], "profile_memory": True},
    "with_flops": {"activities": ["cpu"], "with_flops": True},
    "with_stack_and_modules": {"activities": ["cpu"], "with_stack": True, "with_modules": True},
    "no_activities": {},
}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=list(OPTIONS))
def test_profile_kwargs_reach_polyprof(options: dict, fresh_accelerate_state: None) -> None:
    with shim.shimmed():
        prof = profile_tiny_net(ProfileKwargs(**options))
    assert type(prof).__module__.startswith("polyprof")
    config = prof.config
    for flag in ("record_shapes", "profile_memory", "with_flops", "with_stack", "with_modules"):
        assert getattr(config, flag) is options.get(flag, False), flag
    assert {activity.name for activity in config.activities} == {"CPU"}
    names = prof.key_averages().table(row_limit=-1)
    assert "aten::conv2d" in names and "aten::addmm" in names


def test_without_shims_accelerate_gets_torch(fresh_accelerate_state: None) -> None:
    """The check above is not vacuous: without the shims, accelerate builds torch's profiler."""
    prof = profile_tiny_net(ProfileKwargs(activities=["cpu"]))
    assert type(prof) is torch.profiler.profile


def test_output_trace_dir_writes_profile_0(tmp_path: Path, fresh_accelerate_state: None) -> None:
    out = tmp_path / "nested" / "trace"
    with shim.shimmed():
        profile_tiny_net(ProfileKwargs(activities=["cpu"], output_trace_dir=str(out)))
    assert sorted(os.listdir(out)) == ["profile_0.json"]
    trace = check_kineto_trace(out / "profile_0.json")
    assert {"aten::conv2d", "aten::addmm"} <= {e["name"] for e in trace["traceEvents"]}


def _handler_steps(
    shimmed: bool, schedule_option: dict, steps: int, out: Path
) -> tuple[list[int], list[str]]:
    """Step numbers at which ``on_trace_ready`` ran, and the ProfilerStep names in accelerate's exit export.

    The export is only asked for when the schedule records something (see
    ``test_exporting_an_empty_schedule_fails``).
    """
    calls: list[int] = []
    records = (
        steps > schedule_option.get("skip_first", 0) + schedule_option["wait"] + schedule_option["warmup"]
    )
    kwargs = ProfileKwargs(
        activities=["cpu"],
        schedule_option=schedule_option,
        on_trace_ready=lambda p: calls.append(p.step_num),
        output_trace_dir=str(out) if records else None,
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    with shim.shimmed() if shimmed else contextlib.nullcontext():
        prof = profile_tiny_net(kwargs, steps=steps)
    assert type(prof).__module__.startswith("polyprof") == shimmed
    if not records:
        return calls, []
    events = json.loads((out / "profile_0.json").read_text())["traceEvents"]
    return calls, sorted(
        e["name"] for e in events if e["name"].startswith("ProfilerStep#") and e.get("ph") == "X"
    )


SCHEDULES = {
    # The guide's schedule with the guide's 8 steps: never past skip_first, the handler never runs.
    "guide_8_steps": ({"wait": 5, "warmup": 1, "active": 3, "repeat": 2, "skip_first": 10}, 8),
    "guide_28_steps": ({"wait": 5, "warmup": 1, "active": 3, "repeat": 2, "skip_first": 10}, 28),
    # Cycles over before the block ends: accelerate's exit export still writes the last cycle.
    "finished_before_exit": ({"wait": 1, "warmup": 1, "active": 1, "repeat": 1}, 10),
    # A cycle cut short by the end of the block: the handler runs at exit.
    "cut_short": ({"wait": 1, "warmup": 1, "active": 3}, 4),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=list(SCHEDULES))
def test_schedule_option_runs_handler_as_torch_does(
    schedule: tuple[dict, int], tmp_path: Path, fresh_accelerate_state: None
) -> None:
    schedule_option, steps = schedule
    ours = _handler_steps(True, schedule_option, steps, tmp_path / "polyprof")
    torchs = _handler_steps(False, schedule_option, steps, tmp_path / "torch")
    assert ours == torchs


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_exporting_an_empty_schedule_fails(tmp_path: Path, fresh_accelerate_state: None) -> None:
    """The guide's schedule, 8 steps and ``output_trace_dir``: nothing recorded, so nothing to write.

    torch raises ``AssertionError: Profiler must be initialized before exporting chrome trace``;
    polyprof raises a ``RuntimeError`` saying that nothing was recorded. Neither writes a file.
    """
    kwargs = ProfileKwargs(
        activities=["cpu"],
        schedule_option={"wait": 5, "warmup": 1, "active": 3, "repeat": 2, "skip_first": 10},
        output_trace_dir=str(tmp_path),
    )
    with shim.shimmed(), pytest.raises(RuntimeError, match="nothing was recorded"):
        profile_tiny_net(kwargs, steps=8)
    assert not (tmp_path / "profile_0.json").exists()


def test_handler_export_with_output_trace_dir_is_tolerated(
    tmp_path: Path, fresh_accelerate_state: None
) -> None:
    """Pitfall: a handler that exports plus ``output_trace_dir`` exports one recording twice.

    torch 2.13 raises ``RuntimeError: Trace is already saved.`` at accelerate's second export;
    polyprof writes both files (a finished recording can be exported any number of times).
    """

    def handler(p: object) -> None:
        p.export_chrome_trace(str(tmp_path / f"handler_{p.step_num}.json"))

    kwargs = ProfileKwargs(
        activities=["cpu"],
        schedule_option={"wait": 1, "warmup": 1, "active": 2},
        on_trace_ready=handler,
        output_trace_dir=str(tmp_path / "acc"),
    )
    with shim.shimmed():
        profile_tiny_net(kwargs, steps=4)
    handler_trace = check_kineto_trace(tmp_path / "handler_4.json")
    exit_trace = check_kineto_trace(tmp_path / "acc" / "profile_0.json")
    assert handler_trace["traceEvents"] == exit_trace["traceEvents"]


def test_gpu_activity_without_its_plugin_is_a_clear_error(
    fresh_accelerate_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guide's ``activities=["cpu", "cuda"]`` on a machine without polyprof's CUDA plugin.

    torch would warn and profile the CPU only; polyprof refuses, naming what to install.
    """
    from polyprof.base.errors import ActivityUnavailableError

    monkeypatch.setenv("POLYPROF_DISABLE_PLUGIN_AUTOLOAD", "1")  # as without polyprof-cuda installed
    with shim.shimmed(), pytest.raises(ActivityUnavailableError, match="polyprof-cuda"):
        profile_tiny_net(ProfileKwargs(activities=["cpu", "cuda"]))
