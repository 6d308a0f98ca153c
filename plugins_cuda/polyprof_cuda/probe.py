"""Can CUPTI record here? One cheap, side-effect-free check, cached per process.

The answer is ``None`` (usable) or the reason it is not, in this order of
checks: cupti-python installed; a driver (``libcuda.so.1``); a driver new
enough for this cupti-python; libcupti loadable; CUPTI initialises; at least
one CUDA device. ``cupti.get_timestamp()`` exercises the first five (it loads
the driver and libcupti but subscribes to nothing); the device count comes
from the driver through cuda-bindings, which cupti-python depends on.
"""

from __future__ import annotations

import os
import threading

from polyprof._log import get_logger

from polyprof_cuda.cupti_api import CuptiApi

log = get_logger(__name__)

_lock = threading.Lock()
_cached: dict[str, str | None] = {}


def unavailable_reason(api: CuptiApi | None = None) -> str | None:
    """None when CUPTI activity tracing can run here, else why not.

    With ``api`` None the real cupti-python is probed once per process and the
    answer cached (drivers do not appear mid-run); an explicit ``api`` (tests)
    is probed every time.
    """
    if api is not None:
        return _probe(api)
    with _lock:
        if "reason" not in _cached:
            _cached["reason"] = _probe(CuptiApi())
            log.debug("cupti_probe", reason=_cached["reason"])
        return _cached["reason"]


def forget_cached_probe() -> None:
    """Probe again on the next call (after installing a driver in a long-lived process)."""
    with _lock:
        _cached.clear()


def _probe(api: CuptiApi) -> str | None:
    try:
        api.module  # noqa: B018 - imports cupti-python
    except ImportError as exc:
        return api.classify(ModuleNotFoundError(str(exc))).reason
    try:
        api.get_timestamp()
    except Exception as exc:  # noqa: BLE001 - classified; every failure is a reason
        return api.classify(exc).reason
    count = api.device_count()
    if count == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return f"no CUDA device visible to the driver{hint}"
    return None
