"""The XPU tracer: PTI View records -> the bus, with buffers handed over, never processed, in callbacks.

PTI's callbacks are process-wide, so one ``_CallbackRouter`` owns them for the
life of the process (the ctypes thunks must outlive every PTI thread) and
routes completed buffers to the tracer that is recording. The request
callback hands out a buffer from a free list; the completed callback only
puts ``(address, valid bytes)`` in the tracer's ``Outbox``. The bus thread
walks and decodes the buffer (``decode``), then returns it to the free list.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import os
import threading
import time
import warnings
from collections import Counter
from typing import Any

import attrs
from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity
from polyprof.components import Tracer
from polyprof.config import ProfileConfig
from polyprof.events import EventBatch
from polyprof.session import ActivityUnavailableWarning, user_stacklevel, warn_activity_unavailable

from polyprof_xpu import BUFFER_BYTES_ENV
from polyprof_xpu import pti as pti_module
from polyprof_xpu import records as R
from polyprof_xpu.decode import Clock, Decoder, DeviceTable

log = get_logger(__name__)

SOURCE = "xpu_pti"
DEFAULT_BUFFER_BYTES = 4 * 1024 * 1024  # Kineto's size
#: The largest PTI 1.x record (memory copy P2P v2): smaller buffers are refused by PTI.
MIN_BUFFER_BYTES = 192
#: Offsets below this between PTI's clock and Unix-epoch ns are sampling noise (PTI's default clock is CLOCK_REALTIME).
SAME_CLOCK_TOLERANCE_NS = 1_000_000
#: ``pti_api_class`` / ``pti_api_group_id`` for Kineto's runtime API selection.
API_CLASS_GPU_OPERATION_CORE = 1
API_GROUP_ALL = 0x7FFFFFFF


def buffer_bytes_from_env(environ: Any = os.environ) -> int:
    """The PTI buffer size: ``POLYPROF_XPU_BUFFER_BYTES`` or 4 MiB; bad values are an error."""
    raw = environ.get(BUFFER_BYTES_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_BUFFER_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < MIN_BUFFER_BYTES:
        raise ValueError(
            f"{BUFFER_BYTES_ENV}={raw!r} is not valid: give a whole number of bytes >= {MIN_BUFFER_BYTES} "
            f"(the largest PTI record), e.g. {DEFAULT_BUFFER_BYTES}"
        )
    return value


@attrs.frozen
class CompletedBuffer:
    """A buffer PTI has filled: what the completed callback hands to the bus."""

    address: int
    valid_bytes: int


class BufferPool:
    """PTI record buffers: allocated by Python, lent to PTI, returned after decode."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[Any] = []
        self._lent: dict[int, Any] = {}
        self.buffer_bytes = DEFAULT_BUFFER_BYTES
        self.allocation_failures = 0

    def take(self) -> tuple[int, int]:
        """(address, size) of a free buffer, or (0, 0) when none can be had."""
        with self._lock:
            while self._free:
                buf = self._free.pop()
                if ctypes.sizeof(buf) == self.buffer_bytes:
                    break
            else:
                try:
                    buf = (ctypes.c_uint8 * self.buffer_bytes)()
                except MemoryError:
                    self.allocation_failures += 1
                    return 0, 0
            address = ctypes.addressof(buf)
            self._lent[address] = buf
            return address, ctypes.sizeof(buf)

    def give_back(self, address: int) -> None:
        with self._lock:
            buf = self._lent.pop(address, None)
            if buf is not None:
                self._free.append(buf)

    @property
    def lent(self) -> int:
        with self._lock:
            return len(self._lent)


class _CallbackRouter:
    """The process's PTI callbacks; they route buffers to the recording tracer."""

    def __init__(self) -> None:
        self.pool = BufferPool()
        self.active: XpuTracer | None = None
        self.late_buffers = 0
        self.callback_errors = 0
        # Kept alive for the life of the process: PTI may call them from its own threads at any time.
        self.requested = pti_module.BufferRequested(self._on_requested)
        self.completed = pti_module.BufferCompleted(self._on_completed)
        self.installed_in: set[str] = set()
        self._lock = threading.Lock()

    def install(self, lib: pti_module.PtiLibrary) -> None:
        with self._lock:
            if lib.path not in self.installed_in:
                lib.set_callbacks(self.requested, self.completed)
                self.installed_in.add(lib.path)

    def _on_requested(self, buffer_ptr: Any, size_ptr: Any) -> None:
        try:
            address, size = self.pool.take()
            buffer_ptr[0] = address or None
            size_ptr[0] = size
        except BaseException:  # noqa: BLE001 - never raise into C
            self.callback_errors += 1

    def _on_completed(self, address: int | None, size: int, used: int) -> None:
        try:
            if not address:
                return
            tracer = self.active
            if used == 0:
                self.pool.give_back(address)
            elif tracer is None:
                self.late_buffers += 1
                self.pool.give_back(address)
            else:
                tracer.received.append(used)  # deque.append is atomic: PTI threads may race here
                tracer.outbox.put(CompletedBuffer(address, used))
        except BaseException:  # noqa: BLE001 - never raise into C
            self.callback_errors += 1


_ROUTER: _CallbackRouter | None = None
_ROUTER_LOCK = threading.Lock()


def router() -> _CallbackRouter:
    global _ROUTER
    with _ROUTER_LOCK:
        if _ROUTER is None:
            _ROUTER = _CallbackRouter()
            atexit.register(_stop_at_exit)
        return _ROUTER


def _stop_at_exit() -> None:
    """Disable views and flush before interpreter teardown, so PTI never calls a dead thunk."""
    tracer = _ROUTER.active if _ROUTER is not None else None
    if tracer is not None:
        try:
            tracer.stop()
        except Exception:
            log.debug("xpu_stop_at_exit_failed", exc_info=True)


def sample_clock_offset(lib: pti_module.PtiLibrary, samples: int = 5) -> int:
    """Unix-epoch ns minus PTI ns, from the tightest of ``samples`` bracketed readings; 0 when within 1 ms."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        before = time.time_ns()
        pti_ns = lib.timestamp()
        after = time.time_ns()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) // 2 - pti_ns)
    assert best is not None
    offset = best[1]
    return 0 if abs(offset) < SAME_CLOCK_TOLERANCE_NS else offset


class XpuTracingUnavailableWarning(ActivityUnavailableWarning):
    """XPU was asked for, and the probe passed, but PTI refused to trace: the profile is CPU-only."""


class XpuTracer(Tracer):
    """Records XPU kernels, copies, fills, synchronization, Level Zero and SYCL API calls through PTI."""

    name = SOURCE
    activities = frozenset({ProfilerActivity.XPU})

    def __init__(self, config: ProfileConfig, finding: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.finding = finding
        self.library_path: str = finding["pti_library"]
        self.buffer_bytes = buffer_bytes_from_env()
        self._lib: pti_module.PtiLibrary | None = None
        self._version = (0, 0, 0)
        self._state = "idle"
        self._enabled: list[R.ViewKind] = []
        self._notes: list[str] = []
        self._start_ns = 0
        self._end_ns = 0
        self._decoder: Decoder | None = None
        self._devices = DeviceTable(finding.get("devices", ()))
        #: One entry per buffer PTI completed in this recording (appended from PTI's threads).
        self.received: collections.deque[int] = collections.deque()
        self.buffers_decoded = 0
        self._failed_reason: str | None = None

    @property
    def buffers_received(self) -> int:
        """Buffers PTI handed over in this recording."""
        return len(self.received)

    # ------------------------------------------------------------ lifecycle

    def prepare(self) -> None:
        if self._lib is None:
            try:
                lib = pti_module.load(self.library_path)
                version = lib.version()
                if version[:2] < R.MIN_PTI_VERSION:
                    raise RuntimeError(
                        f"Intel PTI {'.'.join(map(str, version))} at {self.library_path} is too old; "
                        "polyprof-xpu needs >= 0.11"
                    )
                router().install(lib)
            except (pti_module.PtiError, OSError, RuntimeError) as exc:
                # The probe passed, yet PTI refuses in this process: the profile goes on CPU-only.
                self._failed_reason = f"Intel PTI could not start tracing ({exc})"
            else:
                self._lib, self._version = lib, version
                self._failed_reason = None
        self._state = "prepared"

    def start(self) -> None:
        if self._state != "prepared":
            self.prepare()
        if self._failed_reason is not None:
            self.outbox.reopen()
            self._notes = [f"XPU: nothing recorded: {self._failed_reason}"]
            self._decoder = None
            self._state = "failed"
            warn_activity_unavailable(ProfilerActivity.XPU, self._failed_reason, XpuTracingUnavailableWarning)
            return
        lib = self._lib
        assert lib is not None
        r = router()
        if r.active is not None and r.active is not self:
            raise RuntimeError(
                "another polyprof XPU recording is running in this process; PTI's views are process-wide, "
                "so stop that profiler before starting this one"
            )
        self.outbox.reopen()
        r.pool.buffer_bytes = self.buffer_bytes
        self._notes = []
        self.received.clear()
        self.buffers_decoded = 0
        self._late_before = r.late_buffers
        self._alloc_fail_before = r.pool.allocation_failures
        self._devices.new_recording()
        clock = Clock(sample_clock_offset(lib))
        self._decoder = Decoder(lib.api_name, self._devices, clock, source=SOURCE)
        r.active = self
        self._start_ns = time.time_ns()
        self._enable_views(lib)
        self._state = "running"

    def _enable_views(self, lib: pti_module.PtiLibrary) -> None:
        self._enabled = []
        for kind, since in R.TRACED_KINDS.items():
            if self._version[:2] < since:
                continue
            rc = lib.enable(kind)
            if rc != R.PtiResult.SUCCESS:
                self._note(f"PTI view {kind.name} could not be enabled: {R.result_name(rc)}")
                continue
            self._enabled.append(kind)
            if kind == R.ViewKind.RUNTIME_API:
                # As Kineto: only the runtime calls that launch or move work, not every SYCL/UR call.
                lib.enable_runtime_api_class(True, API_CLASS_GPU_OPERATION_CORE, API_GROUP_ALL)
        if R.ViewKind.DEVICE_GPU_KERNEL not in self._enabled:
            warnings.warn(
                "polyprof-xpu: PTI refused the GPU kernel view; this recording has no XPU kernels "
                "(see the trace notes)",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )

    def _note(self, text: str) -> None:
        log.warning("xpu_tracer_note", note=text)
        self._notes.append(text)

    def stop(self) -> None:
        if self._state != "running":
            self.outbox.close()
            return
        lib = self._lib
        assert lib is not None
        try:
            for kind in reversed(self._enabled):
                lib.disable(kind)
            rc = lib.flush()  # completed callbacks run now, on this thread or PTI's
            if rc != R.PtiResult.SUCCESS:
                self._note(f"ptiFlushAllViews returned {R.result_name(rc)}; records may be missing")
        finally:
            r = router()
            if r.active is self:
                r.active = None
            self._end_ns = time.time_ns()
            self._state = "idle"
            self._enabled = []
            self.outbox.close()

    def flush(self) -> None:
        if self._state == "running" and self._lib is not None:
            self._lib.flush()

    def toggle_collection(self, enable: bool, activities: frozenset[ProfilerActivity]) -> None:
        """Pause or resume the PTI views without ending the recording."""
        if ProfilerActivity.XPU not in activities or self._state != "running" or self._lib is None:
            return
        if enable:
            self._enable_views(self._lib)
        else:
            for kind in reversed(self._enabled):
                self._lib.disable(kind)

    # ------------------------------------------------------------ bus thread

    def decode(self, item: Any) -> list[EventBatch]:
        if not isinstance(item, CompletedBuffer):
            raise TypeError(f"XPU tracer outbox holds {item!r}, expected a CompletedBuffer")
        assert self._decoder is not None and self._lib is not None
        try:
            batch = self._decoder.decode_buffer(self._lib.next_record, item.address, item.valid_bytes)
        finally:
            self.buffers_decoded += 1
            router().pool.give_back(item.address)
        return [batch] if batch is not None else []

    # ------------------------------------------------------------ results

    def accounting(self) -> dict[str, Any]:
        """Counts of this recording: buffers, records walked and rows emitted per PTI view kind."""
        d = self._decoder
        walked: Counter[int] = d.records_walked if d else Counter()
        emitted: Counter[int] = d.rows_emitted if d else Counter()
        return {
            "buffers_received": self.buffers_received,
            "buffers_decoded": self.buffers_decoded,
            "records_walked": {_kind_name(k): v for k, v in sorted(walked.items())},
            "rows_emitted": {_kind_name(k): v for k, v in sorted(emitted.items())},
        }

    def trace_metadata(self) -> dict[str, Any]:
        notes = list(self._notes)
        d = self._decoder
        r = router()
        if d is not None:
            walked, emitted = sum(d.records_walked.values()), sum(d.rows_emitted.values())
            if walked != emitted:
                skipped = {
                    _kind_name(k): v - d.rows_emitted.get(k, 0)
                    for k, v in d.records_walked.items()
                    if v != d.rows_emitted.get(k, 0)
                }
                notes.append(
                    f"XPU: {walked} PTI records were read but {emitted} are in the trace; not traced: "
                    + ", ".join(f"{k} x{v}" for k, v in sorted(skipped.items()))
                )
            notes.extend(f"XPU: {p}" for p in d.walk_problems)
            if d.missing_timestamps:
                notes.append(
                    "XPU: records without a start or end timestamp (PTI reported 0) were left out: "
                    + ", ".join(f"{_kind_name(k)} x{v}" for k, v in sorted(d.missing_timestamps.items()))
                )
            if self._devices.unknown:
                notes.append(
                    "XPU: records came from device(s) Level Zero did not list at probe time "
                    f"(uuid {', '.join(self._devices.unknown)}); they were numbered after the known devices"
                )
        if self.buffers_decoded != self.buffers_received:
            notes.append(
                f"XPU: {self.buffers_received - self.buffers_decoded} of {self.buffers_received} PTI buffers "
                "were not decoded; their records are missing"
            )
        late = r.late_buffers - getattr(self, "_late_before", r.late_buffers)
        if late:
            notes.append(f"XPU: {late} PTI buffer(s) arrived after the recording stopped and were dropped")
        failures = r.pool.allocation_failures - getattr(
            self, "_alloc_fail_before", r.pool.allocation_failures
        )
        if failures:
            notes.append(
                f"XPU: {failures} PTI buffer request(s) failed (out of memory); PTI dropped those records"
            )
        version = ".".join(map(str, self._version))
        return {
            "start_ns": self._start_ns,
            "end_ns": self._end_ns,
            "notes": notes,
            "device_properties": [_device_property(dev) for dev in self._devices.devices],
            "metadata_json": {"xpupti_version": f'"{version}"'},
        }


def _kind_name(value: int) -> str:
    try:
        return R.ViewKind(value).name
    except ValueError:
        return f"kind {value}"


def _device_property(device: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": int(device["index"]),
        "name": device.get("name", ""),
        "uuid": device.get("uuid", ""),
        "vendorId": device.get("vendor_id", 0),
        "deviceId": device.get("device_id", 0),
        "maxMemAllocSize": device.get("max_mem_alloc_size", 0),
        "coreClockRate": device.get("core_clock_mhz", 0),
    }
