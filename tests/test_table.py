"""polyprof.analysis.table.build_table against the installed torch's own table code as the oracle.

On every supported torch (2.6 to 2.15) the oracle is that release's
``_build_table``. Two things polyprof does on purpose on older releases are
checked explicitly: ``time_unit`` works before 2.9 (torch's table does not take
it: its text without ``time_unit`` must still match), and XPU device events
are timed before 2.11 (torch raises there; the oracle gets them labelled CUDA).

Real events come from torch.profiler on small CPU workloads; device-time events
are built by hand with torch's FunctionEvent (legacy and Kineto style); random
FunctionEventAvg records come from hypothesis. For each input, our text must be
byte for byte torch's, except where polyprof differs on purpose (see
polyprof.analysis.table's docstring); those cases have their own tests.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import re
import types
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.autograd import DeviceType
from torch.autograd.profiler_util import (
    EventList,
    FunctionEvent,
    FunctionEventAvg,
    _build_table,
    _format_memory,
    _format_time,
    _format_time_share,
)
from torch.profiler import ProfilerActivity, profile, record_function

from hypothesis_budget import examples
from polyprof.analysis.table import (
    VALID_SORT_KEYS,
    InvalidSortKeyError,
    TimeShareError,
    build_table,
    flops_unit,
    format_memory,
    format_time,
    format_time_share,
)
from polyprof.analysis.tree import PostProcessingRules, post_processing_rules
from polyprof.base import torch_support

ExperimentalConfig = torch._C._profiler._ExperimentalConfig

TABLE_FLAGS = ("with_flops", "profile_memory")
FEATURES = torch_support.installed()
RULES = post_processing_rules()
#: torch's table takes ``time_unit`` from 2.9.
TORCH_TIME_UNIT = "time_unit" in inspect.signature(_build_table).parameters
#: torch before 2.11 raises from ``device_time_total`` for XPU events.
XPU_AS_TORCH = FEATURES.at_least(2, 11)


# ---------------------------------------------------------------- workloads


class SmallNet(torch.nn.Module):
    """A conv + linear model: gives conv2d and addmm FLOPs, allocations and nesting."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def run_workload() -> None:
    torch.manual_seed(0)
    net = SmallNet()
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):
        with record_function("forward_block"):
            y = net(x)
        with record_function("extra_block"):
            z = torch.mm(torch.randn(16, 32), torch.randn(32, 8))
            (y.sum() + z.sum()).item()
    # a different input shape for the same op, so group_by_input_shape splits it
    torch.mm(torch.randn(4, 4), torch.randn(4, 4))


@functools.cache
def warm_up_profiler() -> None:
    """One throwaway profile, so that torch's lazy imports happen outside the real ones.

    torch 2.13 imports modules (logging setup, ``torch.profiler._cupti_monitor``)
    inside the first profiled window; with ``verbose=True`` the stacks of those
    frames point at code objects that are freed afterwards, and parsing them
    later fails with ``UnicodeDecodeError``.
    """
    with profile(
        activities=[ProfilerActivity.CPU],
        with_stack=True,
        experimental_config=ExperimentalConfig(verbose=True),
    ):
        torch.add(torch.ones(1), 1)


def profiled(**kwargs: Any) -> torch.profiler.profile:
    warm_up_profiler()
    with profile(activities=[ProfilerActivity.CPU], **kwargs) as prof:
        run_workload()
    prof.events()  # parse now, while every frame of the window is still alive
    return prof


@pytest.fixture(scope="module")
def full_prof() -> torch.profiler.profile:
    return profiled(record_shapes=True, profile_memory=True, with_flops=True)


@pytest.fixture(scope="module")
def plain_prof() -> torch.profiler.profile:
    return profiled()


@pytest.fixture(scope="module")
def stack_prof() -> torch.profiler.profile:
    return profiled(with_stack=True, with_flops=True, experimental_config=ExperimentalConfig(verbose=True))


@pytest.fixture(scope="module")
def stack_averages(stack_prof: torch.profiler.profile) -> tuple[EventList, ...]:
    return stack_prof.key_averages(group_by_stack_n=3), stack_prof.key_averages(group_by_stack_n=1)


@pytest.fixture(scope="module")
def overload_prof() -> torch.profiler.profile:
    if "capture_overload_names" not in FEATURES.experimental_fields:
        pytest.skip(
            f"torch {FEATURES.version_text} records no overload names (test_no_overload_column_before_2_7)"
        )
    return profiled(record_shapes=True, experimental_config=ExperimentalConfig(capture_overload_names=True))


# ---------------------------------------------------------------- helpers


def flags_of(events: EventList) -> dict[str, bool]:
    return {"with_flops": events._with_flops, "profile_memory": events._profile_memory}


def table_method_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for torch's ``EventList.table``: without ``time_unit`` before 2.9 (it has none)."""
    if TORCH_TIME_UNIT:
        return options
    return {k: v for k, v in options.items() if k != "time_unit"}


def relabelled(events: Any, old: DeviceType, new: DeviceType) -> EventList:
    """Shallow copies of ``events`` with device type ``old`` written as ``new`` (same list flags)."""
    out = []
    for evt in events:
        if evt.device_type == old:
            evt = copy.copy(evt)
            evt.device_type = new
        out.append(evt)
    return EventList(
        out,
        use_device=getattr(events, "_use_device", None),
        profile_memory=getattr(events, "_profile_memory", False),
        with_flops=getattr(events, "_with_flops", False),
    )


def torch_input(events: Any) -> Any:
    """What torch is given as the oracle: XPU events labelled CUDA before 2.11 (see the module doc)."""
    if XPU_AS_TORCH or not any(evt.device_type == DeviceType.XPU for evt in events):
        return events
    return relabelled(events, DeviceType.XPU, DeviceType.CUDA)


#: What ``build_table`` reads of an event.
TABLE_ATTRIBUTES = (
    "key", "count", "cpu_time_total", "self_cpu_time_total", "cpu_time", "device_time_total",
    "self_device_time_total", "device_time", "cpu_memory_usage", "device_memory_usage",
    "self_cpu_memory_usage", "self_device_memory_usage", "input_shapes", "stack", "flops",
    "overload_name", "node_id", "is_async", "is_user_annotation", "is_legacy", "use_device", "cpu_parent",
)  # fmt: skip


def ours_input(events: Any) -> Any:
    """What polyprof is given: torch's own events, except XPU ones before 2.11.

    There torch's ``device_time_total`` property raises, so polyprof's table
    gets snapshots of the values torch computes for the same events labelled
    CUDA (polyprof's own results carry values, never torch's properties).
    """
    if torch_input(events) is events:
        return events
    cuda = relabelled(events, DeviceType.XPU, DeviceType.CUDA)
    return [
        types.SimpleNamespace(
            **{name: getattr(evt, name, None) for name in TABLE_ATTRIBUTES}, device_type=orig.device_type
        )
        for orig, evt in zip(events, cuda, strict=True)
    ]


def torch_key_averages(events: EventList) -> EventList:
    """``events.key_averages()``, through ``torch_input`` where torch would raise."""
    if torch_input(events) is events:
        return events.key_averages()
    averages = relabelled(events, DeviceType.XPU, DeviceType.CUDA)
    averages._tree_built = True
    return relabelled(averages.key_averages(), DeviceType.CUDA, DeviceType.XPU)


def ours_and_torch(events: Any, **kwargs: Any) -> tuple[str, str]:
    """Our table, then torch's (torch writes percent attributes onto events; we never read them).

    Before torch 2.9 its table has no ``time_unit``: torch must refuse it, and
    the texts are compared without it.
    """
    ours = build_table(ours_input(events), **kwargs)
    if "time_unit" in kwargs and not TORCH_TIME_UNIT:
        with pytest.raises(TypeError, match="time_unit"):
            _build_table(torch_input(events), **kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k != "time_unit"}
        ours = build_table(ours_input(events), **kwargs)
    theirs = _build_table(torch_input(events), **kwargs)
    return ours, theirs


def assert_same(events: Any, **kwargs: Any) -> str:
    ours, theirs = ours_and_torch(events, **kwargs)
    assert ours == theirs, f"tables differ for {kwargs}\n--- ours\n{ours}\n--- torch\n{theirs}"
    return ours


def without_none_flops(events: list[Any]) -> list[Any]:
    """Shallow copies with flops=None replaced by 0: what torch would print if it did not crash."""
    fixed = []
    for evt in events:
        evt = copy.copy(evt)
        if evt.flops is None:
            evt.flops = 0
        fixed.append(evt)
    return fixed


OPTION_SETS: list[dict[str, Any]] = [
    {},
    {"sort_by": "cpu_time_total"},
    {"sort_by": "self_cpu_time_total", "row_limit": 5},
    {"sort_by": "cpu_time", "row_limit": -1},
    {"sort_by": "count", "row_limit": 0},
    {"sort_by": "cuda_time_total"},
    {"sort_by": "self_xpu_time_total", "time_unit": "s"},
    {"sort_by": "device_time"},
    {"sort_by": "cpu_memory_usage", "header": "MY HEADER"},
    {"sort_by": "self_cpu_memory_usage", "row_limit": 5, "max_name_column_width": 12, "time_unit": "ms"},
    {"sort_by": "self_cuda_memory_usage", "time_unit": "us"},
    {"sort_by": "flops", "max_name_column_width": 20},
    {"sort_by": "key"},
    {"top_level_events_only": True},
    {"top_level_events_only": True, "row_limit": 2, "header": "top"},
    {"max_name_column_width": None, "max_shapes_column_width": None, "max_src_column_width": None},
    {"max_shapes_column_width": 10, "max_src_column_width": 20, "row_limit": 1},
    {"max_name_column_width": 4},
]
FLAG_SETS = [
    dict(zip(TABLE_FLAGS, values, strict=True)) for values in itertools.product((False, True), repeat=2)
]


def column_spans(rule_line: str) -> list[tuple[int, int]]:
    """(start, end) of each ``----`` run in a separator line."""
    return [m.span() for m in re.finditer(r"-+", rule_line)]


# ---------------------------------------------------------------- real profiles


def test_default_table_matches_torch_list_table(full_prof: torch.profiler.profile) -> None:
    averages = full_prof.key_averages()
    ours = build_table(averages, **flags_of(averages))
    assert ours == averages.table()
    # the workload really exercises the optional columns
    assert "Self CPU Mem" in ours and "Input Shapes" not in ours and "FLOPs" in ours


@pytest.mark.parametrize(
    "options", OPTION_SETS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults"
)
def test_key_averages_match_torch(full_prof: torch.profiler.profile, options: dict[str, Any]) -> None:
    averages = full_prof.key_averages()
    table_options = table_method_options(options)
    assert build_table(averages, **flags_of(averages), **table_options) == averages.table(**table_options)
    for flags in FLAG_SETS:
        assert_same(averages, **flags, **options)


@pytest.mark.parametrize("options", OPTION_SETS[:10], ids=str)
def test_grouped_by_input_shape_matches_torch(
    full_prof: torch.profiler.profile, options: dict[str, Any]
) -> None:
    grouped = full_prof.key_averages(group_by_input_shape=True)
    options = table_method_options(options)
    ours = build_table(grouped, **flags_of(grouped), **options)
    assert ours == grouped.table(**options)
    if options.get("row_limit", 100) != 0:
        assert "Input Shapes" in ours


@pytest.mark.parametrize("options", OPTION_SETS, ids=str)
def test_raw_events_match_torch(plain_prof: torch.profiler.profile, options: dict[str, Any]) -> None:
    events = plain_prof.events()
    for flags in FLAG_SETS:
        assert_same(events, **flags, **options)


@pytest.mark.parametrize("options", OPTION_SETS, ids=str)
def test_raw_events_with_shapes_and_memory_match_torch(
    full_prof: torch.profiler.profile, options: dict[str, Any]
) -> None:
    events = full_prof.events()
    # torch crashes on the flops=None of these events with with_flops=True or sort_by="flops"
    # (difference 1): its oracle text comes from copies with 0 instead.
    fixed = without_none_flops(events)
    if not TORCH_TIME_UNIT:  # torch < 2.9 (test_time_unit_works_on_every_release)
        options = {k: v for k, v in options.items() if k != "time_unit"}
    for with_flops in (False, True):
        ours = build_table(events, profile_memory=True, with_flops=with_flops, **options)
        assert ours == _build_table(fixed, profile_memory=True, with_flops=with_flops, **options)
    if options.get("sort_by") != "flops":
        assert_same(events, profile_memory=True, with_flops=False, **options)


@pytest.mark.parametrize(
    "options",
    [
        *OPTION_SETS[:3],
        pytest.param(OPTION_SETS[3], marks=pytest.mark.slow),  # every row with its stacks: seconds
        *OPTION_SETS[4:6],
        {"max_src_column_width": 20},
        {"sort_by": "self_cpu_time_total", "row_limit": 3, "max_src_column_width": 60},
    ],
    ids=str,
)
def test_stacks_match_torch_without_flops(
    stack_prof: torch.profiler.profile, stack_averages: tuple[EventList, ...], options: dict[str, Any]
) -> None:
    for averages in stack_averages:
        ours = assert_same(averages, with_flops=False, profile_memory=False, **options)
        if options.get("row_limit", 100) != 0:
            assert "Source Location" in ours
    assert_same(stack_prof.events(), with_flops=False, **options)


@pytest.mark.parametrize(
    "options", [{}, {"sort_by": "cpu_time_total", "row_limit": 3}, {"max_name_column_width": 10}], ids=str
)
def test_overload_names_match_torch(overload_prof: torch.profiler.profile, options: dict[str, Any]) -> None:
    averages = overload_prof.key_averages(group_by_overload_name=True)
    ours = build_table(averages, **flags_of(averages), **options)
    assert ours == averages.table(**options)
    assert "Overload Name" in ours
    grouped = overload_prof.key_averages(group_by_overload_name=True, group_by_input_shape=True)
    assert build_table(grouped, **flags_of(grouped), **options) == grouped.table(**options)


def test_build_table_does_not_modify_events(plain_prof: torch.profiler.profile) -> None:
    events = plain_prof.events()
    fresh = [copy.copy(evt) for evt in events]
    for evt in fresh:
        evt.self_cpu_percent = evt.total_cpu_percent = evt.total_device_percent = -1
    build_table(fresh, sort_by="cpu_time_total")
    assert all(evt.self_cpu_percent == -1 and evt.total_cpu_percent == -1 for evt in fresh)
    _build_table(fresh)
    assert any(evt.self_cpu_percent != -1 for evt in fresh)  # torch does write them


def test_empty_list_gives_empty_text() -> None:
    assert build_table([]) == "" == _build_table([])
    assert build_table(EventList(), sort_by="no_such_key", header="x") == ""


def test_accepts_any_iterable_of_records(full_prof: torch.profiler.profile) -> None:
    averages = full_prof.key_averages()
    assert build_table(iter(averages), profile_memory=True) == build_table(
        list(averages), profile_memory=True
    )


# ---------------------------------------------------------------- synthetic device events

# torch_profiler.md §2.6 item 3, as measured on torch 2.13 (the golden text, independent of our code).
LEGACY_CUDA_TABLE = """\
--------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
          Name    Self CPU %      Self CPU   CPU total %     CPU total  CPU time avg     Self CUDA   Self CUDA %    CUDA total  CUDA time avg       CPU Mem  Self CPU Mem      CUDA Mem  Self CUDA Mem    # of Calls  Total KFLOPs  
--------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
      aten::mm        55.00%     110.000us        55.00%     110.000us     110.000us      80.000us        88.89%      80.000us      80.000us           0 B           0 B       4.00 KB       4.00 KB             1       524.288  
    aten::relu        15.00%      30.000us        15.00%      30.000us      30.000us       5.500us         6.11%       5.500us       5.500us           0 B           0 B       4.00 KB       4.00 KB             1            --  
     my_region        30.00%      60.000us       100.00%     200.000us     200.000us       4.500us         5.00%      90.000us      90.000us           0 B           0 B       8.00 KB           0 B             1            --  
--------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  ------------  
Self CPU time total: 200.000us
Self CUDA time total: 90.000us
"""  # noqa: E501, W291 - torch's table as it prints it


def legacy_device_events(use_device: str) -> EventList:
    """A region with two ops, each CPU event carrying its own (fake) kernel, as the legacy profiler does."""
    common = {"thread": 0, "use_device": use_device, "is_legacy": True, "stack": []}
    region = FunctionEvent(
        id=0, name="my_region", start_us=0, end_us=200, device_memory_usage=8192, flops=0, **common
    )
    mm = FunctionEvent(
        id=1, name="aten::mm", start_us=10, end_us=120, device_memory_usage=4096, flops=524288, **common
    )
    relu = FunctionEvent(
        id=2, name="aten::relu", start_us=130, end_us=160, device_memory_usage=4096, flops=0, **common
    )
    region.append_kernel("region_kernel", 0, 90.0)
    mm.append_kernel("gemm", 0, 80.0)
    relu.append_kernel("relu_kernel", 0, 5.5)
    for child in (mm, relu):
        region.append_cpu_child(child)
        child.set_cpu_parent(region)
    events = EventList([mm, relu, region], use_device=use_device, profile_memory=True, with_flops=True)
    events._tree_built = True  # the parent/child links above are the tree
    return events


def kineto_device_events(use_device: str) -> EventList:
    """Kineto style: a CPU op with a launched kernel, the kernel itself, and a device-side annotation."""
    op = FunctionEvent(
        id=0, name="aten::mm", thread=0, start_us=0, end_us=50, use_device=use_device, stack=[], flops=2048
    )
    op.append_kernel("gemm", 0, 30.0)
    device_type = {"cuda": DeviceType.CUDA, "xpu": DeviceType.XPU, "mtia": DeviceType.MTIA}.get(
        use_device, DeviceType.PrivateUse1
    )
    kernel = FunctionEvent(
        id=1,
        name="gemm",
        thread=7,
        start_us=10,
        end_us=40,
        use_device=use_device,
        device_type=device_type,
        stack=[],
        flops=0,
    )
    annotation = FunctionEvent(
        id=2,
        name="gpu_annotation",
        thread=7,
        start_us=5,
        end_us=45,
        use_device=use_device,
        device_type=device_type,
        is_user_annotation=True,
        stack=[],
        flops=0,
    )
    child = FunctionEvent(
        id=3, name="aten::empty", thread=0, start_us=2, end_us=4, use_device=use_device, stack=[], flops=0
    )
    op.append_cpu_child(child)
    child.set_cpu_parent(op)
    events = EventList(
        [op, child, kernel, annotation], use_device=use_device, profile_memory=True, with_flops=True
    )
    events._tree_built = True  # the parent/child links above are the tree
    return events


def with_units_before_2_8(text: str) -> str:
    """The golden text as torch before 2.8 prints it (``Kb``, ``b``: same widths)."""
    return re.sub(r"(\d) B(?= )", r"\1 b", text.replace(" KB ", " Kb "))


def test_legacy_cuda_table_matches_golden_text() -> None:
    events = legacy_device_events("cuda")
    golden = LEGACY_CUDA_TABLE if RULES.memory_units[0] == "GB" else with_units_before_2_8(LEGACY_CUDA_TABLE)
    assert build_table(events, **flags_of(events)) == golden
    assert _build_table(events, **flags_of(events)) == golden
    for minor, text in ((7, with_units_before_2_8(LEGACY_CUDA_TABLE)), (8, LEGACY_CUDA_TABLE)):
        assert build_table(events, **flags_of(events), rules=PostProcessingRules.for_torch(2, minor)) == text
    assert "4.00 Kb" in with_units_before_2_8(LEGACY_CUDA_TABLE) and " 0 b " in with_units_before_2_8(
        LEGACY_CUDA_TABLE
    )
    header_line, rule = LEGACY_CUDA_TABLE.splitlines()[1], LEGACY_CUDA_TABLE.splitlines()[0]
    assert len(header_line) == len(rule) + 2  # "CUDA time avg" and "Self CUDA Mem" overflow by one each


@pytest.mark.parametrize("use_device", ["cuda", "xpu", "privateuseone", "mtia"])
@pytest.mark.parametrize("builder", [legacy_device_events, kineto_device_events])
@pytest.mark.parametrize("options", OPTION_SETS, ids=str)
def test_device_events_match_torch(use_device: str, builder: Any, options: dict[str, Any]) -> None:
    events = builder(use_device)
    for flags in FLAG_SETS:
        ours = assert_same(events, **flags, **options)
        assert f"Self {use_device.upper()} time total: " in ours
    assert_same(torch_key_averages(events), **flags_of(events), **options)


def test_xpu_device_time_before_2_11_is_not_torchs_assertion() -> None:
    events = kineto_device_events("xpu")
    ours = build_table(ours_input(events))
    assert ours.endswith("Self XPU time total: 30.000us\n")
    if XPU_AS_TORCH:
        assert _build_table(events) == ours
    else:
        with pytest.raises(AssertionError):
            _build_table(events)
        assert _build_table(relabelled(events, DeviceType.XPU, DeviceType.CUDA)) == ours


def test_no_overload_column_before_2_7() -> None:
    events = [synthetic_avg("aten::add", overload_name="Tensor"), synthetic_avg("aten::mm", overload_name="")]
    assert "Overload Name" not in build_table(events, rules=PostProcessingRules.for_torch(2, 6))
    assert "Overload Name" in build_table(events, rules=PostProcessingRules.for_torch(2, 7))
    assert build_table(events) == _build_table(events)  # torch 2.6 ignores the attribute too
    assert ("Overload Name" in build_table(events)) == RULES.overload_names


def test_time_unit_works_on_every_release(plain_prof: torch.profiler.profile) -> None:
    averages = plain_prof.key_averages()
    ours = build_table(averages, time_unit="ms")
    assert "Self CPU time total: " in ours and ours.splitlines()[-1].endswith("ms")
    if TORCH_TIME_UNIT:
        assert _build_table(averages, time_unit="ms") == ours
    else:
        with pytest.raises(TypeError, match="time_unit"):
            _build_table(averages, time_unit="ms")


def test_rules_must_be_rules(plain_prof: torch.profiler.profile) -> None:
    with pytest.raises(TypeError, match="PostProcessingRules"):
        build_table(plain_prof.key_averages(), rules="2.6")  # type: ignore[arg-type]


def test_xpu_headers_and_footer() -> None:
    ours = build_table(legacy_device_events("xpu"), profile_memory=True, with_flops=True)
    for text in ("Self XPU", "Self XPU %", "XPU total", "XPU time avg", "XPU Mem", "Self XPU Mem"):
        assert text in ours
    assert ours.endswith("Self XPU time total: 90.000us\n")


def test_kineto_device_total_skips_cpu_ops_and_annotations() -> None:
    ours = build_table(kineto_device_events("cuda"))
    # only the kernel (30us) counts: the CPU op's share is 100%, the annotation's 40/30
    assert "100.00%" in ours and "133.33%" in ours
    assert ours.endswith("Self CUDA time total: 30.000us\n")


def test_device_time_without_use_device_raises_like_torch() -> None:
    avg = FunctionEventAvg()
    avg.add(FunctionEvent(id=0, name="op", thread=0, start_us=0, end_us=5, stack=[]))
    avg.self_device_time_total = 3.0
    for render in (build_table, _build_table):
        with pytest.raises(RuntimeError, match="use_device is None, but there is device performance data"):
            render([avg])


# ---------------------------------------------------------------- torch quirks we keep


def synthetic_avg(key: str, **fields: Any) -> FunctionEventAvg:
    avg = FunctionEventAvg()
    avg.add(FunctionEvent(id=0, name=key, thread=0, start_us=0, end_us=10, stack=[]))
    for name, value in fields.items():
        setattr(avg, name, value)
    return avg


def test_name_exactly_width_minus_three_gets_dots_appended() -> None:
    events = [synthetic_avg("aten::sum"), synthetic_avg("aten::mm"), synthetic_avg("aten::clamp_min")]
    ours = assert_same(events, max_name_column_width=12)
    assert "aten::sum..." in ours and "    aten::mm" in ours and "aten::cla..." in ours


def test_nan_share_when_all_times_are_zero() -> None:
    events = [synthetic_avg("a", cpu_time_total=0, self_cpu_time_total=0)]
    ours = assert_same(events)
    assert "NaN" in ours


def test_flops_unit_follows_smallest_positive_count() -> None:
    events = [synthetic_avg("mm", flops=12_582_912), synthetic_avg("add", flops=3)]
    assert "Total FLOPs" in assert_same(events, with_flops=True)
    assert "Total MFLOPs" in assert_same(events[:1], with_flops=True)
    no_flops = assert_same([synthetic_avg("add", flops=0)], with_flops=True)
    assert "FLOPs" not in no_flops


def test_totals_are_summed_in_display_order() -> None:
    # input order sums to 0 (1e16 + 1 rounds to 1e16); torch sums after sorting: 1e16 - 1e16 + 1 = 1
    events = [
        synthetic_avg("big", self_cpu_time_total=1e16, cpu_time_total=1e16, count=3),
        synthetic_avg("one", self_cpu_time_total=1.0, cpu_time_total=1.0, count=1),
        synthetic_avg("minus", self_cpu_time_total=-1e16, cpu_time_total=1.0, count=2),
    ]
    ours = assert_same(events, sort_by="count")
    assert ours.endswith("Self CPU time total: 1.000us\n")
    # the device total too (legacy CPU events count)
    for evt, device_time in zip(events, (1e16, 1.0, -1e16), strict=True):
        evt.use_device, evt.is_legacy, evt.self_device_time_total = "cuda", True, device_time
    assert assert_same(events, sort_by="count").endswith("Self CUDA time total: 1.000us\n")


def test_async_events_print_zero_cpu_total_share() -> None:
    events = [
        synthetic_avg("a", is_async=True, cpu_time_total=7.0, self_cpu_time_total=0),
        synthetic_avg("b"),
    ]
    ours = assert_same(events)
    assert re.search(r"\s0  ", ours.splitlines()[3])


# ---------------------------------------------------------------- deliberate differences


def test_difference_1_none_flops_count_as_zero(full_prof: torch.profiler.profile) -> None:
    events = full_prof.events()
    assert any(evt.flops is None for evt in events), "workload must produce [memory] events"
    with pytest.raises(TypeError):
        _build_table(events, with_flops=True, profile_memory=True)
    ours = build_table(events, with_flops=True, profile_memory=True, sort_by="cpu_time_total", row_limit=-1)
    expected = _build_table(
        without_none_flops(events),
        with_flops=True,
        profile_memory=True,
        sort_by="cpu_time_total",
        row_limit=-1,
    )
    assert ours == expected
    memory_rows = [line for line in ours.splitlines() if line.strip().startswith("[memory]")]
    assert memory_rows and all(line.rstrip().endswith("--") for line in memory_rows)


def test_difference_2_stack_and_flops_each_under_own_header(stack_prof: torch.profiler.profile) -> None:
    averages = stack_prof.key_averages(group_by_stack_n=2)
    options = {"sort_by": "cpu_time_total", "row_limit": -1, "max_src_column_width": 50}
    ours = build_table(averages, with_flops=True, **options).splitlines()
    swapped = _build_table(averages, with_flops=True, **options).splitlines()
    correct_without_flops = _build_table(averages, with_flops=False, **options).splitlines()

    # same headers, in torch's order
    assert ours[:3] == swapped[:3]
    assert ours[1].split()[-4:] == ["Source", "Location", "Total", swapped[1].split()[-1]]
    src_start, src_end = column_spans(swapped[0])[-2]
    flops_cell = 12 + 2
    body = range(3, len(ours) - 2)  # between the header block and the closing rule + footer
    assert len(ours) == len(swapped) == len(correct_without_flops)
    for i in body:
        # everything up to the FLOPs column is torch's table without FLOPs: stacks under Source Location
        assert ours[i][:-flops_cell] == correct_without_flops[i]
        # the FLOPs column holds what torch misplaced under Source Location
        misplaced_flops = swapped[i][src_start:src_end].strip()
        assert ours[i][-flops_cell:] == format(misplaced_flops, ">12") + "  "
    assert any(ours[i][-flops_cell:].strip() not in ("", "--") for i in body), "workload must have FLOPs"
    assert ours != swapped


def test_difference_3_unknown_sort_key(plain_prof: torch.profiler.profile) -> None:
    averages = plain_prof.key_averages()
    with pytest.raises(AttributeError):
        averages.table(sort_by="cpu_tim_total")
    with pytest.raises(InvalidSortKeyError) as caught:
        build_table(averages, sort_by="cpu_tim_total")
    assert isinstance(caught.value, AttributeError) and isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert "'cpu_tim_total'" in message
    for key in VALID_SORT_KEYS:
        assert key in message
    with pytest.raises(AttributeError, match="self_device_tim_total"):  # reports the rewritten name too
        build_table(averages, sort_by="self_cuda_tim_total")
    with pytest.raises(TypeError, match="sort_by must be a str"):
        build_table(averages, sort_by=3)  # type: ignore[arg-type]


def test_difference_3_every_documented_key_sorts(plain_prof: torch.profiler.profile) -> None:
    averages = plain_prof.key_averages()
    for key in VALID_SORT_KEYS:
        assert_same(averages, sort_by=key, with_flops=True)


def test_difference_3_bad_time_unit(plain_prof: torch.profiler.profile) -> None:
    averages = plain_prof.key_averages()
    if TORCH_TIME_UNIT:
        assert averages.table(time_unit="min") == averages.table()  # torch ignores it silently
    with pytest.raises(ValueError, match=r"time_unit='min'.*'s', 'ms', 'us'"):
        build_table(averages, time_unit="min")
    with pytest.raises(ValueError, match="time_unit"):
        build_table([], time_unit="ns")


@pytest.mark.parametrize("bad", ["5", 2.0, None, True])
def test_difference_3_row_limit_must_be_int(plain_prof: torch.profiler.profile, bad: Any) -> None:
    with pytest.raises(TypeError, match="row_limit must be an int"):
        build_table(plain_prof.key_averages(), row_limit=bad)


@pytest.mark.parametrize("name", ["max_name_column_width", "max_shapes_column_width", "max_src_column_width"])
def test_difference_3_column_widths_checked(name: str) -> None:
    events = [synthetic_avg("a")]
    with pytest.raises(ValueError, match=name):
        build_table(events, **{name: -1})
    with pytest.raises(TypeError, match=name):
        build_table(events, **{name: "10"})


def test_difference_4_zero_total_with_nonzero_time() -> None:
    events = [
        synthetic_avg("a", cpu_time_total=0, self_cpu_time_total=0),
        synthetic_avg("b", cpu_time_total=5.0, self_cpu_time_total=0),
    ]
    with pytest.raises(AssertionError):
        _build_table(events)
    with pytest.raises(TimeShareError, match=r"'b'.*CPU total time 5\.0") as caught:
        build_table(events)
    assert isinstance(caught.value, AssertionError) and isinstance(caught.value, ValueError)
    # rows past row_limit are never formatted, by torch or by us
    assert_same(events, row_limit=1)


def test_difference_4_missing_overload_and_stack_read_as_empty() -> None:
    events = [
        synthetic_avg("a", overload_name="Tensor", stack=["f.py(1): f"]),
        synthetic_avg("b", overload_name=None, stack=None),
    ]
    ours = build_table(events)
    fixed = [
        synthetic_avg("a", overload_name="Tensor", stack=["f.py(1): f"]),
        synthetic_avg("b", overload_name="", stack=[]),
    ]
    assert ours == _build_table(fixed)


# ---------------------------------------------------------------- helpers vs torch


@given(
    st.one_of(
        st.floats(-1e9, 1e10, allow_nan=False),
        st.integers(-(10**10), 10**10),
        st.sampled_from([999.9995, 999999.9995, 1e3, 1e6]),
    )
)
def test_format_time_matches_torch(us: float) -> None:
    assert format_time(us) == _format_time(us)


@given(
    st.one_of(
        st.integers(-(2**42), 2**42),
        st.sampled_from([1023, 1024, 1024**2 - 1, 1024**2, 1024**3 - 1, 1024**3, -1024]),
    )
)
def test_format_memory_matches_torch(nbytes: int) -> None:
    assert format_memory(nbytes) == _format_memory(nbytes)


@given(st.floats(-1e7, 1e7, allow_nan=False), st.floats(-1e7, 1e7, allow_nan=False))
def test_format_time_share_matches_torch(t: float, total: float) -> None:
    if total == 0 and t != 0:
        with pytest.raises(TimeShareError):
            format_time_share(t, total)
    else:
        assert format_time_share(t, total) == _format_time_share(t, total)


@pytest.mark.parametrize(
    ("flops", "unit"),
    [
        (3, "FLOPs"),
        (999, "FLOPs"),
        (1000, "KFLOPs"),
        (5_308_416, "MFLOPs"),
        (2e9, "GFLOPs"),
        (1e13, "TFLOPs"),
        (1e15, "PFLOPs"),
        (1e21, "PFLOPs"),
        (0.5, "FLOPs"),
    ],
)
def test_flops_unit(flops: float, unit: str) -> None:
    scale, got = flops_unit(flops)
    assert got == unit
    assert scale == pytest.approx(
        10.0 ** (-3 * ("FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs").index(unit))
    )


@pytest.mark.parametrize("bad", [0, -5])
def test_flops_unit_rejects_non_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        flops_unit(bad)


# ---------------------------------------------------------------- random records


TIMES = st.one_of(
    st.just(0),
    st.floats(0, 5e6, allow_nan=False),
    st.integers(0, 3 * 10**6),
    st.sampled_from([999.9995, 1000.0, 999_999.9995, 1e6, 0.0004, 0.1, 0.2, 0.3, 1e16, -1e16]),
)
MEMORY = st.one_of(
    st.sampled_from(
        [
            0,
            1023,
            1024,
            -1023,
            -1024,
            1024**2 - 1,
            1024**2,
            -(1024**2),
            1024**3 - 1,
            1024**3,
            -(1024**3),
            5 * 1024**3,
        ]
    ),
    st.integers(-(2**40), 2**40),
)
FLOPS = st.one_of(
    st.just(0), st.sampled_from([1, 3, 999, 1000, 10**6, 10**15, 10**18]), st.integers(1, 10**19)
)
KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_:.<>[] #0123456789", max_size=70)
SHAPES = st.one_of(
    st.none(), st.just(""), st.just([]), st.lists(st.lists(st.integers(0, 4096), max_size=4), max_size=5)
)
STACKS = st.one_of(
    st.just([]),
    st.lists(st.text(alphabet="abc/._()0123456789: ", min_size=1, max_size=90), min_size=1, max_size=3),
)
DEVICE_TYPES = st.sampled_from(
    [DeviceType.CPU, DeviceType.CUDA, DeviceType.XPU, DeviceType.PrivateUse1, DeviceType.MTIA, DeviceType.HPU]
)
RECORD_FIELDS = (
    "key",
    "count",
    "node_id",
    "is_async",
    "use_device",
    "cpu_time_total",
    "device_time_total",
    "self_cpu_time_total",
    "self_device_time_total",
    "input_shapes",
    "overload_name",
    "stack",
    "cpu_memory_usage",
    "device_memory_usage",
    "self_cpu_memory_usage",
    "self_device_memory_usage",
    "cpu_parent",
    "device_type",
    "is_legacy",
    "flops",
    "is_user_annotation",
    "cpu_time",
    "device_time",
)


@st.composite
def record_lists(draw: st.DrawFn) -> tuple[list[FunctionEventAvg], dict[str, Any]]:
    options: dict[str, Any] = {
        "with_flops": draw(st.booleans()),
        "profile_memory": draw(st.booleans()),
        "sort_by": draw(st.one_of(st.none(), st.sampled_from(VALID_SORT_KEYS))),
        "row_limit": draw(st.sampled_from([-1, 0, 1, 3, 100])),
        "header": draw(st.sampled_from([None, "", "HEADER"])),
        # torch's table takes time_unit from 2.9 (test_time_unit_works_on_every_release)
        "time_unit": draw(st.sampled_from([None, "s", "ms", "us"] if TORCH_TIME_UNIT else [None])),
        "top_level_events_only": draw(st.booleans()),
        "max_name_column_width": draw(st.sampled_from([None, 8, 12, 30, 55])),
        "max_shapes_column_width": draw(st.sampled_from([None, 6, 80])),
        "max_src_column_width": draw(st.sampled_from([None, 10, 75])),
    }
    use_device = draw(st.sampled_from([None, "cuda", "xpu", "privateuseone"]))
    # torch misplaces stack and FLOPs cells when both columns exist (difference 2): no stacks then.
    stacks = st.just([]) if options["with_flops"] else STACKS
    with_overloads = draw(st.booleans())
    records = []
    for _ in range(draw(st.integers(1, 7))):
        avg = FunctionEventAvg()
        avg.key = draw(KEYS)
        avg.count = draw(st.integers(0, 50))
        avg.node_id = draw(st.sampled_from([-1, -1, -1, 0, 7]))
        avg.is_async = draw(st.booleans())
        avg.use_device = use_device
        avg.cpu_time_total = draw(TIMES)
        avg.self_cpu_time_total = draw(TIMES)
        avg.device_time_total = draw(TIMES)
        avg.self_device_time_total = draw(st.one_of(st.just(0), TIMES))
        avg.input_shapes = draw(SHAPES)
        avg.overload_name = draw(KEYS) if with_overloads else ""
        avg.stack = draw(stacks)
        avg.cpu_memory_usage = draw(MEMORY)
        avg.self_cpu_memory_usage = draw(MEMORY)
        avg.device_memory_usage = draw(MEMORY)
        avg.self_device_memory_usage = draw(MEMORY)
        avg.cpu_parent = draw(st.sampled_from([None, "parent"]))
        avg.device_type = draw(DEVICE_TYPES)
        avg.is_legacy = draw(st.booleans())
        avg.flops = draw(FLOPS)
        avg.is_user_annotation = draw(st.booleans())
        records.append(avg)
    return records, options


def outcome(render: Any, events: list[Any], options: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "text", render(events, **options)
    except (AssertionError, RuntimeError) as exc:
        return "error", exc


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_lists())
def test_random_records_match_torch(case: tuple[list[FunctionEventAvg], dict[str, Any]]) -> None:
    records, options = case
    options = table_method_options(options)  # time_unit is always None before torch 2.9 here
    # our input: plain namespaces with the same attributes (no torch class, no *_str helpers)
    plain = [types.SimpleNamespace(**{name: getattr(avg, name) for name in RECORD_FIELDS}) for avg in records]
    ours = outcome(build_table, plain, options)
    theirs = outcome(_build_table, torch_input(records), options)
    if theirs[0] == "error":
        assert ours[0] == "error", f"torch raised {theirs[1]!r}, we returned text"
        assert isinstance(ours[1], type(theirs[1]))
    else:
        assert ours == theirs
