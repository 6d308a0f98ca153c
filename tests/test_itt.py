"""ITT (Intel VTune) support: polyprof.itt, polyprof.emit_itt and the ``itt`` exporter.

Unit tests use fakes of torch's ITT binding and of ittapi. The end-to-end
tests compile a tiny ITT collector (tests/itt_collector/collector.c) and run
workloads in a subprocess with ``INTEL_LIBITTNOTIFY64`` pointing at it, because
ITT reads that variable once, at the first ITT call of a process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import polyprof
import polyprof.itt as pitt
from hypothesis_budget import examples
from polyprof.base.errors import PluginUnavailable
from polyprof.base.events import EventKind
from polyprof.testing import make_event_batch, make_plugin_manager_for_tests, make_trace
from polyprof_builtins import itt_export
from polyprof_builtins.itt_export import END, IttExporter, replay_plan

COLLECTOR_SOURCE = Path(__file__).parent / "itt_collector" / "collector.c"
REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- polyprof.itt


class FakeIttBinding:
    """Stands in for torch._C._itt and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def is_available(self) -> bool:
        return True

    def rangePush(self, msg: str) -> int:
        self.calls.append(("push", msg))
        return 7

    def rangePop(self) -> int:
        self.calls.append(("pop",))
        return 6

    def mark(self, msg: str) -> None:
        self.calls.append(("mark", msg))


@pytest.fixture
def fake_binding(monkeypatch: pytest.MonkeyPatch) -> FakeIttBinding:
    fake = FakeIttBinding()
    monkeypatch.setattr(torch._C, "_itt", fake)
    return fake


def test_is_available_matches_torch() -> None:
    assert pitt.is_available() is torch.profiler.itt.is_available()


def test_calls_delegate_to_torch_binding(fake_binding: FakeIttBinding) -> None:
    assert pitt.range_push("a") == 7
    assert pitt.range_pop() == 6
    assert pitt.mark("m") is None
    assert fake_binding.calls == [("push", "a"), ("pop",), ("mark", "m")]


def test_range_formats_and_pops_on_error(fake_binding: FakeIttBinding) -> None:
    with pitt.range("iteration_{}_{name}", 3, name="x"):
        pitt.mark("inside")
    with pytest.raises(KeyError), pitt.range("failing"):
        raise KeyError("boom")
    assert fake_binding.calls == [
        ("push", "iteration_3_x"),
        ("mark", "inside"),
        ("pop",),
        ("push", "failing"),
        ("pop",),
    ]


def test_range_works_as_decorator(fake_binding: FakeIttBinding) -> None:
    @pitt.range("decorated")
    def work() -> int:
        return 5

    assert work() == 5
    assert fake_binding.calls == [("push", "decorated"), ("pop",)]


def test_without_torch_itt_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch._C, "_itt")
    assert pitt.is_available() is False
    for call in (lambda: pitt.range_push("x"), pitt.range_pop, lambda: pitt.mark("x")):
        with pytest.raises(RuntimeError, match=r"ITT functions not installed.*lacks"):
            call()
    with pytest.raises(RuntimeError, match="ITT functions not installed"), pitt.range("x"):
        pass
    with pytest.raises(RuntimeError, match="ITT functions not installed"), pitt.emit_itt():
        pass
    assert not torch.autograd._profiler_enabled()


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, polyprof.itt, polyprof_builtins.itt_export; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert polyprof.itt.emit_itt(enabled=False).__enter__() is None"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------- emit_itt


def test_emit_itt_enables_torch_itt_profiler() -> None:
    from torch._C._profiler import ActiveProfilerType

    ctx = pitt.emit_itt()
    with ctx as entered:
        assert entered is ctx
        assert torch.autograd._profiler_enabled()
        assert torch._C._autograd._profiler_type() == ActiveProfilerType.ITT
        assert torch.autograd.profiler._is_profiler_enabled
        torch.ones(2) + 1
    assert not torch.autograd._profiler_enabled()
    assert not torch.autograd.profiler._is_profiler_enabled
    with ctx:  # reusable once exited
        assert torch.autograd._profiler_enabled()
    assert not torch.autograd._profiler_enabled()


def test_emit_itt_disabled_is_a_no_op() -> None:
    with pitt.emit_itt(enabled=False) as entered:
        assert entered is None
        assert not torch.autograd._profiler_enabled()


def test_emit_itt_is_not_reentrant() -> None:
    ctx = pitt.emit_itt(record_shapes=True)
    with ctx:
        with pytest.raises(RuntimeError, match=r"^ITT annotation context manager is not reentrant$"), ctx:
            pass
        assert torch.autograd._profiler_enabled()
        with pytest.raises(RuntimeError, match="Profiler is already enabled on this thread"), pitt.emit_itt():
            pass
    assert not torch.autograd._profiler_enabled()


def test_emit_itt_inside_polyprof_profile_is_an_error() -> None:
    with polyprof.profile() as prof:
        with (
            pytest.raises(
                RuntimeError, match=r"Profiler is already enabled on this thread.*polyprof profile"
            ),
            pitt.emit_itt(),
        ):
            pass
        torch.ones(3)
    assert not torch.autograd._profiler_enabled()
    assert "aten::ones" in {e.key for e in prof.key_averages()}
    with pitt.emit_itt():  # the failed attempt left nothing behind
        pass


def test_emit_itt_inside_torch_profile_is_an_error() -> None:
    with (
        torch.profiler.profile(),
        pytest.raises(RuntimeError, match=r"Profiler is already enabled on this thread.*ProfilerType"),
        pitt.emit_itt(),
    ):
        pass
    with pitt.emit_itt():
        pass


def test_polyprof_profile_inside_emit_itt_is_an_error() -> None:
    with pitt.emit_itt():
        with pytest.raises(RuntimeError, match="already"), polyprof.profile():
            pass
        assert torch.autograd._profiler_enabled()
    assert not torch.autograd._profiler_enabled()
    with polyprof.profile() as prof:
        torch.zeros(2)
    assert "aten::zeros" in {e.key for e in prof.key_averages()}


def test_emit_itt_refuses_a_polyprof_profile_on_another_thread() -> None:
    started, release = threading.Event(), threading.Event()

    def record() -> None:
        with polyprof.profile():
            started.set()
            release.wait(30)

    worker = threading.Thread(target=record)
    worker.start()
    try:
        assert started.wait(30)
        with pytest.raises(RuntimeError, match="polyprof profile is already recording"), pitt.emit_itt():
            pass
        assert not torch.autograd._profiler_enabled()
    finally:
        release.set()
        worker.join(30)


# ------------------------------------------------------------- replay plan


def _event(name: str, start: int, dur: int, tid: int = 1, kind: EventKind = EventKind.CPU_OP, **kw) -> dict:
    return {"name": name, "start_ns": start, "dur_ns": dur, "tid": tid, "kind": kind, **kw}


def _nested_calls(plan) -> list[tuple[str, str | None]]:
    return [("E", None) if n == END else ("B", plan.name_table[n]) for n in plan.names.tolist()]


def test_replay_plan_nests_per_thread_and_selects_ranges() -> None:
    events = [
        _event("aten::mm", 120, 30, tid=1),
        _event("step", 100, 100, tid=1, kind=EventKind.USER_ANNOTATION),
        _event("aten::add", 160, 10, tid=1),
        _event("[memory]", 130, 0, tid=1, kind=EventKind.MEMORY),
        _event("fn", 100, 5, tid=1, kind=EventKind.PYTHON_FUNCTION),
        _event("aten::add", 110, 5, tid=2),
        _event("async", 101, 5, tid=1, is_async=True),
        _event("kernel", 130, 5, tid=7, kind=EventKind.KERNEL),
    ]
    trace = make_trace(make_event_batch(events), start_ns=90)
    plans = replay_plan(trace)
    assert [p.tid for p in plans] == [1, 2]
    assert _nested_calls(plans[0]) == [
        ("B", "step"), ("B", "aten::mm"), ("E", None), ("B", "aten::add"), ("E", None), ("E", None)
    ]  # fmt: skip
    assert plans[0].offsets_ns.tolist() == [10, 30, 60, 70, 80, 110]
    assert _nested_calls(plans[1]) == [("B", "aten::add"), ("E", None)]
    assert [p.task_count for p in plans] == [3, 1]


def test_replay_plan_cuts_ranges_that_overlap_their_parent() -> None:
    trace = make_trace(make_event_batch([_event("outer", 0, 10), _event("inner", 5, 20)]))
    (plan,) = replay_plan(trace)
    assert _nested_calls(plan) == [("B", "outer"), ("B", "inner"), ("E", None), ("E", None)]
    assert plan.offsets_ns.tolist() == [0, 5, 10, 10]


def test_replay_plan_of_empty_trace() -> None:
    assert replay_plan(make_trace()) == []
    memory_only = make_trace(make_event_batch([_event("[memory]", 0, 0, kind=EventKind.MEMORY)]))
    assert replay_plan(memory_only) == []


intervals = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1_000), st.integers(0, 300), st.sampled_from("abcd")),
    max_size=40,
)


@settings(max_examples=examples(150), deadline=None)
@given(intervals)
def test_replay_plan_invariants(rows: list[tuple[int, int, int, str]]) -> None:
    """Any ranges: balanced nesting, every range begun once, in start order, times never go back."""
    events = [_event(name, start, dur, tid=tid) for tid, start, dur, name in rows]
    trace = make_trace(make_event_batch(events), start_ns=0)
    plans = replay_plan(trace)
    assert [p.tid for p in plans] == sorted({tid for tid, *_ in rows})
    for plan in plans:
        mine = sorted((s, -d, n) for t, s, d, n in rows if t == plan.tid)
        depth = 0
        for call in plan.names.tolist():
            depth += -1 if call == END else 1
            assert depth >= 0
        assert depth == 0
        begins = plan.names != END
        begun = list(zip(plan.offsets_ns[begins].tolist(), [plan.name_table[n] for n in plan.names[begins]]))
        assert [s for s, _, _ in mine] == [s for s, _ in begun]  # in start order
        assert sorted((s, n) for s, _, n in mine) == sorted(begun)  # each range once
        assert np.all(np.diff(plan.offsets_ns) >= 0)
        assert plan.task_count == len(mine)


@settings(max_examples=examples(80), deadline=None)
@given(st.data())
def test_replay_plan_keeps_properly_nested_times(data: st.DataObject) -> None:
    """Ranges that nest (as torch records them) are replayed with their own begin and end times."""

    def tree(lo: int, hi: int, depth: int) -> list[tuple[int, int]]:
        out, cursor = [], lo
        for _ in range(data.draw(st.integers(0, 3 if depth < 3 else 0))):
            if cursor >= hi:
                break
            start = data.draw(st.integers(cursor, hi))
            end = data.draw(st.integers(start, hi))
            out.append((start, end))
            out.extend(tree(start, end, depth + 1))
            cursor = end + 1
        return out

    spans = tree(0, 10_000, 0)
    names = [f"r{i}" for i in range(len(spans))]
    events = [_event(n, s, e - s) for n, (s, e) in zip(names, spans, strict=True)]
    plans = replay_plan(make_trace(make_event_batch(events), start_ns=0))
    if not spans:
        assert plans == []
        return
    (plan,) = plans
    stack, seen = [], {}
    for offset, call in zip(plan.offsets_ns.tolist(), plan.names.tolist(), strict=True):
        if call == END:
            name, start = stack.pop()
            seen.setdefault(name, []).append((start, offset))
        else:
            stack.append((plan.name_table[call], offset))
    expected = {}
    for n, span in zip(names, spans, strict=True):
        expected.setdefault(n, []).append(span)
    assert seen == expected


# ---------------------------------------------------------------- exporter


class FakeIttapi:
    """Stands in for the ittapi module; records calls per thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[int, list[tuple[str, ...]]] = {}

    def _log(self, *call: str) -> None:
        with self.lock:
            self.calls.setdefault(threading.get_ident(), []).append(call)

    def domain(self, name: str) -> tuple[str, str]:
        return ("domain", name)

    def string_handle(self, text: str) -> tuple[str, str]:
        return ("handle", text)

    def thread_set_name(self, name: str) -> None:
        self._log("T", name)

    def task_begin(self, domain: tuple[str, str], handle: tuple[str, str]) -> None:
        assert handle[0] == "handle", "ittapi.task_begin needs a StringHandle"
        self._log("B", domain[1], handle[1])

    def task_end(self, domain: tuple[str, str]) -> None:
        self._log("E", domain[1])


@pytest.fixture
def fake_ittapi(monkeypatch: pytest.MonkeyPatch) -> FakeIttapi:
    fake = FakeIttapi()
    monkeypatch.setitem(sys.modules, "ittapi", fake)
    return fake


def _two_thread_trace():
    return make_trace(
        make_event_batch(
            [
                _event("step", 0, 100, tid=11, kind=EventKind.USER_ANNOTATION),
                _event("aten::mm", 10, 20, tid=11),
                _event("aten::relu", 5, 20, tid=22),
            ]
        ),
        start_ns=0,
    )


@pytest.mark.parametrize("pace", [False, True])
def test_exporter_replays_each_thread_and_writes_summary(
    fake_ittapi: FakeIttapi, tmp_path: Path, pace: bool
) -> None:
    pm = make_plugin_manager_for_tests(itt_export)
    exporter = pm.make_exporter(_two_thread_trace().config, "itt")
    assert isinstance(exporter, IttExporter)
    out = tmp_path / "run.itt.json"
    assert exporter.export(_two_thread_trace(), str(out), domain="mine", pace=pace) == str(out)
    per_thread = sorted(fake_ittapi.calls.values())
    assert per_thread == [
        [("T", "polyprof replay of thread 11"), ("B", "mine", "step"), ("B", "mine", "aten::mm"),
         ("E", "mine"), ("E", "mine")],
        [("T", "polyprof replay of thread 22"), ("B", "mine", "aten::relu"), ("E", "mine")],
    ]  # fmt: skip
    summary = json.loads(out.read_text())
    assert summary["domain"] == "mine" and summary["paced"] is pace and summary["tasks"] == 3
    assert summary["threads"] == [{"tid": 11, "tasks": 2}, {"tid": 22, "tasks": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["run.itt.json"]


def test_exporter_without_path_writes_nothing(fake_ittapi: FakeIttapi, tmp_path: Path) -> None:
    assert IttExporter().export(_two_thread_trace(), "") == ""
    assert sum(len(c) for c in fake_ittapi.calls.values()) == 8


def test_exporter_rejects_bad_options(fake_ittapi: FakeIttapi, tmp_path: Path) -> None:
    exporter = IttExporter()
    with pytest.raises(
        TypeError, match=r"unknown itt export options \['colour'\]; valid options: \['domain', 'pace'\]"
    ):
        exporter.export(_two_thread_trace(), str(tmp_path / "x"), colour=1)
    with pytest.raises(ValueError, match="domain must be a non-empty str"):
        exporter.export(_two_thread_trace(), str(tmp_path / "x"), domain="")
    with pytest.raises(TypeError, match="pace must be a bool"):
        exporter.export(_two_thread_trace(), str(tmp_path / "x"), pace="yes")
    assert not fake_ittapi.calls and not list(tmp_path.iterdir())


def test_exporter_reports_a_failing_replay(fake_ittapi: FakeIttapi, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(domain: object, handle: object) -> None:
        raise OSError("collector went away")

    monkeypatch.setattr(fake_ittapi, "task_begin", broken)
    with pytest.raises(OSError, match="collector went away"):
        IttExporter().export(_two_thread_trace(), "")


def test_plugin_unavailable_without_ittapi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ittapi", None)  # import ittapi -> ImportError
    pm = make_plugin_manager_for_tests(("itt_export", itt_export))
    info = pm.plugin_info("itt_export")
    assert info.status == "unavailable"
    assert "ittapi package is not installed" in info.reason and "polyprof[itt]" in info.reason
    with pytest.raises(Exception, match=r"itt.*unavailable.*ittapi"):
        pm.make_exporter(_two_thread_trace().config, "itt")
    with pytest.raises(PluginUnavailable, match="pip install 'polyprof\\[itt\\]'"):
        IttExporter().export(_two_thread_trace(), str(tmp_path / "x"))


def test_plugin_available_with_ittapi() -> None:
    pytest.importorskip("ittapi")
    pm = make_plugin_manager_for_tests(("itt_export", itt_export))
    info = pm.plugin_info("itt_export")
    assert info.status == "loaded"
    assert info.capabilities.exporters == ("itt",)


# ---------------------------------------------- end to end with a real collector


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc) to build the test ITT collector")
    out = tmp_path_factory.mktemp("itt_collector") / "libpolyprof_test_collector.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(COLLECTOR_SOURCE), "-lpthread"],
        check=True,
        timeout=60,
    )
    return out


def _run_with_collector(collector: Path, tmp_path: Path, code: str, *args: str) -> list[list[str]]:
    """Run ``code`` (or ``python args...`` when args are given) with the collector; return its log lines."""
    log = tmp_path / "itt.log"
    env = dict(
        os.environ,
        INTEL_LIBITTNOTIFY64=str(collector),
        INTEL_ITTNOTIFY_GROUPS="all",
        POLYPROF_ITT_LOG=str(log),
    )
    command = [sys.executable, *args] if args else [sys.executable, "-c", textwrap.dedent(code)]
    done = subprocess.run(
        command, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [line.split(" ", 3) for line in log.read_text().splitlines()] if log.exists() else []


def _tasks(lines: list[list[str]], domain: str) -> list[str]:
    """``B name`` / ``E`` for one domain, dropping thread ids."""
    return [f"B {f[3]}" if f[0] == "B" else "E" for f in lines if f[0] in "BE" and f[2] == domain]


@pytest.mark.slow
def test_itt_ranges_and_emit_itt_reach_collector(collector: Path, tmp_path: Path) -> None:
    lines = _run_with_collector(
        collector,
        tmp_path,
        """
        import torch, polyprof
        import polyprof.itt as itt
        assert itt.is_available()
        with itt.range("outer_{}", 1):
            itt.mark("tick")
            itt.range_push("manual")
            itt.range_pop()
        with polyprof.itt.emit_itt():
            with itt.range("iteration_{i}", i=0):
                torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        torch.ones(1)  # after emit_itt: no task
        """,
    )
    tasks = _tasks(lines, "PyTorch")
    assert tasks[:6] == ["B outer_1", "B tick", "E", "B manual", "E", "E"]
    rest = tasks[6:]
    assert rest[0] == "B iteration_0" and rest[-1] == "E"
    assert rest.count("B aten::ones") == 2 and rest.count("B aten::mm") == 1
    assert rest.count("E") == len(rest) // 2
    # ops nest inside the user range: the range ends last
    depth = 0
    for i, t in enumerate(rest):
        depth += -1 if t == "E" else 1
        assert depth > 0 or i == len(rest) - 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "emit, rng",
    [
        ("polyprof.itt.emit_itt", "polyprof.itt.range"),
        # The recipe's own spelling: the shims put polyprof's emit_itt behind torch's name.
        ("torch.autograd.profiler.emit_itt", "torch.profiler.itt.range"),
    ],
)
def test_seed_recipe_through_polyprof_run(collector: Path, tmp_path: Path, emit: str, rng: str) -> None:
    """The VTune recipe's sample under ``polyprof run``, with polyprof's names and unchanged."""
    (tmp_path / "sample.py").write_text(
        textwrap.dedent(
            """
            import torch
            import torch.nn as nn
            import polyprof, polyprof.itt

            class ITTSample(nn.Module):
              def __init__(self):
                super(ITTSample, self).__init__()
                self.conv = nn.Conv2d(3, 5, 3)
                self.linear = nn.Linear(5 * 14 * 14, 10)

              def forward(self, x):
                x = self.conv(x)
                x = x.view(x.shape[0], -1)
                x = self.linear(x)
                return x

            def main():
              m = ITTSample()
              x = torch.rand(2, 3, 16, 16)
              with EMIT():
                for i in range(3):
                  with RANGE(f'iteration_{i}'):
                    m(x)

            if __name__ == '__main__':
              main()
            """
        )
        .replace("EMIT", emit)
        .replace("RANGE", rng)
    )
    lines = _run_with_collector(collector, tmp_path, "", "-m", "polyprof", "run", "sample.py")
    tasks = _tasks(lines, "PyTorch")
    iterations = [t for t in tasks if t.startswith("B iteration_")]
    assert iterations == ["B iteration_0", "B iteration_1", "B iteration_2"]
    assert tasks.count("B aten::conv2d") == 3 and tasks.count("B aten::linear") == 3
    assert tasks.count("E") * 2 == len(tasks)


@pytest.mark.slow
def test_itt_exporter_replays_profile_into_collector(collector: Path, tmp_path: Path) -> None:
    pytest.importorskip("ittapi")
    lines = _run_with_collector(
        collector,
        tmp_path,
        """
        import json, torch, polyprof
        from polyprof.base.events import EventKind
        from polyprof_builtins import itt_export
        from polyprof.testing import make_event_batch, make_plugin_manager_for_tests, make_trace

        with polyprof.profile() as prof:
            with polyprof.record_function("step"):
                torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        recorded = prof._require_results().traces[-1]
        # A second, synthetic trace with two threads: each gets its own replay thread.
        synthetic = make_trace(make_event_batch([
            {"name": "left", "start_ns": 0, "dur_ns": 50, "tid": 101, "kind": EventKind.USER_ANNOTATION},
            {"name": "aten::add", "start_ns": 10, "dur_ns": 5, "tid": 101},
            {"name": "right", "start_ns": 5, "dur_ns": 50, "tid": 202},
        ]), start_ns=0)
        pm = make_plugin_manager_for_tests(itt_export)
        expected = {}
        for i, trace in enumerate((recorded, synthetic)):
            pm.make_exporter(trace.config, "itt").export(trace, f"summary{i}.itt.json")
            # the trace's own view of what should arrive, for the test to compare
            for p in itt_export.replay_plan(trace):
                expected[str(p.tid)] = ["E" if n == -1 else "B " + p.name_table[n] for n in p.names.tolist()]
        json.dump(expected, open("expected.json", "w"))
        """,
    )
    expected = json.loads((tmp_path / "expected.json").read_text())
    summary = json.loads((tmp_path / "summary0.itt.json").read_text())
    assert summary["collector"] == str(collector) and summary["domain"] == "polyprof"
    assert summary["tasks"] == sum(t != "E" for t in next(iter(expected.values())))
    names = {f[1]: " ".join(f[2:]) for f in lines if f[0] == "T"}  # replay thread id -> its name
    assert sorted(names.values()) == sorted(f"polyprof replay of thread {tid}" for tid in expected)
    for replay_tid, name in names.items():
        recorded_tid = name.rsplit(" ", 1)[1]
        mine = [f for f in lines if f[0] in "BE" and f[1] == replay_tid]
        assert all(f[2] == "polyprof" for f in mine)
        assert [f"B {f[3]}" if f[0] == "B" else "E" for f in mine] == expected[recorded_tid]
    assert len(expected) == 3  # the profiled main thread and the synthetic trace's two
    assert expected["101"] == ["B left", "B aten::add", "E", "E"] and expected["202"] == ["B right", "E"]
    everything = {t for ts in expected.values() for t in ts}
    assert {"B step", "B aten::mm", "B aten::ones"} <= everything
