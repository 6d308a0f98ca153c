"""Shims: polyprof's profilers behind torch's profiler names, on request, and back out.

``install()`` rebinds, while the shims are in place:

=========================================  ==============================================
torch name                                 becomes
=========================================  ==============================================
``torch.profiler.profile``                 ``TorchProfile`` (``polyprof.profile``)
``torch.profiler.profiler.profile``        ``TorchProfile``
``torch.autograd.profiler.profile``        ``AutogradProfile`` (torch's own signature)
``torch.autograd.profiler_legacy.profile`` ``LegacyProfile`` (``polyprof.legacy.profile``,
                                           which accepts IPEX's ``use_xpu``)
=========================================  ==============================================

The shim classes live in ``polyprof.frontends.shim_classes`` (``AutogradProfile`` in
``polyprof.frontends.autograd_profile``) and are imported from here. They are distinct
objects, so ``uninstall()`` can tell a name that the shims bound from one a
user bound to ``polyprof.profile`` on purpose. ``type(prof).__module__`` is
``"polyprof.shim"``. ``TorchProfile`` subclasses ``polyprof.profile`` and
``LegacyProfile`` subclasses ``polyprof.legacy.profile``; ``AutogradProfile``
has torch's autograd profile's API and composes a ``polyprof.profile``
(no ``start``/``stop``/``step``, as in torch).

``torch.profiler.schedule``, ``tensorboard_trace_handler``, ``record_function``,
``ProfilerActivity`` and ``ProfilerAction`` are left as torch's: polyprof's
profile accepts torch's enums and schedule functions, torch's trace handler
calls ``prof.export_chrome_trace(path, use_python_export=...)`` which polyprof
has, and torch's ``record_function`` ranges are recorded by the same collector.

What else is covered, and what is not
-------------------------------------

Covered:

* Attribute access at call time: ``torch.profiler.profile(...)``,
  ``import torch.autograd.profiler as ap; ap.profile(...)``, and every library
  that looks the class up when it profiles (such as torch's own
  ``torch._inductor`` benchmarking helpers).
* Names bound before ``install()``: every module global (in any module in
  ``sys.modules`` but polyprof's own) that is bound to one of the replaced torch
  classes is rebound, whatever its name: ``from torch.profiler import profile``
  and ``from torch.profiler import profile as P`` in a notebook's ``__main__``
  or in an imported module.
* ``uninstall()`` puts the original object back in every place the shims
  rebound, unless something else has rebound it since (that binding is left
  alone and logged), and also rebinds module globals that picked up a shim
  class while the shims were installed (``from torch.profiler import profile``
  executed in between) to torch's class; a global that carries the shim
  class's own name (``from polyprof.shim import TorchProfile``) is left alone.
* torch's own profiler classes created before ``install()`` (subclasses of
  ``torch.profiler.profile`` defined earlier, instances already made,
  ``torch.profiler._KinetoProfile``) keep recording with torch: their backend
  is reached as ``torch.autograd.profiler.profile`` from the
  ``torch.profiler.profiler`` module, whose ``prof`` global is pointed at a view
  of ``torch.autograd.profiler`` that still holds torch's class.

Not covered (Python offers no safe way to find these references):

* References held anywhere but a module global: function locals and
  closures, default argument values, class attributes, containers, objects
  (``self.profiler_cls = torch.profiler.profile``), and
  ``functools.partial(torch.profiler.profile, ...)`` made before ``install()``.
* ``isinstance(prof, torch_profile_class_captured_before_install)`` is False
  for polyprof's objects: they are not subclasses of torch's classes.
* Classes that subclass a torch profiler class and were created before
  ``install()`` stay torch's (see above): they are not redirected to polyprof.
* torch.compile: dynamo's table of known context managers holds torch's
  original classes, so a polyprof profile inside a compiled region causes a
  graph break instead of being ignored the way torch's profiler is.
* Child processes (``multiprocessing`` with ``spawn``, ``subprocess``) start
  without the shims; ``fork`` children inherit them.

``install()`` needs torch and raises ``TorchMissingError`` (an ``ImportError``)
without it. It is idempotent, ``uninstall()`` without ``install()`` does
nothing, and ``shimmed()`` installs for the length of a ``with`` block (leaving
shims that were installed before the block in place).

Each shim class takes the arguments the *installed* torch's class takes and
refuses the others with torch's ``TypeError`` (``polyprof.base.shim_arguments``),
plus polyprof's ``plugin_manager`` and, for the legacy profile, IPEX's
``use_xpu``. Which arguments ``AutogradProfile`` honours, and how:
docs/shims.md. ``enabled=False`` (``AutogradProfile`` and ``LegacyProfile``):
``__enter__`` returns the object (torch returns None) and asking it for
results raises ``ProfilerDisabledError``; both record once
(``polyprof.runtime.recording.RecordOnce``).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import attrs

from polyprof.base.errors import PolyprofError
from polyprof.base.log import get_logger
from polyprof.base.shim_arguments import remember_torch_class
from polyprof.frontends.shim_classes import AutogradProfile, LegacyProfile, TorchProfile

log = get_logger(__name__)

__all__ = [
    "Binding",
    "TorchMissingError",
    "install",
    "installed",
    "installed_bindings",
    "shimmed",
    "uninstall",
]


class TorchMissingError(PolyprofError, ImportError):
    """The shims were asked for, but torch cannot be imported."""


# ------------------------------------------------------------------ binding records


@attrs.frozen(eq=False)
class Binding:
    """One module global the shims rebound, and what to put back."""

    module: str
    name: str
    #: The module's ``__dict__`` (held so the binding can be restored even if sys.modules changes).
    namespace: dict[str, Any] = attrs.field(repr=False)
    original: Any = attrs.field(repr=False)
    replacement: Any = attrs.field(repr=False)

    def describe(self) -> str:
        return f"{self.module}.{self.name}"


class _TorchBackendView(types.ModuleType):
    """``torch.autograd.profiler`` as torch's own ``torch.profiler.profiler`` code sees it while shimmed.

    Everything forwards to the real module except ``profile``, which stays
    torch's class, so torch's own profiler classes made before ``install()``
    keep recording with torch instead of failing on polyprof's object.
    """

    def __init__(self, real: types.ModuleType, torch_profile: type) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_real_module"] = real
        self.__dict__["profile"] = torch_profile

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_real_module"], name)

    def __repr__(self) -> str:
        return f"<polyprof shim view of module {self.__name__!r} (profile is torch's own class)>"


#: (module, attribute, kind): the torch names the shims replace; kind picks the shim class.
_NAMED_TARGETS: tuple[tuple[str, str, str], ...] = (
    ("torch.profiler", "profile", "torch"),
    ("torch.profiler.profiler", "profile", "torch"),
    ("torch.autograd.profiler", "profile", "autograd"),
    ("torch.autograd.profiler_legacy", "profile", "legacy"),
    # emit_itt shares torch's one collector with the profiles: it must take the same road.
    ("torch.autograd.profiler", "emit_itt", "itt"),
)

_lock = threading.RLock()
_bindings: list[Binding] | None = None
#: id(shim class) -> torch's class, for restoring names bound while installed.
_originals_by_replacement: dict[int, Any] = {}


def _is_own_module(name: str) -> bool:
    return name == "polyprof" or name.startswith("polyprof.")


#: The module type's own ``__dict__`` slot: reading it runs no code of a module subclass (lazy
#: modules that import on attribute access stay untouched).
_MODULE_DICT: Any = vars(types.ModuleType)["__dict__"]


def _module_namespaces() -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, __dict__) of every real module in sys.modules but polyprof's own."""
    for name, module in list(sys.modules.items()):
        if not issubclass(type(module), types.ModuleType) or _is_own_module(name):
            continue
        namespace = _MODULE_DICT.__get__(module)
        if isinstance(namespace, dict):
            yield name, namespace


def _import_torch_modules() -> dict[str, types.ModuleType]:
    try:
        return {
            name: importlib.import_module(name)
            for name in (
                "torch",
                "torch.profiler",
                "torch.profiler.profiler",
                "torch.autograd.profiler",
                "torch.autograd.profiler_legacy",
            )
        }
    except ImportError as exc:
        raise TorchMissingError(
            f"polyprof's shims replace torch's profiler classes, so they need torch, which cannot be "
            f"imported here ({exc}); install torch (pip install torch) or use polyprof.profile directly"
        ) from exc


def install() -> None:
    """Put polyprof's profilers behind torch's profiler names (see the module docstring).

    Idempotent. Raises ``TorchMissingError`` when torch cannot be imported.
    """
    global _bindings
    with _lock:
        if _bindings is not None:
            return
        modules = _import_torch_modules()
        from polyprof.frontends.itt import emit_itt

        replacements: dict[str, Any] = {  # kind (as in _NAMED_TARGETS) -> what replaces torch's object
            "torch": TorchProfile,
            "autograd": AutogradProfile,
            "legacy": LegacyProfile,
            "itt": emit_itt,
        }
        done: list[Binding] = []
        try:
            originals: dict[int, Any] = {}  # id(torch object) -> shim class
            for module_name, attr, kind in _NAMED_TARGETS:
                replacement = replacements[kind]
                namespace = vars(modules[module_name])
                original = namespace[attr]
                if kind != "itt":  # the shim classes check their arguments against torch's own class
                    remember_torch_class(kind, original)
                originals[id(original)] = replacement
                _originals_by_replacement[id(replacement)] = original
                done.append(_rebind(module_name, namespace, attr, original, replacement))
            for module_name, namespace in _module_namespaces():
                for attr, value in list(namespace.items()):
                    replacement = originals.get(id(value))
                    if replacement is not None and namespace.get(attr) is value:
                        done.append(_rebind(module_name, namespace, attr, value, replacement))
            backend = vars(modules["torch.profiler.profiler"])
            real = modules["torch.autograd.profiler"]
            if backend.get("prof") is real:
                torch_profile = next(
                    b.original for b in done if (b.module, b.name) == ("torch.autograd.profiler", "profile")
                )
                done.append(
                    _rebind(
                        "torch.profiler.profiler",
                        backend,
                        "prof",
                        real,
                        _TorchBackendView(real, torch_profile),
                    )
                )
        except BaseException:
            _restore(done)
            raise
        _bindings = done
        log.debug("shims_installed", bindings=[b.describe() for b in done])


def _rebind(module: str, namespace: dict[str, Any], name: str, original: Any, replacement: Any) -> Binding:
    namespace[name] = replacement
    return Binding(module=module, name=name, namespace=namespace, original=original, replacement=replacement)


def _restore(bindings: list[Binding]) -> list[str]:
    """Put originals back, newest first; returns the bindings left alone because someone rebound them."""
    left_alone = []
    for binding in reversed(bindings):
        if binding.namespace.get(binding.name) is binding.replacement:
            binding.namespace[binding.name] = binding.original
        else:
            left_alone.append(binding.describe())
    return left_alone


def uninstall() -> None:
    """Give torch its profiler names back. Does nothing when the shims are not installed."""
    global _bindings
    with _lock:
        if _bindings is None:
            return
        bindings, _bindings = _bindings, None
        left_alone = _restore(bindings)
        if left_alone:
            log.warning(
                "shim_bindings_left_alone", reason="rebound by someone else since install()", names=left_alone
            )
        late = _restore_late_bindings()
        log.debug("shims_uninstalled", restored=len(bindings) - len(left_alone), late=late)


def _restore_late_bindings() -> list[str]:
    """Module globals bound to a shim class while installed (imported then): back to torch's class.

    A global named like the shim class itself (``from polyprof.shim import
    TorchProfile``) was asked for by that name and is left alone.
    """
    restored = []
    for module_name, namespace in _module_namespaces():
        for attr, value in list(namespace.items()):
            original = _originals_by_replacement.get(id(value))
            if original is not None and attr != value.__name__ and namespace.get(attr) is value:
                namespace[attr] = original
                restored.append(f"{module_name}.{attr}")
    return restored


def installed() -> bool:
    """Whether the shims are installed now."""
    return _bindings is not None


def installed_bindings() -> tuple[str, ...]:
    """``module.name`` of every binding the shims made (empty when not installed)."""
    with _lock:
        return tuple(b.describe() for b in _bindings or ())


@contextlib.contextmanager
def shimmed() -> Iterator[None]:
    """Install the shims for a ``with`` block; shims installed before the block stay installed."""
    with _lock:
        was_installed = installed()
        install()
    try:
        yield
    finally:
        if not was_installed:
            uninstall()
