"""The shims, public path: ``polyprof.shim.install()`` puts polyprof behind torch's profiler names.

A public namespace in the style of ``pytest`` over ``_pytest``: it defines nothing. The shim's
install and uninstall live in ``polyprof.frontends.shim``, the classes it binds in
``polyprof.frontends.shim_classes`` and ``polyprof.frontends.autograd_profile`` (their
``__module__`` is this namespace), the errors in ``polyprof.base.errors``. Importing it imports torch.
"""

from polyprof.base.errors import ProfilerDisabledError
from polyprof.frontends.autograd_profile import AutogradProfile, KinetoRequiredError
from polyprof.frontends.shim import (
    Binding,
    TorchMissingError,
    install,
    installed,
    installed_bindings,
    shimmed,
    uninstall,
)
from polyprof.frontends.shim_classes import LegacyProfile, TorchProfile

__all__ = [
    "AutogradProfile",
    "Binding",
    "KinetoRequiredError",
    "LegacyProfile",
    "ProfilerDisabledError",
    "TorchMissingError",
    "TorchProfile",
    "install",
    "installed",
    "installed_bindings",
    "shimmed",
    "uninstall",
]
