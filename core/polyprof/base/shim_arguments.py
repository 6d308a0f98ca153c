"""The arguments the shim classes take: the installed torch's, asked of its own classes.

polyprof's frontends keep one signature (torch 2.13's); behind torch's names
(``polyprof.shim``) they take what the installed torch's class takes, and
refuse the rest with torch's ``TypeError``: no ``post_processing_timeout_s``
before torch 2.11, ``activity_filters`` from 2.12, no ``use_cuda`` in
``torch.profiler.profile`` / ``torch.autograd.profiler.profile`` from 2.14,
``_profiler_extensions`` from 2.15. Each kind of shim also takes polyprof's
``plugin_manager``, and the legacy one IPEX's ``use_xpu``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["check_torch_arguments", "remember_torch_class", "torch_class"]

#: Arguments each kind of shim takes beyond the torch class it stands in for (polyprof's own, IPEX's).
SHIM_EXTRAS: Mapping[str, frozenset[str]] = {
    "torch": frozenset({"plugin_manager"}),
    "autograd": frozenset({"plugin_manager"}),
    "legacy": frozenset({"plugin_manager", "use_xpu"}),
}
#: Where the torch class that each kind of shim stands in for lives.
TORCH_CLASS_MODULE: Mapping[str, str] = {
    "torch": "torch.profiler.profiler",
    "autograd": "torch.autograd.profiler",
    "legacy": "torch.autograd.profiler_legacy",
}

#: kind -> torch's own class, as ``polyprof.shim.install()`` found it before putting a shim there.
_remembered: dict[str, Any] = {}


def _is_polyprof(obj: Any) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return module == "polyprof" or module.startswith("polyprof.")


def remember_torch_class(kind: str, torch_cls: Any) -> None:
    """Note torch's own class for ``kind`` before a shim takes its name (``polyprof.shim`` calls it)."""
    _remembered[kind] = torch_cls


def torch_class(kind: str) -> Any:
    """The installed torch's own class behind the ``kind`` of shim; None without torch."""
    try:
        module = importlib.import_module(TORCH_CLASS_MODULE[kind])
    except ImportError:
        return None
    candidate = vars(module).get("profile")
    if candidate is None or _is_polyprof(candidate):  # the shims are installed: torch's is remembered
        return _remembered.get(kind)
    return candidate


@functools.cache
def _torch_signature(torch_cls: type) -> inspect.Signature:
    return inspect.signature(torch_cls)


def check_torch_arguments(kind: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse, with torch's TypeError, arguments the installed torch's class would refuse."""
    torch_cls = torch_class(kind)
    if torch_cls is None:
        return
    signature = _torch_signature(torch_cls)
    extras = SHIM_EXTRAS[kind]
    try:
        signature.bind(*args, **{k: v for k, v in kwargs.items() if k not in extras})
    except TypeError as exc:
        import torch

        accepted = ", ".join(p.name for p in signature.parameters.values() if not p.name.startswith("_"))
        raise TypeError(
            f"{exc}: torch {torch.__version__}'s {torch_cls.__module__}.{torch_cls.__qualname__}, which "
            f"polyprof stands in for, takes ({accepted})"
        ) from None
