"""A hanging exporter plugin: export gives up at its deadline, names exporter and path, leaves no file.

Issue 11, fault 4: an exporter whose ``export()`` never returned hung
``prof.export(...)`` and ``polyprof run`` forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

pytest.importorskip("torch")
import torch

import polyprof
from polyprof import ProfilerActivity
from polyprof.hooks.components import Exporter
from polyprof.runtime.exporting import (
    EXPORT_TIMEOUT_BASE_S,
    EXPORT_TIMEOUT_ENV,
    EXPORT_TIMEOUT_PER_EVENT_S,
    ExportTimeoutError,
    export_timeout_s,
)
from polyprof.testing import ComponentPlugin, make_plugin_manager_for_tests

DEADLINE_S = 0.3
#: The test exporters give up by themselves after this long, so that a regression fails instead of hanging.
HANG_S = 30


class HangingExporter(Exporter):
    """Hangs until ``release`` is set; ``in_place`` writes part of the file first, ``atomic`` at the end."""

    suffixes = (".hang",)

    def __init__(self, name: str = "hang", *, in_place: bool = False) -> None:
        self.name = name
        self.in_place = in_place
        self.release = threading.Event()

    def export(self, trace: Any, path: str, **options: Any) -> str:
        if self.in_place:
            with open(path, "w") as f:
                f.write('{"traceEvents": [')
                f.flush()
                self.release.wait(HANG_S)
                f.write("]}")
            return path
        self.release.wait(HANG_S)
        Path(path).write_text("{}")  # stands in for an atomic rename at the end
        return path


class FailingExporter(Exporter):
    name = "fails"

    def export(self, trace: Any, path: str, **options: Any) -> str:
        raise OSError(28, "No space left on device", path)


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EXPORT_TIMEOUT_ENV, str(DEADLINE_S))


def recorded(exporter: Exporter) -> polyprof.profile:
    pm = make_plugin_manager_for_tests(
        ComponentPlugin(plugin_name="hanging", exporters=[exporter]), builtins=True
    )
    with polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=pm) as prof:
        torch.ones(8).sum()
    return prof


@pytest.mark.parametrize("route", ["export", "export_chrome_trace"])
def test_hanging_exporter_times_out_naming_plugin_and_path(
    route: str, short_deadline: None, tmp_path: Path
) -> None:
    # Named "chrome", the test plugin's exporter (registered last) replaces the built-in one.
    exporter = HangingExporter("hang" if route == "export" else "chrome")
    prof = recorded(exporter)
    path = tmp_path / "trace.json"
    started = time.monotonic()
    try:
        with pytest.raises(ExportTimeoutError) as info:
            if route == "export":
                prof.export(path, format="hang")
            else:
                prof.export_chrome_trace(path)
        assert time.monotonic() - started < DEADLINE_S + 5
        message = str(info.value)
        assert f"exporter {exporter.name!r}" in message
        assert "HangingExporter" in message and "plugin 'hanging'" in message
        assert str(path) in message and EXPORT_TIMEOUT_ENV in message
        assert isinstance(info.value, TimeoutError)
        assert not path.exists()
    finally:
        exporter.release.set()


def test_partial_file_of_an_in_place_exporter_is_removed(short_deadline: None, tmp_path: Path) -> None:
    exporter = HangingExporter(in_place=True)
    prof = recorded(exporter)
    path = tmp_path / "trace.hang"
    try:
        with pytest.raises(ExportTimeoutError, match="nothing is left at"):
            prof.export(path, format="hang")
        assert not path.exists()
    finally:
        exporter.release.set()


def test_a_file_that_was_there_before_is_kept(short_deadline: None, tmp_path: Path) -> None:
    exporter = HangingExporter()
    prof = recorded(exporter)
    path = tmp_path / "trace.hang"
    path.write_text("earlier trace")
    try:
        with pytest.raises(ExportTimeoutError, match="already at"):
            prof.export(path, format="hang")
        assert path.read_text() == "earlier trace"
    finally:
        exporter.release.set()


def test_a_late_finish_is_logged_and_its_complete_file_kept(short_deadline: None, tmp_path: Path) -> None:
    exporter = HangingExporter()
    prof = recorded(exporter)
    path = tmp_path / "trace.hang"
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(ExportTimeoutError):
            prof.export(path, format="hang")
        exporter.release.set()
        deadline = time.monotonic() + 10
        while not any(e["event"] == "export_finished_after_deadline" for e in logs):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert path.read_text() == "{}"


def test_a_quick_exporter_and_its_errors_pass_through(short_deadline: None, tmp_path: Path) -> None:
    prof = recorded(FailingExporter())
    with pytest.raises(OSError, match="No space left"):
        prof.export(tmp_path / "t.json", format="fails")
    written = prof.export_chrome_trace(tmp_path / "t.json")  # the built-in exporter, within the deadline
    assert Path(written).stat().st_size > 0


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", ""])
def test_deadline_variable_is_checked(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EXPORT_TIMEOUT_ENV, value)
    if not value:  # unset: the default
        assert export_timeout_s() == EXPORT_TIMEOUT_BASE_S
        return
    with pytest.raises(ValueError, match=f"{EXPORT_TIMEOUT_ENV}={value!r} is not a valid export deadline"):
        export_timeout_s()


def test_deadline_default_scales_with_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EXPORT_TIMEOUT_ENV, raising=False)
    trace = recorded(FailingExporter()).trace
    expected = (
        EXPORT_TIMEOUT_BASE_S
        + len(trace.events) * EXPORT_TIMEOUT_PER_EVENT_S
        + (trace.end_ns - trace.start_ns) / 1e9
    )
    assert export_timeout_s(trace) == pytest.approx(expected)
    monkeypatch.setenv(EXPORT_TIMEOUT_ENV, "inf")
    assert export_timeout_s(trace) is None
    monkeypatch.setenv(EXPORT_TIMEOUT_ENV, " 12.5 ")
    assert export_timeout_s(trace) == 12.5


HANGING_SCRIPT = """
    import threading
    import polyprof, torch
    from polyprof.hooks.components import Exporter
    from polyprof.testing import ComponentPlugin, make_plugin_manager_for_tests

    class Hang(Exporter):
        name = "hang"
        def export(self, trace, path, **options):
            threading.Event().wait()  # forever

    hanging = ComponentPlugin(plugin_name="hanging", exporters=[Hang()])
    pm = make_plugin_manager_for_tests(hanging, builtins=True)
    with polyprof.profile(plugin_manager=pm) as prof:
        torch.ones(4).sum()
    prof.export("trace.hang", format="hang")
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["python", "polyprof run"])
def test_process_with_a_hanging_export_exits_with_a_clear_error(how: str, tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(textwrap.dedent(HANGING_SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    env[EXPORT_TIMEOUT_ENV] = "1"
    argv = [str(script)] if how == "python" else ["-m", "polyprof", "run", str(script)]
    result = subprocess.run(
        [sys.executable, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "ExportTimeoutError" in result.stderr
    assert "exporter 'hang'" in result.stderr and "plugin 'hanging'" in result.stderr
    assert not (tmp_path / "trace.hang").exists()
