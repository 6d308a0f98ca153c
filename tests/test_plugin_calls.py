"""Calling a hook plugin by plugin through pluggy's public API only (``polyprof.hooks.plugin_calls``).

In the ``plugin_host`` subset (tests/conftest.py), so it runs on every pluggy CI installs: the
floors run's 1.5, the newest-torch run's 1.6 (what GPU images ship) and the whole suite's newest.
pluggy 1.6 broke every profile when this module read ``HookSpec.kwargdefaults`` (added in 1.7) and
called the private ``PluginManager._hookexec``.
"""

from __future__ import annotations

import ast
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

import polyprof
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.hooks import activity_resolution, hookspecs
from polyprof.hooks.components import Capabilities
from polyprof.hooks.plugin_calls import HookCalls
from polyprof.testing import make_plugin_manager_for_tests
from test_docs_environment import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
HOOK = "polyprof_torch_collector_activities"
CONFIG = ProfileConfig(activities={ProfilerActivity.CPU})


class _Directory:
    def __init__(self) -> None:
        self.unavailable: dict[str, str] = {}

    def describe_plugin(self, name: str) -> str:
        return f"plugin {name!r}"

    def distribution_of(self, name: str) -> str | None:
        return None

    def mark_unavailable(self, name: str, reason: str) -> None:
        self.unavailable[name] = reason


class _Answers:
    def __init__(self, answer: list[str]) -> None:
        self.answer = answer

    @polyprof.hookimpl
    def polyprof_torch_collector_activities(self, config: ProfileConfig) -> list[str]:
        return self.answer


class _Wrapper:
    """A new-style wrapper (pluggy 1.1+) that notes every call it wraps and what came back."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @polyprof.hookimpl(wrapper=True)
    def polyprof_torch_collector_activities(self, config: ProfileConfig) -> Iterator[None]:
        results = yield
        self.seen.append(results)
        return results


class _OldStyleWrapper:
    def __init__(self) -> None:
        self.calls = 0

    @polyprof.hookimpl(hookwrapper=True)
    def polyprof_torch_collector_activities(self, config: ProfileConfig) -> Iterator[None]:
        self.calls += 1
        yield


def _manager(*plugins: tuple[str, object]) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, plugin in plugins:
        pm.register(plugin, name=name)
    return pm


def test_each_plugin_is_called_on_its_own_in_pluggys_order() -> None:
    pm = _manager(("first", _Answers(["CUDA"])), ("second", _Answers(["XPU"])))
    calls = HookCalls(pm, _Directory())
    # pluggy calls the last registered first; so does each()
    assert list(calls.each(HOOK, {"config": CONFIG})) == [("second", ["XPU"]), ("first", ["CUDA"])]
    assert pm.hook.polyprof_torch_collector_activities(config=CONFIG) == [["XPU"], ["CUDA"]]


def test_wrappers_run_around_each_plugins_call() -> None:
    wrapper, old_style = _Wrapper(), _OldStyleWrapper()
    pm = _manager(
        ("first", _Answers(["CUDA"])),
        ("wrapper", wrapper),
        ("old-style", old_style),
        ("second", _Answers(["XPU"])),
    )
    calls = HookCalls(pm, _Directory())
    assert [name for name, _ in calls.each(HOOK, {"config": CONFIG})] == ["second", "first"]
    assert wrapper.seen == [[["XPU"]], [["CUDA"]]]
    assert old_style.calls == 2


def test_monitoring_sees_one_call_per_plugin() -> None:
    pm = _manager(("first", _Answers(["CUDA"])), ("second", _Answers(["XPU"])))
    seen: list[list[str]] = []
    pm.add_hookcall_monitoring(
        lambda hook_name, impls, kwargs: seen.append([i.plugin_name for i in impls]),
        lambda outcome, hook_name, impls, kwargs: None,
    )
    list(HookCalls(pm, _Directory()).each(HOOK, {"config": CONFIG}))
    assert seen == [["second"], ["first"]]


def test_only_calls_the_plugin_of_that_implementation() -> None:
    pm = _manager(("first", _Answers(["CUDA"])), ("second", _Answers(["XPU"])))
    [first_impl] = [
        i for i in pm.hook.polyprof_torch_collector_activities.get_hookimpls() if i.plugin_name == "first"
    ]
    calls = HookCalls(pm, _Directory())
    assert list(calls.each(HOOK, {"config": CONFIG}, only=first_impl)) == [("first", ["CUDA"])]


def test_a_firstresult_hook_stops_at_the_first_answer_and_skips_none() -> None:
    class Exporter:
        def __init__(self, answer: object) -> None:
            self.answer = answer
            self.asked = 0

        @polyprof.hookimpl
        def polyprof_make_exporter(self, config: ProfileConfig, name: str) -> object:
            self.asked += 1
            return self.answer

    last, silent, first = Exporter("from last"), Exporter(None), Exporter("from first")
    pm = _manager(("first", first), ("silent", silent), ("last", last))
    calls = HookCalls(pm, _Directory())
    assert list(calls.each("polyprof_make_exporter", {"config": CONFIG, "name": "x"})) == [
        ("last", "from last")
    ]
    assert (last.asked, silent.asked, first.asked) == (1, 0, 0)
    last.answer = None
    assert list(calls.each("polyprof_make_exporter", {"config": CONFIG, "name": "x"})) == [
        ("first", "from first")
    ]
    assert (last.asked, silent.asked, first.asked) == (2, 1, 1)


class _SpecnamePlugin:
    """An implementation under another name (pluggy's ``specname``): before pluggy 1.7,
    ``subset_hook_caller`` kept such a plugin when asked to leave it out."""

    @polyprof.hookimpl(specname=HOOK)
    def collector_activities(self, config: ProfileConfig) -> list[str]:
        return ["SPEC"]


def test_a_plugin_implementing_through_specname_is_called_once() -> None:
    pm = _manager(("plain", _Answers(["CUDA"])), ("spec", _SpecnamePlugin()), ("last", _Answers(["XPU"])))
    calls = HookCalls(pm, _Directory())
    assert list(calls.each(HOOK, {"config": CONFIG})) == [
        ("last", ["XPU"]),
        ("spec", ["SPEC"]),
        ("plain", ["CUDA"]),
    ]


def test_unhashable_plugin_objects_are_called_one_at_a_time() -> None:
    """pluggy keeps the plugins to leave out in a set; an attrs class without a hash cannot go in."""

    class Unhashable(_Answers):
        __hash__ = None  # type: ignore[assignment]

    pm = _manager(("first", Unhashable(["CUDA"])), ("second", Unhashable(["XPU"])))
    calls = HookCalls(pm, _Directory())
    assert list(calls.each(HOOK, {"config": CONFIG})) == [("second", ["XPU"]), ("first", ["CUDA"])]


def test_a_historic_hook_is_refused_naming_the_way() -> None:
    calls = HookCalls(_manager(), _Directory())
    with pytest.raises(ValueError, match="polyprof_addhooks is a historic hook: call it with call_historic"):
        list(calls.each("polyprof_addhooks", {"pluginmanager": None}))


def test_a_plugins_error_is_noted_with_its_name_on_every_python() -> None:
    """Python 3.10 has no ``add_note``: the note goes in PEP 678's ``__notes__`` all the same."""

    class Raises:
        @polyprof.hookimpl
        def polyprof_torch_collector_activities(self, config: ProfileConfig) -> list[str]:
            raise RuntimeError("plugin bug")

    calls = HookCalls(_manager(("raises", Raises())), _Directory())
    with pytest.raises(RuntimeError, match="plugin bug") as err:
        list(calls.each(HOOK, {"config": CONFIG}))
    assert err.value.__notes__ == [f"raised by polyprof plugin 'raises' in {HOOK}"]


def test_a_profile_works_on_the_installed_pluggy() -> None:
    """The failure GPU images met (pluggy 1.6): every profile failed at start."""
    torch = pytest.importorskip("torch")
    with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU]) as prof:
        torch.ones(4).add(1)
    assert any(e.key == "aten::add" for e in prof.key_averages())
    print(f"pluggy {importlib.metadata.version('pluggy')}")


#: The private attributes of pluggy's PluginManager, HookCaller, HookImpl, HookRelay and Result in
#: pluggy 1.5 to 1.7 (read off each), and HookSpec.kwargdefaults (a public name of a class pluggy
#: does not export, added in 1.7). A fixed list: read off the installed pluggy, a private name a
#: later pluggy adds could match one of polyprof's own (``self._lock``).
PLUGGY_PRIVATE = frozenset(
    {
        "_add_hookimpl",
        "_apply_defaults",
        "_call_history",
        "_exception",
        "_hookexec",
        "_hookimpls",
        "_inner_hookexec",
        "_maybe_apply_history",
        "_name2plugin",
        "_orig",
        "_plugin_distinfo",
        "_remove_plugin",
        "_remove_plugins",
        "_result",
        "_traceback",
        "_verify_all_args_are_provided",
        "_verify_hook",
        "kwargdefaults",
    }
)


def test_polyprof_uses_only_pluggys_public_api() -> None:
    """No private attribute of pluggy's classes, and from ``pluggy.`` only the names it exports.

    A pluggy release may change anything private (1.7 added ``HookSpec.kwargdefaults``, which 1.6
    lacks).
    """
    exported = set(pluggy.__all__)
    found = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Attribute):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                if node.attr in PLUGGY_PRIVATE:
                    found.append(f"{where}: .{node.attr}")
                if (
                    isinstance(node.value, ast.Name)
                    and node.value.id == "pluggy"
                    and node.attr not in exported
                ):
                    found.append(f"{where}: pluggy.{node.attr} is not in pluggy.__all__")
    assert not found, "pluggy used outside its public API:\n" + "\n".join(found)


class _AsksTorch:
    """Answers like the GPU plugins: provisionally until "torch" is loaded, then torch's answer."""

    def __init__(self, torch_loaded: list[bool], sees_device: bool) -> None:
        self.torch_loaded = torch_loaded
        self.sees_device = sees_device

    @polyprof.hookimpl
    def polyprof_capabilities(self) -> Capabilities:
        if not self.torch_loaded[0]:
            return Capabilities(
                activities={ProfilerActivity.CUDA},
                unavailable_reason=None if self.sees_device else "no driver files",
                provisional="whether torch sees a GPU",
            )
        reason = None if self.sees_device else "torch sees no CUDA device"
        return Capabilities(activities={ProfilerActivity.CUDA}, unavailable_reason=reason)


@pytest.mark.parametrize("sees_device", [True, False])
def test_a_provisional_answer_is_asked_again_once_torch_is_loaded(sees_device: bool) -> None:
    """polyprof run makes its manager before torch is imported; the profile asks again."""
    torch_loaded = [False]
    plugin = _AsksTorch(torch_loaded, sees_device=not sees_device)  # the provisional answer is wrong
    pm = make_plugin_manager_for_tests(("gpu", plugin))
    first = pm.plugin_info("gpu")
    assert first.provisional == "whether torch sees a GPU"
    assert first.status == ("unavailable" if sees_device else "loaded")
    plugin.sees_device = sees_device
    torch_loaded[0] = True
    pm.confirm_provisional()
    confirmed = pm.plugin_info("gpu")
    assert confirmed.provisional is None
    assert confirmed.status == ("loaded" if sees_device else "unavailable")
    assert (
        ProfilerActivity.CUDA in activity_resolution.supported_activities(pm.plugin_infos())
    ) is sees_device
    assert (pm.get_plugin("gpu") is plugin) is sees_device
