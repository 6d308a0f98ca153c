"""Packaging: the wheel, the editable install, entry points, and the example third-party plugin.

The slow tests build polyprof's wheel, install it into a fresh virtual
environment without torch (dependencies come from the machine's pip
configuration), and check ``import polyprof``, the ``polyprof`` console script
and plugin discovery there; then they install the example exporter
distribution (docs/examples/polyprof-example-exporter) into the same
environment and check that it is discovered through its entry point.
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from decimal import Decimal
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import tomllib
from hypothesis import given
from hypothesis import strategies as st

import polyprof
from polyprof.base.config import ProfileConfig
from polyprof.base.events import EventKind
from polyprof.hooks.plugin_discovery import (
    ALLOW_LIST_ENV,
    BUILTIN_PLUGINS,
    DISABLE_AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
)
from polyprof.hooks.registry import TRACE_ENV, make_plugin_manager
from polyprof.testing import make_event_batch, make_trace

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "polyprof-example-exporter"
#: Left out when copying the checkout: build outputs and caches.
COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    "__pycache__",
    "build",
    "dist",
    "*.egg-info",
    ".venv",
    ".hypothesis",
    ".pytest_cache",
    "out",
    # scripts/torch_matrix.py's venvs (~5 GB each) and results
    ".venvs",
    "torch-matrix-results",
)
# Built-ins that need an optional package: torch_cpu needs torch, itt_export needs ittapi (extra "itt").
NON_TORCH_BUILTINS = sorted(set(BUILTIN_PLUGINS) - {"torch_cpu", "itt_export"})


def load_toml(path: Path) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in (DISABLE_AUTOLOAD_ENV, ALLOW_LIST_ENV, TRACE_ENV):
        monkeypatch.delenv(var, raising=False)


# ------------------------------------------------------------- metadata (fast)


def test_builtin_plugins_match_pyproject():
    project = load_toml(REPO / "pyproject.toml")["project"]
    assert project["entry-points"][ENTRY_POINT_GROUP] == dict(BUILTIN_PLUGINS)
    assert project["scripts"]["polyprof"] == "polyprof.cli:console_main"


def test_example_distribution_metadata():
    project = load_toml(EXAMPLE / "pyproject.toml")["project"]
    assert project["name"] == "polyprof-example-exporter"
    assert project["entry-points"][ENTRY_POINT_GROUP] == {"example_csv": "polyprof_example_exporter"}
    assert any(dep.startswith("polyprof") for dep in project["dependencies"])
    assert (EXAMPLE / "polyprof_example_exporter" / "__init__.py").is_file()
    assert (EXAMPLE / "README.md").is_file()


def test_editable_install_entry_points_resolve():
    # A checkout on sys.path may also expose a stale polyprof.egg-info: pick what pip installed.
    installed = [
        d for d in importlib.metadata.distributions(name="polyprof") if d.read_text("direct_url.json")
    ]
    if not installed:
        pytest.skip("polyprof is not pip-installed in this environment")
    dist = installed[0]
    direct_url = json.loads(dist.read_text("direct_url.json"))
    if not direct_url.get("dir_info", {}).get("editable"):
        pytest.skip("polyprof is not an editable install here")
    # The editable install maps the import packages onto this checkout's core/ and plugins/.
    assert Path(polyprof.__file__).resolve() == REPO / "core" / "polyprof" / "__init__.py"
    eps = {ep.name: ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP}
    assert {name: ep.value for name, ep in eps.items()} == dict(BUILTIN_PLUGINS)
    for name, ep in eps.items():
        spec = importlib.util.find_spec(ep.module)
        assert spec is not None and spec.origin, f"entry point {name} -> {ep.value} does not resolve"
        # The essential built-ins live in the core (polyprof.runtime), the others in plugins/.
        folder = REPO / ("core" if ep.module.startswith("polyprof.") else "plugins")
        assert Path(spec.origin).resolve().is_relative_to(folder), spec.origin
    [script] = [ep for ep in dist.entry_points if ep.group == "console_scripts" and ep.name == "polyprof"]
    from polyprof.cli import console_main

    assert script.load() is console_main
    # And the registry finds them through the same metadata.
    pm = make_plugin_manager(autoload=True, allow=())
    by_name = {info.name: info for info in pm.plugin_infos()}
    for name, module in BUILTIN_PLUGINS.items():
        assert by_name[name].builtin and by_name[name].module == module


# ------------------------------------------------------ example exporter (fast)


class ExampleDistribution:
    metadata: ClassVar[dict[str, str]] = {"Name": "polyprof-example-exporter"}
    version = "0.1.0"
    entry_points: ClassVar[list[importlib.metadata.EntryPoint]] = [
        importlib.metadata.EntryPoint("example_csv", "polyprof_example_exporter", ENTRY_POINT_GROUP)
    ]


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter([ExampleDistribution()]))
    yield
    for name in [m for m in sys.modules if m.startswith("polyprof_example_exporter")]:
        del sys.modules[name]


def sample_trace(**config_options):
    t0 = 1_700_000_000_123_456_789
    batch = make_event_batch(
        [
            {"name": "ProfilerStep#0", "kind": EventKind.USER_ANNOTATION, "start_ns": t0, "dur_ns": 812_331},
            {"name": "aten::mm", "start_ns": t0 + 12_402, "dur_ns": 353_192, "shapes": [[32, 32], [32, 32]]},
            {"name": "aten::add", "start_ns": t0 + 400_000, "dur_ns": 1_001, "thread": 2, "tid": 77},
        ]
    )
    config = ProfileConfig(activities={polyprof.ProfilerActivity.CPU}, options=config_options)
    return make_trace(batch, config=config, start_ns=t0)


def read_csv(path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_example_exporter_found_through_its_entry_point(example_on_path, tmp_path):
    pm = make_plugin_manager(builtins=False)
    info = pm.plugin_info("example_csv")
    assert (info.status, info.distribution, info.module) == (
        "loaded",
        "polyprof-example-exporter",
        "polyprof_example_exporter",
    )
    assert info.capabilities.exporters == ("csv",)
    assert pm.exporter_names() == ["csv"]
    trace = sample_trace()
    out = pm.make_exporter(trace.config, "csv").export(trace, str(tmp_path / "ops.csv"))
    rows = read_csv(out)
    assert [r["name"] for r in rows] == ["ProfilerStep#0", "aten::mm", "aten::add"]
    assert rows[1] == {
        "name": "aten::mm",
        "category": "cpu_op",
        "start_us": "12.402",
        "dur_us": "353.192",
        "pid": "0",
        "tid": "0",
        "thread": "0",
        "device_type": "CPU",
        "device_index": "0",
        "correlation_id": "0",
        "input_shapes": "[[32, 32], [32, 32]]",
    }
    assert rows[0]["category"] == "user_annotation"
    assert os.listdir(tmp_path) == ["ops.csv"], "no temporary file is left behind"


def test_example_exporter_reads_settings_from_config(example_on_path, tmp_path):
    pm = make_plugin_manager(builtins=False)
    trace = sample_trace(**{"csv.columns": "name,end_us,tid", "csv.time_origin": "epoch"})
    out = pm.make_exporter(trace.config, "csv").export(trace, str(tmp_path / "ops.csv"))
    rows = read_csv(out)
    assert rows[2] == {"name": "aten::add", "end_us": "1700000000123857.790", "tid": "77"}
    with pytest.raises(ValueError, match="unknown CSV columns \\['colour'\\]; valid columns: name, category"):
        pm.make_exporter(trace.config, "csv").export(trace, str(tmp_path / "x.csv"), columns=["colour"])
    with pytest.raises(TypeError, match="unknown options \\['delimiter'\\]"):
        pm.make_exporter(trace.config, "csv").export(trace, str(tmp_path / "x.csv"), delimiter=";")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pm.make_exporter(trace.config, "csv").export(trace, str(tmp_path / "no" / "x.csv"))


@given(st.lists(st.integers(-(2**62), 2**62), max_size=50))
def test_example_time_formatting_is_exact(values):
    sys.path.insert(0, str(EXAMPLE))
    try:
        from polyprof_example_exporter.csv_exporter import format_us
    finally:
        sys.path.remove(str(EXAMPLE))
    texts = format_us(np.asarray(values, dtype=np.int64)).tolist()
    assert [Decimal(t) for t in texts] == [Decimal(v) / 1000 for v in values]
    assert all(len(t.rpartition(".")[2]) == 3 for t in texts)


# ------------------------------------------------------------ wheel venv (slow)


def run(
    cmd: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(
            f"command failed ({result.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}"
        )
    return result


def clean_subprocess_env() -> dict[str, str]:
    """The caller's environment (pip configuration included) minus anything that would leak this venv."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("POLYPROF_")}
    env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


class WheelVenv:
    def __init__(self, root: Path, wheel: Path, venv: Path, env: dict[str, str]) -> None:
        self.root, self.wheel, self.venv, self.env = root, wheel, venv, env
        self.python = venv / "bin" / "python"
        self.polyprof = venv / "bin" / "polyprof"

    def run(self, *args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run([str(a) for a in args], env=self.env, cwd=self.root, timeout=timeout)

    def plugins_json(self) -> dict[str, dict]:
        result = self.run(self.polyprof, "plugins", "--json")
        return {record["name"]: record for record in json.loads(result.stdout)}


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    """Build the wheel from a copy of this checkout and install it into a fresh venv (once per module)."""
    root = tmp_path_factory.mktemp("wheel_venv")
    env = clean_subprocess_env()
    source = root / "src"
    shutil.copytree(REPO, source, ignore=COPY_IGNORE)  # keep build outputs out of the checkout
    dist = root / "dist"
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)], env=env, cwd=root)
    [wheel] = dist.glob("polyprof-*.whl")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", str(venv)], env=env, cwd=root)  # no --system-site-packages
    env = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    handle = WheelVenv(root, wheel, venv, env)
    handle.run(handle.python, "-m", "pip", "install", "--quiet", wheel)
    return handle


@pytest.mark.slow
def test_wheel_contents(wheel_venv):
    with zipfile.ZipFile(wheel_venv.wheel) as whl:
        names = set(whl.namelist())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_text = whl.read(entry_points).decode()
    for module in (
        "__init__", "__main__", "plugin", "testing", "hooks/registry", "cli/__init__", "hooks/hookspecs",
        "hooks/components", "base/events", "analysis/tree", "formats/columnar", "native/native_reader",
        "runtime/bus", "runtime/torch_cpu", "runtime/chrome_trace", "frontends/profiler", "ranks/__init__",
    ):  # fmt: skip
        assert f"polyprof/{module}.py" in names
    assert "polyprof_builtins/__init__.py" in names
    assert {"polyprof/py.typed", "polyprof_builtins/py.typed"} <= names
    # the compiled modules' sources: they are built where polyprof runs (native_reader, native_columns)
    sources = ("kineto_reader", "chrome_lines", "chrome_columns")
    assert {f"polyprof/native/{name}.cpp" for name in sources} <= names
    assert not any(n.startswith(("core/", "plugins/", "tests/", "docs/")) for n in names)
    assert "[polyprof]" in entry_text and "polyprof = polyprof.cli:console_main" in entry_text
    for name, module in BUILTIN_PLUGINS.items():
        assert f"{name} = {module}" in entry_text


@pytest.mark.slow
def test_wheel_imports_without_torch(wheel_venv):
    code = textwrap.dedent(
        """
        import importlib.util, sys
        assert importlib.util.find_spec("torch") is None, "torch must not be installed here"
        import polyprof, polyprof.hooks.registry, polyprof.cli, polyprof.testing
        assert "torch" not in sys.modules
        print(polyprof.__file__)
        """
    )
    result = wheel_venv.run(wheel_venv.python, "-c", code)
    assert Path(result.stdout.strip()).is_relative_to(wheel_venv.venv), (
        "imported from the venv, not the checkout"
    )


@pytest.mark.slow
def test_wheel_console_script_lists_builtins(wheel_venv):
    records = wheel_venv.plugins_json()
    assert set(BUILTIN_PLUGINS) <= set(records)
    torch_cpu = records["torch_cpu"]
    assert torch_cpu["status"] in ("unavailable", "failed")
    assert "torch" in torch_cpu["reason"].lower()
    itt = records["itt_export"]
    assert itt["status"] == "unavailable" and "ittapi" in itt["reason"]
    for name in NON_TORCH_BUILTINS:
        assert records[name]["status"] == "loaded", records[name]["display_status"]
        assert records[name]["distribution"] == "polyprof" and records[name]["builtin"]
    # python -m polyprof works too, and prints the same table's names.
    table = wheel_venv.run(wheel_venv.python, "-m", "polyprof", "plugins").stdout
    for name in BUILTIN_PLUGINS:
        assert any(line.startswith(f"{name} ") for line in table.splitlines())


@pytest.mark.slow
def test_example_distribution_installs_and_is_discovered(wheel_venv):
    example_copy = wheel_venv.root / "polyprof-example-exporter"
    shutil.copytree(EXAMPLE, example_copy, ignore=COPY_IGNORE)
    wheel_venv.run(wheel_venv.python, "-m", "pip", "install", "--quiet", example_copy)
    records = wheel_venv.plugins_json()
    example = records["example_csv"]
    assert example["status"] == "loaded", example["display_status"]
    assert example["distribution"] == "polyprof-example-exporter" and example["version"] == "0.1.0"
    assert example["capabilities"]["exporters"] == ["csv"]
    assert not example["builtin"]
    # And it exports for real in that environment (no torch there).
    out = wheel_venv.root / "ops.csv"
    code = textwrap.dedent(
        f"""
        from polyprof.hooks.registry import make_plugin_manager
        from polyprof.testing import make_event_batch, make_trace
        trace = make_trace(make_event_batch([{{"name": "aten::mm", "start_ns": 5000, "dur_ns": 1500}}]))
        with make_plugin_manager() as pm:
            print(pm.make_exporter(trace.config, "csv").export(trace, {str(out)!r}))
        """
    )
    wheel_venv.run(wheel_venv.python, "-c", code)
    rows = read_csv(out)
    assert rows[0]["name"] == "aten::mm" and rows[0]["start_us"] == "0.000" and rows[0]["dur_us"] == "1.500"
    # The allow-list can leave it out.
    env = {**wheel_venv.env, ALLOW_LIST_ENV: "nothing_here"}
    result = run([str(wheel_venv.polyprof), "plugins", "--json"], env=env, cwd=wheel_venv.root)
    records = {r["name"]: r for r in json.loads(result.stdout)}
    assert records["example_csv"]["status"] == "blocked"
    assert "nothing_here" in result.stderr, "unknown allow-list names are warned about"
