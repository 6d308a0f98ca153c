"""Is XPU tracing possible here? Found out without letting PTI abort the process.

With a Level Zero loader that PTI can use but no GPU driver, PTI's first view
call (even ``ptiViewGetTimestamp``) calls ``abort()`` (reference: xpu.md §0.2).
So the checks run in a child process (``python -m polyprof_xpu.probe``) whose
death is only a finding, in this order, each naming the first thing missing:

1. the libpti_view library (``POLYPROF_XPU_PTI_LIBRARY``, the ``intel-pti``
   distribution, ``sys.prefix/lib``, the system) and its version (>= 0.11);
2. the Level Zero loader (``POLYPROF_XPU_ZE_LOADER``, else ``libze_loader.so.1``)
   and its ``zesInit`` (loaders >= 1.9; PTI 1.x needs it);
3. whether PTI's backend loads: ``ptiViewGetApiIdName`` (safe without a driver)
   returns NOT_IMPLEMENTED when it does not; the usual cause in a virtual
   environment is ``libxptifw.so`` off the library path (xpu.md §0.4);
4. ``zeInit`` succeeds, ``zeDriverGet`` finds a driver, ``zeDeviceGet`` a GPU;
5. only then the real PTI view calls (set callbacks, enable, disable, flush).

This module uses only the standard library: the child imports nothing else.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import json
import os
import subprocess
import sys
import threading
from typing import Any

PTI_LIBRARY_ENV = "POLYPROF_XPU_PTI_LIBRARY"
ZE_LOADER_ENV = "POLYPROF_XPU_ZE_LOADER"
DEFAULT_ZE_LOADER = "libze_loader.so.1"
MIN_PTI_VERSION = (0, 11)
ZE_RESULT_ERROR_UNINITIALIZED = 0x78000001
ZE_DEVICE_TYPE_GPU = 1
ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x3
PROBE_TIMEOUT_S = 60.0


class PtiVersion(ctypes.Structure):
    """``pti_version``, returned by value from ``ptiVersion()``."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]


class ZeDeviceProperties(ctypes.Structure):
    """``ze_device_properties_t`` (ze_api.h, 1.x)."""

    _fields_ = [
        ("stype", ctypes.c_uint32),
        ("pNext", ctypes.c_void_p),
        ("type", ctypes.c_uint32),
        ("vendorId", ctypes.c_uint32),
        ("deviceId", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("subdeviceId", ctypes.c_uint32),
        ("coreClockRate", ctypes.c_uint32),
        ("maxMemAllocSize", ctypes.c_uint64),
        ("maxHardwareContexts", ctypes.c_uint32),
        ("maxCommandQueuePriority", ctypes.c_uint32),
        ("numThreadsPerEU", ctypes.c_uint32),
        ("physicalEUSimdWidth", ctypes.c_uint32),
        ("numEUsPerSubslice", ctypes.c_uint32),
        ("numSubslicesPerSlice", ctypes.c_uint32),
        ("numSlices", ctypes.c_uint32),
        ("timerResolution", ctypes.c_uint64),
        ("timestampValidBits", ctypes.c_uint32),
        ("kernelTimestampValidBits", ctypes.c_uint32),
        ("uuid", ctypes.c_uint8 * 16),
        ("name", ctypes.c_char * 256),
    ]


def _finding(code: str, reason: str | None, **facts: Any) -> dict[str, Any]:
    return {"available": code == "ok", "code": code, "reason": reason, **facts}


def candidate_pti_libraries() -> tuple[list[str], str | None]:
    """Paths to try for libpti_view, best first, and an error when the override is wrong."""
    override = os.environ.get(PTI_LIBRARY_ENV)
    if override:
        if not os.path.isfile(override):
            return [], f"{PTI_LIBRARY_ENV}={override!r} is not a file; point it at a libpti_view.so"
        return [override], None
    found: list[str] = []
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            dist = distribution("intel-pti")
            for f in dist.files or ():
                if os.path.basename(str(f)).startswith("libpti_view.so"):
                    found.append(os.path.normpath(str(dist.locate_file(f))))
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover - stdlib on 3.8+
        pass
    # Unversioned name first: the soname changes with every PTI release.
    found.sort(key=lambda p: (os.path.basename(p) != "libpti_view.so", p))
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        found.extend(sorted(glob.glob(os.path.join(prefix, "lib", "libpti_view.so*"))))
    system = ctypes.util.find_library("pti_view")
    if system:
        found.append(system)
    return [p for p in dict.fromkeys(found) if os.path.exists(p) or "/" not in p], None


def _loaded_path(fragment: str) -> str | None:
    """Real path of a mapped library whose file name contains ``fragment``."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if fragment in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


def _bind(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


def _venv_hint(pti_path: str) -> str | None:
    """Why PTI's backend may not load in a virtual environment (xpu.md §0.4), or None."""
    lib_dir = os.path.dirname(os.path.realpath(pti_path))
    if not glob.glob(os.path.join(lib_dir, "libxptifw.so*")):
        return None
    try:
        ctypes.CDLL("libxptifw.so")
        return None  # findable by name: the library path is fine
    except OSError:
        return (
            f"library not found in a virtual environment: PTI's backend needs 'libxptifw.so', which pip put in "
            f"{lib_dir} but which is not on the library search path; start Python with "
            f"LD_LIBRARY_PATH={lib_dir}:$LD_LIBRARY_PATH"
        )


def check(view_calls: bool = True) -> dict[str, Any]:
    """Run the checks in this process and return the finding (see the module docstring).

    ``view_calls`` adds step 5, which may abort the process on a broken
    install: call it with True only in a child process.
    """
    candidates, error = candidate_pti_libraries()
    if error:
        return _finding("no_pti", error)
    if not candidates:
        return _finding(
            "no_pti",
            "Intel PTI (libpti_view) not found: pip install intel-pti, or set "
            f"{PTI_LIBRARY_ENV} to a libpti_view.so",
        )
    pti = None
    failures = []
    for path in candidates:
        try:
            pti = ctypes.CDLL(path)
            pti_path = path
            break
        except OSError as exc:
            failures.append(str(exc))
    if pti is None:
        return _finding("no_pti", f"cannot load Intel PTI: {'; '.join(failures)}")
    facts: dict[str, Any] = {"pti_library": pti_path}
    try:
        version = _bind(pti, "ptiVersion", PtiVersion)()
    except AttributeError:
        return _finding("old_pti", f"{pti_path} has no ptiVersion(); polyprof-xpu needs PTI >= 0.11", **facts)
    facts["pti_version"] = f"{version.major}.{version.minor}.{version.patch}"
    if (version.major, version.minor) < MIN_PTI_VERSION:
        return _finding(
            "old_pti",
            f"Intel PTI {facts['pti_version']} is too old: polyprof-xpu reads PTI >= 0.11 records "
            "(pip install -U intel-pti)",
            **facts,
        )

    loader_name = os.environ.get(ZE_LOADER_ENV) or DEFAULT_ZE_LOADER
    try:
        ze = ctypes.CDLL(loader_name)
    except OSError as exc:
        return _finding(
            "no_loader",
            f"no Level Zero loader: cannot load {loader_name} ({exc}); install the Intel GPU driver "
            "packages (level-zero / libze1, intel-level-zero-gpu)",
            **facts,
        )
    facts["ze_loader"] = _loaded_path("libze_loader") or loader_name
    if not hasattr(ze, "zesInit"):
        return _finding(
            "loader_without_zesinit",
            f"PTI not implemented for this loader: {facts['ze_loader']} has no zesInit (Level Zero loader "
            f"< 1.9); Intel PTI {facts['pti_version']} needs a loader >= 1.9 (install a newer level-zero)",
            **facts,
        )

    name = ctypes.c_char_p()
    get_name = _bind(
        pti,
        "ptiViewGetApiIdName",
        ctypes.c_uint32,
        ctypes.c_uint32,
        ctypes.c_uint32,
        ctypes.POINTER(ctypes.c_char_p),
    )
    rc = get_name(1, 0, ctypes.byref(name))
    if rc == 2:
        hint = _venv_hint(pti_path)
        if hint:
            return _finding("venv_library_path", hint, **facts)
        return _finding(
            "pti_not_implemented",
            f"PTI not implemented for this loader: Intel PTI {facts['pti_version']} returns "
            "PTI_ERROR_NOT_IMPLEMENTED (2); its backend libpti.so did not load (run with LD_DEBUG=libs to see why)",
            **facts,
        )

    ze_init = _bind(ze, "zeInit", ctypes.c_uint32, ctypes.c_uint32)
    rc = ze_init(0)
    if rc != 0:
        return _finding(
            "no_driver",
            f"no Level Zero driver: zeInit returned {rc:#x}"
            + (" (ZE_RESULT_ERROR_UNINITIALIZED)" if rc == ZE_RESULT_ERROR_UNINITIALIZED else "")
            + "; install the Intel GPU driver, and in a container pass /dev/dri",
            **facts,
        )
    driver_get = _bind(ze, "zeDriverGet", ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p)
    count = ctypes.c_uint32(0)
    rc = driver_get(ctypes.byref(count), None)
    if rc != 0 or count.value == 0:
        return _finding(
            "no_driver", f"no Level Zero driver: zeDriverGet found {count.value} (result {rc:#x})", **facts
        )
    drivers = (ctypes.c_void_p * count.value)()
    driver_get(ctypes.byref(count), drivers)
    device_get = _bind(
        ze, "zeDeviceGet", ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p
    )
    get_props = _bind(
        ze, "zeDeviceGetProperties", ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(ZeDeviceProperties)
    )
    devices = []
    for driver in drivers:
        n = ctypes.c_uint32(0)
        if device_get(driver, ctypes.byref(n), None) != 0 or n.value == 0:
            continue
        handles = (ctypes.c_void_p * n.value)()
        device_get(driver, ctypes.byref(n), handles)
        for handle in handles[: n.value]:
            props = ZeDeviceProperties(stype=ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES)
            if get_props(handle, ctypes.byref(props)) != 0 or props.type != ZE_DEVICE_TYPE_GPU:
                continue
            devices.append(
                {
                    "index": len(devices),
                    "name": props.name.decode("utf-8", "replace"),
                    "uuid": bytes(props.uuid).hex(),
                    "vendor_id": props.vendorId,
                    "device_id": props.deviceId,
                    "max_mem_alloc_size": props.maxMemAllocSize,
                    "core_clock_mhz": props.coreClockRate,
                }
            )
    facts["devices"] = devices
    if not devices:
        return _finding(
            "no_device", f"no Intel GPU device: Level Zero has {count.value} driver(s) but no GPU", **facts
        )
    if view_calls:
        problem = _view_calls(pti)
        if problem:
            return _finding("pti_error", problem, **facts)
    return _finding("ok", None, **facts)


_RESULT_NAMES = {
    2: "PTI_ERROR_NOT_IMPLEMENTED",
    3: "PTI_ERROR_BAD_ARGUMENT",
    4: "PTI_ERROR_NO_CALLBACKS_SET",
    50: "PTI_ERROR_DRIVER",
    51: "PTI_ERROR_TRACING_NOT_INITIALIZED",
    52: "PTI_ERROR_L0_LOCAL_PROFILING_NOT_SUPPORTED",
    200: "PTI_ERROR_INTERNAL",
}


def _result_text(code: int) -> str:
    return f"{_RESULT_NAMES.get(code, 'pti_result')} ({code})"


def _view_calls(pti: ctypes.CDLL) -> str | None:
    """Set callbacks, enable and disable the kernel view, flush: the calls that abort on a broken setup."""
    requested = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t))
    completed = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
    buffers: list[Any] = []

    def on_request(buf: Any, size: Any) -> None:
        arr = (ctypes.c_uint8 * 65536)()
        buffers.append(arr)
        buf[0] = ctypes.addressof(arr)
        size[0] = 65536

    req, done = requested(on_request), completed(lambda *_: None)
    steps = [
        (
            "ptiViewSetCallbacks",
            lambda: _bind(pti, "ptiViewSetCallbacks", ctypes.c_uint32, requested, completed)(req, done),
        ),
        ("ptiViewEnable", lambda: _bind(pti, "ptiViewEnable", ctypes.c_uint32, ctypes.c_uint32)(1)),
        ("ptiViewDisable", lambda: _bind(pti, "ptiViewDisable", ctypes.c_uint32, ctypes.c_uint32)(1)),
        ("ptiFlushAllViews", lambda: _bind(pti, "ptiFlushAllViews", ctypes.c_uint32)()),
    ]
    for name, call in steps:
        rc = call()
        if rc != 0:
            hint = ""
            if rc == 51:
                hint = "; set ZE_ENABLE_TRACING_LAYER=1 before Level Zero starts (an old loader or driver)"
            elif rc == 2:
                hint = "; PTI is not implemented for this driver (a symbol PTI needs is missing)"
            return f"Intel PTI failed: {name} returned {_result_text(rc)}{hint}"
    return None


def main() -> int:
    """Child-process entry: print the finding as one JSON line."""
    try:
        finding = check(view_calls=True)
    except Exception as exc:  # noqa: BLE001 - any failure is a finding for the parent
        finding = _finding("probe_failed", f"the XPU probe failed: {type(exc).__name__}: {exc}")
    sys.stdout.write(json.dumps(finding) + "\n")
    sys.stdout.flush()
    return 0


_cache: dict[tuple, dict[str, Any]] = {}
_cache_lock = threading.Lock()
#: Environment variables that change the probe's answer (a new value probes again).
CACHE_KEY_ENV = (
    PTI_LIBRARY_ENV,
    ZE_LOADER_ENV,
    "LD_LIBRARY_PATH",
    "ZE_ENABLE_TRACING_LAYER",
    "ZE_AFFINITY_MASK",
    "ONEAPI_DEVICE_SELECTOR",
    "ZE_FLAT_DEVICE_HIERARCHY",
)


def run_in_child(timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """The finding of ``check()`` run in a child process; a crash of the child is a finding too.

    Cached per process for the same values of ``CACHE_KEY_ENV``; ``clear_cache()`` forgets.
    """
    key = tuple(os.environ.get(k) for k in CACHE_KEY_ENV)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
        finding = _run_child(timeout_s)
        _cache[key] = finding
        return finding


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def _run_child(timeout_s: float) -> dict[str, Any]:
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "polyprof_xpu.probe"],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _finding(
            "probe_failed", f"the XPU probe did not finish in {timeout_s:.0f} s (a hung GPU driver?)"
        )
    except OSError as exc:
        return _finding("probe_failed", f"cannot start the XPU probe: {exc}")
    stderr_tail = " ".join(proc.stderr.strip().splitlines()[-3:])
    if proc.returncode != 0:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        aborted = proc.returncode in (-6, 134)
        return _finding(
            "aborted" if aborted else "probe_failed",
            f"Intel PTI {'aborted' if aborted else 'killed'} the XPU probe process ({how}): "
            + (stderr_tail or "no message")
            + "; a Level Zero loader without a working GPU driver does this",
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return _finding(
            "probe_failed", f"the XPU probe printed no finding (stderr: {stderr_tail or 'empty'})"
        )


if __name__ == "__main__":
    raise SystemExit(main())
