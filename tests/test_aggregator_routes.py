"""One route to every ``key_averages`` table, whichever aggregator is installed (issue 11, house item 2).

``prof.key_averages()``, ``prof.events().key_averages()``, the legacy
profile's ``key_averages()`` and the autograd shim's all ask the session's
``key_averages`` aggregator the same way, so a third-party aggregator gives
one answer everywhere. The core imports none of its own plugins, and the
aggregator gets the event tree through its contract, not from a module cache.
"""

from __future__ import annotations

import ast
import collections
import types
import weakref
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

import polyprof
import polyprof.legacy
import polyprof.shim
from polyprof.analysis.averages import Aggregator
from polyprof.analysis.event_list import wrap_key_averages
from polyprof.analysis.function_events import FunctionEventAvg
from polyprof.analysis.tree import tree_for
from polyprof.base.errors import PolyprofDeprecationWarning
from polyprof.base.events import concat
from polyprof.testing import ComponentPlugin, FakeTracer, make_event_batch, make_plugin_manager_for_tests
from polyprof_builtins.key_averages import KeyAverages

US = 1000
#: Two threads; ``outer`` contains both matrix products, one op appears twice.
OPS = [
    {"name": "outer", "start_ns": 0, "dur_ns": 500 * US, "thread": 1, "correlation_id": 1},
    {"name": "aten::mm", "start_ns": 10 * US, "dur_ns": 100 * US, "thread": 1, "correlation_id": 2},
    {"name": "aten::relu", "start_ns": 200 * US, "dur_ns": 50 * US, "thread": 1, "correlation_id": 3},
    {"name": "aten::mm", "start_ns": 300 * US, "dur_ns": 40 * US, "thread": 1, "correlation_id": 4},
    {"name": "aten::add", "start_ns": 20 * US, "dur_ns": 7 * US, "thread": 2, "correlation_id": 5},
]


class OffsetTracer(FakeTracer):
    """Emits ``ops`` at stop, their start times counted from the moment it started."""

    def __init__(self, ops: list[dict[str, Any]] = OPS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ops = ops

    def stop(self) -> None:
        base = self.start_ns or 0
        self.batches = (make_event_batch([{**op, "start_ns": base + op["start_ns"]} for op in self.ops]),)
        super().stop()


class NameCounts(Aggregator):
    """A third party's ``key_averages``: one row per name, keyed ``"<name> (plugin)"``, with its count.

    It reads only the raw events of the trace it is given, so it answers under
    any version of the aggregator contract.
    """

    name = "key_averages"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def aggregate(self, trace: Any, **options: Any) -> list[FunctionEventAvg]:
        self.calls.append(options)
        events = trace.events
        table = events.table("name")
        counts = collections.Counter(table[i] for i in events["name"].tolist())
        rows = []
        for name, count in sorted(counts.items()):
            avg = FunctionEventAvg()
            avg.key, avg.count = f"{name} (plugin)", count
            rows.append(avg)
        return rows


def _manager(aggregator: Aggregator) -> Any:
    return make_plugin_manager_for_tests(
        ComponentPlugin(tracers=[OffsetTracer(name="fake_cpu")], aggregators=[aggregator])
    )


def _rows(averages: Any) -> list[tuple[str, int]]:
    return [(avg.key, avg.count) for avg in averages]


EXPECTED_PLUGIN_ROWS = [
    ("aten::add (plugin)", 1),
    ("aten::mm (plugin)", 2),
    ("aten::relu (plugin)", 1),
    ("outer (plugin)", 1),
]


def test_every_route_to_key_averages_asks_the_installed_aggregator() -> None:
    """Before the fix ``prof.events().key_averages()`` bypassed the plugin (built-in rows)."""
    pm = _manager(NameCounts())
    try:
        with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU], plugin_manager=pm) as prof:
            pass
        with polyprof.legacy.profile(plugin_manager=pm) as legacy_prof:
            pass
        with polyprof.shim.AutogradProfile(plugin_manager=pm) as autograd_prof:
            pass
    finally:
        pm.close()
    answers = {
        "prof.key_averages()": _rows(prof.key_averages()),
        "prof.events().key_averages()": _rows(prof.events().key_averages()),
        "legacy key_averages()": _rows(legacy_prof.key_averages()),
        "legacy function_events.key_averages()": _rows(legacy_prof.function_events.key_averages()),
        "autograd key_averages()": _rows(autograd_prof.key_averages()),
        "autograd function_events.key_averages()": _rows(autograd_prof.function_events.key_averages()),
    }
    assert answers == dict.fromkeys(answers, EXPECTED_PLUGIN_ROWS)


class NameCounts01(NameCounts):
    """The same aggregator written against polyprof 0.1's explicit signature (no tree, no rows)."""

    def aggregate(  # type: ignore[override]
        self,
        trace: Any,
        use_device: str | None = None,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
    ) -> list[FunctionEventAvg]:
        return super().aggregate(
            trace,
            use_device=use_device,
            group_by_input_shape=group_by_input_shape,
            group_by_stack_n=group_by_stack_n,
            group_by_overload_name=group_by_overload_name,
        )


def test_an_aggregator_written_for_0_1_still_answers_with_a_deprecation_warning() -> None:
    aggregator = NameCounts01()
    pm = _manager(aggregator)
    try:
        with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU], plugin_manager=pm) as prof:
            pass
    finally:
        pm.close()
    with pytest.warns(PolyprofDeprecationWarning, match="0.1's aggregate"):
        rows = _rows(prof.key_averages(group_by_input_shape=True))
    assert rows == EXPECTED_PLUGIN_ROWS
    # Called as 0.1 called it: use_device, the grouping it names, no tree, rows or newer options.
    assert aggregator.calls[-1] == {
        "use_device": None,
        "group_by_input_shape": True,
        "group_by_stack_n": 0,
        "group_by_overload_name": False,
    }


# --------------------------------------------------------------- the core stands on its own


CORE = Path(polyprof.__file__).parent


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, anywhere in it (functions and TYPE_CHECKING blocks too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def test_no_core_module_imports_the_builtin_plugins() -> None:
    modules = sorted(CORE.rglob("*.py"))
    assert len(modules) > 20  # the scan reads the package, not an empty folder
    offenders = [
        f"{path.name}:{line} imports {module}"
        for path in modules
        for line, module in _imported_modules(path)
        if module == "polyprof_builtins" or module.startswith("polyprof_builtins.")
    ]
    assert offenders == []


# ------------------------------------------------------------- no side channel


def test_no_module_level_cache_carries_trees() -> None:
    """The aggregator gets its tree through ``aggregate(trace, tree=..., rows=...)``, nothing else."""
    import polyprof.analysis.averages
    import polyprof.analysis.results
    import polyprof.analysis.tree

    for module in (polyprof.analysis.tree, polyprof.analysis.results, polyprof.analysis.averages):
        caches = [
            name
            for name, value in vars(module).items()
            if isinstance(value, (weakref.WeakKeyDictionary, weakref.WeakValueDictionary))
        ]
        assert caches == [], f"{module.__name__} keeps {caches}"
    assert not hasattr(polyprof.analysis.tree, "_cache") and not hasattr(
        polyprof.analysis.tree, "remember_tree"
    )


def _cycles_profile(**flags: Any) -> Any:
    torch = pytest.importorskip("torch")
    a = torch.ones(16, 16)
    with polyprof.profile(
        activities=[polyprof.ProfilerActivity.CPU],
        schedule=polyprof.schedule(wait=0, warmup=1, active=1, repeat=2),
        acc_events=True,
        **flags,
    ) as prof:
        for i in range(4):
            with polyprof.record_function(f"step{i}"):
                torch.mm(a, a).relu()
            prof.step()
    return prof


def test_builtin_aggregator_on_a_fresh_trace_gives_the_profiles_numbers() -> None:
    """Two acc_events cycles: a new MergedTrace, unknown to any cache, gives the same table."""
    from polyprof.analysis.tree import MergedTrace  # new with the fix: the trace of several cycles

    prof = _cycles_profile(record_shapes=True)
    results = prof._require_results()
    assert len(results.traces) == 2
    cycles = tuple(attrs.evolve(t) for t in reversed(results.traces))  # new objects, newest first
    fresh = MergedTrace(
        events=concat([c.events for c in cycles], source="fresh"),
        config=cycles[0].config,
        start_ns=0,
        end_ns=1,
        pid=1,
        cycles=cycles,
    )
    tree = tree_for(fresh, results.use_device)
    for grouping in ({}, {"group_by_input_shape": True}):
        summary = KeyAverages().aggregate(fresh, tree=tree, rows=np.arange(len(tree)), **grouping)
        ours = wrap_key_averages(summary, profile_memory=False, with_flops=False)
        expected = prof.key_averages(**grouping)
        assert ours.table(sort_by="self_cpu_time_total") == expected.table(sort_by="self_cpu_time_total")
        assert [(a.key, a.count, a.self_cpu_time_total) for a in ours] == [
            (a.key, a.count, a.self_cpu_time_total) for a in expected
        ]


def test_export_stacks_of_several_cycles_matches_the_event_list(tmp_path: Path) -> None:
    """The stacks exporter reads a MergedTrace's exact tree without any tree planted for it."""
    from torch._C._profiler import _ExperimentalConfig

    prof = _cycles_profile(with_stack=True, experimental_config=_ExperimentalConfig(verbose=True))
    through_exporter = prof.export_stacks(str(tmp_path / "exporter.stacks"))
    through_events = prof.events().export_stacks(str(tmp_path / "events.stacks"))
    text = Path(through_exporter).read_text()
    assert text and text == Path(through_events).read_text()


# ------------------------------------------------------------ the guide's example


def _guide_aggregator_example() -> types.ModuleType:
    """The code block of the plugin author guide's aggregator section, run as a plugin module."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "plugin-author-guide.md").read_text()
    section = guide[guide.index("## 8. Writing an aggregator") : guide.index("## 9. ")]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    module = types.ModuleType("plugin_author_guide_aggregator")
    exec(compile(code, "plugin-author-guide.md#8", "exec"), module.__dict__)  # noqa: S102 - our own docs
    return module


def test_the_guides_aggregator_answers_every_route() -> None:
    example = _guide_aggregator_example()
    step = {"name": "ProfilerStep#3", "start_ns": 0, "dur_ns": 600 * US, "thread": 1, "correlation_id": 9}
    tracer = OffsetTracer([step, *OPS], name="fake_cpu")
    pm = make_plugin_manager_for_tests(ComponentPlugin(tracers=[tracer]), ("guide", example))
    try:
        with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU], plugin_manager=pm) as prof:
            pass
    finally:
        pm.close()
    assert "ProfilerStep*" in {e.key for e in prof.events()}  # recorded, then left out of the averages
    assert {avg.key for avg in prof.key_averages()} == {"outer", "aten::mm", "aten::relu", "aten::add"}
    assert _rows(prof.events().key_averages()) == _rows(prof.key_averages())
