"""ctypes bindings to libpti_view: the calls the tracer makes, typed once.

Only load a library here after ``polyprof_xpu.probe`` found a driver and a
device: without them PTI aborts the process at its first view call.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

from polyprof_xpu.probe import PtiVersion
from polyprof_xpu.records import PtiResult, result_name

#: ``void (*)(unsigned char** buffer, size_t* size)``
BufferRequested = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t))
#: ``void (*)(unsigned char* buffer, size_t size, size_t used)``
BufferCompleted = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)


class PtiError(RuntimeError):
    """A PTI call returned an error code."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} returned {result_name(code)}")
        self.call = call
        self.code = code


class PtiLibrary:
    """One loaded libpti_view, with typed entry points."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lib = ctypes.CDLL(path)
        u32, vp, size_t = ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t
        self._version = self._fn("ptiVersion", PtiVersion)
        self._set_callbacks = self._fn("ptiViewSetCallbacks", u32, BufferRequested, BufferCompleted)
        self._enable = self._fn("ptiViewEnable", u32, u32)
        self._disable = self._fn("ptiViewDisable", u32, u32)
        self._flush = self._fn("ptiFlushAllViews", u32)
        self.next_record = self._fn("ptiViewGetNextRecord", u32, vp, size_t, ctypes.POINTER(vp))
        self._timestamp = self._fn("ptiViewGetTimestamp", ctypes.c_uint64)
        self._api_id_name = self._fn("ptiViewGetApiIdName", u32, u32, u32, ctypes.POINTER(ctypes.c_char_p))
        # >= 0.12; without it every runtime API is traced, which is what older PTI did anyway.
        self._runtime_class = self._fn("ptiViewEnableRuntimeApiClass", u32, u32, u32, u32, optional=True)
        self._lock = threading.Lock()

    def _fn(self, name: str, restype: Any, *argtypes: Any, optional: bool = False) -> Any:
        fn = getattr(self._lib, name, None)
        if fn is None:
            if optional:
                return None
            raise AttributeError(f"{self.path} does not export {name}; is it a libpti_view library?")
        fn.restype = restype
        fn.argtypes = list(argtypes)
        return fn

    def version(self) -> tuple[int, int, int]:
        v = self._version()
        return (int(v.major), int(v.minor), int(v.patch))

    def check(self, call: str, code: int) -> None:
        if code != PtiResult.SUCCESS:
            raise PtiError(call, code)

    def set_callbacks(self, requested: Any, completed: Any) -> None:
        self.check("ptiViewSetCallbacks", self._set_callbacks(requested, completed))

    def enable(self, kind: int) -> int:
        return int(self._enable(kind))

    def disable(self, kind: int) -> int:
        return int(self._disable(kind))

    def enable_runtime_api_class(self, enable: bool, api_class: int, group: int) -> int | None:
        if self._runtime_class is None:
            return None
        return int(self._runtime_class(int(enable), api_class, group))

    def flush(self) -> int:
        return int(self._flush())

    def timestamp(self) -> int:
        return int(self._timestamp())

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one library object per process
    def api_name(self, group: int, api_id: int) -> str:
        """``ptiViewGetApiIdName``, or ``"<api group G id N>"`` when PTI does not know it."""
        name = ctypes.c_char_p()
        rc = self._api_id_name(group, api_id, ctypes.byref(name))
        if rc != PtiResult.SUCCESS or not name.value:
            return f"<api group {group} id {api_id}>"
        return name.value.decode("utf-8", "replace")


_libraries: dict[str, PtiLibrary] = {}
_libraries_lock = threading.Lock()


def load(path: str) -> PtiLibrary:
    """The process's ``PtiLibrary`` for ``path`` (PTI state is process-wide: load once)."""
    with _libraries_lock:
        lib = _libraries.get(path)
        if lib is None:
            lib = _libraries[path] = PtiLibrary(path)
        return lib
