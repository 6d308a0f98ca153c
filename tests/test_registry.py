"""The plugin registry: guarded loading, opt-outs, activity resolution, component building.

Entry points come from fake distributions (``importlib.metadata.distributions``
is monkeypatched, as pluggy's own tests do); the plugin modules they name are
real files written to a temporary directory.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyprof
from polyprof.analysis.averages import Aggregator
from polyprof.base.activity import ProfilerActivity
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import ActivityUnavailableError, PluginLoadError, PluginUnavailable, PolyprofWarning
from polyprof.hooks import activity_resolution
from polyprof.hooks.components import Capabilities, Exporter, Subscriber
from polyprof.hooks.plugin_calls import PluginCallError
from polyprof.hooks.plugin_discovery import (
    ALLOW_LIST_ENV,
    BUILTIN_PLUGINS,
    DISABLE_AUTOLOAD_ENV,
    discover_entry_points,
    env_flag,
    parse_allow_list,
)
from polyprof.hooks.plugin_info import PluginInfo
from polyprof.hooks.registry import (
    TRACE_ENV,
    PolyprofPluginManager,
    UnknownExporterError,
    make_plugin_manager,
)
from polyprof.testing import (
    ComponentPlugin,
    FakeTracer,
    InMemoryExporter,
    make_event_batch,
    make_plugin_manager_for_tests,
    make_trace,
)

PLUGIN_SOURCES = {
    "pp_fake_valid": """
        from polyprof import hookimpl
        from polyprof.hooks.components import Capabilities
        from polyprof.testing import InMemoryExporter

        @hookimpl
        def polyprof_capabilities():
            return Capabilities(exporters=("fake",))

        @hookimpl
        def polyprof_make_exporter(config, name):
            return InMemoryExporter(name="fake") if name == "fake" else None
    """,
    "pp_fake_other": """
        from polyprof import hookimpl
        from polyprof.hooks.components import Capabilities
        from polyprof.testing import InMemoryExporter

        @hookimpl
        def polyprof_capabilities():
            return Capabilities(exporters=("other",))

        @hookimpl
        def polyprof_make_exporter(config, name):
            return InMemoryExporter(name="other") if name == "other" else None
    """,
    "pp_fake_broken": """
        import polyprof
        raise ImportError("libfake.so.1: cannot open shared object file")
    """,
    "pp_fake_unavailable": """
        from polyprof.base.errors import PluginUnavailable
        raise PluginUnavailable("no FakeDevice driver (libfakedev not found)")
    """,
    "pp_fake_typo": """
        from polyprof import hookimpl

        @hookimpl
        def polyprof_make_exporterz(config, name):
            return None
    """,
    "pp_fake_badsig": """
        from polyprof import hookimpl

        @hookimpl
        def polyprof_make_exporter(config, name, colour):
            return None
    """,
    "pp_fake_cuda": """
        from polyprof.base.errors import PluginUnavailable
        raise PluginUnavailable("no CUDA driver found")
    """,
    "pp_fake_stacks": """
        from polyprof import hookimpl
        from polyprof.hooks.components import Capabilities

        LOADED_FROM_ENTRY_POINT = True

        @hookimpl
        def polyprof_capabilities():
            return Capabilities(exporters=("fake_stacks",))
    """,
}


class FakeDistribution:
    """Just what the registry reads from an ``importlib.metadata.Distribution``."""

    def __init__(
        self, name: str, version: str, entry_points: dict[str, str], group: str = "polyprof"
    ) -> None:
        self.metadata = {"Name": name}
        self.version = version
        self.entry_points = [importlib.metadata.EntryPoint(n, v, group) for n, v in entry_points.items()]
        # Entry points of other groups are ignored.
        self.entry_points.append(importlib.metadata.EntryPoint("unrelated", "json", "console_scripts"))


class BrokenDistribution:
    @property
    def metadata(self):
        raise OSError("METADATA unreadable")


FAKES = FakeDistribution(
    "polyprof-fakes",
    "1.2.3",
    {
        "valid": "pp_fake_valid",
        "broken": "pp_fake_broken",
        "unavailable": "pp_fake_unavailable",
        "typo": "pp_fake_typo",
        "badsig": "pp_fake_badsig",
        "missing": "pp_fake_does_not_exist",
    },
)
OTHER = FakeDistribution("polyprof-other", "0.9", {"other": "pp_fake_other"})
CUDA = FakeDistribution("polyprof_cuda", "0.3.1", {"cuda": "pp_fake_cuda"})
CONFIG = ProfileConfig(activities={ProfilerActivity.CPU})


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake_plugins")
    for module, source in PLUGIN_SOURCES.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for module in PLUGIN_SOURCES:
        sys.modules.pop(module, None)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in (DISABLE_AUTOLOAD_ENV, ALLOW_LIST_ENV, TRACE_ENV):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def installed(monkeypatch, plugin_dir):
    """``installed(dist, ...)``: make these the only installed distributions."""

    def install(*dists):
        monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter(dists))

    return install


def infos_by_name(pm: PolyprofPluginManager) -> dict[str, PluginInfo]:
    return {info.name: info for info in pm.plugin_infos()}


# ------------------------------------------------------------------ guarded loading


def test_guarded_loading_records_each_outcome_and_goes_on(installed, caplog):
    installed(FAKES)
    with caplog.at_level(logging.WARNING, logger="polyprof.hooks.registry"):
        pm = make_plugin_manager(builtins=False)
    infos = infos_by_name(pm)
    assert set(infos) == {"valid", "broken", "unavailable", "typo", "badsig", "missing"}

    valid = infos["valid"]
    assert (valid.status, valid.distribution, valid.version, valid.module) == (
        "loaded",
        "polyprof-fakes",
        "1.2.3",
        "pp_fake_valid",
    )
    assert valid.capabilities == Capabilities(exporters=("fake",))
    assert valid.hooks == ("polyprof_capabilities", "polyprof_make_exporter")
    assert not valid.builtin

    broken = infos["broken"]
    assert broken.status == "failed"
    assert broken.reason == "ImportError: libfake.so.1: cannot open shared object file"
    assert "pp_fake_broken.py" in broken.traceback and "raise ImportError" in broken.traceback
    assert pm.get_plugin("broken") is None

    assert infos["missing"].status == "failed"
    assert "No module named 'pp_fake_does_not_exist'" in infos["missing"].reason

    assert infos["unavailable"].status == "unavailable"
    assert infos["unavailable"].reason == "no FakeDevice driver (libfakedev not found)"
    assert infos["unavailable"].display_status == "unavailable: no FakeDevice driver (libfakedev not found)"

    typo = infos["typo"]
    assert typo.status == "failed"
    assert "unknown hook 'polyprof_make_exporterz'" in typo.reason
    assert "did you mean 'polyprof_make_exporter'?" in typo.reason
    assert pm.get_plugin("typo") is None, "a plugin with an unknown hook must not stay registered"

    badsig = infos["badsig"]
    assert badsig.status == "failed" and "colour" in badsig.reason
    assert pm.get_plugin("badsig") is None

    # The run goes on: the valid plugin works.
    assert pm.make_exporter(CONFIG, "fake").name == "fake"
    # Failures are logged by plugin name (unavailable is not a failure: not a warning).
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for name in ("broken", "missing", "typo", "badsig"):
        assert f"plugin='{name}'" in logged
    assert "plugin='unavailable'" not in logged


def test_unreadable_distribution_is_skipped(installed, caplog):
    installed(BrokenDistribution(), OTHER)
    with caplog.at_level(logging.WARNING, logger="polyprof.hooks.registry"):
        candidates = discover_entry_points()
    assert [c.name for c in candidates] == ["other"]
    assert "METADATA unreadable" in caplog.text


def test_distribution_seen_twice_loads_once_and_name_clash_fails_closed(installed):
    clash = FakeDistribution("polyprof-zz-clash", "1.0", {"valid": "pp_fake_other"})
    installed(FAKES, FAKES, clash)
    pm = make_plugin_manager(builtins=False)
    infos = infos_by_name(pm)
    # The same distribution seen twice is one distribution: each of its six plugins is seen once.
    assert [i.distribution for i in pm.plugin_infos()].count("polyprof-fakes") == 6
    # Two distributions declaring 'valid': neither loads under it (tests/test_plugin_faults.py has more).
    assert "valid" not in infos
    assert infos["valid (polyprof-fakes)"].status == "blocked"
    assert infos["valid (polyprof-zz-clash)"].conflicts_with == ("polyprof-fakes",)


def test_no_global_manager_at_import():
    code = (
        "import gc, pluggy, polyprof, polyprof.hooks.registry, polyprof.cli, polyprof.testing\n"
        "print(sum(isinstance(o, pluggy.PluginManager) for o in gc.get_objects()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_each_manager_is_independent(installed):
    installed()
    first = make_plugin_manager_for_tests(ComponentPlugin(exporters=[InMemoryExporter("a")]))
    second = make_plugin_manager_for_tests()
    assert first.exporter_names() == ["a"]
    assert second.exporter_names() == []


# -------------------------------------------------------------------- built-ins


def test_builtins_always_load_and_take_the_entry_point_road(installed):
    core = FakeDistribution("polyprof", "9.9", {"stacks": "pp_fake_stacks"})
    installed(core)
    pm = make_plugin_manager()
    infos = infos_by_name(pm)
    assert list(infos) == list(BUILTIN_PLUGINS)
    assert all(info.builtin and info.distribution == "polyprof" for info in infos.values())
    # With autoload on, the core's entry point is what loads (here: a stand-in module).
    assert infos["stacks"].module == "pp_fake_stacks"
    assert infos["stacks"].status == "loaded" and infos["stacks"].version == "9.9"
    # The other built-ins fall back to their module path (the stand-in core declares none).
    assert infos["chrome_trace"].module == BUILTIN_PLUGINS["chrome_trace"]


def test_autoload_off_still_loads_builtins_by_module_path(installed, monkeypatch):
    core = FakeDistribution("polyprof", "9.9", {"stacks": "pp_fake_stacks"})
    installed(core, FAKES, OTHER)
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    pm = make_plugin_manager()
    infos = infos_by_name(pm)
    for name, module in BUILTIN_PLUGINS.items():
        assert infos[name].builtin
        assert infos[name].module == module
        assert infos[name].version == polyprof.__version__
    third_party = [i for i in infos.values() if not i.builtin]
    assert {i.name for i in third_party} == {
        "valid",
        "broken",
        "unavailable",
        "typo",
        "badsig",
        "missing",
        "other",
    }
    for info in third_party:
        assert info.status == "blocked"
        assert DISABLE_AUTOLOAD_ENV in info.reason
    assert "pp_fake_broken" not in sys.modules


def test_autoload_argument_overrides_env_and_allow_list_reenables(installed, monkeypatch):
    installed(FAKES, OTHER)
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    pm = make_plugin_manager(autoload=True, builtins=False)
    assert infos_by_name(pm)["other"].status == "loaded"
    # Autoload off, but named explicitly: loaded (pytest's PYTEST_PLUGINS semantics).
    pm = make_plugin_manager(autoload=False, allow=["other"], builtins=False)
    infos = infos_by_name(pm)
    assert infos["other"].status == "loaded"
    assert infos["valid"].status == "blocked"


# ------------------------------------------------------------------- allow-list


def test_allow_list_from_env_blocks_the_rest_and_warns_on_unknown_names(installed, monkeypatch):
    installed(FAKES, OTHER)
    monkeypatch.setenv(ALLOW_LIST_ENV, "valid, nosuchplugin ,stacks")
    with pytest.warns(PolyprofWarning) as record:
        pm = make_plugin_manager()
    [warning] = [w for w in record if "nosuchplugin" in str(w.message)]
    message = str(warning.message)
    assert "POLYPROF_PLUGINS names plugins that are not installed: nosuchplugin" in message
    assert (
        "installed third-party plugins: badsig, broken, missing, other, typo, unavailable, valid" in message
    )
    infos = infos_by_name(pm)
    assert infos["valid"].status == "loaded"
    assert infos["other"].status == "blocked"
    assert "not in POLYPROF_PLUGINS" in infos["other"].reason
    assert "pp_fake_other" not in sys.modules or infos["other"].status == "blocked"
    assert all(infos[name].builtin for name in BUILTIN_PLUGINS), "built-ins are always allowed"


def test_allow_list_accepts_distribution_names(installed):
    installed(FAKES, OTHER)
    pm = make_plugin_manager(allow="polyprof_other", builtins=False)
    infos = infos_by_name(pm)
    assert infos["other"].status == "loaded"
    assert infos["valid"].status == "blocked"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        # Set but blank is an empty allow-list (no third-party plugin), not "no allow-list".
        ("", set()),
        ("  ", set()),
        (" , ", set()),
        ("a,b", {"a", "b"}),
        (" a , ,b ", {"a", "b"}),
        ([], set()),
        ("polyprof-cuda:cuda, cuda", {"polyprof-cuda:cuda", "cuda"}),
    ],
)
def test_parse_allow_list(raw, expected):
    result = parse_allow_list(raw)
    assert result == (None if expected is None else frozenset(expected))


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("yes", True), ("ON", True), ("0", False), ("off", False), ("", False)],
)
def test_env_flag(value, expected):
    assert env_flag("X", {"X": value}) is expected


def test_env_flag_warns_on_nonsense():
    with pytest.warns(PolyprofWarning, match="use one of 1, true"):
        assert env_flag("X", {"X": "maybe"}) is True


# --------------------------------------------------------------------- activities


def test_activity_needs_its_distribution(installed):
    installed()
    pm = make_plugin_manager_for_tests()
    with pytest.raises(ActivityUnavailableError) as err:
        activity_resolution.check_activities(pm.plugin_infos(), [ProfilerActivity.CUDA])
    assert str(err.value) == "ProfilerActivity.CUDA needs the polyprof-cuda plugin: pip install polyprof-cuda"
    with pytest.raises(
        ActivityUnavailableError, match="needs the polyprof-xpu plugin: pip install polyprof-xpu"
    ):
        activity_resolution.check_activities(pm.plugin_infos(), ["xpu"])
    with pytest.raises(ActivityUnavailableError, match="HPU: no installed polyprof plugin provides it"):
        activity_resolution.check_activities(pm.plugin_infos(), [ProfilerActivity.HPU])
    assert isinstance(err.value, ValueError)
    with pytest.raises(ValueError, match="valid activities are"):
        activity_resolution.check_activities(pm.plugin_infos(), ["tpu"])


def test_torch_activities_are_understood(installed):
    torch_profiler = pytest.importorskip("torch.profiler")
    installed()
    pm = make_plugin_manager_for_tests(ComponentPlugin(tracers=[FakeTracer(activities=["cpu"])]))
    providers = activity_resolution.check_activities(pm.plugin_infos(), [torch_profiler.ProfilerActivity.CPU])
    assert providers[ProfilerActivity.CPU].name == "components"
    with pytest.raises(ActivityUnavailableError, match="polyprof-cuda"):
        activity_resolution.check_activities(pm.plugin_infos(), [torch_profiler.ProfilerActivity.CUDA])


def test_installed_but_unavailable_plugin_gives_its_reason(installed):
    installed(CUDA)
    pm = make_plugin_manager(builtins=False)
    with pytest.raises(ActivityUnavailableError) as err:
        activity_resolution.check_activities(pm.plugin_infos(), [ProfilerActivity.CUDA])
    assert str(err.value) == (
        "ProfilerActivity.CUDA comes from the polyprof_cuda plugin 'cuda', which is installed but "
        "unavailable here: no CUDA driver found"
    )


def test_unavailable_by_capabilities_is_reported_and_unregistered(installed):
    installed()
    gpu = ComponentPlugin(
        plugin_name="fakegpu",
        tracers=[FakeTracer(name="gpu", activities=[ProfilerActivity.XPU])],
        unavailable_reason="no XPU device",
    )
    pm = make_plugin_manager_for_tests(gpu)
    info = pm.plugin_info("fakegpu")
    assert info.status == "unavailable" and info.reason == "no XPU device"
    assert info.capabilities.activities == {ProfilerActivity.XPU}
    assert pm.get_plugin("fakegpu") is None
    assert activity_resolution.provider_of(pm.plugin_infos(), "xpu") is None
    with pytest.raises(
        ActivityUnavailableError, match="'fakegpu', which is installed but unavailable here: no XPU"
    ):
        activity_resolution.check_activities(pm.plugin_infos(), ["xpu"])


class RaisingCapabilities:
    def __init__(self, exc: Exception | None = None, result: object = None) -> None:
        self.exc, self.result = exc, result

    @polyprof.hookimpl
    def polyprof_capabilities(self):
        if self.exc is not None:
            raise self.exc
        return self.result


def test_capabilities_outcomes():
    pm = make_plugin_manager_for_tests(
        ("gone", RaisingCapabilities(PluginUnavailable("driver too old (needs 535)"))),
        ("crash", RaisingCapabilities(RuntimeError("boom"))),
        ("wrong", RaisingCapabilities(result={"activities": ["cpu"]})),
        ("badact", RaisingCapabilities(result=Capabilities(activities=["tpu"]))),
        ("fine", RaisingCapabilities(result=Capabilities(activities=["cpu"]))),
        strict=False,
    )
    infos = infos_by_name(pm)
    assert infos["gone"].display_status == "unavailable: driver too old (needs 535)"
    assert infos["crash"].status == "failed"
    assert infos["crash"].reason == "polyprof_capabilities raised RuntimeError: boom"
    assert "RuntimeError: boom" in infos["crash"].traceback
    assert infos["wrong"].status == "failed" and "which is not a Capabilities" in infos["wrong"].reason
    assert infos["badact"].status == "failed" and "valid activities are" in infos["badact"].reason
    # String activities are normalised to ProfilerActivity.
    assert infos["fine"].capabilities.activities == {ProfilerActivity.CPU}
    assert activity_resolution.supported_activities(pm.plugin_infos()) == {ProfilerActivity.CPU}
    assert sorted(name for name, _ in pm.list_name_plugin() if _ is not None) == ["fine"]


# ----------------------------------------------------------------------- exporters


def test_exporter_selection_by_name_and_error_listing_names(installed):
    installed(FAKES, OTHER)
    pm = make_plugin_manager(builtins=False)
    assert pm.exporter_names() == ["fake", "other"]
    assert pm.make_exporter(CONFIG, "other").name == "other"
    with pytest.raises(UnknownExporterError) as err:
        pm.make_exporter(CONFIG, "parquet")
    assert "no exporter named 'parquet'; available exporters: fake, other" in str(err.value)
    assert isinstance(err.value, ValueError)
    with pytest.raises(TypeError, match="non-empty str"):
        pm.make_exporter(CONFIG, "")


def test_exporter_of_an_unavailable_plugin_says_so():
    plugin = ComponentPlugin(
        plugin_name="remote", exporters=[InMemoryExporter("otlp")], unavailable_reason="no network"
    )
    pm = make_plugin_manager_for_tests(plugin)
    with pytest.raises(UnknownExporterError, match="plugin 'remote', which is unavailable: no network"):
        pm.make_exporter(CONFIG, "otlp")


class TrylastExporter:
    plugin_name = "builtin_like"

    def __init__(self) -> None:
        self.exporter = InMemoryExporter("chrome")

    @polyprof.hookimpl
    def polyprof_capabilities(self):
        return Capabilities(exporters=("chrome",))

    @polyprof.hookimpl(trylast=True)
    def polyprof_make_exporter(self, config, name):
        return self.exporter if name == "chrome" else None


def test_later_or_non_trylast_exporters_win():
    first, second = InMemoryExporter("x"), InMemoryExporter("x")
    pm = make_plugin_manager_for_tests(
        ("first", ComponentPlugin(exporters=[first])), ("second", ComponentPlugin(exporters=[second]))
    )
    assert pm.make_exporter(CONFIG, "x") is second
    builtin_like = TrylastExporter()
    replacement = InMemoryExporter("chrome")
    # The trylast (built-in style) plugin registered last still loses to a normal one.
    pm = make_plugin_manager_for_tests(ComponentPlugin(exporters=[replacement]), builtin_like)
    assert pm.make_exporter(CONFIG, "chrome") is replacement


class ReturnsJunk:
    plugin_name = "junk"

    @polyprof.hookimpl
    def polyprof_make_exporter(self, config, name):
        return "definitely not an exporter"

    @polyprof.hookimpl
    def polyprof_make_tracers(self, config):
        return FakeTracer()  # a single tracer, not a list

    @polyprof.hookimpl
    def polyprof_make_subscribers(self, config):
        return [object()]


def test_components_are_type_checked_naming_the_plugin():
    pm = make_plugin_manager_for_tests(ReturnsJunk())
    with pytest.raises(
        TypeError, match="plugin 'junk' returned 'definitely not an exporter', which is not a Exporter"
    ):
        pm.make_exporter(CONFIG, "anything")
    with pytest.raises(TypeError, match="plugin 'junk': polyprof_make_tracers must return a list of Tracer"):
        pm.make_tracers(CONFIG)
    with pytest.raises(
        TypeError, match=r"plugin 'junk' returned <object object .*>, which is not a Subscriber"
    ):
        pm.make_subscribers(CONFIG)


class Explodes:
    plugin_name = "explodes"

    @polyprof.hookimpl
    def polyprof_make_aggregators(self, config):
        raise RuntimeError("aggregator setup failed")

    @polyprof.hookimpl
    def polyprof_trace_ready(self, session, trace):
        raise RuntimeError("trace_ready failed")


def test_hook_errors_name_the_plugin_or_are_isolated(caplog):
    pm = make_plugin_manager_for_tests(Explodes(), ComponentPlugin())
    with pytest.raises(RuntimeError, match="aggregator setup failed") as err:
        pm.make_aggregators(CONFIG)
    assert "raised by polyprof plugin 'explodes' in polyprof_make_aggregators" in err.value.__notes__
    with caplog.at_level(logging.WARNING, logger="polyprof.hooks.registry"):
        results = pm.call_each("polyprof_trace_ready", isolate_errors=True, session=None, trace=None)
    assert results == []
    assert "plugin_hook_failed" in caplog.text and "plugin='explodes'" in caplog.text
    with pytest.raises(ValueError, match="no hook named 'polyprof_nope'; known hooks: polyprof_addhooks"):
        pm.call_each("polyprof_nope")


class UnavailableAtRuntime:
    plugin_name = "flaky"

    @polyprof.hookimpl
    def polyprof_make_exporter(self, config, name):
        raise PluginUnavailable("license server unreachable")


def test_plugin_unavailable_from_a_hook_skips_the_plugin():
    fallback = InMemoryExporter("chrome")
    pm = make_plugin_manager_for_tests(ComponentPlugin(exporters=[fallback]), UnavailableAtRuntime())
    assert pm.make_exporter(CONFIG, "chrome") is fallback
    assert pm.plugin_info("flaky").display_status == "unavailable: license server unreachable"


# ------------------------------------------------------------------- tracers etc.


def test_make_tracers_checks_duplicates_and_coverage():
    cpu = FakeTracer(name="cpu_a")
    pm = make_plugin_manager_for_tests(ComponentPlugin(tracers=[cpu]))
    assert activity_resolution.make_tracers(pm, CONFIG).tracers == (cpu,)

    both = ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA})
    with pytest.raises(ActivityUnavailableError, match="CUDA needs the polyprof-cuda plugin"):
        activity_resolution.make_tracers(pm, both)
    # The registry only builds and type-checks them; the resolver checks coverage and claims.
    assert pm.make_tracers(both) == [cpu]
    assert pm.tracers_by_plugin(both) == [("components", cpu)]

    twice = make_plugin_manager_for_tests(
        ("a", ComponentPlugin(tracers=[FakeTracer(name="cpu_a")])),
        ("b", ComponentPlugin(tracers=[FakeTracer(name="cpu_b")])),
    )
    with pytest.raises(
        PluginCallError, match=r"CPU is claimed by tracer 'cpu_b' of plugin 'b' and by tracer 'cpu_a'"
    ):
        activity_resolution.make_tracers(twice, CONFIG)
    same_name = make_plugin_manager_for_tests(
        ("a", ComponentPlugin(tracers=[FakeTracer(name="t", activities=["cpu"])])),
        ("b", ComponentPlugin(tracers=[FakeTracer(name="t", activities=["cuda"])])),
    )
    with pytest.raises(PluginCallError, match="both returned a tracer named 't'"):
        activity_resolution.make_tracers(
            same_name, ProfileConfig(activities={ProfilerActivity.CPU, ProfilerActivity.CUDA})
        )


class NamedAggregator(Aggregator):
    def __init__(self, name: str) -> None:
        self.name = name

    def aggregate(self, trace, **options):
        return self.name


class TrylastAggregators:
    plugin_name = "builtin_aggregators"

    @polyprof.hookimpl(trylast=True)
    def polyprof_make_aggregators(self, config):
        return [NamedAggregator("key_averages"), NamedAggregator("memory")]


def test_make_aggregators_later_registration_wins():
    replacement = NamedAggregator("key_averages")
    later = NamedAggregator("memory")
    pm = make_plugin_manager_for_tests(
        TrylastAggregators(),
        ("early", ComponentPlugin(aggregators=[replacement])),
        ("late", ComponentPlugin(aggregators=[later])),
    )
    aggregators = pm.make_aggregators(CONFIG)
    assert aggregators["key_averages"] is replacement
    assert aggregators["memory"] is later


class CountingSubscriber(Subscriber):
    def consume(self, batch):
        pass


def test_make_subscribers_collects_from_all_plugins():
    a, b = CountingSubscriber(), CountingSubscriber()
    pm = make_plugin_manager_for_tests(
        ("a", ComponentPlugin(subscribers=[a])), ("b", ComponentPlugin(subscribers=[b]))
    )
    assert pm.make_subscribers(CONFIG) == [b, a]


# --------------------------------------------------------------- hook extension


class NewHooks:
    @polyprof.hookspec
    def polyprof_example_extra(self, value):
        """A hook added by a plugin through polyprof_addhooks."""


class AddsHooks:
    plugin_name = "adds_hooks"

    @polyprof.hookimpl
    def polyprof_addhooks(self, pluginmanager):
        pluginmanager.add_hookspecs(NewHooks)


class UsesNewHook:
    plugin_name = "uses_new_hook"

    @polyprof.hookimpl
    def polyprof_example_extra(self, value):
        return value * 2


def test_plugins_may_add_hooks_before_or_after_their_users():
    pm = make_plugin_manager_for_tests(UsesNewHook(), AddsHooks())
    assert pm.plugin_info("uses_new_hook").status == "loaded"
    assert pm.call_each("polyprof_example_extra", value=21) == [("uses_new_hook", 42)]


# ---------------------------------------------------------------------- tracing


def test_trace_plugins_env_logs_hook_calls(monkeypatch, caplog):
    monkeypatch.setenv(TRACE_ENV, "1")
    with caplog.at_level(logging.INFO, logger="polyprof.hooks.registry"):
        pm = make_plugin_manager_for_tests(ComponentPlugin(exporters=[InMemoryExporter("m")]))
        pm.make_exporter(CONFIG, "m")
    text = caplog.text
    assert "event='hook_call'" in text and "hook='polyprof_make_exporter'" in text
    assert "event='hook_result'" in text and "InMemoryExporter" in text
    pm.close()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="polyprof.hooks.registry"):
        pm.make_exporter(CONFIG, "m")
    assert "hook_call" not in caplog.text, "close() undoes the monitoring"


# -------------------------------------------------------------- records, closing


def test_plugin_info_json_and_validation(installed):
    installed(FAKES)
    pm = make_plugin_manager(builtins=False)
    records = json.loads(json.dumps([info.to_dict() for info in pm.plugin_infos()]))
    valid = next(r for r in records if r["name"] == "valid")
    assert valid["capabilities"] == {
        "activities": [],
        "exporters": ["fake"],
        "aggregators": [],
        "unavailable_reason": None,
        "mode": None,
        "provisional": None,
    }
    with pytest.raises(ValueError):
        PluginInfo("x", "x", None, None, status="sleeping")
    with pytest.raises(KeyError, match="no plugin named 'nope'; known plugins: badsig, broken, missing"):
        pm.plugin_info("nope")


class FailingShutdown(Exporter):
    name = "bad"

    def export(self, trace, path, **options):
        return path

    def shutdown(self):
        raise OSError("disk gone")


def test_close_shuts_down_exporters_and_logs_failures(caplog):
    good = InMemoryExporter("good")
    pm = make_plugin_manager_for_tests(ComponentPlugin(exporters=[good, FailingShutdown()]))
    with caplog.at_level(logging.WARNING, logger="polyprof.hooks.registry"), pm:
        pm.make_exporter(CONFIG, "good")
        pm.make_exporter(CONFIG, "bad")
    assert good.shut_down
    assert "exporter_shutdown_failed" in caplog.text and "disk gone" in caplog.text


# ---------------------------------------------------------------- testing helpers


class Typo:
    @polyprof.hookimpl
    def polyprof_make_tracer(self, config):  # missing "s"
        return []


def test_testing_manager_is_strict_about_broken_plugins():
    with pytest.raises(PluginLoadError, match="did you mean 'polyprof_make_tracers'"):
        make_plugin_manager_for_tests(Typo())
    pm = make_plugin_manager_for_tests(Typo(), strict=False)
    assert pm.plugin_info("Typo").status == "failed"
    # An isolated manager: no built-ins, no entry points.
    assert [i.name for i in pm.plugin_infos()] == ["Typo"]


def test_fake_tracer_and_in_memory_exporter():
    batch = make_event_batch([{"name": "aten::add", "start_ns": 5, "dur_ns": 3}])
    tracer = FakeTracer([batch], name="fake_cpu")
    tracer.prepare()
    tracer.start()
    tracer.stop()
    assert tracer.calls == ["prepare", "start", "stop"]
    assert tracer.outbox.closed and tracer.outbox.drain() == [batch]
    assert list(tracer.decode(batch)) == [batch]
    meta = tracer.trace_metadata()
    assert meta["start_ns"] <= meta["end_ns"]
    with pytest.raises(TypeError, match="FakeTracer takes EventBatch objects"):
        FakeTracer(["not a batch"])

    exporter = InMemoryExporter()
    trace = make_trace(batch)
    assert exporter.export(trace, "somewhere.memory", detail=1) == "somewhere.memory"
    assert exporter.traces == [trace] and exporter.exported[0].options == {"detail": 1}
    exporter.clear()
    assert exporter.exported == []
    with pytest.raises(TypeError, match=r"needs a polyprof.plugin.Trace"):
        exporter.export(batch, "x")


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "name": st.sampled_from(["aten::mm", "aten::add", "", "outer"]),
                "start_ns": st.integers(0, 2**40),
                "dur_ns": st.integers(0, 2**20),
            }
        ),
        max_size=30,
    )
)
def test_make_event_batch_round_trips(events):
    batch = make_event_batch(events)
    assert len(batch) == len(events)
    assert batch.values("name", empty="") == [e["name"] for e in events]
    assert batch["start_ns"].tolist() == [e["start_ns"] for e in events]
    trace = make_trace(batch)
    if events:
        assert trace.start_ns == min(e["start_ns"] for e in events)
        assert trace.end_ns == max(e["start_ns"] + e["dur_ns"] for e in events)
