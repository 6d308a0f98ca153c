"""Atomic file writing and early output-path checks (polyprof.base.fileio)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from polyprof.base import fileio
from polyprof.base.errors import PolyprofError
from polyprof.base.fileio import (
    OutputDirectoryMissing,
    OutputNameTooLong,
    OutputNotADirectory,
    OutputPathError,
    OutputPathIsDirectory,
    OutputPermissionError,
    atomic_writer,
    check_writable_path,
    is_gzip_path,
    prepare_output_directory,
)

#: polyprof's temp names: ``.polyprof-<host tag>-<pid>-<random>.tmp``, whatever the final name.
TEMP_NAME = re.compile(r"\.polyprof-[0-9a-f]{8}-[0-9]+-[0-9a-f]{8}\.tmp")


def entries(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# ------------------------------------------------------------ atomic writes


def test_text_write_creates_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    with atomic_writer(target) as f:
        f.write("héllo\n")
        f.write("wörld")
    assert target.read_bytes() == "héllo\nwörld".encode()
    assert entries(tmp_path) == ["out.json"]


def test_binary_write(tmp_path: Path) -> None:
    target = tmp_path / "blob.bin"
    with atomic_writer(str(target), binary=True) as f:
        f.write(b"\x00\x01\xff")
    assert target.read_bytes() == b"\x00\x01\xff"


def test_destination_appears_only_at_the_end_and_temp_is_in_same_directory(tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    with atomic_writer(target) as f:
        f.write("partial")
        f.flush()
        assert not target.exists(), "the destination must not exist while writing"
        names = entries(tmp_path)
        assert len(names) == 1 and TEMP_NAME.fullmatch(names[0])
    assert entries(tmp_path) == ["trace.json"]


def test_gz_path_is_compressed_and_deterministic(tmp_path: Path) -> None:
    text = '{"traceEvents": []}\n' * 100
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    for target in (first, second):
        with atomic_writer(target) as f:
            f.write(text)
    raw = first.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert gzip.decompress(raw).decode() == text
    assert raw == second.read_bytes(), "no timestamp or file name embedded: same input, same bytes"
    assert is_gzip_path("x.JSON.GZ") and not is_gzip_path("x.json")


def test_gzip_level_changes_size_and_bad_level_is_rejected_before_writing(tmp_path: Path) -> None:
    text = "".join(f"line {i} {i * 7919 % 1000}\n" for i in range(20000))
    sizes = {}
    for level in (0, 9):
        target = tmp_path / f"l{level}.txt.gz"
        with atomic_writer(target, gzip_level=level) as f:
            f.write(text)
        sizes[level] = target.stat().st_size
        assert gzip.decompress(target.read_bytes()).decode() == text
    assert sizes[9] < sizes[0] / 3
    with pytest.raises(ValueError, match="gzip_level must be an int from 0"):
        with atomic_writer(tmp_path / "bad.gz", gzip_level=11) as f:
            f.write("x")
    assert not (tmp_path / "bad.gz").exists()


def test_exception_mid_write_keeps_previous_file_and_removes_temp(tmp_path: Path) -> None:
    target = tmp_path / "keep.json"
    target.write_text("previous contents")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_writer(target) as f:
            f.write("new contents that must never be seen")
            raise RuntimeError("boom")
    assert target.read_text() == "previous contents"
    assert entries(tmp_path) == ["keep.json"]


def test_exception_mid_write_of_gz_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "new.json.gz"
    with pytest.raises(KeyboardInterrupt):
        with atomic_writer(target) as f:
            f.write("x" * 100000)
            raise KeyboardInterrupt
    assert entries(tmp_path) == []


def test_replacing_keeps_permission_bits_of_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "mode.txt"
    target.write_text("old")
    os.chmod(target, 0o640)
    with atomic_writer(target) as f:
        f.write("new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_new_file_gets_the_mode_open_would_give(tmp_path: Path) -> None:
    reference = tmp_path / "reference.txt"
    reference.write_text("r")
    target = tmp_path / "new.txt"
    with atomic_writer(target) as f:
        f.write("n")
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(reference.stat().st_mode)


def test_concurrent_writers_never_mix_contents(tmp_path: Path) -> None:
    target = tmp_path / "race.txt"
    payloads = [str(i) * 200_000 for i in range(4)]

    def write(payload: str) -> None:
        for _ in range(3):
            with atomic_writer(target) as f:
                for start in range(0, len(payload), 4096):
                    f.write(payload[start : start + 4096])

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_text() in payloads
    assert entries(tmp_path) == ["race.txt"]


@settings(max_examples=examples(40), deadline=None)
@given(text=st.text(max_size=300), compress=st.booleans())
def test_any_text_round_trips(text: str, compress: bool) -> None:
    with tempfile.TemporaryDirectory() as directory:
        target = os.path.join(directory, "t.txt.gz" if compress else "t.txt")
        with atomic_writer(target) as f:
            f.write(text)
        with open(target, "rb") as f:
            raw = f.read()
        data = gzip.decompress(raw) if compress else raw
        assert data.decode("utf-8") == text
        assert os.listdir(directory) == [os.path.basename(target)]


# ------------------------------------------------------------- path checks


def test_check_returns_str_for_path_like(tmp_path: Path) -> None:
    assert check_writable_path(tmp_path / "a.json") == str(tmp_path / "a.json")


def test_missing_directory_names_the_outermost_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "deeper" / "t.json"
    with pytest.raises(OutputDirectoryMissing) as info:
        check_writable_path(path)
    err = info.value
    assert isinstance(err, FileNotFoundError) and isinstance(err, OutputPathError)
    assert isinstance(err, PolyprofError)
    assert str(err) == f"cannot write {str(path)!r}: directory {str(tmp_path / 'missing')!r} does not exist"
    assert err.path == str(path)
    assert "\n" not in str(err)


def test_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(OutputPathIsDirectory, match="path is a directory") as info:
        check_writable_path(tmp_path)
    assert isinstance(info.value, IsADirectoryError)
    with pytest.raises(OutputPathIsDirectory, match="path is a directory"):
        check_writable_path(str(tmp_path / "sub") + os.sep)


def test_parent_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputNotADirectory, match="is not a directory") as info:
        check_writable_path(tmp_path / "file" / "t.json")
    assert isinstance(info.value, NotADirectoryError)
    with pytest.raises(OutputNotADirectory, match=f"{str(tmp_path / 'file')!r} is not a directory"):
        check_writable_path(tmp_path / "file" / "deeper" / "t.json")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_special_file_is_never_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(OutputPathError, match="path exists and is not a regular file"):
        check_writable_path(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_empty_path_and_wrong_type() -> None:
    with pytest.raises(OutputPathError, match="empty path"):
        check_writable_path("")
    with pytest.raises(TypeError, match="output path must be a str"):
        check_writable_path(b"bytes.json")  # type: ignore[arg-type]


def test_atomic_writer_to_missing_directory_fails_before_the_block_runs(tmp_path: Path) -> None:
    ran = []
    with pytest.raises(OutputDirectoryMissing, match="does not exist"):
        with atomic_writer(tmp_path / "nope" / "t.json") as f:
            ran.append(True)
            f.write("x")
    assert ran == [] and entries(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
@pytest.mark.parametrize("skip_early_check", [False, True], ids=["early-check", "on-create"])
def test_read_only_directory_gives_clear_permission_error_and_no_file(
    skip_early_check: bool, readonly_dir: tuple[str, str], run_unprivileged
) -> None:
    _, readonly = readonly_dir
    target = os.path.join(readonly, "t.json")

    def attempt() -> str:
        real_access = os.access
        if skip_early_check:
            # Let the early check pass, as when permissions change between
            # check and write: creating the temp file fails, and is reported alike.
            os.access = lambda *args, **kwargs: True  # type: ignore[assignment]
        try:
            with atomic_writer(target) as f:
                f.write("x")
        except OutputPermissionError as exc:
            return f"{type(exc).__name__}|{isinstance(exc, PermissionError)}|{exc}"
        finally:
            os.access = real_access  # type: ignore[assignment]
        return "no error"

    result = run_unprivileged(attempt)
    message = f"cannot write {target!r}: no write permission for directory {readonly!r}"
    assert result == f"OutputPermissionError|True|{message}"
    assert os.listdir(readonly) == []


# ------------------------------------------- temp names, long names, leftovers


def name_of_bytes(length: int, suffix: str = ".pt.trace.json") -> str:
    """A file name of ``length`` bytes in UTF-8 with multibyte characters, ending like torch's trace files."""
    stem_bytes = length - len(suffix.encode())
    return "é" * (stem_bytes // 2) + "w" * (stem_bytes % 2) + suffix


@pytest.mark.parametrize("length", [238, 245, 254, 255])
@pytest.mark.parametrize("suffix", [".pt.trace.json", ".pt.trace.json.gz"])
def test_names_up_to_name_max_are_written(tmp_path: Path, length: int, suffix: str) -> None:
    """torch's tensorboard_trace_handler names (worker = host_pid) reach 238-254 bytes on long host names."""
    assert os.pathconf(tmp_path, "PC_NAME_MAX") == 255
    name = name_of_bytes(length, suffix)
    assert len(name.encode()) == length
    with atomic_writer(tmp_path / name) as f:
        [temp] = entries(tmp_path)
        assert TEMP_NAME.fullmatch(temp), "the temp name is short whatever the final name is"
        f.write('{"traceEvents": []}')
    assert entries(tmp_path) == [name]
    raw = (tmp_path / name).read_bytes()
    assert (gzip.decompress(raw) if suffix.endswith(".gz") else raw) == b'{"traceEvents": []}'


def test_a_name_longer_than_name_max_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / name_of_bytes(256)
    with pytest.raises(OutputNameTooLong) as info:
        check_writable_path(path)
    assert isinstance(info.value, OutputPathError) and isinstance(info.value, OSError)
    assert str(info.value) == (
        f"cannot write {str(path)!r}: the file name is 256 bytes long, longer than the 255 bytes "
        "(NAME_MAX) its file system allows"
    )
    with pytest.raises(OutputNameTooLong, match="NAME_MAX"), atomic_writer(path) as f:
        f.write("x")
    assert entries(tmp_path) == []


def write_leftover(directory: Path, *, host_tag: str | None = None, pid: int | None = None) -> Path:
    """A temp file as a writer that died would leave it: polyprof's name, no lock held."""
    name = fileio._temp_name(pid=os.getpid() + 1 if pid is None else pid)
    if host_tag is not None:
        name = re.sub(r"^\.polyprof-[0-9a-f]{8}-", f".polyprof-{host_tag}-", name)
    leftover = directory / name
    leftover.write_bytes(b"x" * 4096)
    return leftover


def test_a_leftover_of_a_writer_that_is_gone_is_removed_by_the_next_write(tmp_path: Path) -> None:
    # The pid in the name may be reused by a live process; only the writer's lock keeps a temp file.
    write_leftover(tmp_path, pid=1)
    write_leftover(tmp_path)
    with atomic_writer(tmp_path / "next.json") as f:
        f.write("{}")
    assert entries(tmp_path) == ["next.json"]


def test_only_polyprof_temp_names_of_this_host_are_ever_removed(tmp_path: Path) -> None:
    keep = [
        ".trace.json.0123456789ab.tmp",  # earlier polyprof versions' pattern: its writers took no lock
        ".polyprof-12345678-1-abcdef01.tmp.bak",
        ".polyprof-xyz-1-abcdef01.tmp",
        "polyprof-12345678-1-abcdef01.tmp",
        "user.tmp",
    ]
    for name in keep:
        (tmp_path / name).write_text("user data")
    other_host = write_leftover(
        tmp_path, host_tag="00000000" if fileio.host_tag() != "00000000" else "11111111"
    )
    directory = tmp_path / fileio._temp_name(pid=1)
    directory.mkdir()
    link = tmp_path / fileio._temp_name(pid=2)
    link.symlink_to(tmp_path / "user.tmp")
    own = tmp_path / fileio._temp_name(pid=os.getpid())  # this process's: only it knows whether it is live
    own.write_text("")
    with atomic_writer(tmp_path / "t.json") as f:
        f.write("{}")
    assert entries(tmp_path) == sorted(
        [*keep, other_host.name, directory.name, link.name, own.name, "t.json"]
    )


def test_a_write_in_progress_keeps_its_temp_while_others_write_alongside(tmp_path: Path) -> None:
    with atomic_writer(tmp_path / "first.json") as first:
        first.write("first")
        with atomic_writer(tmp_path / "second.json") as second:
            second.write("second")
        first.write(" done")
    assert (tmp_path / "first.json").read_text() == "first done"
    assert entries(tmp_path) == ["first.json", "second.json"]


WRITER = """
import sys, time
from polyprof.base.fileio import atomic_writer

with atomic_writer(sys.argv[1]) as f:
    f.write('{"traceEvents": [')
    for i in range(20000):  # about 2 MB, then keep writing slowly until killed or told to finish
        f.write('{"name": "aten::mm", "ph": "X", "ts": %d, "dur": 1, "pid": 1, "tid": 1},' % i)
    f.flush()
    print("writing", flush=True)
    sys.stdin.readline()
    f.write("{}]}")
print("done", flush=True)
"""


def start_writer(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    return proc


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
@pytest.mark.parametrize("signum", ["SIGKILL", "SIGTERM"])
def test_a_killed_writers_temp_file_is_removed_by_the_next_export(tmp_path: Path, signum: str) -> None:
    proc = start_writer(tmp_path / "killed.pt.trace.json")
    proc.send_signal(getattr(signal, signum))
    proc.wait(timeout=30)
    [leftover] = entries(tmp_path)  # no finally runs on SIGKILL, nor on SIGTERM without a handler
    assert TEMP_NAME.fullmatch(leftover) and (tmp_path / leftover).stat().st_size > 1_000_000
    with atomic_writer(tmp_path / "next.pt.trace.json") as f:
        f.write("{}")
    assert entries(tmp_path) == ["next.pt.trace.json"]


@pytest.mark.slow
def test_a_live_writer_in_another_process_keeps_its_temp_file(tmp_path: Path) -> None:
    proc = start_writer(tmp_path / "live.json")
    try:
        with atomic_writer(tmp_path / "other.json") as f:
            f.write("{}")
        [temp] = [name for name in entries(tmp_path) if name != "other.json"]
        assert TEMP_NAME.fullmatch(temp)
    finally:
        out, _ = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0 and out == "done\n"
    assert json.loads((tmp_path / "live.json").read_text())["traceEvents"][-1] == {}
    assert entries(tmp_path) == ["live.json", "other.json"]


# ------------------------------------------------------------ output directories


def test_an_output_directory_is_created_with_its_parents_and_left_empty(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert prepare_output_directory(target) == str(tmp_path / "a")  # the outermost one it made
    assert target.is_dir() and entries(target) == []  # the probe file is gone
    assert prepare_output_directory(str(target)) is None


@pytest.mark.parametrize(
    ("output_dir", "error", "message"),
    [
        (
            "file",
            OutputNotADirectory,
            "cannot use {d!r} as the output directory: it exists and is not a directory",
        ),
        (
            "file/sub",
            OutputNotADirectory,
            "cannot create the output directory {d!r}: {p!r} is not a directory",
        ),
        (
            "file/sub/deeper",
            OutputNotADirectory,
            "cannot create the output directory {d!r}: {p!r} is not a directory",
        ),
        ("", OutputDirectoryMissing, "the output directory is an empty path"),
    ],
)
def test_an_output_directory_that_cannot_be_used(
    tmp_path: Path, output_dir: str, error: type, message: str
) -> None:
    (tmp_path / "file").write_text("user data")
    directory = str(tmp_path / output_dir) if output_dir else ""
    with pytest.raises(error) as info:
        prepare_output_directory(directory)
    assert str(info.value) == message.format(d=directory, p=str(tmp_path / "file"))
    assert info.value.path == directory
    assert (tmp_path / "file").read_text() == "user data"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_an_output_directory_without_write_permission(
    readonly_dir: tuple[str, str], run_unprivileged
) -> None:
    _, readonly = readonly_dir
    below = os.path.join(readonly, "new", "sub")

    def attempt() -> str:
        results = []
        for directory in (readonly, below):
            try:
                prepare_output_directory(directory)
            except OutputPermissionError as exc:
                results.append(str(exc))
        return "\n".join(results)

    assert run_unprivileged(attempt).splitlines() == [
        f"cannot write into the output directory {readonly!r}: no write permission",
        f"cannot create the output directory {below!r}: no write permission for directory {readonly!r}",
    ]
    assert os.listdir(readonly) == []
