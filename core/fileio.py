"""Writing files atomically, and checking an output path before any work is done.

``atomic_writer`` writes to a temporary file in the destination's directory,
fsyncs it and renames it over the destination with ``os.replace``: readers see
either the old file or the complete new one, never a half-written file. On any
exception the temporary file is removed and the destination is left as it was.

``check_writable_path`` fails early with a one-line message naming the path and
the problem, so a profiler can refuse a bad ``export_chrome_trace`` path before
it spends seconds building the trace text.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO, Any

from polyprof._log import get_logger
from polyprof.errors import PolyprofError

log = get_logger(__name__)

#: zlib's own default: a good balance of speed and size for multi-MB traces.
DEFAULT_GZIP_LEVEL = 6

__all__ = [
    "DEFAULT_GZIP_LEVEL",
    "OutputDirectoryMissing",
    "OutputNotADirectory",
    "OutputPathError",
    "OutputPathIsDirectory",
    "OutputPermissionError",
    "atomic_writer",
    "check_writable_path",
    "is_gzip_path",
]


class OutputPathError(PolyprofError, OSError):
    """An output file cannot be written at the given path.

    ``str(err)`` is the whole one-line message; ``err.path`` is the path asked for.
    Each subclass is also the matching builtin (``FileNotFoundError``,
    ``PermissionError``, ...), so ``except OSError`` code keeps working.
    """

    default_errno = 0

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        # Not ``filename``: OSError would then rewrite str() as "[Errno n] ...".
        self.path = path
        self.errno = self.default_errno


class OutputDirectoryMissing(OutputPathError, FileNotFoundError):
    """The directory that should hold the file does not exist."""

    default_errno = errno.ENOENT


class OutputNotADirectory(OutputPathError, NotADirectoryError):
    """A component of the directory part of the path is a file."""

    default_errno = errno.ENOTDIR


class OutputPathIsDirectory(OutputPathError, IsADirectoryError):
    """The path itself names a directory."""

    default_errno = errno.EISDIR


class OutputPermissionError(OutputPathError, PermissionError):
    """The directory exists but this process may not create files in it."""

    default_errno = errno.EACCES


def is_gzip_path(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` asks for gzip compression (it ends in ``.gz``)."""
    return os.fspath(path).lower().endswith(".gz")


def _parent_dir(path: str) -> str:
    return os.path.dirname(path) or os.curdir


def check_writable_path(path: str | os.PathLike[str]) -> str:
    """Check that a file can be created or replaced at ``path``; return it as ``str``.

    Raises an ``OutputPathError`` subclass naming the path and the problem:
    the directory does not exist (``FileNotFoundError``), a parent is not a
    directory (``NotADirectoryError``), the path is a directory
    (``IsADirectoryError``), the directory is not writable (``PermissionError``),
    or the path is a device or pipe (``OutputPathError``).
    """
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"output path must be a str or os.PathLike of str, not {type(path).__name__}")
    if not path:
        raise OutputDirectoryMissing("cannot write to an empty path", path)
    if path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)) or os.path.isdir(path):
        raise OutputPathIsDirectory(f"cannot write {path!r}: path is a directory", path)
    directory = _parent_dir(path)
    if not os.path.exists(directory):
        missing = directory
        # Name the outermost missing directory: that is what the user must create.
        parent = os.path.dirname(missing.rstrip(os.sep))
        while parent and parent != missing and not os.path.exists(parent):
            missing, parent = parent, os.path.dirname(parent.rstrip(os.sep))
        if parent and os.path.exists(parent) and not os.path.isdir(parent):
            raise OutputNotADirectory(f"cannot write {path!r}: {parent!r} is not a directory", path)
        raise OutputDirectoryMissing(f"cannot write {path!r}: directory {missing!r} does not exist", path)
    if not os.path.isdir(directory):
        raise OutputNotADirectory(f"cannot write {path!r}: {directory!r} is not a directory", path)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputPermissionError(
            f"cannot write {path!r}: no write permission for directory {directory!r}", path
        )
    if os.path.exists(path) and not os.path.isfile(path):
        # A device or pipe: replacing it with a regular file would be a surprise, never a trace.
        raise OutputPathError(f"cannot write {path!r}: path exists and is not a regular file", path)
    return path


def _create_temp(directory: str, final_name: str) -> tuple[int, str]:
    """Create a new empty file next to the destination (mode follows the umask)."""
    for _ in range(100):
        temp = os.path.join(directory, f".{final_name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        return fd, temp
    raise FileExistsError(f"could not create a unique temporary file in {directory!r}")


def _fsync_directory(directory: str) -> None:
    """Make the rename durable; not possible (nor needed) on every platform."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _translate_os_error(exc: OSError, path: str) -> OutputPathError | None:
    """Turn a raw error from creating the temp file into our one-line error."""
    directory = _parent_dir(path)
    if isinstance(exc, PermissionError):
        return OutputPermissionError(
            f"cannot write {path!r}: no write permission for directory {directory!r}", path
        )
    if isinstance(exc, FileNotFoundError):
        return OutputDirectoryMissing(f"cannot write {path!r}: directory {directory!r} does not exist", path)
    if exc.errno == errno.EROFS:
        return OutputPermissionError(
            f"cannot write {path!r}: directory {directory!r} is on a read-only file system", path
        )
    return None


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike[str], *, binary: bool = False, gzip_level: int | None = None
) -> Iterator[IO[Any]]:
    """Open ``path`` for writing, atomically.

    Yields a file object (text, UTF-8, ``"\\n"`` line ends, unless ``binary``).
    When ``path`` ends in ``.gz`` what is written is gzip-compressed at
    ``gzip_level`` (default ``DEFAULT_GZIP_LEVEL``). The destination appears, or
    is replaced, only when the ``with`` block ends without an exception; on an
    exception the temporary file is deleted and the exception propagates.
    """
    path = check_writable_path(path)
    if gzip_level is not None and not (isinstance(gzip_level, int) and 0 <= gzip_level <= 9):
        raise ValueError(
            f"gzip_level must be an int from 0 (no compression) to 9 (smallest), not {gzip_level!r}"
        )
    directory = _parent_dir(path)
    try:
        fd, temp = _create_temp(directory, os.path.basename(path))
    except OSError as exc:
        translated = _translate_os_error(exc, path)
        if translated is None:
            raise
        raise translated from exc
    raw = os.fdopen(fd, "wb")
    layers: list[IO[Any]] = []  # outermost first; closed in that order
    committed = False
    try:
        sink: IO[Any] = raw
        if is_gzip_path(path):
            level = DEFAULT_GZIP_LEVEL if gzip_level is None else gzip_level
            # mtime=0 and no embedded name: identical input gives identical bytes.
            sink = gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=raw, mtime=0)
            layers.insert(0, sink)
        if not binary:
            sink = io.TextIOWrapper(sink, encoding="utf-8", newline="\n", write_through=False)
            layers.insert(0, sink)
        yield sink
        for layer in layers:
            if isinstance(layer, io.TextIOWrapper):
                layer.flush()
                layer.detach()  # close() would close the file below it too
            else:
                layer.close()  # GzipFile writes its trailer; it never closes a fileobj it was given
        raw.flush()
        os.fsync(raw.fileno())
        raw.close()
        _keep_mode_of_existing(path, temp)
        os.replace(temp, path)
        committed = True
        _fsync_directory(directory)
    finally:
        if not committed:
            for layer in layers:
                with contextlib.suppress(Exception):
                    layer.close()
            with contextlib.suppress(Exception):
                raw.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)


def _keep_mode_of_existing(path: str, temp: str) -> None:
    """A replaced file keeps its permission bits, as an in-place rewrite would."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.chmod(temp, mode)
