"""The CUPTI tracer: ProfilerActivity.CUDA through CUPTI's activity API (cupti-python).

Threads and hand-over (cupti.md §3):

* CUPTI calls the buffer callbacks from its own threads, or from the thread
  that calls ``activity_flush_all``, while holding its internal lock, and
  cupti-python runs them under the GIL. So they do nothing but hand the record
  list to ``Tracer.outbox`` (``put`` never blocks) and note its length in a
  deque (``append`` is atomic): no CUPTI, CUDA, lock or event-loop call.
* A daemon thread calls ``activity_flush_all(0)`` every ``flush_period_s``
  (about 1 s), so buffers reach the bus, which decodes them concurrently with
  the CPU tracer, while the recording runs.
* ``stop``: stop the flusher, ``torch.cuda.synchronize()`` when CUDA is
  initialised, ``activity_flush_all(FLUSH_FORCED)`` (the callbacks run on this
  thread), read the dropped-record count, disable the kinds, release the
  subscriber, close the outbox.

Accounting: records delivered to the callbacks, records decoded into the
trace and CUPTI's dropped-record count are compared at the end; any
difference is explained in ``trace_metadata()["notes"]``.

Failure policy: CUPTI trouble at ``start`` (another subscriber, a refused
call) never reaches the user's program: a warning names the cause and the
recording goes on CPU-only.
"""

from __future__ import annotations

import collections
import threading
import time
import warnings
from typing import Any

import attrs
from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity
from polyprof.components import Tracer
from polyprof.events import EventBatch
from polyprof.session import ActivityUnavailableWarning, user_stacklevel

from polyprof_cuda import cbids
from polyprof_cuda.clock import IDENTITY, ClockSync, drift_note, sample_clock
from polyprof_cuda.cupti_api import (
    BUFFER_SIZE_BYTES,
    DEVICE_KINDS,
    HOST_KINDS,
    CuptiApi,
    SubscriberConflict,
)
from polyprof_cuda.decode import DecodeStats, RecordDecoder
from polyprof_cuda.device import DeviceInfo, synchronize_all

log = get_logger(__name__)

SOURCE = "cupti"
#: Name CUPTI shows other tools ("CUPTI for polyprof-cuda").
SUBSCRIBER_NAME = "polyprof-cuda"
DEFAULT_FLUSH_PERIOD_S = 1.0


class CudaTracingUnavailableWarning(ActivityUnavailableWarning):
    """CUDA was asked for but CUPTI could not record this time; the profile is CPU-only."""


@attrs.frozen(eq=False)
class CuptiBuffer:
    """One completed CUPTI buffer: the record objects cupti-python built for it."""

    records: list


class CuptiTracer(Tracer):
    """Records kernels, memcpys, memsets, CUDA runtime/driver calls, syncs and CUPTI overhead."""

    name = SOURCE
    activities = frozenset({ProfilerActivity.CUDA})

    def __init__(
        self,
        config: Any = None,
        api: CuptiApi | None = None,
        *,
        flush_period_s: float = DEFAULT_FLUSH_PERIOD_S,
        device_info: DeviceInfo | None = None,
        synchronize: Any = synchronize_all,
    ) -> None:
        super().__init__()
        if not (isinstance(flush_period_s, (int, float)) and flush_period_s > 0):
            raise ValueError(f"flush_period_s must be a number of seconds > 0, not {flush_period_s!r}")
        self.config = config
        self.api = api if api is not None else CuptiApi()
        self.flush_period_s = float(flush_period_s)
        self.device_info = device_info if device_info is not None else DeviceInfo()
        self._synchronize = synchronize
        self._state = "idle"  # idle -> running | disabled -> idle
        self._reset()

    def _reset(self) -> None:
        self._subscriber: Any = None
        self._enabled_kinds: list[int] = []
        self._delivered: collections.deque[int] = collections.deque()
        self._stats_lock = threading.Lock()
        self._stats: list[DecodeStats] = []
        self._notes: list[str] = []
        self._dropped = 0
        self._clock: ClockSync = IDENTITY
        self._decoder: RecordDecoder | None = None
        self._flusher: threading.Thread | None = None
        self._flusher_stop = threading.Event()
        self._start_ns = self._end_ns = 0
        self._device_properties: list[dict] = []
        self._disabled_reason: str | None = None

    # ------------------------------------------------------------ callbacks

    def _buffer_requested(self) -> tuple[int, int]:
        # cupti-python allocates the buffer itself; (size, max records: 0 = as many as fit).
        return BUFFER_SIZE_BYTES, 0

    def _buffer_completed(self, activities: list) -> None:
        # Runs on a CUPTI thread under CUPTI's lock: hand over and return, nothing else.
        self._delivered.append(len(activities))
        self.outbox.put(CuptiBuffer(activities))

    # -------------------------------------------------------------- start

    def start(self) -> None:
        if self._state == "running":
            raise RuntimeError("the CUPTI tracer is already recording; stop it first")
        self._reset()
        self.outbox.reopen()
        self._start_ns = time.time_ns()
        try:
            self._start_cupti()
        except SubscriberConflict as conflict:
            other = f" ({conflict.other})" if conflict.other else ""
            self._disable(
                f"another CUPTI client{other} holds the CUPTI subscriber: only one may trace at a time before "
                "CUDA 13.3 with an r610+ driver (torch.profiler with CUDA keeps it for the rest of the "
                "process once it has run)"
            )
        except Exception as exc:  # noqa: BLE001 - CUPTI trouble must not end the user's program
            self._disable(self.api.classify(exc).reason)
        else:
            self._state = "running"

    def _start_cupti(self) -> None:
        api = self.api
        self._subscriber = api.subscribe(SUBSCRIBER_NAME)
        try:
            self._start_recording()
        except BaseException:
            self._release()
            raise

    def _start_recording(self) -> None:
        api = self.api
        thread_map = None
        try:
            api.set_thread_id_type_system()
        except Exception as exc:  # noqa: BLE001 - fall back to mapping pthread ids
            log.info("cupti_thread_id_type_default", reason=str(exc))
            thread_map = _pthread_to_native_ids()
            self._notes.append(
                "cuda: CUPTI records pthread ids here (ActivityThreadIdType.SYSTEM refused); API calls from "
                "threads that ended before the recording stopped keep those ids"
            )
        self._clock = sample_clock(api.get_timestamp)
        runtime_names, driver_names = api.runtime_cbids(), api.driver_cbids()
        api.register_callbacks(self._buffer_requested, self._buffer_completed)
        runtime_recorded = self._enable_kinds()
        self._filter_at_source(runtime_names, driver_names, runtime_recorded)
        api.dropped_records()  # reset CUPTI's counter: count only this recording's drops
        self._decoder = RecordDecoder(
            kinds=api.kind_values(),
            runtime_names=runtime_names,
            driver_names=driver_names,
            api_filter=cbids.ApiCallFilter.build(
                runtime_names, driver_names, runtime_recorded=runtime_recorded
            ),
            offset_ns=self._clock.offset_ns,
            thread_map=thread_map,
            sm_count=self.device_info.sm_count,
            warp_size=self.device_info.warp_size,
            source=SOURCE,
        )
        if not self._clock.realtime:
            self._notes.append(f"cuda: {self._clock.describe()}")
        self._flusher_stop.clear()
        self._flusher = threading.Thread(
            target=self._flush_periodically, name="polyprof-cupti-flush", daemon=True
        )
        self._flusher.start()

    def _enable_kinds(self) -> bool:
        """Enable the activity kinds this binding supports; True when RUNTIME is among them."""
        api = self.api
        device_enabled = False
        runtime_recorded = False
        for name in DEVICE_KINDS + HOST_KINDS:
            value = api.kind(name)
            if value is None:
                continue
            try:
                api.enable_kind(value)
            except NotImplementedError as exc:
                # cupti-python 12.x rejects RUNTIME on the Python side; DRIVER records stand in.
                log.info("cupti_kind_unsupported", kind=name, reason=str(exc))
                if name == "RUNTIME":
                    self._notes.append(
                        f"cuda: cupti-python {api.version()} cannot record CUDA runtime calls; driver calls "
                        "(cuLaunchKernel, cuMemcpy*, ...) stand in for them"
                    )
                continue
            self._enabled_kinds.append(value)
            device_enabled |= name in DEVICE_KINDS
            runtime_recorded |= name == "RUNTIME"
        if not device_enabled:
            raise RuntimeError("CUPTI accepted none of the kernel/memcpy/memset activity kinds")
        return runtime_recorded

    def _filter_at_source(self, runtime_names: dict, driver_names: dict, runtime_recorded: bool) -> None:
        """Kineto's enable-time filters: CUPTI does not even record these calls."""
        api = self.api
        chosen = [
            (api.enable_driver_cbid, c)
            for c in cbids.disabled_at_source(driver_names, cbids.DRIVER_DISABLED_AT_SOURCE)
        ]
        if runtime_recorded:
            chosen += [
                (api.enable_runtime_cbid, c)
                for c in cbids.disabled_at_source(runtime_names, cbids.RUNTIME_DISABLED_AT_SOURCE)
            ]
        for switch, cbid in chosen:
            try:
                switch(cbid, False)
            except Exception as exc:  # noqa: BLE001 - a filter is an optimisation, not a requirement
                log.debug("cupti_cbid_filter_failed", cbid=cbid, reason=str(exc))

    def _disable(self, reason: str) -> None:
        self._state = "disabled"
        self._disabled_reason = reason
        self._notes.append(f"cuda: no GPU activity recorded: {reason}")
        log.warning("cupti_tracing_off", reason=reason)
        warnings.warn(
            f"polyprof-cuda: CUDA activity is not recorded ({reason}); profiling continues CPU-only",
            CudaTracingUnavailableWarning,
            stacklevel=user_stacklevel(),
        )

    # -------------------------------------------------------------- flush

    def _flush_periodically(self) -> None:
        failures = 0
        while not self._flusher_stop.wait(self.flush_period_s):
            try:
                self.api.flush_all(False)
            except Exception:
                failures += 1
                if failures == 1:
                    log.warning("cupti_periodic_flush_failed", exc_info=True)

    def flush(self) -> None:
        """Hand completed CUPTI buffers to the outbox now (any thread but a CUPTI callback)."""
        if self._state == "running":
            self.api.flush_all(False)

    # --------------------------------------------------------------- stop

    def stop(self) -> None:
        if self._state != "running":
            self._state = "idle"
            self._end_ns = self._end_ns or time.time_ns()
            self.outbox.close()
            return
        try:
            self._stop_flusher()
            try:
                self._synchronize()
            except Exception:
                log.warning("cuda_synchronize_failed", exc_info=True)
            self._final_flush()
            self._dropped = self._read_dropped()
            stop_clock = self._sample_clock_quietly()
            if stop_clock is not None and (note := drift_note(self._clock, stop_clock)):
                self._notes.append(note)
            if self._decoder is not None and self._decoder.thread_map is not None:
                self._decoder.thread_map = {**self._decoder.thread_map, **_pthread_to_native_ids()}
            self._device_properties = self.device_info.all_properties()
        finally:
            self._release()
            self._state = "idle"
            self._end_ns = time.time_ns()
            self.outbox.close()

    def _final_flush(self) -> None:
        # A CUPTI error here must not end the user's program: what was delivered so far stays.
        try:
            self.api.flush_all(True)
        except Exception as exc:
            reason = self.api.classify(exc).reason
            log.warning("cupti_final_flush_failed", reason=reason, exc_info=True)
            self._notes.append(
                f"cuda: the final CUPTI flush failed ({reason}); GPU activity of the last moments is missing"
            )
            warnings.warn(
                f"polyprof-cuda: the final CUPTI flush failed ({reason}); some GPU activity is missing",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )

    def _stop_flusher(self) -> None:
        self._flusher_stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=max(5.0, 2 * self.flush_period_s))
            if self._flusher.is_alive():
                log.warning("cupti_flusher_did_not_stop")
            self._flusher = None

    def _read_dropped(self) -> int:
        try:
            return self.api.dropped_records()
        except Exception:
            log.debug("cupti_dropped_count_failed", exc_info=True)
            return 0

    def _sample_clock_quietly(self) -> ClockSync | None:
        try:
            return sample_clock(self.api.get_timestamp)
        except Exception:  # noqa: BLE001
            return None

    def _release(self) -> None:
        """Disable what was enabled and give the subscriber back (errors logged, not raised)."""
        for kind in reversed(self._enabled_kinds):
            try:
                self.api.disable_kind(kind)
            except Exception:
                log.debug("cupti_disable_failed", kind=kind, exc_info=True)
        self._enabled_kinds = []
        if self._subscriber is not None:
            try:
                self.api.unsubscribe(self._subscriber)
            except Exception:
                log.debug("cupti_unsubscribe_failed", exc_info=True)
            self._subscriber = None

    def toggle_collection(self, enable: bool, activities: frozenset[ProfilerActivity]) -> None:
        """Pause or resume CUDA collection (torch's ``_toggle_collection_dynamic``)."""
        if ProfilerActivity.CUDA not in activities or self._state != "running":
            return
        switch = self.api.enable_kind if enable else self.api.disable_kind
        failed = []
        for kind in self._enabled_kinds:
            try:
                switch(kind)
            except Exception as exc:  # noqa: BLE001 - CUPTI trouble must not end the user's program
                failed.append(self.api.classify(exc).reason)
        if failed:
            action = "resume" if enable else "pause"
            log.warning("cupti_toggle_failed", enable=enable, reasons=failed)
            warnings.warn(
                f"polyprof-cuda: could not {action} CUDA collection for {len(failed)} activity kind(s) "
                f"({failed[0]})",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )

    # ------------------------------------------------------------- decode

    def decode(self, item: Any) -> list[EventBatch]:
        if not isinstance(item, CuptiBuffer):
            raise TypeError(f"the CUPTI tracer's outbox holds CuptiBuffer items, not {type(item).__name__}")
        if self._decoder is None:
            raise RuntimeError("a CUPTI buffer arrived before the tracer was started")
        if self._decoder.thread_map is not None:
            # pthread ids of threads started since the last look (they may end before stop).
            self._decoder.thread_map = {**self._decoder.thread_map, **_pthread_to_native_ids()}
        batch, stats = self._decoder.decode(item.records)
        with self._stats_lock:
            self._stats.append(stats)
        return [batch]

    # ----------------------------------------------------------- metadata

    def accounting(self) -> dict[str, Any]:
        """Records delivered by CUPTI, decoded, filtered, dropped (after ``stop`` and the bus drained)."""
        with self._stats_lock:
            stats = list(self._stats)
        ignored: dict[str, int] = {}
        for s in stats:
            for k, v in s.ignored.items():
                ignored[k] = ignored.get(k, 0) + v
        return {
            "delivered": sum(self._delivered),
            "decoded": sum(s.records for s in stats),
            "rows": sum(s.rows for s in stats),
            "filtered_api_calls": sum(s.filtered_api_calls for s in stats),
            "untimed": sum(s.untimed for s in stats),
            "ignored": ignored,
            "dropped_by_cupti": self._dropped,
        }

    def _accounting_notes(self) -> list[str]:
        acc = self.accounting()
        notes = []
        if acc["dropped_by_cupti"]:
            notes.append(
                f"cuda: CUPTI dropped {acc['dropped_by_cupti']} activity records for lack of buffer space; "
                "GPU activity is missing from this trace"
            )
        if acc["delivered"] != acc["rows"]:
            parts = []
            if acc["filtered_api_calls"]:
                parts.append(
                    f"{acc['filtered_api_calls']} runtime/driver calls left out by Kineto's default filter"
                )
            if acc["untimed"]:
                parts.append(f"{acc['untimed']} without timestamps (still running at the final flush)")
            for kind, count in sorted(acc["ignored"].items()):
                parts.append(f"{count} {kind} records not turned into events")
            lost = acc["delivered"] - acc["decoded"]
            if lost:
                parts.append(f"{lost} delivered but never decoded (see the polyprof.bus log)")
            notes.append(
                f"cuda: CUPTI delivered {acc['delivered']} records, {acc['rows']} are in the trace"
                + (f" ({'; '.join(parts)})" if parts else "")
            )
        return notes

    def trace_metadata(self) -> dict[str, Any]:
        notes = list(self._notes)
        if self._disabled_reason is None:
            notes += self._accounting_notes()
        return {
            "start_ns": self._start_ns,
            "end_ns": self._end_ns,
            "device_properties": list(self._device_properties),
            "notes": notes,
        }


def _pthread_to_native_ids() -> dict[int, int]:
    """Low 32 bits of each live Python thread's pthread id -> its OS thread id."""
    return {
        t.ident & 0xFFFFFFFF: t.native_id
        for t in threading.enumerate()
        if t.ident is not None and t.native_id is not None
    }
