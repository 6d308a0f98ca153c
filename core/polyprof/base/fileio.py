"""Writing files atomically, and checking an output path before any work is done.

``atomic_writer`` writes to a temporary file in the destination's directory,
fsyncs it and renames it over the destination with ``os.replace``: readers see
either the old file or the complete new one, never a half-written file. On any
exception the temporary file is removed and the destination is left as it was.

``check_writable_path`` fails early with a one-line message naming the path and
the problem, so a profiler can refuse a bad ``export_chrome_trace`` path before
it spends seconds building the trace text; ``prepare_output_directory`` does the
same for a directory that traces will be written into later.

Temporary files are named ``.polyprof-<host tag>-<pid>-<random>.tmp``, about 40
bytes whatever the final name, so every name that fits the file system's
``NAME_MAX`` can be written (torch's trace names reach 254 bytes). A writer
holds an ``flock`` on its temporary file until the rename; a writer killed
mid-write (SIGKILL, or SIGTERM without a handler, where no ``finally`` runs)
leaves the file unlocked, and the next write into that directory removes it.
The pid in the name may be reused, so only the lock says whether a writer is
alive; the host tag keeps one machine from judging another's files on a shared
file system whose locks may be local.

A write can be cancelled from another thread: ``cancellable_writes(cancellation)``
puts the ``atomic_writer`` calls made under it (in that thread or context) under
a ``WriteCancellation``. Once ``cancel()`` returns, none of them renames into
place any more: each raises ``WriteCancelled`` at its next write to the disk or
before its rename, and removes its temporary file. ``polyprof.runtime.exporting`` uses
it to stop an export on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import gzip
import io
import os
import re
import secrets
import socket
import stat
import threading
import zlib
from collections.abc import Iterable, Iterator
from typing import IO, Any, cast

import attrs

from polyprof.base.errors import PolyprofError
from polyprof.base.log import get_logger

try:
    import fcntl
except ImportError:  # Windows: an open file cannot be deleted there, but no lock tells a live writer apart
    fcntl = None  # type: ignore[assignment]

log = get_logger(__name__)

#: zlib's own default: a good balance of speed and size for multi-MB traces.
DEFAULT_GZIP_LEVEL = 6

__all__ = [
    "DEFAULT_GZIP_LEVEL",
    "OutputDirectoryMissing",
    "OutputNameTooLong",
    "OutputNotADirectory",
    "OutputPathError",
    "OutputPathIsDirectory",
    "OutputPermissionError",
    "WriteCancellation",
    "WriteCancelled",
    "atomic_writer",
    "cancellable_writes",
    "check_writable_path",
    "file_ids",
    "host_tag",
    "is_gzip_path",
    "prepare_output_directory",
]

#: Names of polyprof's temporary files; nothing else is ever removed as a leftover.
_TEMP_NAME = re.compile(r"\.polyprof-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)-[0-9a-f]{8}\.tmp")


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


class OutputNameTooLong(OutputPathError):
    """The file name is longer than the file system allows (``NAME_MAX`` bytes)."""

    default_errno = errno.ENAMETOOLONG


class WriteCancelled(BaseException):
    """An atomic write was stopped by its ``WriteCancellation``; its temporary file is removed.

    A ``BaseException``, as ``asyncio.CancelledError`` is: an exporter's ``except Exception``
    must not turn a cancelled write into a finished one.
    """


@attrs.define(eq=False)
class WriteCancellation:
    """A switch that stops the atomic writes started under it (``cancellable_writes``).

    ``cancel()`` and each write's rename take the same lock, so after ``cancel()`` returns
    no write under it renames into place: it has either done so already or never will.
    ``cancel()`` sets its flag before it waits for that lock: an interrupt that ends the wait
    (a second Ctrl-C) leaves the write cancelled all the same.
    """

    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _cancelled: bool = attrs.field(default=False, init=False)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        self._cancelled = True  # first, and without blocking: no write checks in after this
        with self._lock:  # a rename already under way ends before this returns
            pass

    def check(self) -> None:
        """Raise ``WriteCancelled`` once cancelled."""
        if self._cancelled:
            raise WriteCancelled("the write was cancelled")

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """Hold off ``cancel()`` while a finished write is renamed into place; raise if it came first."""
        with self._lock:
            self.check()
            yield


_cancellation: contextvars.ContextVar[WriteCancellation | None] = contextvars.ContextVar(
    "polyprof_write_cancellation", default=None
)


@contextlib.contextmanager
def cancellable_writes(cancellation: WriteCancellation) -> Iterator[None]:
    """Put every ``atomic_writer`` started in this block (this context) under ``cancellation``."""
    token = _cancellation.set(cancellation)
    try:
        yield
    finally:
        _cancellation.reset(token)


class _CheckedFileIO(io.FileIO):
    """A temporary file whose every write to the disk first asks whether the write was cancelled.

    The lowest layer: what the buffering and gzip layers above hand down comes through here.
    """

    cancellation: WriteCancellation | None = None

    def write(self, data: Any, /) -> int:
        if self.cancellation is not None:
            self.cancellation.check()
        return super().write(data)


def is_gzip_path(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` asks for gzip compression (it ends in ``.gz``)."""
    return os.fspath(path).lower().endswith(".gz")


def file_ids(paths: Iterable[str]) -> set[tuple[int, int]]:
    """The (device, inode) of each path that exists, links followed: the same file by any name.

    An output whose id is among its inputs' would be written over one of them."""
    ids = set()
    for path in paths:
        try:
            seen = os.stat(path)
        except (OSError, ValueError):  # missing, unreadable, or a name with a NUL byte
            continue
        ids.add((seen.st_dev, seen.st_ino))
    return ids


def _parent_dir(path: str) -> str:
    return os.path.dirname(path) or os.curdir


def check_writable_path(path: str | os.PathLike[str]) -> str:
    """Check that a file can be created or replaced at ``path``; return it as ``str``.

    Raises an ``OutputPathError`` subclass naming the path and the problem:
    the directory does not exist (``FileNotFoundError``), a parent is not a
    directory (``NotADirectoryError``), the path is a directory
    (``IsADirectoryError``), the file name is longer than the file system's
    ``NAME_MAX`` (``OutputNameTooLong``), the directory is not writable
    (``PermissionError``), or the path is a device or pipe (``OutputPathError``).
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
    name_bytes, name_max = len(os.fsencode(os.path.basename(path))), _name_max(directory)
    if name_max is not None and name_bytes > name_max:
        raise OutputNameTooLong(
            f"cannot write {path!r}: the file name is {name_bytes} bytes long, longer than the "
            f"{name_max} bytes (NAME_MAX) its file system allows",
            path,
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputPermissionError(
            f"cannot write {path!r}: no write permission for directory {directory!r}", path
        )
    if os.path.exists(path) and not os.path.isfile(path):
        # A device or pipe: replacing it with a regular file would be a surprise, never a trace.
        raise OutputPathError(f"cannot write {path!r}: path exists and is not a regular file", path)
    return path


def _name_max(directory: str) -> int | None:
    """The longest file name, in bytes, that ``directory``'s file system takes; None when it does not say."""
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (AttributeError, ValueError, OSError):  # no pathconf (Windows), or not known for this file system
        return None
    return limit if limit > 0 else None


def prepare_output_directory(path: str | os.PathLike[str]) -> str | None:
    """Make sure files can be created in the directory ``path``, creating it and its parents if needed.

    Returns the outermost directory this call created (``path`` or a parent of it,
    so that a caller can remove what it made for nothing), or None. Raises an
    ``OutputPathError`` subclass naming the directory and the problem: it exists
    and is not a directory, or a parent is not (``NotADirectoryError``), it cannot
    be created or written into (``PermissionError``, also for a read-only file
    system). Writing is tried with a temporary file, removed at once: permission
    bits do not tell for root, ACLs or read-only mounts.
    """
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"output directory must be a str or os.PathLike of str, not {type(path).__name__}")
    if not path:
        raise OutputDirectoryMissing("the output directory is an empty path", path)
    created = None
    if not os.path.isdir(path):
        if os.path.lexists(path):
            raise OutputNotADirectory(
                f"cannot use {path!r} as the output directory: it exists and is not a directory", path
            )
        ancestor, outermost_missing = _nearest_existing_ancestor(path)
        cannot_create = f"cannot create the output directory {path!r}"
        if not os.path.isdir(ancestor):
            raise OutputNotADirectory(f"{cannot_create}: {ancestor!r} is not a directory", path)
        try:
            os.makedirs(path, exist_ok=True)
        except PermissionError as exc:
            raise OutputPermissionError(
                f"{cannot_create}: no write permission for directory {ancestor!r}", path
            ) from exc
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise OutputPermissionError(
                    f"{cannot_create}: {ancestor!r} is on a read-only file system", path
                ) from exc
            raise OutputPathError(f"{cannot_create}: {exc.strerror or exc}", path) from exc
        created = outermost_missing
    cannot_write = f"cannot write into the output directory {path!r}"
    try:
        fd, probe = _create_temp(path)
    except PermissionError as exc:
        raise OutputPermissionError(f"{cannot_write}: no write permission", path) from exc
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise OutputPermissionError(f"{cannot_write}: it is on a read-only file system", path) from exc
        raise OutputPathError(f"{cannot_write}: {exc.strerror or exc}", path) from exc
    try:
        os.unlink(probe)
    finally:
        os.close(fd)
    return created


def _nearest_existing_ancestor(path: str) -> tuple[str, str]:
    """The closest parent of the missing ``path`` that exists, and its child on the way to ``path``.

    ``os.makedirs`` creates the directories from that child down.
    """
    missing = path
    while True:
        parent = os.path.dirname(missing.rstrip(os.sep)) or os.curdir
        if parent == missing or os.path.lexists(parent):
            return parent, missing
        missing = parent


# ------------------------------------------------------------ temporary files


@functools.cache
def host_tag() -> str:
    """8 hex digits naming this machine in temporary file names (pids mean nothing elsewhere)."""
    return f"{zlib.crc32(socket.gethostname().encode('utf-8', 'surrogateescape')):08x}"


def _temp_name(pid: int | None = None) -> str:
    """A fresh temporary file name, short whatever the destination's name is."""
    return f".polyprof-{host_tag()}-{os.getpid() if pid is None else pid}-{secrets.token_hex(4)}.tmp"


def _create_temp(directory: str) -> tuple[int, str]:
    """Create a new empty file in ``directory``, locked while it is written (mode follows the umask)."""
    for _ in range(100):
        temp = os.path.join(directory, _temp_name())
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        if _lock_new_temp(fd, temp):
            return fd, temp
        os.close(fd)  # another process's sweep took it before the lock and removes it: take another name
    raise FileExistsError(f"could not create a unique temporary file in {directory!r}")


def _lock_new_temp(fd: int, temp: str) -> bool:
    """Lock a just-created temporary file; False if a sweep of leftovers got to it first."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # no locks on this file system: no sweep can lock it either, so none removes it
    try:
        # A sweep may have locked, removed and released it between our open and our lock.
        return os.path.samestat(os.fstat(fd), os.lstat(temp))
    except FileNotFoundError:
        return False


def _remove_leftover_temps(directory: str) -> None:
    """Remove temporary files that writers killed mid-write left in ``directory``.

    Only names of polyprof's pattern made on this host by another process are
    considered, and only unlocked ones (their writer is gone) are removed. This
    process's own are left alone: on file systems that emulate ``flock`` with
    per-process locks (NFS) its threads' locks would not exclude each other.
    Never raises: a leftover that cannot be judged or removed stays.
    """
    if fcntl is None:
        return
    try:
        with os.scandir(directory) as scan:
            names = [entry.name for entry in scan if entry.name.startswith(".polyprof-")]
    except OSError:
        return
    host, own_pid = host_tag(), os.getpid()
    for name in names:
        match = _TEMP_NAME.fullmatch(name)
        if match is not None and match["host"] == host and int(match["pid"]) != own_pid:
            _remove_if_abandoned(os.path.join(directory, name))


def _remove_if_abandoned(temp: str) -> None:
    """Remove ``temp`` if it is this user's regular file and no writer holds its lock."""
    try:
        seen = os.lstat(temp)
        if not stat.S_ISREG(seen.st_mode) or (hasattr(os, "geteuid") and seen.st_uid != os.geteuid()):
            return
        fd = os.open(temp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return
    try:
        if not os.path.samestat(os.fstat(fd), seen):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # a live writer holds it, or locks do not work here
        if os.path.samestat(os.fstat(fd), os.lstat(temp)):  # still the file we locked
            os.unlink(temp)
            log.info("removed_leftover_temp_file", path=temp, size=seen.st_size)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    if exc.errno == errno.ENAMETOOLONG:
        return OutputNameTooLong(f"cannot write {path!r}: the path is too long for its file system", path)
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
    exception (``KeyboardInterrupt`` included) the temporary file is deleted and
    the exception propagates. Leftovers of killed writers in the destination's
    directory are removed first. Under ``cancellable_writes`` a cancelled write
    raises ``WriteCancelled`` at its next write to the disk or before its rename.
    """
    path = check_writable_path(path)
    if gzip_level is not None and not (isinstance(gzip_level, int) and 0 <= gzip_level <= 9):
        raise ValueError(
            f"gzip_level must be an int from 0 (no compression) to 9 (smallest), not {gzip_level!r}"
        )
    cancellation = _cancellation.get()
    if cancellation is not None:
        cancellation.check()
    directory = _parent_dir(path)
    _remove_leftover_temps(directory)
    try:
        fd, temp = _create_temp(directory)
    except OSError as exc:
        translated = _translate_os_error(exc, path)
        if translated is None:
            raise
        raise translated from exc
    disk = _CheckedFileIO(fd, "wb")
    disk.cancellation = cancellation
    raw = io.BufferedWriter(disk)
    layers: list[IO[Any]] = []  # outermost first; closed in that order
    committed = False
    try:
        sink: IO[Any] = raw
        if is_gzip_path(path):
            level = DEFAULT_GZIP_LEVEL if gzip_level is None else gzip_level
            # mtime=0 and no embedded name: identical input gives identical bytes.
            compressed = gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=raw, mtime=0)
            sink = cast(IO[Any], compressed)
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
        _keep_mode_of_existing(path, temp)
        if fcntl is None:
            raw.close()  # Windows renames no open file; there is no lock to keep
        # The lock is held through the rename: a sweep must never take a finished temp file for a leftover.
        with contextlib.nullcontext() if cancellation is None else cancellation.committing():
            os.replace(temp, path)
            committed = True
        raw.close()
        _fsync_directory(directory)
    finally:
        if not committed:
            disk.cancellation = None  # closing flushes what is buffered: into the file about to go
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
