"""Atomic file writing and early output-path checks (polyprof.fileio)."""

from __future__ import annotations

import gzip
import os
import stat
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyprof.errors import PolyprofError
from polyprof.fileio import (
    OutputDirectoryMissing,
    OutputNotADirectory,
    OutputPathError,
    OutputPathIsDirectory,
    OutputPermissionError,
    atomic_writer,
    check_writable_path,
    is_gzip_path,
)



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
        assert len(names) == 1 and names[0].startswith(".trace.json.") and names[0].endswith(".tmp")
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


@settings(max_examples=40, deadline=None)
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
