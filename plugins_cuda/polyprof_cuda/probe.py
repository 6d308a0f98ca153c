"""Can polyprof's own CUPTI tracer (direct mode) record here? Cached per process.

The answer is ``None`` (usable) or the reason it is not, in this order of
checks: cupti-python installed; a driver (``libcuda.so.1``); a driver new
enough for this cupti-python; libcupti loadable; CUPTI initialises; at least
one CUDA device. The first two are answered in this process without importing
cupti-python (``find_spec`` and a ``dlopen`` of ``libcuda.so.1``), so a
machine without a driver pays microseconds, not the ~0.4 s import. The rest
run in a child process (``python -m polyprof_cuda.probe``): ``cupti.get_timestamp()``
loads the driver and libcupti and initialises CUDA, which must never happen in
the user's process (nor a second libcupti beside torch's). The device count
comes from the driver through cuda-bindings, which cupti-python depends on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from polyprof._log import get_logger

from polyprof_cuda.cupti_api import NO_DRIVER_REASON, CuptiApi

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
            _cached["reason"] = _probe_here_then_in_child(CuptiApi())
            log.debug("cupti_probe", reason=_cached["reason"])
        return _cached["reason"]


PROBE_TIMEOUT_S = 60.0


def _probe_here_then_in_child(api: CuptiApi) -> str | None:
    """The cheap checks here; those that load libcupti or initialise CUDA in a child process."""
    if not api.binding_installed():
        return api.classify(ModuleNotFoundError("No module named 'cupti'")).reason
    if not api.driver_present():
        return NO_DRIVER_REASON
    try:
        done = subprocess.run(
            [sys.executable, "-W", "ignore::RuntimeWarning", "-m", "polyprof_cuda.probe"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the CUPTI probe (a child process) did not finish: {exc}"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        return f"the CUPTI probe (a child process) failed with exit code {done.returncode}: {tail or 'no output'}"
    return json.loads(lines[-1])["reason"]


def forget_cached_probe() -> None:
    """Probe again on the next call (after installing a driver in a long-lived process)."""
    with _lock:
        _cached.clear()


def _probe(api: CuptiApi) -> str | None:
    if not api.binding_installed():
        return api.classify(ModuleNotFoundError("No module named 'cupti'")).reason
    if not api.driver_present():
        return NO_DRIVER_REASON
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


if __name__ == "__main__":  # the child process of _probe_here_then_in_child
    print(json.dumps({"reason": _probe(CuptiApi())}))
