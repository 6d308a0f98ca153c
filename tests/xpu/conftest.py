"""Fixtures for polyprof-xpu's tests: the fake PTI and Level Zero libraries, compiled from C here.

``fake_pti.c`` is a stand-in libpti_view that delivers records, laid out as
PTI's C structs, through the plugin's real callbacks; ``fake_ze_loader.c`` is
a stand-in Level Zero loader that the plugin's real probe interrogates (and
that lets the real intel-pti backend load, so its ptiViewGetNextRecord can
walk test buffers). Both are built with gcc into a temporary directory once
per test session; without gcc these tests skip.
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

HERE = Path(__file__).resolve().parent
PTI_DIST = "intel-pti"

#: Device UUIDs the fake loader reports for devices 0 and 1.
UUID0 = bytes([0x86, 0x80, 0] + [0] * 13)
UUID1 = bytes([0x86, 0x80, 1] + [0] * 13)
#: A UUID the fake loader does not list.
UUID_UNKNOWN = bytes([0xAB] * 16)
#: Env vars of the fakes and the plugin that tests set; cleared around each test.
TEST_ENV = (
    "POLYPROF_XPU_PTI_LIBRARY",
    "POLYPROF_XPU_ZE_LOADER",
    "POLYPROF_XPU_BUFFER_BYTES",
    "IPEX_ZE_TRACING",
    "FAKE_ZE_INIT_RESULT",
    "FAKE_ZE_DRIVERS",
    "FAKE_ZE_DEVICES",
    "FAKE_PTI_VERSION",
    "FAKE_PTI_NOT_IMPLEMENTED",
    "FAKE_PTI_ABORT",
    "FAKE_PTI_REFUSE_KIND",
    "FAKE_PTI_CLOCK_OFFSET_NS",
    "FAKE_PTI_REAL_LIBRARY",
    "ZE_ENABLE_TRACING_LAYER",
)


@attrs.frozen
class FakeLibs:
    """Paths of the compiled fakes."""

    pti: str
    #: Directory holding a libze_loader.so.1 with zesInit (a loader >= 1.9).
    ze_dir: str
    #: Directory holding a libze_loader.so.1 without zesInit (like Debian bookworm's 1.8.12).
    ze_old_dir: str

    @property
    def ze_loader(self) -> str:
        return os.path.join(self.ze_dir, "libze_loader.so.1")

    @property
    def ze_old_loader(self) -> str:
        return os.path.join(self.ze_old_dir, "libze_loader.so.1")


def _gcc(args: list[str]) -> None:
    proc = subprocess.run(["gcc", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"gcc {' '.join(args)} failed:\n{proc.stderr}")


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> FakeLibs:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fake PTI and Level Zero libraries")
    out = tmp_path_factory.mktemp("xpu_fakes")
    pti = out / "libpti_view.so"
    ze_dir, ze_old_dir = out / "ze", out / "ze_old"
    ze_dir.mkdir()
    ze_old_dir.mkdir()
    common = ["-shared", "-fPIC", "-O1", "-Wall", "-Werror"]
    _gcc([*common, "-o", str(pti), str(HERE / "fake_pti.c"), "-lpthread", "-ldl"])
    loader = ["-Wl,-soname,libze_loader.so.1", str(HERE / "fake_ze_loader.c")]
    _gcc([*common, "-o", str(ze_dir / "libze_loader.so.1"), *loader])
    _gcc([*common, "-DFAKE_ZE_NO_ZESINIT", "-o", str(ze_old_dir / "libze_loader.so.1"), *loader])
    return FakeLibs(str(pti), str(ze_dir), str(ze_old_dir))


class FakePti:
    """The fake's test-only API, typed."""

    def __init__(self, path: str) -> None:
        lib = self.lib = ctypes.CDLL(path)
        u32, u64, p = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_char_p
        sigs = {
            "fakePtiReset": [],
            "fakePtiAddKernel": [u64, u64, u32, u32, p, u64, u64, p, u64],
            "fakePtiAddMemcpy": [u64, u64, u32, u32, p, u64, u64, u32, u32, u32, u64],
            "fakePtiAddMemcpyP2P": [u64, u64, u32, u32, p, p, u64, u64, u64],
            "fakePtiAddMemfill": [u64, u64, u32, u32, p, u64, u64, u32, u64, u64],
            "fakePtiAddApi": [u32, u64, u64, u32, u32, u32, u32, u32],
            "fakePtiAddSync": [u64, u64, u32, u32, u32, u64, u32, u32],
            "fakePtiAddOverhead": [u64, u64, u32, u32, u64, u64],
            "fakePtiAddExternalCorrelation": [u32, u64, u32],
            "fakePtiEnableAllForBuilding": [],
            "fakePtiDisableAll": [],
            "fakePtiFlushOnThread": [],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int if name == "fakePtiFlushOnThread" else None
        lib.fakePtiCounter.argtypes = [p]
        lib.fakePtiCounter.restype = ctypes.c_long
        lib.fakePtiRecordSize.argtypes = [u32]
        lib.fakePtiRecordSize.restype = ctypes.c_size_t
        lib.fakePtiBuildBuffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.fakePtiBuildBuffer.restype = ctypes.c_size_t
        lib.fakePtiEnabled.argtypes = [u32]
        lib.fakePtiEnabled.restype = ctypes.c_int
        # Kernel names must outlive the records (PTI owns them for the process's life).
        self._names: dict[str, ctypes.Array] = {}

    def name(self, text: str) -> bytes:
        buf = self._names.get(text)
        if buf is None:
            buf = self._names[text] = ctypes.create_string_buffer(text.encode())
        return ctypes.cast(buf, ctypes.c_char_p)  # type: ignore[return-value]

    def counter(self, name: str) -> int:
        return int(self.lib.fakePtiCounter(name.encode()))

    def __getattr__(self, item: str):  # fakePtiAdd... pass-through
        return getattr(self.lib, item)


@pytest.fixture
def xpu_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A clean environment for the plugin's variables; the probe's cache is forgotten before and after."""
    from polyprof_xpu import probe

    for name in TEST_ENV:
        monkeypatch.delenv(name, raising=False)
    probe.clear_cache()
    yield monkeypatch
    probe.clear_cache()


@pytest.fixture
def fake_pti(fake_libs: FakeLibs, xpu_env: pytest.MonkeyPatch) -> Iterator[FakePti]:
    """The plugin pointed at the fakes (a driver and two GPUs), the fake's queue empty."""
    xpu_env.setenv("POLYPROF_XPU_PTI_LIBRARY", fake_libs.pti)
    xpu_env.setenv("POLYPROF_XPU_ZE_LOADER", fake_libs.ze_loader)
    fake = FakePti(fake_libs.pti)
    fake.fakePtiReset()
    yield fake
    fake.fakePtiReset()
    fake.fakePtiDisableAll()


def real_pti_library() -> str | None:
    """The intel-pti wheel's libpti_view.so, or None when intel-pti is not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution(PTI_DIST)
    except PackageNotFoundError:
        return None
    for f in dist.files or ():
        if os.path.basename(str(f)) == "libpti_view.so":
            return os.path.normpath(str(dist.locate_file(f)))
    return None


def real_pti_lib_dir() -> str | None:
    lib = real_pti_library()
    return os.path.dirname(lib) if lib else None


def system_ze_loader() -> str | None:
    """Path of an installed system Level Zero loader (Debian's libze1), or None."""
    for pattern in (
        "/usr/lib/x86_64-linux-gnu/libze_loader.so.1*",
        "/usr/lib64/libze_loader.so.1*",
        "/usr/lib/libze_loader.so.1*",
    ):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def run_python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``env`` added to a copy of this environment."""
    full = {k: v for k, v in os.environ.items() if k not in TEST_ENV}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout, check=False
    )
