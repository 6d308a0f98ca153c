"""polyprof.base._memory: freed heap pages go back to the OS after large decodes."""

from __future__ import annotations

import platform
import sys
import threading
from types import SimpleNamespace

import pytest

from polyprof.base._memory import release_free_heap, release_free_heap_in_background


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="needs glibc's malloc_trim",
)
def test_trim_returns_freed_small_objects_to_the_os():
    release_free_heap()
    before = _rss_kb()
    # ~120 MB of malloc'd objects (over pymalloc's 512-byte limit), as decoding torch's result
    # makes; a few stay alive in between and at the end, so glibc cannot shrink the heap by itself.
    garbage = [bytes(600) + bytes([i % 256]) for i in range(200_000)]
    survivors = garbage[::64] + garbage[-1:]
    grown = _rss_kb()
    del garbage
    assert release_free_heap() is True
    after = _rss_kb()
    assert grown - before > 50_000
    assert after - before < (grown - before) / 2
    assert len(survivors) > 1


def test_the_background_trim_runs_on_its_own_thread(monkeypatch):
    import polyprof.base._memory as memory

    ran = threading.Event()
    calls = []

    def trim(pad: int) -> int:
        calls.append((pad, threading.current_thread().name))
        ran.set()
        return 1

    memory._malloc_trim.cache_clear()
    monkeypatch.setattr(memory, "_malloc_trim", lambda: trim)
    release_free_heap_in_background()
    assert ran.wait(10)
    assert calls == [(0, "polyprof-heap-trim")]


def test_no_op_without_glibc(monkeypatch):
    import polyprof.base._memory as memory

    monkeypatch.setattr(memory.sys, "platform", "darwin")
    memory._malloc_trim.cache_clear()
    try:
        assert release_free_heap() is False
        started = []
        monkeypatch.setattr(memory, "threading", SimpleNamespace(Thread=lambda *a, **k: started.append(k)))
        release_free_heap_in_background()
        assert started == []
    finally:
        memory._malloc_trim.cache_clear()
