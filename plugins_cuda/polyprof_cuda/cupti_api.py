"""The one place that calls cupti-python: a thin facade the tracer talks to.

Everything CUPTI-specific the tracer needs goes through ``CuptiApi``: enabling
activity kinds, per-cbid filters, buffer callbacks, flushing, dropped-record
counts, the subscriber check and error classification. Tests drive the tracer
with a subclass that overrides these methods (no driver, no GPU), and the real
facade's no-driver behaviour is tested for real.

cupti-python is imported lazily, on first use: ``import polyprof_cuda`` works
without it, and without a driver ``import cupti`` still succeeds while every
call raises (``NotSupportedError``, a ``RuntimeError``). Real CUPTI failures
raise ``cupti.cupti.cuptiError``, which is *not* a ``RuntimeError`` and carries
``.status`` (a ``cupti.Result`` value).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs

#: Activity kinds the tracer asks for, in enable order (names of ``cupti.ActivityKind``).
DEVICE_KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMCPY2", "MEMSET")
HOST_KINDS = ("RUNTIME", "DRIVER", "SYNCHRONIZATION", "OVERHEAD")

#: ``cupti.Result`` names that mean "another CUPTI client holds the subscriber".
SUBSCRIBER_CONFLICT_RESULTS = frozenset(
    {"ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED", "ERROR_MAX_LIMIT_REACHED"}
)

#: The driver library cupti-python loads (by this soname, through the dynamic loader's search).
DRIVER_SONAME = "libcuda.so.1"
#: The reason given when there is no driver, whichever check noticed it.
NO_DRIVER_REASON = f"no NVIDIA driver ({DRIVER_SONAME} not found)"

#: Buffer size handed to CUPTI per request: Kineto uses 4 MiB ("CUPTI recommends 1 to 10 MB").
BUFFER_SIZE_BYTES = 4 * 1024 * 1024

_VERSION_SUFFIX = re.compile(r"_v\d{4,}$")


class SubscriberConflict(Exception):
    """Another CUPTI client (torch.profiler, Nsight, ...) holds the one subscriber slot."""

    def __init__(self, other: str | None, detail: str) -> None:
        super().__init__(detail)
        #: The other subscriber's name when CUPTI reports it, else None.
        self.other = other


class CuptiUnusable(Exception):
    """CUPTI cannot be used here; the message is the reason shown to the user."""


@attrs.frozen
class CuptiFailure:
    """What a cupti-python exception means, for messages and decisions."""

    #: ``cupti.Result`` name (``ERROR_NOT_INITIALIZED``), or a short label for Python-side errors.
    code: str
    #: One sentence for the user.
    reason: str


def cbid_name(raw: str) -> str:
    """Kineto's spelling of a cbid enum name: the ``_v7000`` version suffix removed."""
    return _VERSION_SUFFIX.sub("", raw)


class CuptiApi:
    """The cupti-python calls polyprof-cuda makes, on the module ``cupti.cupti``.

    Construct cheaply; ``module`` imports cupti-python on first access and
    raises ``ModuleNotFoundError`` when it is not installed.
    """

    def __init__(self) -> None:
        self._module: Any = None

    # ---------------------------------------------------------------- module

    @property
    def module(self) -> Any:
        if self._module is None:
            self._module = importlib.import_module("cupti.cupti")
        return self._module

    def binding_installed(self) -> bool:
        """True when cupti-python is installed (found without importing it)."""
        if self._module is not None:
            return True
        try:
            return importlib.util.find_spec("cupti") is not None
        except (ImportError, ValueError):
            return False

    def driver_present(self) -> bool:
        """True when the dynamic loader finds ``libcuda.so.1`` (the NVIDIA driver).

        ``dlopen`` by soname, as cupti-python does, so ``LD_LIBRARY_PATH`` and the
        loader cache count; without a driver this answers in microseconds, where
        importing cupti-python just to hear the same takes about 0.4 s.
        """
        try:
            ctypes.CDLL(DRIVER_SONAME)
        except OSError:
            return False
        return True

    def version(self) -> str:
        """cupti-python's distribution version ("13.4.0"), or "unknown"."""
        try:
            return importlib.metadata.version("cupti-python")
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    def kind(self, name: str) -> int | None:
        """The integer value of ``ActivityKind.<name>``, or None when this binding lacks it."""
        member = getattr(self.module.ActivityKind, name, None)
        return None if member is None else int(member)

    def kind_values(self) -> dict[str, int]:
        """Every ``ActivityKind`` name -> value (decoding dispatches on these)."""
        return {m.name: int(m) for m in self.module.ActivityKind}

    # ----------------------------------------------------------- cbid names

    def runtime_cbids(self) -> dict[int, str]:
        """Runtime API cbid -> name (``cudaLaunchKernel``); works without a driver."""
        return _cbid_table(self.module.runtime_api_trace_cbid)

    def driver_cbids(self) -> dict[int, str]:
        """Driver API cbid -> name (``cuLaunchKernel``); works without a driver."""
        return _cbid_table(self.module.driver_api_trace_cbid)

    # ------------------------------------------------------------- probing

    def get_timestamp(self) -> int:
        """CUPTI's current timestamp (ns); the cheapest call that needs driver and libcupti."""
        return int(self.module.get_timestamp())

    def device_count(self) -> int | None:
        """CUDA devices the driver sees, or None when that cannot be asked here."""
        try:
            from cuda.bindings import driver
        except ImportError:
            return None
        try:
            (err,) = driver.cuInit(0)
            if int(err) != 0:
                return 0
            err, count = driver.cuDeviceGetCount()
        except Exception:  # noqa: BLE001 - a probe: any failure means "cannot tell"
            return None
        return int(count) if int(err) == 0 else 0

    # -------------------------------------------------------- subscription

    def subscribe(self, name: str) -> Any:
        """Take the CUPTI subscriber slot under ``name``; ``SubscriberConflict`` when taken.

        Uses ``subscribe_v2`` (it reports the other subscriber's name) where the
        binding has it, else ``subscribe``.
        """
        mod = self.module
        callback = _no_op_callback
        if hasattr(mod, "subscribe_v2"):
            params = SubscriberParams.make(name, int(getattr(mod, "SUBSCRIBER_PARAMS_SIZE", 0)))
            try:
                return mod.subscribe_v2(callback, None, ctypes.addressof(params))
            except Exception as exc:
                failure = self.classify(exc)
                if failure.code in SUBSCRIBER_CONFLICT_RESULTS:
                    raise SubscriberConflict(params.other_name(), failure.reason) from exc
                raise
        try:
            return mod.subscribe(callback, None)
        except Exception as exc:
            failure = self.classify(exc)
            if failure.code in SUBSCRIBER_CONFLICT_RESULTS:
                raise SubscriberConflict(None, failure.reason) from exc
            raise

    def unsubscribe(self, handle: Any) -> None:
        self.module.unsubscribe(handle)

    # ------------------------------------------------------------ activity

    def set_thread_id_type_system(self) -> None:
        """Make API records carry ``gettid()`` thread ids (``ActivityThreadIdType.SYSTEM``)."""
        mod = self.module
        mod.set_thread_id_type(int(mod.ActivityThreadIdType.SYSTEM))

    def thread_id_type_is_system(self) -> bool:
        mod = self.module
        return int(mod.get_thread_id_type()) == int(mod.ActivityThreadIdType.SYSTEM)

    def register_callbacks(self, request: Callable[[], Any], complete: Callable[[list], None]) -> None:
        self.module.activity_register_callbacks(request, complete)

    def enable_kind(self, kind: int) -> None:
        self.module.activity_enable(kind)

    def disable_kind(self, kind: int) -> None:
        self.module.activity_disable(kind)

    def enable_runtime_cbid(self, cbid: int, enable: bool) -> None:
        self.module.activity_enable_runtime_api(cbid, int(enable))

    def enable_driver_cbid(self, cbid: int, enable: bool) -> None:
        self.module.activity_enable_driver_api(cbid, int(enable))

    def flush_all(self, forced: bool) -> None:
        """Deliver completed buffers now (the completion callback runs on this thread)."""
        mod = self.module
        self.module.activity_flush_all(int(mod.ActivityFlag.FLUSH_FORCED) if forced else 0)

    def dropped_records(self) -> int:
        """Records CUPTI dropped for lack of buffer space since the last call (global queue)."""
        dropped = ctypes.c_size_t(0)
        self.module.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
        return int(dropped.value)

    # -------------------------------------------------------------- errors

    def classify(self, exc: BaseException) -> CuptiFailure:
        """What a cupti-python exception means (never raises)."""
        return classify_exception(exc, self.version())


class SubscriberParams(ctypes.Structure):
    """``CUpti_SubscriberParams`` (cupti_callbacks.h), with the buffer CUPTI writes the other
    subscriber's name into; cupti-python's own wrapper cannot allocate that buffer."""

    _fields_ = (
        ("struct_size", ctypes.c_size_t),
        ("subscriber_name", ctypes.c_char_p),
        ("old_subscriber_name", ctypes.c_void_p),
        ("old_subscriber_size", ctypes.c_size_t),
        ("allow_multiple_subscribers", ctypes.c_uint8),
        ("padding", ctypes.c_uint8 * 7),
    )

    @classmethod
    def make(cls, name: str, struct_size: int = 0) -> SubscriberParams:
        params = cls()
        # CUpti_SubscriberParams_STRUCT_SIZE: offsetof(padding) + sizeof(padding), the whole struct.
        params.struct_size = struct_size or ctypes.sizeof(cls)
        params._name = ctypes.create_string_buffer(name.encode()[:_SUBSCRIBER_NAME_MAX_LEN])
        params.subscriber_name = ctypes.cast(params._name, ctypes.c_char_p)
        params._other = ctypes.create_string_buffer(_OLD_SUBSCRIBER_NAME_LEN)
        params.old_subscriber_name = ctypes.addressof(params._other)
        params.old_subscriber_size = _OLD_SUBSCRIBER_NAME_LEN
        return params

    def other_name(self) -> str | None:
        """The other subscriber's name CUPTI wrote, or None."""
        text = self._other.value.decode("utf-8", errors="replace").strip()
        return text or None


_SUBSCRIBER_NAME_MAX_LEN = 52
_OLD_SUBSCRIBER_NAME_LEN = 256


def _no_op_callback(*_args: Any) -> None:
    """The subscriber's callback: polyprof-cuda enables no callback domains."""


def _cbid_table(enum_type: Any) -> dict[int, str]:
    table: dict[int, str] = {}
    for member in enum_type:
        value = int(member)
        if value not in table and member.name not in ("INVALID", "SIZE", "FORCE_INT"):
            table[value] = cbid_name(member.name)
    return table


def _result_name(status: Any) -> str:
    try:
        from cupti import cupti as mod

        return mod.Result(int(status)).name
    except Exception:  # noqa: BLE001 - unknown status: fall back to the number
        return f"ERROR_{status}"


def classify_exception(exc: BaseException, binding_version: str = "unknown") -> CuptiFailure:
    """Map a cupti-python exception to a ``CuptiFailure`` (cupti.md §2.3's table)."""
    text = str(exc)
    status = getattr(exc, "status", None)
    if isinstance(exc, ModuleNotFoundError):
        return CuptiFailure(
            "NO_BINDING",
            "cupti-python is not installed (pip install 'polyprof-cuda[cu13]' for a CUDA 13 driver, "
            "'polyprof-cuda[cu12]' for CUDA 12)",
        )
    if status is not None and type(exc).__name__ == "cuptiError":
        name = _result_name(status)
        return CuptiFailure(
            name, _CUPTI_RESULT_REASONS.get(name, f"CUPTI failed with {name} ({int(status)})")
        )
    if isinstance(exc, NotImplementedError):
        return CuptiFailure(
            "KIND_UNSUPPORTED", f"cupti-python {binding_version} does not support this: {text}"
        )
    if isinstance(exc, RuntimeError):
        if "driver is not found" in text or ("libcuda" in text and "cannot open" in text):
            return CuptiFailure("NO_DRIVER", NO_DRIVER_REASON)
        if "or later driver is supported" in text:
            return CuptiFailure(
                "DRIVER_TOO_OLD",
                f"the NVIDIA driver is too old for cupti-python {binding_version} ({text}); "
                "update the driver or install polyprof-cuda[cu12] with a matching cupti-python",
            )
        if "libcupti" in text:
            return CuptiFailure(
                "NO_LIBCUPTI",
                f"libcupti not found ({text}); install nvidia-cuda-cupti for your CUDA version "
                "or put the CUDA toolkit's libcupti on LD_LIBRARY_PATH",
            )
    return CuptiFailure("UNEXPECTED", f"CUPTI failed: {type(exc).__name__}: {text}")


_CUPTI_RESULT_REASONS = {
    "ERROR_NOT_INITIALIZED": (
        "CUPTI could not initialise (CUPTI_ERROR_NOT_INITIALIZED): usually a driver older than the "
        "installed libcupti; update the driver or install an older cupti-python"
    ),
    "ERROR_INSUFFICIENT_PRIVILEGES": (
        "CUPTI needs permission to profile the GPU (CUPTI_ERROR_INSUFFICIENT_PRIVILEGES): run as root or "
        "set the driver option NVreg_RestrictProfilingToAdminUsers=0"
    ),
    "ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES": (
        "CUPTI is not allowed on this virtual GPU (CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES)"
    ),
    "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED": (
        "another CUPTI client already holds the subscriber (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)"
    ),
    "ERROR_MAX_LIMIT_REACHED": "another CUPTI client already holds the subscriber (CUPTI_ERROR_MAX_LIMIT_REACHED)",
    "ERROR_NO_DEVICE": "no CUDA device (CUPTI_ERROR_NO_DEVICE)",
    "ERROR_INVALID_DEVICE": "no usable CUDA device (CUPTI_ERROR_INVALID_DEVICE)",
    "ERROR_NOT_COMPATIBLE": (
        "CUPTI refused the call as incompatible (CUPTI_ERROR_NOT_COMPATIBLE): another tool uses the "
        "per-subscriber activity API in this process"
    ),
}


def names_to_cbids(table: dict[int, str], names: Iterable[str]) -> frozenset[int]:
    """The cbids whose (suffix-free) name is in ``names``."""
    wanted = set(names)
    return frozenset(cbid for cbid, name in table.items() if name in wanted)
