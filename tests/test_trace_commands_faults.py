"""``convert``, ``report DIR`` and ``merge`` under faults: inputs never written over, one-line errors,
nothing partial left, temporary folders removed after SIGTERM and SIGKILL, names escaped."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

import pyarrow as pa
import pyarrow.parquet as pq

from polyprof.base import fileio
from polyprof.cli import main as cli_main
from polyprof.ranks import rank_set
from polyprof.ranks.rank_set import collect_rank_set, temporary_parquet_dir

BASE_NS = 1_700_000_000_000_000_000
#: What a terminal must never get raw: C0 controls but the newline, DEL, C1.
RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def rank_doc(rank: Any, world_size: int = 2, *, name: str = "aten::mm") -> dict[str, Any]:
    """A small rank trace: one step holding one op, and Kineto's global instant event (``pid ""``)."""
    return {
        "baseTimeNanoseconds": BASE_NS,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world_size},
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#1",
                "pid": 1,
                "tid": 1,
                "ts": 0.0,
                "dur": 100.0,
            },
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 1.0, "dur": 50.0},
            {
                "ph": "i",
                "s": "g",
                "name": "Iteration Start: PyTorch Profiler",
                "pid": "",
                "tid": "",
                "ts": 0.0,
            },
        ],
    }


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def write_parquet(path: Path, doc: dict[str, Any]) -> Path:
    source = write_json(path.with_name(path.name + ".src.json"), doc)
    assert cli_main(["convert", str(source), str(path)]) == 0
    source.unlink()
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    for rank in range(2):
        write_json(folder / f"r{rank}.json", rank_doc(rank))
    return folder


@pytest.fixture
def private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$TMPDIR`` of this test alone: the temporary Parquet folders go there."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def assert_one_clear_line(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"polyprof {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def no_temp_files(*folders: Path) -> bool:
    return not [p for folder in folders for p in folder.iterdir() if p.name.startswith(".polyprof-")]


# ------------------------------------------------------- item 3: merge -o or report -o an input


@pytest.mark.parametrize("form", ["in the directory", "named", "by a link"])
def test_merge_refuses_to_write_over_one_of_its_traces(run: Path, tmp_path: Path, capsys, form: str) -> None:
    before = contents(run)
    if form == "in the directory":
        argv = [str(run), "-o", str(run / "r0.json")]
    elif form == "named":
        argv = [str(run / "r0.json"), str(run / "r1.json"), "-o", str(run / "r1.json")]
    else:
        (tmp_path / "link.json").symlink_to(run / "r1.json")
        argv = [str(run), "-o", str(tmp_path / "link.json")]
    assert cli_main(["merge", *argv]) == 2
    line = assert_one_clear_line(capsys.readouterr().err, "merge")
    assert "is one of the traces to merge, which is never written over" in line
    assert contents(run) == before


@pytest.mark.parametrize("form", ["in the directory", "named", "by a link"])
def test_report_refuses_to_write_over_one_of_its_traces(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, form: str
) -> None:
    if form == "in the directory":
        argv = [str(run), "-o", str(run / "r0.json")]
    elif form == "named":
        argv = [str(run / "r0.json"), str(run / "r1.json"), "-o", str(run / "r1.json")]
    else:
        (tmp_path / "link.json").symlink_to(run / "r1.json")
        argv = [str(run), "-o", str(tmp_path / "link.json")]
    before = contents(run)
    converted: list[str] = []
    monkeypatch.setattr("polyprof.ranks.rank_set.json_trace_table", lambda source: converted.append(source))
    assert cli_main(["report", *argv, "--format", "json"]) == 2
    line = assert_one_clear_line(capsys.readouterr().err, "report")
    assert "is one of the traces to report on, which is never written over" in line
    assert contents(run) == before and converted == []  # refused before any work


# ------------------------------------------------- item 4: a same-stem input is never written over


def same_stem_run(tmp_path: Path) -> Path:
    """``r.json`` is rank 0; ``r.parquet`` beside it is rank 1 (another trace, not r.json's copy)."""
    folder = tmp_path / "run"
    write_json(folder / "r.json", rank_doc(0))
    write_parquet(folder / "r.parquet", rank_doc(1))
    return folder


@pytest.mark.parametrize("command", ["report", "merge"])
def test_a_parquet_input_with_the_stem_of_a_json_input_is_kept(tmp_path: Path, capsys, command: str) -> None:
    folder = same_stem_run(tmp_path)
    rank1 = (folder / "r.parquet").read_bytes()
    capsys.readouterr()
    out = tmp_path / "merged.json"
    argv = [str(folder), "--parquet-dir", str(folder)]
    if command == "report":
        assert cli_main(["report", *argv, "--format", "json"]) == 0
        ranks = {r["rank"]: r["source"] for r in json.loads(capsys.readouterr().out)["ranks"]}
    else:
        assert cli_main(["merge", *argv, "-o", str(out)]) == 0
        ranks = {r["rank"]: r["source"] for r in json.loads(out.read_text())["polyprofMerge"]["ranks"]}
    assert ranks == {0: str(folder / "r.json"), 1: str(folder / "r.parquet")}
    assert (folder / "r.parquet").read_bytes() == rank1
    assert (folder / "r.2.parquet").exists()  # r.json's copy, under the next free name


def test_an_earlier_conversion_in_the_parquet_dir_is_replaced(run: Path, tmp_path: Path) -> None:
    keep = tmp_path / "pq"
    assert collect_rank_set([str(run)], str(keep)).ranks[0].parquet == str(keep / "r0.parquet")
    write_json(run / "r0.json", rank_doc(0, name="aten::add"))
    rank_set = collect_rank_set([str(run)], str(keep))
    assert rank_set.ranks[0].parquet == str(keep / "r0.parquet")  # not r0.2.parquet: it is no input
    assert "aten::add" in pq.read_table(keep / "r0.parquet").column("name").to_pylist()


def test_convert_into_its_source_directory_skips_a_source_it_would_write_over(tmp_path: Path, capsys) -> None:
    folder = same_stem_run(tmp_path)
    before = contents(folder)
    assert cli_main(["convert", str(folder), "-o", str(folder)]) == 1
    err = capsys.readouterr().err
    assert (
        f"skipped {folder / 'r.json'}: its destination {folder / 'r.parquet'} is one of the traces "
        "converted, which is never written over" in err
    )
    assert contents(folder) == before


# ------------------------------------------------------------- item 5: one line, nothing partial


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file polyprof.base.fileio writes goes to /dev/full: its data fails with ENOSPC, for real."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    real = fileio._create_temp

    def on_a_full_disk(directory: str) -> tuple[int, str]:
        fd, temp = real(directory)
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)
        os.close(full)
        return fd, temp

    monkeypatch.setattr(fileio, "_create_temp", on_a_full_disk)


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "{run}/r0.json", "{out}/r0.parquet"],
        ["convert", "{run}", "-o", "{out}"],
        ["convert", "{parquet}/r0.parquet", "{out}/r0.json.gz"],
        ["merge", "{parquet}", "-o", "{out}/merged.json"],
        ["report", "{parquet}", "-o", "{out}/report.txt"],
        ["report", "{parquet}/r0.parquet", "{run}/r1.json", "--format", "json"],  # r1.json's copy
    ],
    ids=lambda argv: " ".join(argv),
)
def test_a_full_disk_is_one_line_and_leaves_nothing(
    run: Path, tmp_path: Path, private_tmpdir: Path, capsys, request, argv: list[str]
) -> None:
    parquet = tmp_path / "parquet"
    assert cli_main(["convert", str(run), "-o", str(parquet)]) == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.txt").write_text("an earlier report")
    capsys.readouterr()
    before = {folder: contents(folder) for folder in (run, parquet, out)}
    request.getfixturevalue("full_disk")
    argv = [a.format(run=run, out=out, parquet=parquet) for a in argv]
    assert cli_main(argv) == 2
    line = assert_one_clear_line(capsys.readouterr().err, argv[0])
    assert "No space left on device" in line
    assert {folder: contents(folder) for folder in (run, parquet, out)} == before
    assert no_temp_files(run, parquet, out) and not list(private_tmpdir.iterdir())


@pytest.mark.parametrize("command", ["report", "merge", "convert"])
def test_a_directory_that_cannot_be_listed_is_one_line(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, command: str
) -> None:
    real = os.listdir

    def listdir(path: Any = ".") -> list[str]:
        if os.fspath(path) == str(run):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    out = tmp_path / "out"
    argv = {"report": [], "merge": ["-o", str(tmp_path / "m.json")], "convert": ["-o", str(out)]}[command]
    assert cli_main([command, str(run), *argv]) != 0
    line = assert_one_clear_line(capsys.readouterr().err, command)
    assert f"cannot list the directory {str(run)!r}: Permission denied" in line


@pytest.mark.parametrize("command", ["report", "merge"])
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_parquet_dir_that_cannot_be_used_is_refused_before_any_conversion(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, command: str, where: str
) -> None:
    (tmp_path / "file").write_text("not a directory")
    parquet_dir = tmp_path / "file" if where == "a file" else tmp_path / "file" / "pq"
    converted: list[str] = []
    monkeypatch.setattr("polyprof.ranks.rank_set.json_trace_table", lambda source: converted.append(source))
    argv = ["-o", str(tmp_path / "m.json")] if command == "merge" else []
    assert cli_main([command, str(run), "--parquet-dir", str(parquet_dir), *argv]) == 2
    line = assert_one_clear_line(capsys.readouterr().err, command)
    assert str(parquet_dir) in line and converted == []


@pytest.mark.parametrize("command", ["report", "merge"])
def test_a_parquet_trace_whose_ts_is_text_is_skipped_with_the_reason(
    run: Path, tmp_path: Path, capsys, command: str
) -> None:
    bad = write_parquet(run / "r2.parquet", rank_doc(1))
    table = pq.read_table(bad)
    text = pa.array([str(v) for v in table.column("ts").to_pylist()], pa.string())
    pq.write_table(table.set_column(table.schema.get_field_index("ts"), "ts", text), bad)
    argv = ["-o", str(tmp_path / "m.json")] if command == "merge" else []
    assert cli_main([command, str(run), *argv]) == 0
    err = capsys.readouterr().err
    assert (
        f"skipped {bad}: not a readable polyprof Parquet trace: its column 'ts' holds string, not numbers"
        in err
    )
    assert "Traceback" not in err


# ------------------------------------------- item 6: no temporary folder outlives its command

SLOW_COMMAND = textwrap.dedent(
    """
    import sys, time
    import polyprof.cli.cli_merge, polyprof.ranks
    from polyprof.cli import main

    def slow(*args, **kwargs):  # the traces are converted into the temporary folder by now
        print("converted", flush=True)
        time.sleep(120)

    polyprof.ranks.rank_rows = slow
    polyprof.cli.cli_merge.merge_rank_set = slow
    raise SystemExit(main(sys.argv[1:]))
    """
)


def start_slow(command: str, run: Path, tmpdir: Path) -> subprocess.Popen[str]:
    argv = [str(run), "-o", str(run.parent / "merged.json")] if command == "merge" else [str(run)]
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_COMMAND, command, *argv], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline() == "converted\n"
    return proc


def report_folders(tmpdir: Path) -> list[Path]:
    return sorted(tmpdir.glob("polyprof-report-*"))


@pytest.mark.parametrize("command", ["report", "merge"])
def test_sigterm_removes_the_temporary_folder_and_exits_143(
    run: Path, private_tmpdir: Path, command: str
) -> None:
    proc = start_slow(command, run, private_tmpdir)
    try:
        (folder,) = report_folders(private_tmpdir)
        assert (folder / "r0.parquet").exists()
        with temporary_parquet_dir():  # another command: the live command's folder is not its to remove
            assert folder.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert report_folders(private_tmpdir) == []


#: ``report DIR`` held in one DuckDB query (the first rank's), after its traces were converted: the
#: main thread waits in Python meanwhile (``rank_analysis.interruptible``), where SIGTERM lands.
SLOW_QUERY = textwrap.dedent(
    """
    import sys
    from polyprof.ranks import rank_analysis
    from polyprof.cli import main

    real = rank_analysis.rows_of_rank

    def slow(connection, path, rank):
        print("query running", flush=True)
        connection.sql("select count(*) from range(1000000000000000)").to_arrow_table()
        return real(connection, path, rank)

    rank_analysis.rows_of_rank = slow
    raise SystemExit(main(sys.argv[1:]))
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM to a process is POSIX's")
# as the query starts, and once it runs in DuckDB's own code (where a Python handler alone never runs)
@pytest.mark.parametrize("delay_s", [0.0, 0.3])
def test_sigterm_during_a_duckdb_query_removes_the_folder_and_exits_143(
    run: Path, private_tmpdir: Path, delay_s: float
) -> None:
    env = {**os.environ, "TMPDIR": str(private_tmpdir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_QUERY, "report", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "query running\n"
        (folder,) = report_folders(private_tmpdir)
        assert (folder / "r0.parquet").exists()
        time.sleep(delay_s)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)  # a query DuckDB was not told to stop runs for years
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert out == "" and "Traceback" not in err
    assert report_folders(private_tmpdir) == []


def open_files() -> list[str]:
    """The paths this process has open (Linux's /proc)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the fd listdir itself used is closed by now
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
    return targets


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd to see open files")
def test_the_folder_is_removed_after_its_lock_file_is_closed(
    private_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows deletes no open file: a lock file still open when its folder is removed keeps both."""
    open_at_removal: list[list[str]] = []
    real_rmtree = shutil.rmtree

    def rmtree(path: str, *args: Any, **kwargs: Any) -> None:
        open_at_removal.append(open_files())
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with temporary_parquet_dir() as folder:
        assert [f for f in open_files() if f.startswith(folder)]  # the lock file, held while it runs
    (at_removal,) = open_at_removal
    assert not [f for f in at_removal if f.startswith(folder)]
    assert report_folders(private_tmpdir) == []


@pytest.mark.parametrize("command", ["report", "merge"])
def test_the_folder_of_a_command_killed_by_sigkill_goes_at_the_next_run(
    run: Path, private_tmpdir: Path, capsys, command: str
) -> None:
    proc = start_slow(command, run, private_tmpdir)
    proc.kill()
    proc.wait()
    (left,) = report_folders(private_tmpdir)
    not_ours = private_tmpdir / f"polyprof-report-{fileio.host_tag()}-1-x"  # no lock file in it
    not_ours.mkdir()
    assert cli_main(["report", str(run)]) == 0
    assert report_folders(private_tmpdir) == [not_ours] and not left.exists()


def test_a_folder_left_without_its_lock_file_goes_after_an_hour(private_tmpdir: Path, capsys) -> None:
    """A command killed between making its folder and its lock file leaves a folder with no lock."""
    fresh = private_tmpdir / f"polyprof-report-{fileio.host_tag()}-1-fresh"
    old = private_tmpdir / f"polyprof-report-{fileio.host_tag()}-1-old"
    for folder in (fresh, old):
        folder.mkdir()
        (folder / ".polyprof-lock.new").write_text("")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    with temporary_parquet_dir():
        pass
    assert report_folders(private_tmpdir) == [fresh]


def test_without_file_locks_a_folder_is_made_and_removed_without_a_lock_file(
    private_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows: no flock, and no rename of an open file; the folder is still made and removed."""
    monkeypatch.setattr(rank_set, "fcntl", None)
    with temporary_parquet_dir() as folder:
        assert os.listdir(folder) == []
    assert report_folders(private_tmpdir) == []


# ------------------------------------------------------------ item 7: convert's names escaped


def test_convert_escapes_file_names_and_trace_keys(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "traces"
    write_json(folder / "ok.json", rank_doc(0))
    (folder / "\x1b[31mred.json").write_text("{")
    (folder / "keys\x07.json").write_text(json.dumps({"\x1b]0;owned\x07": 1}))
    assert cli_main(["convert", str(folder), "-o", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert "\\x1b[31mred.json" in err and "\\x07" in err
    assert cli_main(["convert", str(folder / "keys\x07.json"), str(tmp_path / "one.parquet")]) == 1
    out2, err2 = capsys.readouterr()
    assert "\\x1b]0;owned\\x07" in err2
    for text in (out, err, out2, err2):
        assert not RAW_CONTROLS.search(text), text


# --------------------------------------------------------------- item 9: messages that mislead


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1", "distributedInfo.rank is '1' (a str), not an integer"),
        (1.0, "distributedInfo.rank is 1.0 (a float), not an integer"),
        (-1, "distributedInfo.rank is -1, not a rank (0 or more)"),
    ],
)
def test_a_rank_that_is_not_an_integer_is_named_as_such(run: Path, capsys, value: Any, reason: str) -> None:
    bad = write_json(run / "r9.json", rank_doc(value))
    assert cli_main(["report", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"skipped {bad}: {reason}" in err and "has no distributedInfo" not in err


def test_a_symlink_loop_is_named_as_one(run: Path, capsys) -> None:
    (run / "a.json").symlink_to("b.json")
    (run / "b.json").symlink_to("a.json")
    (run / "c.json").symlink_to("nowhere.json")
    assert cli_main(["report", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"skipped {run / 'a.json'}: a symbolic link loop" in err
    assert f"skipped {run / 'c.json'}: a broken symbolic link" in err


def test_the_reasons_name_the_users_trace_never_its_parquet_copy(
    run: Path, private_tmpdir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from polyprof.ranks import rank_set

    real = rank_set.write_parquet_table

    def damaged_copy(table: Any, target: str, **options: Any) -> str:
        real(table, target, **options)
        if target.endswith("r1.parquet"):
            Path(target).write_bytes(b"PAR1 a copy damaged on disk PAR1")
        return target

    monkeypatch.setattr(rank_set, "write_parquet_table", damaged_copy)
    assert cli_main(["report", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"skipped {run / 'r1.json'}: not a readable polyprof Parquet trace" in err
    assert str(private_tmpdir) not in err


# -------------------------------------------------------------- item 11: the command line


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "{run}", "-o", "{tmp}/missing/report.txt", "--parquet-dir", "{tmp}/pq"],
        ["merge", "{run}", "-o", "{tmp}/missing/merged.json", "--parquet-dir", "{tmp}/pq"],
        ["convert", "{run}/r0.json", "{tmp}/missing/r0.parquet"],
        ["convert", "{run}", "-o", "{tmp}/file"],
    ],
    ids=lambda argv: " ".join(argv[:2] + argv[-1:]),
)
def test_an_unusable_output_exits_2_before_any_work(
    run: Path, tmp_path: Path, capsys, argv: list[str]
) -> None:
    (tmp_path / "file").write_text("not a directory")
    argv = [a.format(run=run, tmp=tmp_path) for a in argv]
    assert cli_main(argv) == 2
    assert_one_clear_line(capsys.readouterr().err, argv[0])
    assert not (tmp_path / "pq").exists()  # nothing was converted


def test_kinetos_global_lane_is_named_and_one_rank_is_one_rank(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "run"
    write_json(folder / "r0.json", rank_doc(0, world_size=1))
    out = tmp_path / "merged.json"
    assert cli_main(["merge", str(folder), "-o", str(out)]) == 0
    assert "polyprof merge: 1 rank, " in capsys.readouterr().err
    names = [
        e["args"]["name"]
        for e in json.loads(out.read_text())["traceEvents"]
        if e.get("name") == "process_name"
    ]
    assert "rank 0: global" in names and not any(n.endswith(": process ") for n in names)


def test_report_names_each_skipped_trace_once(run: Path, capsys) -> None:
    bad = write_json(run / "r9.json", {"traceEvents": {}})
    assert cli_main(["report", str(run)]) == 0
    out, err = capsys.readouterr()
    assert f"skipped {bad}" in err and f"skipped {bad}" not in out


def test_a_merged_trace_among_the_rank_traces_is_named_as_one(run: Path, tmp_path: Path, capsys) -> None:
    merged = tmp_path / "merged.json"
    assert cli_main(["merge", str(run), "-o", str(merged)]) == 0
    os.replace(merged, run / "merged.json")
    capsys.readouterr()
    assert cli_main(["report", str(run), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [r["rank"] for r in json.loads(out)["ranks"]] == [0, 1]
    assert f"skipped {run / 'merged.json'}: a trace `polyprof merge` wrote, holding several ranks" in err
