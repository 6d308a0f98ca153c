"""polyprof's compiled reader of torch's raw result against its pure-Python reader (issue 12).

The compiled reader (polyprof.native.native_reader, core/polyprof/native/kineto_reader.cpp) must give
exactly what the Python reader gives: every column, decoded at once or deferred, on every
supported torch (this file is in the differential subset). torch's own parse is the oracle for
the Python reader (test_results.py, test_event_attributes.py, ...); scripts/test.sh runs that
subset with each reader. Here: the two readers on the same raw result, the row subsets the
decoder takes, and what happens when the compiled reader cannot be built or is asked wrongly.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyprof.base import torch_support
from polyprof.base.config import ProfileConfig
from polyprof.base.errors import PolyprofError
from polyprof.native import native_reader
from polyprof.runtime import result_rows
from polyprof.runtime.result_rows import ResultRows

torch = pytest.importorskip("torch")
torch_cpu = pytest.importorskip("polyprof.runtime.torch_cpu")
if torch_cpu.torch_unavailable_reason() is not None:
    pytest.skip(torch_cpu.torch_unavailable_reason(), allow_module_level=True)

from torch._C._profiler import _ExperimentalConfig  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from polyprof.base.activity import ProfilerActivity as PA  # noqa: E402

FEATURES = torch_support.installed()
HAS_COMPILER = shutil.which(os.environ.get("CXX", "c++")) is not None
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler here: only the Python reader")


@pytest.fixture(scope="module")
def compiled() -> Any:
    if not HAS_COMPILER:
        pytest.skip("no C++ compiler here: only the Python reader")
    return native_reader.reader("native")


def _workload() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    x = torch.randn(4, 8, requires_grad=True)
    for step in range(2):
        with record_function(f"step_{step}"):
            loss = model(x).sum()
            loss.backward()
        torch.ones(3).add_(1)


FLAG_SETS = {
    "default": {},
    "record_shapes": {"record_shapes": True},
    "profile_memory": {"profile_memory": True},
    "with_stack": {"with_stack": True},
    "with_flops": {"with_flops": True},
    "with_modules": {"with_modules": True},
    "every_flag": {
        "record_shapes": True,
        "profile_memory": True,
        "with_stack": True,
        "with_flops": True,
        "with_modules": True,
    },
}


def _raw_result(flags: dict[str, Any]) -> tuple[Any, ProfileConfig]:
    experimental = {k: True for k in ("capture_overload_names",) if k in FEATURES.experimental_fields}
    with profile(
        activities=[ProfilerActivity.CPU], experimental_config=_ExperimentalConfig(**experimental), **flags
    ) as prof:
        _workload()
    return prof.profiler.kineto_results, ProfileConfig(activities={PA.CPU}, **flags, **experimental)


@pytest.fixture
def saved_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch writes a result once (before 2.13 the args and flows come from that file): both
    readers' decodes of one result share the one read."""
    read = torch_cpu.SavedKinetoTrace.read
    memo: dict[int, Any] = {}

    def read_once(result: Any) -> Any:
        if id(result) not in memo:
            memo[id(result)] = read(result)
        return memo[id(result)]

    monkeypatch.setattr(torch_cpu.SavedKinetoTrace, "read", staticmethod(read_once))


def _every_column(batch: Any) -> dict[str, tuple[np.ndarray, tuple]]:
    full = batch.materialized()
    return {field: (full[field], full.table(field)) for field in full.fields}


@pytest.mark.parametrize("flags", list(FLAG_SETS.values()), ids=list(FLAG_SETS))
def test_both_readers_decode_the_same_batch(flags: dict[str, Any], compiled: Any, saved_once: None) -> None:
    result, config = _raw_result(flags)
    native_batch, native_facts = torch_cpu.decode_result(result, config, pid=1, reader="native")
    python_batch, python_facts = torch_cpu.decode_result(result, config, pid=1, reader="python")
    assert native_facts == python_facts
    assert native_batch.fields == python_batch.fields
    native, python = _every_column(native_batch), _every_column(python_batch)
    assert len(native_batch) == len(python_batch) > 20
    for field in python:
        assert native[field][1] == python[field][1], f"table of {field}"
        assert native[field][0].dtype == python[field][0].dtype, field
        np.testing.assert_array_equal(native[field][0], python[field][0], err_msg=field)


def _fields_to_compare() -> list[tuple[str, str]]:
    wanted = [
        ("start_ns", "int64"),
        ("end_ns", "int64"),
        ("start_thread_id", "int64"),
        ("end_thread_id", "int64"),
        ("fwd_thread_id", "int64"),
        ("sequence_nr", "int64"),
        ("scope", "int8"),
        ("device_type", "int8"),
        ("device_index", "int32"),
        ("device_resource_id", "int64"),
        ("correlation_id", "int64"),
        ("linked_correlation_id", "int64"),
        ("is_async", "bool"),
        ("is_user_annotation", "bool"),
        ("is_python_function", "bool"),
        ("is_hidden_event", "bool"),
        ("flops", "int64"),
        ("nbytes", "int64"),
        ("flow_id", "int64"),
        ("flow_type", "int8"),
        ("flow_start", "bool"),
        ("external_id", "int64"),
        ("python_id", "int64"),
        ("python_parent_id", "int64"),
        ("python_module_id", "int64"),
    ]
    return [(name, dtype) for name, dtype in wanted if FEATURES.has_accessor(name)]


@pytest.fixture(scope="module")
def recorded() -> Any:
    result, _ = _raw_result(FLAG_SETS["every_flag"])
    return result


def test_the_compiled_reader_reads_every_field_torch_offers(compiled: Any) -> None:
    offered = {name for name, _ in _fields_to_compare()}
    assert offered <= set(compiled.field_names())


@needs_compiler
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_rows_read_alike(data: st.DataObject, recorded: Any, compiled: Any) -> None:
    """Columns and names of any subset of rows, in any order, repeats allowed, as the accessors give."""
    count = len(recorded.events())
    indices = np.array(data.draw(st.lists(st.integers(0, count - 1), max_size=60)), dtype=np.int64)
    native = ResultRows(recorded, compiled).take(indices)
    python = ResultRows(recorded, None).take(indices)
    assert native.native and not python.native
    for name, dtype in _fields_to_compare():
        np.testing.assert_array_equal(native.column(name, dtype), python.column(name, dtype), err_msg=name)
    for name in ("metadata_json", "activity_type", "extra_meta", "typed_metadata"):
        if FEATURES.has_accessor(name):
            n_idx, n_table = native.structured(name)
            p_idx, p_table = python.structured(name)
            np.testing.assert_array_equal(n_idx, p_idx, err_msg=name)
            assert n_table == p_table, name
    for which in ("name", "overload_name"):
        if which == "name" or FEATURES.has_accessor(which):
            n_idx, n_table, n_bad = native.names(which, empty="")
            p_idx, p_table, p_bad = python.names(which, empty="")
            np.testing.assert_array_equal(n_idx, p_idx)
            assert (n_table, n_bad) == (p_table, p_bad)


def test_host_rows_structured_metadata_is_read_without_torchs_wrappers(recorded: Any, compiled: Any) -> None:
    """What makes the deferred decode fast: no ``events()`` list for the structured columns."""
    rows = ResultRows(recorded, compiled)
    for name in ("metadata_json", "activity_type", "extra_meta", "typed_metadata"):
        if FEATURES.has_accessor(name) and (name != "activity_type" or FEATURES.at_least(2, 13)):
            rows.structured(name)
            assert rows._shared.every is None, name


def test_a_row_outside_the_result_is_refused_with_the_count(recorded: Any, compiled: Any) -> None:
    count = len(recorded.events())
    rows = ResultRows(recorded, compiled).take(np.array([0, count], dtype=np.int64))
    with pytest.raises(IndexError, match=f"row index {count} is outside the {count} events"):
        rows.column("start_ns", "int64")


def test_stand_ins_for_torchs_result_are_read_in_python(compiled: Any) -> None:
    class Event:
        def start_ns(self) -> int:
            return 5

    class StandIn:
        def events(self) -> list[Event]:
            return [Event(), Event()]

    rows = ResultRows(StandIn(), compiled)
    assert not rows.native
    assert rows.column("start_ns", "int64").tolist() == [5, 5]


# ----------------------------------------------------------------- choosing and building


def test_a_bad_reader_choice_fails_the_profiles_start_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import polyprof

    monkeypatch.setenv(native_reader.MODE_VARIABLE, "fastest")
    prof = polyprof.profile(activities=[polyprof.ProfilerActivity.CPU])
    with pytest.raises(PolyprofError, match="'fastest' is not a reader; choose one of auto, native, python"):
        prof.start()  # before anything is recorded
    assert not torch.autograd.profiler._is_profiler_enabled


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(native_reader.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.setattr(native_reader, "_loaded", {})
    monkeypatch.setattr(native_reader, "_background_started", set())
    yield tmp_path


def _spawns(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    started: list[list[str]] = []

    class Popen:
        pid = -1  # no such process: nothing is reniced

        def __init__(self, args: list[str], **kwargs: Any) -> None:
            assert kwargs["start_new_session"] is True and kwargs["stdout"] is subprocess.DEVNULL
            started.append(args)

    monkeypatch.setattr(native_reader.subprocess, "Popen", Popen)
    return started


def test_auto_reads_in_python_and_builds_once_in_the_background(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _spawns(monkeypatch)
    assert native_reader.reader("auto") is None
    assert native_reader.reader("auto") is None
    assert started == [[sys.executable, "-m", "polyprof.native.native_reader", "--background-build"]]


def test_a_failed_build_is_remembered_and_auto_falls_back_to_python(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no compiler works, the build fails once, says why, and profiles still come out whole."""
    import polyprof

    monkeypatch.setenv("CXX", "/nonexistent/c++")
    state = native_reader.build()
    assert not state.built and state.failure
    assert (state.folder / native_reader.FAILED_MARKER).is_file()
    started = _spawns(monkeypatch)
    assert native_reader.reader("auto") is None
    assert started == []  # not retried by auto
    with pytest.raises(native_reader.NativeReaderUnavailable, match="the build failed"):
        native_reader.reader("native")

    monkeypatch.setenv(native_reader.MODE_VARIABLE, "auto")
    with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU]) as prof:
        torch.ones(4).add_(1)
    assert "aten::add_" in prof.key_averages().table()


def _fake_compiler(monkeypatch: pytest.MonkeyPatch, *, fails: bool = False) -> list[dict[str, Any]]:
    """Replace the compiler: it notes where it built and whether the cache's build lock was free."""
    import fcntl

    builds: list[dict[str, Any]] = []
    suffix = native_reader.sysconfig.get_config_var("EXT_SUFFIX") or ".so"

    def compile_(spec: Any, folder: Path) -> None:
        cache = native_reader.BuildSpec.for_installed_torch().folder()
        with open(cache / native_reader.BUILD_LOCK, "a+b") as other:
            try:
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock_free = True
            except BlockingIOError:
                lock_free = False
        builds.append({"folder": folder, "lock_free": lock_free})
        if fails:
            raise RuntimeError("no compiler")
        (folder / f"{native_reader.MODULE_NAME}{suffix}").write_bytes(b"fake module")

    class Module:
        @staticmethod
        def field_names() -> list[str]:
            return ["start_ns", "end_ns", "start_thread_id"]

    monkeypatch.setattr(native_reader, "_compile", compile_)
    monkeypatch.setattr(native_reader, "_load", lambda folder: Module())
    return builds


@pytest.mark.skipif(native_reader.fcntl is None, reason="needs flock")
def test_the_background_build_compiles_aside_without_the_lock_a_waiting_build_needs(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It runs at idle priority: a build someone waits for must never wait for it to get a core."""
    builds = _fake_compiler(monkeypatch)
    state = native_reader.build(aside=True)
    assert state.built
    [built] = builds
    assert built["folder"] != state.folder and built["lock_free"]
    assert not built["folder"].exists(), "the build's own folder was left behind"
    assert native_reader._module_file(state.folder) is not None


@pytest.mark.skipif(native_reader.fcntl is None, reason="needs flock")
def test_a_build_someone_waits_for_holds_the_lock_and_an_aside_failure_is_remembered(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = _fake_compiler(monkeypatch, fails=True)
    state = native_reader.build(aside=True)
    assert not state.built and "no compiler" in (state.failure or "")
    assert (state.folder / native_reader.FAILED_MARKER).is_file()
    assert not builds[0]["folder"].exists()
    builds = _fake_compiler(monkeypatch)
    assert native_reader.build(force=True).built
    assert builds[0]["folder"] == state.folder and not builds[0]["lock_free"]


def test_an_unwritable_cache_is_a_reason_not_a_crash(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = empty_cache / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(native_reader.CACHE_VARIABLE, str(blocked))
    state = native_reader.build()
    assert not state.built and native_reader.CACHE_VARIABLE in (state.failure or "")
    with pytest.raises(native_reader.NativeReaderUnavailable, match=native_reader.CACHE_VARIABLE):
        native_reader.reader("native")
    started = _spawns(monkeypatch)
    assert native_reader.reader("auto") is None and started == []


def test_a_reader_that_fails_on_a_result_falls_back_to_python(recorded: Any, compiled: Any) -> None:
    """A compiled reader at odds with this torch (say, pybind's internals) must not cost the profile."""

    class Broken:
        def __getattr__(self, name: str) -> Any:
            def fail(*args: Any) -> Any:
                raise RuntimeError("Unable to cast Python instance to C++ type")

            return fail

    rows = ResultRows(recorded, Broken())  # type: ignore[arg-type]
    python = ResultRows(recorded, None)
    assert not rows.native
    np.testing.assert_array_equal(rows.column("start_ns", "int64"), python.column("start_ns", "int64"))


def test_a_result_nothing_else_holds_is_freed_on_a_thread_of_its_own(
    compiled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not compiled.can_release():
        pytest.skip("this torch's ProfilerResult has members release() does not know")
    release = result_rows._release
    done = threading.Event()
    seen: list[tuple[str, int, int]] = []

    def spy(reader: Any, result: Any) -> None:
        release(reader, result)
        seen.append(
            (threading.current_thread().name, len(result.events()), len(result.experimental_event_tree()))
        )
        done.set()

    monkeypatch.setattr(result_rows, "_release", spy)
    rows = ResultRows(_raw_result({})[0], compiled)
    gc.collect()  # torch's profile is gone (it is a cycle): these rows hold the result
    assert rows.count > 0
    assert rows.close() is True
    assert rows.result is None
    assert done.wait(30)
    assert seen == [("polyprof-result-release", 0, 0)]  # emptied by torch's destructor, without the GIL


def test_a_result_held_elsewhere_is_left_to_its_holders(compiled: Any) -> None:
    result, _ = _raw_result({})
    count = len(result.events())
    for reader in (compiled, None):
        assert ResultRows(result, reader).close() is False
        assert len(result.events()) == count  # untouched: the test still holds it
    wrappers = ResultRows(result, compiled)
    wrappers.events()
    kept = wrappers.take(np.arange(2))
    del result
    assert wrappers.close() is False  # a subset of the rows still reads it
    assert kept.column("start_ns", "int64").shape == (2,)


def _everything_read(result: Any, reader: Any) -> dict[str, Any]:
    rows = ResultRows(result, reader)
    read: dict[str, Any] = {f: rows.column(f, dtype).tolist() for f, dtype in _fields_to_compare()}
    for which in ("name", "overload_name"):
        if which == "name" or FEATURES.has_accessor(which):
            indices, table, _ = rows.names(which)
            read[which] = [table[i] if i >= 0 else None for i in np.asarray(indices).tolist()]
    for name in ("metadata_json", "activity_type", "extra_meta", "typed_metadata"):
        if FEATURES.has_accessor(name):
            column, table = rows.structured(name)
            read[name] = [table[i] if i >= 0 else None for i in column.tolist()]
    return read


def test_the_rows_read_alike_after_kinetos_trace_is_freed(compiled: Any) -> None:
    if not compiled.can_release():
        pytest.skip("this torch's ProfilerResult has members release_trace() does not know")
    result, _ = _raw_result(FLAG_SETS["every_flag"])
    before = _everything_read(result, compiled)
    assert ResultRows(result, compiled).release_kineto_trace() is True
    for thread in threading.enumerate():
        if thread.name == result_rows.TRACE_RELEASE:
            thread.join(30)
    assert _everything_read(result, compiled) == before
    assert _everything_read(result, None) == before


def test_the_freeing_threads_are_never_daemons(compiled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """They inherit their creator's flag otherwise, and the export and the bus run on daemon threads:
    a daemon freeing torch's result at interpreter exit would race torch's own teardown."""
    if not compiled.can_release():
        pytest.skip("this torch's ProfilerResult has members release() does not know")
    seen: list[tuple[str, bool]] = []
    for name in ("_release", "_release_trace"):
        monkeypatch.setattr(
            result_rows,
            name,
            lambda reader, result, _name=name: seen.append((_name, threading.current_thread().daemon)),
        )

    # Recorded here, not on the daemon: on torch 2.15 a profile recorded on a side thread made a
    # later all-threads profile (test_chrome_trace.py, in the same process) show one more thread.
    held = [ResultRows(_raw_result({})[0], compiled)]
    gc.collect()  # torch's profile is a cycle: these rows hold the result

    def from_a_daemon() -> None:
        rows = held.pop()
        assert rows.release_kineto_trace() is True
        assert rows.close() is True  # after waiting for the trace's thread

    creator = threading.Thread(target=from_a_daemon, daemon=True)
    creator.start()
    creator.join(60)
    assert sorted(seen) == [("_release", False), ("_release_trace", False)]


@pytest.mark.parametrize("flags", [{}, {"record_shapes": True}], ids=["default", "record_shapes"])
def test_kinetos_trace_is_freed_at_exit_only_when_nothing_will_read_it(
    flags: dict[str, Any], compiled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from polyprof import profile as polyprof_profile

    calls: list[int] = []
    release = ResultRows.release_kineto_trace
    monkeypatch.setattr(ResultRows, "release_kineto_trace", lambda rows: calls.append(1) or release(rows))
    with polyprof_profile(activities=[PA.CPU], **flags) as prof:
        _workload()
    reference = [(e.name, e.cpu_time_total) for e in prof.events()]
    assert reference
    # Kineto's args (record_shapes) and, before 2.13, its writer's flows come from that trace.
    wanted = not flags and FEATURES.has_accessor("flow_id")
    assert calls == ([1] if wanted else [])


def test_a_process_that_exits_right_after_exporting_frees_the_result_cleanly(tmp_path: Path) -> None:
    """The freeing thread is not a daemon: the interpreter waits for it before tearing torch down."""
    script = (
        "import torch\n"
        "from polyprof import profile, ProfilerActivity, result_rows\n"
        "from polyprof.runtime import torch_cpu\n"
        "torch_cpu.EAGER_DECODE_EVENTS = 0  # deferred: the export's decode frees the result\n"
        "release = result_rows._release\n"
        "def spy(reader, result):\n"
        "    print('freed on', __import__('threading').current_thread().name, flush=True)\n"
        "    release(reader, result)\n"
        "result_rows._release = spy\n"
        "a = torch.ones(1)\n"
        "with profile(activities=[ProfilerActivity.CPU]) as prof:\n"
        "    for _ in range(5000):\n"
        "        torch.add(a, a)\n"
        f"prof.export_chrome_trace({str(tmp_path / 'trace.json')!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    if HAS_COMPILER and native_reader.mode() != "python":
        assert f"freed on {result_rows.RESULT_RELEASE}" in done.stdout
    with open(tmp_path / "trace.json", encoding="utf-8") as trace:
        events = json.load(trace)["traceEvents"]
    assert sum(1 for e in events if e.get("name") == "aten::add") == 5000


def test_python_never_builds(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _spawns(monkeypatch)
    assert native_reader.reader("python") is None
    assert started == []
    assert not any(empty_cache.iterdir())


@pytest.mark.slow
@needs_compiler
def test_the_background_build_leaves_a_reader_the_next_profile_loads(empty_cache: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "polyprof.native.native_reader", "--background-build"],
        env={**os.environ, native_reader.CACHE_VARIABLE: str(empty_cache)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert native_reader.BuildState.of(native_reader.BuildSpec.for_installed_torch()).built
    module = native_reader.reader("auto")
    assert module is not None and "start_ns" in module.field_names()


LINUX_IDLE = hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_getscheduler")
#: A process's nice value and scheduling policy (-1 where the platform has no policies), as JSON.
PRIORITY_PROBE = """
import json, os
def priority():
    policy = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else -1
    return [os.getpriority(os.PRIO_PROCESS, 0), policy]
"""


def _priority_of(pid: int) -> tuple[int, int]:
    scheduler = os.sched_getscheduler(pid) if hasattr(os, "sched_getscheduler") else -1
    return os.getpriority(os.PRIO_PROCESS, pid), scheduler


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no process priorities here")
def test_the_background_build_runs_at_the_lowest_priority_and_its_compilers_inherit_it(
    empty_cache: Path,
) -> None:
    """The background entry point, with the build faked: it lowers itself before the build, and a
    process it starts (as torch's builder starts ninja and the compiler) inherits that."""
    compiler = PRIORITY_PROBE + "print(json.dumps(priority()))\n"
    script = PRIORITY_PROBE + (
        "import subprocess, sys\n"
        "from polyprof import native_reader\n"
        "seen = {}\n"
        "def fake_build(**_):\n"
        "    seen['self'] = priority()\n"
        f"    done = subprocess.run([sys.executable, '-c', {compiler!r}], capture_output=True, text=True)\n"
        "    seen['compiler'] = json.loads(done.stdout)\n"
        "    return native_reader.BuildState(native_reader.cache_root(), True, None)\n"
        "native_reader.build = fake_build\n"
        "seen['rc'] = native_reader._background_main()\n"
        "print(json.dumps(seen))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, native_reader.CACHE_VARIABLE: str(empty_cache)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["rc"] == 0
    expected = [native_reader.BUILD_NICE, os.SCHED_IDLE if LINUX_IDLE else -1]
    assert seen["self"] == expected and seen["compiler"] == expected, seen
    assert not any(empty_cache.iterdir())  # the build was faked: nothing compiled


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no process priorities here")
def test_the_spawned_build_is_lowered_at_once_by_the_profiled_process(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before its interpreter has started, the build process is at the lowest priority: the
    profiled program lowers it right after spawning it (it lowers itself again)."""
    spawned: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def sleeper(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        spawned.append(real_popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs))
        return spawned[-1]

    monkeypatch.setattr(native_reader.subprocess, "Popen", sleeper)
    monkeypatch.setattr(native_reader, "_background_running", set())
    mine = _priority_of(0)
    try:
        assert native_reader._start_background_build(native_reader.BuildSpec.for_installed_torch())
        (process,) = spawned
        assert _priority_of(process.pid) == (
            native_reader.BUILD_NICE,
            os.SCHED_IDLE if LINUX_IDLE else -1,
        )
    finally:
        for process in spawned:
            process.kill()
            process.wait()
    assert _priority_of(0) == mine  # the profiled program's own priority is left alone


def test_lowest_priority_is_best_effort(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> None:
        raise PermissionError("not allowed")

    monkeypatch.setattr(native_reader.os, "setpriority", refuse)
    monkeypatch.setattr(native_reader.os, "sched_setscheduler", refuse, raising=False)
    assert native_reader.lowest_priority(-1) == []


@pytest.fixture
def unannounced(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(native_reader, "_background_running", set())
    monkeypatch.setattr(native_reader, "_announced", set())
    return empty_cache


def test_a_started_build_is_announced_once_with_where_cost_and_how_to_avoid_it(
    unannounced: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _spawns(monkeypatch)
    with pytest.warns(native_reader.KinetoReaderBuildWarning) as caught:
        native_reader.build_in_background("auto")
        native_reader.build_in_background("auto")
        assert native_reader.reader("auto") is None
    assert len(started) == 1 and len(caught) == 1
    message = str(caught[0].message)
    folder = native_reader.BuildSpec.for_installed_torch().folder()
    assert "\n" not in message and str(folder) in message and native_reader.BUILD_COST in message
    assert "lowest CPU priority" in message and "pure-Python reader" in message
    assert "'polyprof kineto-reader build'" in message and "POLYPROF_KINETO_READER=python" in message
    assert caught[0].filename == __file__  # at the caller's line


def test_a_build_the_decode_started_is_announced_by_the_next_stop(
    unannounced: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode (on the bus thread) may ask for the reader before the stop's own call: the build
    starts once, and the user's thread announces it."""
    started = _spawns(monkeypatch)
    assert native_reader.reader("auto") is None
    with pytest.warns(native_reader.KinetoReaderBuildWarning):
        native_reader.build_in_background("auto")
    assert len(started) == 1


@pytest.mark.parametrize("requested", ["python", "native"])
def test_only_auto_builds_in_the_background(
    unannounced: Path, monkeypatch: pytest.MonkeyPatch, requested: str, recwarn: pytest.WarningsRecorder
) -> None:
    started = _spawns(monkeypatch)
    native_reader.build_in_background(requested)
    assert started == [] and not recwarn.list


def test_nothing_is_announced_for_a_build_that_did_not_start(
    unannounced: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    def no_fork(*_: Any, **__: Any) -> None:
        raise OSError("fork: out of memory")

    monkeypatch.setattr(native_reader.subprocess, "Popen", no_fork)
    native_reader.build_in_background("auto")
    native_reader.build_in_background("auto")
    assert not recwarn.list  # logged (kineto_reader_build_not_started), not announced


def test_an_announcement_made_an_error_does_not_cost_the_profile(
    unannounced: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warnings

    import polyprof

    started = _spawns(monkeypatch)
    monkeypatch.setenv(native_reader.MODE_VARIABLE, "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error", native_reader.KinetoReaderBuildWarning)
        with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU]) as prof:
            torch.ones(4).add_(1)
    assert "aten::add_" in prof.key_averages().table() and len(started) == 1


def test_two_profiles_on_an_empty_cache_announce_the_build_once_on_stderr(empty_cache: Path) -> None:
    """As a user's script meets it: two profiles, the build (faked: no compiler runs) started and
    announced by the first; one warning line on stderr, nothing on stdout."""
    script = (
        "import subprocess, torch, polyprof\n"
        "from polyprof import native_reader\n"
        "started = []\n"
        "class FakePopen:\n"
        "    pid = -1\n"
        "    def __init__(self, args, **kwargs):\n"
        "        started.append(args)\n"
        "native_reader.subprocess.Popen = FakePopen\n"
        "for _ in range(2):\n"
        "    with polyprof.profile(activities=[polyprof.ProfilerActivity.CPU]) as prof:\n"
        "        torch.ones(4).add_(1)\n"
        "    assert 'aten::add_' in prof.key_averages().table()\n"
        "assert len(started) == 1, started\n"
    )
    env = {
        **os.environ,
        native_reader.CACHE_VARIABLE: str(empty_cache),
        native_reader.MODE_VARIABLE: "auto",
    }
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""
    announced = [line for line in done.stderr.splitlines() if "KinetoReaderBuildWarning" in line]
    assert len(announced) == 1, done.stderr
    assert str(native_reader.BuildSpec.for_installed_torch().folder()) in announced[0]
    assert "polyprof kineto-reader build" in announced[0]


def test_the_cli_reports_the_reader(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from polyprof.cli import main

    monkeypatch.setenv(native_reader.MODE_VARIABLE, "python")
    assert main(["kineto-reader"]) == 0
    out = capsys.readouterr().out
    assert "POLYPROF_KINETO_READER=python" in out and "cache" in out


def test_a_built_module_that_does_not_load_is_tried_once_by_the_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attempts: list[Path] = []

    def broken(folder: Path) -> Any:
        attempts.append(folder)
        raise ImportError("undefined symbol: _ZN5torch8autograd8profiler")

    monkeypatch.setenv(native_reader.MODE_VARIABLE, "auto")
    monkeypatch.setattr(native_reader, "_loaded", {})
    monkeypatch.setattr(native_reader, "_not_loadable", set())
    monkeypatch.setattr(native_reader, "_load", broken)
    monkeypatch.setattr(
        native_reader.BuildState, "of", classmethod(lambda cls, spec: cls(spec.folder(), True, None))
    )
    assert native_reader.built_module() is None
    assert native_reader.built_module() is None
    assert len(attempts) == 1
