"""Modules with one job each (issue 11, house item 5): what can be checked of each job.

* Which activities a session records is decided by ``polyprof.activity_resolution``
  alone: no other core module raises ``ActivityUnavailableError`` or warns that an
  activity is unavailable.
* ``polyprof.plugin_discovery`` decides which entry points load without importing
  a plugin or calling a hook; ``polyprof.plugin_calls`` calls a hook plugin by
  plugin on any pluggy manager.
* torch's legacy JSON array is written in one place (``polyprof.legacy_trace``).
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
import warnings
from pathlib import Path
from typing import Any

import pluggy
import pytest

import polyprof
from polyprof import _compat, hookspecs
from polyprof.activity import ProfilerActivity
from polyprof.config import ProfileConfig
from polyprof.errors import PolyprofDeprecationWarning, PolyprofWarning
from polyprof.events import DeviceType, EventKind
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
    for path in sorted(CORE.glob("*.py")):
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
    imported = _imported_modules(CORE / "plugin_discovery.py")
    forbidden = {"pluggy", "polyprof.hookspecs", "polyprof.plugin_calls", "polyprof.registry"}
    assert not imported & forbidden


class _NeverLoaded:
    """An entry point that fails the test if anything imports it."""

    def load(self) -> Any:
        raise AssertionError("plugin_discovery imported a plugin")


def _candidate(name: str, distribution: str) -> Any:
    from polyprof.plugin_discovery import EntryPointCandidate

    return EntryPointCandidate(name, f"{distribution}_plugin", distribution, "1.0", _NeverLoaded())


def test_a_plan_blocks_squatters_and_keeps_the_order_without_importing_anything(monkeypatch) -> None:
    from polyprof import plugin_discovery
    from polyprof.plugin_discovery import plan_third_party, resolve_allow_list

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
    from polyprof.plugin_calls import HookCalls

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
        for path in CORE.glob("*.py")
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
    from polyprof.results import ProfileResults

    config = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.XPU})
    return ProfileResults(
        [make_trace(make_event_batch(_device_rows()), config=config)], use_device=use_device
    )


def test_export_chrome_trace_is_the_legacy_writer_over_the_events(tmp_path: Path) -> None:
    from polyprof.legacy_trace import write_legacy_chrome_trace

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
    from polyprof.torch_event_surface import torch_event_surface

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

#: Modules that gather names defined elsewhere, on purpose: the package face and the plugin contract.
FACES = {"polyprof", "polyprof.plugin"}
#: Re-exports still to go (issue 25); this list may only shrink. polyprof.shim is the shims' public
#: module (docs/shims.md, the classes' __module__): a face, or should its names live there?
NOT_YET_ONE_HOME = {
    "polyprof.chrome_reader": {"us_to_ns"},
    "polyprof.legacy": {"ProfilerDisabledError"},
    "polyprof.shim": {"AutogradProfile", "KinetoRequiredError", "LegacyProfile", "ProfilerDisabledError",
                      "TorchProfile"},
    "polyprof.shim_classes": {"AutogradProfile"},
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


def test_only_the_old_modules_and_the_faces_have_a_module_getattr() -> None:
    """The old paths have one mechanism, ``polyprof._compat``: each old module holds only its line."""
    expected = ast.parse("__getattr__ = _compat.moved_names(__name__)").body[0]
    with_getattr = {}
    for path in sorted(CORE.rglob("*.py")):
        for node in _tree(path).body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                with_getattr[_module_name(path)] = "def"
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__getattr__" for t in node.targets
            ):
                assert ast.dump(node) == ast.dump(expected), f"{path.name}: {ast.unparse(node)}"
                with_getattr[_module_name(path)] = "_compat"
    assert with_getattr == {
        **dict.fromkeys(_compat.MOVED, "_compat"),
        **{face: "def" for face in FACES},  # names loaded on first use, none of them deprecated
    }


def test_the_deprecation_warning_is_polyprofs_and_pythons() -> None:
    assert issubclass(PolyprofDeprecationWarning, PolyprofWarning)
    assert issubclass(PolyprofDeprecationWarning, DeprecationWarning)
    assert (_compat.REMOVED_IN, _compat.REMOVAL_DATE) == ("0.3.0", "2027-03-01")


@pytest.mark.parametrize(("old", "name"), MOVED_PATHS)
def test_an_old_path_gives_the_same_object_and_warns_naming_its_home(old: str, name: str) -> None:
    home = _compat.MOVED[old][name]
    assert home != old and not home.startswith("polyprof._")
    module = importlib.import_module(old)
    assert name not in vars(module), f"{old} still binds {name}: reading it there would not warn"
    assert name not in getattr(module, "__all__", ())
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
    from polyprof import function_events

    with pytest.warns(PolyprofDeprecationWarning, match=r"moved to polyprof\.function_events\.") as record:
        from polyprof.results import FunctionEvent  # the old path
    assert FunctionEvent is function_events.FunctionEvent
    assert (record[0].filename, record[0].lineno) == (
        __file__,
        _line_of("from polyprof.results import FunctionEvent"),
    )


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.strip().startswith(text))


@pytest.mark.parametrize("old", sorted(_compat.MOVED))
def test_any_other_name_of_an_old_module_is_the_usual_attribute_error(old: str) -> None:
    with pytest.raises(AttributeError, match=f"^module '{old}' has no attribute 'Nothing'$"):
        importlib.import_module(old).Nothing  # noqa: B018 - the attribute access is the test
