"""polyprof.legacy.profile: the (IPEX) legacy profiler's API, with torch's legacy profiler as the oracle."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples

torch = pytest.importorskip("torch")
from torch.autograd import profiler_legacy  # noqa: E402

import polyprof  # noqa: E402
import polyprof.legacy  # noqa: E402
from polyprof import ProfilerActivity  # noqa: E402
from polyprof.analysis.averages import Aggregator  # noqa: E402
from polyprof.analysis.function_events import FunctionEventAvg  # noqa: E402
from polyprof.base.errors import ActivityUnavailableError, ProfilerDisabledError  # noqa: E402
from polyprof.base.events import DeviceType, EventKind  # noqa: E402
from polyprof.base.user_warnings import ActivityUnavailableWarning  # noqa: E402
from polyprof.testing import (  # noqa: E402
    ComponentPlugin,
    FakeTracer,
    make_event_batch,
    make_plugin_manager_for_tests,
)

legacy = polyprof.legacy


def workload() -> None:
    """Ops, a user range, an autograd pass and allocations freed outside every op."""
    x = torch.linspace(-1.0, 1.0, 257)
    with torch.autograd.profiler.record_function("blk"):
        torch.nonzero(x)
        torch.unique(x)
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        torch.nn.functional.linear(torch.ones(4, 8), torch.ones(3, 8))
    w = torch.ones(4, requires_grad=True)
    (w * 2).sum().backward()
    del x


def run_both(fn: Callable[[], None], **flags: bool) -> tuple:
    """``fn`` under torch's legacy profiler, then under polyprof's."""
    with profiler_legacy.profile(**flags) as theirs:
        fn()
    with legacy.profile(**flags) as ours:
        fn()
    return theirs, ours


def header(table: str) -> list[str]:
    """The rule, the column titles and the rule below them."""
    return table.splitlines()[:3]


def key_counts(averages) -> list[tuple[str, int]]:
    return [(avg.key, avg.count) for avg in averages]


def assert_nothing_running() -> None:
    assert not torch.autograd._profiler_enabled()
    with legacy.profile() as prof:  # a new profile starts: nothing was left registered
        torch.ones(2).sum()
    assert any(evt.key == "aten::sum" for evt in prof.key_averages())


@pytest.fixture
def tracing_workload() -> None:
    """Run the workload once first, so lazy initialisation inside torch is not profiled by either."""
    workload()


# ---------------------------------------------------------------- torch as the oracle


FLAG_SETS = [
    {},
    {"record_shapes": True},
    {"profile_memory": True},
    {"with_flops": True},
    {"record_shapes": True, "profile_memory": True, "with_flops": True},
]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: ",".join(f) or "default")
def test_same_events_and_table_layout_as_torch_legacy(flags: dict, tracing_workload: None) -> None:
    theirs, ours = run_both(workload, **flags)
    assert collections.Counter(e.name for e in ours.function_events) == collections.Counter(
        e.name for e in theirs.function_events
    )
    # Same groups in the same order ([memory] rows first, as the legacy parse sorts them).
    assert key_counts(ours.key_averages()) == key_counts(theirs.key_averages())
    assert header(ours.key_averages().table()) == header(theirs.key_averages().table())
    # The profile's own table lists raw events; with_flops implies record_shapes there.
    ours_raw = ours.table(row_limit=-1)
    if flags.get("profile_memory") and flags.get("with_flops"):
        # torch's bug: its [memory] rows have flops=None, which its table cannot compare; ours prints.
        with pytest.raises(TypeError):
            theirs.table(row_limit=-1)
        assert "[memory]" in ours_raw
    else:
        theirs_raw = theirs.table(row_limit=-1)
        assert header(ours_raw) == header(theirs_raw)
        assert len(ours_raw.splitlines()) == len(theirs_raw.splitlines())
    assert ours.record_shapes == theirs.record_shapes
    assert ours.total_average().count == theirs.total_average().count == len(ours.function_events)
    assert ours.self_cpu_time_total > 0
    assert str(ours) == ours.table()


def test_group_by_input_shape_as_torch_legacy(tracing_workload: None) -> None:
    theirs, ours = run_both(workload, record_shapes=True)

    def groups(prof) -> list:
        return [(a.key, a.count, str(a.input_shapes)) for a in prof.key_averages(group_by_input_shape=True)]

    assert groups(ours) == groups(theirs)
    assert header(ours.key_averages(True).table()) == header(theirs.key_averages(True).table())


def test_memory_rows_come_first_as_in_torch_legacy() -> None:
    def frees_outside_ops() -> None:
        a = torch.ones(1000)
        torch.relu(a)
        del a

    theirs, ours = run_both(frees_outside_ops, profile_memory=True)
    assert theirs.key_averages()[0].key == "[memory]"
    assert key_counts(ours.key_averages()) == key_counts(theirs.key_averages())
    assert ours.function_events[0].name == "[memory]"


def test_sort_by_id_lists_raw_events_newest_first_as_torch(tracing_workload: None) -> None:
    theirs, ours = run_both(workload)
    ours_table = ours.table(sort_by="id", row_limit=100000)
    theirs_table = theirs.table(sort_by="id", row_limit=100000)

    def names(table: str) -> list[str]:
        return [line.split()[0] for line in table.splitlines()[3:-2]]

    assert names(ours_table) == names(theirs_table)
    ids = [evt.id for evt in ours.function_events]
    assert names(ours_table)[0] == ours.function_events[ids.index(max(ids))].name
    assert len(names(ours_table)) == len(ours.function_events)


OPS: dict[str, Callable[[torch.Tensor], object]] = {
    "add": lambda t: t + 1,
    "mul": lambda t: t * t,
    "mm": lambda t: torch.mm(t.reshape(4, 4), t.reshape(4, 4)),
    "relu": torch.relu,
    "sum": torch.sum,
    "cat": lambda t: torch.cat([t, t]),
    "sort": torch.sort,
    "clone": torch.clone,
    "to_double": lambda t: t.to(torch.float64),
    "range": lambda t: record_range(t),
    "in_place": lambda t: t.clone().add_(1),
    "mask": lambda t: t[t > 3],
    "conv": lambda t: torch.nn.functional.conv2d(t.reshape(1, 1, 4, 4), torch.ones(2, 1, 3, 3)),
    "backward": lambda t: (t.clone().requires_grad_() * 3).sum().backward(),
    "softmax": lambda t: torch.softmax(t, 0),
}


def record_range(t: torch.Tensor) -> object:
    with torch.autograd.profiler.record_function("user_range"):
        return t.exp()


@settings(max_examples=examples(15), deadline=None)
@given(ops=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=6))
def test_any_op_sequence_gives_torch_legacy_names_and_counts(ops: list[str]) -> None:
    t = torch.arange(16, dtype=torch.float32)

    def fn() -> None:
        for op in ops:
            OPS[op](t)

    fn()
    theirs, ours = run_both(fn)
    assert key_counts(ours.key_averages()) == key_counts(theirs.key_averages())


# ---------------------------------------------------------------- the IPEX document's samples, on CPU


def test_ipex_use_tool_sample(capsys: pytest.CaptureFixture[str]) -> None:
    input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")
    with polyprof.legacy.profile() as prof:
        output_tensor_1 = torch.nonzero(input_tensor)  # noqa: F841
        output_tensor_2 = torch.unique(input_tensor)  # noqa: F841
    print(prof.key_averages().table())
    printed = capsys.readouterr().out
    for title in ("Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls"):
        assert title in printed
    assert "aten::nonzero" in printed and "aten::_unique2" in printed
    assert "Self CPU time total:" in printed


def test_ipex_disable_sample_gives_clear_error() -> None:
    input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")
    # use_xpu=True stays: a disabled profile never looks for the XPU plugin.
    with polyprof.legacy.profile(enabled=False, use_xpu=True) as prof:
        output_tensor_1 = torch.nonzero(input_tensor)  # noqa: F841
        output_tensor_2 = torch.unique(input_tensor)  # noqa: F841
        assert not torch.autograd._profiler_enabled()
    assert prof is not None  # torch returns None here
    with pytest.raises(RuntimeError, match=r"profiler was disabled \(enabled=False\)"):
        print(prof.key_averages().table())


@pytest.mark.parametrize(
    "ask",
    [
        lambda p: p.key_averages(),
        lambda p: p.table(),
        lambda p: p.total_average(),
        lambda p: p.export_chrome_trace("never.json"),
        lambda p: p.export_stacks("never.txt"),
        lambda p: p.function_events,
        lambda p: p.self_cpu_time_total,
        str,
    ],
    ids=[
        "key_averages",
        "table",
        "total_average",
        "export_chrome_trace",
        "export_stacks",
        "function_events",
        "self_cpu_time_total",
        "str",
    ],
)
def test_disabled_profile_results_are_clear_errors(ask: Callable, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with legacy.profile(enabled=False) as prof:
        torch.ones(2).sum()
    with pytest.raises(ProfilerDisabledError, match="enabled=False"):
        ask(prof)
    assert "disabled" in repr(prof)
    assert list(tmp_path.iterdir()) == []


def test_ipex_sort_by_id_sample(capsys: pytest.CaptureFixture[str]) -> None:
    input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")
    with polyprof.legacy.profile() as prof:
        torch.nonzero(input_tensor)
        torch.unique(input_tensor)
    print(prof.table(sort_by="id", row_limit=100000))
    rows = capsys.readouterr().out.splitlines()[3:-3]  # print adds an empty last line
    assert len(rows) == len(prof.function_events)
    # Descending ids: the last op called comes first.
    assert rows[-1].split()[0] == "aten::nonzero"


def test_ipex_chrome_trace_sample(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    input_tensor = torch.randn(1024, dtype=torch.float32, device="cpu")
    with polyprof.legacy.profile() as prof:
        torch.nonzero(input_tensor)
        torch.unique(input_tensor)
    prof.export_chrome_trace("trace_file.json")
    events = json.loads((tmp_path / "trace_file.json").read_text())
    assert isinstance(events, list)  # the legacy format: a bare array
    assert [e["name"] for e in events] == [evt.trace_name for evt in prof.function_events]
    assert [p.name for p in tmp_path.iterdir()] == ["trace_file.json"]  # no temp file left


def test_chrome_trace_schema_matches_torch_legacy(tmp_path, tracing_workload: None) -> None:
    theirs, ours = run_both(workload)
    theirs.export_chrome_trace(str(tmp_path / "theirs.json"))
    written = ours.export_chrome_trace(tmp_path / "ours.json")
    assert written == str(tmp_path / "ours.json")
    ours_events = json.loads((tmp_path / "ours.json").read_text())
    theirs_events = json.loads((tmp_path / "theirs.json").read_text())
    assert {tuple(sorted(e)) for e in ours_events} == {tuple(sorted(e)) for e in theirs_events}
    assert {(e["ph"], e["pid"]) for e in ours_events} == {("X", "CPU functions")}
    assert sorted(e["name"] for e in ours_events) == sorted(e["name"] for e in theirs_events)


# ---------------------------------------------------------------- life cycle and errors


def test_not_reentrant_and_records_once() -> None:
    prof = legacy.profile()
    with prof:
        torch.ones(2).sum()
        with pytest.raises(RuntimeError, match="not reentrant"):
            with prof:
                pass
        torch.ones(2).sum()
    assert sum(a.count for a in prof.key_averages() if a.key == "aten::sum") == 2
    with pytest.raises(RuntimeError, match=r"not reentrant.*already recorded once"):
        with prof:
            pass
    assert_nothing_running()


def test_torch_legacy_raises_the_same_for_reentry() -> None:
    prof = profiler_legacy.profile()
    with prof:
        with pytest.raises(RuntimeError, match="not reentrant"):
            prof.__enter__()


def test_results_before_the_end_are_clear_errors() -> None:
    prof = legacy.profile()
    with pytest.raises(RuntimeError, match="didn't finish running"):
        prof.table()
    assert prof.function_events is None
    assert str(prof).startswith("<unfinished polyprof.legacy.profile")
    with prof:
        with pytest.raises(RuntimeError, match=r"didn't finish running.*after the with-block"):
            prof.key_averages()
        assert "recording" in repr(prof)


def test_no_concurrent_polyprof_profiles() -> None:
    with legacy.profile() as outer:
        torch.ones(2).sum()
        with pytest.raises(RuntimeError, match="already recording"):
            with polyprof.profile(activities=[ProfilerActivity.CPU]):
                pass
        with pytest.raises(RuntimeError, match="already recording"):
            with legacy.profile():
                pass
    assert any(a.key == "aten::sum" for a in outer.key_averages())
    with polyprof.profile(activities=[ProfilerActivity.CPU]):
        with pytest.raises(RuntimeError, match="already recording"):
            with legacy.profile():
                pass
    assert_nothing_running()


def test_torch_profiler_running_is_a_clear_error_and_leaves_it_alone() -> None:
    with profiler_legacy.profile() as theirs:
        with pytest.raises(RuntimeError, match="already running"):
            with legacy.profile():
                pass
        torch.ones(2).sum()
    assert any(evt.name == "aten::sum" for evt in theirs.function_events)
    assert_nothing_running()


def test_exception_in_block_keeps_results_and_stops() -> None:
    prof = legacy.profile()
    with pytest.raises(KeyError, match="boom"):
        with prof:
            torch.ones(2).sum()
            raise KeyError("boom")
    assert any(a.key == "aten::sum" for a in prof.key_averages())
    assert not torch.autograd._profiler_enabled()


@pytest.mark.parametrize(
    "flag",
    ["record_shapes", "with_flops", "profile_memory", "with_stack", "with_modules"],
)
def test_non_boolean_flags_are_rejected(flag: str) -> None:
    # enabled, use_cuda and use_xpu take any value, as torch's do (tests/test_profile_arguments.py).
    with pytest.raises(TypeError, match=f"{flag} must be True or False"):
        legacy.profile(**{flag: "yes"})
    legacy.profile(**{flag: np.bool_(True)})  # numpy booleans are fine


def test_torch_rejects_use_xpu_which_polyprof_supplies() -> None:
    with pytest.raises(TypeError, match="use_xpu"):
        profiler_legacy.profile(use_xpu=True)
    assert "use_xpu" not in dir(profiler_legacy.profile)
    assert legacy.profile(use_xpu=True).activities_requested == {ProfilerActivity.CPU, ProfilerActivity.XPU}


def test_export_stacks_needs_with_stack(tmp_path) -> None:
    with legacy.profile() as prof:
        torch.ones(2).sum()
    with pytest.raises(RuntimeError, match="requires with_stack=True"):
        prof.export_stacks(tmp_path / "stacks.txt")
    assert not (tmp_path / "stacks.txt").exists()


def test_with_stack_fills_op_stacks_without_python_function_rows(tmp_path) -> None:
    def fn() -> None:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))

    theirs, ours = run_both(fn, with_stack=True)
    assert collections.Counter(e.name for e in ours.function_events) == collections.Counter(
        e.name for e in theirs.function_events
    )
    mm = next(evt for evt in ours.function_events if evt.name == "aten::mm")
    assert any("fn" in frame for frame in mm.stack)
    assert "Source Location" in header(ours.key_averages(group_by_stack_n=2).table())[1]
    path = ours.export_stacks(tmp_path / "stacks.txt", "self_cpu_time_total")
    lines = (tmp_path / "stacks.txt").read_text().splitlines()
    assert path == str(tmp_path / "stacks.txt") and lines
    assert all(line.rsplit(" ", 1)[1].isdigit() for line in lines)


# ---------------------------------------------------------------- devices, through fake plugins

US = 1000


class OffsetTracer(FakeTracer):
    """Emits ``specs`` at stop, their start times counted from the moment it started."""

    def __init__(self, specs: list[dict], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.specs = specs

    def stop(self) -> None:
        base = self.start_ns or 0
        self.batches = (make_event_batch([{**s, "start_ns": base + s["start_ns"]} for s in self.specs]),)
        super().stop()


CPU_OPS = [
    {"name": "aten::mm", "start_ns": 10 * US, "dur_ns": 100 * US, "thread": 1, "correlation_id": 1},
    {"name": "aten::relu", "start_ns": 200 * US, "dur_ns": 50 * US, "thread": 1, "correlation_id": 2},
]


def kernels(device: DeviceType) -> list[dict]:
    return [
        {
            "name": name,
            "kind": EventKind.KERNEL,
            "start_ns": start * US,
            "dur_ns": dur * US,
            "thread": 7,
            "device_type": int(device),
            "linked_correlation_id": corr,
        }
        for name, start, dur, corr in (("gemm_kernel", 20, 40, 1), ("relu_kernel", 210, 5, 2))
    ]


def device_plugin_manager(activity: ProfilerActivity, device: DeviceType):
    """A CPU tracer and a device tracer, both synthetic: two ops and the kernels they launched."""
    plugin = ComponentPlugin(
        plugin_name="fake_device",
        tracers=[
            OffsetTracer(CPU_OPS, name="fake_cpu"),
            OffsetTracer(kernels(device), name="fake_device", activities=[activity]),
        ],
    )
    return make_plugin_manager_for_tests(plugin)


@pytest.mark.parametrize(
    ("flag", "activity", "device", "title"),
    [
        ("use_xpu", ProfilerActivity.XPU, DeviceType.XPU, "XPU"),
        ("use_cuda", ProfilerActivity.CUDA, DeviceType.CUDA, "CUDA"),
    ],
)
def test_device_time_columns(flag: str, activity, device, title: str, tmp_path) -> None:
    pm = device_plugin_manager(activity, device)
    try:
        with legacy.profile(plugin_manager=pm, **{flag: True}) as prof:
            pass
    finally:
        pm.close()
    assert prof.use_device == title.lower()
    table = prof.key_averages().table(sort_by=f"self_{title.lower()}_time_total")
    titles = header(table)[1].split("  ")
    for column in (f"Self {title}", f"Self {title} %", f"{title} total", f"{title} time avg"):
        assert column.strip() in [t.strip() for t in titles]
    assert table.splitlines()[-1] == f"Self {title} time total: 45.000us"
    by_key = {a.key: a for a in prof.key_averages()}
    assert by_key["aten::mm"].self_device_time_total == pytest.approx(40.0)
    assert by_key["aten::relu"].device_time_total == pytest.approx(5.0)
    assert by_key["aten::mm"].self_cpu_time_total == pytest.approx(100.0)
    rows = table.splitlines()[3:-3]
    assert rows[0].split()[0] in ("aten::mm", "gemm_kernel")
    assert f"Self {title}" in header(prof.table())[1]
    # The legacy export links each op to its kernels with a cpu_to_<device> flow.
    prof.export_chrome_trace(tmp_path / "trace.json")
    events = json.loads((tmp_path / "trace.json").read_text())
    flows = [e for e in events if e["ph"] == "s"]
    assert [f["name"] for f in flows] == ["aten::mm", "aten::relu"]
    assert {f["cat"] for f in flows} == {f"cpu_to_{title.lower()}"}


@pytest.mark.parametrize(
    ("flag", "distribution"), [("use_xpu", "polyprof-xpu"), ("use_cuda", "polyprof-cuda")]
)
def test_device_without_plugin_names_the_distribution(flag: str, distribution: str) -> None:
    pm = make_plugin_manager_for_tests(builtins=True)
    try:
        prof = legacy.profile(plugin_manager=pm, **{flag: True})
        with pytest.raises(ActivityUnavailableError, match=f"pip install {distribution}"):
            with prof:
                raise AssertionError("the block must not run")
    finally:
        pm.close()
    assert not prof.entered and "not started" in repr(prof)
    assert_nothing_running()


@pytest.mark.parametrize(
    ("flag", "activity"), [("use_xpu", ProfilerActivity.XPU), ("use_cuda", ProfilerActivity.CUDA)]
)
def test_installed_but_unavailable_device_warns_and_profiles_cpu(flag: str, activity) -> None:
    unusable = ComponentPlugin(
        plugin_name="fake_device",
        tracers=[FakeTracer(name="fake_device", activities=[activity])],
        unavailable_reason="no driver found",
    )
    pm = make_plugin_manager_for_tests(unusable, builtins=True)
    try:
        with pytest.warns(
            ActivityUnavailableWarning, match=f"{activity.name} profiling is not available"
        ) as caught:
            with legacy.profile(plugin_manager=pm, **{flag: True}) as prof:
                torch.ones(2).sum()
    finally:
        pm.close()
    assert caught[0].filename == __file__  # the warning points at the user's with-statement
    assert prof.use_device is None
    table = prof.key_averages().table()
    assert "aten::sum" in table and "Self CPU" in table and activity.name not in header(table)[1]
    assert not torch.autograd._profiler_enabled()


def test_python_function_rows_are_dropped_with_stack() -> None:
    specs = [
        {
            "name": "f.py(3): f",
            "kind": EventKind.PYTHON_FUNCTION,
            "start_ns": 0,
            "dur_ns": 90 * US,
            "thread": 1,
        },
        {
            "name": "aten::mm",
            "start_ns": 10 * US,
            "dur_ns": 50 * US,
            "thread": 1,
            "correlation_id": 1,
            "stack": ("f.py(3): f", "main.py(9): <module>"),
        },
    ]
    pm = make_plugin_manager_for_tests(ComponentPlugin(tracers=[OffsetTracer(specs, name="fake_cpu")]))
    try:
        with legacy.profile(with_stack=True, plugin_manager=pm) as prof:
            pass
    finally:
        pm.close()
    assert [evt.name for evt in prof.function_events] == ["aten::mm"]
    assert prof.function_events[0].stack == ["f.py(3): f", "main.py(9): <module>"]
    assert prof.function_events[0].cpu_parent is None  # the dropped frame parents nothing
    assert prof.self_cpu_time_total == pytest.approx(50.0)


class CountingAggregator(Aggregator):
    """A replacement ``key_averages`` aggregator: one row per event kind."""

    name = "key_averages"

    def aggregate(self, trace, **options):
        rows = []
        for kind, count in collections.Counter(trace.events["kind"].tolist()).items():
            avg = FunctionEventAvg()
            avg.key, avg.count = f"kind {kind}", count
            rows.append(avg)
        return rows


def test_a_plugin_aggregator_replaces_key_averages() -> None:
    pm = make_plugin_manager_for_tests(
        ComponentPlugin(tracers=[OffsetTracer(CPU_OPS, name="fake_cpu")], aggregators=[CountingAggregator()])
    )
    try:
        with legacy.profile(plugin_manager=pm) as prof:
            pass
    finally:
        pm.close()
    assert key_counts(prof.key_averages()) == [("kind 0", 2)]
