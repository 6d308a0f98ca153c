"""polyprof-xpu: Intel GPU (XPU) rows for polyprof, from torch's own Kineto collector.

The plugin module registered in the ``polyprof`` entry-point group is
``polyprof_xpu.plugin``. polyprof-xpu never loads Intel PTI itself: an XPU
build of torch records XPU through its Kineto, and polyprof decodes those rows
(docs/xpu.md says why there is no direct PTI mode).
"""

__version__ = "0.2.1"

__all__ = ["__version__"]
