"""polyprof's compiled reader of torch's raw profiler result: built once per torch, loaded when built.

torch's Python API gives one pybind wrapper per event and one call per field;
at 200k events reading what a table needs costs more than a quarter of torch's
own ``_disable_profiler()``. ``native/kineto_reader.cpp`` reads the same
fields from torch's C++ ``KinetoEvent`` into numpy arrays, about ten times
faster (docs/performance.md). It must be compiled against the installed
torch's headers, so it is built here, not by ``pip install``: with torch's own
``torch.utils.cpp_extension`` (the ``ninja`` wheel is a dependency; the C++
compiler is the system's), into a cache folder named after the torch build,
the Python and the source, where every later process finds it.

``POLYPROF_KINETO_READER`` chooses:

* ``auto`` (default): the compiled reader when it is built for this torch;
  otherwise the pure-Python reader, and one background build (a detached
  process at the lowest CPU priority, announced once on stderr by a
  ``KinetoReaderBuildWarning``) so later profiles find it. A build that failed
  (no compiler, say) is remembered with its reason and not retried by ``auto``.
* ``native``: the compiled reader, built now if need be; an error saying why
  when it cannot be.
* ``python``: the pure-Python reader; nothing is built.

Both readers give identical results (tests/test_native_reader.py compares
them). ``POLYPROF_CACHE_DIR`` moves the cache (default
``$XDG_CACHE_HOME/polyprof`` or ``~/.cache/polyprof``). ``polyprof
kineto-reader`` shows the state and builds on request.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import warnings

try:
    import fcntl
except ImportError:  # not on Windows: builds there are not serialised
    fcntl = None  # type: ignore[assignment]
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from polyprof.base import torch_support
from polyprof.base.errors import PolyprofError, PolyprofWarning
from polyprof.base.fileio import atomic_writer
from polyprof.base.log import get_logger
from polyprof.base.user_warnings import user_stacklevel

log = get_logger(__name__)

MODE_VARIABLE = "POLYPROF_KINETO_READER"
MODES = ("auto", "native", "python")
CACHE_VARIABLE = "POLYPROF_CACHE_DIR"
#: The extension module's name (its ``PyInit_`` symbol); one per cache folder.
MODULE_NAME = "polyprof_kineto_reader"
#: The module's sources: the reader (which defines the module) and the Chrome trace line formatter.
SOURCES = tuple(Path(__file__).parent / name for name in ("kineto_reader.cpp", "chrome_lines.cpp"))
#: Accessors of torch's ``_KinetoEvent`` whose C++ counterparts only some torch releases have; the
#: build defines ``POLYPROF_HAS_<name>`` for those the installed torch's Python bindings offer.
VERSIONED_ACCESSORS = (
    "is_python_function",
    "is_hidden_event",
    "flow_id",
    "external_id",
    "python_id",
    "python_module_id",
    "overload_name",
    "metadata_json",
    "typed_metadata",
)
#: Marker files in a build folder: the build loaded and passed its check / it failed (the reason).
BUILT_MARKER = "built"
FAILED_MARKER = "failed"
#: polyprof's build lock (flock) and the lock file torch's builder leaves behind when killed.
BUILD_LOCK = "polyprof-build.lock"
TORCH_BUILD_LOCK = "lock"
#: The background build's nice value: the lowest CPU priority a user may set.
BUILD_NICE = 19
#: What a build costs, as the announcement and the docs state it (docs/performance.md): CPU time of
#: the two sources' compilation, measured at 18 s on an idle 2-core machine and up to 27 s on busy ones.
BUILD_COST = "about 15-30 s of CPU time"


class NativeReaderUnavailable(PolyprofError):
    """``POLYPROF_KINETO_READER=native`` and the compiled reader cannot be built or loaded here."""


class KinetoReaderBuildWarning(PolyprofWarning):
    """Said once per process, when a profile starts the compiled reader's background build.

    Informational: the profile is complete (read by the pure-Python reader).
    ``warnings.filterwarnings("ignore", category=KinetoReaderBuildWarning)``
    silences it; ``polyprof kineto-reader build`` (ahead of time) or
    ``POLYPROF_KINETO_READER=python`` avoid the build.
    """


def mode() -> str:
    """The reader ``POLYPROF_KINETO_READER`` asks for; a clear error for anything else."""
    value = os.environ.get(MODE_VARIABLE, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise PolyprofError(
            f"{MODE_VARIABLE}={os.environ[MODE_VARIABLE]!r} is not a reader; choose one of {', '.join(MODES)}"
        )
    return value


def cache_root() -> Path:
    explicit = os.environ.get(CACHE_VARIABLE)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "polyprof"


@attrs.frozen
class BuildSpec:
    """What one build of the reader is for: the folder name is a hash of all of it."""

    torch_version: str
    torch_git: str
    python_tag: str
    platform: str
    defines: tuple[str, ...]
    source_digest: str

    @classmethod
    def for_installed_torch(cls) -> BuildSpec:
        return _installed_spec()

    @classmethod
    def of_torch(cls) -> BuildSpec:
        import torch

        features = torch_support.installed()
        defines = tuple(
            f"-DPOLYPROF_HAS_{name}" for name in VERSIONED_ACCESSORS if features.has_accessor(name)
        )
        if features.has_accessor("activity_type") and _kineto_names_types_inline(torch):
            defines += ("-DPOLYPROF_HAS_activity_type",)
        if _result_members_known(torch):
            defines += ("-DPOLYPROF_HAS_result_members",)
        return cls(
            torch_version=str(torch.__version__),
            torch_git=str(getattr(torch.version, "git_version", "")),
            python_tag=sys.implementation.cache_tag or sys.version,
            platform=sysconfig.get_platform(),
            defines=defines,
            source_digest=hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES)).hexdigest(),
        )

    @property
    def key(self) -> str:
        text = "\n".join(
            [
                self.torch_version,
                self.torch_git,
                self.python_tag,
                self.platform,
                *self.defines,
                self.source_digest,
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def folder(self) -> Path:
        return cache_root() / "kineto-reader" / self.key


def _kineto_names_types_inline(torch: Any) -> bool:
    """Whether torch's Kineto header defines ``toString(ActivityType)`` inline (2.13+): older
    releases keep it inside libtorch, unexported, so the reader leaves activity types to Python."""
    header = Path(torch.__file__).parent / "include" / "kineto" / "ActivityType.h"
    try:
        return "inline const char* toString(ActivityType" in header.read_text(encoding="utf-8")
    except OSError:
        return False


#: The members of torch's ``ProfilerResult`` that ``release()`` empties, as its header declares them
#: (torch 2.6 to 2.15). Another torch builds the module without ``release()``.
RESULT_MEMBERS = (
    "std::vector<KinetoEvent> events_;",
    "std::unique_ptr<torch::profiler::impl::kineto::ActivityTraceWrapper> trace_;",
    "std::vector<experimental_event_t> event_tree_;",
)


def _result_members_known(torch: Any) -> bool:
    """Whether torch's ``ProfilerResult`` holds exactly the members ``release()`` expects."""
    header = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "autograd" / "profiler_kineto.h"
    try:
        text = header.read_text(encoding="utf-8")
    except OSError:
        return False
    declared = text[text.find("struct TORCH_API ProfilerResult") :]
    declared = declared[: declared.find("};")]
    return all(member in declared for member in RESULT_MEMBERS)


@functools.cache
def _installed_spec() -> BuildSpec:
    return BuildSpec.of_torch()  # torch does not change within a process


@attrs.frozen
class BuildState:
    """Where the reader for the installed torch stands: built, failed (why), or not built."""

    folder: Path
    built: bool
    failure: str | None

    @classmethod
    def of(cls, spec: BuildSpec) -> BuildState:
        folder = spec.folder()
        failure = None
        with contextlib.suppress(OSError):
            failure = (folder / FAILED_MARKER).read_text(encoding="utf-8").strip() or "unknown"
        return cls(folder, (folder / BUILT_MARKER).is_file() and _module_file(folder) is not None, failure)

    def describe(self) -> str:
        if self.built:
            return f"built in {self.folder}"
        if self.failure is not None:
            return f"the build failed ({self.failure}); 'polyprof kineto-reader build' tries again"
        return f"not built yet (cache {self.folder})"


def _module_file(folder: Path) -> Path | None:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for candidate in (folder / f"{MODULE_NAME}{suffix}", folder / f"{MODULE_NAME}.so"):
        if candidate.is_file():
            return candidate
    return None


_loaded: dict[str, ModuleType] = {}
_load_lock = threading.Lock()
#: Background builds (by ``BuildSpec.key``) this process tried, those it started, and those it announced.
_background_started: set[str] = set()
_background_running: set[str] = set()
_announced: set[str] = set()
#: Built modules that would not load in this process (logged once): the export stops asking.
_not_loadable: set[str] = set()


def _load(folder: Path) -> ModuleType:
    path = _module_file(folder)
    if path is None:
        raise ImportError(f"no {MODULE_NAME} module in {folder}")
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(*, force: bool = False, aside: bool = False) -> BuildState:
    """Build the reader for the installed torch now (this process; ``BUILD_COST``), unless built already.

    A failure is written to the folder's ``failed`` marker and returned, not
    raised. Concurrent builds of one folder wait for each other (our build
    lock), so many ranks starting at once build it once.

    :param aside: compile in a folder of this process's own, without the lock, and take the
        lock only to put the module in place (the background build: it runs at idle priority,
        and a build someone waits for, ``native`` or ``polyprof kineto-reader build``, must
        never wait for it to get a core).
    """
    spec = BuildSpec.for_installed_torch()
    state = BuildState.of(spec)
    if state.built and not force:
        return state
    folder = state.folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / BUILD_LOCK, "a+b")
    except OSError as exc:
        reason = f"the cache folder {folder} is not writable ({_one_line(exc)}); set {CACHE_VARIABLE}"
        log.warning("kineto_reader_build_failed", folder=str(folder), reason=reason)
        return BuildState(folder, built=False, failure=reason)
    where = folder.with_name(f"{folder.name}.building-{os.getpid()}") if aside else folder
    failure = _compile_and_check(spec, where) if aside else None
    try:
        with lock:
            # Our own lock, released by the kernel if a builder dies: torch's builder waits for ever
            # on a lock file a killed build left behind, so that file is removed while we hold ours.
            if fcntl is not None:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            state = BuildState.of(spec)
            if state.built and not force:
                return state  # another process built it meanwhile
            for leftover in (FAILED_MARKER, BUILT_MARKER, TORCH_BUILD_LOCK):
                with contextlib.suppress(FileNotFoundError):
                    (folder / leftover).unlink()
            if not aside:
                failure = _compile_and_check(spec, folder)
            elif failure is None:
                built = _module_file(where)
                assert built is not None  # _compile_and_check loaded it
                os.replace(built, folder / built.name)
            if failure is not None:
                with contextlib.suppress(OSError):
                    _write_marker(folder / FAILED_MARKER, failure)
                log.warning("kineto_reader_build_failed", folder=str(folder), reason=failure)
                return BuildState(folder, built=False, failure=failure)
            _write_marker(folder / BUILT_MARKER, spec.torch_version)
    finally:
        if aside:
            shutil.rmtree(where, ignore_errors=True)
    log.info("kineto_reader_built", folder=str(folder))
    return BuildState.of(spec)


def _compile_and_check(spec: BuildSpec, folder: Path) -> str | None:
    """Compile the reader into ``folder`` and load it there; None, or why it failed (one line)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _compile(spec, folder)
        module = _load(folder)
        fields = set(module.field_names())
        if not {"start_ns", "end_ns", "start_thread_id"} <= fields:
            raise ImportError(f"the built module reads only {sorted(fields)}")
    except Exception as exc:  # noqa: BLE001 - any failure (no compiler, headers, linker) is a reason
        return _one_line(exc)
    return None


def _compile(spec: BuildSpec, folder: Path) -> None:
    from torch.utils import cpp_extension

    # torch's builder runs "ninja" from PATH; the ninja wheel's binary is not on PATH when the
    # environment's python is run without activating it.
    extra_path = []
    with contextlib.suppress(ImportError, AttributeError):
        import ninja

        extra_path.append(str(ninja.BIN_DIR))
    extra_path.append(sysconfig.get_path("scripts"))
    path = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([*extra_path, path or ""])
    try:
        cpp_extension.load(
            name=MODULE_NAME,
            sources=[str(source) for source in SOURCES],
            extra_cflags=["-O2", *spec.defines],
            build_directory=str(folder),
            is_python_module=True,
            verbose=False,
        )
    finally:
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path


def _write_marker(path: Path, text: str) -> None:
    with atomic_writer(path) as out:
        out.write(text + "\n")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[-400:]}" if text else type(exc).__name__


def lowest_priority(pid: int = 0) -> list[str]:
    """Put process ``pid`` (0: this one) at the lowest CPU priority a user may set; returns what was set.

    nice ``BUILD_NICE`` and, on Linux, the ``SCHED_IDLE`` policy (runs only on
    a core nothing else wants). Processes it starts afterwards (the build's
    compiler, assembler and linker) inherit both. The I/O priority follows with
    no call of its own: Linux gives a ``SCHED_IDLE`` process that set none the
    idle I/O class (``task_nice_ioclass``), which BFQ and mq-deadline honour.
    Each is best effort: one the platform lacks or refuses is left out. On
    Linux both apply to one thread, so call it before the process starts others.
    """
    applied = []
    with contextlib.suppress(OSError, AttributeError):  # no setpriority on Windows
        os.setpriority(os.PRIO_PROCESS, pid, BUILD_NICE)
        applied.append(f"nice {BUILD_NICE}")
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):  # Linux only
        with contextlib.suppress(OSError):
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
            applied.append("SCHED_IDLE")
    return applied


def _start_background_build(spec: BuildSpec) -> bool:
    """One detached, lowest-priority build per process and torch build; its outcome lands in the
    cache. Whether it started now (not before, nor refused: those are logged)."""
    if spec.key in _background_started or not sys.executable:
        return False
    _background_started.add(spec.key)
    if not _writable(spec.folder()):
        log.warning("kineto_reader_cache_not_writable", folder=str(spec.folder()), variable=CACHE_VARIABLE)
        return False
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "polyprof.native.native_reader", "--background-build"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        log.warning("kineto_reader_build_not_started", reason=_one_line(exc))
        return False
    if process.pid > 0:  # lowered at once, before its interpreter starts; it lowers itself again
        lowest_priority(process.pid)
    _background_running.add(spec.key)
    log.info("kineto_reader_building_in_background", folder=str(spec.folder()), pid=process.pid)
    return True


def background_build_announcement(folder: Path) -> str:
    """The one line that says a background build started: where, its cost, and how to avoid it."""
    return (
        f"polyprof is building its compiled reader of torch's results in the background into {folder} "
        f"(once per torch build; {BUILD_COST} at the lowest CPU priority); meanwhile profiles use the "
        "pure-Python reader, with identical results. Build it ahead of time with 'polyprof kineto-reader "
        f"build' (an install step for clusters and images), or set {MODE_VARIABLE}=python to never build it"
    )


def build_in_background(requested: str) -> None:
    """After a recording, on the user's thread: with ``auto``, start the build if the compiled reader
    is missing for this torch, and say so once per process, at the user's line.

    The tracer that owns torch's collector calls it when it stops, so the build
    never starts unannounced: the decode (``reader``, on the bus thread) may ask
    first and start it, and this call still says so. Cheap once the reader is
    loaded or announced; with ``native`` or ``python`` it does nothing.
    """
    if requested != "auto":
        return
    spec = BuildSpec.for_installed_torch()
    with _load_lock:
        if spec.key in _loaded or spec.key in _announced:
            return
        if spec.key not in _background_started:
            state = BuildState.of(spec)
            if state.built or state.failure is not None:
                return
            _start_background_build(spec)
        if spec.key not in _background_running:
            return
        _announced.add(spec.key)
    warnings.warn(
        background_build_announcement(spec.folder()), KinetoReaderBuildWarning, stacklevel=user_stacklevel()
    )


def _writable(folder: Path) -> bool:
    """Whether ``folder`` can be created and written: its nearest existing ancestor is writable."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return os.access(candidate, os.W_OK | os.X_OK)
    return False


def reader(requested: str | None = None) -> ModuleType | None:
    """The compiled reader to decode with, or None for the pure-Python one (``mode()`` decides).

    ``native`` builds it now if need be and raises ``NativeReaderUnavailable``
    with the reason when it cannot; ``auto`` never waits for a build.
    """
    chosen = requested or mode()
    if chosen == "python":
        return None
    spec = BuildSpec.for_installed_torch()
    with _load_lock:
        if spec.key in _loaded:
            return _loaded[spec.key]
        state = BuildState.of(spec)
        if not state.built:
            if chosen == "auto":
                if state.failure is None:
                    _start_background_build(spec)
                return None
            state = build()
            if not state.built:
                raise NativeReaderUnavailable(
                    f"{MODE_VARIABLE}=native, but polyprof's compiled reader for torch {spec.torch_version} "
                    f"is unavailable: {state.describe()}; {MODE_VARIABLE}=python or auto read torch's "
                    "result in pure Python"
                )
        try:
            return _load_built(spec, state)
        except ImportError as exc:
            if chosen == "native":
                raise NativeReaderUnavailable(f"polyprof's compiled reader does not load: {exc}") from exc
            return None


def built_module() -> ModuleType | None:
    """The compiled module where it is chosen and already built for this torch, else None.

    For its other users (the Chrome export's line formatter): never builds, never starts a
    build and never raises; a module that does not load is logged and left aside.
    """
    try:
        if mode() == "python":
            return None
        spec = BuildSpec.for_installed_torch()
    except PolyprofError:
        return None  # a bad choice: the decode reports it; the export writes in Python
    with _load_lock:
        if spec.key in _loaded:
            return _loaded[spec.key]
        if spec.key in _not_loadable:
            return None  # tried and logged once in this process
        state = BuildState.of(spec)
        if not state.built:
            return None
        try:
            return _load_built(spec, state)
        except ImportError:
            _not_loadable.add(spec.key)
            return None


def _load_built(spec: BuildSpec, state: BuildState) -> ModuleType:
    """Load the built module into this process once (under ``_load_lock``); ImportError logged."""
    try:
        module = _load(state.folder)
    except ImportError as exc:
        log.warning("kineto_reader_not_loaded", folder=str(state.folder), reason=_one_line(exc))
        raise
    _loaded[spec.key] = module
    return module


def _background_main() -> int:
    lowest_priority()  # never compete with the training job that profiled; the compilers inherit it
    import torch  # noqa: F401 - the build reads the installed torch

    return 0 if build(aside=True).built else 1


def describe_installed() -> dict[str, Any]:
    """The state ``polyprof kineto-reader`` prints: mode, cache folder, built or why not."""
    spec = BuildSpec.for_installed_torch()
    state = BuildState.of(spec)
    return {
        "mode": mode(),
        "torch": spec.torch_version,
        "folder": str(state.folder),
        "built": state.built,
        "failure": state.failure,
        "state": state.describe(),
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--background-build"]:
        sys.exit(_background_main())
    sys.exit(
        "usage: python -m polyprof.native.native_reader --background-build (see 'polyprof kineto-reader')"
    )
