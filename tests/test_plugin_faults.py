"""A broken or squatting plugin never costs the user's recording (issue 11, faults 2, 5 and 6).

Plugins come from fake distributions (``importlib.metadata.distributions`` is
monkeypatched, as in tests/test_registry.py); the modules they name are real
files in a temporary directory. The built-in plugins, torch's CPU tracer among
them, load by module path, so every profile here records real torch ops.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys
import textwrap
import warnings

import pytest

import polyprof
import polyprof.base.config
import polyprof.hooks.plugin_discovery
import polyprof.legacy
from polyprof.base.activity import ProfilerActivity
from polyprof.base.user_warnings import ActivityUnavailableWarning
from polyprof.cli import main
from polyprof.hooks import activity_resolution
from polyprof.hooks.plugin_calls import PluginFailureWarning
from polyprof.hooks.plugin_discovery import (
    ALLOW_LIST_ENV,
    BUILTIN_PLUGINS,
    DISABLE_AUTOLOAD_ENV,
    PluginSelectionError,
)
from polyprof.hooks.registry import TRACE_ENV, make_plugin_manager

torch = pytest.importorskip("torch")

#: A device tracer that hands over one kernel, then fails in stop() before closing its outbox.
FAILING_STOP = """
    from polyprof import hookimpl
    from polyprof.hooks.components import Capabilities
    from polyprof.base.events import EventKind
    from polyprof.testing import FakeTracer, make_event_batch

    class FailsToStop(FakeTracer):
        def stop(self):
            self.outbox.put(make_event_batch([
                {"name": "handed_over_kernel", "kind": EventKind.KERNEL, "start_ns": self.start_ns,
                 "dur_ns": 1000, "device_type": 1, "thread": 7},
            ]))
            raise RuntimeError("device went away")

    @hookimpl
    def polyprof_capabilities():
        return Capabilities(activities=["cuda"])

    @hookimpl
    def polyprof_make_tracers(config):
        return [FailsToStop(name="flaky_device", activities=["cuda"])]
"""

#: Raises in the hook named by the module's last word (pp_explodes_<hook>).
EXPLODES = """
    from polyprof import hookimpl
    from polyprof.hooks.components import Capabilities

    @hookimpl
    def polyprof_capabilities():
        return Capabilities(exporters=("chrome",), aggregators=("key_averages",))

    @hookimpl
    def polyprof_{hook}({args}):
        raise RuntimeError("plugin bug in {hook}")
"""
HOOK_ARGS = {
    "session_start": "session",
    "torch_collector_activities": "config",
    "make_tracers": "config",
    "make_subscribers": "config",
    "make_aggregators": "config",
    "make_exporter": "config, name",
}

#: Declares CUDA but cannot build its tracer.
CUDA_TRACER_BUG = """
    from polyprof import hookimpl
    from polyprof.hooks.components import Capabilities

    @hookimpl
    def polyprof_capabilities():
        return Capabilities(activities=["cuda"])

    @hookimpl
    def polyprof_make_tracers(config):
        raise RuntimeError("cannot open the device")
"""

#: Returns something that is not a list of aggregators.
JUNK_AGGREGATORS = """
    from polyprof import hookimpl

    @hookimpl
    def polyprof_make_aggregators(config):
        return "not a list of aggregators"
"""

REAL_CUDA = """
    from polyprof import hookimpl
    from polyprof.hooks.components import Capabilities

    @hookimpl
    def polyprof_capabilities():
        return Capabilities(exporters=("real_cuda_marker",))
"""
#: A squatter: importing it at all is the harm (tests look for it in ``sys.modules``).
SQUATTER = """
    IMPORTED = True
"""

MODULES = {
    "pp_faults_failing_stop": FAILING_STOP,
    "pp_faults_cuda_tracer_bug": CUDA_TRACER_BUG,
    "pp_faults_junk_aggregators": JUNK_AGGREGATORS,
    "pp_faults_real_cuda": REAL_CUDA,
    "pp_faults_squatter": SQUATTER,
    **{f"pp_explodes_{hook}": EXPLODES.format(hook=hook, args=args) for hook, args in HOOK_ARGS.items()},
}


class FakeDistribution:
    """Just what the registry reads from an ``importlib.metadata.Distribution``."""

    def __init__(self, name: str, version: str, entry_points: dict[str, str]) -> None:
        self.metadata = {"Name": name}
        self.version = version
        self.entry_points = [importlib.metadata.EntryPoint(n, v, "polyprof") for n, v in entry_points.items()]


REAL = FakeDistribution("polyprof-cuda", "0.3.1", {"cuda": "pp_faults_real_cuda"})
SQUAT = FakeDistribution("aaa-squat", "6.6.6", {"cuda": "pp_faults_squatter"})


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("fault_plugins")
    for module, source in MODULES.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for module in MODULES:
        sys.modules.pop(module, None)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in (DISABLE_AUTOLOAD_ENV, ALLOW_LIST_ENV, TRACE_ENV):
        monkeypatch.delenv(var, raising=False)
    for module in MODULES:  # so that "was it imported?" is asked of this test alone
        sys.modules.pop(module, None)


@pytest.fixture
def installed(monkeypatch, plugin_dir):
    """``installed(dist, ...)``: make these the only installed distributions."""

    def install(*dists):
        monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter(dists))

    return install


def workload() -> None:
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))


def op_names(prof) -> set[str]:
    return {event.name for event in prof.events()}


# --------------------------------------------------------------- fault 2: stop() raises


def test_a_tracer_whose_stop_raises_costs_only_its_own_events(installed, caplog):
    installed(FakeDistribution("polyprof-flaky", "1.0", {"flaky": "pp_faults_failing_stop"}))
    pm = make_plugin_manager()
    prof = polyprof.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], plugin_manager=pm)
    with (
        caplog.at_level(logging.ERROR, logger="polyprof.runtime.session"),
        pytest.warns(PluginFailureWarning) as record,
        prof,
    ):
        workload()
    [warning] = [w for w in record if issubclass(w.category, PluginFailureWarning)]
    message = str(warning.message)
    assert "tracer 'flaky_device' of plugin 'flaky' (polyprof-flaky 1.0)" in message
    assert "RuntimeError: device went away" in message
    assert warning.filename == __file__, "the warning points at the user's line"
    # The CPU tracer's events are all there, and what the failing tracer handed over too.
    assert "aten::mm" in op_names(prof)
    assert "handed_over_kernel" in op_names(prof)
    [trace] = prof._traces
    assert any("'flaky_device'" in note and "device went away" in note for note in trace.notes)
    assert "tracer_stop_failed" in caplog.text and "plugin='flaky'" in caplog.text


def test_the_legacy_profiler_keeps_its_events_too(installed):
    installed(FakeDistribution("polyprof-flaky", "1.0", {"flaky": "pp_faults_failing_stop"}))
    prof = polyprof.legacy.profile(use_cuda=True, plugin_manager=make_plugin_manager())
    with pytest.warns(PluginFailureWarning, match="'flaky_device' of plugin 'flaky'"), prof:
        workload()
    assert "aten::mm" in {e.key for e in prof.key_averages()}


# ------------------------------------------------- fault 5: a hook raises or returns junk


@pytest.mark.parametrize("hook", sorted(HOOK_ARGS))
def test_a_plugin_failing_in_a_hook_is_skipped_and_named(installed, hook, tmp_path, caplog):
    installed(FakeDistribution("polyprof-explodes", "2.0", {"explodes": f"pp_explodes_{hook}"}))
    prof = polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=make_plugin_manager())
    with (
        caplog.at_level(logging.WARNING, logger="polyprof.hooks.registry"),
        warnings.catch_warnings(record=True) as record,
    ):
        warnings.simplefilter("always")
        with prof:
            workload()
        # The exporter is asked for when exporting; the built-in chrome exporter takes over.
        prof.export_chrome_trace(str(tmp_path / "trace.json"))
    messages = [str(w.message) for w in record if issubclass(w.category, PluginFailureWarning)]
    assert messages == [
        (
            f"polyprof: skipped plugin 'explodes' (polyprof-explodes 2.0) in polyprof_{hook}: "
            f"RuntimeError: plugin bug in {hook}; profiling goes on without it"
        )
    ]
    assert "aten::mm" in op_names(prof)
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    assert "aten::mm" in (tmp_path / "trace.json").read_text()
    assert "plugin_hook_failed" in caplog.text and "plugin='explodes'" in caplog.text
    assert f"hook='polyprof_{hook}'" in caplog.text


def test_an_activity_whose_plugin_cannot_build_its_tracer_is_left_out(installed):
    installed(FakeDistribution("polyprof-cuda", "0.3.1", {"cuda": "pp_faults_cuda_tracer_bug"}))
    prof = polyprof.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], plugin_manager=make_plugin_manager()
    )
    failed = r"'cuda' \(polyprof-cuda 0.3.1\) in polyprof_make_tracers"
    dropped = "CUDA profiling is not available here"
    with (
        pytest.warns(PluginFailureWarning, match=failed),
        pytest.warns(ActivityUnavailableWarning, match=dropped),
        prof,
    ):
        workload()
    assert "aten::mm" in op_names(prof)
    assert prof._traces[0].config.activities == {ProfilerActivity.CPU}


def test_a_plugin_returning_junk_is_skipped_and_named(installed):
    installed(FakeDistribution("polyprof-junk", "1.0", {"junk": "pp_faults_junk_aggregators"}))
    prof = polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=make_plugin_manager())
    junk = "skipped plugin 'junk' .* must return a list of Aggregator"
    with pytest.warns(PluginFailureWarning, match=junk), prof:
        workload()
    assert "aten::mm" in {e.key for e in prof.key_averages()}


def test_the_registry_keeps_fail_fast_calls_for_plugin_authors(installed):
    """Without ``isolate_errors`` (plugin authors' own tests), the error still reaches the caller."""
    installed(FakeDistribution("polyprof-explodes", "2.0", {"explodes": "pp_explodes_make_aggregators"}))
    pm = make_plugin_manager()
    config = polyprof.base.config.ProfileConfig(activities={ProfilerActivity.CPU})
    with pytest.raises(RuntimeError, match="plugin bug in make_aggregators") as err:
        pm.make_aggregators(config)
    assert "raised by polyprof plugin 'explodes' in polyprof_make_aggregators" in err.value.__notes__
    assert "key_averages" in pm.make_aggregators(config, isolate_errors=True)
    [failure] = pm.hook_failures()
    assert (failure.plugin, failure.hook) == ("explodes", "polyprof_make_aggregators")


# ------------------------------------------------------------ fault 6: name squatting


def test_two_distributions_with_one_name_fail_closed_and_both_show(installed, capsys, monkeypatch):
    # For a name polyprof's own plugins do not hold ('cuda' is polyprof-cuda's, which keeps it:
    # tests/test_exporter_plugin_faults.py)
    monkeypatch.setattr(polyprof.hooks.plugin_discovery, "OWNED_NAMES", {})
    installed(SQUAT, REAL)
    pm = make_plugin_manager()
    infos = {info.name: info for info in pm.plugin_infos()}
    assert "cuda" not in infos, "neither loads under the contested name"
    real, squat = infos["cuda (polyprof-cuda)"], infos["cuda (aaa-squat)"]
    assert (real.status, squat.status) == ("blocked", "blocked")
    assert real.conflicts_with == ("aaa-squat",) and squat.conflicts_with == ("polyprof-cuda",)
    assert "conflict: entry-point name 'cuda' is also declared by aaa-squat" in real.reason
    assert "POLYPROF_PLUGINS names one as DIST:NAME (e.g. polyprof-cuda:cuda)" in real.reason
    assert "pp_faults_squatter" not in sys.modules and "pp_faults_real_cuda" not in sys.modules
    # A request for CUDA says why, rather than handing it to whichever sorted first.
    with pytest.raises(polyprof.ActivityUnavailableError, match="blocked: conflict"):
        activity_resolution.check_activities(pm.plugin_infos(), [ProfilerActivity.CUDA])

    assert main(["plugins"]) == 0
    table = capsys.readouterr().out
    assert "cuda (polyprof-cuda)" in table and "cuda (aaa-squat)" in table
    assert table.count("blocked: conflict: entry-point name 'cuda'") == 2
    assert main(["plugins", "--json"]) == 0
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert records["cuda (aaa-squat)"]["conflicts_with"] == ["polyprof-cuda"]


@pytest.mark.parametrize("autoload", ["0", "1"])
def test_an_ambiguous_bare_name_is_an_error_naming_the_candidates(installed, monkeypatch, autoload):
    installed(SQUAT, REAL)
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, autoload)
    monkeypatch.setenv(ALLOW_LIST_ENV, "cuda")
    expected = (
        "POLYPROF_PLUGINS entry 'cuda' is ambiguous: it matches plugins of several distributions "
        "(aaa-squat:cuda, polyprof-cuda:cuda); name the one to load as DIST:NAME"
    )
    with pytest.raises(PluginSelectionError) as err:
        make_plugin_manager()
    assert str(err.value) == expected
    assert "pp_faults_squatter" not in sys.modules
    # A profile fails with the same one line, before anything runs.
    with pytest.raises(PluginSelectionError, match="entry 'cuda' is ambiguous"):
        polyprof.profile(activities=[ProfilerActivity.CPU]).start()


@pytest.mark.parametrize("allow", ["polyprof-cuda:cuda", "polyprof_cuda", "Polyprof.Cuda:cuda"])
def test_the_allow_list_picks_the_distribution(installed, monkeypatch, allow):
    installed(SQUAT, REAL)
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    monkeypatch.setenv(ALLOW_LIST_ENV, allow)
    pm = make_plugin_manager()
    infos = {info.name: info for info in pm.plugin_infos()}
    assert infos["cuda"].status == "loaded" and infos["cuda"].distribution == "polyprof-cuda"
    squat = infos["cuda (aaa-squat)"]
    assert squat.status == "blocked" and squat.conflicts_with == ("polyprof-cuda",)
    assert "also declared by polyprof-cuda, which POLYPROF_PLUGINS picks" in squat.reason
    assert "pp_faults_squatter" not in sys.modules


def test_a_bare_name_with_one_provider_still_works(installed, monkeypatch):
    installed(REAL, FakeDistribution("polyprof-flaky", "1.0", {"flaky": "pp_faults_failing_stop"}))
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    monkeypatch.setenv(ALLOW_LIST_ENV, "cuda")
    infos = {info.name: info for info in make_plugin_manager().plugin_infos()}
    assert infos["cuda"].status == "loaded" and infos["flaky"].status == "blocked"


@pytest.mark.parametrize(
    "allow",
    [
        ":cuda",
        "polyprof-cuda:",
        "polyprof-cuda:cuda,aaa-squat:cuda",
    ],
)
def test_malformed_or_double_selections_are_errors(installed, monkeypatch, allow):
    installed(SQUAT, REAL)
    monkeypatch.setenv(ALLOW_LIST_ENV, allow)
    with pytest.raises(PluginSelectionError) as err:
        make_plugin_manager()
    message = str(err.value)
    assert "\n" not in message
    if "," in allow:
        assert "selects 2 plugins with the entry-point name 'cuda' (aaa-squat:cuda, polyprof-cuda:cuda)" in (
            message
        )
    else:
        assert f"entry {allow!r} is malformed; write NAME, DIST or DIST:NAME" in message
    assert "pp_faults_squatter" not in sys.modules


@pytest.mark.parametrize("blank", ["", "   ", " , "])
def test_a_blank_allow_list_loads_no_third_party_plugin(installed, monkeypatch, blank):
    installed(REAL)
    monkeypatch.setenv(ALLOW_LIST_ENV, blank)
    infos = {info.name: info for info in make_plugin_manager().plugin_infos()}
    assert infos["cuda"].status == "blocked"
    assert infos["cuda"].reason == "POLYPROF_PLUGINS is empty"
    # never blocked: each loads, or says it cannot run here (itt without ittapi, parquet without pyarrow)
    assert all(infos[name].status in ("loaded", "unavailable") for name in BUILTIN_PLUGINS), (
        "built-ins always load"
    )


def test_a_third_party_cannot_take_a_builtin_name(installed, monkeypatch):
    installed(FakeDistribution("aaa-squat", "6.6.6", {"stacks": "pp_faults_squatter"}))
    monkeypatch.setenv(ALLOW_LIST_ENV, "aaa-squat:stacks")
    infos = {info.name: info for info in make_plugin_manager().plugin_infos()}
    assert infos["stacks"].builtin and infos["stacks"].status == "loaded"
    squat = infos["stacks (aaa-squat)"]
    assert squat.status == "blocked" and squat.conflicts_with == ("polyprof",)
    assert "belongs to a plugin polyprof always loads" in squat.reason
    assert "pp_faults_squatter" not in sys.modules
