"""The public plugin contract (issue 11, "The house" 3; issue 25 item 2).

The contract is ``polyprof.plugin.__all__``: every name a plugin may use, in one namespace
(docs/plugin-author-guide.md section 5 lists them; section 3 the hooks; section 4 the components'
methods). These tests keep the guide and the code in agreement, keep polyprof-cuda, polyprof-xpu,
the built-in plugins and the example exporter within the contract, and check that the session
drives tracers only through methods their base class declares.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

import polyprof
import polyprof.plugin
from polyprof.hooks import hookspecs
from polyprof.plugin import Aggregator, Exporter, ProfileConfig, ProfilerActivity, Subscriber, Tracer
from polyprof.testing import ComponentPlugin, FakeTracer, make_plugin_manager_for_tests

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "plugin-author-guide.md"
#: The GPU distributions: (project folder, import package).
GPU_DISTRIBUTIONS = (("plugins_cuda", "polyprof_cuda"), ("plugins_xpu", "polyprof_xpu"))
BUILTINS = ROOT / "plugins" / "polyprof_builtins"
EXAMPLE = ROOT / "docs" / "examples" / "polyprof-example-exporter"
BACKTICKED_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)`")

#: The contract: every name a plugin may import, all from ``polyprof.plugin``.
CONTRACT = frozenset(polyprof.plugin.__all__)
#: What a plugin imports of polyprof: the contract, and in its tests the testing companion.
CONTRACT_MODULE = "polyprof.plugin"
TESTING_MODULE = "polyprof.testing"


def guide_section(number: int) -> str:
    """The text of section ``number`` of the plugin author guide, heading included."""
    text = GUIDE.read_text()
    start = re.search(rf"^## {number}\. .*$", text, re.MULTILINE)
    assert start is not None, f"the guide has no section {number}"
    end = re.search(r"^## \d+\. ", text[start.end() :], re.MULTILINE)
    return text[start.start() : start.end() + end.start()] if end else text[start.start() :]


def guide_contract_names() -> list[str]:
    """The names in the first column of section 5's table (its group rows, in bold, name none)."""
    names = []
    for line in guide_section(5).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 2 or cells[0].startswith(("**", "name", "-")):
            continue
        names.extend(BACKTICKED_NAME.findall(cells[0]))
    return names


def test_the_guide_names_exactly_the_contract() -> None:
    names = guide_contract_names()
    assert len(names) == len(set(names)), "section 5 names something twice"
    assert set(names) == CONTRACT, (
        f"only in the guide: {sorted(set(names) - CONTRACT)}; only in polyprof.plugin.__all__: "
        f"{sorted(CONTRACT - set(names))}"
    )


def test_the_guide_points_plugins_at_the_contract_and_tests_at_polyprof_testing() -> None:
    section = guide_section(5)
    assert "`polyprof.plugin`" in section.splitlines()[0]
    assert "`polyprof.testing`" in section
    assert "polyprof.testing" not in CONTRACT


def test_every_contract_name_is_public_and_exists() -> None:
    assert len(polyprof.plugin.__all__) == len(CONTRACT), "polyprof.plugin.__all__ names something twice"
    for name in sorted(CONTRACT):
        assert not name.startswith("_"), f"polyprof.plugin.{name} is private"
        assert getattr(polyprof.plugin, name, None) is not None, f"polyprof.plugin.{name} does not exist"


def test_the_contract_types_are_the_core_s_own() -> None:
    """The names loaded on first use are the classes the hooks are given."""
    from polyprof.hooks.registry import PolyprofPluginManager
    from polyprof.runtime.session import Session

    assert polyprof.plugin.Session is Session
    assert polyprof.plugin.PolyprofPluginManager is PolyprofPluginManager
    assert polyprof.plugin.hookimpl is polyprof.hookimpl
    with pytest.raises(AttributeError, match="no attribute 'registry'"):
        _ = polyprof.plugin.registry


def test_installed_build_answers_as_the_core_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that fakes torch's build in ``polyprof.base.torch_support`` fakes it for plugins too."""
    from polyprof.base import torch_support

    build = polyprof.plugin.TorchBuild("2.13.0+cu130", cuda="13.0")
    monkeypatch.setattr(torch_support, "installed_build", lambda: build)
    assert polyprof.plugin.installed_build() is build


def test_importing_the_contract_is_cheap_and_torch_free() -> None:
    """Plugins import it while ``polyprof plugins`` lists them: nothing heavy beyond ``import polyprof``."""
    code = (
        "import sys\n"
        "import polyprof\n"
        "before = set(sys.modules)\n"
        "import polyprof.plugin\n"
        "new = sorted(set(sys.modules) - before)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "heavy = [m for m in new if not m.startswith('polyprof.') and m.lstrip('_') != 'queue']\n"
        "assert not heavy, heavy\n"
        "late = {'polyprof.runtime.session', 'polyprof.hooks.registry', 'polyprof.runtime.bus'} & set(new)\n"
        "assert not late, late\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_every_name_is_its_home_module_s_own() -> None:
    """Re-exported, not copied: a name's home module (its old path) gives the same object."""
    for name in sorted(CONTRACT):
        obj = getattr(polyprof.plugin, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)) or obj.__module__.startswith("pluggy"):
            continue
        if obj.__module__ == "polyprof.plugin":
            assert name == "installed_build", f"polyprof.plugin.{name} is defined there, not re-exported"
            continue
        assert getattr(importlib.import_module(obj.__module__), obj.__name__) is obj, name


def test_the_logging_and_warning_entry_points_are_public() -> None:
    from polyprof.base import log, user_warnings

    assert polyprof.plugin.get_logger is log.get_logger
    assert polyprof.plugin.ActivityUnavailableWarning is user_warnings.ActivityUnavailableWarning
    assert issubclass(polyprof.plugin.ActivityUnavailableWarning, polyprof.plugin.PolyprofWarning)
    assert isinstance(polyprof.plugin.get_logger("polyprof_plugin"), polyprof.plugin.Logger)


# ------------------------------------------------------------------- the plugins


def gpu_sources(*, tests: bool) -> Iterator[Path]:
    for folder, package in GPU_DISTRIBUTIONS:
        yield from sorted((ROOT / folder / package).rglob("*.py"))
        if tests:
            yield from sorted((ROOT / folder / "tests").rglob("*.py"))


def builtin_sources() -> Iterator[Path]:
    """The built-in plugins, every one held to the contract (the essential ones live in the core)."""
    yield from sorted(BUILTINS.rglob("*.py"))


def example_sources(*, tests: bool) -> Iterator[Path]:
    yield from sorted((EXAMPLE / "polyprof_example_exporter").glob("*.py"))
    if tests:
        yield from sorted((EXAMPLE / "tests").glob("*.py"))


def plugin_sources() -> Iterator[Path]:
    """Every plugin package held to the contract (not tests, which may also import ``polyprof.testing``)."""
    yield from gpu_sources(tests=False)
    yield from builtin_sources()
    yield from example_sources(tests=False)


def polyprof_imports(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name or None) for each import of polyprof or one of its modules in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "polyprof" or alias.name.startswith("polyprof."):
                    yield node.lineno, alias.name, None
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module is not None
            and (node.module == "polyprof" or node.module.startswith("polyprof."))
        ):
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def outside_the_contract(path: Path, *, tests: bool = False) -> list[str]:
    """``path``'s imports of polyprof that are not ``polyprof.plugin`` (nor, in tests, ``polyprof.testing``).

    Allowed: ``import polyprof.plugin``, ``from polyprof import plugin`` and ``from polyprof.plugin
    import NAME`` for a contract name. ``import polyprof`` alone is not: a plugin uses nothing else of it.
    """
    modules = {CONTRACT_MODULE, TESTING_MODULE} if tests else {CONTRACT_MODULE}
    outside = []
    for line, module, name in polyprof_imports(path):
        if module == CONTRACT_MODULE:
            allowed = name is None or name in CONTRACT
        elif module == "polyprof" and name is not None:
            allowed = f"polyprof.{name}" in modules
        else:
            allowed = module in modules
        if not allowed:
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            outside.append(f"{where}:{line}: {module}{'.' + name if name else ''}")
    return outside


def test_the_plugins_import_only_the_contract() -> None:
    """polyprof-cuda, polyprof-xpu, the built-ins and the example exporter import it alone."""
    outside = [line for path in plugin_sources() for line in outside_the_contract(path)]
    assert not outside, "imports outside polyprof.plugin (the guide's section 5):\n" + "\n".join(outside)


def test_the_example_exporter_s_tests_use_the_contract_and_polyprof_testing_only() -> None:
    """Third parties copy the example: its tests import ``polyprof.plugin`` and ``polyprof.testing`` only."""
    outside = [
        line for path in example_sources(tests=True) for line in outside_the_contract(path, tests=True)
    ]
    assert not outside, "\n".join(outside)


def test_every_builtin_is_held_to_the_contract() -> None:
    """No exemption: what is in ``polyprof_builtins`` is a plugin like any other; the built-ins that
    use the core's internals (``torch_cpu``, ``chrome_trace``, ``parquet_trace``) live in the core."""
    held = {path.relative_to(BUILTINS).as_posix() for path in builtin_sources()}
    assert {"__init__.py", "key_averages.py", "stacks.py", "itt_export.py"} <= held
    assert not held & {"torch_cpu.py", "own_frames.py", "chrome_trace.py", "parquet_trace.py"}


def test_the_scan_refuses_what_is_not_the_contract(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import polyprof\nimport polyprof.plugin\nfrom polyprof import plugin, testing\n"
        "from polyprof.plugin import Exporter, _private, registry\n"
        "from polyprof.base.events import EventKind\n"
    )
    refused = [line.split(": ", 1)[1] for line in outside_the_contract(sample)]
    assert refused == [
        "polyprof",
        "polyprof.testing",
        "polyprof.plugin._private",
        "polyprof.plugin.registry",
        "polyprof.base.events.EventKind",
    ]
    assert [line.split(": ", 1)[1] for line in outside_the_contract(sample, tests=True)] == [
        "polyprof",
        "polyprof.plugin._private",
        "polyprof.plugin.registry",
        "polyprof.base.events.EventKind",
    ]


def test_the_plugins_import_nothing_private_of_polyprof() -> None:
    """Sources and tests: no ``polyprof._*`` module and no ``_name`` from any polyprof module."""
    private = []
    for path in [*gpu_sources(tests=True), *builtin_sources(), *example_sources(tests=True)]:
        for line, module, name in polyprof_imports(path):
            parts = [*module.split("."), *([name] if name else [])]
            if any(part.startswith("_") for part in parts):
                private.append(f"{path.relative_to(ROOT)}:{line}: {'.'.join(parts)}")
    assert not private, "private polyprof names imported:\n" + "\n".join(private)


def test_the_scan_sees_a_private_import(tmp_path: Path) -> None:
    """The scan reads every import form that could reach a private name."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import polyprof._log\nfrom polyprof import _log\n"
        "from polyprof.runtime.session import user_stacklevel as u\n"
        "def f():\n    from polyprof.runtime.session import _internal_frame\n"
    )
    assert sorted(polyprof_imports(sample)) == [
        (1, "polyprof._log", None),
        (2, "polyprof", "_log"),
        (3, "polyprof.runtime.session", "user_stacklevel"),
        (5, "polyprof.runtime.session", "_internal_frame"),
    ]


def guide_code_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.MULTILINE | re.DOTALL)


def test_every_code_sample_of_the_guide_imports_from_the_contract() -> None:
    """Plugin code imports ``polyprof.plugin`` (tests also ``polyprof.testing``); a user's, ``polyprof``."""
    blocks = guide_code_blocks()
    assert len(blocks) >= 8
    for number, block in enumerate(blocks, 1):
        tree = ast.parse(textwrap.dedent(block), f"guide sample {number}")
        imports = [
            (node.module if isinstance(node, ast.ImportFrom) else alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        ]
        polyprof_modules = {m for m in imports if m and (m == "polyprof" or m.startswith("polyprof."))}
        assert polyprof_modules <= {"polyprof", CONTRACT_MODULE, TESTING_MODULE}, (number, polyprof_modules)
        if "hookimpl" in block:  # a plugin: everything from the contract, nothing through ``import polyprof``
            assert "polyprof" not in polyprof_modules and "polyprof.hookimpl" not in block, block[:200]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == CONTRACT_MODULE:
                unknown = {alias.name for alias in node.names} - CONTRACT
                assert not unknown, f"guide sample {number} imports {sorted(unknown)}, not in the contract"


@pytest.mark.parametrize("package", [package for _, package in GPU_DISTRIBUTIONS])
def test_every_module_of_the_gpu_distributions_imports(package: str) -> None:
    top = importlib.import_module(package)
    names = [info.name for info in pkgutil.walk_packages(top.__path__, prefix=f"{package}.")]
    files = sorted(p.stem for p in Path(top.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert sorted(name.rsplit(".", 1)[1] for name in names) == files
    for name in names:
        importlib.import_module(name)


@pytest.mark.parametrize(("folder", "package"), GPU_DISTRIBUTIONS)
def test_the_gpu_distributions_are_typed_and_pin_a_compatible_polyprof(folder: str, package: str) -> None:
    project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-data"][package] == ["py.typed"]
    assert (ROOT / folder / package / "py.typed").is_file()
    assert (Path(importlib.import_module(package).__file__).parent / "py.typed").is_file()
    [pin] = [Requirement(r) for r in project["project"]["dependencies"] if Requirement(r).name == "polyprof"]
    major, minor, _ = (int(part) for part in polyprof.__version__.split("."))
    assert pin.specifier.contains(polyprof.__version__), f"{pin} excludes this polyprof"
    assert not pin.specifier.contains(f"{major}.{minor + 1}.0"), f"{pin} has no upper bound"


@pytest.mark.slow
@pytest.mark.parametrize(("folder", "package"), GPU_DISTRIBUTIONS)
def test_the_gpu_wheels_ship_py_typed_and_the_pin(folder: str, package: str, tmp_path: Path) -> None:
    """The wheel, not just the checkout: ``py.typed`` inside, the tests outside, the polyprof pin declared."""
    source = tmp_path / folder
    shutil.copytree(
        ROOT / folder, source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build")
    )
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = tmp_path.glob(f"{package}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
        requires = [
            Requirement(line.split(":", 1)[1].strip())
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    assert f"{package}/py.typed" in names and f"{package}/plugin.py" in names
    assert not any(name.startswith(("tests/", f"{package}/tests/")) for name in names)
    [pin] = [r for r in requires if r.name == "polyprof"]
    major, minor, _ = (int(part) for part in polyprof.__version__.split("."))
    assert pin.specifier.contains(polyprof.__version__)
    assert not pin.specifier.contains(f"{major}.{minor + 1}.0")


def test_the_gpu_distributions_carry_their_own_tests() -> None:
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())
    testpaths = core["tool"]["pytest"]["ini_options"]["testpaths"]
    for folder, _ in GPU_DISTRIBUTIONS:
        assert f"{folder}/tests" in testpaths, "the whole-suite run must collect them"
        assert list((ROOT / folder / "tests").glob("test_*.py"))
    assert not (ROOT / "tests" / "cuda").exists() and not (ROOT / "tests" / "xpu").exists()


# ---------------------------------------------------------------- hooks and guide


def hookspec_signatures() -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(fn).parameters)
        for name, fn in vars(hookspecs).items()
        if name.startswith("polyprof_") and hasattr(fn, "polyprof_spec")
    }


def arguments(text: str) -> list[str]:
    """``"config, name"`` or ``"self, config: ProfileConfig"`` -> the parameter names, ``self`` left out."""
    names = [part.split(":")[0].split("=")[0].strip().lstrip("*") for part in text.split(",")]
    return [name for name in names if name and name != "self"]


def test_every_hook_has_its_heading_in_the_guide_with_its_arguments() -> None:
    headings = {
        name: arguments(args)
        for name, args in re.findall(r"^### `(polyprof_\w+)\(([^)]*)\)", guide_section(3), re.MULTILINE)
    }
    assert headings == hookspec_signatures()


def test_every_hook_the_guide_names_exists_with_those_arguments() -> None:
    """Anywhere in the guide, ``polyprof_x(...)`` is a hook; an implementation may take a subset."""
    specs = hookspec_signatures()
    mentions = re.findall(r"\b(polyprof_\w+)\(([^()]*)\)", GUIDE.read_text())
    assert len(mentions) > len(specs)
    for name, args in mentions:
        assert name in specs, f"the guide names a hook {name!r} that hookspecs.py does not have"
        extra = set(arguments(args)) - set(specs[name])
        assert not extra, f"the guide gives {name} arguments it does not have: {sorted(extra)}"


def test_the_arguments_test_reads_signatures() -> None:
    assert arguments("config, name") == ["config", "name"]
    assert arguments("self, config: ProfileConfig, *, n=10, **options") == ["config", "n", "options"]
    assert arguments("") == []


COMPONENTS = {"Tracer": Tracer, "Subscriber": Subscriber, "Aggregator": Aggregator, "Exporter": Exporter}


def component_bullets() -> dict[str, str]:
    """Section 4's bullet of each component class."""
    bullets = re.split(r"^- \*\*`(\w+)`\*\*:", guide_section(4), flags=re.MULTILINE)
    return {bullets[i]: bullets[i + 1] for i in range(1, len(bullets), 2)}


def public_members(cls: type) -> set[str]:
    """What a component class declares, its bases' included (attributes, annotations, methods)."""
    members: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__ == "abc":
            continue
        members |= {name for name in vars(klass) if not name.startswith("_")}
        members |= {name for name in getattr(klass, "__annotations__", {}) if not name.startswith("_")}
    return members


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_the_guide_documents_each_component_method_as_declared(component: str) -> None:
    cls = COMPONENTS[component]
    text = component_bullets()[component]
    documented_calls = dict(re.findall(r"`(\w+)\(([^()]*)\)(?: -> [^`]*)?`", text))
    for method, args in documented_calls.items():
        assert callable(getattr(cls, method, None)), f"the guide gives {component}.{method}(), which it lacks"
        declared = [p for p in inspect.signature(getattr(cls, method)).parameters if p != "self"]
        assert arguments(args) == declared, f"{component}.{method}: guide {args!r}, code {declared}"
    documented = {name for name in BACKTICKED_NAME.findall(text)} | set(documented_calls)
    missing = public_members(cls) - documented
    assert not missing, f"section 4 does not document {component}'s {sorted(missing)}"


# -------------------------------------------------- the session calls declared methods


class ConfigRecordingTracer(FakeTracer):
    """Remembers each configuration handed over, as a tracer keeping its own state would."""

    def __init__(self) -> None:
        super().__init__()
        self.trace_ids: list[str] = []

    def configure(self, config: ProfileConfig) -> None:
        super().configure(config)
        self.trace_ids.append(config.trace_id)


def profile_cycles(tracer: Tracer, trace_ids: list[str]) -> None:
    """Record ``len(trace_ids)`` cycles of one profile with ``tracer`` as its only tracer."""
    pm = make_plugin_manager_for_tests(ComponentPlugin(tracers=[tracer]))
    ids = iter(trace_ids)
    with polyprof.profile(
        activities=[ProfilerActivity.CPU],
        plugin_manager=pm,
        schedule=polyprof.schedule(wait=0, warmup=0, active=1, repeat=len(trace_ids)),
        custom_trace_id_callback=lambda: next(ids),
        on_trace_ready=lambda prof: None,
    ) as prof:
        for _ in trace_ids:
            prof.step()


def test_each_cycles_configuration_reaches_the_tracer_through_configure() -> None:
    tracer = ConfigRecordingTracer()
    profile_cycles(tracer, ["FIRST", "SECOND"])
    assert tracer.trace_ids == ["FIRST", "SECOND"]
    assert tracer.config.trace_id == "SECOND"


def test_the_default_configure_keeps_the_configuration() -> None:
    """A tracer written before ``configure`` existed (no override) still gets ``config``."""
    tracer = FakeTracer()
    profile_cycles(tracer, ["ONLY"])
    assert tracer.config.trace_id == "ONLY"
    assert tracer.config.activities == frozenset({ProfilerActivity.CPU})


def test_a_tracer_that_cannot_pause_refuses_naming_itself_and_the_activities() -> None:
    tracer = FakeTracer(name="no_pause", activities=("cpu", "cuda"))
    with pytest.raises(
        NotImplementedError, match=r"^tracer 'no_pause' cannot pause collection of CPU, CUDA$"
    ):
        tracer.toggle_collection(False, frozenset(ProfilerActivity))
    pm = make_plugin_manager_for_tests(ComponentPlugin(tracers=[FakeTracer(name="no_pause")]))
    with (
        polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=pm) as prof,
        pytest.raises(NotImplementedError, match=r"tracer 'no_pause' cannot pause collection of CPU"),
    ):
        prof.toggle_collection_dynamic(False, [ProfilerActivity.CPU])


class PausingTracer(FakeTracer):
    def __init__(self) -> None:
        super().__init__(name="pausing")
        self.toggles: list[tuple[bool, frozenset[ProfilerActivity]]] = []

    def toggle_collection(self, enable: bool, activities: frozenset[ProfilerActivity]) -> None:
        self.toggles.append((enable, activities))


def test_the_session_asks_the_tracers_of_the_toggled_activities() -> None:
    pausing = PausingTracer()
    pm = make_plugin_manager_for_tests(ComponentPlugin(tracers=[pausing]))
    with polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=pm) as prof:
        prof.toggle_collection_dynamic(False, [ProfilerActivity.CPU])
        prof.toggle_collection_dynamic(True, ["cpu"])
        prof.toggle_collection_dynamic(False, [ProfilerActivity.CUDA])  # none of its activities: not asked
    cpu = frozenset({ProfilerActivity.CPU})
    assert pausing.toggles == [(False, cpu), (True, cpu)]
