"""The classes the shims put behind torch's profiler names (public as ``polyprof.shim.*``).

* ``TorchProfile``: ``polyprof.profile`` as ``torch.profiler.profile``.
* ``AutogradProfile`` (``polyprof.frontends.autograd_profile``): torch's
  ``torch.autograd.profiler.profile`` API, composing a ``polyprof.profile``.
* ``LegacyProfile``: ``polyprof.legacy.profile`` as
  ``torch.autograd.profiler_legacy.profile``.

Each takes the arguments the installed torch's class takes
(``polyprof.base.shim_arguments``). They are classes of their own, not polyprof's
frontends themselves, so that ``polyprof.shim.uninstall()`` can tell the
bindings the shims made from a ``from polyprof import profile`` made on
purpose. Their ``__module__`` is ``"polyprof.shim"``, the module users import
them from, so ``type(prof)`` reads ``polyprof.shim.TorchProfile``.
"""

from __future__ import annotations

from typing import Any

from polyprof.base.shim_arguments import check_torch_arguments
from polyprof.frontends.autograd_profile import AutogradProfile
from polyprof.frontends.legacy import profile as _legacy_profile
from polyprof.frontends.profiler import profile as _polyprof_profile

__all__ = ["AutogradProfile", "LegacyProfile", "TorchProfile"]

#: Where users import the shim classes from (their ``__module__``).
PUBLIC_MODULE = "polyprof.shim"


class TorchProfile(_polyprof_profile):
    """``polyprof.profile`` as ``torch.profiler.profile`` while the shims are installed.

    The same semantics and results as ``polyprof.profile``; it takes the
    arguments the installed torch's ``torch.profiler.profile`` takes (and
    refuses the others with torch's TypeError).
    """

    __module__ = PUBLIC_MODULE

    def __new__(cls, *args: Any, **kwargs: Any) -> TorchProfile:
        if cls is TorchProfile:  # a subclass's own __init__ decides what it takes
            check_torch_arguments("torch", args, kwargs)
        return super().__new__(cls)


class LegacyProfile(_legacy_profile):
    """``polyprof.legacy.profile`` as ``torch.autograd.profiler_legacy.profile`` while the shims are in place.

    Accepts IPEX's ``use_xpu`` (``polyprof.base.shim_arguments``).
    """

    __module__ = PUBLIC_MODULE

    def __new__(cls, *args: Any, **kwargs: Any) -> LegacyProfile:
        if cls is LegacyProfile:  # a subclass's own __init__ decides what it takes
            check_torch_arguments("legacy", args, kwargs)
        return super().__new__(cls)
