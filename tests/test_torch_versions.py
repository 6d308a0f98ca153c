"""The torch tracer on whichever supported torch is installed: torch is the oracle.

These run unchanged on every torch from 2.6 to 2.15 (CI runs them on 2.6,
2.13 and 2.15): each asks the installed torch what it offers, as the tracer
does, and compares polyprof with that torch's own profiler.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polyprof.analysis.tree import EventTree
from polyprof.base import torch_support
from polyprof.base.activity import ProfilerActivity as PA
from polyprof.base.config import ProfileConfig
from polyprof.base.events import EventBatch, EventKind, concat
from polyprof.base.trace import Trace
from polyprof.runtime.result_rows import ResultRows

torch = pytest.importorskip("torch")
from torch._C._profiler import _ExperimentalConfig  # noqa: E402
from torch.profiler import profile as torch_profile  # noqa: E402

import polyprof  # noqa: E402
from polyprof.runtime import torch_cpu  # noqa: E402

FEATURES = torch_support.installed()


# ------------------------------------------------------------ supported range


@pytest.mark.parametrize(
    ("version", "supported"),
    [("2.5.1", False), ("2.6.0", True), ("2.10.0+cu128", True), ("2.15.0", True), ("2.16.0a0", False)],
)
def test_torch_outside_the_range_is_one_clear_reason(monkeypatch, version: str, supported: bool) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    fake = torch_support.TorchFeatures(
        version_text=version,
        version=torch_support.parse_version(version),
        event_accessors=FEATURES.event_accessors,
        experimental_fields=FEATURES.experimental_fields,
        result_methods=FEATURES.result_methods,
    )
    monkeypatch.setattr(torch_support, "installed", lambda: fake)
    reason = torch_cpu.torch_unavailable_reason()
    if supported:
        assert reason is None
        return
    assert reason == f"torch {version} is not supported: polyprof supports torch 2.6 to 2.15"
    caps = torch_cpu.polyprof_capabilities()
    assert caps.unavailable_reason == reason


def test_installed_torch_is_supported_and_readable() -> None:
    assert torch_cpu.torch_unavailable_reason() is None
    assert FEATURES.supported
    assert torch_support.REQUIRED_EVENT_ACCESSORS <= FEATURES.event_accessors
    assert "verbose" in FEATURES.experimental_fields


def test_experimental_flags_are_read_back_on_this_torch() -> None:
    readable = [f for f in torch_support.READ_BACK_FLAGS if f in FEATURES.experimental_fields]
    assert "verbose" in readable
    assert torch_support.experimental_flags(_ExperimentalConfig()) == dict.fromkeys(
        torch_support.READ_BACK_FLAGS, False
    )
    for flag in readable:
        flags = torch_support.experimental_flags(_ExperimentalConfig(**{flag: True}))
        assert flags == {f: f == flag for f in torch_support.READ_BACK_FLAGS}, flag


def test_a_flag_this_torch_lacks_is_a_clear_error(monkeypatch) -> None:
    lacking = attrs_evolve(
        FEATURES, experimental_fields=FEATURES.experimental_fields - {"profile_all_threads"}
    )
    monkeypatch.setattr(torch_support, "installed", lambda: lacking)
    with pytest.raises(ValueError, match="has no _ExperimentalConfig option profile_all_threads"):
        torch_support.make_experimental_config(verbose=False, profile_all_threads=True)
    # Off, the missing flag is simply left out.
    assert torch_support.make_experimental_config(verbose=True, profile_all_threads=False) is not None


def attrs_evolve(features: Any, **changes: Any) -> Any:
    import attrs

    return attrs.evolve(features, **changes)


# ------------------------------------------------------- differential checks


def _names(prof: Any) -> Counter:
    return Counter(e.name for e in prof.events())


def test_ops_agree_with_torch_on_this_version() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    model(x).sum().backward()
    kwargs = {"record_shapes": True, "profile_memory": True, "with_flops": True}
    with torch_profile(**kwargs) as theirs:
        model(x).sum().backward()
    with polyprof.profile(**kwargs) as ours:
        model(x).sum().backward()
    ours_names, their_names = _names(ours), _names(theirs)
    if not FEATURES.at_least(2, 11):
        # Two runs: before 2.11 torch rounds op windows through float µs, so whether a record at an
        # op's edge becomes its own [memory] row varies by run (test_results compares them on one).
        del ours_names["[memory]"], their_names["[memory]"]
    assert ours_names == their_names


def test_profiler_flag_is_set_as_torch_sets_it() -> None:
    from torch.autograd import profiler as autograd_profiler

    assert not autograd_profiler._is_profiler_enabled
    with polyprof.profile():
        assert autograd_profiler._is_profiler_enabled
    assert not autograd_profiler._is_profiler_enabled


@pytest.mark.slow
def test_ranges_torch_emits_only_under_its_profiler_flag() -> None:
    """torch.compile's wrappers record ranges only when torch's profiler flag is set."""

    def fn(x: Any) -> Any:
        return (x.sin() + 1).cos()

    compiled = torch.compile(fn, backend="aot_eager")
    x = torch.randn(8, requires_grad=True)
    compiled(x).sum().backward()  # compile outside the profiles

    def ranges(prof: Any) -> set[str]:
        return {e.name for e in prof.events() if not e.name.startswith("aten::")}

    with torch_profile() as theirs:
        compiled(x).sum().backward()
    with polyprof.profile() as ours:
        compiled(x).sum().backward()
    assert ranges(ours) == ranges(theirs)
    assert any("Compiled" in name for name in ranges(ours))


def _user_frames(prof: Any) -> Counter:
    """python_function events of the user's code and modules (not of either profiler's machinery)."""
    return Counter(
        re.sub(r"\(\d+\)", "(N)", e.name)  # the two profiles are entered from different lines
        for e in prof.events()
        if e.name.startswith("nn.Module:") or "test_torch_versions.py" in e.name or "/nn/modules/" in e.name
    )


def test_with_stack_keeps_the_users_python_functions() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    def step() -> None:
        model(torch.ones(2, 4)).sum()

    step()
    kwargs = {"with_stack": True, "experimental_config": _ExperimentalConfig(verbose=True)}
    with torch_profile(**kwargs) as theirs:
        step()
    with polyprof.profile(**kwargs) as ours:
        step()
    theirs_frames, ours_frames = _user_frames(theirs), _user_frames(ours)
    assert ours_frames == theirs_frames
    if FEATURES.has_accessor("is_python_function"):
        # torch puts python_function events in events() from the release that can tell them apart.
        assert any(name.startswith("nn.Module: Sequential") for name in ours_frames)
    else:
        assert not ours_frames  # older torch: python functions only reach the trace


def test_no_bus_frames_among_the_users_python_functions() -> None:
    with polyprof.profile(with_stack=True, experimental_config=_ExperimentalConfig(verbose=True)) as ours:
        torch.ones(3).add(1)
    assert not [e.name for e in ours.events() if "_run_bus_loop" in e.name or "_eventloop.py" in e.name]


# --------------------------------------------------------------- trace_only


@pytest.mark.skipif("trace_only" not in FEATURES.experimental_fields, reason="this torch has no trace_only")
def test_trace_only_exports_the_ops_and_refuses_events(tmp_path) -> None:
    import json

    config = _ExperimentalConfig(trace_only=True)
    with torch_profile(experimental_config=config) as theirs:
        torch.ones(3).add(1)
    with polyprof.profile(experimental_config=_ExperimentalConfig(trace_only=True)) as ours:
        torch.ones(3).add(1)
    with pytest.raises(RuntimeError) as torch_error:
        theirs.events()
    with pytest.raises(RuntimeError) as our_error:
        ours.events()
    assert str(our_error.value) == str(torch_error.value)
    with pytest.raises(RuntimeError, match="trace_only=True"):
        ours.key_averages()
    path = tmp_path / "trace.json"
    ours.export_chrome_trace(str(path))
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert "aten::add" in names


# ------------------------------------------------ undecodable bytes from torch


class _FakeEvent:
    def __init__(self, name: str, start: int, stack_ok: bool = True) -> None:
        self._name, self._start, self._stack_ok = name, start, stack_ok

    def name(self) -> str:
        return self._name

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._start + 10

    def start_thread_id(self) -> int:
        return 1

    end_thread_id = start_thread_id

    def is_async(self) -> bool:
        return False

    def is_user_annotation(self) -> bool:
        return False

    def is_hidden_event(self) -> bool:
        return False

    def is_python_function(self) -> bool:
        return False

    def stack(self) -> list[str]:
        if not self._stack_ok:
            raise UnicodeDecodeError("utf-8", b"\xe8", 0, 1, "invalid continuation byte")
        return ["file.py(1): f"]

    def sequence_nr(self) -> int:
        return -1

    def fwd_thread_id(self) -> int:
        return 0

    def scope(self) -> int:
        return 0


class _FakeResult:
    def __init__(self, events: list[_FakeEvent], trace_events: list[dict] | None = None) -> None:
        self._events = events
        self._trace_events = trace_events or []

    def events(self) -> list[_FakeEvent]:
        return self._events

    def trace_start_ns(self) -> int:
        return 100

    def save(self, path: str) -> None:
        """torch's writer: the trace of the result (here only what the test gives)."""
        Path(path).write_text(json.dumps({"baseTimeNanoseconds": 0, "traceEvents": self._trace_events}))


def test_an_undecodable_stack_is_replaced_and_noted_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fake has only what the decode at exit reads: its deferred columns must stay deferred
    monkeypatch.setattr(torch_cpu, "EAGER_DECODE_EVENTS", 0)
    result = _FakeResult([_FakeEvent("aten::add", 100), _FakeEvent("aten::mul", 120, stack_ok=False)])
    config = ProfileConfig(activities={PA.CPU}, with_stack=True)
    batch, facts = torch_cpu.decode_result(result, config, pid=1)
    assert batch.values("name") == ["aten::add", "aten::mul"]
    assert batch.values("stack") == [("file.py(1): f",), (torch_cpu.UNDECODABLE_FRAME,)]
    assert len(facts["notes"]) == 1 and "1 Python stack(s)" in facts["notes"][0]


def _python_frame(
    name: str, ts_us: float, py_id: int, parent: int | None, *, tid: int = 7, pid: int = 5
) -> dict:
    return {
        "ph": "X",
        "cat": "python_function",
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts_us,
        "dur": 1.5,
        "args": {"Python parent id": parent, "Python id": py_id, "Ev Idx": 10 + py_id},
    }


def test_python_functions_only_torchs_writer_has_become_trace_only_rows() -> None:
    """torch < 2.12 writes its Python tracer's frames only to its trace: they come back as trace-only
    rows, pid/tid as torch wrote them, without polyprof's own bus-thread call tree."""
    trace_events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 5, "tid": 7, "ts": 0.1, "dur": 0.01},
        _python_frame("train.py(3): <module>", 0.05, 1, None),
        _python_frame("train.py(9): step", 0.06, 2, 1),
        # an untracked thread's frame: torch writes pid and tid 0 and an unset thread as 2**64 - 1
        _python_frame("tqdm/_monitor.py(60): run", 0.07, 3, None, tid=0, pid=0),
        _python_frame("polyprof/runtime/bus.py(431): _run_bus_loop", 0.08, 4, None),
        _python_frame("polyprof/runtime/bus.py(80): _pull", 0.09, 5, 4),
    ]
    result = _FakeResult([_FakeEvent("aten::add", 100)], trace_events)
    saved = torch_cpu.SavedKinetoTrace.read(result)
    assert saved is not None
    batch = saved.python_function_batch()
    assert batch.values("name") == ["train.py(3): <module>", "train.py(9): step", "tqdm/_monitor.py(60): run"]
    assert batch["trace_only"].all()
    assert (batch["kind"] == int(EventKind.PYTHON_FUNCTION)).all()
    assert batch["start_ns"].tolist() == [50, 60, 70] and batch["dur_ns"].tolist() == [1500] * 3
    assert batch["pid"].tolist() == [5, 5, 0] and batch["tid"].tolist() == [7, 7, 0]
    assert batch["python_parent_id"].tolist() == [-1, 1, -1]
    # Structured args (polyprof.base.kineto_format): the exporter alone writes them as JSON.
    assert dict(batch.values("args")[1]) == {"Python parent id": 1, "Python id": 2, "Ev Idx": 12}


def test_trace_only_rows_stay_out_of_the_tree_and_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_cpu, "EAGER_DECODE_EVENTS", 0)  # the fake has no deferred accessors
    config = ProfileConfig(activities={PA.CPU}, with_stack=True)
    batch, _ = torch_cpu.decode_result(_FakeResult([_FakeEvent("aten::add", 100)]), config, pid=1)
    python = EventBatch.build(
        "test",
        {
            "kind": np.array([int(EventKind.PYTHON_FUNCTION)], dtype=np.int8),
            "name": np.array([0], dtype=np.int32),
            "start_ns": np.array([90], dtype=np.int64),
            "dur_ns": np.array([100], dtype=np.int64),
            "trace_only": np.array([True]),
        },
        {"name": ("train.py(3): <module>",)},
    )
    trace = Trace(events=concat([batch, python]), config=config, start_ns=50, end_ns=500, pid=1, hostname="h")
    tree = EventTree.from_trace(trace, use_device=None)
    assert [trace.events.values("name")[i] for i in tree.source.tolist()] == ["aten::add"]


def test_frames_of_a_thread_torch_never_saw_run_are_placed_as_torchs(tmp_path: Path) -> None:
    """A thread blocked all along has Python frames but no thread id torch knows.

    torch places them on tid 0 (pid 0 on 2.6 and 2.7), names that lane or not by release, and
    gives their events thread 2**64 - 1. torch also chains such threads' stacks into one; in
    polyprof's run its bus thread is one of them, and the user's frames must survive its removal.
    """
    import os
    import threading

    stop = threading.Event()
    blocked = threading.Thread(target=stop.wait, name="blocked-all-along", daemon=True)
    blocked.start()
    docs: dict[str, dict] = {}
    attrs: dict[str, Counter] = {}
    try:
        for name, profile_cls, activity in (
            ("torch", torch_profile, torch.profiler.ProfilerActivity.CPU),
            ("ours", polyprof.profile, PA.CPU),
        ):
            with profile_cls(activities=[activity], with_stack=True) as prof:
                torch.ones(4).add(1)
            path = tmp_path / f"{name}.json"
            prof.export_chrome_trace(str(path))
            # torch 2.6 to 2.13 may copy frame names from freed memory, invalid JSON included
            docs[name] = json.loads(path.read_bytes().decode(errors="replace"), strict=False)
            attrs[name] = Counter(
                (e.name, e.thread, e.device_index, e.device_resource_id)
                for e in prof.events()
                if e.name.startswith("threading.py")
            )
    finally:
        stop.set()
        blocked.join()

    def unseen_thread_frames(doc: dict) -> Counter:
        return Counter(
            (e["name"], e["pid"], e["tid"])
            for e in doc["traceEvents"]
            if e.get("cat") == "python_function" and e["tid"] == 0
        )

    def unseen_lane_metadata(doc: dict) -> set:
        # other lanes may differ: torch also names live threads that recorded nothing
        return {
            (e["name"], e["pid"], e["tid"])
            for e in doc["traceEvents"]
            if e.get("ph") == "M" and (e["pid"] == 0 or (e["tid"] == 0 and e["name"].startswith("thread")))
        }

    theirs = unseen_thread_frames(docs["torch"])
    # the lane: pid 0 on torch 2.6 and 2.7, the process from 2.8 on
    # the blocked thread's frame: its line in threading.py differs between Pythons
    waits = {pid for name, pid, _ in theirs if re.fullmatch(r"threading\.py\(\d+\): wait", name)}
    assert waits in ({0}, {os.getpid()})
    assert unseen_thread_frames(docs["ours"]) == theirs
    assert unseen_lane_metadata(docs["ours"]) == unseen_lane_metadata(docs["torch"])
    assert attrs["ours"] == attrs["torch"]
    ours_roots = [
        e
        for e in docs["ours"]["traceEvents"]
        if e.get("cat") == "python_function" and e["tid"] == 0 and e["name"].endswith(": _bootstrap")
    ]
    # a root frame: "Python parent id" null (2.15+: no such key), not the id of a frame left out
    assert ours_roots and any(e["args"].get("Python parent id") is None for e in ours_roots)


# ----------------------------------------------- a torch profiler inside ours


def test_a_torch_profiler_inside_ours_warns_and_both_keep_their_ops() -> None:
    x = torch.ones(4)
    with pytest.warns(torch_cpu.NestedProfilerWarning, match="started inside a polyprof profile"):
        with polyprof.profile() as ours:
            for _ in range(3):
                x.add(1)
            with torch_profile() as inner:
                x.mul(2)
            for _ in range(4):
                x.sub(1)
    ours_ops = Counter(e.name for e in ours.events())
    assert ours_ops["aten::add"] == 3 and ours_ops["aten::sub"] == 4
    assert ours_ops["aten::mul"] == 0
    assert Counter(e.name for e in inner.events())["aten::mul"] == 1
    assert any("torch profiler ran inside" in note for note in ours.trace.notes)
    # torch's functions are back in place once the recording ends.
    from torch.autograd import profiler as autograd_profiler

    assert autograd_profiler._prepare_profiler is torch._C._autograd._prepare_profiler


def test_without_a_nested_profiler_nothing_is_noted() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_cpu.NestedProfilerWarning)
        with polyprof.profile() as ours:
            torch.ones(2).add(1)
    assert not any("torch profiler ran inside" in note for note in ours.trace.notes)


# ------------------------------------------------- what torch.profiler does first


@pytest.mark.slow
def test_inductor_is_loaded_before_recording_as_torch_does() -> None:
    """torch.profiler's prepare_trace imports Inductor before its collector starts (2.6-2.15).

    Left to the first profiled step, that import put over a million Python frames into a
    with_stack profile and ran torch's _disable_profiler out of memory.
    """
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from {module} import profile\n"
        "p = profile()\n"
        "p.__enter__()\n"
        "loaded = 'torch._inductor' in sys.modules\n"
        "p.__exit__(None, None, None)\n"
        "print(loaded)\n"
    )
    for module in ("torch.profiler", "polyprof"):
        out = subprocess.run(
            [sys.executable, "-c", code.format(module=module)], capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-1] == "True", module


class _BadArgsActivity:
    def name(self) -> str:
        return "aten::add"

    def timestamp(self) -> int:
        return 1_000_000

    def metadata_json(self) -> str:
        raise UnicodeDecodeError("utf-8", b"\x8f", 0, 1, "invalid start byte")


class _ResultWithBadArgs(_FakeResult):
    def trace_activities(self) -> list[_BadArgsActivity]:
        return [_BadArgsActivity()]

    def save(self, path: str) -> None:
        event = (
            b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1000.000, '
            b'"dur": 0.010, "args": {"External id": 1, "Call stack": "a.py(1): \x8f"}}'
        )
        with open(path, "wb") as file:
            file.write(b'{"baseTimeNanoseconds": 0, "traceEvents": [' + event + b"]}")


def test_undecodable_args_are_read_from_torchs_writer_with_bytes_replaced() -> None:
    if "trace_activities" not in FEATURES.result_methods:
        pytest.skip("this torch reads args from its writer anyway (no trace_activities)")
    events = [_FakeEvent("aten::add", 1_000_000)]
    with pytest.warns(RuntimeWarning, match="not valid UTF-8"):
        column, table = torch_cpu._trace_args_column(ResultRows(_ResultWithBadArgs(events), None))
    assert len(column) == 1 and column[0] >= 0
    args = table[column[0]]
    assert "\ufffd" in args["Call stack"]


def test_the_torch_build_is_read_from_its_files_as_torch_reports_it() -> None:
    """Device plugins choose their mode by it without importing torch (a fresh process here)."""
    import subprocess
    import sys

    code = (
        "import sys, json; from polyprof import torch_support; b = torch_support.installed_build(); "
        "print(json.dumps([b.version, b.cuda, b.xpu, 'torch' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    version, cuda, xpu, imported = json.loads(out.strip().splitlines()[-1])
    assert not imported
    assert (version, cuda, xpu) == (
        str(torch.__version__),
        torch.version.cuda,
        getattr(torch.version, "xpu", None),
    )
