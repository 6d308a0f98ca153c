"""``polyprof.profile``: torch.profiler.profile's signature and semantics.

The schedule state machine, ``ProfilerStep#N`` ranges, ``on_trace_ready``
timing (including the partial cycle delivered at exit), ``acc_events`` and
the result methods follow torch 2.13. Recording and post-processing go
through a polyprof ``Session``: plugins, the event bus, columnar results.

``activities`` is read as the installed torch reads it (dict filters from
torch 2.12, the same exception types; its ``activity_configs`` attribute on
2.15), ``KinetoStepTracker`` is driven as the installed torch drives it, and
the settings the installed torch deprecates (``with_modules`` on 2.14+,
``adjust_profiler_step`` on 2.15, ...) give its ``FutureWarning`` where it
gives them (``warn_torch_deprecations``).

Differences from torch, on purpose: starting a profile while another is
running raises a clear RuntimeError (torch silently empties the outer one);
bad arguments raise errors that name the argument and list the valid choices
(of torch's exception types), when the profile is made, while values torch
takes (a truthy int for a flag, any value for ``acc_events``) still pass,
see ``polyprof.frontends.frontend_arguments``; ``post_processing_timeout_s`` drops no events; an
exporter plugin that does not finish within its deadline raises
``ExportTimeoutError`` naming it (``polyprof.runtime.exporting``).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from polyprof.base.activity import (
    CPU_GROUP_ACTIVITY_TYPES,
    ProfilerActivity,
    coerce_activity,
    use_device_for_activities,
)
from polyprof.base.config import ProfileConfig
from polyprof.base.distributed import default_worker_name, distributed_info
from polyprof.base.errors import PolyprofError, PolyprofWarning
from polyprof.base.log import get_logger
from polyprof.base.torch_support import (
    DEPRECATABLE_SETTINGS,
    experimental_flags,
    experimental_option,
    setting_deprecation,
)
from polyprof.base.trace import CONFIG_FLAG_KEYS
from polyprof.frontends.frontend_arguments import (
    check_callable,
    check_execution_trace_observer,
    check_experimental_config,
    check_plugin_manager,
    check_timeout,
    config_flag,
    truth_flag,
)
from polyprof.frontends.record import record_function
from polyprof.frontends.schedule import ProfilerAction, coerce_action, default_schedule
from polyprof.runtime.recording import Recording

log = get_logger(__name__)

PROFILER_STEP_NAME = "ProfilerStep"
ACC_EVENTS_WARNING = (
    "Warning: Profiler clears events at the end of each cycle. Only events from the current cycle "
    "will be reported. To keep events across cycles, set acc_events=True."
)

#: torch's words (2.13+) when events are asked of a trace_only profile.
TRACE_ONLY_EVENTS_ERROR = (
    "events() is not available when trace_only=True in ExperimentalConfig. Use export_chrome_trace() instead."
)


class NoActivitiesError(PolyprofError, ValueError, AssertionError):
    """``activities`` names no activity to record.

    Also an AssertionError, the type torch raises here ("No valid profiler
    activities found"), so code written for torch that catches it keeps working.
    """


class UnknownActivityTypeError(PolyprofError, ValueError, RuntimeError):
    """An activity filter names an activity type torch does not know for that activity.

    Also a RuntimeError, the type torch's ``_prepare_profiler`` raises for it.
    """


class ProfilerNotStartedError(PolyprofError, RuntimeError, AssertionError):
    """``stop()`` (or ``__exit__``) on a profile that was never started.

    Also an AssertionError, the type torch raises here ("Profiler must be
    initialized before stopping trace").
    """


_VALID_ACTIVITIES = ", ".join(f"ProfilerActivity.{m.name}" for m in ProfilerActivity)
_VALID_ITEMS = (
    f"ProfilerActivity values (torch's or polyprof's; valid activities are: {_VALID_ACTIVITIES}) "
    "or dicts {ProfilerActivity: [activity type names]}"
)


@attrs.frozen
class ActivityRules:
    """How the installed torch's ``torch.profiler.profile`` reads ``activities``."""

    #: torch's version text, for messages ("2.13.0+cpu"; torch 2.13's rules without torch).
    torch_version: str
    #: ``{activity: [type names]}`` items (``torch.profiler.profiler._parse_activities``, torch 2.12+).
    dict_items: bool
    #: ``ProfilerActivityConfig`` values in those dicts, and None for "all types" (torch 2.15+).
    activity_configs: bool
    #: torch 2.12 and 2.13 collect the activities before parsing them, so a list with no activity at
    #: all raises AssertionError before a bad item raises TypeError; 2.14+ parse first.
    scan_first: bool


@functools.cache
def activity_rules() -> ActivityRules:
    """The installed torch's rules for ``activities``; torch 2.13's (DESIGN.md) when torch is absent."""
    try:
        import torch.profiler.profiler as torch_profiler

        from polyprof.base.torch_support import installed

        features = installed()
    except (ImportError, AttributeError):  # no torch, or one built without its profiler
        return ActivityRules(
            torch_version="2.13 (torch not installed)",
            dict_items=True,
            activity_configs=False,
            scan_first=True,
        )
    dict_items = hasattr(torch_profiler, "_parse_activities")
    return ActivityRules(
        torch_version=features.version_text,
        dict_items=dict_items,
        activity_configs=hasattr(torch_profiler, "ProfilerActivityConfig"),
        scan_first=dict_items and not features.at_least(2, 14),
    )


def _as_activity(value: Any) -> ProfilerActivity | None:
    """polyprof's or torch's ``ProfilerActivity`` as polyprof's; None for anything else (names too)."""
    if isinstance(value, ProfilerActivity):
        return value
    if type(value).__name__ == "ProfilerActivity" and type(value).__module__.startswith("torch"):
        return coerce_activity(value)
    return None


def _filter_names(act: ProfilerActivity, value: Any, rules: ActivityRules) -> frozenset[str] | None:
    """The type names of ``{act: value}``; None when the value asks for all of the activity's types."""
    if rules.activity_configs and type(value).__name__ == "ProfilerActivityConfig":
        if getattr(value, "profiler_configs", None):
            warnings.warn(
                f"the profiler_configs of {act.name}'s ProfilerActivityConfig ({value.profiler_configs!r}) "
                "configure torch's own CUDA profiler extensions, which polyprof does not run; they are "
                "ignored",
                PolyprofWarning,
                stacklevel=4,
            )
        value = value.activity_types
    if value is None and rules.activity_configs:
        return None
    if isinstance(value, (str, bytes)):
        raise UnknownActivityTypeError(
            f"the activity types for {act.name} must be a list of names, not the string {value!r} "
            f"(torch would read it letter by letter){_valid_type_names(act)}"
        )
    try:
        names = frozenset(value)
    except TypeError:
        raise TypeError(
            f"the activity types for {act.name} must be a list of activity type names, got {value!r}"
            f"{_valid_type_names(act)}"
        ) from None
    if act is ProfilerActivity.CPU:
        unknown = sorted(str(n) for n in names if n not in CPU_GROUP_ACTIVITY_TYPES)
        if unknown:
            raise UnknownActivityTypeError(
                "Unknown or non-member activity type name for ProfilerActivity.CPU: "
                f"{', '.join(map(repr, unknown))}"
                f"{_valid_type_names(act)}"
            )
    return names


def _valid_type_names(act: ProfilerActivity) -> str:
    if act is ProfilerActivity.CPU:
        return f"; valid names for ProfilerActivity.CPU (case matters): {', '.join(CPU_GROUP_ACTIVITY_TYPES)}"
    return (
        f"; valid names for ProfilerActivity.{act.name} are Kineto's activity types, such as "
        "['CONCURRENT_KERNEL']"
    )


def parse_activities(
    activities: Iterable[Any] | None,
    use_cuda: bool | None = None,
) -> tuple[frozenset[ProfilerActivity] | None, dict[ProfilerActivity, frozenset[str]]]:
    """Read ``activities`` exactly as the installed torch's ``torch.profiler.profile`` does.

    Items are activities, or (torch 2.12+) dicts mapping an activity to the
    activity type names to keep (torch 2.15+ also takes a ``ProfilerActivityConfig``).
    Returns ``(activities, filters)``; activities is None for torch's default.
    The exception types are torch's: TypeError for an item of the wrong type
    (or a dict on a torch without filters), ValueError for an activity given
    twice (torch 2.12+; older ones drop the repeat), ``NoActivitiesError``
    (an AssertionError) when nothing is left, ``UnknownActivityTypeError`` (a
    RuntimeError) for a CPU type name torch's collector refuses. ``use_cuda`` is
    torch's deprecated flag: as in torch it only counts towards "nothing is
    left" (torch records the activities as given whatever it says).
    """
    rules = activity_rules()
    if activities is None:
        return None, {}
    if isinstance(activities, (str, bytes)):
        # torch iterates a string letter by letter: a TypeError where it parses items first, else
        # "no activity found" (AssertionError).
        error = TypeError if rules.dict_items and not rules.scan_first else NoActivitiesError
        raise error(
            f"activities must be a list of {_VALID_ITEMS}, not the string {activities!r} (read letter by "
            "letter, it names no activity); e.g. activities=[ProfilerActivity.CPU]"
        )
    if isinstance(activities, Mapping):
        # torch iterates a dict given as ``activities``: its keys, with the values unused.
        activities = list(activities)
    try:
        items = list(activities)
    except TypeError:
        raise TypeError(f"activities must be a list of {_VALID_ITEMS}, got {activities!r}") from None
    if not rules.dict_items:
        return _parse_without_filters(items, use_cuda, rules), {}
    if rules.scan_first:
        scanned = {i for i in items if _as_activity(i) is not None}
        scanned |= {k for i in items if isinstance(i, dict) for k in i}
        _check_not_empty(scanned, use_cuda, items)
    chosen: list[ProfilerActivity] = []
    filters: dict[ProfilerActivity, frozenset[str]] = {}

    def add(act: ProfilerActivity) -> None:
        if act in chosen:
            raise ValueError(
                f"Activity ProfilerActivity.{act.name} specified more than once in activities={items!r}; "
                "give each activity once, either alone or as a dict key with its activity types"
            )
        chosen.append(act)

    for item in items:
        act = _as_activity(item)
        if act is not None:
            add(act)
        elif isinstance(item, dict):
            for key, value in item.items():
                act = _as_activity(key)
                if act is None:
                    raise TypeError(
                        f"activity filter key {key!r} is not a ProfilerActivity; activities takes "
                        f"{_VALID_ITEMS}"
                    )
                add(act)
                names = _filter_names(act, value, rules)
                if names is not None:
                    filters[act] = names
        else:
            raise TypeError(
                f"Expected ProfilerActivity or dict in activities, got {type(item).__name__} {item!r}; "
                f"activities takes {_VALID_ITEMS}"
            )
    if not rules.scan_first:
        _check_not_empty(set(chosen), use_cuda, items)
    return frozenset(chosen), filters


def _parse_without_filters(
    items: list[Any], use_cuda: bool | None, rules: ActivityRules
) -> frozenset[ProfilerActivity] | None:
    """torch 2.6 to 2.11: ``set(activities) if activities else default`` (repeats merge, dicts refused)."""
    if not items:
        return None
    chosen: list[ProfilerActivity] = []
    ignored = []
    for item in items:
        if isinstance(item, dict):
            raise TypeError(
                f"activities item {item!r} is an activity filter, which torch {rules.torch_version} does not "
                f"take (torch 2.12 and newer do); pass ProfilerActivity values (valid activities are: "
                f"{_VALID_ACTIVITIES})"
            )
        try:
            hash(item)
        except TypeError:
            raise TypeError(
                f"unhashable type in activities: {item!r}; activities takes ProfilerActivity values (valid "
                f"activities are: {_VALID_ACTIVITIES})"
            ) from None
        act = _as_activity(item)
        if act is None:
            ignored.append(item)
        elif act not in chosen:
            chosen.append(act)
    if not chosen:
        raise NoActivitiesError(
            f"No activities specified for the profiler: {items!r} holds no ProfilerActivity; "
            f"valid activities are: {_VALID_ACTIVITIES}"
        )
    if ignored:
        # torch drops them silently; say so.
        warnings.warn(
            f"activities items {ignored!r} are not ProfilerActivity values; torch {rules.torch_version} "
            "ignores them, and so does polyprof",
            PolyprofWarning,
            stacklevel=4,
        )
    _check_not_empty(set(chosen), use_cuda, items)
    return frozenset(chosen)


def _check_not_empty(found: set[Any], use_cuda: bool | None, items: list[Any]) -> None:
    left = {a if _as_activity(a) is None else _as_activity(a) for a in found}
    if use_cuda:
        left.add(ProfilerActivity.CUDA)
    elif use_cuda is not None:
        left.discard(ProfilerActivity.CUDA)
    if not left:
        raise NoActivitiesError(
            f"No valid profiler activities found in activities={items!r}"
            + (f" with use_cuda={use_cuda}" if use_cuda is not None else "")
            + f"; valid activities are: {_VALID_ACTIVITIES}"
        )


def torch_activity_configs(activities: Iterable[Any] | None) -> dict[Any, Any]:
    """torch 2.15's ``activity_configs`` of ``activities`` (already checked by ``parse_activities``).

    As ``torch.profiler.profile`` keeps it: each dict item's key as given, mapped to its
    ``ProfilerActivityConfig``, the one given or, for a list of activity type names, one made of
    that list (``ProfilerActivityConfig(activity_types=[...])``); bare activities have no entry and
    ``activities=None`` gives ``{}``.
    """
    if activities is None:
        return {}
    import torch.profiler.profiler as torch_profiler

    config_type = vars(torch_profiler)["ProfilerActivityConfig"]  # torch 2.15+ (activity_rules())

    configs: dict[Any, Any] = {}
    for item in activities:  # a Mapping given as activities: its keys, no dict items (as torch)
        if isinstance(item, dict):
            for key, value in item.items():
                configs[key] = value if isinstance(value, config_type) else config_type(activity_types=value)
    return configs


def warn_torch_deprecations(with_modules: bool, experimental_config: Any, *, stacklevel: int = 1) -> None:
    """Give the warnings the installed torch's profilers give for the deprecated settings that are on.

    torch 2.14 deprecates ``with_modules`` and the ``profiler_metrics`` and
    ``profiler_measure_per_kernel`` options of ``_ExperimentalConfig``; 2.15
    ``with_modules`` and ``adjust_profiler_step``. Each is a ``FutureWarning``
    with torch's words, asked of the installed torch
    (``polyprof.base.torch_support.setting_deprecation``), in torch's order, once per
    distinct message (torch gives one warning for both metrics options).
    ``stacklevel`` 1 names the caller's line, as ``warnings.warn`` counts.
    """
    given: set[str] = set()
    for setting, _ in DEPRECATABLE_SETTINGS:
        value = (
            with_modules if setting == "with_modules" else experimental_option(experimental_config, setting)
        )
        if not value:
            continue
        notice = setting_deprecation(setting)
        if notice is not None and notice.message not in given:
            given.add(notice.message)
            warnings.warn(notice.message, notice.category, stacklevel=stacklevel + 1)


class profile:  # noqa: N801 - torch's name
    """Profile a block of code; the same arguments and methods as ``torch.profiler.profile``.

    ``with polyprof.profile(activities=[ProfilerActivity.CPU]) as prof: ...``
    then ``prof.key_averages().table(...)``, ``prof.export_chrome_trace(path)``.
    """

    def __init__(
        self,
        *,
        activities: Iterable[Any] | Mapping[Any, Iterable[str]] | None = None,
        schedule: Callable[[int], Any] | None = None,
        on_trace_ready: Callable[[Any], Any] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        experimental_config: Any = None,
        execution_trace_observer: Any = None,
        acc_events: bool = False,
        use_cuda: bool | None = None,
        custom_trace_id_callback: Callable[[], str] | None = None,
        post_processing_timeout_s: float | None = None,
        plugin_manager: Any = None,
    ) -> None:
        if use_cuda is not None:
            warnings.warn(
                "`use_cuda` is deprecated, use `activities` argument instead", FutureWarning, stacklevel=2
            )
            use_cuda = truth_flag("use_cuda", use_cuda)
        if isinstance(activities, Iterator):  # read twice below (the activities, torch's attribute)
            activities = list(activities)
        # As in torch (2.6 to 2.13), use_cuda only counts towards "no activity left": the
        # activities recorded are the ones given (or the default set).
        acts, filters = parse_activities(activities, use_cuda=use_cuda)
        check_callable(
            "schedule",
            schedule,
            takes="the step number and returns a ProfilerAction (polyprof.schedule(...))",
            arguments=1,
        )
        check_callable(
            "on_trace_ready",
            on_trace_ready,
            takes="the profile (e.g. tensorboard_trace_handler)",
            arguments=1,
        )
        check_callable(
            "custom_trace_id_callback",
            custom_trace_id_callback,
            takes="no arguments and returns a str",
            arguments=0,
        )
        check_experimental_config(experimental_config)
        check_execution_trace_observer(execution_trace_observer)
        check_timeout("post_processing_timeout_s", post_processing_timeout_s)
        check_plugin_manager(plugin_manager)
        self.activities_requested = acts
        self.activity_filters = filters
        if activity_rules().activity_configs:
            #: torch 2.15+'s attribute: ``{activity: ProfilerActivityConfig}`` of the dict items of
            #: ``activities`` (``torch_activity_configs``); absent before 2.15, as in torch.
            self.activity_configs = torch_activity_configs(activities)
        self.record_shapes = config_flag("record_shapes", record_shapes)
        self.profile_memory = config_flag("profile_memory", profile_memory)
        self.with_stack = config_flag("with_stack", with_stack)
        self.with_flops = config_flag("with_flops", with_flops)
        self.with_modules = config_flag("with_modules", with_modules)
        self.experimental_config = experimental_config
        self.execution_trace_observer = execution_trace_observer
        self.acc_events = truth_flag("acc_events", acc_events)
        self.custom_trace_id_callback = custom_trace_id_callback
        #: Checked, then a deliberate difference (docs/user-guide.md): torch cuts its Python
        #: post-processing at this deadline and returns partial events; polyprof's is columnar and
        #: lazy, and keeps every event.
        self.post_processing_timeout_s = post_processing_timeout_s
        self.on_trace_ready = on_trace_ready
        self.record_steps = schedule is not None
        self.schedule = schedule if schedule is not None else default_schedule
        self.step_num = 0
        self.current_action = coerce_action(self.schedule(self.step_num))
        self.step_rec_fn: record_function | None = None
        self.preset_metadata: dict[str, str] = {}
        self._plugin_manager = plugin_manager
        #: Whether preparing a cycle gives torch's deprecation warnings (``warn_torch_deprecations``),
        #: as ``torch.profiler.profile`` does; a frontend that composes this profile gives its own.
        self._gives_torch_deprecations = True
        #: The gate and the session, from creation to close (polyprof.runtime.recording).
        self._lifecycle = Recording(self, self._create_session)
        self._prepared = False
        #: torch's ``self.profiler is not None``: a cycle was prepared at least once.
        self._initialized = False
        self._trace_id: str | None = None
        self._cycle_metadata: dict[str, str] = {}
        self._has_cudagraphs = False
        self._traces: list[Any] = []
        self._results: Any = None
        self._cleared_warned = False
        #: torch's attribute: the last ``export_memory_timeline``'s timeline.
        self.mem_tl: Any = None
        #: torch's raw result of the last cycle, kept for the memory timeline
        #: (polyprof.runtime.memory_timeline).
        self._memory_profile_results: tuple[Any, ...] = ()
        # torch's step count for Kineto (on-demand tracing, optimizer step hooks) is registered
        # here and erased at exit, as torch.profiler.profile does; without torch there is none.
        self._step_tracker = _kineto_step_tracker()
        if self._step_tracker is not None:
            self._step_tracker.init_step_count(PROFILER_STEP_NAME)

    @classmethod
    def on_behalf_of(cls, frontend: object, **kwargs: Any) -> profile:
        """A profile that records for ``frontend``, another polyprof frontend that composes it.

        For frontends with another class's API (the autograd shim composes one):
        the process's recording gate names ``frontend`` as the recording's holder,
        so a second recording's error, and ``polyprof run``'s note when the script
        starts its own profiler, name the class the user made. ``kwargs`` are
        ``profile``'s arguments.
        """
        prof = cls(**kwargs)
        prof._lifecycle = Recording(frontend, prof._create_session)
        # the frontend's API is what the user called: it gives the installed torch's deprecation
        # warnings of that API itself (torch's autograd profile gives them when it is made)
        prof._gives_torch_deprecations = False
        return prof

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        try:
            self.stop()
            # Erased only after a clean stop, as in torch's __exit__.
            if self._step_tracker is not None:
                self._step_tracker.erase_step_count(PROFILER_STEP_NAME)
        finally:
            if self.execution_trace_observer is not None:
                self.execution_trace_observer.cleanup()

    def start(self) -> None:
        """Begin profiling (what ``__enter__`` does)."""
        self._lifecycle.open()
        try:
            self._transit_action(ProfilerAction.NONE, self.current_action)
        except BaseException:
            self._lifecycle.abort()
            self._lifecycle.close()
            raise
        if self.record_steps:
            self.step_rec_fn = record_function(f"{PROFILER_STEP_NAME}#{self.step_num}")
            self.step_rec_fn.__enter__()

    def stop(self) -> None:
        """End profiling (what ``__exit__`` does); delivers a pending cycle to ``on_trace_ready``.

        The session then ends: plugins hear ``polyprof_session_finish`` and exporters shut down.
        In a child process forked while recording, it only lets go: the data is the parent's.
        """
        if self._lifecycle.in_forked_child:
            self._prepared = False
            self._lifecycle.close()
            return
        try:
            if self.record_steps and self.step_rec_fn is not None:
                self.step_rec_fn.__exit__(None, None, None)
                self.step_rec_fn = None
            self._transit_action(self.current_action, None)
        finally:
            self._lifecycle.abort()
            self._prepared = False
            self._lifecycle.close()

    def step(self) -> None:
        """Signal that the next training step starts (in a child forked while recording: nothing)."""
        if self._lifecycle.in_forked_child:
            return  # the recording and its schedule are the parent's (polyprof.runtime.recording)
        if self.record_steps and self.step_rec_fn is not None:
            self.step_rec_fn.__exit__(None, None, None)
            self.step_rec_fn = None
        prev_action = self.current_action
        next_action = coerce_action(self.schedule(self.step_num + 1))
        self.step_num += 1
        self.current_action = next_action
        self._transit_action(prev_action, next_action)
        if self._step_tracker is not None and _step_hook_enabled():
            self._step_tracker.increment_step(PROFILER_STEP_NAME)
        if self.record_steps:
            self.step_rec_fn = record_function(f"{PROFILER_STEP_NAME}#{self.step_num}")
            self.step_rec_fn.__enter__()

    # ------------------------------------------------------ state machine

    def _transit_action(self, prev: ProfilerAction, new: ProfilerAction | None) -> None:
        for action in _ACTION_MAP.get((prev, new), ()):
            action(self)

    def _warn_incorrect(self, prev: str, new: str) -> None:
        warnings.warn(f"Incorrect schedule: {prev} followed by {new}", stacklevel=4)

    def prepare_trace(self) -> None:
        self._has_cudagraphs = _load_inductor_config()
        if self._traces and not self.acc_events and not self._cleared_warned:
            self._cleared_warned = True
            warnings.warn(ACC_EVENTS_WARNING, stacklevel=4)
        if self._gives_torch_deprecations and not (self._initialized and self.acc_events):
            # where torch's prepare_trace makes its autograd profile, whose __init__ warns (2.14+)
            warn_torch_deprecations(self.with_modules, self.experimental_config)
        if not self.acc_events:
            # as torch's prepare_trace drops its profiler: the last cycle's raw result is not held
            # while the next records, and the memory timeline has nothing until the next cycle stops
            self._memory_profile_results = ()
        self._trace_id = self._make_trace_id()
        self._lifecycle.prepare(trace_id=self._trace_id)
        self._prepared = True
        self._initialized = True

    def start_trace(self) -> None:
        if self.execution_trace_observer is not None:
            self.execution_trace_observer.start()
        if not self._prepared:
            self.prepare_trace()
        self._cycle_metadata = {}
        for flag in CONFIG_FLAG_KEYS:
            if getattr(self, flag):
                self._cycle_metadata[flag] = "1"
        self._note_distributed_info()
        self._lifecycle.start()
        if self._has_cudagraphs and _cupti_teardown_breaks_cuda_graphs():
            # torch.profiler's own workaround, at the same point: CUDA graphs crash on a re-init of
            # CUPTI after its teardown (CUDA 11 on the first lazy one, CUDA 12 on the second).
            os.environ["DISABLE_CUPTI_LAZY_REINIT"] = "1"
            self._cycle_metadata["DISABLE_CUPTI_LAZY_REINIT"] = "1"
            os.environ["TEARDOWN_CUPTI"] = "0"
        self._cycle_metadata.update(self.preset_metadata)

    def _note_distributed_info(self) -> None:
        """Put the process group's facts in this cycle's trace as ``distributedInfo``, unless they are.

        As torch, at the start of each cycle; polyprof also at its end, for a group that came up
        during the cycle (a whole-script profile, ``polyprof run``), and ``polyprof run`` just before
        the script destroys its group.
        """
        if "distributedInfo" in self._cycle_metadata:
            return
        dist_info = distributed_info()
        if dist_info is not None:
            # numpy numbers as numbers, as torch's _NumpyEncoder writes them
            self._cycle_metadata["distributedInfo"] = json.dumps(dist_info, default=_json_number)

    def stop_trace(self) -> None:
        if self.execution_trace_observer is not None:
            self.execution_trace_observer.stop()
        if not self._initialized:
            # torch's rule: stopping a profile that never started is an error, and on_trace_ready
            # (which comes after this) must not be handed a profile without data.
            raise ProfilerNotStartedError(
                "Profiler must be initialized before stopping trace: stop() was called on a profile that "
                "was never started; call start() first (or use `with polyprof.profile(...) as prof:`)"
            )
        if not self._lifecycle.recording:
            return
        self._prepared = False
        self._note_distributed_info()
        trace = self._lifecycle.stop(metadata_json=self._cycle_metadata, trace_id=self._trace_id or "")
        self._memory_profile_results = _memory_profile_results(self._lifecycle.session)
        if self.acc_events:
            self._traces.append(trace)
        else:
            self._traces = [trace]
        self._results = None

    def _trace_ready(self) -> None:
        if self._traces:
            self._lifecycle.trace_ready(self._traces[-1])
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    # ------------------------------------------------------------ session

    def _create_session(self) -> Any:
        """A new ``Session`` for this profile's settings (``Recording`` calls it)."""
        from polyprof.runtime.session import Session

        flags: dict[str, Any] = experimental_flags(self.experimental_config)
        if flags["trace_only"] and self.with_stack:
            # torch's own rule and words (torch.profiler.profile.__init__, 2.13+)
            warnings.warn(
                "trace_only=True is incompatible with with_stack=True (stack traces require event "
                "post-processing). Disabling trace_only.",
                stacklevel=2,
            )
            flags["trace_only"] = False
        return Session.create(
            activities=self.activities_requested,
            activity_filters=self.activity_filters,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
            experimental_config=self.experimental_config,
            plugin_manager=self._plugin_manager,
            **flags,
        )

    def _make_trace_id(self) -> str:
        if self.custom_trace_id_callback is not None:
            return str(self.custom_trace_id_callback())
        return f"{uuid.uuid4().int:032X}"

    def set_custom_trace_id_callback(self, callback: Callable[[], str]) -> None:
        """Set the trace id generator, called at the start of each cycle."""
        check_callable("callback", callback, takes="no arguments and returns a str", arguments=0)
        self.custom_trace_id_callback = callback

    def get_trace_id(self) -> str | None:
        """The current (or last) cycle's trace id."""
        return self._trace_id

    # ------------------------------------------------------------ results

    @property
    def config(self) -> ProfileConfig | None:
        session = self._lifecycle.session
        return session.config if session is not None else None

    @property
    def activities(self) -> frozenset[ProfilerActivity]:
        """The activities actually recorded (after dropping unusable ones)."""
        if self._lifecycle.session is not None:
            return self._lifecycle.session.config.activities
        return self.activities_requested or frozenset({ProfilerActivity.CPU})

    @property
    def use_device(self) -> str | None:
        """torch's ``use_device``: the accelerator whose time the tables show (``polyprof.base.activity``)."""
        return use_device_for_activities(self.activities)

    def _require_results(self) -> Any:
        if not self._traces:
            if self._lifecycle.in_forked_child:
                raise RuntimeError(f"no profiling data: {self._lifecycle.forked_child_message()}")
            if self._lifecycle.recording:
                raise RuntimeError(
                    "the profiler is still recording: results are available after the with-block ends "
                    "(or after stop(), or in on_trace_ready)"
                )
            raise RuntimeError(
                "no profiling data: nothing was recorded (was the profiler started, and did the schedule "
                "reach a RECORD step?)"
            )
        if self._results is None:
            from polyprof.analysis.results import ProfileResults

            self._results = ProfileResults(
                traces=tuple(self._traces),
                use_device=self.use_device,
                aggregators=(
                    self._lifecycle.session.aggregators if self._lifecycle.session is not None else None
                ),
            )
        return self._results

    @property
    def trace(self) -> Any:
        """The last finished ``polyprof.base.trace.Trace``."""
        return self._require_results().traces[-1]

    def _refuse_if_trace_only(self) -> None:
        if self.config is not None and self.config.trace_only:
            raise RuntimeError(TRACE_ONLY_EVENTS_ERROR)

    def events(self) -> Any:
        """Every recorded event, as an ``EventList`` of ``FunctionEvent``."""
        self._refuse_if_trace_only()
        return self._require_results().events()

    def key_averages(
        self,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
        include_python_functions: bool | None = None,
    ) -> Any:
        """Events averaged by name (and optionally shapes, stack, overload).

        ``include_python_functions`` (torch 2.14+): None follows the installed torch, which
        leaves python_function events out from 2.14 and keeps them before.
        """
        from polyprof.analysis.event_list import check_stack_n

        self._refuse_if_trace_only()
        check_stack_n(group_by_stack_n)  # before "no data", as torch checks its arguments first
        return self._require_results().key_averages(
            group_by_input_shape=group_by_input_shape,
            group_by_stack_n=group_by_stack_n,
            group_by_overload_name=group_by_overload_name,
            include_python_functions=include_python_functions,
        )

    def export_chrome_trace(self, path: str | os.PathLike[str], use_python_export: bool = False) -> str:
        """Write the last cycle's trace as Kineto-shaped Chrome JSON (``.gz`` compresses)."""
        results = self._require_results()
        return self._export("chrome", results.traces[-1], os.fspath(path))

    def export_stacks(self, path: str | os.PathLike[str], metric: str = "self_cpu_time_total") -> str:
        """Write collapsed stacks (flame graph input); needs ``with_stack=True``."""
        if not self.with_stack:
            raise RuntimeError(
                "export_stacks() requires with_stack=True (and, as in torch, "
                "experimental_config=_ExperimentalConfig(verbose=True) so that ops carry stacks)"
            )
        results = self._require_results()
        return self._export("stacks", results.merged_trace(), os.fspath(path), metric=metric)

    def export(
        self,
        path: str | os.PathLike[str],
        format: str = "chrome",  # noqa: A002
        *,
        metadata_json: Mapping[str, str] | None = None,
        **options: Any,
    ) -> str:
        """Write the last cycle's trace with any installed exporter, chosen by name.

        :param metadata_json: top-level metadata for this file only: keys mapped to raw JSON
            text, as in ``add_metadata_json`` (torch's autograd profile takes it in its
            ``export_chrome_trace``).
        :param options: the exporter's own options.
        :raises polyprof.runtime.exporting.ExportTimeoutError: the exporter did not finish within its
            deadline (``POLYPROF_EXPORT_TIMEOUT_S``); no unfinished file is left at ``path``.
        """
        trace = self._require_results().traces[-1]
        if metadata_json:
            for key, value in metadata_json.items():
                _check_json(key, value)
            trace = attrs.evolve(trace, metadata_json={**trace.metadata_json, **metadata_json})
        return self._export(format, trace, os.fspath(path), **options)

    def export_memory_timeline(self, path: str | os.PathLike[str], device: str | None = None) -> None:
        """Write torch's memory timeline of the last cycle: memory over time by category.

        As the installed torch's ``export_memory_timeline`` (its ``FutureWarning`` included, 2.13+):
        ``path`` ending in ``.html`` gets a plot (needs matplotlib), ``raw.json.gz`` the raw
        events, other ``.gz`` and any other suffix ``[times, sizes by category]`` (gzipped or
        JSON); ``device`` defaults to device 0 of the profile's accelerator, else ``cpu``. Needs
        ``record_shapes``, ``profile_memory`` and ``with_stack`` (``ValueError`` names those off).
        """
        from polyprof.runtime import memory_timeline

        memory_timeline.require_torch()
        memory_timeline.warn_if_torch_deprecates(stacklevel=2)
        if device is None:
            device = memory_timeline.default_device(self.use_device)
        memory_timeline.check_flags(self)
        self.mem_tl = memory_timeline.build_timeline(self._memory_profile_results)
        memory_timeline.export(self.mem_tl, os.fspath(path), device)

    def _export(self, name: str, trace: Any, path: str, **options: Any) -> str:
        # Bounded: a hanging exporter plugin raises ExportTimeoutError naming it instead of hanging here.
        return self._lifecycle.export(name, trace, path, **options)

    def add_metadata(self, key: str, value: str) -> None:
        """Add a string value to the trace's top-level metadata."""
        self.add_metadata_json(key, json.dumps(str(value)))

    def add_metadata_json(self, key: str, value: str) -> None:
        """Add a raw JSON value to the trace's top-level metadata (current cycle)."""
        _check_json(key, value)
        if not self._lifecycle.recording:
            log.warning("metadata_outside_recording", key=key)
            warnings.warn(
                f"add_metadata({key!r}) called while the profiler is not recording: it is skipped "
                "(use preset_metadata_json to add it to the next cycle)",
                stacklevel=2,
            )
            return
        self._cycle_metadata[key] = value

    def preset_metadata_json(self, key: str, value: str) -> None:
        """Add a raw JSON value to every following cycle's trace metadata."""
        _check_json(key, value)
        self.preset_metadata[key] = value

    def toggle_collection_dynamic(self, enable: bool, activities: Iterable[Any]) -> None:
        """Pause or resume collection of ``activities`` without ending the cycle."""
        wanted = frozenset(coerce_activity(a) for a in activities)
        session = self._lifecycle.live_session
        if session is None:  # as torch: nothing to toggle before a cycle is prepared or after the end
            return
        session.toggle_collection(enable, wanted)

    @property
    def bus_statistics(self) -> Any:
        """Counters of the event bus: received, delivered and dropped per subscriber."""
        session = self._lifecycle.session
        return session.statistics() if session is not None else None

    def __repr__(self) -> str:
        acts = ",".join(sorted(a.name for a in self.activities))
        action = self.current_action.name
        return f"<polyprof.profile activities={acts} step_num={self.step_num} action={action}>"


def _memory_profile_results(session: Any) -> tuple[Any, ...]:
    """The raw results the session's driver of torch's collector kept for the memory timeline."""
    from polyprof.runtime.torch_result import TorchCollectorOwner

    for tracer in session.tracers:
        if isinstance(tracer, TorchCollectorOwner):
            return tracer.memory_profile_results()
    return ()


def _kineto_step_tracker() -> Any:
    """torch's ``KinetoStepTracker`` (``torch.autograd.profiler``), or None without torch."""
    try:
        from torch.autograd.profiler import KinetoStepTracker
    except ImportError:
        return None
    return KinetoStepTracker


def _step_hook_enabled() -> bool:
    """Whether torch's ``profile.step()`` counts the step for Kineto in this process.

    torch 2.6 counts every step; from 2.7 on only with a Kineto daemon
    (``KINETO_USE_DAEMON``) or, in Meta's own builds, ``KINETO_FORCE_STEP_HOOK``.
    Read at each step, as torch does.
    """
    from polyprof.base.torch_support import installed

    try:
        if not installed().at_least(2, 7):
            return True
    except (ImportError, AttributeError):  # a torch without the profiler: follow the newest rule
        pass
    if os.environ.get("KINETO_USE_DAEMON", ""):
        return True
    try:
        from torch._environment import is_fbcode
    except ImportError:
        return False
    return bool(is_fbcode() and os.environ.get("KINETO_FORCE_STEP_HOOK", ""))


def _load_inductor_config() -> bool:
    """What torch.profiler.profile.prepare_trace does first on every release 2.6-2.15.

    Returns Inductor's ``triton.cudagraphs`` (torch's ``has_cudagraphs``), False without Inductor.

    ``hasattr(torch, "_inductor")`` imports Inductor (hundreds of modules, sympy
    among them) before the collector starts. Skipping it moved that import into
    the first profiled step of a fresh process: with ``with_stack`` torch's
    Python tracer then recorded over a million import frames, and with
    ``verbose`` stacks its ``_disable_profiler`` ran out of memory
    (``polyprof run --with-stack`` on a small training script: 19 GB, then
    std::bad_alloc or undecodable names).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if hasattr(torch, "_inductor"):
            import torch._inductor.config as inductor_config

            return bool(inductor_config.triton.cudagraphs)
    except Exception:  # torch.profiler lets this raise; a broken Inductor must not stop profiling
        log.debug("inductor_config_unavailable", exc_info=True)
    return False


def _cupti_teardown_breaks_cuda_graphs() -> bool:
    """The installed torch.profiler's test for keeping CUPTI up under Inductor's CUDA graphs.

    Torch with ``profiler_allow_cudagraph_cupti_lazy_reinit_cuda12`` keeps it up before CUDA 12.6
    or when that switch says no; older torch (2.6) always does.
    """
    torch = sys.modules["torch"]
    try:
        from torch._utils_internal import profiler_allow_cudagraph_cupti_lazy_reinit_cuda12
    except ImportError:
        return True
    cuda = getattr(torch.version, "cuda", None)
    if isinstance(cuda, str):
        numbers = tuple(int(part) for part in cuda.split(".")[:2] if part.isdigit())
        if numbers < (12, 6):
            return True
    return not profiler_allow_cudagraph_cupti_lazy_reinit_cuda12()


def _check_json(key: str, value: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"metadata key must be a non-empty str, got {key!r}")
    try:
        json.loads(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata value for {key!r} is not valid JSON: {value!r} ({exc})") from None


def _json_number(value: Any) -> Any:
    """torch's ``_NumpyEncoder``: numpy scalars as numbers, arrays as lists."""
    tolist = getattr(value, "tolist", None)
    if tolist is None:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return tolist()


def _stop_and_save(p: profile) -> None:
    p.stop_trace()
    p._trace_ready()


_A = ProfilerAction
_ACTION_MAP: dict[tuple[ProfilerAction, ProfilerAction | None], tuple[Callable[[profile], None], ...]] = {
    (_A.NONE, _A.NONE): (),
    (_A.NONE, _A.WARMUP): (profile.prepare_trace,),
    (_A.NONE, _A.RECORD): (profile.prepare_trace, profile.start_trace),
    (_A.NONE, _A.RECORD_AND_SAVE): (profile.prepare_trace, profile.start_trace),
    (_A.WARMUP, _A.NONE): (
        lambda p: p._warn_incorrect("WARMUP", "NONE"),
        profile.start_trace,
        profile.stop_trace,
    ),
    (_A.WARMUP, _A.WARMUP): (),
    (_A.WARMUP, _A.RECORD): (profile.start_trace,),
    (_A.WARMUP, _A.RECORD_AND_SAVE): (profile.start_trace,),
    (_A.RECORD, _A.NONE): (lambda p: p._warn_incorrect("RECORD", "NONE"), profile.stop_trace),
    (_A.RECORD, _A.WARMUP): (lambda p: p._warn_incorrect("RECORD", "WARMUP"), profile.stop_trace),
    (_A.RECORD, _A.RECORD): (),
    (_A.RECORD, _A.RECORD_AND_SAVE): (),
    (_A.RECORD_AND_SAVE, _A.NONE): (_stop_and_save,),
    (_A.RECORD_AND_SAVE, _A.WARMUP): (_stop_and_save, profile.prepare_trace),
    (_A.RECORD_AND_SAVE, _A.RECORD): (_stop_and_save, profile.prepare_trace, profile.start_trace),
    (_A.RECORD_AND_SAVE, _A.RECORD_AND_SAVE): (_stop_and_save, profile.prepare_trace, profile.start_trace),
    (_A.WARMUP, None): (profile.start_trace, profile.stop_trace),
    (_A.RECORD, None): (_stop_and_save,),
    (_A.RECORD_AND_SAVE, None): (_stop_and_save,),
}


def tensorboard_trace_handler(
    dir_name: str | os.PathLike[str],
    worker_name: str | None = None,
    use_gzip: bool = False,
    use_python_export: bool = False,
) -> Callable[[profile], None]:
    """An ``on_trace_ready`` handler writing ``<worker>.<ns>.pt.trace.json[.gz]`` into ``dir_name``.

    The default worker is torch's ``<hostname>_<pid>``, led by the rank in a distributed job
    (``rank03_<hostname>_<pid>``, zero-padded to the world size), so each rank's files are named
    by rank and sort by it.
    """
    directory = os.fspath(dir_name)

    def handler_fn(prof: profile) -> None:
        try:
            os.makedirs(directory, exist_ok=True)
        except Exception as exc:
            raise RuntimeError("Can't create directory: " + directory) from exc
        worker = worker_name or default_worker_name(socket.gethostname(), os.getpid())
        file_name = f"{worker}.{time.time_ns()}.pt.trace.json"
        if use_gzip:
            file_name += ".gz"
        prof.export_chrome_trace(os.path.join(directory, file_name), use_python_export=use_python_export)

    return handler_fn
