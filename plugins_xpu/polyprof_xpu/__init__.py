"""polyprof-xpu: Intel GPU (Level Zero) tracing for polyprof through Intel PTI.

The plugin module registered in the ``polyprof`` entry-point group is
``polyprof_xpu.plugin``. This package's ``__init__`` imports nothing heavy,
so ``python -m polyprof_xpu.probe`` (the availability probe, run in a child
process) starts quickly and needs only the standard library.
"""

__version__ = "0.1.0"

#: Environment variable naming the libpti_view shared library to load.
PTI_LIBRARY_ENV = "POLYPROF_XPU_PTI_LIBRARY"
#: Environment variable naming the Level Zero loader library to probe.
ZE_LOADER_ENV = "POLYPROF_XPU_ZE_LOADER"
#: Environment variable with the size in bytes of each PTI record buffer.
BUFFER_BYTES_ENV = "POLYPROF_XPU_BUFFER_BYTES"

__all__ = ["BUFFER_BYTES_ENV", "PTI_LIBRARY_ENV", "ZE_LOADER_ENV", "__version__"]
