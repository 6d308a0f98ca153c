"""``torch.autograd.profiler.profile``'s API, recorded by polyprof (``polyprof.shim.AutogradProfile``).

The class composes a ``polyprof.profile`` that records on its behalf (the
recording gate names the ``AutogradProfile``) and torch's ``enabled`` and
record-once rule (``polyprof.runtime.recording.RecordOnce``, shared with
``polyprof.legacy.profile``). It is not a ``polyprof.profile``: like torch's
autograd profile it has no ``start()``, ``stop()``, ``step()`` or schedule.

Which arguments are honoured, and how: docs/shims.md.

CUDA (``use_device="cuda"``, or the deprecated ``use_cuda=True`` of torch 2.6
to 2.13) is recorded the way torch records it with ``use_kineto=True``: the
real kernels, copies and fills, through torch's Kineto (polyprof-cuda), each
linked to the op that launched it. torch's default, ``use_kineto=False``, is
its GPU fallback instead (``ProfilerState.KINETO_GPU_FALLBACK``): a CUDA event
pair around every op on the current stream, one "kernel" per op named after
the op. polyprof does not reproduce that measurement; docs/shims.md ("CUDA
time: use_cuda, use_device and use_kineto") says why and what differs.
``use_kineto`` keeps torch's one rule that does not depend on the device:
``use_cpu=False`` needs ``use_kineto=True`` (``KinetoRequiredError``, an
``AssertionError`` as torch's).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from polyprof.base.activity import DEVICES, ProfilerActivity, coerce_activity
from polyprof.base.errors import PolyprofError, PolyprofWarning
from polyprof.base.log import get_logger
from polyprof.base.shim_arguments import check_torch_arguments
from polyprof.frontends import frontend_results
from polyprof.frontends.profiler import NoActivitiesError, warn_torch_deprecations
from polyprof.frontends.profiler import profile as _polyprof_profile
from polyprof.runtime.recording import RecordOnce

log = get_logger(__name__)

__all__ = ["AutogradProfile", "KinetoRequiredError"]

#: ``use_device`` values torch accepts and the activity each records (``polyprof.base.activity.DEVICES``,
#: ``autograd_use_device``); PrivateUse1 is asked of torch under its backend's name.
DEVICE_ACTIVITY: Mapping[str, ProfilerActivity] = {
    d.use_device: d.activity for d in DEVICES if d.autograd_use_device
}
#: torch's name of the PrivateUse1 backend until one renames it: its ``use_device`` ("privateuseone").
_PRIVATEUSE1_DEFAULT_NAME = next(d.use_device for d in DEVICES if d.activity is ProfilerActivity.PrivateUse1)


def _privateuse1_backend_name() -> str | None:
    """The renamed PrivateUse1 backend (e.g. ``"npu"``), or None."""
    try:
        import torch
    except ImportError:
        return None
    name = torch._C._get_privateuse1_backend_name()
    return None if name == _PRIVATEUSE1_DEFAULT_NAME else name


class KinetoRequiredError(PolyprofError, ValueError, AssertionError):
    """``use_cpu=False`` without ``use_kineto=True``, which torch's autograd profile refuses.

    Also an AssertionError, the type torch raises ("Device-only events supported
    only with Kineto (use_kineto=True)"), so code that catches torch's keeps working.
    """


def _warn_use_cuda() -> None:
    """torch 2.6 to 2.13's warning for ``use_cuda=True`` (2.14 removed the argument)."""
    warnings.warn(
        "The attribute `use_cuda` will be deprecated soon, please use ``use_device = 'cuda'`` instead.",
        FutureWarning,
        stacklevel=4,
    )


def _autograd_device(use_device: str | None) -> ProfilerActivity | None:
    """The device activity ``torch.autograd.profiler.profile`` would record, warning as torch warns."""
    if use_device is None:
        return None
    if use_device in DEVICE_ACTIVITY:
        return DEVICE_ACTIVITY[use_device]
    if use_device == _privateuse1_backend_name():
        return ProfilerActivity.PrivateUse1
    warnings.warn(f"The {use_device} is not a valid device option.", stacklevel=4)
    return None


class _Forwarded:
    """A setting of the composed ``polyprof.profile``, read and written through (as torch's attributes)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj._profile, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj._profile, self.name, value)


class AutogradProfile:
    """``torch.autograd.profiler.profile``'s signature and methods, recorded by polyprof.

    Torch's ``table()`` (of the raw events), ``function_events``,
    ``key_averages()``, ``total_average()``, ``self_cpu_time_total``,
    ``export_chrome_trace(path, metadata=None, use_python_export=False)``
    (``metadata``: top-level keys mapped to raw JSON text, written whatever
    ``use_python_export`` says), ``export_stacks`` and
    ``toggle_collection_dynamic``; and polyprof's ``events()``, ``export()``,
    ``trace``, ``config``, ``activities`` and ``bus_statistics``. Like torch's,
    it records once: a second ``with`` raises ``RuntimeError``.
    """

    __module__ = "polyprof.shim"  # its public name; type(prof) reads polyprof.shim.AutogradProfile

    def __new__(cls, *args: Any, **kwargs: Any) -> AutogradProfile:
        if cls is AutogradProfile:  # a subclass's own __init__ decides what it takes
            check_torch_arguments("autograd", args, kwargs)
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
        self.enabled = bool(enabled)
        #: torch's switch between its GPU fallback (False) and Kineto (True). polyprof records
        #: devices through Kineto either way; it only keeps torch's rule for ``use_cpu=False``.
        self.use_kineto = use_kineto
        self.use_cpu = bool(use_cpu)
        #: torch's ``enabled`` and record-once rule.
        self._once = RecordOnce(enabled=self.enabled, frontend="torch.autograd.profiler.profile")
        if not self.enabled:
            # torch's __init__ keeps ``enabled`` and returns (2.6 to 2.15): no other argument is
            # checked or warned about. The composed profile, never started, has torch's defaults.
            self._profile = _polyprof_profile.on_behalf_of(self)
            return
        if _profiler_extensions:
            # torch 2.15's CUDA profiler extensions (performance metrics): torch's Kineto runs them.
            warnings.warn(
                f"_profiler_extensions {dict(_profiler_extensions)!r} configure torch's own CUDA profiler "
                "extensions, which polyprof does not run; they are ignored",
                PolyprofWarning,
                stacklevel=2,
            )
        warn_torch_deprecations(with_modules, experimental_config, stacklevel=2)  # where torch 2.14+ warns
        device = self._device(use_cuda, use_device)
        chosen = ([ProfilerActivity.CPU] if self.use_cpu else []) + ([device] if device is not None else [])
        if not chosen:
            raise NoActivitiesError(
                "No activities specified for the profiler: use_cpu=False needs a device, e.g. "
                f"use_device='cuda'; valid devices: {', '.join(DEVICE_ACTIVITY)}"
            )
        filters = {coerce_activity(k): v for k, v in (activity_filters or {}).items()}
        unknown = sorted(a.name for a in filters if a not in chosen)
        if unknown:
            log.debug("activity_filters_ignored", activities=unknown)
        activities = [{act: list(filters[act])} if act in filters else act for act in chosen]
        #: What records: a polyprof.profile whose recording names this object at the gate.
        self._profile = _polyprof_profile.on_behalf_of(
            self,
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

    def _device(self, use_cuda: Any, use_device: str | None) -> ProfilerActivity | None:
        """The device to record, checked and warned about in torch's order (not called when disabled)."""
        if use_cuda:
            _warn_use_cuda()
            use_device = "cuda"
        if not self.use_cpu and not self.use_kineto:
            raise KinetoRequiredError(
                "Device-only events supported only with Kineto (use_kineto=True): torch's "
                "torch.autograd.profiler.profile refuses use_cpu=False without use_kineto=True, and so does "
                "polyprof's; pass use_kineto=True, or keep use_cpu=True"
            )
        return _autograd_device(use_device)

    # torch's settings (read when recording starts, as torch reads them), kept by the composed profile.
    record_shapes = _Forwarded()
    with_flops = _Forwarded()
    profile_memory = _Forwarded()
    with_stack = _Forwarded()
    with_modules = _Forwarded()
    experimental_config = _Forwarded()
    acc_events = _Forwarded()
    custom_trace_id_callback = _Forwarded()
    post_processing_timeout_s = _Forwarded()
    activity_filters = _Forwarded()

    # ------------------------------------------------------------ recording

    @property
    def entered(self) -> bool:
        """torch's ``entered``: recording started (False while disabled, or after an entry that failed)."""
        return self._once.entered

    def __enter__(self) -> AutogradProfile:
        # enabled=False: returns the object (torch returns None), and results say it was disabled.
        self._once.enter(self._profile.start)
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        # torch's autograd profile leaves an __exit__ without __enter__ alone (polyprof.profile raises).
        if self._once.leave():
            self._profile.__exit__(exc_type, exc_val, exc_tb)

    def toggle_collection_dynamic(self, enabled: bool, activities: Iterable[Any]) -> None:
        """Pause or resume collection of ``activities`` without ending the recording."""
        self._profile.toggle_collection_dynamic(enabled, activities)

    # ------------------------------------------------------------ results

    @property
    def activities(self) -> frozenset[ProfilerActivity]:
        """The activities recorded (after dropping unusable ones)."""
        return self._profile.activities

    @property
    def use_device(self) -> str | None:
        """torch's ``use_device``: the accelerator whose time the tables show."""
        return self._profile.use_device

    @property
    def config(self) -> Any:
        """polyprof's ``ProfileConfig`` of the recording (None before it); torch's is a method."""
        return self._profile.config

    @property
    def bus_statistics(self) -> Any:
        """Counters of the event bus (``polyprof.profile.bus_statistics``)."""
        return self._profile.bus_statistics

    def get_trace_id(self) -> str | None:
        """The recording's trace id."""
        return self._profile.get_trace_id()

    def _finished_events(self, what: str) -> Any:
        """The recorded events (``frontend_results``); torch's messages when disabled or unfinished."""
        self._once.check_enabled(what)
        return self._profile.events()

    @property
    def trace(self) -> Any:
        """The finished ``polyprof.base.trace.Trace``."""
        self._once.check_enabled("trace")
        return self._profile.trace

    def events(self) -> Any:
        """Every recorded event, as an ``EventList`` of ``FunctionEvent``."""
        return self._finished_events("events()")

    @property
    def function_events(self) -> Any:
        """Every recorded event (torch's ``function_events``), as an ``EventList``."""
        return self._finished_events("function_events")

    # torch's table of the raw (not averaged) events, total_average() and self_cpu_time_total.
    table = frontend_results.table
    total_average = frontend_results.total_average
    self_cpu_time_total = frontend_results.self_cpu_time_total

    def key_averages(
        self,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
        include_python_functions: bool | None = None,
    ) -> Any:
        """Events averaged by name (and optionally shapes, stack, overload), as ``polyprof.profile``'s."""
        self._once.check_enabled("key_averages()")
        return self._profile.key_averages(
            group_by_input_shape=group_by_input_shape,
            group_by_stack_n=group_by_stack_n,
            group_by_overload_name=group_by_overload_name,
            include_python_functions=include_python_functions,
        )

    def export_chrome_trace(
        self,
        path: str | os.PathLike[str],
        metadata: Mapping[str, str] | None = None,
        use_python_export: bool = False,
    ) -> str:
        """Write the trace as Kineto-shaped Chrome JSON; ``metadata`` adds top-level keys (raw JSON text)."""
        self._once.check_enabled("export_chrome_trace()")
        if not metadata:
            return self._profile.export_chrome_trace(path, use_python_export=use_python_export)
        extra = {}
        for key, value in metadata.items():
            try:
                json.loads(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"metadata[{key!r}] must be raw JSON text (e.g. '\"text\"' or '3'), got {value!r} ({exc})"
                ) from None
            extra[str(key)] = value
        return self._profile.export(path, "chrome", metadata_json=extra)

    def export_stacks(self, path: str | os.PathLike[str], metric: str = "self_cpu_time_total") -> str:
        """Write collapsed stacks (flame graph input); needs ``with_stack=True``."""
        self._once.check_enabled("export_stacks()")
        return self._profile.export_stacks(path, metric)

    def export(self, path: str | os.PathLike[str], format: str = "chrome", **options: Any) -> str:  # noqa: A002
        """Write the trace with any installed exporter, chosen by name (``polyprof.profile.export``)."""
        self._once.check_enabled("export()")
        return self._profile.export(path, format, **options)

    def __str__(self) -> str:
        return str(self._finished_events("str(profile)"))

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else "finished" if self._once.finished else "unfinished"
        acts = ",".join(sorted(a.name for a in self.activities))
        return f"<polyprof.shim.AutogradProfile {state} activities={acts}>"
