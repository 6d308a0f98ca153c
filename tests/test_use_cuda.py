"""``use_cuda``, ``use_device="cuda"`` and ``use_kineto`` of the legacy and autograd profilers (issue 24/9).

torch has two ways to time CUDA behind these arguments (docs/shims.md, "CUDA time"):

* its GPU fallback, ``torch.autograd.profiler.profile(use_device="cuda")`` with
  the default ``use_kineto=False`` (and ``use_cuda=True`` on 2.6 to 2.13):
  ``ProfilerState.KINETO_GPU_FALLBACK``, a CUDA event pair around every op, read
  back as ``_KinetoEvent.cuda_elapsed_us()``; each op gets one "kernel" named
  after itself and ``is_legacy=True``. The legacy profiler
  (``torch.autograd.profiler_legacy.profile(use_cuda=True)``,
  ``ProfilerState.CUDA``) times ops the same way;
* Kineto (``use_kineto=True`` where CUPTI is available, and ``torch.profiler``):
  the real kernels, linked to their ops.

polyprof records the real kernels for every one of these spellings. Without a
GPU this file checks: torch's choice of state and its fallback post-processing
(the facts the docs state, on whichever torch runs the suite); that polyprof's
frontends give, for ``use_cuda``/``use_device="cuda"`` with or without
``use_kineto``, the kernels and device totals torch's own post-processing gives
for Kineto rows; what they ask torch's collector for; and torch's warnings and
errors where they exist on the CPU. tests/gpu compares the kernel path with
torch on hardware.
"""

from __future__ import annotations

import inspect
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.profiler as autograd_profiler  # noqa: E402
from torch._C._profiler import ProfilerActivity as TorchActivity  # noqa: E402
from torch._C._profiler import ProfilerState  # noqa: E402
from torch.autograd import profiler_legacy, profiler_util  # noqa: E402

import polyprof.legacy  # noqa: E402
from polyprof import ProfilerActivity, shim  # noqa: E402
from polyprof.base.events import DeviceType, EventKind  # noqa: E402
from polyprof.frontends.autograd_profile import KinetoRequiredError  # noqa: E402
from polyprof.testing import (  # noqa: E402
    ComponentPlugin,
    FakeTracer,
    KinetoEventStandIn,
    RawResultStandIn,
    make_event_batch,
    make_plugin_manager_for_tests,
)
from test_collector_settings import CollectorRecorder  # noqa: E402

#: torch 2.6 to 2.13 take ``use_cuda`` in torch.autograd.profiler.profile; 2.14 removed it.
AUTOGRAD_HAS_USE_CUDA = "use_cuda" in inspect.signature(autograd_profiler.profile).parameters
US = 1000

# ---------------------------------------------------------------- one workload, three ways to see it
#
# A user range around two ops, each of which launches one kernel. Times in ns from the trace start.

OPS = [
    # name, activity type, kind, start, end, correlation id
    ("step", "user_annotation", EventKind.USER_ANNOTATION, 1 * US, 100 * US, 1),
    ("aten::mm", "cpu_op", EventKind.CPU_OP, 2 * US, 30 * US, 2),
    ("aten::relu", "cpu_op", EventKind.CPU_OP, 40 * US, 60 * US, 3),
]
KERNELS = [
    # name, start, end, the op that launched it
    ("gemm_kernel", 5 * US, 25 * US, 2),
    ("relu_kernel", 45 * US, 47 * US, 3),
]
#: What torch's fallback measured for each op: µs between its two CUDA events (whole µs, as
#: ``cuda_elapsed_us()`` truncates them); the range's span holds both ops' spans and the gaps.
FALLBACK_US = {"step": 90, "aten::mm": 25, "aten::relu": 12}
TRACE_START = 500


class FallbackEventStandIn(KinetoEventStandIn):
    """A ``_KinetoEvent`` recorded under ``KINETO_GPU_FALLBACK``: its CUDA events' elapsed µs."""

    def __init__(self, *args: Any, cuda_us: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cuda_us = cuda_us

    def cuda_elapsed_us(self) -> int:
        return self._cuda_us


def _host_stand_ins(*, fallback: bool) -> list[Any]:
    out = []
    for name, activity, _kind, start, end, corr in OPS:
        args = (name, activity, 0, 0, TRACE_START + start, TRACE_START + end, corr, 0, 0)
        out.append(
            FallbackEventStandIn(*args, cuda_us=FALLBACK_US[name]) if fallback else KinetoEventStandIn(*args)
        )
    return out


def _kernel_stand_ins() -> list[Any]:
    return [
        KinetoEventStandIn(name, "kernel", 1, 0, TRACE_START + start, TRACE_START + end, 100 + i, corr, 7)
        for i, (name, start, end, corr) in enumerate(KERNELS)
    ]


def torch_function_events(raw_events: list[Any]) -> Any:
    """torch's own ``prof.function_events`` for these raw events, read with ``use_device="cuda"``."""
    prof = autograd_profiler.profile.__new__(autograd_profiler.profile)
    prof.use_device = "cuda"
    parsed = autograd_profiler.profile._parse_kineto_results(prof, RawResultStandIn(raw_events, TRACE_START))
    events = profiler_util.EventList(parsed, use_device="cuda")
    events._build_tree()
    return events


def device_view(events: Any) -> dict[str, tuple]:
    """Per host row: its kernels' names, CUDA total and Self CUDA (µs), is_legacy."""
    return {
        evt.name: (
            [k.name for k in evt.kernels],
            evt.device_time_total,
            evt.self_device_time_total,
            evt.is_legacy,
        )
        for evt in events
        if int(evt.device_type) == DeviceType.CPU
    }


# ---------------------------------------------------------------- torch's facts, on the installed torch


def test_torch_fallback_gives_each_op_one_kernel_named_after_it() -> None:
    events = torch_function_events(_host_stand_ins(fallback=True))
    assert device_view(events) == {
        # the op's own CUDA-event span is its CUDA total; Self CUDA is what its children's spans leave
        "step": (["step"], 90, 90 - 25 - 12, True),
        "aten::mm": (["aten::mm"], 25, 25, True),
        "aten::relu": (["aten::relu"], 12, 12, True),
    }
    assert all(int(evt.device_type) == DeviceType.CPU for evt in events)  # no device rows
    table = events.key_averages().table(sort_by="cuda_time_total")
    assert "gemm_kernel" not in table and table.splitlines()[-1] == "Self CUDA time total: 90.000us"


def test_torch_kineto_rows_give_the_real_kernels() -> None:
    events = torch_function_events(_host_stand_ins(fallback=False) + _kernel_stand_ins())
    view = device_view(events)
    assert view == {
        "step": ([], 22.0, 0, False),
        "aten::mm": (["gemm_kernel"], 20.0, 20.0, False),
        "aten::relu": (["relu_kernel"], 2.0, 2.0, False),
    }


@pytest.fixture
def cuda_visible(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch believes CUDA is available (its profiles are only made, never entered)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    yield


@pytest.mark.usefixtures("cuda_visible")
@pytest.mark.parametrize("cupti", [True, False], ids=["cupti", "no-cupti"])
def test_torch_picks_the_fallback_unless_use_kineto_and_cupti(
    monkeypatch: pytest.MonkeyPatch, cupti: bool
) -> None:
    supported = {TorchActivity.CPU} | ({TorchActivity.CUDA} if cupti else set())
    monkeypatch.setattr(autograd_profiler, "_supported_activities", lambda: supported, raising=False)
    fallback = autograd_profiler.profile(use_device="cuda")
    assert fallback.profiler_kind == ProfilerState.KINETO_GPU_FALLBACK
    assert fallback.kineto_activities == {TorchActivity.CPU}  # CUPTI is not asked for
    kineto = autograd_profiler.profile(use_device="cuda", use_kineto=True)
    if cupti:
        assert kineto.profiler_kind == ProfilerState.KINETO
        assert kineto.kineto_activities == {TorchActivity.CPU, TorchActivity.CUDA}
    else:
        assert kineto.profiler_kind == ProfilerState.KINETO_GPU_FALLBACK
    if AUTOGRAD_HAS_USE_CUDA:
        with pytest.warns(FutureWarning, match="use_cuda"):
            deprecated = autograd_profiler.profile(use_cuda=True)
        assert deprecated.profiler_kind == ProfilerState.KINETO_GPU_FALLBACK
    assert profiler_legacy.profile(use_cuda=True).profiler_kind == ProfilerState.CUDA


# ---------------------------------------------------------------- polyprof: the real kernels, every spelling


class _OffsetTracer(FakeTracer):
    """Emits ``specs`` at stop, their start times counted from the moment it started."""

    def __init__(self, specs: list[dict], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.specs = specs

    def stop(self) -> None:
        base = self.start_ns or 0
        self.batches = (make_event_batch([{**s, "start_ns": base + s["start_ns"]} for s in self.specs]),)
        super().stop()


def _cuda_plugin_manager() -> Any:
    """A CPU tracer and a CUDA tracer standing in for torch's collector and polyprof-cuda."""
    host = [
        {
            "name": name,
            "kind": kind,
            "start_ns": start,
            "dur_ns": end - start,
            "thread": 1,
            "correlation_id": corr,
        }
        for name, _activity, kind, start, end, corr in OPS
    ]
    device = [
        {
            "name": name,
            "kind": EventKind.KERNEL,
            "start_ns": start,
            "dur_ns": end - start,
            "thread": 7,
            "device_type": int(DeviceType.CUDA),
            "linked_correlation_id": corr,
        }
        for name, start, end, corr in KERNELS
    ]
    plugin = ComponentPlugin(
        plugin_name="fake_cuda",
        tracers=[
            _OffsetTracer(host, name="fake_cpu"),
            _OffsetTracer(device, name="fake_cuda", activities=[ProfilerActivity.CUDA]),
        ],
    )
    return make_plugin_manager_for_tests(plugin)


SPELLINGS = {
    "legacy use_cuda": lambda pm: polyprof.legacy.profile(use_cuda=True, plugin_manager=pm),
    "legacy shim use_cuda": lambda pm: _legacy_shim()(use_cuda=True, plugin_manager=pm),
    "autograd use_device": lambda pm: shim.AutogradProfile(use_device="cuda", plugin_manager=pm),
    "autograd use_device use_kineto": lambda pm: shim.AutogradProfile(
        use_device="cuda", use_kineto=True, plugin_manager=pm
    ),
    "autograd use_cuda": lambda pm: _autograd_use_cuda(pm),
}


def _legacy_shim() -> Any:
    return shim.LegacyProfile


def _autograd_use_cuda(pm: Any) -> Any:
    if not AUTOGRAD_HAS_USE_CUDA:
        pytest.skip(f"torch {torch.__version__}'s torch.autograd.profiler.profile has no use_cuda (2.14+)")
    with pytest.warns(FutureWarning, match="use_cuda"):
        return shim.AutogradProfile(use_cuda=True, plugin_manager=pm)


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_spelling_records_the_real_kernels_as_torch_reads_kineto_rows(spelling: str) -> None:
    pm = _cuda_plugin_manager()
    try:
        with SPELLINGS[spelling](pm) as prof:
            pass
    finally:
        pm.close()
    assert prof.use_device == "cuda"
    theirs = device_view(torch_function_events(_host_stand_ins(fallback=False) + _kernel_stand_ins()))
    assert device_view(prof.function_events) == theirs
    # Kernel rows are rows too, as in torch's Kineto tables; the footer sums them once.
    table = prof.key_averages().table(sort_by="cuda_time_total")
    assert "gemm_kernel" in table and "Self CUDA" in table.splitlines()[1]
    assert table.splitlines()[-1] == "Self CUDA time total: 22.000us"


@pytest.mark.parametrize("frontend", ["legacy", "legacy shim"])
def test_legacy_export_has_host_rows_and_a_flow_per_kernel_as_torch_legacy(
    frontend: str, tmp_path: Path
) -> None:
    pm = _cuda_plugin_manager()
    cls = polyprof.legacy.profile if frontend == "legacy" else _legacy_shim()
    try:
        with cls(use_cuda=True, plugin_manager=pm) as prof:
            pass
    finally:
        pm.close()
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    # torch's legacy profile's export_chrome_trace is its function_events' (one call): the same file
    same = prof.function_events.export_chrome_trace(tmp_path / "function_events.json")
    assert Path(same).read_bytes() == Path(path).read_bytes()
    events = json.loads(Path(path).read_text())
    assert [(e["name"], e["ph"]) for e in events] == [
        ("step", "X"),
        ("aten::mm", "X"),
        ("aten::mm", "s"),
        ("aten::relu", "X"),
        ("aten::relu", "s"),
    ]
    assert {e["pid"] for e in events} == {"CPU functions"}
    assert {e["cat"] for e in events if e["ph"] == "s"} == {"cpu_to_cuda"}


@pytest.mark.parametrize("use_kineto", [False, True])
def test_the_autograd_shim_asks_the_collector_what_torch_asks_with_use_kineto(
    monkeypatch: pytest.MonkeyPatch, gpu_present: Any, use_kineto: bool
) -> None:
    """With or without use_kineto, the shim asks torch's collector for Kineto and CUDA, never the fallback."""
    recorder = CollectorRecorder(monkeypatch)

    def workload() -> None:
        torch.ones(4, 4).mm(torch.ones(4, 4)).relu()

    with autograd_profiler.profile(use_device="cuda", use_kineto=True):
        workload()
    theirs = recorder.take()
    with shim.AutogradProfile(use_device="cuda", use_kineto=use_kineto, plugin_manager=gpu_present):
        workload()
    ours = recorder.take()
    assert theirs and ours == theirs
    assert "KINETO_GPU_FALLBACK" not in repr(ours)


# ---------------------------------------------------------------- torch's warnings and errors, on the CPU


def _outcome(make: Any) -> tuple[str, list[tuple[str, str]]]:
    """What making a profile did: "ok" or the exception's type and message, and the warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            make()
        except Exception as exc:  # noqa: BLE001
            outcome = f"{type(exc).__name__}: {exc}"
        else:
            outcome = "ok"
    return outcome, [(w.category.__name__, str(w.message)) for w in caught]


REFUSED = {
    "use_cpu=False": {"use_cpu": False},
    "use_cpu=False, use_device=cuda": {"use_cpu": False, "use_device": "cuda"},
    "use_cpu=False, use_device=xpu": {"use_cpu": False, "use_device": "xpu"},
    "use_cpu=False, use_device=bogus": {"use_cpu": False, "use_device": "bogus"},
}


@pytest.mark.parametrize("flags", list(REFUSED.values()), ids=list(REFUSED))
def test_device_only_without_use_kineto_is_refused_as_torch_refuses_it(flags: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before any device is looked at: no warning first
        with pytest.raises(AssertionError) as theirs:
            autograd_profiler.profile(**flags)
        with pytest.raises(KinetoRequiredError) as ours:
            shim.AutogradProfile(**flags)
    assert str(theirs.value) == "Device-only events supported only with Kineto (use_kineto=True)"
    assert str(ours.value).startswith(str(theirs.value))
    assert str(ours.value).endswith("; pass use_kineto=True, or keep use_cpu=True")
    assert isinstance(ours.value, AssertionError) and isinstance(ours.value, ValueError)


#: What torch's autograd profile takes here (its keyword arguments differ by release).
AUTOGRAD_TAKES = set(inspect.signature(autograd_profiler.profile).parameters)
#: Arguments an enabled profile refuses or warns about; torch's with enabled=False looks at none.
CHECKED_WHEN_ENABLED = [
    {"use_device": "cuda", "use_cpu": False},
    {"use_cpu": False},
    {"use_device": "bogus"},
    {"use_cuda": True},
    {"use_cuda": True, "use_cpu": False},
    {"post_processing_timeout_s": -1.0},
    {"activity_filters": {"no such activity": {"x"}}},
    {"activity_filters": {TorchActivity.CUDA: {"kernel"}}},
    {"acc_events": "yes"},
    {"record_shapes": "yes", "with_stack": 3, "profile_memory": None},
    {"custom_trace_id_callback": "not callable"},
    {"experimental_config": "not a config"},
]


@pytest.mark.parametrize(
    "flags",
    [flags for flags in CHECKED_WHEN_ENABLED if set(flags) <= AUTOGRAD_TAKES],
    ids=repr,
)
def test_a_disabled_profile_checks_and_warns_nothing_as_in_torch(flags: dict) -> None:
    theirs = _outcome(lambda: autograd_profiler.profile(enabled=False, **flags))
    ours = _outcome(lambda: shim.AutogradProfile(enabled=False, **flags))
    assert theirs == ("ok", []) and ours == theirs
    entered = _outcome(
        lambda: shim.AutogradProfile(enabled=False, **flags).__enter__().__exit__(None, None, None)
    )
    assert entered == ("ok", [])


@pytest.mark.usefixtures("cuda_visible")  # torch's own "CUDA is not available" stays out of it
@pytest.mark.skipif(not AUTOGRAD_HAS_USE_CUDA, reason="torch 2.14+ has no use_cuda")
def test_use_cuda_warns_at_the_callers_line_as_torch_does() -> None:
    def made(cls: Any) -> tuple[str, int]:
        with pytest.warns(FutureWarning, match="`use_cuda` will be deprecated soon") as caught:
            line = sys._getframe().f_lineno + 1
            cls(use_cuda=True)
        hit = next(w for w in caught if issubclass(w.category, FutureWarning))
        return hit.filename, hit.lineno - line

    assert made(shim.AutogradProfile) == made(autograd_profiler.profile) == (__file__, 0)


@pytest.mark.skipif(AUTOGRAD_HAS_USE_CUDA, reason="torch 2.6 to 2.13 take use_cuda")
def test_use_cuda_is_refused_where_torch_removed_it() -> None:
    with pytest.raises(TypeError, match="use_cuda"):
        autograd_profiler.profile(use_cuda=True)
    with pytest.raises(TypeError, match="use_cuda"):
        shim.AutogradProfile(use_cuda=True)
    # the legacy profiler keeps it on every supported torch
    assert "use_cuda" in inspect.signature(profiler_legacy.profile).parameters
