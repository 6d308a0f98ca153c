"""Exporters and plugins that must never lose or misreport a trace (issue 23, items 6, 8, 9 and 10).

* Ctrl-C during ``export_chrome_trace`` stops the export: no temporary file, the
  destination as it was, the interrupt propagates (real processes, real SIGINT);
* an exporter's suffixes and the format asked for agree, or the call says why;
* a plugin whose ``make_exporter`` raises is named with its reason, not as a missing name;
* a tracer whose ``prepare()`` or ``start()`` raises costs only its own events;
* a distribution squatting polyprof-cuda's entry-point name ``cuda`` no longer blocks it, and
  is warned about once per process.

Fake plugins come from fake distributions, as in tests/test_plugin_faults.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import structlog

import polyprof
from polyprof.base.activity import ProfilerActivity
from polyprof.base.errors import PolyprofError, PolyprofWarning
from polyprof.base.fileio import WriteCancellation, WriteCancelled, atomic_writer, cancellable_writes
from polyprof.hooks import plugin_discovery
from polyprof.hooks.components import Exporter
from polyprof.hooks.plugin_calls import PluginFailureWarning
from polyprof.hooks.plugin_discovery import ALLOW_LIST_ENV, DISABLE_AUTOLOAD_ENV
from polyprof.hooks.registry import (
    TRACE_ENV,
    UnknownExporterError,
    forget_shared_plugin_manager,
    make_plugin_manager,
    shared_plugin_manager,
)
from polyprof.runtime import exporting
from polyprof.runtime.exporting import export_trace
from polyprof.testing import (
    ComponentPlugin,
    FakeTracer,
    InMemoryExporter,
    make_plugin_manager_for_tests,
    make_trace,
)

torch = pytest.importorskip("torch")


def workload() -> None:
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))


#: Test exporters and Ctrl-C presses give up after this long, so that a regression fails instead of hanging.
HANG_S = 30


def leftovers(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


# ------------------------------------------------------ item 6: Ctrl-C during an export

#: Profiles, then exports with a slowed chrome exporter (many small chunks, a pause after each)
#: and touches ``<dest>.started`` once the temporary file has data; on Ctrl-C it waits a second
#: (an abandoned write would go on meanwhile), prints what the directory holds, and re-raises.
INTERRUPTED_EXPORT = """
    import os, sys, time
    import torch
    import polyprof
    import polyprof.shim
    import polyprof.runtime.chrome_trace as chrome_trace

    dest, frontend = sys.argv[1], sys.argv[2]
    chrome_trace.CHUNK_EVENTS = 200
    chunks = chrome_trace._trace_chunks

    def slowed(*args, **kwargs):
        for i, chunk in enumerate(chunks(*args, **kwargs)):
            yield chunk
            if i == 1:
                open(dest + ".started", "w").close()
            time.sleep(0.05)

    chrome_trace._trace_chunks = slowed
    if frontend == "autograd":
        prof = polyprof.shim.AutogradProfile()
    else:
        prof = polyprof.profile(activities=[polyprof.ProfilerActivity.CPU])
    x = torch.ones(4)
    with prof:
        for _ in range(2000):
            x = x + 1
    try:
        prof.export_chrome_trace(dest)
    except KeyboardInterrupt:
        time.sleep(1.0)
        print("after the interrupt:", sorted(os.listdir(os.path.dirname(dest))), flush=True)
        raise
    print("finished without an interrupt", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("delay_s", "name", "frontend", "existing"),
    [
        (0.0, "t.json", "profile", None),
        (0.15, "t.json.gz", "profile", None),
        (0.3, "t.json", "profile", b"the previous trace"),
        (0.5, "t.json", "autograd", None),
        (0.8, "t.json.gz", "autograd", b"the previous trace"),
    ],
)
def test_ctrl_c_during_export_stops_it_and_leaves_nothing(
    tmp_path: Path, delay_s: float, name: str, frontend: str, existing: bytes | None
) -> None:
    script = tmp_path / "export.py"
    script.write_text(textwrap.dedent(INTERRUPTED_EXPORT))
    out = tmp_path / "out"
    out.mkdir()
    dest = out / name
    if existing is not None:
        dest.write_bytes(existing)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYPROF_")}
    child = subprocess.Popen(
        [sys.executable, str(script), str(dest), frontend],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = Path(f"{dest}.started")
        while not started.exists() and child.poll() is None:
            time.sleep(0.01)
        assert child.poll() is None, child.communicate()
        time.sleep(delay_s)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    time.sleep(0.5)  # nothing may appear after the process is gone either
    assert child.returncode == -signal.SIGINT, (child.returncode, stderr)  # status 130 in a shell
    assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
    assert "Fatal Python error" not in stderr
    assert "after the interrupt" in stdout, "the interrupt reached the caller of export_chrome_trace"
    assert ".tmp" not in stdout, "the temporary file was still there a second after the interrupt"
    assert leftovers(out) == []
    if existing is None:
        assert not dest.exists(), "the interrupted write must not finish later"
    else:
        assert dest.read_bytes() == existing


def test_a_cancelled_atomic_write_stops_and_never_renames(tmp_path: Path) -> None:
    dest = tmp_path / "t.json"
    cancellation = WriteCancellation()
    with cancellable_writes(cancellation), pytest.raises(WriteCancelled):
        with atomic_writer(dest) as out:
            out.write("x" * 100_000)
            out.flush()
            cancellation.cancel()
            out.write("y" * 100_000)
            out.flush()
    assert not dest.exists() and leftovers(tmp_path) == []
    # Cancelled after its last write but before its rename: it still renames nothing.
    cancellation = WriteCancellation()
    with cancellable_writes(cancellation), pytest.raises(WriteCancelled):
        with atomic_writer(dest) as out:
            out.write("{}")
            cancellation.cancel()
    assert not dest.exists() and leftovers(tmp_path) == []
    with atomic_writer(dest) as out:  # outside the block, writes are not cancellable
        out.write("{}")
    assert dest.read_text() == "{}"


def interrupt_main_thread() -> None:
    """Ctrl-C, as the terminal sends it: SIGINT, handled by the main thread."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def export_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("polyprof-export-")]


def late_end(logs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one log of an abandoned write's end, once it is there (joining the thread is no use: up
    to Python 3.12 a join that Ctrl-C interrupted returns at once from then on)."""
    for _ in range(HANG_S * 100):
        ends = [e for e in logs if e["event"].startswith("export_finished_after")]
        if ends:
            [end] = ends
            return end
        time.sleep(0.01)
    raise AssertionError(f"the abandoned write never ended: {logs}")


@pytest.fixture
def in_main_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread, which receives SIGINT")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not raise KeyboardInterrupt here")


class TwoFileExporter(Exporter):
    """Writes ``path`` and then a sidecar ``path + '.index'``, both through atomic_writer.

    The first rename blocks until ``release`` is set (slow storage); ``renaming`` is set when it begins.
    """

    name = "two_files"

    def __init__(self) -> None:
        self.renaming = threading.Event()
        self.release = threading.Event()
        self.cancellation: WriteCancellation | None = None

    def export(self, trace: Any, path: str, **options: Any) -> str:
        from polyprof.base import fileio

        self.cancellation = fileio._cancellation.get()  # the test waits until the caller has cancelled it
        with atomic_writer(path) as out:
            out.write("trace")
        with atomic_writer(path + ".index") as out:
            out.write("index")
        return path


def test_a_second_ctrl_c_ends_the_wait_but_not_the_cancellation(
    in_main_thread, monkeypatch, tmp_path: Path
) -> None:
    exporter = TwoFileExporter()
    replace = os.replace

    def slow_replace(source: Any, destination: Any) -> None:
        if threading.current_thread() in export_threads() and not exporter.renaming.is_set():
            exporter.renaming.set()
            exporter.release.wait(HANG_S)
        replace(source, destination)

    def press_ctrl_c_twice() -> None:
        exporter.renaming.wait(HANG_S)
        interrupt_main_thread()  # the caller cancels the write, then waits for the rename under way
        for _ in range(200):  # without the fix, cancel() sets nothing before that rename ends
            if exporter.cancellation is not None and exporter.cancellation.cancelled:
                break
            time.sleep(0.01)
        interrupt_main_thread()

    monkeypatch.setattr(os, "replace", slow_replace)
    dest = tmp_path / "t.json"
    presser = threading.Thread(target=press_ctrl_c_twice)
    with structlog.testing.capture_logs() as logs:
        presser.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                export_trace(exporter, make_trace(), str(dest))
        finally:
            presser.join()
            exporter.release.set()
        late = late_end(logs)
    assert late["event"] == "export_finished_after_interrupt" and late["outcome"] == "cancelled"
    assert dest.read_text() == "trace"  # the rename under way at the interrupt ends
    assert not Path(f"{dest}.index").exists(), "the cancellation was lost with the second Ctrl-C"
    assert leftovers(tmp_path) == []


class LateAtomicExporter(Exporter):
    """Reaches its first atomic write only once the export has been cancelled."""

    name = "late_atomic"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.cancellation: WriteCancellation | None = None

    def export(self, trace: Any, path: str, **options: Any) -> str:
        from polyprof.base import fileio

        self.cancellation = fileio._cancellation.get()
        self.started.set()
        self.release.wait(HANG_S)
        with atomic_writer(path) as out:
            out.write("trace")
        return path


def test_ctrl_c_waits_for_the_cancelled_write_to_clean_up(
    in_main_thread, monkeypatch, tmp_path: Path
) -> None:
    # The wait's bound is not under test here: on a loaded machine the 5 s default was once too short.
    monkeypatch.setattr(exporting, "EXPORT_CANCEL_WAIT_S", float(HANG_S))
    exporter = LateAtomicExporter()
    dest = tmp_path / "t.json"

    def press_ctrl_c() -> None:
        exporter.started.wait(HANG_S)
        interrupt_main_thread()
        for _ in range(HANG_S * 100):
            if exporter.cancellation is not None and exporter.cancellation.cancelled:
                break
            time.sleep(0.01)
        exporter.release.set()

    presser = threading.Thread(target=press_ctrl_c)
    with structlog.testing.capture_logs() as logs:
        presser.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                export_trace(exporter, make_trace(), str(dest))
            # Already when the interrupt reaches the caller, not some time later:
            assert [e["event"] for e in logs if e["event"].startswith("export_")] == ["export_cancelled"]
        finally:
            presser.join()
            exporter.release.set()
    assert not dest.exists() and leftovers(tmp_path) == []


class BlockingExporter(Exporter):
    """Writes in place (not through atomic_writer), once ``release`` is set."""

    name = "blocking"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def export(self, trace: Any, path: str, **options: Any) -> str:
        self.started.set()
        self.release.wait(HANG_S)
        Path(path).write_text("late")
        return path


def test_a_write_that_ends_after_the_interrupts_wait_is_logged_as_such(
    in_main_thread, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(exporting, "EXPORT_CANCEL_WAIT_S", 0.0)
    exporter = BlockingExporter()
    dest = tmp_path / "t.blocking"

    def press_ctrl_c() -> None:
        exporter.started.wait(HANG_S)
        interrupt_main_thread()

    presser = threading.Thread(target=press_ctrl_c)
    with structlog.testing.capture_logs() as logs:
        presser.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                export_trace(exporter, make_trace(), str(dest))
        finally:
            presser.join()
            exporter.release.set()
        late = late_end(logs)
    assert late["event"] == "export_finished_after_interrupt" and late["outcome"] == "finished"
    assert dest.read_text() == "late"


# ------------------------------------------------------ fake plugins from fake distributions

#: A tracer that fails in the step named by the module's last word (pp_h3_tracer_<step>).
FAILING_TRACER = """
    from polyprof import hookimpl
    from polyprof.hooks.components import Capabilities
    from polyprof.testing import FakeTracer

    class Fails(FakeTracer):
        def {step}(self):
            raise RuntimeError("no device handle in {step}")

    @hookimpl
    def polyprof_capabilities():
        return Capabilities(activities=["cuda"])

    @hookimpl
    def polyprof_make_tracers(config):
        return [Fails(name="third_party_device", activities=["cuda"])]
"""

#: Declares the exporter "faulty" and fails to make it.
FAULTY_EXPORTER = """
    from polyprof import hookimpl
    from polyprof.hooks.components import Capabilities

    @hookimpl
    def polyprof_capabilities():
        return Capabilities(exporters=("faulty",))

    @hookimpl
    def polyprof_make_exporter(config, name):
        if name == "faulty":
            raise ImportError("libfaulty.so: cannot open shared object file")
"""

#: Fails to make any exporter, without declaring one.
UNDECLARED_FAULTY_EXPORTER = """
    from polyprof import hookimpl

    @hookimpl
    def polyprof_make_exporter(config, name):
        raise RuntimeError("bug in an exporter plugin")
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
    "pp_h3_tracer_prepare": FAILING_TRACER.format(step="prepare"),
    "pp_h3_tracer_start": FAILING_TRACER.format(step="start"),
    "pp_h3_faulty_exporter": FAULTY_EXPORTER,
    "pp_h3_undeclared_faulty": UNDECLARED_FAULTY_EXPORTER,
    "pp_h3_real_cuda": REAL_CUDA,
    "pp_h3_squatter": SQUATTER,
}


class FakeDistribution:
    """Just what the registry reads from an ``importlib.metadata.Distribution``."""

    def __init__(self, name: str, version: str, entry_points: dict[str, str]) -> None:
        self.metadata = {"Name": name}
        self.version = version
        self.entry_points = [importlib.metadata.EntryPoint(n, v, "polyprof") for n, v in entry_points.items()]


REAL = FakeDistribution("polyprof-cuda", "0.3.1", {"cuda": "pp_h3_real_cuda"})
SQUAT = FakeDistribution("aaa-squat", "6.6.6", {"cuda": "pp_h3_squatter"})


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("h3_plugins")
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
    monkeypatch.setattr(plugin_discovery, "_contested_warned", set())  # warned once per process


@pytest.fixture
def installed(monkeypatch, plugin_dir):
    """``installed(dist, ...)``: make these the only installed distributions."""

    def install(*dists):
        monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter(dists))

    return install


def recorded(pm) -> polyprof.profile:
    with polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=pm) as prof:
        workload()
    return prof


# ------------------------------------------------- item 8: the suffix and the format agree


@pytest.mark.parametrize(
    ("call", "name", "expected"),
    [
        (
            "parquet",
            "t.json",
            (
                "format='parquet' writes .parquet files; 't.json' ends in .json, which format='chrome' "
                "writes: name it t.parquet or write it with export('t.json', format='chrome')"
            ),
        ),
        (
            "parquet",
            "t.json.gz",
            (
                "format='parquet' writes .parquet files; 't.json.gz' ends in .json.gz, which format='chrome' "
                "writes: name it t.parquet"
            ),
        ),
        ("parquet", "trace", "format='parquet' writes .parquet files; 'trace' ends in none of them"),
        (
            "export_chrome_trace",
            "t.parquet",
            (
                "format='chrome' writes .json or .json.gz files (export_chrome_trace and "
                "tensorboard_trace_handler write this format); 't.parquet' ends in .parquet, which "
                "format='parquet' writes: name it t.json or write it with "
                "export('t.parquet', format='parquet')"
            ),
        ),
        ("chrome", "t.PARQUET", "'t.PARQUET' ends in .parquet, which format='parquet' writes"),
    ],
)
def test_a_suffix_that_disagrees_with_the_format_is_refused(
    tmp_path: Path, call: str, name: str, expected: str
) -> None:
    prof = recorded(make_plugin_manager(entry_points=False))
    path = tmp_path / name
    earlier = b"the previous file"
    path.write_bytes(earlier)
    with pytest.raises(PolyprofError) as err:
        if call == "export_chrome_trace":
            prof.export_chrome_trace(path)
        else:
            prof.export(path, format=call)
    assert isinstance(err.value, ValueError)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert path.read_bytes() == earlier and leftovers(tmp_path) == []


def test_the_builtin_exporters_refuse_it_when_called_directly(tmp_path: Path) -> None:
    pm = make_plugin_manager(entry_points=False)
    trace = recorded(pm).trace
    for format_name, name in [("parquet", "t.json"), ("chrome", "t.parquet")]:
        with pytest.raises(ValueError, match=f"format={format_name!r} writes"):
            pm.make_exporter(trace.config, format_name).export(trace, str(tmp_path / name))
    assert os.listdir(tmp_path) == []


def test_matching_suffixes_and_torch_style_names_still_write(tmp_path: Path) -> None:
    import gzip

    pytest.importorskip("pyarrow")
    from polyprof.formats.columnar import read_parquet_table

    prof = recorded(make_plugin_manager(entry_points=False))
    parquet = prof.export(tmp_path / "T.Parquet", format="parquet")
    assert read_parquet_table(parquet).num_rows > 0
    gz = prof.export_chrome_trace(tmp_path / "t.json.gz")
    assert any(
        e.get("name") == "aten::mm" for e in json.loads(gzip.decompress(Path(gz).read_bytes()))["traceEvents"]
    )
    # torch's export_chrome_trace and export_stacks write any name that is no other trace format's
    for name in ("trace.pt.trace.json", "trace", "trace.txt"):
        assert json.loads(Path(prof.export_chrome_trace(tmp_path / name)).read_text())["traceEvents"]


class SuffixedExporter(Exporter):
    """A third-party exporter that declares its suffix (a suggestion) and writes through atomic_writer."""

    name = "thirdparty"
    suffixes = (".tp",)

    def export(self, trace: Any, path: str, **options: Any) -> str:
        with atomic_writer(path) as out:
            out.write("third party")
        return path


def test_every_other_format_writes_any_name(tmp_path: Path) -> None:
    """Only the two trace formats are held to their suffixes; torch writes any name."""
    pytest.importorskip("ittapi")
    from torch._C._profiler import _ExperimentalConfig

    memory = InMemoryExporter()  # declares .memory
    pm = make_plugin_manager_for_tests(
        ComponentPlugin(plugin_name="thirdparty", exporters=[SuffixedExporter(), memory]), builtins=True
    )
    with polyprof.profile(
        activities=[ProfilerActivity.CPU],
        with_stack=True,
        experimental_config=_ExperimentalConfig(verbose=True),
        plugin_manager=pm,
    ) as prof:
        workload()
    for name in ("t.json", "t.parquet", "trace"):
        assert Path(prof.export(tmp_path / name, format="thirdparty")).read_text() == "third party"
    assert prof.export(tmp_path / "kept.json", format="memory") == str(tmp_path / "kept.json")
    assert memory.exported[-1].path == str(tmp_path / "kept.json")
    summary = json.loads(Path(prof.export(tmp_path / "summary.json", format="itt")).read_text())
    assert summary["exporter"] == "itt"
    stacks = Path(prof.export_stacks(tmp_path / "x.json")).read_text().splitlines()
    assert stacks and all(line.rsplit(" ", 1)[1].isdigit() for line in stacks)  # collapsed stacks


def test_the_known_trace_suffixes_are_the_builtin_exporters_own() -> None:
    from polyprof.runtime.chrome_trace import ChromeTraceExporter
    from polyprof.runtime.exporting import TRACE_FORMAT_SUFFIXES
    from polyprof.runtime.parquet_trace import ParquetTraceExporter

    assert TRACE_FORMAT_SUFFIXES == {
        "chrome": ChromeTraceExporter.suffixes,
        "parquet": ParquetTraceExporter.suffixes,
    }


# ------------------------------------------- item 9: an exporter its plugin fails to make


def test_an_exporter_whose_plugin_fails_to_make_it_is_named_with_the_reason(
    installed, tmp_path: Path
) -> None:
    installed(FakeDistribution("polyprof-faulty", "1.0", {"faulty": "pp_h3_faulty_exporter"}))
    prof = recorded(make_plugin_manager())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginFailureWarning)
        with pytest.raises(UnknownExporterError) as err:
            prof.export(tmp_path / "t.faulty", format="faulty")
    message = str(err.value)
    assert message == (
        "exporter 'faulty' could not be made: plugin 'faulty' (polyprof-faulty 1.0), which provides it, "
        "failed in polyprof_make_exporter: ImportError: libfaulty.so: cannot open shared object file"
    )
    assert "available exporters" not in message
    assert os.listdir(tmp_path) == []


def test_a_missing_exporter_names_the_plugins_that_failed_to_answer(installed, tmp_path: Path) -> None:
    installed(FakeDistribution("polyprof-buggy", "2.0", {"buggy": "pp_h3_undeclared_faulty"}))
    prof = recorded(make_plugin_manager())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginFailureWarning)
        with pytest.raises(UnknownExporterError) as err:
            prof.export(tmp_path / "t.nope", format="nope")
    message = str(err.value)
    assert message.startswith("no exporter named 'nope'; available exporters: chrome, ")
    assert message.endswith(
        "; plugin 'buggy' (polyprof-buggy 2.0) failed in polyprof_make_exporter "
        "(RuntimeError: bug in an exporter plugin)"
    )


# ------------------------------------- item 10 (a): a tracer failing in prepare() or start()


@pytest.mark.parametrize("step", ["prepare", "start"])
def test_a_third_party_tracer_failing_to_begin_costs_only_its_own_events(
    installed, step: str, caplog
) -> None:
    installed(FakeDistribution("polyprof-device", "1.0", {"device": f"pp_h3_tracer_{step}"}))
    prof = polyprof.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], plugin_manager=make_plugin_manager()
    )
    with (
        caplog.at_level(logging.ERROR, logger="polyprof.runtime.session"),
        warnings.catch_warnings(record=True) as record,
    ):
        warnings.simplefilter("always")
        with prof:
            workload()
    messages = [str(w.message) for w in record if issubclass(w.category, PluginFailureWarning)]
    assert messages == [
        (
            "polyprof: tracer 'third_party_device' of plugin 'device' (polyprof-device 1.0) "
            f"failed in {step}() (RuntimeError: no device handle in {step}); the recording keeps the other "
            "tracers' events, and its own may be missing or incomplete"
        )
    ]
    assert "aten::mm" in {event.name for event in prof.events()}
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    [trace] = prof._traces
    assert any("'third_party_device'" in note and f"failed in {step}()" in note for note in trace.notes)
    assert f"tracer_{step}_failed" in caplog.text and "plugin='device'" in caplog.text
    # The next recording asks the tracer again, and torch's collector is free for it.
    with (
        pytest.warns(PluginFailureWarning, match=f"failed in {step}"),
        polyprof.profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], plugin_manager=make_plugin_manager()
        ) as again,
    ):
        workload()
    assert "aten::mm" in {event.name for event in again.events()}


class FailsOnSecondStart(FakeTracer):
    """Records the first time; then fails to start, keeping the first recording's start_ns and end_ns."""

    def start(self) -> None:
        if "start" in self.calls:
            raise RuntimeError("device busy")
        super().start()


def test_a_tracer_left_out_does_not_stretch_the_trace_with_an_earlier_span() -> None:
    tracer = FailsOnSecondStart(name="third_party_device", activities=["cuda"])
    pm = make_plugin_manager_for_tests(ComponentPlugin(plugin_name="device", tracers=[tracer]), builtins=True)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with polyprof.profile(activities=activities, plugin_manager=pm) as first:
        workload()
    with pytest.warns(PluginFailureWarning, match="failed in start"):
        with polyprof.profile(activities=activities, plugin_manager=pm) as second:
            workload()
    [earlier], [trace] = first._traces, second._traces
    assert tracer.start_ns is not None and tracer.start_ns <= earlier.end_ns  # what it would report
    assert trace.start_ns > earlier.end_ns, "the trace spans the earlier recording too"


def test_the_builtin_collector_failing_to_start_still_stops_the_profile(monkeypatch) -> None:
    """torch's collector is the recording: its failure is the profile's, raised as before."""
    from polyprof.runtime.torch_cpu import TorchCpuTracer

    def busy(self) -> None:
        raise RuntimeError("collector busy")

    real_start = TorchCpuTracer.start
    monkeypatch.setattr(TorchCpuTracer, "start", busy)
    prof = polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=make_plugin_manager())
    with pytest.raises(RuntimeError, match="collector busy"), prof:
        workload()
    # the collector it prepared is released: the next profile records (torch 2.6 failed it)
    monkeypatch.setattr(TorchCpuTracer, "start", real_start)
    with polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=make_plugin_manager()) as prof:
        workload()
    assert any(e.name.startswith("aten::") for e in prof.events())


# -------------------------------------------------- item 10 (b): a squatter on 'cuda'


def test_polyprof_cuda_keeps_its_name_against_a_squatter_and_says_so(installed, capsys) -> None:
    from polyprof.cli import main

    installed(SQUAT, REAL)
    with pytest.warns(PolyprofWarning) as record:
        pm = make_plugin_manager()
    [message] = [str(w.message) for w in record]
    assert message == (
        "entry-point name 'cuda' is declared by polyprof-cuda and by aaa-squat; polyprof loads "
        "polyprof-cuda, polyprof's own plugin for it. To load another, set POLYPROF_PLUGINS=DIST:cuda "
        "(e.g. POLYPROF_PLUGINS=aaa-squat:cuda)"
    )
    infos = {info.name: info for info in pm.plugin_infos()}
    assert infos["cuda"].status == "loaded" and infos["cuda"].distribution == "polyprof-cuda"
    squat = infos["cuda (aaa-squat)"]
    assert squat.status == "blocked" and squat.conflicts_with == ("polyprof-cuda",)
    assert squat.reason == (
        "conflict: entry-point name 'cuda' belongs to polyprof-cuda, which loads in its place; "
        "to load this one, set POLYPROF_PLUGINS=aaa-squat:cuda"
    )
    assert "pp_h3_squatter" not in sys.modules and "pp_h3_real_cuda" in sys.modules
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolyprofWarning)  # warned once per process; the table says it
        assert main(["plugins"]) == 0
    table = capsys.readouterr().out
    assert "belongs to" in " ".join(table.split()) and "polyprof-cuda, which loads in its place" in table


def test_the_contested_name_is_warned_once_per_process_in_one_log_line(installed) -> None:
    installed(SQUAT, REAL)
    forget_shared_plugin_manager()
    try:
        with structlog.testing.capture_logs() as logs, warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            managers = [make_plugin_manager(), make_plugin_manager()]
            managers += [shared_plugin_manager(), shared_plugin_manager()]  # one per profile
    finally:
        forget_shared_plugin_manager()
    for pm in managers:
        assert {info.name: info.distribution for info in pm.plugin_infos()}["cuda"] == "polyprof-cuda"
    warned = [str(w.message) for w in record if issubclass(w.category, PolyprofWarning)]
    assert len(warned) == 1 and "polyprof loads polyprof-cuda" in warned[0]
    assert [e["event"] for e in logs if e["event"].startswith("plugin_name_")] == ["plugin_name_contested"]


def test_the_allow_list_can_still_pick_the_squatter(installed, monkeypatch) -> None:
    installed(SQUAT, REAL)
    monkeypatch.setenv(ALLOW_LIST_ENV, "aaa-squat:cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolyprofWarning)  # an explicit choice gets no warning
        pm = make_plugin_manager()
    infos = {info.name: info for info in pm.plugin_infos()}
    assert infos["cuda"].distribution == "aaa-squat" and infos["cuda"].status == "loaded"
    real = infos["cuda (polyprof-cuda)"]
    assert (
        real.status == "blocked" and "also declared by aaa-squat, which POLYPROF_PLUGINS picks" in real.reason
    )


def test_with_autoload_off_neither_loads_and_no_one_is_said_to(installed, monkeypatch) -> None:
    installed(SQUAT, REAL)
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolyprofWarning)
        pm = make_plugin_manager()
    statuses = {info.name: info.status for info in pm.plugin_infos() if "cuda" in info.name}
    assert set(statuses.values()) == {"blocked"}
    assert not any("loads in its place" in (info.reason or "") for info in pm.plugin_infos())


def test_two_third_parties_on_one_name_still_fail_closed(installed) -> None:
    installed(
        FakeDistribution("aaa-squat", "6.6.6", {"tool": "pp_h3_squatter"}),
        FakeDistribution("zzz-tool", "1.0", {"tool": "pp_h3_real_cuda"}),
    )
    infos = {info.name: info for info in make_plugin_manager().plugin_infos()}
    assert "tool" not in infos
    assert infos["tool (aaa-squat)"].status == infos["tool (zzz-tool)"].status == "blocked"
