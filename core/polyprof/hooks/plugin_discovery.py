"""Which plugins a session may load: the ``polyprof`` entry points and the ``POLYPROF_PLUGINS`` allow-list.

Nothing here imports a plugin or calls a hook. ``discover_entry_points`` lists
the entry points installed distributions declare; ``resolve_allow_list`` turns
the allow-list into the entry points it selects; ``plan_third_party`` decides,
for each third-party entry point, whether it loads or why it is blocked
(autoload off, left out of the allow-list, or an entry-point name that another
distribution or a built-in also declares: a conflict fails closed, except that
polyprof's own plugin distributions (``OWNED_NAMES``: polyprof-cuda's ``cuda``,
polyprof-xpu's ``xpu``) keep their names by default, with a warning naming
both distributions and how to pick the other). The
registry (``polyprof.hooks.registry.make_plugin_manager``) then loads what the plan
says.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import threading
import types
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from polyprof.base.activity import DEVICES
from polyprof.base.errors import PolyprofError, PolyprofWarning
from polyprof.base.log import get_logger

log = get_logger(__name__)

#: The one entry-point group; each entry point names a plugin module.
ENTRY_POINT_GROUP: Final = "polyprof"
#: The distribution whose entry points are the built-in plugins.
CORE_DISTRIBUTION: Final = "polyprof"
#: Built-in plugins: entry-point name -> module. Must match pyproject.toml's
#: ``[project.entry-points.polyprof]`` (a test checks). Used directly when
#: autoload is off or the core's metadata is missing (running from a checkout).
BUILTIN_PLUGINS: Final[Mapping[str, str]] = types.MappingProxyType(
    {
        "torch_cpu": "polyprof.runtime.torch_cpu",
        "key_averages": "polyprof_builtins.key_averages",
        "chrome_trace": "polyprof.runtime.chrome_trace",
        "stacks": "polyprof_builtins.stacks",
        "itt_export": "polyprof_builtins.itt_export",
        "parquet_trace": "polyprof.runtime.parquet_trace",
    }
)

#: polyprof's own plugin distributions, by the entry-point name each declares. A name declared by
#: one of these and by another distribution loads this one by default (``plan_third_party``).
OWNED_NAMES: Final[Mapping[str, str]] = types.MappingProxyType(
    {d.entry_point: d.distribution for d in DEVICES if d.entry_point and d.distribution}
)

#: Set to 1 to stop loading third-party plugins from entry points.
DISABLE_AUTOLOAD_ENV: Final = "POLYPROF_DISABLE_PLUGIN_AUTOLOAD"
#: Comma-separated third-party plugins to load: ``NAME`` (entry point), ``DIST`` (distribution) or
#: ``DIST:NAME``. Set but blank: no third-party plugin.
ALLOW_LIST_ENV: Final = "POLYPROF_PLUGINS"

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


class PluginSelectionError(PolyprofError, ValueError):
    """The allow-list cannot be resolved safely: a malformed entry, or a name of several distributions."""


@attrs.frozen
class EntryPointCandidate:
    """One entry point of the ``polyprof`` group, before it is loaded."""

    name: str
    #: ``module`` or ``module:attribute``.
    value: str
    distribution: str | None
    version: str | None
    #: Anything with ``load()`` (an ``importlib.metadata.EntryPoint``).
    entry_point: Any = attrs.field(eq=False, repr=False)

    @property
    def builtin(self) -> bool:
        return self.distribution is not None and canonical_name(self.distribution) == CORE_DISTRIBUTION


@attrs.frozen
class PluginDecision:
    """Whether one third-party entry point loads, and if not, why (``plan_third_party``)."""

    candidate: EntryPointCandidate
    #: Why it does not load; None: it loads.
    blocked_reason: str | None = None
    #: Distributions that declare the same entry-point name, when that is why it is blocked.
    conflicts_with: tuple[str, ...] = ()

    @property
    def loads(self) -> bool:
        return self.blocked_reason is None

    @property
    def listed_as(self) -> str:
        """Its name in ``polyprof plugins``: a blocked rival is listed under its distribution too."""
        if not self.conflicts_with:
            return self.candidate.name
        return f"{self.candidate.name} ({self.candidate.distribution})"


def canonical_name(name: str) -> str:
    """Distribution names compare like pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def env_flag(var: str, environ: Mapping[str, str] | None = None, *, given: list[str] | None = None) -> bool:
    """Read a boolean environment variable (1/true/yes/on or 0/false/no/off).

    :param given: where the warning about a value that is neither is also noted, to be given again.
    """
    raw = (os.environ if environ is None else environ).get(var, "")
    value = raw.strip().lower()
    if value in _TRUE_WORDS:
        return True
    if value in _FALSE_WORDS:
        return False
    message = (
        f"{var}={raw!r} is not a recognised boolean; use one of 1, true, yes, on, 0, false, no, off. "
        "Treating it as set."
    )
    warnings.warn(message, PolyprofWarning, stacklevel=3)
    if given is not None:
        given.append(message)
    return True


def parse_allow_list(value: str | Iterable[str] | None) -> frozenset[str] | None:
    """``"a, b"`` or ``["a", "b"]`` -> ``{"a", "b"}``; None -> None (no allow-list).

    A blank string is an empty allow-list: no third-party plugin loads. An
    allow-list that was set fails closed, however it was emptied.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    names = frozenset(name.strip() for name in value if name and name.strip())
    return names


def _spelled(candidate: EntryPointCandidate) -> str:
    """How the allow-list names exactly this entry point."""
    return f"{candidate.distribution}:{candidate.name}"


def _dist_key(candidate: EntryPointCandidate) -> str:
    return canonical_name(candidate.distribution or "")


def resolve_allow_list(
    allowed: frozenset[str],
    third_party: Sequence[EntryPointCandidate],
    builtin_names: Iterable[str] = BUILTIN_PLUGINS,
    source: str = ALLOW_LIST_ENV,
) -> tuple[set[EntryPointCandidate], list[str]]:
    """The third-party entry points ``allowed`` selects, and its entries that match nothing.

    An entry is ``NAME`` (an entry-point name), ``DIST`` (every entry point of
    that distribution) or ``DIST:NAME``. A bare word that several
    distributions answer to is refused, as is a selection that puts two
    plugins under one entry-point name: a squatting distribution must never
    be picked by accident. Built-in names are always allowed (and never a
    third party's).

    :raises PluginSelectionError: naming the entry and the candidates.
    """
    builtin_names = set(builtin_names)
    selected: set[EntryPointCandidate] = set()
    unknown: list[str] = []
    for entry in sorted(allowed):
        if ":" in entry:
            dist, _, name = (part.strip() for part in entry.partition(":"))
            if not dist or not name:
                raise PluginSelectionError(
                    f"{source} entry {entry!r} is malformed; write NAME, DIST or DIST:NAME "
                    "(e.g. polyprof-cuda:cuda)"
                )
            matches = [c for c in third_party if _dist_key(c) == canonical_name(dist) and c.name == name]
            if not matches and not (canonical_name(dist) == CORE_DISTRIBUTION and name in builtin_names):
                unknown.append(entry)
            selected.update(matches)
            continue
        if entry in builtin_names:
            continue  # built-ins always load; a third party cannot take their names
        matches = [c for c in third_party if c.name == entry or _dist_key(c) == canonical_name(entry)]
        if not matches:
            unknown.append(entry)
            continue
        if len({_dist_key(c) for c in matches}) > 1:
            choices = ", ".join(sorted(_spelled(c) for c in matches))
            raise PluginSelectionError(
                f"{source} entry {entry!r} is ambiguous: it matches plugins of several distributions "
                f"({choices}); name the one to load as DIST:NAME"
            )
        selected.update(matches)
    by_name: dict[str, list[EntryPointCandidate]] = {}
    for candidate in selected:
        by_name.setdefault(candidate.name, []).append(candidate)
    for name, same in sorted(by_name.items()):
        if len(same) > 1:
            choices = ", ".join(sorted(_spelled(c) for c in same))
            raise PluginSelectionError(
                f"{source} selects {len(same)} plugins with the entry-point name {name!r} ({choices}); "
                "only one can load under a name: keep one"
            )
    return selected, unknown


def discover_entry_points(group: str = ENTRY_POINT_GROUP) -> list[EntryPointCandidate]:
    """Every entry point of ``group`` across installed distributions.

    A distribution found twice on ``sys.path`` (an ``.egg-info`` in the working
    directory next to the installed ``.dist-info``) counts once: the first, as
    Python's import system would pick it. Unreadable metadata is logged and
    skipped.
    """
    seen: set[str] = set()
    found: list[EntryPointCandidate] = []
    for dist in importlib.metadata.distributions():
        try:
            dist_name = dist.metadata["Name"] or getattr(dist, "name", None)
            if not dist_name:
                continue
            key = canonical_name(dist_name)
            if key in seen:
                continue
            seen.add(key)
            eps = [ep for ep in dist.entry_points if ep.group == group]
            version = dist.version
        except Exception as exc:  # noqa: BLE001 - broken metadata must not stop discovery
            log.warning("distribution_metadata_unreadable", error=f"{type(exc).__name__}: {exc}")
            continue
        for ep in eps:
            found.append(EntryPointCandidate(ep.name, ep.value, dist_name, version, ep))
    return found


#: Per ``sys.path`` entry: its (inode, modification time) and the metadata folders it held then.
_listings: dict[str, tuple[tuple[int, int], tuple[tuple[str, int], ...] | None]] = {}
_METADATA_SUFFIXES = (".dist-info", ".egg-info")


def _metadata_folders(entry: str) -> tuple[tuple[str, int], ...] | None:
    """The metadata folders (name, inode) in ``sys.path`` entry ``entry``; None: it lists none."""
    try:
        with os.scandir(entry or os.curdir) as found:
            return tuple(sorted((e.name, e.inode()) for e in found if e.name.endswith(_METADATA_SUFFIXES)))
    except (OSError, ValueError):  # a zip file, or gone
        return None


def installed_distributions_key() -> tuple[Any, ...]:
    """What changes whenever a distribution is installed, removed or upgraded; microseconds to read.

    Installers add and remove a distribution's ``.dist-info`` (or ``.egg-info``) folder in a
    ``sys.path`` folder; the key holds, for each entry of ``sys.path``, those folders' names
    and inodes (a reinstall makes a new folder). A folder is listed again only when its own
    modification time moved, so unrelated writes (a trace saved beside the script) cost a
    listing, not a rediscovery. The function that lists distributions is in the key too, so
    that a replaced one (tests fake it) is honoured at once.
    """
    entries: list[tuple[str, tuple[tuple[str, int], ...] | None]] = []
    for entry in sys.path:
        try:
            stat = os.stat(entry or os.curdir)
            stamp = (stat.st_ino, stat.st_mtime_ns)
        except (OSError, ValueError):
            entries.append((entry, None))
            continue
        known = _listings.get(entry)
        if known is None or known[0] != stamp:
            listing = _metadata_folders(entry)
            known = _listings[entry] = (stamp, listing if listing is not None else ((str(stamp), 0),))
        entries.append((entry, known[1]))
    return (importlib.metadata.distributions, tuple(entries))


_discovered_lock = threading.Lock()
if hasattr(os, "register_at_fork"):  # a child must not inherit the lock held by a parent's thread
    os.register_at_fork(after_in_child=lambda: globals().update(_discovered_lock=threading.Lock()))
_discovered: dict[str, tuple[tuple[Any, ...], list[EntryPointCandidate]]] = {}


def discover_entry_points_once(group: str = ENTRY_POINT_GROUP) -> list[EntryPointCandidate]:
    """``discover_entry_points(group)``, read again only when the installed distributions changed.

    Reading every distribution's metadata takes 50-60 ms with 120 packages installed (it grows
    with the environment); a profile's start must not pay it each time
    (``installed_distributions_key`` says when the answer may have changed).
    """
    key = installed_distributions_key()
    with _discovered_lock:
        known = _discovered.get(group)
        if known is not None and known[0] == key:
            return list(known[1])
        found = discover_entry_points(group)
        _discovered[group] = (key, found)
        return list(found)


def forget_discovered_entry_points() -> None:
    """Drop what ``discover_entry_points_once`` remembers: the next call reads the metadata again."""
    with _discovered_lock:
        _discovered.clear()
        _listings.clear()


def builtin_entry_point(name: str, module: str) -> importlib.metadata.EntryPoint:
    """The entry point of a built-in plugin loaded by module path (autoload off, or no core metadata)."""
    return importlib.metadata.EntryPoint(name=name, value=module, group=ENTRY_POINT_GROUP)


def _conflict_reason(
    candidate: EntryPointCandidate,
    rivals: Sequence[str],
    selected: set[EntryPointCandidate],
    *,
    builtin: bool,
    source: str,
    owners_load: bool = False,
) -> str | None:
    """Why ``candidate`` may not load under its entry-point name, or None when it may.

    :param owners_load: polyprof's own plugins (``OWNED_NAMES``) load under their contested names.
    """
    name = candidate.name
    if builtin:  # built-ins load first and are never replaced
        return (
            f"conflict: entry-point name {name!r} belongs to a plugin polyprof always loads; "
            "a third-party plugin cannot take it (rename the entry point)"
        )
    if not rivals or candidate in selected:
        return None
    chosen = sorted(c.distribution or "?" for c in selected if c.name == name)
    if chosen:
        return f"conflict: entry-point name {name!r} is also declared by {chosen[0]}, which {source} picks"
    if _kept_by_its_owner(candidate, rivals, owners_load):
        return (
            f"conflict: entry-point name {name!r} belongs to {OWNED_NAMES[name]}, which loads in its place; "
            f"to load this one, set {ALLOW_LIST_ENV}={_spelled(candidate)}"
        )
    return (
        f"conflict: entry-point name {name!r} is also declared by {', '.join(rivals)}; none of them loads "
        f"unless {ALLOW_LIST_ENV} names one as DIST:NAME (e.g. {_spelled(candidate)})"
    )


def _owner_keeps_its_name(candidate: EntryPointCandidate, rivals: Sequence[str]) -> bool:
    """Whether ``candidate`` is polyprof's own plugin for its contested name."""
    owner = OWNED_NAMES.get(candidate.name)
    return bool(rivals) and owner is not None and _dist_key(candidate) == canonical_name(owner)


#: The contested names already warned about in this process, as (name, chosen, the others):
#: every plugin manager plans again (one per profile when the installed set changes, ``polyprof
#: plugins``), and the same warning each time would bury the first.
_contested_warned: set[tuple[str, str | None, tuple[str, ...]]] = set()
_contested_lock = threading.Lock()


def _warn_owner_chosen(candidate: EntryPointCandidate, rivals: Sequence[str]) -> None:
    """Say which plugin has the contested name, why, and how to pick another (once per process)."""
    key = (candidate.name, candidate.distribution, tuple(rivals))
    with _contested_lock:
        if key in _contested_warned:
            return
        _contested_warned.add(key)
    message = (
        f"entry-point name {candidate.name!r} is declared by {candidate.distribution} and by "
        f"{', '.join(rivals)}; polyprof loads {candidate.distribution}, polyprof's own plugin for it. "
        f"To load another, set {ALLOW_LIST_ENV}=DIST:{candidate.name} "
        f"(e.g. {ALLOW_LIST_ENV}={rivals[0]}:{candidate.name})"
    )
    log.warning(
        "plugin_name_contested",
        plugin=candidate.name,
        chosen=candidate.distribution,
        not_loaded=list(rivals),
    )
    warnings.warn(message, PolyprofWarning, stacklevel=4)


def _kept_by_its_owner(candidate: EntryPointCandidate, rivals: Sequence[str], owners_load: bool) -> bool:
    """Whether ``candidate`` is blocked because polyprof's own plugin keeps its contested name."""
    owner = OWNED_NAMES.get(candidate.name)
    return owners_load and owner is not None and canonical_name(owner) in {canonical_name(r) for r in rivals}


def plan_third_party(
    third_party: Sequence[EntryPointCandidate],
    *,
    taken: Mapping[str, str],
    allowed: frozenset[str] | None,
    selected: set[EntryPointCandidate],
    autoload: bool,
    source: str = ALLOW_LIST_ENV,
) -> list[PluginDecision]:
    """For each of ``third_party`` (in order): load it, or block it with the reason.

    :param taken: entry-point names already loaded (the built-ins) -> their distribution;
        a third party declaring one of them is a conflict.
    :param allowed: the allow-list (None: none set); ``selected`` is what it selects
        (``resolve_allow_list``).
    :param autoload: third-party plugins load unless the allow-list leaves them out;
        off, only the ones it names load.
    :param source: how the allow-list is named in reasons (the environment variable, or
        "the allow-list" when given in code).
    """
    # By default (autoload on, no allow-list) polyprof's own plugins keep their names; an allow-list
    # picks by itself (resolve_allow_list).
    owners_load = autoload and allowed is None
    providers: dict[str, list[EntryPointCandidate]] = {}
    for candidate in third_party:
        providers.setdefault(candidate.name, []).append(candidate)
    decisions = []
    for candidate in third_party:
        named = candidate in selected
        if candidate.name in taken:
            rivals = [taken[candidate.name]]
        else:
            others = (c for c in providers[candidate.name] if _dist_key(c) != _dist_key(candidate))
            rivals = sorted({c.distribution or "?" for c in others})
        builtin = candidate.name in taken
        if owners_load and not builtin and _owner_keeps_its_name(candidate, rivals):
            _warn_owner_chosen(candidate, rivals)
            conflict = None
        else:
            conflict = _conflict_reason(
                candidate, rivals, selected, builtin=builtin, source=source, owners_load=owners_load
            )
        if conflict is not None:
            if not _kept_by_its_owner(candidate, rivals, owners_load):  # else plugin_name_contested said it
                log.warning(
                    "plugin_name_conflict",
                    plugin=candidate.name,
                    distribution=candidate.distribution,
                    conflicts_with=rivals,
                )
            decisions.append(PluginDecision(candidate, conflict, tuple(rivals)))
        elif allowed is not None and not named:
            listed = ", ".join(sorted(allowed))
            reason = f"not in {source} ({listed})" if listed else f"{source} is empty"
            decisions.append(PluginDecision(candidate, reason))
        elif not autoload and not named:
            reason = f"autoload is off ({DISABLE_AUTOLOAD_ENV}=1) and it is not named in {ALLOW_LIST_ENV}"
            decisions.append(PluginDecision(candidate, reason))
        else:
            decisions.append(PluginDecision(candidate))
    return decisions


__all__ = [
    "ALLOW_LIST_ENV",
    "BUILTIN_PLUGINS",
    "CORE_DISTRIBUTION",
    "DISABLE_AUTOLOAD_ENV",
    "ENTRY_POINT_GROUP",
    "OWNED_NAMES",
    "EntryPointCandidate",
    "PluginDecision",
    "PluginSelectionError",
    "builtin_entry_point",
    "canonical_name",
    "discover_entry_points",
    "discover_entry_points_once",
    "env_flag",
    "forget_discovered_entry_points",
    "installed_distributions_key",
    "parse_allow_list",
    "plan_third_party",
    "resolve_allow_list",
]
