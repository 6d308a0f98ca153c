"""Fixtures shared by several test files."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from hypothesis_budget import FAST_PROFILE

NOBODY_UID = 65534

#: The differential subset (marker ``torch_oracle``): tests that use torch as the oracle, and the
#: torch tracer's own tests. scripts/torch_matrix.py runs it on other torch versions and CI on
#: 2.6 and 2.15 (docs/torch-versions.md), so it must not depend on anything torch-version-specific
#: that the 2.13 venv alone has (the GPU plugins, HTA, ittapi). Patterns match file names in tests/.
TORCH_ORACLE_FILES = (
    "test_differential.py",
    "test_results.py",
    "test_tree.py",
    "test_table.py",
    "test_torch_cpu.py",
    "test_profiler.py",
    "test_chrome_trace.py",
    "test_legacy.py",
    "test_shim.py",
    "test_stacks.py",
    "test_event_attributes.py",
    "test_torch_result.py",
    "test_native_reader.py",
    "test_chrome_lines.py",
    "test_collector_settings.py",
    "test_recording_quiet.py",
    "test_distributed_ranks.py",
    "test_memory_timeline.py",
    "test_own_frames.py",
    "test_report_threads.py",
    "test_outside_stop.py",
    "test_use_cuda.py",
    "test_*version*.py",
)
#: The plugin host (marker ``plugin_host``): pluggy's hooks called plugin by plugin, guarded
#: loading, a plugin's faults isolated. Every matrix run takes it with the subset above, so it runs
#: on each pluggy CI installs (the floors' 1.5, the newest run's 1.6, the whole suite's newest).
PLUGIN_HOST_FILES = (
    "test_plugin_calls.py",
    "test_registry.py",
    "test_plugin_faults.py",
    "test_plugin_reuse.py",
    "test_exporter_plugin_faults.py",
)
#: The optional dependencies' tests (marker ``optional_extras``), paths from the repository root:
#: pyarrow, duckdb and ray (the many-rank report), and the GPU plugin distributions' own tests
#: (nvidia-ml-py among their needs). The floors run installs all of these at their floors.
OPTIONAL_EXTRAS_PATHS = (
    "tests/test_columnar.py",
    "tests/test_native_columns.py",
    "tests/test_rank_report.py",
    "tests/test_merge.py",
    "tests/test_rank_ray.py",
    "tests/test_rank_engine_faults.py",
    "tests/test_trace_commands_faults.py",
    "tests/test_trace_commands_matrix.py",
    "plugins_cuda/tests/test_*.py",
    "plugins_xpu/tests/test_*.py",
)
#: Every subset by marker, as patterns of paths from the repository root.
SUBSETS = {
    "torch_oracle": tuple(f"tests/{name}" for name in TORCH_ORACLE_FILES),
    "plugin_host": tuple(f"tests/{name}" for name in PLUGIN_HOST_FILES),
    "optional_extras": OPTIONAL_EXTRAS_PATHS,
}

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent

# Which reader of torch's raw result the tests decode with (polyprof.native.native_reader): the compiled
# one where a C++ compiler is present (built once per torch, into the repository's .cache), the
# pure-Python one otherwise; scripts/test.sh runs the differential subset on both. Set here, at
# import, so every profile and every child process of the run reads the same.
os.environ.setdefault("POLYPROF_CACHE_DIR", str(TESTS_DIR.parent / ".cache" / "polyprof"))
os.environ.setdefault(
    "POLYPROF_KINETO_READER", "native" if shutil.which(os.environ.get("CXX", "c++")) else "python"
)


def _in_torch_oracle(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in TORCH_ORACLE_FILES)


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def subsets_of(path: Path) -> list[str]:
    """The subsets (markers) a test file belongs to."""
    relative = _relative(path)
    return [
        marker for marker, patterns in SUBSETS.items() if any(fnmatch.fnmatch(relative, p) for p in patterns)
    ]


def selected_subsets(markexpr: str) -> set[str] | None:
    """The subsets ``-m`` names when it is only subsets joined by ``or`` ("torch_oracle or plugin_host")."""
    words = markexpr.split()
    if not words or len(words) % 2 == 0 or any(w != "or" for w in words[1::2]):
        return None
    named = set(words[0::2])
    return named if named <= SUBSETS.keys() else None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m`` naming only subsets, import nothing outside them.

    The other torch versions' venvs have neither polyprof-cuda nor polyprof-xpu, whose test
    folders fail to import without them, nor HTA or ittapi.
    """
    chosen = selected_subsets(config.getoption("markexpr", ""))
    if chosen is None:
        return None
    patterns = [p for marker in chosen for p in SUBSETS[marker]]
    relative = _relative(collection_path)
    if collection_path.is_dir():
        # a folder stays when some pattern's folder is it or lies inside it
        inside = any(p.rsplit("/", 1)[0] == relative or p.startswith(relative + "/") for p in patterns)
        return None if inside or relative == "." else True
    if collection_path.suffix == ".py" and not any(fnmatch.fnmatch(relative, p) for p in patterns):
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Note the subsets ``-m`` selects, for the plugin folders' conftests; a fast run's hypothesis budget.

    The fast subset (``-m "not slow"``) tries fewer hypothesis examples (tests/hypothesis_budget.py).

    A profile chosen with ``--hypothesis-profile`` wins; every run without "not slow" in its marker
    expression (CI's whole suite, the torch matrix) keeps every example.
    """
    # None: -m selects more than whole subsets (or nothing), so every folder is collected.
    config.polyprof_selected_subsets = selected_subsets(config.getoption("markexpr", ""))  # type: ignore[attr-defined]
    if "not slow" in config.getoption("markexpr", "") and not config.getoption("--hypothesis-profile", None):
        settings.load_profile(FAST_PROFILE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the subsets, so that ``pytest -m torch_oracle`` (or another) selects them."""
    for item in items:
        for marker in subsets_of(item.path):
            item.add_marker(getattr(pytest.mark, marker))


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
        except BaseException as exc:  # noqa: BLE001 - report anything, never run the parent's code
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


def pytest_report_header(config: pytest.Config) -> str:
    reader = os.environ["POLYPROF_KINETO_READER"]
    return f"polyprof reader of torch's result: {reader} (POLYPROF_KINETO_READER)"


@pytest.fixture
def gpu_present(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """torch and polyprof-cuda both believe a GPU is here, on any build of torch.

    torch's CPU build accepts ``ProfilerActivity.CUDA`` and records the CPU side, so a profile
    takes the path recording CUDA takes. polyprof-cuda comes from this repository's plugins_cuda
    folder where it is not installed (scripts/torch_matrix.py's runs). Yields the plugin manager
    to pass to polyprof's profilers: None (the installed plugins) or one holding polyprof-cuda.
    """
    torch = pytest.importorskip("torch")
    import torch.autograd.profiler as autograd_profiler

    from polyprof.base import torch_support
    from polyprof.hooks.registry import make_plugin_manager

    # Installed means its entry point is (an import from an earlier test's sys.path is not).
    installed = any(ep.name == "cuda" for ep in importlib.metadata.entry_points(group="polyprof"))
    if not installed:
        monkeypatch.syspath_prepend(str(REPO_ROOT / "plugins_cuda"))
    from polyprof_cuda import kineto, mode, plugin

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    supported = {torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA}
    monkeypatch.setattr(autograd_profiler, "_supported_activities", lambda: supported, raising=False)
    build = torch_support.installed_build()
    version = build.version if build is not None else torch.__version__
    monkeypatch.setattr(
        torch_support, "installed_build", lambda: torch_support.TorchBuild(version, cuda="13.0")
    )
    monkeypatch.setattr(kineto, "kineto_mode_reason", lambda: None)
    mode.forget_cached_mode()
    # Not installed: the plugin given in code, and no entry point read (an egg-info an editable
    # install left in plugins_cuda would offer it a second time).
    pm = None if installed else make_plugin_manager(entry_points=False, extra_plugins=[("cuda", plugin)])
    try:
        yield pm
    finally:
        mode.forget_cached_mode()
        if pm is not None:
            pm.close()
