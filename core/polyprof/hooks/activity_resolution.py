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
   (``polyprof_torch_collector_activities``, each answer checked), then the
   tracers (``polyprof_make_tracers``), each plugin isolated: one that fails
   is skipped and recorded as a ``HookFailure``. Two tracers that claim one
   activity or one name are a ``PluginCallError``; a requested activity left
   without a tracer, its plugin not failed, an ``ActivityUnavailableError``.
3. ``activities_with_tracers``: the final set, the activities some tracer
   covers; an activity whose plugin failed to make its tracer warns and is
   dropped.

``polyprof.runtime.session.Session.create`` runs the three; ``polyprof run`` runs the
first before the script starts, so a bad ``--activities`` fails early. The
plugin manager is asked only through the public calls ``Plugins`` lists (its
plugins' records, a hook called plugin by plugin, the tracers it type-checked);
it never calls back here for a policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from polyprof.base.activity import (
    DISTRIBUTION_FOR_ACTIVITY,
    TORCH_COLLECTOR_ACTIVITY_NAMES,
    ProfilerActivity,
    coerce_activity,
)
from polyprof.base.errors import ActivityUnavailableError
from polyprof.base.user_warnings import warn_activity_unavailable
from polyprof.hooks.plugin_calls import HookFailure, PluginCallError
from polyprof.hooks.plugin_discovery import ALLOW_LIST_ENV, canonical_name
from polyprof.hooks.plugin_info import PluginInfo

if TYPE_CHECKING:
    from polyprof.base.config import ProfileConfig
    from polyprof.hooks.components import Tracer

__all__ = [
    "Plugins",
    "TracersMade",
    "activities_with_tracers",
    "check_activities",
    "check_collector_answer",
    "check_tracer_claims",
    "check_tracers_cover",
    "collector_activities",
    "explain_missing_activity",
    "make_tracers",
    "provider_of",
    "resolve_activities",
    "supported_activities",
    "unavailable_provider",
]

_COLLECTOR_ACTIVITIES = "polyprof_torch_collector_activities"
_MAKE_TRACERS = "polyprof_make_tracers"


class Plugins(Protocol):
    """What the resolver asks of the plugin manager (``registry.PolyprofPluginManager`` answers)."""

    def plugin_infos(self) -> tuple[PluginInfo, ...]:
        """Every plugin seen, in load order, whatever its status."""
        ...

    def hook_failures(self) -> tuple[HookFailure, ...]:
        """Hook implementations that failed and were skipped, oldest first."""
        ...

    def iter_each(
        self, hook_name: str, *, isolate_errors: bool = False, **kwargs: Any
    ) -> Iterator[tuple[str, Any]]:
        """``(plugin, result)`` for each plugin, each called when the iteration reaches it."""
        ...

    def record_hook_failure(self, plugin: str, hook: str, exc: BaseException) -> None:
        """Log and keep the failure of ``plugin`` in ``hook`` (in ``hook_failures``)."""
        ...

    def tracers_by_plugin(
        self, config: ProfileConfig, *, isolate_errors: bool = False
    ) -> list[tuple[str, Tracer]]:
        """``(plugin, tracer)`` for every tracer the plugins made, type-checked, in pluggy's order."""
        ...


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
    pm: Plugins, requested: frozenset[ProfilerActivity] | None
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


def collector_activities(
    pm: Plugins, config: ProfileConfig, *, isolate_errors: bool = False
) -> frozenset[str]:
    """The union of the activities plugins ask torch's collector to record.

    From ``polyprof_torch_collector_activities``, once per session.

    :raises PluginCallError: an answer that is not a collection of
        ``torch.profiler.ProfilerActivity`` member names; with ``isolate_errors``
        that plugin's answer (or exception) is skipped and recorded instead.
    """
    names: set[str] = set()
    # Each answer is checked as it comes (iter_each, not call_each): a bad one stops the call before
    # the next plugin is asked, as an exception would, and failures are kept in call order.
    for plugin, answer in pm.iter_each(_COLLECTOR_ACTIVITIES, isolate_errors=isolate_errors, config=config):
        try:
            names.update(check_collector_answer(plugin, answer))
        except PluginCallError as exc:
            if not isolate_errors:
                raise
            pm.record_hook_failure(plugin, _COLLECTOR_ACTIVITIES, exc)
    return frozenset(names)


def check_tracer_claims(made: Iterable[tuple[str, Tracer]]) -> dict[ProfilerActivity, Tracer]:
    """Each tracer name and each activity claimed once; returns the tracer of each activity.

    ``made``: ``(plugin, tracer)`` pairs, as ``Plugins.tracers_by_plugin`` gives them.

    :raises PluginCallError: two tracers with one name, or two tracers claiming one activity.
    """
    by_activity: dict[ProfilerActivity, tuple[str, Tracer]] = {}
    by_name: dict[str, str] = {}
    for plugin, tracer in made:
        if tracer.name in by_name:
            raise PluginCallError(
                f"plugins {by_name[tracer.name]!r} and {plugin!r} both returned a tracer named "
                f"{tracer.name!r}; tracer names must be unique per session"
            )
        by_name[tracer.name] = plugin
        for activity in tracer.activities:
            activity = coerce_activity(activity)
            if activity in by_activity:
                other_plugin, other = by_activity[activity]
                raise PluginCallError(
                    f"ProfilerActivity.{activity.name} is claimed by tracer {other.name!r} of plugin "
                    f"{other_plugin!r} and by tracer {tracer.name!r} of plugin {plugin!r}; "
                    f"uninstall one or leave it out with {ALLOW_LIST_ENV}"
                )
            by_activity[activity] = (plugin, tracer)
    return {activity: tracer for activity, (_, tracer) in by_activity.items()}


def make_tracers(pm: Plugins, config: ProfileConfig) -> TracersMade:
    """Ask torch's collector for what plugins need, then make the tracers, each plugin isolated.

    :raises PluginCallError: two tracers claim one activity or one name (``check_tracer_claims``).
    :raises ActivityUnavailableError: a requested activity has no tracer, and its plugin did not
        fail (``check_tracers_cover``).
    """
    seen = len(pm.hook_failures())
    torch_activities = collector_activities(pm, config, isolate_errors=True)
    if torch_activities:
        config = attrs.evolve(config, torch_activities=torch_activities)
    before_tracers = len(pm.hook_failures())
    made = pm.tracers_by_plugin(config, isolate_errors=True)
    covered = check_tracer_claims(made)
    failed = {f.plugin for f in pm.hook_failures()[before_tracers:]}
    check_tracers_cover(pm.plugin_infos(), config.activities, covered, failed)
    return TracersMade(
        config=config, tracers=tuple(tracer for _, tracer in made), failures=pm.hook_failures()[seen:]
    )


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
