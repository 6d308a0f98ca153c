"""Shims: polyprof's profilers behind torch's profiler names, on request, and back out.

``install()`` rebinds, while the shims are in place:

=========================================  ==============================================
torch name                                 becomes
=========================================  ==============================================
``torch.profiler.profile``                 ``TorchProfile`` (``polyprof.profile``)
``torch.profiler.profiler.profile``        ``TorchProfile``
``torch.autograd.profiler.profile``        ``AutogradProfile`` (its own signature, below)
``torch.autograd.profiler_legacy.profile`` ``LegacyProfile`` (``polyprof.legacy.profile``,
                                           which accepts IPEX's ``use_xpu``)
=========================================  ==============================================

The shim classes are thin subclasses of polyprof's frontends, so they are
distinct objects: ``uninstall()`` can tell a name that the shims bound from one
a user bound to ``polyprof.profile`` on purpose. ``type(prof).__module__`` is
``"polyprof.shim"`` and ``isinstance(prof, polyprof.profile)`` holds.

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
refuses the others with torch's ``TypeError`` (asked of torch's own signature:
``post_processing_timeout_s`` from torch 2.11, ``activity_filters`` from 2.12,
no ``use_cuda`` in ``torch.profiler.profile`` / ``torch.autograd.profiler.profile``
from 2.14, ``_profiler_extensions`` from 2.15), plus polyprof's
``plugin_manager`` and, for the legacy profile, IPEX's ``use_xpu``.

``torch.autograd.profiler.profile`` (AutogradProfile) honours: ``enabled``,
``use_cpu`` and ``use_device`` / ``use_cuda`` (choose the activities: CPU, and
``cuda``, ``xpu``, ``mtia``, ``hpu`` or the PrivateUse1 backend name; an
unknown device warns as torch does and profiles the CPU only),
``record_shapes``, ``with_flops`` (implies ``record_shapes``),
``profile_memory``, ``with_stack``, ``with_modules``, ``experimental_config``,
``acc_events``, ``custom_trace_id_callback``, ``post_processing_timeout_s``
(checked; polyprof keeps every event, see docs/user-guide.md) and
``activity_filters``; ``_profiler_extensions`` (torch's CUDA extensions) warns
and is ignored. ``use_kineto`` is accepted and ignored: polyprof always
records through its tracer plugins (the CPU tracer drives torch's Kineto
collector). A device activity needs the polyprof plugin that records it
(``polyprof-cuda``, ``polyprof-xpu``); without it ``__enter__`` raises
``ActivityUnavailableError`` naming the distribution, where torch would warn
and profile the CPU only. ``enabled=False``: ``__enter__`` returns the object
(torch returns None) and asking it for results raises ``ProfilerDisabledError``,
as ``polyprof.legacy.profile`` does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from polyprof import frontend_results
from polyprof._log import get_logger
from polyprof.activity import ProfilerActivity, coerce_activity
from polyprof.errors import PolyprofError, PolyprofWarning, ProfilerDisabledError
from polyprof.profiler import NoActivitiesError
from polyprof.profiler import profile as _polyprof_profile

log = get_logger(__name__)

__all__ = [  # and LegacyProfile, built on first access (it needs polyprof.legacy)
    "AutogradProfile",
    "Binding",
    "ProfilerDisabledError",
    "TorchMissingError",
    "TorchProfile",
    "install",
    "installed",
    "installed_bindings",
    "shimmed",
    "uninstall",
]


class TorchMissingError(PolyprofError, ImportError):
    """The shims were asked for, but torch cannot be imported."""


# ------------------------------------------------------------------ shim classes


#: Arguments the shim classes take beyond the torch class they stand in for (polyprof's own, IPEX's).
_SHIM_EXTRAS: Mapping[str, frozenset[str]] = {
    "torch": frozenset({"plugin_manager"}),
    "autograd": frozenset({"plugin_manager"}),
    "legacy": frozenset({"plugin_manager", "use_xpu"}),
}
#: Where the torch class that each kind of shim stands in for lives.
_TORCH_CLASS_MODULE: Mapping[str, str] = {
    "torch": "torch.profiler.profiler",
    "autograd": "torch.autograd.profiler",
    "legacy": "torch.autograd.profiler_legacy",
}


def _torch_class(kind: str, shim_cls: type) -> Any:
    """The installed torch's own class behind ``shim_cls``; None without torch."""
    original = _originals_by_replacement.get(id(shim_cls))
    if original is not None:
        return original
    try:
        module = importlib.import_module(_TORCH_CLASS_MODULE[kind])
    except ImportError:
        return None
    candidate = vars(module).get("profile")
    if candidate is None or _is_own_module(getattr(candidate, "__module__", "") or ""):
        return None
    return candidate


@functools.cache
def _torch_signature(torch_cls: type) -> inspect.Signature:
    return inspect.signature(torch_cls)


def _check_torch_arguments(
    kind: str, shim_cls: type, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> None:
    """Refuse, with torch's TypeError, arguments the installed torch's class would refuse.

    polyprof's frontends keep one signature (torch 2.13's); behind torch's names
    they take what the installed torch takes: no ``post_processing_timeout_s``
    before 2.11, no ``use_cuda`` from 2.14, ``activity_filters`` from 2.12, ...
    """
    torch_cls = _torch_class(kind, shim_cls)
    if torch_cls is None:
        return
    signature = _torch_signature(torch_cls)
    extras = _SHIM_EXTRAS[kind]
    try:
        signature.bind(*args, **{k: v for k, v in kwargs.items() if k not in extras})
    except TypeError as exc:
        import torch

        accepted = ", ".join(p.name for p in signature.parameters.values() if not p.name.startswith("_"))
        raise TypeError(
            f"{exc}: torch {torch.__version__}'s {torch_cls.__module__}.{torch_cls.__qualname__}, which "
            f"polyprof stands in for, takes ({accepted})"
        ) from None


class TorchProfile(_polyprof_profile):
    """``polyprof.profile`` as ``torch.profiler.profile`` while the shims are installed.

    The same semantics and results as ``polyprof.profile``; it takes the
    arguments the installed torch's ``torch.profiler.profile`` takes (and
    refuses the others with torch's TypeError). A separate class also so that
    the shims know which bindings they made.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> TorchProfile:
        if cls is TorchProfile:  # a subclass's own __init__ decides what it takes
            _check_torch_arguments("torch", TorchProfile, args, kwargs)
        return super().__new__(cls)


#: ``use_device`` values torch accepts and the activity each records.
_DEVICE_ACTIVITY: Mapping[str, ProfilerActivity] = {
    "cuda": ProfilerActivity.CUDA,
    "xpu": ProfilerActivity.XPU,
    "mtia": ProfilerActivity.MTIA,
    "hpu": ProfilerActivity.HPU,
}


def _privateuse1_backend_name() -> str | None:
    """The renamed PrivateUse1 backend (e.g. ``"npu"``), or None."""
    try:
        import torch
    except ImportError:
        return None
    name = torch._C._get_privateuse1_backend_name()
    return None if name == "privateuseone" else name


def _autograd_device(use_cuda: bool, use_device: str | None) -> ProfilerActivity | None:
    """The device activity ``torch.autograd.profiler.profile`` would record, warning as torch warns."""
    if use_cuda:
        warnings.warn(
            "The attribute `use_cuda` will be deprecated soon, please use ``use_device = 'cuda'`` instead.",
            FutureWarning,
            stacklevel=3,
        )
        use_device = "cuda"
    if use_device is None:
        return None
    if use_device in _DEVICE_ACTIVITY:
        return _DEVICE_ACTIVITY[use_device]
    if use_device == _privateuse1_backend_name():
        return ProfilerActivity.PrivateUse1
    warnings.warn(f"The {use_device} is not a valid device option.", stacklevel=3)
    return None


class AutogradProfile(_polyprof_profile):
    """``torch.autograd.profiler.profile``'s signature and methods, recorded by polyprof.

    See the module docstring for which arguments are honoured. Beyond
    ``polyprof.profile``'s methods it has torch's ``table()`` (of the raw
    events), ``function_events``, ``total_average()`` and
    ``self_cpu_time_total``, and ``export_chrome_trace(path, metadata=None,
    use_python_export=False)`` (``metadata``: top-level keys mapped to raw JSON
    text, written whatever ``use_python_export`` says). Like torch's, it records
    once: a second ``with`` raises ``RuntimeError``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> AutogradProfile:
        if cls is AutogradProfile:  # a subclass's own __init__ decides what it takes
            _check_torch_arguments("autograd", AutogradProfile, args, kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        enabled: bool = True,
        *,
        use_cuda: bool = False,
        use_device: str | None = None,
        record_shapes: bool = False,
        with_flops: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_modules: bool = False,
        use_kineto: bool = False,
        use_cpu: bool = True,
        experimental_config: Any = None,
        acc_events: bool = False,
        custom_trace_id_callback: Callable[[], str] | None = None,
        post_processing_timeout_s: float | None = None,
        activity_filters: Mapping[Any, Iterable[str]] | None = None,
        _profiler_extensions: Mapping[str, str] | None = None,
        plugin_manager: Any = None,
    ) -> None:
        if _profiler_extensions:
            # torch 2.15's CUDA profiler extensions (performance metrics): torch's Kineto runs them.
            warnings.warn(
                f"_profiler_extensions {dict(_profiler_extensions)!r} configure torch's own CUDA profiler "
                "extensions, which polyprof does not run; they are ignored",
                PolyprofWarning,
                stacklevel=2,
            )
        self.enabled = bool(enabled)
        #: Accepted for torch compatibility; polyprof's tracers decide how to record.
        self.use_kineto = use_kineto
        self.use_cpu = bool(use_cpu)
        device = _autograd_device(bool(use_cuda), use_device)
        chosen = ([ProfilerActivity.CPU] if self.use_cpu else []) + ([device] if device is not None else [])
        if not chosen:
            raise NoActivitiesError(
                "No activities specified for the profiler: use_cpu=False needs a device, e.g. "
                f"use_device='cuda'; valid devices: {', '.join(_DEVICE_ACTIVITY)}"
            )
        filters = {coerce_activity(k): v for k, v in (activity_filters or {}).items()}
        unknown = sorted(a.name for a in filters if a not in chosen)
        if unknown:
            log.debug("activity_filters_ignored", activities=unknown)
        activities = [{act: list(filters[act])} if act in filters else act for act in chosen]
        super().__init__(
            activities=activities,
            record_shapes=bool(record_shapes) or bool(with_flops),
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            with_modules=with_modules,
            experimental_config=experimental_config,
            acc_events=acc_events,
            custom_trace_id_callback=custom_trace_id_callback,
            post_processing_timeout_s=post_processing_timeout_s,
            plugin_manager=plugin_manager,
        )
        self.entered = False

    def __enter__(self) -> AutogradProfile:
        if not self.enabled:
            return self
        if self.entered:
            raise RuntimeError("Profiler context manager is not reentrant")
        self.entered = True
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        # torch's autograd profile leaves an __exit__ without __enter__ alone (polyprof.profile raises).
        if self.enabled and self.entered:
            super().__exit__(exc_type, exc_val, exc_tb)

    def _require_results(self) -> Any:
        if not self.enabled:
            raise ProfilerDisabledError(
                "the profiler was disabled (enabled=False), so it recorded nothing; create it with "
                "torch.autograd.profiler.profile(enabled=True, ...) to get results"
            )
        return super()._require_results()

    @property
    def function_events(self) -> Any:
        """Every recorded event (torch's ``function_events``), as an ``EventList``."""
        return self.events()

    def _finished_events(self, what: str) -> Any:
        """``events()``; its errors (disabled, unfinished) are torch's messages, which name no method."""
        return self.events()

    # torch's table of the raw (not averaged) events, total_average() and self_cpu_time_total.
    table = frontend_results.table
    total_average = frontend_results.total_average
    self_cpu_time_total = frontend_results.self_cpu_time_total

    def export_chrome_trace(
        self,
        path: str | os.PathLike[str],
        metadata: Mapping[str, str] | None = None,
        use_python_export: bool = False,
    ) -> str:
        """Write the trace as Kineto-shaped Chrome JSON; ``metadata`` adds top-level keys (raw JSON values)."""
        if not metadata:
            return super().export_chrome_trace(path, use_python_export=use_python_export)
        extra = {}
        for key, value in metadata.items():
            try:
                json.loads(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"metadata[{key!r}] must be raw JSON text (e.g. '\"text\"' or '3'), got {value!r} ({exc})"
                ) from None
            extra[str(key)] = value
        trace = self.trace
        trace = attrs.evolve(trace, metadata_json={**trace.metadata_json, **extra})
        return self._export("chrome", trace, os.fspath(path))

    def __str__(self) -> str:
        return str(self.events())

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else "finished" if self._traces else "unfinished"
        acts = ",".join(sorted(a.name for a in self.activities))
        return f"<polyprof.shim.AutogradProfile {state} activities={acts}>"


_legacy_class_lock = threading.Lock()
_legacy_class: type | None = None


def _legacy_new(cls: type, *args: Any, **kwargs: Any) -> Any:
    if cls is _legacy_class:  # a subclass's own __init__ decides what it takes
        _check_torch_arguments("legacy", cls, args, kwargs)
    return object.__new__(cls)


def _legacy_profile_class() -> type | None:
    """``LegacyProfile``, made on first use; None when ``polyprof.legacy`` is not installed."""
    global _legacy_class
    try:
        legacy = importlib.import_module("polyprof.legacy")
    except ModuleNotFoundError as exc:
        if exc.name != "polyprof.legacy":
            raise
        return None
    with _legacy_class_lock:
        if _legacy_class is None or _legacy_class.__bases__ != (legacy.profile,):
            _legacy_class = type(
                "LegacyProfile",
                (legacy.profile,),
                {
                    "__module__": __name__,
                    "__qualname__": "LegacyProfile",
                    "__new__": _legacy_new,
                    "__doc__": (
                        "``polyprof.legacy.profile`` as ``torch.autograd.profiler_legacy.profile`` while "
                        "the shims are installed (accepts IPEX's ``use_xpu``)."
                    ),
                },
            )
        return _legacy_class


def __getattr__(name: str) -> Any:  # PEP 562: LegacyProfile is built when polyprof.legacy is first needed
    if name == "LegacyProfile":
        cls = _legacy_profile_class()
        if cls is None:
            raise AttributeError("polyprof.shim.LegacyProfile needs polyprof.legacy, which is not installed")
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
_MODULE_DICT = types.ModuleType.__dict__["__dict__"]


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
        from polyprof.itt import emit_itt

        replacements = {
            "torch": TorchProfile,
            "autograd": AutogradProfile,
            "legacy": _legacy_profile_class(),
            "itt": emit_itt,
        }
        if replacements["legacy"] is None:
            log.warning("legacy_shim_skipped", reason="polyprof.legacy is not installed")
        done: list[Binding] = []
        try:
            originals: dict[int, Any] = {}  # id(torch object) -> shim class
            for module_name, attr, kind in _NAMED_TARGETS:
                replacement = replacements[kind]
                if replacement is None:
                    continue
                namespace = vars(modules[module_name])
                original = namespace[attr]
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
