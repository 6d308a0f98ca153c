"""``polyprof run``: real subprocess runs of small scripts, and argument handling in-process.

The subprocess runs all start at once (each imports torch, which dominates
their time) from one module fixture; each test then reads its own run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from polyprof.base.errors import EXIT_USAGE
from polyprof.cli.cli_run import add_run_command
from polyprof.cli.run_options import ScheduleSpec, parse_activities, parse_schedule
from polyprof.cli.run_target import RunTarget, outcome_of_exit

pytest.importorskip("torch")

#: How the lead's brief runs the command before ``run`` is in ``polyprof.cli.SUBCOMMANDS``.
RUN = (
    "import polyprof.cli as c, polyprof.cli.cli_run as r; "
    "r.add_run_command in c.SUBCOMMANDS or c.SUBCOMMANDS.append(r.add_run_command); "
    "raise SystemExit(c.main())"
)

SCRIPTS = {
    "self_profiling.py": """
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            with record_function("my_block"):
                torch.ones(8, 8) @ torch.ones(8, 8)
        print("TYPE", type(prof).__module__, type(prof).__name__)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=5))
    """,
    "legacy_xpu.py": """
        import torch

        with torch.autograd.profiler_legacy.profile(use_xpu=False) as prof:
            torch.ones(8, 8) @ torch.ones(8, 8)
        print("TYPE", type(prof).__module__, type(prof).__name__)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5))
    """,
    "plain.py": """
        import sys
        import torch

        print("ARGV", sys.argv[1:])
        print("NAME", __name__)
        print("FILE", __file__)
        print("PATH0", sys.path[0])
        x = torch.ones(16, 16)
        for _ in range(3):
            x = torch.mm(x, x) / 16
        print("DONE")
    """,
    "raises.py": """
        import torch

        def failing_step():
            torch.ones(4) * 2
            raise ValueError("boom from the script")

        failing_step()
    """,
    "exits.py": """
        import sys
        import torch

        torch.ones(4) + 1
        print("BEFORE EXIT")
        sys.exit(3)
        print("NOT REACHED")
    """,
    "training.py": """
        import torch

        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(7):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
        print("TRAINED")
    """,
    "runnable_pkg/__init__.py": "",
    "runnable_pkg/tool.py": """
        import sys
        import torch

        torch.ones(4) + 1
        print("MODULE", __name__, sys.argv[1:])
    """,
}


def write_scripts(root: Path) -> None:
    for name, source in SCRIPTS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))


class Run:
    """One ``polyprof run`` subprocess, started now, read when a test asks."""

    def __init__(self, cwd: Path, *argv: str) -> None:
        self.cwd = cwd
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", RUN, "run", *argv],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._done: tuple[int, str, str] | None = None

    def _wait(self) -> tuple[int, str, str]:
        if self._done is None:
            out, err = self._proc.communicate(timeout=120)
            self._done = (self._proc.returncode, out, err)
        return self._done

    @property
    def returncode(self) -> int:
        return self._wait()[0]

    @property
    def stdout(self) -> str:
        return self._wait()[1]

    @property
    def stderr(self) -> str:
        return self._wait()[2]

    def traces(self, output_dir: str = "polyprof-out") -> list[Path]:
        self._wait()
        return sorted((self.cwd / output_dir).glob("*.pt.trace.json"))

    def written(self) -> list[str]:
        """Paths that polyprof run said it wrote."""
        return re.findall(r"^polyprof run: trace written to (.+)$", self.stderr, flags=re.MULTILINE)


def run_in(tmp_path_factory, name: str, *argv: str) -> Run:
    cwd = tmp_path_factory.mktemp(name)
    write_scripts(cwd)
    return Run(cwd, *argv)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    started = {
        "self_profiling": run_in(tmp_path_factory, "self", "self_profiling.py"),
        "plain": run_in(
            tmp_path_factory, "plain", "--record-shapes", "--row-limit", "5", "plain.py", "a", "-b", "--c"
        ),
        "raises": run_in(tmp_path_factory, "raises", "raises.py"),
        "exits": run_in(tmp_path_factory, "exits", "exits.py"),
        "module": run_in(
            tmp_path_factory, "module", "--output-dir", "traces", "-m", "runnable_pkg.tool", "x", "-y"
        ),
        "schedule": run_in(
            tmp_path_factory, "schedule", "--schedule", "1,1,2", "--row-limit", "3", "training.py"
        ),
        "legacy": run_in(tmp_path_factory, "legacy", "legacy_xpu.py"),
    }
    return started


def load_trace(path: Path) -> dict:
    return json.loads(path.read_text())


def event_names(trace: dict) -> set[str]:
    return {e.get("name") for e in trace["traceEvents"]}


# ------------------------------------------------------------------ subprocess runs


@pytest.mark.slow
def test_a_script_that_profiles_itself_gets_polyprof(runs) -> None:
    run = runs["self_profiling"]
    assert run.returncode == 0, run.stderr
    assert "TYPE polyprof.shim TorchProfile" in run.stdout
    assert "my_block" in run.stdout and "aten::mm" in run.stdout  # the script's own table
    assert "started its own profiler (polyprof.shim.TorchProfile)" in run.stderr
    assert run.written() == [] and run.traces() == []  # the whole-script profile stepped aside


@pytest.mark.slow
def test_the_legacy_profiler_takes_use_xpu(runs) -> None:
    run = runs["legacy"]
    assert run.returncode == 0, run.stderr
    assert "TYPE polyprof.shim LegacyProfile" in run.stdout
    assert "aten::mm" in run.stdout
    assert "started its own profiler (polyprof.shim.LegacyProfile)" in run.stderr


@pytest.mark.slow
def test_a_script_that_does_not_profile_itself_is_profiled_whole(runs) -> None:
    run = runs["plain"]
    assert run.returncode == 0, run.stderr
    script = run.cwd.resolve() / "plain.py"
    assert run.stdout.splitlines() == [  # stdout is the script's alone
        "ARGV ['a', '-b', '--c']",
        "NAME __main__",
        f"FILE {script}",
        f"PATH0 {run.cwd.resolve()}",
        "DONE",
    ]
    assert "polyprof run: profile of plain.py" in run.stderr
    assert re.search(r"^\s+aten::mm\s", run.stderr, flags=re.MULTILINE)  # the table, on stderr
    assert "Input Shapes" in run.stderr  # --record-shapes reached the profile
    [written] = run.written()
    [trace_path] = run.traces()
    assert (run.cwd / written).resolve() == trace_path.resolve()
    assert trace_path.name.startswith("plain.")
    trace = load_trace(trace_path)
    assert "aten::mm" in event_names(trace)
    assert trace["record_shapes"] == 1


@pytest.mark.slow
def test_a_script_that_raises_shows_its_traceback_and_still_writes(runs) -> None:
    run = runs["raises"]
    assert run.returncode == 1
    assert len(run.traces()) == 1 and "aten::mul" in event_names(load_trace(run.traces()[0]))
    err = run.stderr
    assert "ValueError: boom from the script" in err
    traceback_text = err[err.index("Traceback (most recent call last):") :]
    assert "raises.py" in traceback_text and "failing_step" in traceback_text
    assert "runpy" not in traceback_text and "cli_run" not in traceback_text
    assert "run_target.py" not in traceback_text
    assert err.index("trace written to") < err.index("Traceback")  # the profile first, the error last


@pytest.mark.slow
def test_sys_exit_code_is_the_exit_status(runs) -> None:
    run = runs["exits"]
    assert run.returncode == 3
    assert run.stdout.splitlines() == ["BEFORE EXIT"]
    assert len(run.traces()) == 1


@pytest.mark.slow
def test_module_form_runs_as_main_with_its_arguments(runs) -> None:
    run = runs["module"]
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["MODULE __main__ ['x', '-y']"]
    assert "profile of -m runnable_pkg.tool" in run.stderr
    [trace] = run.traces("traces")
    assert trace.name.startswith("runnable_pkg.tool.")


@pytest.mark.slow
def test_schedule_counts_optimizer_steps(runs) -> None:
    run = runs["schedule"]
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["TRAINED"]
    # 7 steps, wait 1, warmup 1, active 2: steps 2-3 end cycle 1; step 6 starts cycle 2, cut short at exit.
    assert "cycle 1 (after 4 optimizer steps)" in run.stderr
    assert "cycle 2 (after 7 optimizer steps)" in run.stderr
    assert "acc_events" not in run.stderr  # each cycle is reported on its own: no clearing warning
    first, second = (load_trace(p) for p in run.traces())
    assert {"ProfilerStep#2", "ProfilerStep#3"} <= event_names(first)
    assert "ProfilerStep#1" not in event_names(first)
    assert "ProfilerStep#6" in event_names(second)
    assert "aten::addmm" in event_names(first)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.py"], "can't open file"),
        (["-m", "pp_no_such_module_anywhere"], "No module named pp_no_such_module_anywhere"),
    ],
)
def test_a_missing_target_is_a_one_line_error(tmp_path, argv, message) -> None:
    result = subprocess.run(
        [sys.executable, "-c", RUN, "run", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == EXIT_USAGE
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("polyprof run: error:")


# ------------------------------------------------------------------ in-process: arguments


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="polyprof")
    add_run_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(["run", *argv])


def test_options_go_before_the_script_and_the_rest_is_the_scripts() -> None:
    args = parse(["--record-shapes", "--format", "stacks", "train.py", "--record-shapes", "-m", "x"])
    assert args.record_shapes and args.format == "stacks"
    assert RunTarget.from_args(args) == RunTarget("script", "train.py", ("--record-shapes", "-m", "x"))
    args = parse(["--with-stack", "-m", "pkg.mod", "--lr", "3"])
    assert args.with_stack
    assert RunTarget.from_args(args) == RunTarget("module", "pkg.mod", ("--lr", "3"))


def test_unknown_options_list_the_valid_ones(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        parse(["--bogus", "train.py"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized option: --bogus" in err
    for option in (
        "--activities",
        "--schedule",
        "--sort-by",
        "--row-limit",
        "--output-dir",
        "--format",
        "-m",
    ):
        assert option in err


def test_bad_values_are_usage_errors_naming_the_choices(capsys) -> None:
    for argv, expected in (
        (["--sort-by", "nope", "x.py"], "self_cpu_time_total"),
        (["--activities", "cpu,tpu", "x.py"], "valid activities: cpu, xpu, cuda"),
        (["--schedule", "1,1", "x.py"], "wait,warmup,active"),
        (["--schedule", "1,1,0", "x.py"], "active=0"),
        (["--row-limit", "ten", "x.py"], "invalid int value"),
    ):
        with pytest.raises(SystemExit):
            parse(argv)
        assert expected in capsys.readouterr().err, argv


def test_nothing_to_run_is_a_usage_error(capsys) -> None:
    for argv in ([], ["-m"]):
        args = parse(argv)
        assert args.handler(args) == EXIT_USAGE
        assert "polyprof run: error:" in capsys.readouterr().err


def test_unknown_exporter_and_missing_activity_fail_before_the_script_runs(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # polyprof-cuda may be installed (CI installs it): kept out, CUDA has no provider.
    monkeypatch.setenv("POLYPROF_DISABLE_PLUGIN_AUTOLOAD", "1")
    marker = tmp_path / "ran"
    (tmp_path / "s.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    for argv, expected in (
        (["--format", "nope", "s.py"], "no exporter named 'nope'; available exporters: chrome"),
        (["--activities", "cuda", "s.py"], "polyprof-cuda"),
    ):
        args = parse(argv)
        assert args.handler(args) == EXIT_USAGE
        assert expected in capsys.readouterr().err
    assert not marker.exists()


def test_in_process_run_restores_the_interpreter_state(tmp_path, capsys, monkeypatch) -> None:
    """sys.argv, sys.path and __main__ come back; the shims are gone; polyprof.profile in the script works."""
    from polyprof import shim

    monkeypatch.chdir(tmp_path)
    (tmp_path / "direct.py").write_text(
        textwrap.dedent(
            """
            import sys, torch, polyprof
            sys.argv = ["replaced"]
            sys.path.insert(0, "/nowhere")
            with polyprof.profile() as prof:
                torch.ones(2) + 1
            print("KEYS", sorted(e.key for e in prof.key_averages() if e.key == "aten::add"))
            sys.exit("stopping with a message")
            """
        )
    )
    argv, path, path_items, main = sys.argv, sys.path, sys.path[:], sys.modules["__main__"]
    args = parse(["direct.py"])
    assert args.handler(args) == 1
    out, err = capsys.readouterr()
    assert "KEYS ['aten::add']" in out
    assert "started its own profiler (polyprof.frontends.profiler.profile)" in err
    assert err.rstrip().endswith("stopping with a message")
    assert sys.argv is argv and sys.path is path and sys.path == path_items
    assert sys.modules["__main__"] is main
    assert not shim.installed()
    from polyprof.runtime.recording import recording_gate

    # The run's step-aside listener is gone and nothing holds the gate.
    assert recording_gate._listeners == [] and recording_gate.current() is None


def test_parsers_and_exit_codes() -> None:
    assert parse_schedule("1, 2, 3") == ScheduleSpec(1, 2, 3, 0)
    assert parse_schedule("0,1,1,4") == ScheduleSpec(0, 1, 1, 4)
    from polyprof import ProfilerActivity

    assert parse_activities("cpu,CUDA,cpu") == {ProfilerActivity.CPU, ProfilerActivity.CUDA}
    assert outcome_of_exit(SystemExit()).exit_code == 0
    assert outcome_of_exit(SystemExit(7)).exit_code == 7
    assert outcome_of_exit(SystemExit(False)).exit_code == 0
    text = outcome_of_exit(SystemExit("bad input"))
    assert (text.exit_code, text.exit_message) == (1, "bad input")


def test_a_trace_that_cannot_be_written_makes_a_clean_run_fail(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    # The directory was usable when the run began; the script puts a file in its place.
    (tmp_path / "ok.py").write_text(
        "import os, torch\nos.rmdir('out')\nopen('out', 'w').close()\ntorch.ones(3) + 1\nprint('OK')\n"
    )
    args = parse(["--output-dir", "out", "ok.py"])
    assert args.handler(args) == 1
    out, err = capsys.readouterr()
    assert out == "OK\n"
    assert "aten::add" in err  # the table still comes
    assert "polyprof run: could not write the trace of cycle 1" in err
    assert "trace written" not in err


def test_other_exporters_name_files_with_their_own_ending(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work.py").write_text("import torch\ntorch.mm(torch.ones(4, 4), torch.ones(4, 4))\n")
    args = parse(
        ["--format", "stacks", "--with-stack", "--sort-by", "count", "--output-dir", "out", "work.py"]
    )
    assert args.handler(args) == 0
    err = capsys.readouterr().err
    [written] = re.findall(r"^polyprof run: trace written to (.+)$", err, flags=re.MULTILINE)
    assert written.startswith(os.path.join("out", "work.")) and written.endswith(".stacks")
    lines = (tmp_path / written).read_text().splitlines()
    assert lines and all(re.fullmatch(r".+ \d+", line) for line in lines)  # collapsed stacks: "a;b;c value"


def test_without_torch_run_says_it_needs_torch(tmp_path, monkeypatch) -> None:
    from polyprof.shim import TorchMissingError

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    (tmp_path / "s.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    args = parse(["s.py"])
    with pytest.raises(TorchMissingError, match="needs torch"):  # polyprof.cli.main prints it, exit 1
        args.handler(args)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("output_dir", "problem"),
    [
        ("taken", "cannot use 'taken' as the output directory: it exists and is not a directory"),
        ("taken/sub", "cannot create the output directory 'taken/sub': 'taken' is not a directory"),
    ],
    ids=["a-file", "below-a-file"],
)
def test_an_unusable_output_dir_fails_before_the_script_runs(
    tmp_path, capsys, monkeypatch, output_dir, problem
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("user data")
    marker = tmp_path / "ran"
    (tmp_path / "s.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    args = parse(["--output-dir", output_dir, "s.py"])
    assert args.handler(args) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"polyprof run: error: argument --output-dir: {problem}\n")
    assert not marker.exists()
    assert (tmp_path / "taken").read_text() == "user data"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_an_output_dir_without_write_permission_fails_before_the_script_runs(
    readonly_dir, run_unprivileged, monkeypatch
) -> None:
    parent, readonly = readonly_dir
    monkeypatch.chdir(parent)
    script = os.path.join(parent, "s.py")
    with open(script, "w") as f:
        f.write("print('RAN')\n")

    def attempt() -> str:
        results = []
        for output_dir in (readonly, os.path.join(readonly, "new")):
            args = parse(["--output-dir", output_dir, script])
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = args.handler(args)
            results.append(f"{code}|{out.getvalue()}|{err.getvalue()}")
        return "".join(results)

    prefix = "polyprof run: error: argument --output-dir:"
    assert run_unprivileged(attempt).splitlines() == [
        f"{EXIT_USAGE}||{prefix} cannot write into the output directory {readonly!r}: no write permission",
        (
            f"{EXIT_USAGE}||{prefix} cannot create the output directory {os.path.join(readonly, 'new')!r}: "
            f"no write permission for directory {readonly!r}"
        ),
    ]


def test_the_output_dir_is_made_before_the_script_runs_and_kept_when_it_changes_directory(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "moves.py").write_text(
        "import os, torch\nprint('MADE', os.path.isdir('new/out'))\n"
        "os.chdir('elsewhere')\ntorch.ones(2) + 1\n"
    )
    args = parse(["--output-dir", os.path.join("new", "out"), "moves.py"])
    try:
        assert args.handler(args) == 0
    finally:
        os.chdir(tmp_path)  # the in-process script changed it
    out, err = capsys.readouterr()
    assert out == "MADE True\n"
    [written] = re.findall(r"^polyprof run: trace written to (.+)$", err, flags=re.MULTILINE)
    assert written.startswith(os.path.join("new", "out", "moves."))  # as given, from where the run began
    assert (tmp_path / written).is_file() and os.listdir(tmp_path / "elsewhere") == []


@pytest.mark.parametrize(
    ("options", "left"),
    [
        ([], []),  # no empty polyprof-out left behind
        (["--output-dir", "made/for/nothing"], []),
        # "made" is not below "kept", the outermost directory made: when unsure, nothing is removed.
        (["--output-dir", "kept/../made"], ["kept", "made"]),
    ],
)
def test_an_output_dir_made_for_nothing_is_removed_again(
    tmp_path, capsys, monkeypatch, options, left
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "own.py").write_text("import torch\nwith torch.profiler.profile():\n    torch.ones(2) + 1\n")
    args = parse([*options, "own.py"])
    assert args.handler(args) == 0
    assert "started its own profiler" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == sorted(["own.py", *left])
