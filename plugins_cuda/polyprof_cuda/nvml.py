"""GPU counters from NVML (nvidia-ml-py): utilization, memory used, power and SM clock.

Opt-in: set ``POLYPROF_CUDA_NVML_INTERVAL_MS`` to the sampling interval in
milliseconds (a number from 10 to 60000; 100 is a good start) and install the
``nvml`` extra (``pip install 'polyprof-cuda[nvml]'``). Sessions that record
``ProfilerActivity.CUDA`` then get an ``NvmlSampler`` next to the CUDA tracer,
and the Chrome trace gets one counter track per metric in each device's
process ("CUDA 0"), which Perfetto draws as "GPU Utilization %", "GPU Memory
Used MiB", "GPU Power W" and "GPU SM Clock MHz". Unset or empty: no sampler.

Threads: the user's thread only reads which devices torch uses (no NVML call)
and starts and joins the sampler thread. ``nvmlInit``, every read and
``nvmlShutdown`` run on the sampler's own daemon thread, which hands its
samples to the bus about once a second (``Outbox.put`` never blocks).

Failure policy: a metric a device does not support (NVMLError "Not Supported"
on the first read) is left out with a note; any other NVML failure is logged,
noted in the trace and ends the sampling for this recording, while the
profile goes on. ``stop`` waits at most ``STOP_TIMEOUT_S`` for the thread.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import numpy as np

from polyprof.plugin import (
    ActivityUnavailableWarning,
    DeviceType,
    EventBatch,
    EventKind,
    TraceMetadata,
    Tracer,
    get_logger,
    user_stacklevel,
)

log = get_logger(__name__)

SOURCE = "nvml"
#: The opt-in switch: the sampling interval in milliseconds.
INTERVAL_ENV = "POLYPROF_CUDA_NVML_INTERVAL_MS"
#: NVML refreshes these readings no faster (utilization every 1/6 s to 1 s, by GPU), and at 1 ms with
#: 50 µs per query the sampler's GIL hand-offs slowed a GIL-bound program by 22% (bench_nvml_sampler.py).
MIN_INTERVAL_MS = 10.0
MAX_INTERVAL_MS = 60_000.0
#: How often the sampler thread hands its samples to the bus while recording.
HANDOVER_PERIOD_S = 1.0
#: ``stop`` waits this long for the sampler thread (an NVML call on a lost GPU can hang).
STOP_TIMEOUT_S = 2.0
#: NVML's error code for a query the device does not support (``NVML_ERROR_NOT_SUPPORTED``).
NVML_ERROR_NOT_SUPPORTED = 3


class NvmlUnavailableWarning(ActivityUnavailableWarning):
    """GPU counters were asked for but cannot be sampled; the profile goes on without them."""


@attrs.frozen
class CounterMetric:
    """One NVML query, drawn as one counter track per device."""

    #: Track name in the trace (the Chrome counter event's ``name``).
    name: str
    #: Series name: the key of the event's args, here the unit.
    series: str
    #: Reads the value from ``(pynvml module, device handle)``, already in ``series`` units.
    read: Callable[[Any, Any], float]


METRICS: tuple[CounterMetric, ...] = (
    CounterMetric("GPU Utilization", "%", lambda nvml, h: nvml.nvmlDeviceGetUtilizationRates(h).gpu),
    CounterMetric("GPU Memory Used", "MiB", lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20),
    CounterMetric("GPU Power", "W", lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1000),  # mW -> W
    CounterMetric("GPU SM Clock", "MHz", lambda nvml, h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
)


def interval_from_environment(environ: Mapping[str, str] = os.environ) -> float | None:
    """The interval in ms that ``POLYPROF_CUDA_NVML_INTERVAL_MS`` asks for; None when unset or empty."""
    text = environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return None
    try:
        interval_ms = float(text)
    except ValueError:
        interval_ms = float("nan")
    if not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:  # NaN fails too
        raise ValueError(
            f"{INTERVAL_ENV}={text!r} is not a sampling interval: set it to a number of milliseconds from "
            f"{MIN_INTERVAL_MS:g} to {MAX_INTERVAL_MS:g} (e.g. 100) to sample GPU counters with NVML, or "
            "leave it unset or empty for no sampler"
        )
    return interval_ms


@attrs.frozen
class DeviceInUse:
    """A CUDA device to sample: its ordinal in this process (the trace lane) and NVML UUID if known."""

    ordinal: int
    uuid: str | None = None


def cuda_devices_in_use() -> list[DeviceInUse] | None:
    """The devices on which torch has a CUDA context; None when torch has not initialised CUDA.

    Never initialises CUDA (and makes no NVML call): it asks only when torch
    already did, and says None otherwise, so the sampler takes every visible device.
    """
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        if has_context is None:  # every torch polyprof supports has it; the current device is per thread
            return None
        ordinals = [i for i in range(torch.cuda.device_count()) if has_context(i)]
        devices = []
        for ordinal in ordinals:
            uuid = getattr(torch.cuda.get_device_properties(ordinal), "uuid", None)
            devices.append(DeviceInUse(ordinal, f"GPU-{uuid}" if uuid is not None else None))
        return devices
    except Exception:  # a broken CUDA setup: fall back to the visible devices
        log.debug("nvml_devices_in_use_unknown", exc_info=True)
        return None


def visible_device_entries(environ: Mapping[str, str] = os.environ) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it (up to the first invalid entry); None when unset."""
    text = environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    entries = []
    for entry in (e.strip() for e in text.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return entries


def _nvml_handle(nvml: Any, device: DeviceInUse, visible: list[str] | None) -> Any:
    """The NVML handle of a CUDA device: by its UUID, else through ``CUDA_VISIBLE_DEVICES``."""
    if device.uuid is not None:
        return nvml.nvmlDeviceGetHandleByUUID(device.uuid)
    entry = str(device.ordinal) if visible is None else visible[device.ordinal]
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    return nvml.nvmlDeviceGetHandleByUUID(entry)


@attrs.frozen(eq=False)
class CounterSamples:
    """Samples the sampler thread hands to the bus: parallel lists, one entry per value read."""

    start_ns: list[int]
    ordinal: list[int]
    metric: list[int]
    value: list[float]


def counter_batch(samples: CounterSamples, source: str = SOURCE) -> EventBatch:
    """``COUNTER`` rows (trace only) of ``samples`` on CUDA device lanes."""
    n = len(samples.start_ns)
    ordinal = np.asarray(samples.ordinal, dtype=np.int64)
    metric = np.asarray(samples.metric, dtype=np.int32)
    columns = {
        "kind": np.full(n, int(EventKind.COUNTER), dtype=np.int8),
        "name": metric,
        "counter_series": metric,
        "counter_value": np.asarray(samples.value, dtype=np.float64),
        "start_ns": np.asarray(samples.start_ns, dtype=np.int64),
        "dur_ns": np.zeros(n, dtype=np.int64),
        "pid": ordinal,
        "tid": np.zeros(n, dtype=np.int64),
        "device_type": np.full(n, int(DeviceType.CUDA), dtype=np.int8),
        "device_index": ordinal,
        "trace_only": np.ones(n, dtype=bool),
    }
    tables = {"name": [m.name for m in METRICS], "counter_series": [m.series for m in METRICS]}
    return EventBatch.build(source, columns, tables)


def _is_not_supported(exc: BaseException) -> bool:
    return getattr(exc, "value", None) == NVML_ERROR_NOT_SUPPORTED


class NvmlSampler(Tracer):
    """Samples ``METRICS`` of the CUDA devices in use every ``interval_ms`` on its own thread.

    Records no torch activity (``activities`` is empty): it adds counter rows
    beside the device tracer's rows and never pauses with ``toggle_collection``.
    """

    name = SOURCE
    activities = frozenset()

    def __init__(
        self,
        nvml: Any,
        interval_ms: float,
        *,
        devices_in_use: Callable[[], list[DeviceInUse] | None] = cuda_devices_in_use,
        environ: Mapping[str, str] = os.environ,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__()
        if not (isinstance(interval_ms, (int, float)) and MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS):
            raise ValueError(
                f"interval_ms must be a number of milliseconds from {MIN_INTERVAL_MS:g} to "
                f"{MAX_INTERVAL_MS:g}, not {interval_ms!r}"
            )
        self.nvml = nvml
        self.interval_s = interval_ms / 1000
        self._devices_in_use = devices_in_use
        self._environ = environ
        self._clock_ns = clock_ns
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._notes: list[str] = []
        #: Sampling rounds completed in the current (or last) recording.
        self.rounds = 0

    # ---------------------------------------------------------- user's thread

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the NVML sampler is already recording; stop it first")
        self.outbox.reopen()
        self._notes = []
        self.rounds = 0
        self._stop.clear()
        # All of the set-up (asking torch which devices it uses, nvmlInit, the handles) runs on
        # the sampler's thread: the profile's start on the user's thread only starts it.
        self._thread = threading.Thread(target=self._run, name="polyprof-nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                log.warning("nvml_sampler_stop_timed_out", timeout_s=STOP_TIMEOUT_S)
                self._notes.append(
                    f"nvml: the sampler thread did not finish within {STOP_TIMEOUT_S:g} s (an NVML call "
                    "hangs); the counters end at its last hand-over"
                )
        self.outbox.close()

    def trace_metadata(self) -> TraceMetadata:
        return {"notes": list(self._notes)}

    # -------------------------------------------------------- sampler thread

    def _run(self) -> None:
        nvml = self.nvml
        devices = self._devices_in_use()
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - no GPU counters, the profile goes on
            self._fail("nvmlInit", exc)
            return
        try:
            reads = self._setup(devices)
            if reads:
                self._sample(reads)
        except Exception as exc:  # noqa: BLE001 - setup failed: no GPU counters this time
            self._fail("setup", exc)
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:  # nothing left to do about it
                log.warning("nvml_shutdown_failed", exc_info=True)

    def _setup(self, devices: list[DeviceInUse] | None) -> list[tuple[int, int, Any]]:
        """(ordinal, metric index, handle) of every supported metric of every device to sample."""
        nvml = self.nvml
        visible = visible_device_entries(self._environ)
        if devices is None:
            count = nvml.nvmlDeviceGetCount() if visible is None else len(visible)
            devices = [DeviceInUse(i) for i in range(count)]
        reads = []
        for device in devices:
            handle = _nvml_handle(nvml, device, visible)
            for index, metric in enumerate(METRICS):
                try:
                    metric.read(nvml, handle)
                except Exception as exc:
                    if not _is_not_supported(exc):
                        raise
                    self._notes.append(
                        f"nvml: {metric.name} is not supported on CUDA device {device.ordinal}"
                    )
                    continue
                reads.append((device.ordinal, index, handle))
        if not reads:
            self._notes.append("nvml: no device to sample (none visible, or no metric supported)")
        log.debug("nvml_sampler_started", devices=[d.ordinal for d in devices], series=len(reads))
        return reads

    def _sample(self, reads: list[tuple[int, int, Any]]) -> None:
        nvml, clock_ns, stop = self.nvml, self._clock_ns, self._stop
        period = self.interval_s
        chunk = CounterSamples([], [], [], [])
        next_handover = time.monotonic() + HANDOVER_PERIOD_S
        next_round = time.monotonic()
        try:
            while True:
                for ordinal, index, handle in reads:
                    value = METRICS[index].read(nvml, handle)
                    chunk.start_ns.append(clock_ns())
                    chunk.ordinal.append(ordinal)
                    chunk.metric.append(index)
                    chunk.value.append(float(value))
                self.rounds += 1
                now = time.monotonic()
                if now >= next_handover:
                    self.outbox.put(chunk)
                    chunk = CounterSamples([], [], [], [])
                    next_handover = now + HANDOVER_PERIOD_S
                # Fixed-rate schedule; a round that overran starts the next one at once.
                next_round = max(next_round + period, now)
                if stop.wait(next_round - now):
                    return
        except Exception as exc:  # noqa: BLE001 - the counters end here, the profile goes on
            self._fail("sampling", exc)
        finally:
            if chunk.start_ns:
                self.outbox.put(chunk)

    def _fail(self, phase: str, exc: BaseException) -> None:
        log.warning("nvml_sampler_failed", phase=phase, rounds=self.rounds, error=repr(exc), exc_info=exc)
        self._notes.append(
            f"nvml: GPU counters stopped during {phase} after {self.rounds} sampling rounds: {exc!r}"
        )

    # ------------------------------------------------------------ bus thread

    def decode(self, item: CounterSamples) -> Iterable[EventBatch]:
        return (counter_batch(item, self.name),)


def sampler_from_environment(environ: Mapping[str, str] = os.environ) -> NvmlSampler | None:
    """The sampler ``POLYPROF_CUDA_NVML_INTERVAL_MS`` asks for, or None (unset, or nvidia-ml-py missing).

    Raises ``ValueError`` naming the variable when its value is not a valid interval.
    """
    interval_ms = interval_from_environment(environ)
    if interval_ms is None:
        return None
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError as exc:
        reason = f"nvidia-ml-py is not installed ({exc}); pip install 'polyprof-cuda[nvml]'"
        log.warning("nvml_sampler_unavailable", reason=reason)
        warnings.warn(
            f"polyprof-cuda: {INTERVAL_ENV} is set but GPU counters cannot be sampled: {reason}; "
            "profiling continues without them",
            NvmlUnavailableWarning,
            stacklevel=user_stacklevel(),
        )
        return None
    return NvmlSampler(nvml, interval_ms, environ=environ)


__all__ = [
    "INTERVAL_ENV",
    "METRICS",
    "CounterMetric",
    "CounterSamples",
    "DeviceInUse",
    "NvmlSampler",
    "NvmlUnavailableWarning",
    "counter_batch",
    "cuda_devices_in_use",
    "interval_from_environment",
    "sampler_from_environment",
    "visible_device_entries",
]
