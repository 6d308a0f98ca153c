"""The ``stacks`` exporter: torch's collapsed-stack text, from the same raw result.

torch's ``export_stacks`` is the oracle for real profiles (``with_stack`` plus
``_ExperimentalConfig(verbose=True)``); device metrics are checked on a
synthetic trace with kernels, where the expected lines follow from torch's
rules by hand.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from polyprof.analysis.collapsed_stacks import SUPPORTED_METRICS, metric_attribute
from polyprof.base.activity import ProfilerActivity as PA
from polyprof.base.config import ProfileConfig
from polyprof.base.events import EventKind
from polyprof.base.trace import Trace
from polyprof.runtime.torch_cpu import decode_result
from polyprof.testing import make_event_batch, make_plugin_manager_for_tests, make_trace
from polyprof_builtins import stacks as stacks_plugin
from polyprof_builtins.stacks import StacksExporter

torch = pytest.importorskip("torch")
from torch._C._profiler import _ExperimentalConfig  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402


@pytest.fixture(scope="module")
def stack_profile() -> tuple[Any, Trace]:
    torch.set_num_threads(1)
    verbose = _ExperimentalConfig(verbose=True)
    # torch's first profile imports modules whose frames it later names from freed memory.
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, experimental_config=verbose) as warm:
        torch.ones(2).add(1)
    warm.events()

    def layer(x: Any) -> Any:
        return torch.relu(x @ x)

    def model(x: Any) -> Any:
        with record_function("block; with spaces\tand tabs"):
            return layer(layer(x)).sum()

    x = torch.randn(32, 32, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, experimental_config=verbose) as prof:
        model(x).backward()
    config = ProfileConfig(activities={PA.CPU}, with_stack=True, verbose=True)
    batch, facts = decode_result(prof.profiler.kineto_results, config)
    # torch names some frames from memory its raw result does not own; let it parse before that
    # memory is reused (the trees built below are garbage once a test has used them).
    prof.events()
    trace = Trace(
        events=batch, config=config, start_ns=facts["start_ns"], end_ns=facts["start_ns"], pid=os.getpid()
    )
    return prof, trace


def test_plugin_makes_the_stacks_exporter() -> None:
    pm = make_plugin_manager_for_tests(stacks_plugin)
    exporter = pm.make_exporter(ProfileConfig(activities={PA.CPU}), "stacks")
    assert isinstance(exporter, StacksExporter)
    assert exporter.suffixes == (".stacks", ".txt")
    assert stacks_plugin.polyprof_capabilities().exporters == ("stacks",)
    assert stacks_plugin.polyprof_make_exporter(ProfileConfig(activities={PA.CPU}), "chrome") is None


@pytest.mark.parametrize("metric", SUPPORTED_METRICS)
def test_export_matches_torch(stack_profile: tuple[Any, Trace], metric: str, tmp_path: Any) -> None:
    prof, trace = stack_profile
    ours, theirs = tmp_path / "ours.stacks", tmp_path / "theirs.stacks"
    assert StacksExporter().export(trace, str(ours), metric=metric) == str(ours)
    prof.export_stacks(str(theirs), metric)
    assert ours.read_text() == theirs.read_text()


def test_cpu_export_has_outermost_first_frames_and_sanitized_names(
    stack_profile: tuple[Any, Trace], tmp_path: Any
) -> None:
    _, trace = stack_profile
    path = tmp_path / "cpu.txt"
    StacksExporter().export(trace, str(path))
    lines = path.read_text().splitlines()
    assert lines
    for line in lines:
        frames, value = line.rsplit(" ", 1)
        assert int(value) > 0 and "\t" not in frames
        assert all(" " not in f for f in frames.split(";"))
    # Outermost frame first: the caller (model) comes before the callee (layer).
    nested = [
        line.rsplit(" ", 1)[0].split(";") for line in lines if "):_layer" in line and "):_model" in line
    ]
    assert nested
    for frames in nested:
        model = next(i for i, f in enumerate(frames) if f.endswith("):_model"))
        layer = next(i for i, f in enumerate(frames) if f.endswith("):_layer"))
        assert model < layer


def _device_trace(activity: PA) -> Trace:
    us = 1000
    events = [
        {
            "name": "aten::mm",
            "start_ns": 0,
            "dur_ns": 10 * us,
            "thread": 1,
            "correlation_id": 1,
            "stack": ("inner.py(2): f", "outer.py(1): <module>"),
        },
        {
            "name": "aten::relu",
            "start_ns": 20 * us,
            "dur_ns": 500,
            "thread": 1,
            "correlation_id": 2,
            "stack": ("a b.py(3): g",),
        },
        {
            "name": "gemm",
            "kind": int(EventKind.KERNEL),
            "start_ns": 12 * us,
            "dur_ns": 7 * us + 600,
            "device_type": 1 if activity == PA.CUDA else 12,
            "linked_correlation_id": 1,
        },
        {
            "name": "relu_k",
            "kind": int(EventKind.KERNEL),
            "start_ns": 22 * us,
            "dur_ns": 800,
            "device_type": 1 if activity == PA.CUDA else 12,
            "linked_correlation_id": 2,
        },
    ]
    config = ProfileConfig(activities={PA.CPU, activity}, with_stack=True)
    return make_trace(make_event_batch(events), config=config, start_ns=0)


@pytest.mark.parametrize("activity", [PA.CUDA, PA.XPU])
def test_device_metrics_read_the_launching_ops_kernel_time(activity: PA, tmp_path: Any) -> None:
    trace = _device_trace(activity)
    path = tmp_path / "dev.txt"
    for metric in ("self_cuda_time_total", "self_xpu_time_total", "self_privateuse1_time_total"):
        StacksExporter().export(trace, str(path), metric=metric)
        # 7.6 µs of kernel time -> 7; relu's 0.8 µs truncates to 0 and is left out.
        assert path.read_text() == "outer.py(1):_<module>;inner.py(2):_f 7\n"
    StacksExporter().export(trace, str(path))
    assert path.read_text() == "outer.py(1):_<module>;inner.py(2):_f 10\n"
    StacksExporter().export(trace, str(path), metric="self_cuda_time_total", use_device=None)
    assert path.read_text() == ""  # without a use_device torch reports no device time


def test_bad_metric_and_options_fail_before_writing(tmp_path: Any) -> None:
    trace = _device_trace(PA.CUDA)
    path = tmp_path / "never.txt"
    with pytest.raises(ValueError, match="self_privateuse1_time_total"):
        StacksExporter().export(trace, str(path), metric="cpu_time_total")
    with pytest.raises(TypeError, match="metric"):
        StacksExporter().export(trace, str(path), metrics="self_cpu_time_total")
    assert not path.exists()
    assert metric_attribute("self_xpu_time_total") == "self_device_time_total"


def test_export_is_atomic_and_replaces_old_content(tmp_path: Any) -> None:
    trace = _device_trace(PA.CUDA)
    path = tmp_path / "out.txt"
    path.write_text("old content\n")
    StacksExporter().export(trace, str(path))
    assert path.read_text().startswith("outer.py")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temporary file left
    with pytest.raises(OSError):
        StacksExporter().export(trace, str(tmp_path / "missing" / "out.txt"))
    assert not (tmp_path / "missing").exists()


def test_trace_without_stacks_exports_an_empty_file(tmp_path: Any) -> None:
    trace = make_trace(make_event_batch([{"name": "aten::mm", "start_ns": 0, "dur_ns": 5000}]))
    path = tmp_path / "empty.stacks"
    StacksExporter().export(trace, str(path))
    assert path.read_text() == ""
