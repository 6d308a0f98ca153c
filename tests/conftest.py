"""Fixtures shared by several test files."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

NOBODY_UID = 65534


def _run_unprivileged(fn: Callable[[], str]) -> str:
    """Run ``fn`` where the file system's permissions apply; return its result.

    Root ignores directory permissions, so as root ``fn`` runs in a forked
    child that has switched to the "nobody" user; the result comes back
    through a pipe.
    """
    if os.geteuid() != 0:
        return fn()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(read_end)
            os.setgid(NOBODY_UID)
            os.setuid(NOBODY_UID)
            result = fn()
        except BaseException as exc:  # report anything, never run the parent's code
            result, code = f"child failed: {exc!r}", 1
        with os.fdopen(write_end, "w") as out:
            out.write(result)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as inp:
        result = inp.read()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, result
    return result


@pytest.fixture
def run_unprivileged() -> Callable[[Callable[[], str]], str]:
    """``run_unprivileged(fn)``: ``fn()``'s result, with directory permissions enforced."""
    return _run_unprivileged


@pytest.fixture
def readonly_dir() -> Iterator[tuple[str, str]]:
    """``(parent, readonly)``: a 0o555 directory whose parents an unprivileged user can traverse."""
    parent = tempfile.mkdtemp(prefix="polyprof-ro-", dir="/tmp" if os.path.isdir("/tmp") else None)
    os.chmod(parent, 0o755)
    readonly = os.path.join(parent, "ro")
    os.mkdir(readonly)
    os.chmod(readonly, 0o555)
    try:
        yield parent, readonly
    finally:
        os.chmod(readonly, 0o755)
        shutil.rmtree(parent)
