"""polyprof's compiled builder of Parquet trace columns from Chrome trace JSON: built once, then cached.

``polyprof convert`` (JSON to Parquet) spent most of its time making Python objects: orjson's
parse of the whole document, then a Python pass over every event sorting its keys into columns
(docs/performance.md). ``native/chrome_columns.cpp`` reads the JSON bytes straight into the
columns, several times faster, and gives exactly what the Python builder gives
(``polyprof.formats.columnar``; tests/test_columnar.py compares both on awkward traces). What it does not
reproduce exactly (invalid JSON, integers past int64, duplicate keys, ...) it refuses, and the
Python builder takes that file.

It uses Python's C API only, not torch, so it loads without torch. It is compiled with the
system's C++ compiler (``$CXX``, else ``c++``; a second or two) the first time a conversion needs
it, into a folder of the cache that ``POLYPROF_CACHE_DIR`` moves (beside the Kineto reader's),
named after the Python, the platform, the compiler and the source, where every later process
finds it. A build that fails (no compiler, say) is remembered with its reason and not retried;
the Python builder is used. ``pip install`` stays the only install step.

``POLYPROF_COLUMN_BUILDER`` chooses:

* ``auto`` (default): the compiled builder, built on first need; the Python one where it cannot be.
* ``native``: the compiled builder; an error saying why when it cannot be built or loaded.
* ``python``: the Python builder; nothing is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

from polyprof.base.errors import PolyprofError
from polyprof.base.fileio import atomic_writer
from polyprof.base.log import get_logger

log = get_logger(__name__)

MODE_VARIABLE = "POLYPROF_COLUMN_BUILDER"
MODES = ("auto", "native", "python")
#: The extension module's name (its ``PyInit_`` symbol).
MODULE_NAME = "polyprof_chrome_columns"
SOURCE = Path(__file__).with_name("chrome_columns.cpp")
#: Marker of a failed build in its folder: the reason.
FAILED_MARKER = "failed"
#: Seconds a build may take before it counts as failed.
BUILD_TIMEOUT_S = 300


class NativeColumnsUnavailable(PolyprofError):
    """``POLYPROF_COLUMN_BUILDER=native`` and the compiled builder cannot be built or loaded here."""


def mode() -> str:
    """The builder ``POLYPROF_COLUMN_BUILDER`` asks for; a clear error for anything else."""
    value = os.environ.get(MODE_VARIABLE, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise PolyprofError(
            f"{MODE_VARIABLE}={os.environ[MODE_VARIABLE]!r} is not a column builder; choose one of "
            f"{', '.join(MODES)}"
        )
    return value


def _cache_root() -> Path:
    from polyprof.native.native_reader import cache_root  # the Kineto reader's cache, same rules

    return cache_root()


def compiler_command() -> list[str]:
    """The C++ compiler to build with: ``$CXX`` (it may hold arguments), else ``c++``."""
    return shlex.split(os.environ.get("CXX", "").strip() or "c++")


def _compile_command(source: Path, output: Path) -> list[str]:
    include = sysconfig.get_paths()["include"]
    command = [*compiler_command(), "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{include}"]
    if sys.platform == "darwin":
        command += ["-undefined", "dynamic_lookup"]  # Python's symbols come from the interpreter
    return [*command, str(source), "-o", str(output)]


def _suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def folder() -> Path:
    """The cache folder of the build for this Python, platform, compiler and source."""
    text = "\n".join(
        [
            sys.implementation.cache_tag or sys.version,
            sysconfig.get_platform(),
            _suffix(),
            " ".join(compiler_command()),
            hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
        ]
    )
    return _cache_root() / "chrome-columns" / hashlib.sha256(text.encode()).hexdigest()[:20]


def _module_path(where: Path) -> Path:
    return where / f"{MODULE_NAME}{_suffix()}"


def failure(where: Path | None = None) -> str | None:
    """Why the build in ``where`` (default: this one's folder) failed, or None."""
    try:
        return (((where or folder()) / FAILED_MARKER).read_text(encoding="utf-8")).strip() or "unknown"
    except OSError:
        return None


_loaded: dict[Path, ModuleType] = {}
_refused: dict[Path, str] = {}  # folders whose module would not build or load here: the reason
_lock = threading.Lock()


def build(where: Path | None = None) -> str | None:
    """Compile the builder into ``where`` now (this process); None when built, else the reason.

    The module is written under a temporary name and renamed into place, so concurrent builds
    (several conversions started at once) never load a half-written file. A failure is returned,
    not raised; the compiler's own refusal (the same for this compiler and source on every host
    sharing the folder) is also written to its ``failed`` marker, and ``auto`` does not retry it.
    """
    where = where or folder()
    if sys.platform == "win32":
        return _failed(where, "not built on Windows (the Python builder is used)")
    compiler = compiler_command()
    if shutil.which(compiler[0]) is None:
        # not remembered: a host that shares the cache folder may have one, and looking is cheap
        reason = f"no C++ compiler: {compiler[0]!r} is not on PATH (set CXX to one)"
        log.info("chrome_columns_build_failed", folder=str(where), reason=reason)
        return reason
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"the cache folder {where} is not writable ({exc}); set POLYPROF_CACHE_DIR"
    final = _module_path(where)
    temporary = where / f".{MODULE_NAME}-{os.getpid()}-{secrets.token_hex(4)}{_suffix()}"
    log.info("chrome_columns_building", folder=str(where))
    try:
        done = subprocess.run(
            _compile_command(SOURCE, temporary),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            detail = " ".join((done.stderr or done.stdout).split())[-400:]
            return _failed(where, f"the compiler failed (exit {done.returncode}): {detail}")
        os.replace(temporary, final)
    except (OSError, subprocess.SubprocessError) as exc:
        # a timeout on a loaded machine, a full disk: not remembered, the next conversion tries again
        reason = f"{type(exc).__name__}: {exc}"
        log.info("chrome_columns_build_failed", folder=str(where), reason=reason)
        return reason
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
    log.info("chrome_columns_built", folder=str(where))
    return None


def _failed(where: Path, reason: str) -> str:
    with contextlib.suppress(OSError):
        where.mkdir(parents=True, exist_ok=True)
        with atomic_writer(where / FAILED_MARKER) as out:
            out.write(reason + "\n")
    log.info("chrome_columns_build_failed", folder=str(where), reason=reason)
    return reason


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = module.columns(b'{"traceEvents": [{"ph": "i"}]}')
    if not isinstance(found, tuple) or found[0] != 1:
        raise ImportError(f"{path} gives {found!r} for a one-event trace")
    return module


def builder(requested: str | None = None) -> ModuleType | None:
    """The compiled builder to convert with, or None for the Python builder (``mode()`` decides).

    ``auto`` builds it now when it was never tried for this Python, platform and source (and
    returns None when that fails); ``native`` raises ``NativeColumnsUnavailable`` with the reason.
    """
    chosen = requested or mode()
    if chosen == "python":
        return None
    try:
        where = folder()
    except OSError as exc:  # the source is missing from this installation
        if chosen == "native":
            raise NativeColumnsUnavailable(
                f"polyprof's compiled column builder is unavailable: its source cannot be read ({exc})"
            ) from exc
        return None
    with _lock:
        module = _loaded.get(where)
        if module is not None:
            return module
        reason: str | None = _refused.get(where) or _built_or_reason(where, retry=chosen == "native")
        if reason is None:
            try:
                module = _load(_module_path(where))
            except Exception as exc:  # noqa: BLE001 - any failure to load means the Python builder
                reason = f"the built module does not load: {type(exc).__name__}: {exc}"
                log.warning("chrome_columns_not_loaded", folder=str(where), reason=reason)
            else:
                _loaded[where] = module
                return module
        _refused[where] = reason
    if chosen == "native":
        raise NativeColumnsUnavailable(
            f"{MODE_VARIABLE}=native, but polyprof's compiled column builder is unavailable: {reason}; "
            f"{MODE_VARIABLE}=python or auto convert with the Python builder"
        )
    return None


def _built_or_reason(where: Path, *, retry: bool) -> str | None:
    if _module_path(where).is_file():
        return None
    earlier = failure(where)
    if earlier is not None and not retry:
        return earlier
    return build(where)


def describe() -> dict[str, object]:
    """Where the compiled builder stands: mode, cache folder, built or why not (never builds)."""
    where = folder()
    return {
        "mode": mode(),
        "folder": str(where),
        "built": _module_path(where).is_file(),
        "failure": failure(where),
    }


__all__ = [
    "MODES",
    "MODE_VARIABLE",
    "NativeColumnsUnavailable",
    "build",
    "builder",
    "describe",
    "failure",
    "folder",
    "mode",
]
