"""Which torch polyprof supports, and what the installed one offers.

polyprof reads torch's C++ collector directly, so the accessors it can call
(``_KinetoEvent``), the flags it can set (``_ExperimentalConfig``) and the
methods of the raw result (``_ProfilerResult``) depend on the torch release.
They are asked of the installed torch once, here, instead of being assumed;
every version-dependent decision elsewhere reads this module.

Importing it never imports torch: ``installed()`` does, on first call.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs

if TYPE_CHECKING:
    from torch._C._profiler import _ExperimentalConfig

#: Oldest and newest supported torch minors (inclusive): every minor in between is tested.
SUPPORTED_MIN = (2, 6)
SUPPORTED_MAX = (2, 15)
SUPPORTED_RANGE_TEXT = f"{SUPPORTED_MIN[0]}.{SUPPORTED_MIN[1]} to {SUPPORTED_MAX[0]}.{SUPPORTED_MAX[1]}"

#: What the tracer cannot work without, on every supported release.
REQUIRED_EVENT_ACCESSORS = frozenset(
    {"name", "start_ns", "end_ns", "start_thread_id", "end_thread_id", "is_async", "is_user_annotation"}
)


def parse_version(text: str) -> tuple[int, int, int]:
    """``"2.6.0+cu124"`` -> ``(2, 6, 0)``; pre-releases count as their release (``2.16.0a0`` -> 2.16.0)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


@attrs.frozen
class TorchFeatures:
    """What the installed torch's profiler offers, asked of it once."""

    version_text: str
    version: tuple[int, int, int]
    #: Accessor methods of ``torch._C._autograd._KinetoEvent``.
    event_accessors: frozenset[str]
    #: Keyword arguments of ``torch._C._profiler._ExperimentalConfig``.
    experimental_fields: frozenset[str]
    #: Methods of ``torch._C._autograd._ProfilerResult``.
    result_methods: frozenset[str]
    #: Whether ``_prepare_profiler`` takes ``activity_filter`` (torch's dict-form activities).
    prepare_takes_activity_filter: bool = False
    #: Whether ``_prepare_profiler`` takes ``profiler_extensions`` (2.15+; torch passes ``{}``).
    prepare_takes_profiler_extensions: bool = False

    @property
    def minor(self) -> tuple[int, int]:
        return self.version[:2]

    def at_least(self, major: int, minor: int, patch: int = 0) -> bool:
        return self.version >= (major, minor, patch)

    def has_accessor(self, name: str) -> bool:
        return name in self.event_accessors

    @property
    def supported(self) -> bool:
        return SUPPORTED_MIN <= self.minor <= SUPPORTED_MAX


#: ``cuda: Optional[str] = '13.0'`` (or ``= None``) and the like in torch/version.py.
_BUILD_LINE = r"^{key}\b[^=\n]*=\s*(?:'([^']*)'|\"([^\"]*)\"|None)"


@attrs.frozen
class TorchBuild:
    """What the installed torch package is built for, read without importing torch."""

    version: str
    #: CUDA version of a CUDA build ("13.0"), else None.
    cuda: str | None = None
    #: XPU (SYCL) version of an XPU build, else None.
    xpu: str | None = None
    #: HIP version of a ROCm build, else None.
    hip: str | None = None


def parse_version_file(text: str) -> TorchBuild:
    """A ``TorchBuild`` from the text of ``torch/version.py``."""

    def value(key: str) -> str | None:
        found = re.search(_BUILD_LINE.format(key=key), text, re.MULTILINE)
        return (found.group(1) or found.group(2) or None) if found else None

    return TorchBuild(value("__version__") or "unknown", value("cuda"), value("xpu"), value("hip"))


def installed_build() -> TorchBuild | None:
    """The installed torch's build (None when torch is not installed), without importing it.

    Device plugins decide by it whether torch's Kineto owns CUPTI or PTI in
    this process, where importing torch just to ask would cost seconds.
    """
    import importlib.util
    import sys
    from pathlib import Path

    torch = sys.modules.get("torch")
    if torch is not None:
        version = getattr(torch, "version", None)
        return TorchBuild(
            str(torch.__version__),
            getattr(version, "cuda", None),
            getattr(version, "xpu", None),
            getattr(version, "hip", None),
        )
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or ()) if spec is not None else ():
        path = Path(location) / "version.py"
        if path.is_file():
            return parse_version_file(path.read_text(errors="replace"))
    return None


def _experimental_fields(config_type: Any) -> frozenset[str]:
    """The keyword names of ``_ExperimentalConfig.__init__`` (pybind's signature line)."""
    doc = getattr(config_type.__init__, "__doc__", "") or ""
    first = doc.split("\n", 1)[0]
    return frozenset(re.findall(r"(\w+): [^,)]+(?: = [^,)]+)?", first.split("(", 1)[-1])) - {"self"}


def probe() -> TorchFeatures:
    """Ask the installed torch (imports it); raises ImportError when it lacks the profiler."""
    import torch
    from torch._C._autograd import _KinetoEvent, _prepare_profiler, _ProfilerResult
    from torch._C._profiler import _ExperimentalConfig

    return TorchFeatures(
        version_text=str(torch.__version__),
        version=parse_version(str(torch.__version__)),
        event_accessors=frozenset(n for n in dir(_KinetoEvent) if not n.startswith("_")),
        experimental_fields=_experimental_fields(_ExperimentalConfig),
        result_methods=frozenset(n for n in dir(_ProfilerResult) if not n.startswith("_")),
        prepare_takes_activity_filter="activity_filter" in _signature_line(_prepare_profiler),
        prepare_takes_profiler_extensions="profiler_extensions" in _signature_line(_prepare_profiler),
    )


def _signature_line(function: Any) -> str:
    """The first line of a pybind function's docstring: its signature."""
    return (function.__doc__ or "").split("\n", 1)[0]


@functools.cache
def installed() -> TorchFeatures:
    """The installed torch's features (probed once per process)."""
    return probe()


def unsupported_reason() -> str | None:
    """None when polyprof can drive the installed torch's profiler, else one line saying why not."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not installed ({exc}); polyprof supports torch {SUPPORTED_RANGE_TEXT}"
    version = str(getattr(torch, "__version__", "unknown"))
    try:
        features = installed()
    except (ImportError, AttributeError) as exc:
        return (
            f"torch {version} is built without its profiler ({exc}); polyprof supports torch "
            f"{SUPPORTED_RANGE_TEXT} with the Kineto profiler"
        )
    if not features.supported:
        return f"torch {version} is not supported: polyprof supports torch {SUPPORTED_RANGE_TEXT}"
    missing = REQUIRED_EVENT_ACCESSORS - features.event_accessors
    if missing:
        return f"torch {version}'s profiler lacks {', '.join(sorted(missing))}; polyprof cannot read it"
    return None


def unsupported_reason_from_build(build: TorchBuild | None) -> str | None:
    """What ``unsupported_reason`` can say from the installed package's files alone (no import).

    None when the version is in the supported range: whether the build has the profiler polyprof
    reads is asked when torch is imported (``unsupported_reason``).
    """
    if build is None:
        return f"torch is not installed; polyprof supports torch {SUPPORTED_RANGE_TEXT}"
    try:
        version = parse_version(build.version)
    except ValueError:
        return None  # an unreadable version.py: torch itself answers when imported
    if not SUPPORTED_MIN <= version[:2] <= SUPPORTED_MAX:
        return f"torch {build.version} is not supported: polyprof supports torch {SUPPORTED_RANGE_TEXT}"
    return None


def import_installed() -> None:
    """Import torch where it is installed, so that plugins answer from torch itself.

    A profile calls it before reading plugins' capabilities, which are provisional while torch is
    not imported (``Capabilities.provisional``). A torch that fails to import is left for the
    plugins to report.
    """
    import importlib.util
    import sys

    if "torch" in sys.modules:
        return
    try:
        if importlib.util.find_spec("torch") is None:
            return
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken torch is reported by the plugins that need it
        return


@attrs.frozen
class TorchWarning:
    """A warning the installed torch gives: its category and its words."""

    category: type[Warning]
    message: str


#: The settings that a torch release may deprecate in its profilers, in the order its autograd
#: profile checks them (torch 2.14: ``profiler_metrics``/``profiler_measure_per_kernel`` and
#: ``with_modules``; 2.15: ``adjust_profiler_step`` and ``with_modules``), each with the
#: ``_ExperimentalConfig`` option that turns it on, or None for the profile's own argument.
DEPRECATABLE_SETTINGS: tuple[tuple[str, Any], ...] = (
    ("profiler_metrics", ["polyprof_probe"]),
    ("profiler_measure_per_kernel", True),
    ("adjust_profiler_step", True),
    ("with_modules", None),
)


@functools.cache
def setting_deprecation(setting: str) -> TorchWarning | None:
    """The deprecation warning the installed torch gives for ``setting``, or None if it gives none.

    ``setting`` is one of ``DEPRECATABLE_SETTINGS``. torch's
    ``torch.autograd.profiler.profile`` gives these warnings when it is made,
    and ``torch.profiler.profile`` makes one each time it prepares a cycle, so
    that class is asked: made once with only that setting on (a plain object:
    nothing starts), its warnings caught. torch's own class is asked while the
    shims stand in for it. Asked once per setting and process; None without
    torch, or when this torch has no such option.
    """
    values = dict(DEPRECATABLE_SETTINGS)
    if setting not in values:
        raise ValueError(f"unknown setting {setting!r}; known: {', '.join(values)}")
    try:
        from torch._C._profiler import _ExperimentalConfig

        from polyprof.base.shim_arguments import torch_class

        torch_profile = torch_class("autograd")
        if torch_profile is None:
            return None
        if values[setting] is None:
            kwargs: dict[str, Any] = {setting: True}
        elif setting in installed().experimental_fields:
            kwargs = {"experimental_config": _ExperimentalConfig(**{setting: values[setting]})}
        else:
            return None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch_profile(**kwargs)
    except Exception:  # noqa: BLE001 - a torch that cannot answer gives no warning to copy
        return None
    for warning in caught:
        if issubclass(warning.category, (FutureWarning, DeprecationWarning, PendingDeprecationWarning)):
            return TorchWarning(warning.category, str(warning.message))
    return None


def experimental_option(experimental_config: Any, name: str) -> Any:
    """The value of option ``name`` in a user's ``_ExperimentalConfig`` (None for no config or option).

    The releases that deprecate an option read it as an attribute, so it is read the same way.
    """
    return None if experimental_config is None else getattr(experimental_config, name, None)


#: The ``_ExperimentalConfig`` flags polyprof reads back from a user's config.
READ_BACK_FLAGS = ("verbose", "profile_all_threads", "capture_overload_names", "trace_only")


class _PicklableConfig(Protocol):
    def __getstate__(self) -> tuple[object, ...]: ...


def _config_state(config: _ExperimentalConfig) -> tuple[object, ...]:
    """``config.__getstate__()``: its options as a tuple, in this torch's order."""
    # cast: pybind pickles _ExperimentalConfig through a tuple on every supported torch; the
    # stubs leave __getstate__ out.
    return cast(_PicklableConfig, config).__getstate__()


def _new_experimental_config(flags: Mapping[str, bool]) -> _ExperimentalConfig:
    """``_ExperimentalConfig(**flags)``; the callers pass only bool options this torch has."""
    from torch._C._profiler import _ExperimentalConfig

    # The stubs type each option apart; these option names are known only at run time.
    new: Callable[..., _ExperimentalConfig] = _ExperimentalConfig
    return new(**flags)


@functools.cache
def _experimental_state_positions() -> dict[str, int]:
    """Where each flag sits in ``_ExperimentalConfig.__getstate__()`` on this torch.

    The tuple's layout changes between releases (2.6 has 6 entries, 2.13 and
    2.15 have 12 in different orders) and most releases expose no attributes,
    so each flag's position is found by setting it alone and seeing which
    entry changes.
    """
    from torch._C._profiler import _ExperimentalConfig

    base = _config_state(_ExperimentalConfig())
    positions = {}
    for name in READ_BACK_FLAGS:
        if name not in installed().experimental_fields:
            continue
        state = _config_state(_new_experimental_config({name: True}))
        changed = [i for i, (a, b) in enumerate(zip(base, state, strict=True)) if a != b]
        if len(changed) == 1:
            positions[name] = changed[0]
    return positions


def experimental_flags(experimental_config: Any) -> dict[str, bool]:
    """The flags of a user's ``_ExperimentalConfig`` that polyprof acts on (False where absent)."""
    flags = dict.fromkeys(READ_BACK_FLAGS, False)
    if experimental_config is None:
        return flags
    state = _config_state(experimental_config)
    for name, position in _experimental_state_positions().items():
        flags[name] = bool(state[position])
    return flags


def make_experimental_config(**flags: bool) -> Any:
    """A ``_ExperimentalConfig`` with the given flags, leaving out those this torch lacks (when False).

    Raises ``ValueError`` for a flag set to True that this torch does not have:
    recording would silently differ from what was asked.
    """
    fields = installed().experimental_fields
    missing = sorted(name for name, value in flags.items() if value and name not in fields)
    if missing:
        raise ValueError(
            f"torch {installed().version_text} has no _ExperimentalConfig option {', '.join(missing)} "
            f"(its options: {', '.join(sorted(fields))})"
        )
    return _new_experimental_config({name: value for name, value in flags.items() if name in fields})
