"""Which activities a session records, decided in one place.

Three steps, each with the errors and warnings users see:

1. ``resolve_activities``: the requested activities (None: every one some
   loaded plugin records here, as torch's ``supported_activities()``) -> the
   ones a loaded plugin provides. An activity that only an installed but
   unusable plugin provides warns (``ActivityUnavailableWarning``) and is
   dropped; one that nothing installed provides is an
   ``ActivityUnavailableError`` naming the distribution to install
   (``explain_missing_activity``).
2. ``make_tracers``: what plugins ask torch's collector to record
   (``polyprof_torch_collector_activities``), then the tracers
   (``polyprof_make_tracers``), each plugin isolated: one that fails is
   skipped and recorded as a ``HookFailure``.
3. ``activities_with_tracers``: the final set, the activities some tracer
   covers; an activity whose plugin failed to make its tracer warns and is
   dropped.

``polyprof.session.Session.create`` runs the three; ``polyprof run`` runs the
first before the script starts, so a bad ``--activities`` fails early. The
plugin manager's ``provider_of``, ``supported_activities``,
``check_activities`` and ``explain_missing_activity`` answer from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from polyprof.activity import DISTRIBUTION_FOR_ACTIVITY, ProfilerActivity, coerce_activity
from polyprof.errors import ActivityUnavailableError
from polyprof.plugin_calls import HookFailure, PluginCallError
from polyprof.plugin_discovery import canonical_name
from polyprof.plugin_info import PluginInfo
from polyprof.torch_result import TORCH_COLLECTOR_ACTIVITY_NAMES
from polyprof.user_warnings import warn_activity_unavailable

if TYPE_CHECKING:
    from polyprof.components import Tracer
    from polyprof.config import ProfileConfig
    from polyprof.registry import PolyprofPluginManager

__all__ = [
    "TracersMade",
    "activities_with_tracers",
    "check_activities",
    "check_collector_answer",
    "check_tracers_cover",
    "explain_missing_activity",
    "make_tracers",
    "provider_of",
    "resolve_activities",
    "supported_activities",
    "unavailable_provider",
]

_MAKE_TRACERS = "polyprof_make_tracers"


# ------------------------------------------------------------- who provides what


def provider_of(infos: Sequence[PluginInfo], activity: Any) -> PluginInfo | None:
    """The loaded plugin that provides ``activity`` (the last registered wins), or None."""
    activity = coerce_activity(activity)
    for info in reversed(infos):
        if info.loaded and info.capabilities is not None and activity in info.capabilities.activities:
            return info
    return None


def supported_activities(infos: Iterable[PluginInfo]) -> frozenset[ProfilerActivity]:
    """Activities that some loaded plugin can record here."""
    return frozenset(
        act for info in infos if info.loaded and info.capabilities for act in info.capabilities.activities
    )


def unavailable_provider(infos: Iterable[PluginInfo], activity: ProfilerActivity) -> str | None:
    """``plugin 'x': <reason>`` for an installed plugin that provides ``activity`` but cannot run here."""
    for info in infos:
        caps = info.capabilities
        if info.status == "unavailable" and caps is not None and activity in caps.activities:
            return f"plugin {info.name!r}: {info.reason}"
    return None


def explain_missing_activity(infos: Sequence[PluginInfo], activity: ProfilerActivity) -> str:
    """Why no loaded plugin records ``activity``, and what the user can do."""
    label = f"ProfilerActivity.{activity.name}"
    dist = DISTRIBUTION_FOR_ACTIVITY.get(activity)
    # A plugin that declared the activity, or comes from the distribution that should, but is not loaded.
    for info in reversed(infos):
        declares = info.capabilities is not None and activity in info.capabilities.activities
        from_dist = (
            dist is not None and info.distribution is not None and canonical_name(info.distribution) == dist
        )
        if not info.loaded and (declares or from_dist):
            origin = (
                f"the {info.distribution} plugin {info.name!r}"
                if info.distribution
                else f"plugin {info.name!r}"
            )
            what = {
                "failed": "is installed but failed to load",
                "unavailable": "is installed but unavailable here",
                "blocked": "is installed but blocked",
            }[info.status]
            detail = f": {info.reason}" if info.reason else ""
            return f"{label} comes from {origin}, which {what}{detail}"
    if dist is not None:
        return f"{label} needs the {dist} plugin: pip install {dist}"
    offered = sorted(a.name for a in supported_activities(infos))
    return (
        f"{label}: no installed polyprof plugin provides it; "
        f"activities available here: {', '.join(offered) or 'none'} (see `polyprof plugins`)"
    )


def check_activities(
    infos: Sequence[PluginInfo], activities: Iterable[Any]
) -> dict[ProfilerActivity, PluginInfo]:
    """Map each activity to its provider, or raise ``ActivityUnavailableError`` saying what to do."""
    providers: dict[ProfilerActivity, PluginInfo] = {}
    problems = []
    for value in activities:
        activity = coerce_activity(value)
        info = provider_of(infos, activity)
        if info is None:
            problems.append(explain_missing_activity(infos, activity))
        else:
            providers[activity] = info
    if problems:
        raise ActivityUnavailableError("; ".join(problems))
    return providers


# ------------------------------------------------------------ step 1: requested


def resolve_activities(
    pm: PolyprofPluginManager, requested: frozenset[ProfilerActivity] | None
) -> frozenset[ProfilerActivity]:
    """The activities to record: each must have a plugin; installed-but-unusable ones warn and drop.

    ``None`` means every activity some loaded plugin can record here (torch's
    ``supported_activities()``).

    :raises ActivityUnavailableError: an activity nothing installed provides, or none left.
    """
    infos = pm.plugin_infos()
    if requested is None:
        chosen = supported_activities(infos)
        if not chosen:
            raise ActivityUnavailableError(
                "no installed polyprof plugin can record anything here: "
                + explain_missing_activity(infos, ProfilerActivity.CPU)
            )
        return chosen
    usable = []
    for act in requested:
        if provider_of(infos, act) is not None:
            usable.append(act)
            continue
        unusable = unavailable_provider(infos, act)
        if unusable is None:
            raise ActivityUnavailableError(explain_missing_activity(infos, act))
        warn_activity_unavailable(act, unusable)
    if not usable:
        raise ActivityUnavailableError(
            "No activities left to profile: every requested activity is unavailable here "
            f"({', '.join(a.name for a in requested)})"
        )
    return frozenset(usable)


# -------------------------------------------------------------- step 2: tracers


def check_collector_answer(plugin: str, answer: Any) -> list[str]:
    """A plugin's ``polyprof_torch_collector_activities`` answer, checked: names of torch activities.

    :raises PluginCallError: not a collection of ``torch.profiler.ProfilerActivity`` member names.
    """
    names = None if isinstance(answer, str | bytes) or not isinstance(answer, Iterable) else list(answer)
    if names is None or not all(isinstance(n, str) for n in names):
        raise PluginCallError(
            f"plugin {plugin!r} answered polyprof_torch_collector_activities with {answer!r}; "
            "expected names of torch.profiler.ProfilerActivity members, e.g. ['CUDA']"
        )
    unknown = sorted(set(names) - set(TORCH_COLLECTOR_ACTIVITY_NAMES))
    if unknown:
        raise PluginCallError(
            f"plugin {plugin!r} asked torch's collector for {', '.join(unknown)}; valid: "
            f"{', '.join(TORCH_COLLECTOR_ACTIVITY_NAMES)}"
        )
    return names


def check_tracers_cover(
    infos: Sequence[PluginInfo],
    requested: Iterable[Any],
    covered: Iterable[ProfilerActivity],
    failed_plugins: Iterable[str] = (),
) -> None:
    """Every requested activity has a tracer, or its plugin failed (and was recorded as such).

    :raises ActivityUnavailableError: naming each activity left without a tracer and why.
    """
    failed = set(failed_plugins)
    missing = sorted(set(map(coerce_activity, requested)) - set(covered))
    problems = []
    for activity in missing:
        info = provider_of(infos, activity)
        if info is not None and info.name in failed:
            continue  # recorded as a hook failure; the caller goes on without it
        if info is None:
            problems.append(explain_missing_activity(infos, activity))
        else:
            problems.append(
                f"ProfilerActivity.{activity.name}: plugin {info.name!r} declares it but "
                "returned no tracer for it"
            )
    if problems:
        raise ActivityUnavailableError("; ".join(problems))


@attrs.frozen
class TracersMade:
    """The tracers a session's plugins made for its configuration (``make_tracers``)."""

    #: The configuration, with ``torch_activities`` set when plugins asked torch's collector for any.
    config: ProfileConfig
    tracers: tuple[Tracer, ...]
    #: The hooks that failed meanwhile (skipped), oldest first.
    failures: tuple[HookFailure, ...]


def make_tracers(pm: PolyprofPluginManager, config: ProfileConfig) -> TracersMade:
    """Ask torch's collector for what plugins need, then make the tracers, each plugin isolated."""
    seen = len(pm.hook_failures())
    torch_activities = pm.torch_collector_activities(config, isolate_errors=True)
    if torch_activities:
        config = attrs.evolve(config, torch_activities=torch_activities)
    tracers = pm.make_tracers(config, isolate_errors=True)
    return TracersMade(config=config, tracers=tuple(tracers), failures=pm.hook_failures()[seen:])


# ----------------------------------------------------------- step 3: final set


def activities_with_tracers(made: TracersMade) -> ProfileConfig:
    """The configuration with the activities some tracer covers; the others warn and drop.

    An activity is lost here only when its plugin failed to make its tracer
    (``check_tracers_cover`` let it through): the warning names the plugin.

    :raises ActivityUnavailableError: the plugins of every requested activity failed.
    """
    config = made.config
    covered = frozenset(coerce_activity(a) for t in made.tracers for a in t.activities) & config.activities
    lost = config.activities - covered
    if not lost:
        return config
    culprits = "; ".join(
        f"{f.label} failed in {_MAKE_TRACERS}: {f.error}" for f in made.failures if f.hook == _MAKE_TRACERS
    )
    for activity in sorted(lost):
        warn_activity_unavailable(activity, culprits)
    if not covered:
        raise ActivityUnavailableError(
            f"No activities left to profile: the plugins of every requested activity failed ({culprits})"
        )
    return attrs.evolve(config, activities=covered)
