"""The ``polyprof`` command line as docs/cli.md describes it, across its subcommands.

Usage errors name the command that was given (its usage, ``polyprof COMMAND: error: ...``); errors
from a command's work carry its name too; an output that cannot be written is status 2 in every
command; option values that start with '-' reach their own checks; what a trace holds cannot break
the terminal's encoding; a merged trace is not reported as if it were one rank's; Ctrl-C ends the
command as it ends python, so that a shell loop of commands stops; the exit statuses have one home.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polyprof import cli
from polyprof.base.errors import EXIT_INTERRUPTED, EXIT_SLOWER, EXIT_USAGE, PolyprofError
from polyprof.base.fileio import OutputDirectoryMissing
from polyprof.cli import cli_convert, cli_merge, cli_report, cli_run
from report_cli import CliResult

REPO_ROOT = Path(__file__).resolve().parents[1]
CORE = REPO_ROOT / "core"
BASE_NS = 1_790_857_026_000_000_000


@pytest.fixture
def polyprof(capsys) -> Callable[..., CliResult]:
    """``polyprof(*argv)`` runs the command in-process and returns its status, stdout and stderr."""

    def run(*argv: Any) -> CliResult:
        capsys.readouterr()
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


def rank_doc(rank: int, world_size: int = 2, *, name: str = "aten::mm") -> dict[str, Any]:
    """A small rank trace of a two-rank run: two steps, one op in each."""
    events = []
    for step in range(2):
        ts = step * 200.0
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": 150.0,
            }
        )
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts + 1, "dur": 50.0}
        )
    info = {"backend": "gloo", "rank": rank, "world_size": world_size}
    return {"baseTimeNanoseconds": BASE_NS, "distributedInfo": info, "traceEvents": events}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in (0, 1):
        (folder / f"r{rank}.json").write_text(json.dumps(rank_doc(rank)), encoding="utf-8")
    return folder


def no_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any reading of the ranks' traces fails the test: what is checked must be checked before it."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the traces were read before the options were checked")

    monkeypatch.setattr("polyprof.ranks.collect_rank_set", refuse)


# ------------------------------------------------------------------ usage errors

#: Every subcommand, with arguments that parse, so that only the unknown option is wrong.
COMMAND_LINES = {
    "plugins": ["plugins"],
    "report": ["report", "trace.json"],
    "diff": ["diff", "a.json", "b.json"],
    "convert": ["convert", "a.json", "b.parquet"],
    "merge": ["merge", "traces", "-o", "merged.json"],
    "run": ["run", "train.py"],
    "kineto-reader": ["kineto-reader", "status"],
}


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (subparsers,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


def test_every_subcommand_is_listed_here() -> None:
    assert set(command_parsers()) == set(COMMAND_LINES)


@pytest.mark.parametrize("command", sorted(COMMAND_LINES))
@pytest.mark.parametrize("where", ["first", "last"])
def test_an_unknown_option_is_the_commands_usage_error(polyprof, command: str, where: str) -> None:
    argv = list(COMMAND_LINES[command])
    if where == "first":
        argv.insert(1, "--bogus")
    elif command == "run":  # after the script, it is the script's argument
        argv.insert(1, "--bogus")
    else:
        argv.append("--bogus")
    result = polyprof(*argv)
    assert result.code == 2
    assert result.out == ""
    assert result.err.startswith(f"usage: polyprof {command} ")
    last = result.err.splitlines()[-1]
    assert last.startswith(f"polyprof {command}: error: unrecognized "), result.err
    assert "--bogus" in last


def test_an_unknown_option_without_a_command_is_polyprofs_usage_error(polyprof) -> None:
    result = polyprof("--bogus", "report", "trace.json")
    assert result.code == 2
    assert result.err.startswith("usage: polyprof [-h]")
    assert result.err.splitlines()[-1] == "polyprof: error: unrecognized arguments: --bogus"


# ------------------------------------------------------------------ errors from a command's work

#: Where each command's handler is looked up when the parser is built.
HANDLERS = {
    "plugins": (cli, "run_plugins_command"),
    "report": (cli_report, "run_report_command"),
    "convert": (cli_convert, "run_convert_command"),
    "merge": (cli_merge, "run_merge_command"),
    "run": (cli_run, "run_command"),
    "kineto-reader": (cli, "run_kineto_reader_command"),
}


@pytest.mark.parametrize("command", sorted(HANDLERS))
@pytest.mark.parametrize(
    ("error", "status"),
    [
        (PolyprofError("the \x1b[31mproblem"), 1),
        (OutputDirectoryMissing("cannot write 'x/out.json': directory 'x' does not exist", "x/out.json"), 2),
        (OSError(errno.ENOSPC, "No space left on device"), 2),
    ],
    ids=["polyprof error", "unusable output", "disk full"],
)
def test_a_commands_errors_carry_its_name(
    polyprof, monkeypatch, command: str, error: Exception, status: int
) -> None:
    def fail(args: Any) -> int:
        raise error

    module, name = HANDLERS[command]
    monkeypatch.setattr(module, name, fail)
    result = polyprof(*COMMAND_LINES[command])
    assert result.code == status
    assert "Traceback" not in result.err
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith(f"polyprof {command}: error: ")
    assert "\x1b" not in lines[0]


def test_converts_own_errors_carry_its_name(polyprof, run_dir: Path) -> None:
    result = polyprof("convert", run_dir / "r0.json", run_dir / "r0.txt")
    assert result.code == 1
    assert result.err.startswith("polyprof convert: error: cannot tell the format to write")


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "{run}/r0.json", "{missing}/r0.json.gz"],
        ["convert", "{run}", "-o", "{file}/sub"],
        ["report", "{run}", "-o", "{missing}/report.txt"],
        ["report", "{run}", "-o", "{file}/report.txt"],
        ["merge", "{run}", "-o", "{missing}/merged.json"],
    ],
    ids=lambda argv: " ".join(argv[:1] + argv[2:]),
)
def test_an_unusable_output_is_status_2_in_every_command(polyprof, run_dir: Path, argv: list[str]) -> None:
    if argv[0] == "merge":
        pytest.importorskip("pyarrow")
    a_file = run_dir.parent / "notes.txt"
    a_file.write_text("not a directory", encoding="utf-8")
    names = {"run": run_dir, "missing": run_dir.parent / "missing", "file": a_file}
    result = polyprof(*(part.format(**names) for part in argv))
    assert result.code == 2, result.err
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith(f"polyprof {argv[0]}: error: ")
    assert not (run_dir.parent / "missing").exists()


def test_report_dir_checks_its_output_before_the_analysis(polyprof, monkeypatch, run_dir: Path) -> None:
    no_analysis(monkeypatch)
    result = polyprof("report", run_dir, "-o", run_dir.parent / "missing" / "report.txt")
    assert result.code == 2
    assert result.err.startswith("polyprof report: error: cannot write ")


# ------------------------------------------------------------------ values that start with '-'


def test_a_negative_memory_limit_gets_the_real_message_before_any_work(
    polyprof, monkeypatch, run_dir: Path
) -> None:
    no_analysis(monkeypatch)
    result = polyprof("report", run_dir, "--memory-limit", "-5GB")
    assert result.code == 2
    assert result.err == (
        "polyprof report: error: argument --memory-limit: '-5GB': a size must be positive, e.g. 2GB\n"
    )


def duckdbs(value: str, problem: str) -> Any:
    """A case that DuckDB itself refuses, with its message."""
    needs = pytest.mark.skipif(importlib.util.find_spec("duckdb") is None, reason="needs duckdb")
    return pytest.param(value, problem, marks=needs, id=value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        # DuckDB's own reason follows; its words differ between versions
        duckdbs("2", "not a size DuckDB takes: Parser Error: "),
        duckdbs("lots", "not a size DuckDB takes: Parser Error: "),
        duckdbs("1,5GB", "not a size DuckDB takes: Parser Error: "),
        ("", "no size given"),
        ("0GB", "must be positive"),
        ("0.0 %", "must be positive"),
        ("-0GB", "must be positive"),
        ("-1", "must be positive"),
        ("150%", "at most 100%"),
    ],
)
def test_a_memory_limit_duckdb_would_not_take_or_would_misread_is_refused_first(
    polyprof, monkeypatch, run_dir: Path, value: str, problem: str
) -> None:
    """DuckDB reads a leading minus as no limit at all, and 0 as a limit every query fails under."""
    no_analysis(monkeypatch)
    result = polyprof("report", run_dir, "--memory-limit", value)
    assert result.code == 2
    assert result.err.startswith(f"polyprof report: error: argument --memory-limit: {value!r}: ")
    assert problem in result.err
    assert len(result.err.splitlines()) == 1


@pytest.mark.parametrize(
    "value",
    [
        *("2GB", "2 gb", "512MiB", "1.5GiB", ".5TB", "100KB", "50%", "1TiB"),
        *("4G", "512M", "1T", "1gigabyte", "100000000 bytes"),
    ],
)
def test_the_memory_limits_duckdb_takes_pass(value: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    try:
        duckdb.connect(config={"memory_limit": value}).close()
    except duckdb.Error:  # a share (50%) is taken by newer DuckDB releases only
        with pytest.raises(ValueError, match="not a size DuckDB takes"):
            cli_report.check_memory_limit(value)
        return
    assert cli_report.check_memory_limit(value) == value


def test_without_duckdb_only_what_it_would_misread_is_refused(monkeypatch) -> None:
    """What DuckDB takes is DuckDB's to say; without it the engine's error says it is missing."""
    monkeypatch.setitem(sys.modules, "duckdb", None)  # `import duckdb` raises ImportError
    assert cli_report.check_memory_limit("2") == "2"
    with pytest.raises(ValueError, match="a size must be positive"):
        cli_report.check_memory_limit("-5GB")


def test_a_negative_schedule_gets_the_schedules_own_message(polyprof) -> None:
    result = polyprof("run", "--schedule", "-1,1,2", "train.py")
    assert result.code == 2
    last = result.err.splitlines()[-1]
    assert last.startswith("polyprof run: error: argument --schedule: '-1,1,2': ")
    assert "wait=-1 (need >= 0)" in last


def _value_options() -> list[tuple[str, str]]:
    """(command, option) for every option of every command that takes one value."""
    return [
        (command, action.option_strings[-1])
        for command, parser in command_parsers().items()
        for action in parser._actions
        if isinstance(action, argparse._StoreAction) and action.option_strings and action.nargs is None
    ]


def test_the_options_that_take_a_value_are_found() -> None:
    found = _value_options()
    for expected in (
        ("report", "--memory-limit"),
        ("run", "--schedule"),
        ("convert", "--to"),
        ("merge", "--output"),
    ):
        assert expected in found


@pytest.mark.parametrize(("command", "option"), _value_options(), ids=lambda x: x)
def test_a_value_starting_like_a_negative_number_is_the_options_value(
    capsys, command: str, option: str
) -> None:
    """Whatever the option then says of it, argparse never answers "expected one argument"."""
    argv = [command, option, "-5x", *COMMAND_LINES[command][1:]]
    try:
        cli.build_parser().parse_known_args(argv)
    except SystemExit:
        pass
    assert "expected one argument" not in capsys.readouterr().err


def test_argparse_still_has_the_matcher_polyprof_sets() -> None:
    """``read_negative_looking_values_as_values`` sets argparse's private ``_negative_number_matcher``
    (argparse has no public setting): were it renamed, the setting would do nothing, silently."""
    stock = argparse.ArgumentParser()
    assert isinstance(getattr(stock, "_negative_number_matcher", None), re.Pattern), (
        "argparse no longer has _negative_number_matcher: "
        "see polyprof.cli.read_negative_looking_values_as_values"
    )
    assert stock._negative_number_matcher.match("-5")
    parser = argparse.ArgumentParser()
    cli.read_negative_looking_values_as_values(parser)
    parser.add_argument("--size")
    assert parser.parse_args(["--size", "-5GB"]).size == "-5GB"


# ------------------------------------------------------------------ Ctrl-C

#: ``python -m polyprof`` (as runpy runs it for -m), its reading of the trace held the first time
#: (until ``$HELD_MARKER`` exists) until a signal comes.
HELD_REPORT = textwrap.dedent(
    """
    import os, runpy, sys, time
    from polyprof.cli import cli_report

    real = cli_report.load_report_results

    def held(path, **kwargs):
        if not os.path.exists(os.environ["HELD_MARKER"]):
            open(os.environ["HELD_MARKER"], "w").close()
            print("HELD", file=sys.stderr, flush=True)
            time.sleep(60)
        return real(path, **kwargs)

    cli_report.load_report_results = held
    runpy.run_module("polyprof", run_name="__main__", alter_sys=True)
    """
)


def held_env(tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(CORE), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "HELD_MARKER": str(tmp_path / "held"),
        "PYTHON": sys.executable,
        "HELD": HELD_REPORT,
        "TRACE": str(tmp_path / "trace.json"),
    }


def wait_until_held(process: subprocess.Popen[str]) -> None:
    assert process.stderr is not None
    seen = []
    for line in process.stderr:  # the command's own warnings may come first
        seen.append(line)
        if line.strip() == "HELD":
            return
    raise AssertionError("the command never got to its held step:\n" + "".join(seen))


@pytest.mark.skipif(os.name != "posix", reason="ending by a signal is POSIX's")
def test_ctrl_c_ends_the_polyprof_process_by_sigint_as_python(tmp_path: Path) -> None:
    """What a shell looks at: the command died of SIGINT (it still shows $? as 130)."""
    env = held_env(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-c", HELD_REPORT, "report", env["TRACE"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_until_held(process)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGINT, err
    assert (out, err) == ("", "polyprof report: interrupted\n")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_ctrl_c_stops_a_shell_loop_of_polyprof_commands(tmp_path: Path) -> None:
    """Ctrl-C signals the loop's process group; bash stops only if the command died of SIGINT."""
    loop = 'for i in 1 2; do "$PYTHON" -c "$HELD" report "$TRACE"; echo "after $?"; done'
    process = subprocess.Popen(
        [shutil.which("bash") or "bash", "-c", loop],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=held_env(tmp_path),
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        wait_until_held(process)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert "after" not in out, out + err
    assert process.returncode == -signal.SIGINT, err


def test_in_this_process_ctrl_c_is_status_130(polyprof, monkeypatch) -> None:
    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_report, "run_report_command", interrupted)
    result = polyprof("report", "trace.json")
    assert (result.code, result.out, result.err) == (EXIT_INTERRUPTED, "", "polyprof report: interrupted\n")


def test_the_exit_statuses_are_defined_once() -> None:
    defined = {
        path.name: re.findall(r"^(EXIT_\w+) = (\d+)", path.read_text(encoding="utf-8"), re.MULTILINE)
        for path in (CORE / "polyprof").rglob("*.py")
    }
    assert {name: found for name, found in defined.items() if found} == {
        "errors.py": [
            ("EXIT_USAGE", str(EXIT_USAGE)),
            ("EXIT_SLOWER", str(EXIT_SLOWER)),
            ("EXIT_INTERRUPTED", str(EXIT_INTERRUPTED)),
        ]
    }


# ------------------------------------------------------------------ what a trace holds


def surrogate_trace(folder: Path) -> Path:
    """A trace whose op name holds the JSON escape of a lone surrogate (six characters in the file)."""
    events = json.dumps(rank_doc(0)["traceEvents"]).replace("aten::mm", "aten::mm\\ud800x")
    trace = folder / "trace.json"
    trace.write_text('{"traceEvents": ' + events + "}", encoding="utf-8")
    assert "\\ud800" in trace.read_text(encoding="utf-8")
    return trace


def test_a_lone_surrogate_in_a_name_is_printed_as_its_escape(tmp_path: Path) -> None:
    """As a user runs it: its own process (no torch imported), stdout a pipe that takes UTF-8 only."""
    trace = surrogate_trace(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "polyprof", "report", str(trace)], capture_output=True, timeout=120
    )
    err = done.stderr.decode("utf-8", errors="replace")
    assert done.returncode == 0, err
    assert "Traceback" not in err
    assert "aten::mm\\ud800x" in done.stdout.decode("utf-8")


def test_a_lone_surrogate_in_a_name_is_printed_as_its_escape_with_torch_loaded(
    polyprof, tmp_path: Path
) -> None:
    """With torch imported, names go through torch's demangler, which cannot take a surrogate."""
    pytest.importorskip("torch")
    result = polyprof("report", surrogate_trace(tmp_path))
    assert result.code == 0, result.err
    assert "aten::mm\\ud800x" in result.out


def merged_doc(ranks: list[int]) -> dict[str, Any]:
    """What ``polyprof merge`` writes for ``ranks``: each rank's processes under ``rank * 100 + 1``."""
    events: list[dict[str, Any]] = []
    for rank in ranks:
        pid = rank * 100 + 1
        events += [{**event, "pid": pid} for event in rank_doc(rank)["traceEvents"]]
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"rank {rank}: python"},
            }
        )
    listed = [{"rank": r, "source": f"r{r}.json", "shift_ns": 0, "pid_base": r * 100} for r in ranks]
    merge_key = {"align": "wall", "ranks": listed, "world_size": len(ranks), "backend": "gloo"}
    return {"baseTimeNanoseconds": BASE_NS, "polyprofMerge": merge_key, "traceEvents": events}


def test_report_of_a_merged_trace_of_ranks_says_it_mixes_them(polyprof, tmp_path: Path) -> None:
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps(merged_doc([0, 1])), encoding="utf-8")
    result = polyprof("report", merged)
    assert result.code == 2
    assert result.out == ""
    assert result.err.startswith(f"polyprof report: error: {merged}: polyprof merge's trace of 2 ranks")
    assert "polyprof report DIR" in result.err
    assert len(result.err.splitlines()) == 1


def test_report_of_a_merged_trace_of_one_rank_is_that_ranks_table(polyprof, tmp_path: Path) -> None:
    merged, alone = tmp_path / "merged.json", tmp_path / "r3.json"
    merged.write_text(json.dumps(merged_doc([3])), encoding="utf-8")
    alone.write_text(json.dumps(rank_doc(3)), encoding="utf-8")
    result = polyprof("report", merged)
    assert result.code == 0, result.err
    assert result.out == polyprof("report", alone).out


def test_report_of_what_polyprof_merge_wrote_says_it_mixes_ranks(polyprof, run_dir: Path) -> None:
    pytest.importorskip("pyarrow")
    merged = run_dir.parent / "merged.json"
    assert polyprof("merge", run_dir, "-o", merged).code == 0
    result = polyprof("report", merged)
    assert result.code == 2
    assert "polyprof merge's trace of 2 ranks" in result.err


# ------------------------------------------------------------------ help and changelog


def test_the_top_level_help_says_what_report_does_with_a_directory(polyprof) -> None:
    result = polyprof("--help")
    assert result.code == 0
    text = " ".join(result.out.split())
    expected = (
        "print a trace's key_averages table, or with a directory / several traces the report across ranks"
    )
    assert f"report {expected}" in text


def test_string_activities_are_refused_as_torch_refuses_them_and_the_changelog_says_so() -> None:
    torch = pytest.importorskip("torch")
    import polyprof

    for activities in (["cpu"], ["cpu", torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises((TypeError, AssertionError)) as ours:
            polyprof.profile(activities=activities)
        with pytest.raises((TypeError, AssertionError)) as torchs:
            torch.profiler.profile(activities=activities)
        assert isinstance(ours.value, type(torchs.value))
    changelog = (REPO_ROOT / "docs" / "changelog.md").read_text(encoding="utf-8")
    unreleased = changelog.split("\n## ", 2)[1]
    assert 'activities=["cpu"]' in unreleased
