"""The NVML sampler: GPU counters on their own thread, as Chrome counter tracks.

NVML is a fake module put in ``sys.modules["pynvml"]``, shaped like
nvidia-ml-py's API (``nvmlInit``, ``nvmlDeviceGetHandleByIndex``,
``nvmlDeviceGetUtilizationRates(h).gpu``, ``nvmlDeviceGetMemoryInfo(h).used``,
``nvmlDeviceGetPowerUsage`` in mW, ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``,
``nvmlShutdown``, ``NVMLError(value)``). It records the thread of every call.
Sessions run torch's real CPU tracer beside the sampler.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import types
import warnings
from typing import Any

import numpy as np
import pytest
import structlog

torch = pytest.importorskip("torch")

import polyprof  # noqa: E402
from polyprof import ProfilerActivity  # noqa: E402
from polyprof.base.activity import ProfilerActivity as Act  # noqa: E402
from polyprof.base.config import ProfileConfig  # noqa: E402
from polyprof.base.events import DeviceType, EventKind  # noqa: E402
from polyprof.formats.chrome_reader import read_chrome_trace  # noqa: E402
from polyprof.hooks.hookspecs import hookimpl  # noqa: E402
from polyprof.testing import make_plugin_manager_for_tests  # noqa: E402
from polyprof_cuda import nvml, plugin  # noqa: E402
from polyprof_cuda.nvml import INTERVAL_ENV, METRICS, DeviceInUse, NvmlSampler, NvmlUnavailableWarning  # noqa: E402

NVML_ERROR_UNKNOWN = 999
METRIC_NAMES = {m.name for m in METRICS}


class FakeNVMLError(Exception):
    """nvidia-ml-py's NVMLError: built from an error code, kept in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The slice of pynvml the sampler uses, with per-device readings; every call's thread is noted."""

    NVML_CLOCK_SM = 1

    def __init__(
        self, count: int = 2, *, fail_after: int | None = None, unsupported: tuple[str, ...] = ()
    ) -> None:
        self.count = count
        self.fail_after = fail_after
        self.unsupported = set(unsupported)
        self.calls = 0
        self.threads: set[int] = set()
        self.lookups: list[tuple[str, Any]] = []
        self.initialized = 0
        self.module = self._as_module()

    def _call(self, name: str) -> None:
        self.threads.add(threading.get_ident())
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise FakeNVMLError(NVML_ERROR_UNKNOWN)
        if name in self.unsupported:
            raise FakeNVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.threads.add(threading.get_ident())
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call("nvmlDeviceGetHandleByIndex")
        self.lookups.append(("index", index))
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._call("nvmlDeviceGetHandleByUUID")
        self.lookups.append(("uuid", uuid))
        return ("handle", uuid)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=40 + _index(handle), memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(total=80 * 2**30, free=78 * 2**30, used=(2 + _index(handle)) * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._call("nvmlDeviceGetPowerUsage")
        return 250_500 + _index(handle)  # mW

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        self._call("nvmlDeviceGetClockInfo")
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def _as_module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml")
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(module, name, getattr(self, name))
        module.NVML_CLOCK_SM = self.NVML_CLOCK_SM
        module.NVML_ERROR_NOT_SUPPORTED = nvml.NVML_ERROR_NOT_SUPPORTED
        module.NVMLError = FakeNVMLError
        return module


def _index(handle: Any) -> int:
    return handle[1] if isinstance(handle[1], int) else 0


class SamplerPlugin:
    """Hands the session a sampler on the fake NVML (CPU-only sessions: it claims no activity)."""

    def __init__(
        self, fake: FakeNvml, interval_ms: float = 10, devices: list[DeviceInUse] | None = None
    ) -> None:
        self.fake = fake
        self.interval_ms = interval_ms
        self.devices = devices
        self.samplers: list[NvmlSampler] = []

    @hookimpl
    def polyprof_make_tracers(self, config):
        sampler = NvmlSampler(
            self.fake.module, self.interval_ms, devices_in_use=lambda: self.devices, environ={}
        )
        self.samplers.append(sampler)
        return [sampler]


def profile_with(fake: FakeNvml, seconds: float = 0.15, **plugin_options: Any) -> tuple[Any, SamplerPlugin]:
    """Profile ``seconds`` of matmuls; the sampler plugin keeps the recording window it saw."""
    sampler_plugin = SamplerPlugin(fake, **plugin_options)
    pm = make_plugin_manager_for_tests(("nvml_test", sampler_plugin), builtins=True)
    x = torch.ones(64, 64)
    profiler = polyprof.profile(activities=[ProfilerActivity.CPU], plugin_manager=pm)
    before_start = time.time_ns()
    with profiler as prof:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            torch.mm(x, x)
    sampler_plugin.window = (before_start, time.time_ns())
    return prof, sampler_plugin


def counter_rows(trace: Any) -> dict[str, np.ndarray]:
    events = trace.events
    rows = np.flatnonzero(events["kind"] == EventKind.COUNTER)
    names = events.values("name")
    series = events.values("counter_series")
    return {
        "name": np.array([names[i] for i in rows]),
        "series": np.array([series[i] for i in rows]),
        "value": events["counter_value"][rows],
        "start_ns": events["start_ns"][rows],
        "pid": events["pid"][rows],
        "device_index": events["device_index"][rows],
        "device_type": events["device_type"][rows],
        "trace_only": events["trace_only"][rows],
    }


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "polyprof-nvml-sampler"]


@pytest.fixture(scope="module")
def recorded():
    fake = FakeNvml(count=2)
    prof, sampler_plugin = profile_with(fake)
    return fake, prof, sampler_plugin


# ------------------------------------------------------------------ recording


def test_samples_arrive_as_counter_rows_inside_the_recording_window(recorded):
    _, prof, sampler_plugin = recorded
    trace = prof.trace
    rows = counter_rows(trace)
    rounds = sampler_plugin.samplers[0].rounds
    # 150 ms at 10 ms: about 15 rounds; a loaded machine may run fewer, never none.
    assert rounds >= 3
    assert len(rows["name"]) == rounds * 2 * len(METRICS)
    assert set(rows["name"]) == METRIC_NAMES
    # Inside the user's start-to-stop window, and never after the trace ends: the sampler stops
    # before torch's tracer (tracers stop in order); it may start before it, as here.
    first_allowed, last_allowed = sampler_plugin.window
    assert first_allowed <= rows["start_ns"].min() and rows["start_ns"].max() <= min(
        trace.end_ns, last_allowed
    )
    assert set(rows["pid"].tolist()) == set(rows["device_index"].tolist()) == {0, 1}
    assert set(rows["device_type"].tolist()) == {int(DeviceType.CUDA)}
    assert rows["trace_only"].all()
    by_metric = {
        (name, int(pid)): set(rows["value"][(rows["name"] == name) & (rows["pid"] == pid)].tolist())
        for name in METRIC_NAMES
        for pid in (0, 1)
    }
    assert by_metric[("GPU Utilization", 1)] == {41.0}
    assert by_metric[("GPU Memory Used", 0)] == {2048.0}  # MiB
    assert by_metric[("GPU Power", 1)] == {250.501}  # W, from mW
    assert by_metric[("GPU SM Clock", 0)] == {1980.0}
    series = dict(zip(rows["name"].tolist(), rows["series"].tolist()))
    assert series == {
        "GPU Utilization": "%",
        "GPU Memory Used": "MiB",
        "GPU Power": "W",
        "GPU SM Clock": "MHz",
    }
    # Samples are spread over the 150 ms the program ran, not bunched at one end.
    assert rows["start_ns"].max() - rows["start_ns"].min() >= 100_000_000


def test_counter_rows_stay_out_of_events_and_tables(recorded):
    _, prof, _ = recorded
    keys = {e.key for e in prof.key_averages()}
    names = {e.name for e in prof.events()}
    assert "aten::mm" in keys
    assert not (keys | names) & METRIC_NAMES


def test_no_nvml_call_on_the_users_thread_and_the_thread_is_gone_after_stop(recorded):
    fake, _, _ = recorded
    assert fake.calls > 0
    assert threading.get_ident() not in fake.threads
    assert fake.initialized == 0, "nvmlShutdown balances nvmlInit"
    assert sampler_threads() == []


def test_trace_has_counter_events_that_read_back(recorded, tmp_path):
    _, prof, _ = recorded
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    counters = [e for e in doc["traceEvents"] if e.get("ph") == "C"]
    assert len(counters) == len(counter_rows(prof.trace)["name"])
    for event in counters:
        assert set(event) == {"ph", "name", "pid", "tid", "ts", "args"}
        assert event["name"] in METRIC_NAMES and event["pid"] in (0, 1) and event["tid"] == 0
        assert isinstance(event["ts"], float)
        ((series, value),) = event["args"].items()
        assert isinstance(series, str) and isinstance(value, (int, float))
    lanes = {
        (e["pid"], e["args"]["name"])
        for e in doc["traceEvents"]
        if e.get("ph") == "M" and e["name"] == "process_name"
    }
    assert {(0, "CUDA 0"), (1, "CUDA 1")} <= lanes
    original, back = counter_rows(prof.trace), counter_rows(read_chrome_trace(str(path)))
    for field in ("name", "series", "value", "start_ns", "pid", "device_index", "device_type", "trace_only"):
        assert back[field].tolist() == original[field].tolist(), field


# ------------------------------------------------------------------- failures


def test_a_failing_nvml_call_stops_the_sampler_and_the_profile_goes_on():
    fake = FakeNvml(count=1, fail_after=1 + 1 + 1 + 4 + 4 * 5)  # init, count, handle, probe, 5 rounds
    with structlog.testing.capture_logs() as logs:
        prof, sampler_plugin = profile_with(fake, seconds=0.2)
    rows = counter_rows(prof.trace)
    assert len(rows["name"]) == 5 * len(METRICS)
    assert sampler_plugin.samplers[0].rounds == 5
    assert any(
        n.startswith("nvml: GPU counters stopped during sampling after 5 sampling rounds")
        for n in prof.trace.notes
    )
    failures = [e for e in logs if e["event"] == "nvml_sampler_failed"]
    assert len(failures) == 1 and failures[0]["phase"] == "sampling"
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    assert sampler_threads() == []
    assert fake.initialized == 0


def test_nvml_init_failure_gives_no_counters_and_a_note():
    fake = FakeNvml(fail_after=0)
    prof, _ = profile_with(fake, seconds=0.02)
    assert len(counter_rows(prof.trace)["name"]) == 0
    assert any("stopped during nvmlInit" in n for n in prof.trace.notes)
    assert sampler_threads() == []


def test_a_metric_the_device_does_not_support_is_left_out():
    fake = FakeNvml(count=1, unsupported=("nvmlDeviceGetPowerUsage",))
    prof, _ = profile_with(fake, seconds=0.05)
    rows = counter_rows(prof.trace)
    assert set(rows["name"]) == METRIC_NAMES - {"GPU Power"}
    assert "nvml: GPU Power is not supported on CUDA device 0" in prof.trace.notes


def test_stop_waits_a_bounded_time_for_a_hung_nvml_call(monkeypatch):
    monkeypatch.setattr(nvml, "STOP_TIMEOUT_S", 0.05)
    release = threading.Event()
    fake = FakeNvml(count=1)
    hanging = fake.module.nvmlDeviceGetClockInfo

    def hang_after_setup(handle, clock):
        if fake.calls > 10:
            release.wait(5)
        return hanging(handle, clock)

    fake.module.nvmlDeviceGetClockInfo = hang_after_setup
    sampler = NvmlSampler(fake.module, 10, devices_in_use=lambda: None, environ={})
    sampler.start()
    time.sleep(0.05)
    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 1
    assert any("did not finish" in n for n in sampler.trace_metadata()["notes"])
    release.set()
    for thread in sampler_threads():
        thread.join(2)
    assert sampler_threads() == []


# ---------------------------------------------------------- devices and switch


def test_devices_follow_cuda_visible_devices_or_the_uuids_torch_reports():
    fake = FakeNvml(count=8)
    sampler = NvmlSampler(fake.module, 10, environ={"CUDA_VISIBLE_DEVICES": "5,GPU-1234,bogus,3"})
    reads = sampler._setup(None)
    assert {(ordinal, handle) for ordinal, _, handle in reads} == {
        (0, ("handle", 5)),
        (1, ("handle", "GPU-1234")),
    }
    fake.lookups.clear()
    reads = sampler._setup([DeviceInUse(1, "GPU-abcd")])
    assert fake.lookups == [("uuid", "GPU-abcd")]
    assert {ordinal for ordinal, _, _ in reads} == {1}
    fake.lookups.clear()
    NvmlSampler(fake.module, 10, environ={})._setup(None)
    assert fake.lookups == [("index", i) for i in range(8)]


def test_devices_in_use_is_none_until_torch_has_initialised_cuda():
    assert not torch.cuda.is_initialized()
    assert nvml.cuda_devices_in_use() is None


@pytest.mark.parametrize(
    "text, expected", [(None, None), ("", None), ("  ", None), ("100", 100.0), ("12.5", 12.5)]
)
def test_interval_switch_reads_milliseconds(text, expected):
    environ = {} if text is None else {INTERVAL_ENV: text}
    assert nvml.interval_from_environment(environ) == expected


@pytest.mark.parametrize("text", ["abc", "0", "-5", "9.5", "1e9", "nan", "inf"])
def test_interval_switch_rejects_bad_values_naming_the_valid_ones(text):
    with pytest.raises(ValueError) as err:
        nvml.interval_from_environment({INTERVAL_ENV: text})
    message = str(err.value)
    assert (
        INTERVAL_ENV in message
        and repr(text) in message
        and "from 10 to 60000" in message
        and "unset" in message
    )


@pytest.mark.parametrize("interval", [0, 5, 1e6, "100"])
def test_sampler_rejects_a_bad_interval(interval):
    with pytest.raises(ValueError, match="interval_ms must be a number of milliseconds from 10 to 60000"):
        NvmlSampler(FakeNvml().module, interval)


@pytest.fixture
def cuda_plugin_usable(monkeypatch):
    """Kineto mode with a device (a CUDA build of torch, as the plugin sees it)."""
    from polyprof_cuda import kineto, mode

    monkeypatch.setattr(mode, "current_mode", lambda: mode.CudaMode(mode.KINETO, "via torch's Kineto (test)"))
    monkeypatch.setattr(kineto, "kineto_mode_reason", lambda: None)


def test_plugin_adds_the_sampler_only_when_opted_in_and_cuda_is_recorded(cuda_plugin_usable, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml().module)
    cuda = ProfileConfig(activities={Act.CPU, Act.CUDA})
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert [t.name for t in plugin.polyprof_make_tracers(cuda)] == ["cuda_kineto"]
    monkeypatch.setenv(INTERVAL_ENV, "50")
    tracers = plugin.polyprof_make_tracers(cuda)
    assert [t.name for t in tracers] == ["cuda_kineto", "nvml"]
    assert tracers[1].interval_s == pytest.approx(0.05) and tracers[1].activities == frozenset()
    assert plugin.polyprof_make_tracers(ProfileConfig(activities={Act.CPU})) == []
    monkeypatch.setenv(INTERVAL_ENV, "fast")
    with pytest.raises(ValueError, match=INTERVAL_ENV):
        plugin.polyprof_make_tracers(cuda)


def test_plugin_warns_when_nvidia_ml_py_is_missing(cuda_plugin_usable, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    monkeypatch.setenv(INTERVAL_ENV, "100")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracers = plugin.polyprof_make_tracers(ProfileConfig(activities={Act.CPU, Act.CUDA}))
    assert [t.name for t in tracers] == ["cuda_kineto"]
    (warning,) = [w for w in caught if issubclass(w.category, NvmlUnavailableWarning)]
    assert "nvidia-ml-py is not installed" in str(warning.message) and "polyprof-cuda[nvml]" in str(
        warning.message
    )


# ------------------------------------------------------------------------ HTA


def test_hta_still_loads_a_cuda_trace_with_counters(tmp_path):
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
    from hta.trace_analysis import TraceAnalysis
    from test_cuda_hta import build_trace

    from polyprof.base.events import concat
    from polyprof.runtime.chrome_trace import ChromeTraceExporter
    from polyprof.testing import make_trace

    plain = build_trace()
    first, last = int(plain.events["start_ns"].min()), int(plain.events["start_ns"].max())
    times = np.linspace(first, last, 20).astype(np.int64).tolist()
    samples = nvml.CounterSamples(
        start_ns=[t for t in times for _ in METRICS],
        ordinal=[0] * len(times) * len(METRICS),
        metric=list(range(len(METRICS))) * len(times),
        value=[50.0, 2048.0, 250.5, 1980.0] * len(times),
    )
    with_counters = make_trace(
        concat([plain.events, nvml.counter_batch(samples)]), config=plain.config, pid=plain.pid
    )
    breakdowns = []
    for name, trace in (("plain", plain), ("counters", with_counters)):
        directory = tmp_path / name
        directory.mkdir()
        ChromeTraceExporter().export(trace, str(directory / "rank0.json"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = TraceAnalysis(trace_dir=str(directory))
        breakdowns.append(analysis.get_temporal_breakdown(visualize=False))
    doc = json.loads((tmp_path / "counters" / "rank0.json").read_text())
    assert sum(e.get("ph") == "C" for e in doc["traceEvents"]) == len(times) * len(METRICS)
    assert breakdowns[1].to_dict() == breakdowns[0].to_dict()
