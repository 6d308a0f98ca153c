"""Modules with one job each (issue 11, house item 5): what can be checked of each job.

* Which activities a session records is decided by ``polyprof.hooks.activity_resolution``
  alone: no other core module raises ``ActivityUnavailableError`` or warns that an
  activity is unavailable.
* ``polyprof.hooks.plugin_discovery`` decides which entry points load without importing
  a plugin or calling a hook; ``polyprof.hooks.plugin_calls`` calls a hook plugin by
  plugin on any pluggy manager.
* torch's legacy JSON array is written in one place (``polyprof.formats.legacy_trace``).
* Every name has one home: no module re-exports a name defined elsewhere, but the
  package face (``polyprof``) and the plugin contract (``polyprof.plugin``). A name
  that moved stays readable from its old module, until polyprof 0.3.0, only through
  ``polyprof._compat``: the same object, and a ``PolyprofDeprecationWarning`` naming
  its home.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pluggy
import pytest

import polyprof
from polyprof import _compat
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import PolyprofDeprecationWarning, PolyprofWarning
from polyprof.base.events import DeviceType, EventKind
from polyprof.hooks import hookspecs
from polyprof.testing import make_event_batch, make_trace

CORE = Path(polyprof.__file__).parent


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _called_name(node: ast.AST) -> str | None:
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


# ---------------------------------------------------------------- one activity resolver


def test_only_the_activity_resolver_refuses_or_drops_an_activity() -> None:
    deciders: dict[str, list[str]] = {}
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(_tree(path)):
            raised = isinstance(node, ast.Raise) and node.exc is not None
            if raised and _called_name(node.exc) == "ActivityUnavailableError":
                deciders.setdefault(path.name, []).append(f"raise at line {node.lineno}")
            if isinstance(node, ast.Call) and _called_name(node) == "warn_activity_unavailable":
                deciders.setdefault(path.name, []).append(f"warning at line {node.lineno}")
    assert set(deciders) == {"activity_resolution.py"}, deciders


# ------------------------------------------------------------------------ discovery


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_discovery_neither_loads_plugins_nor_calls_hooks() -> None:
    imported = _imported_modules(CORE / "hooks" / "plugin_discovery.py")
    forbidden = {
        "pluggy",
        "polyprof.hooks.hookspecs",
        "polyprof.hooks.plugin_calls",
        "polyprof.hooks.registry",
    }
    assert not imported & forbidden


class _NeverLoaded:
    """An entry point that fails the test if anything imports it."""

    def load(self) -> Any:
        raise AssertionError("plugin_discovery imported a plugin")


def _candidate(name: str, distribution: str) -> Any:
    from polyprof.hooks.plugin_discovery import EntryPointCandidate

    return EntryPointCandidate(name, f"{distribution}_plugin", distribution, "1.0", _NeverLoaded())


def test_a_plan_blocks_squatters_and_keeps_the_order_without_importing_anything(monkeypatch) -> None:
    from polyprof.hooks import plugin_discovery
    from polyprof.hooks.plugin_discovery import plan_third_party, resolve_allow_list

    monkeypatch.setattr(plugin_discovery, "_contested_warned", set())  # warned once per process

    cuda, squatter, other = (
        _candidate("cuda", "polyprof-cuda"),
        _candidate("cuda", "cuda-squatter"),
        _candidate("zz", "polyprof-zz"),
    )
    third_party = [squatter, cuda, other]
    with pytest.warns(PolyprofWarning, match="polyprof loads polyprof-cuda"):
        plan = plan_third_party(third_party, taken={}, allowed=None, selected=set(), autoload=True)
    # polyprof-cuda owns its name: the squatter is blocked, saying how to pick it
    assert [(d.listed_as, d.loads) for d in plan] == [
        ("cuda (cuda-squatter)", False),
        ("cuda", True),
        ("zz", True),
    ]
    assert plan[0].conflicts_with == ("polyprof-cuda",)
    assert "POLYPROF_PLUGINS=cuda-squatter:cuda" in plan[0].blocked_reason

    selected, unknown = resolve_allow_list(frozenset({"polyprof-cuda:cuda"}), third_party)
    plan = plan_third_party(
        third_party, taken={}, allowed={"polyprof-cuda:cuda"}, selected=selected, autoload=False
    )
    assert [(d.candidate.distribution, d.loads) for d in plan] == [
        ("cuda-squatter", False),
        ("polyprof-cuda", True),
        ("polyprof-zz", False),
    ]
    assert plan[0].blocked_reason == (
        "conflict: entry-point name 'cuda' is also declared by polyprof-cuda, which POLYPROF_PLUGINS picks"
    )
    assert unknown == []

    plan = plan_third_party([other], taken={"zz": "polyprof"}, allowed=None, selected=set(), autoload=True)
    assert not plan[0].loads and "belongs to a plugin polyprof always loads" in plan[0].blocked_reason


# ------------------------------------------------------------------------ hook calls


class _Directory:
    def __init__(self) -> None:
        self.unavailable: dict[str, str] = {}

    def describe_plugin(self, name: str) -> str:
        return f"plugin {name!r} (test-dist 9)"

    def distribution_of(self, name: str) -> str | None:
        return "test-dist"

    def mark_unavailable(self, name: str, reason: str) -> None:
        self.unavailable[name] = reason


class _Answers:
    @polyprof.hookimpl
    def polyprof_torch_collector_activities(self, config: ProfileConfig) -> list[str]:
        return ["CUDA"]


class _Raises:
    @polyprof.hookimpl
    def polyprof_torch_collector_activities(self, config: ProfileConfig) -> list[str]:
        raise RuntimeError("plugin bug")


class _Unavailable:
    @polyprof.hookimpl
    def polyprof_torch_collector_activities(self, config: ProfileConfig) -> list[str]:
        raise polyprof.PluginUnavailable("no device")


def test_hook_calls_isolate_each_plugin_on_a_bare_pluggy_manager() -> None:
    from polyprof.hooks.plugin_calls import HookCalls

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(_Answers(), name="answers")
    pm.register(_Unavailable(), name="away")
    pm.register(_Raises(), name="raises")
    directory = _Directory()
    calls = HookCalls(pm, directory)
    kwargs = {"config": ProfileConfig(activities={ProfilerActivity.CPU})}
    hook = "polyprof_torch_collector_activities"

    assert list(calls.each(hook, kwargs, isolate_errors=True)) == [("answers", ["CUDA"])]
    (failure,) = calls.failures()
    assert (failure.plugin, failure.hook, failure.error) == ("raises", hook, "RuntimeError: plugin bug")
    assert failure.message == (
        "polyprof: skipped plugin 'raises' (test-dist 9) in polyprof_torch_collector_activities: "
        "RuntimeError: plugin bug; profiling goes on without it"
    )
    assert directory.unavailable == {"away": "no device"}

    with pytest.raises(RuntimeError, match="plugin bug") as err:
        list(calls.each(hook, kwargs))
    assert err.value.__notes__ == [
        "raised by polyprof plugin 'raises' in polyprof_torch_collector_activities"
    ]
    with pytest.raises(ValueError, match="no hook named 'polyprof_nope'"):
        list(calls.each("polyprof_nope", {}))


# ---------------------------------------------------------------------- legacy trace


def test_the_legacy_json_array_is_written_in_one_place() -> None:
    writers = sorted(
        path.name
        for path in CORE.rglob("*.py")
        if '"pid": "CPU functions"' in path.read_text(encoding="utf-8")
    )
    assert writers == ["legacy_trace.py"]


BASE_NS = 1_700_000_000 * 10**9


def _device_rows() -> list[dict[str, Any]]:
    host = {"pid": 1, "tid": 2, "device_type": int(DeviceType.XPU), "correlation_id": 9}
    return [
        {"name": "aten::add", "kind": EventKind.CPU_OP, "start_ns": BASE_NS, "dur_ns": 100_000, "pid": 1,
         "tid": 2, "thread": 1, "correlation_id": 5},
        {"name": "urEnqueueKernelLaunch", "kind": EventKind.RUNTIME, "start_ns": BASE_NS + 10_000,
         "dur_ns": 5_000, **host},
        {"name": "zeEventHostSynchronize", "kind": EventKind.SYNC, "start_ns": BASE_NS + 20_000,
         "dur_ns": 5_000, **host},
    ]  # fmt: skip


def _results(use_device: str) -> Any:
    from polyprof.analysis.results import ProfileResults

    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.XPU})
    return ProfileResults(
        [make_trace(make_event_batch(_device_rows()), config=config)], use_device=use_device
    )


def test_export_chrome_trace_is_the_legacy_writer_over_the_events(tmp_path: Path) -> None:
    from polyprof.formats.legacy_trace import write_legacy_chrome_trace

    events = _results("xpu").events()
    by_list = events.export_chrome_trace(str(tmp_path / "list.json"))
    by_writer = write_legacy_chrome_trace(list(events), tmp_path / "writer.json", device_name="xpu")
    assert Path(by_list).read_bytes() == Path(by_writer).read_bytes()
    assert [e["name"] for e in json.loads(Path(by_list).read_text())] == [
        "aten::add",
        "urEnqueueKernelLaunch",
        "zeEventHostSynchronize",
    ]


def test_activity_type_of_rows_without_one_is_the_trace_formats_category_for_the_device() -> None:
    from polyprof.analysis.torch_event_surface import torch_event_surface

    if not torch_event_surface().event_has("activity_type"):
        pytest.skip("the installed torch's FunctionEvent has no activity_type")
    for use_device, prefix in (("xpu", "xpu"), ("cuda", "cuda"), ("mystery", "privateuse1")):
        types = {e.name: e.activity_type for e in _results(use_device).events()}
        assert types == {
            "aten::add": "cpu_op",
            "urEnqueueKernelLaunch": f"{prefix}_runtime",
            "zeEventHostSynchronize": f"{prefix}_sync",  # was cuda_sync whatever the device
        }


# ------------------------------------------------------- one home per name, old paths in _compat

#: Modules that gather names defined elsewhere, on purpose: the public namespaces (pytest's ``pytest``
#: over ``_pytest``): the package, the plugin contract and the three frontends users import by path.
FACES = {"polyprof", "polyprof.plugin", "polyprof.legacy", "polyprof.itt", "polyprof.shim"}
#: Re-exports still to go; this list may only shrink.
NOT_YET_ONE_HOME = {
    "polyprof.formats.chrome_reader": {"us_to_ns"},
    "polyprof.frontends.shim_classes": {"AutogradProfile"},
    "polyprof.testing": {"EventKind"},
}  # fmt: skip
MOVED_PATHS = sorted((old, name) for old, names in _compat.MOVED.items() for name in names)


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _names_bound_by_import(tree: ast.Module) -> set[str]:
    """Top-level names that ``tree`` binds by an import at run time (``TYPE_CHECKING`` blocks left out)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                found |= {(alias.asname or alias.name).split(".")[0] for alias in inner.names}
    return found


def _declared_all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


def test_no_module_re_exports_a_name_defined_elsewhere_but_the_faces() -> None:
    re_exported = {}
    for path in sorted(CORE.rglob("*.py")):
        module = _module_name(path)
        if module in FACES:
            continue
        tree = _tree(path)
        names = set(_declared_all(tree)) & _names_bound_by_import(tree)
        if names - NOT_YET_ONE_HOME.get(module, set()):
            re_exported[module] = sorted(names)
    assert not re_exported, f"re-exported from another module (import them from their home): {re_exported}"


@pytest.mark.parametrize("face", sorted(FACES - {"polyprof", "polyprof.plugin"}))
def test_a_frontends_public_namespace_defines_nothing_and_re_exports_its_home(face: str) -> None:
    """``polyprof.legacy``, ``.itt`` and ``.shim``: the paths users import; the code is in frontends."""
    module = importlib.import_module(face)
    tree = _tree(Path(module.__file__ or ""))
    assert all(isinstance(node, (ast.Expr, ast.ImportFrom, ast.Assign)) for node in tree.body)
    home = importlib.import_module(face.replace("polyprof.", "polyprof.frontends."))
    for name in home.__all__:
        assert getattr(module, name) is getattr(home, name), name
    assert set(module.__all__) >= set(home.__all__)


def test_no_module_but_the_faces_has_a_module_getattr() -> None:
    """Old paths have one mechanism, ``polyprof._compat``'s finder: no module carries a ``__getattr__``."""
    with_getattr = {}
    for path in sorted(CORE.rglob("*.py")):
        for node in _tree(path).body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                with_getattr[_module_name(path)] = "def"
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__getattr__" for t in node.targets
            ):
                with_getattr[_module_name(path)] = "assigned"
    # names loaded on first use, none of them deprecated
    assert with_getattr == {"polyprof": "def", "polyprof.plugin": "def"}


def test_the_deprecation_warning_is_polyprofs_and_pythons() -> None:
    assert issubclass(PolyprofDeprecationWarning, PolyprofWarning)
    assert issubclass(PolyprofDeprecationWarning, DeprecationWarning)
    assert (_compat.REMOVED_IN, _compat.REMOVAL_DATE) == ("0.3.0", "2027-03-01")


def _import_old(old: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PolyprofDeprecationWarning)
        return importlib.import_module(old)


@pytest.mark.parametrize(("old", "name"), MOVED_PATHS)
def test_an_old_path_gives_the_same_object_and_warns_naming_its_home(old: str, name: str) -> None:
    home = _compat.MOVED[old][name]
    assert home != old and not home.startswith("polyprof._")
    module = _import_old(old)
    assert name not in vars(module), f"{old} still binds {name}: reading it there would not warn"
    assert not hasattr(importlib.import_module(_compat.MOVED_MODULES[old]), name), "two homes"
    with pytest.warns(PolyprofDeprecationWarning) as record:
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(home), name)
    (warning,) = record
    message = str(warning.message)
    assert f"{old}.{name} has moved to {home}.{name}" in message
    assert "polyprof 0.3.0, not before 2027-03-01" in message
    contract = importlib.import_module("polyprof.plugin")
    assert ("a plugin imports it from polyprof.plugin" in message) == (name in contract.__all__)
    assert warning.filename == __file__  # the line that read the old path, not polyprof's
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert getattr(module, name) is value
    assert len(again) == 1  # every read warns: Python's filters decide how often it shows


def test_an_old_import_statement_warns_at_its_line() -> None:
    from polyprof.analysis import function_events

    sys.modules.pop("polyprof.results", None)  # imported afresh, so that the module's warning shows
    with pytest.warns(PolyprofDeprecationWarning) as record:
        from polyprof.results import FunctionEvent  # the old path
    assert FunctionEvent is function_events.FunctionEvent
    line = _line_of("from polyprof.results import FunctionEvent")
    assert [(str(w.message).split(";")[0], w.filename, w.lineno) for w in record] == [
        ("the module polyprof.results has moved to polyprof.analysis.results", __file__, line),
        (
            "polyprof.results.FunctionEvent has moved to polyprof.analysis.function_events.FunctionEvent",
            __file__,
            line,
        ),
    ]


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.strip().startswith(text))


def _real_module_file(old: str) -> Path:
    """Where a real module at the path ``old`` would be: in its top package's folder (``polyprof``'s in
    core/, ``polyprof_builtins``' in plugins/)."""
    top, *rest = old.split(".")
    folder = Path(importlib.import_module(top).__file__ or "").parent
    return (folder / Path(*rest)).with_suffix(".py")


@pytest.mark.parametrize("old", sorted(_compat.MOVED_MODULES))
def test_an_old_module_path_is_the_new_module_with_a_warning_at_the_importing_line(old: str) -> None:
    new = _compat.MOVED_MODULES[old]
    real = _real_module_file(old)
    assert real.parent.is_dir() and not real.exists(), f"a real module is there: {real}"
    home = importlib.import_module(new)
    sys.modules.pop(old, None)
    with pytest.warns(PolyprofDeprecationWarning) as record:
        module = importlib.import_module(old)
    (warning,) = record
    assert str(warning.message) == (
        f"the module {old} has moved to {new}; the old path is removed in polyprof 0.3.0, "
        "not before 2027-03-01"
    )
    assert warning.filename == __file__
    assert (module is home) == (old not in _compat.MOVED)
    public = getattr(home, "__all__", None) or [n for n in vars(home) if not n.startswith("__")]
    for name in public:
        assert getattr(module, name) is getattr(home, name), name
    assert set(dir(module)) >= set(public)


def test_a_name_set_on_an_old_module_path_reaches_the_module_that_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from polyprof.base import terminal

    original = terminal.terminal_safe
    old = _import_old("polyprof.terminal")
    monkeypatch.setattr(old, "terminal_safe", lambda text: "patched")
    assert terminal.terminal_safe("x") == "patched"
    monkeypatch.undo()  # and undoing it puts the module's own function back
    assert terminal.terminal_safe is original


def test_the_finder_answers_only_for_the_old_paths() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("polyprof.no_such_module")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolyprofDeprecationWarning)
        importlib.import_module("polyprof.analysis.tree")  # a real path: no warning
        importlib.import_module("polyprof.legacy")  # a public namespace, not an old path


def test_an_old_builtin_path_imports_in_a_fresh_interpreter() -> None:
    """``polyprof_builtins`` imports polyprof first, which installs the finder of the old paths."""
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import polyprof_builtins.own_frames as old\n"
        "from polyprof.base.errors import PolyprofDeprecationWarning\n"
        "from polyprof.runtime import own_frames\n"
        "assert old.without_own_frames is own_frames.without_own_frames\n"
        "print([str(w.message).split(';')[0] for w in caught if w.category is PolyprofDeprecationWarning])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=CORE.parent.parent,  # the checkout, for a relative PYTHONPATH
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "['the module polyprof_builtins.own_frames has moved to polyprof.runtime.own_frames']"
    )


@pytest.mark.parametrize("old", sorted({*_compat.MOVED, "polyprof.tree"}))
def test_any_other_name_of_an_old_module_is_the_usual_attribute_error(old: str) -> None:
    named = old if old in _compat.MOVED else _compat.MOVED_MODULES[old]  # an alias is the module
    with pytest.raises(AttributeError, match=f"^module '{named}' has no attribute 'Nothing'$"):
        _import_old(old).Nothing  # noqa: B018 - the attribute access is the test


def test_an_old_path_without_moved_names_is_the_new_module_itself() -> None:
    """The same object under both names: pluggy's static look-up and isinstance see what they saw,
    and the module keeps its own spec (``importlib.reload`` reads it)."""
    from polyprof.analysis import tree

    old = _import_old("polyprof.tree")
    assert old is tree and sys.modules["polyprof.tree"] is tree
    assert tree.__spec__ is not None and tree.__spec__.name == "polyprof.analysis.tree"
    assert tree.__spec__.origin == tree.__file__


def test_an_old_plugin_path_registers_its_hooks() -> None:
    """A plugin registered by an old path (an entry point not reinstalled) keeps its hooks."""
    from polyprof.testing import make_plugin_manager_for_tests

    old = _import_old("polyprof_builtins.chrome_trace")
    manager = make_plugin_manager_for_tests(old)
    assert manager.hook.polyprof_make_exporter.get_hookimpls(), "no hook found on the old path"


def test_an_old_module_read_as_an_attribute_of_the_package_resolves_and_warns_here() -> None:
    """0.2.0's ``import polyprof`` loaded ``polyprof.config``: ``polyprof.config.X`` still works."""
    from polyprof.base.config import ProfileArgumentError

    sys.modules.pop("polyprof.config", None)
    vars(polyprof).pop("config", None)
    with pytest.warns(PolyprofDeprecationWarning, match="polyprof.config has moved") as record:
        error = polyprof.config.ProfileArgumentError
    assert error is ProfileArgumentError
    assert (record[0].filename, record[0].lineno) == (
        __file__,
        _line_of("error = polyprof.config.ProfileArgumentError"),
    )
    with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
        polyprof.no_such_module  # noqa: B018 - the attribute access is the test


def test_nested_patches_through_a_stand_in_unwind_in_order() -> None:
    """unittest.mock on an old path with moved names (a stand-in): each exit restores its own."""
    from unittest import mock

    from polyprof.hooks import registry

    original = registry.make_plugin_manager
    with mock.patch("polyprof.registry.make_plugin_manager", "A"):
        with mock.patch("polyprof.registry.make_plugin_manager", "B"):
            assert registry.make_plugin_manager == "B"
        assert registry.make_plugin_manager == "A"
    assert registry.make_plugin_manager is original
