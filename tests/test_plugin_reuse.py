"""A profile after the first in a process starts in milliseconds: discovery and the manager are reused.

Reading every installed distribution's metadata for the ``polyprof`` entry points
took 53 ms a profile with 122 packages installed. It is read again only when the
installed distributions change (a ``.dist-info`` folder added or removed changes
its ``sys.path`` folder), and sessions made without a plugin manager share one,
made again when the distributions or the ``POLYPROF_*`` variables it reads change.
Here the distributions are real ``.dist-info`` folders on ``sys.path``.
"""

from __future__ import annotations

import importlib.metadata
import os
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polyprof.base.errors import PolyprofWarning
from polyprof.hooks import registry
from polyprof.hooks.plugin_discovery import (
    ALLOW_LIST_ENV,
    DISABLE_AUTOLOAD_ENV,
    discover_entry_points_once,
    forget_discovered_entry_points,
)
from polyprof.hooks.registry import TRACE_ENV, forget_shared_plugin_manager, shared_plugin_manager

EXPORTER_PLUGIN = """
from polyprof import hookimpl
from polyprof.hooks.components import Capabilities, Exporter

SHUT_DOWN = []


class CountingExporter(Exporter):
    name = "{name}"
    suffixes = (".{name}",)

    def export(self, trace, path, **options):
        with open(path, "w") as out:
            out.write("{name}")
        return path

    def shutdown(self):
        SHUT_DOWN.append(self)


@hookimpl
def polyprof_capabilities():
    return Capabilities(exporters=("{name}",))


@hookimpl
def polyprof_make_exporter(config, name):
    return CountingExporter() if name == "{name}" else None
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """``install(name)``: a distribution ``pp-reuse-NAME`` with one exporter plugin, on ``sys.path``."""
    for var in (DISABLE_AUTOLOAD_ENV, ALLOW_LIST_ENV, TRACE_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_discovered_entry_points()
    forget_shared_plugin_manager()
    modules: list[str] = []

    def install(name: str) -> None:
        module = f"pp_reuse_{name}"
        (tmp_path / f"{module}.py").write_text(EXPORTER_PLUGIN.format(name=name))
        info = tmp_path / f"pp_reuse_{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pp-reuse-{name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(textwrap.dedent(f"[polyprof]\n{name} = {module}\n"))
        # A later install: the folder's time moves on, as it does between two real installs
        # (two changes within one clock tick of the file system share a time).
        later = os.stat(tmp_path).st_mtime_ns + 1_000_000_000 * (len(modules) + 1)
        os.utime(tmp_path, ns=(later, later))
        modules.append(module)

    yield install
    forget_discovered_entry_points()
    forget_shared_plugin_manager()
    import sys

    for module in modules:
        sys.modules.pop(module, None)


@pytest.fixture
def metadata_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often importlib.metadata lists the installed distributions (one entry per listing)."""
    reads: list[int] = []
    real = importlib.metadata.distributions

    def counting(**kwargs: Any) -> Any:
        reads.append(1)
        return real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "distributions", counting)
    return reads


def _names(candidates: list[Any]) -> set[str]:
    return {c.name for c in candidates}


def test_entry_points_are_read_once_until_a_distribution_is_installed(site, metadata_reads) -> None:
    site("first")
    assert "first" in _names(discover_entry_points_once())
    assert "first" in _names(discover_entry_points_once())
    assert len(metadata_reads) == 1, "the metadata was read again although nothing was installed"
    site("second")
    assert {"first", "second"} <= _names(discover_entry_points_once())
    assert len(metadata_reads) == 2, "a new distribution was not seen"


def test_a_file_written_beside_the_distributions_costs_no_rediscovery(site, metadata_reads, tmp_path) -> None:
    site("first")
    discover_entry_points_once()
    (tmp_path / "trace.json").write_text("{}")  # a script saving its trace beside itself
    later = os.stat(tmp_path).st_mtime_ns + 10_000_000_000
    os.utime(tmp_path, ns=(later, later))
    assert "first" in _names(discover_entry_points_once())
    assert len(metadata_reads) == 1


def test_sessions_share_one_manager_until_its_inputs_change(site, monkeypatch) -> None:
    site("first")
    pm = shared_plugin_manager()
    assert shared_plugin_manager() is pm
    assert "first" in pm.exporter_names()
    monkeypatch.setenv(ALLOW_LIST_ENV, "pp-reuse-first")
    allowed = shared_plugin_manager()
    assert allowed is not pm, "POLYPROF_PLUGINS changed, but the manager made before it was reused"
    assert shared_plugin_manager() is allowed
    site("second")
    after_install = shared_plugin_manager()
    assert after_install is not allowed, "a distribution was installed, but the old manager was reused"
    assert "second" not in after_install.exporter_names()  # the allow-list names only the first
    monkeypatch.delenv(ALLOW_LIST_ENV)
    assert {"first", "second"} <= set(shared_plugin_manager().exporter_names())


def test_the_shared_managers_warnings_are_given_to_every_session(site, monkeypatch) -> None:
    site("first")
    monkeypatch.setenv(ALLOW_LIST_ENV, "pp-reuse-first,not-installed-anywhere")
    for _ in range(2):
        with pytest.warns(PolyprofWarning, match="not-installed-anywhere"):
            shared_plugin_manager()


def test_a_second_profile_reads_no_metadata_and_shuts_down_only_its_own_exporters(
    site, metadata_reads, tmp_path
) -> None:
    torch = pytest.importorskip("torch")
    import polyprof

    site("first")
    plugin = __import__("pp_reuse_first")
    paths = []
    for run in range(2):
        with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU]) as prof:
            torch.ones(4).add(1)
        path = tmp_path / f"run{run}.first"
        prof.export(str(path), format="first")
        paths.append(path)
        if run == 0:
            reads_after_first = len(metadata_reads)
    assert len(metadata_reads) == reads_after_first, "the second profile read the distributions again"
    assert all(p.read_text() == "first" for p in paths)
    assert len(plugin.SHUT_DOWN) == 2, "each profile's exporter is shut down once its profile is done"
    assert len({id(e) for e in plugin.SHUT_DOWN}) == 2
    manager = shared_plugin_manager()
    assert manager.make_exporter(prof.trace.config, "first") is not None  # still open for the next


def test_a_warning_filter_of_the_caller_still_applies_to_given_again_warnings(site, monkeypatch) -> None:
    site("first")
    monkeypatch.setenv(ALLOW_LIST_ENV, "not-installed-anywhere")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", PolyprofWarning)
        shared_plugin_manager()
        shared_plugin_manager()
        assert registry.shared_plugin_manager() is registry.shared_plugin_manager()
    assert not [w for w in caught if issubclass(w.category, PolyprofWarning)]


def test_the_shared_manager_lets_go_of_each_sessions_components() -> None:
    """It outlives every session: holding their tracers would keep each profile's data alive."""
    torch = pytest.importorskip("torch")
    import gc
    import weakref

    import polyprof

    forget_shared_plugin_manager()
    gone = []
    for _ in range(2):
        with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU]) as prof:
            torch.ones(4).add(1)
        prof.key_averages()
        session = prof._lifecycle._session
        gone.extend(weakref.ref(part) for part in (*session.tracers, *session.aggregators.values()))
        del prof, session
    gc.collect()
    assert gone and all(ref() is None for ref in gone), "a finished profile's components are still held"
