"""The ``itt`` exporter: replays a recorded trace's ranges into Intel VTune as ITT tasks.

``prof.export(path, format="itt")`` (or ``polyprof run --format itt``) walks
the trace's CPU operators and ``record_function`` ranges thread by thread, in
time order and properly nested, and issues one ITT ``task_begin``/``task_end``
pair per range through the ``ittapi`` package (``pip install 'polyprof[itt]'``),
in the ITT domain ``"polyprof"``. Run the program under VTune (or with
``INTEL_LIBITTNOTIFY64`` naming any ITT collector) and the ranges appear in its
timeline, on one replay thread per recorded thread, named
``polyprof replay of thread <tid>``.

What is kept and what is not: names, nesting and order per thread are kept.
ITT's task API stamps each call with the time it is made (``ittapi`` offers no
call with an explicit timestamp), so the replayed tasks happen *now*, not at
their recorded times: by default as fast as possible (durations collapse), or
with ``pace=True`` at the recorded pace (the replay takes as long as the
recording, durations approximately kept, sleep resolution permitting). To see
operators at their true times, wrap the live run in ``polyprof.emit_itt()``
instead.

A range that overlaps its parent's end (which torch's collector does not
produce) is cut at the parent's end, since ITT tasks on one thread nest
strictly. Asynchronous events (``is_async``) are left out.

``path`` receives a small JSON summary (domain, tasks per thread, whether a
collector was attached); an empty path skips it. Without ``ittapi`` installed
the plugin is listed as unavailable by ``polyprof plugins`` and asking for
the ``itt`` exporter names the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from polyprof.plugin import (
    Capabilities,
    EventKind,
    Exporter,
    PluginUnavailable,
    atomic_writer,
    get_logger,
    hookimpl,
)

if TYPE_CHECKING:
    from polyprof.plugin import ProfileConfig, Trace

log = get_logger(__name__)

__all__ = [
    "DEFAULT_DOMAIN",
    "NAME",
    "REPLAYED_KINDS",
    "IttExporter",
    "ThreadReplay",
    "ittapi_unavailable_reason",
    "replay_plan",
]

NAME = "itt"
DEFAULT_DOMAIN = "polyprof"
#: The ranges replayed: torch operators and record_function / user annotations.
REPLAYED_KINDS: tuple[EventKind, ...] = (EventKind.CPU_OP, EventKind.USER_ANNOTATION)
#: Marks an end call in ``ThreadReplay.names``.
END = -1
_UNNAMED = "<unnamed>"
_VALID_OPTIONS = ("domain", "pace")


def ittapi_unavailable_reason() -> str | None:
    """None when the ``ittapi`` package can be imported here, else why not (without importing it)."""
    if "ittapi" in sys.modules:  # already imported (or blocked with None)
        found = sys.modules["ittapi"] is not None
    else:
        try:
            found = importlib.util.find_spec("ittapi") is not None
        except (ImportError, ValueError) as exc:
            return f"the ittapi package cannot be found ({exc}); install it with: pip install 'polyprof[itt]'"
    if not found:
        return "the ittapi package is not installed; install it with: pip install 'polyprof[itt]'"
    return None


@attrs.frozen(eq=False)
class ThreadReplay:
    """The ITT calls for one recorded thread, in the order they are made.

    Call ``i`` happens ``offsets_ns[i]`` after the trace's start; it begins a
    task named ``name_table[names[i]]``, or ends the innermost task when
    ``names[i] == END``. Begins and ends are balanced and nest.
    """

    tid: int
    offsets_ns: np.ndarray
    names: np.ndarray
    name_table: tuple[str, ...]

    @property
    def task_count(self) -> int:
        return int(np.count_nonzero(self.names != END))


def replay_plan(trace: Trace) -> list[ThreadReplay]:
    """The ITT calls that replay ``trace``'s CPU ranges, one ``ThreadReplay`` per thread (sorted by tid)."""
    events = trace.events
    if not len(events):
        return []
    kind = events["kind"]
    chosen = np.flatnonzero(np.isin(kind, np.asarray(REPLAYED_KINDS, dtype=kind.dtype)) & ~events["is_async"])
    if not len(chosen):
        return []
    tids = events["tid"][chosen]
    starts = events["start_ns"][chosen]
    durs = np.maximum(events["dur_ns"][chosen], 0)
    name_idx = events["name"][chosen]
    table = (*events.table("name"), _UNNAMED)
    name_idx = np.where(name_idx < 0, len(table) - 1, name_idx).astype(np.int32)
    # Per thread by start; at equal starts the longer (outer) range first.
    order = np.lexsort((-durs, starts, tids))
    tids, starts, durs, name_idx = tids[order], starts[order], durs[order], name_idx[order]
    bounds = np.flatnonzero(np.diff(tids)) + 1
    # Offsets from the recording's start (or the first range, if earlier), so never negative.
    origin = min(int(trace.start_ns), int(starts.min()))
    plans = []
    for lo, hi in zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(tids)].tolist(), strict=True):
        plans.append(_nest_thread(int(tids[lo]), starts[lo:hi] - origin, durs[lo:hi], name_idx[lo:hi], table))
    return plans


def _nest_thread(
    tid: int, starts: np.ndarray, durs: np.ndarray, names: np.ndarray, table: tuple[str, ...]
) -> ThreadReplay:
    """Begin/end calls for one thread's ranges (sorted by start, outer first).

    One pass with a stack of open ranges' ends; the replay itself makes one
    native call per range anyway, so this loop is not the cost.
    """
    times: list[int] = []
    calls: list[int] = []
    open_ends: list[int] = []
    for start, end, name in zip(starts.tolist(), (starts + durs).tolist(), names.tolist(), strict=True):
        while open_ends and open_ends[-1] <= start:
            times.append(open_ends.pop())
            calls.append(END)
        if open_ends and end > open_ends[-1]:
            end = open_ends[-1]  # ITT tasks nest strictly: cut at the parent's end
        times.append(start)
        calls.append(name)
        open_ends.append(end)
    while open_ends:
        times.append(open_ends.pop())
        calls.append(END)
    return ThreadReplay(
        tid=tid,
        offsets_ns=np.asarray(times, dtype=np.int64),
        names=np.asarray(calls, dtype=np.int32),
        name_table=table,
    )


class IttExporter(Exporter):
    """Replays a trace's ranges as ITT tasks (see the module docstring)."""

    name = NAME
    suffixes = (".itt.json",)

    def export(
        self, trace: Trace, path: str, *, domain: str = DEFAULT_DOMAIN, pace: bool = False, **options: Any
    ) -> str:
        """Replay ``trace`` into ITT; write a JSON summary to ``path`` (skipped when empty).

        :param domain: the ITT domain the tasks are created in.
        :param pace: replay at the recorded pace instead of as fast as possible.
        :returns: ``path`` (``""`` when no summary was written).
        :raises TypeError: unknown option. :raises ValueError: bad ``domain``.
        :raises PluginUnavailable: ``ittapi`` is not installed.
        """
        if options:
            raise TypeError(
                f"unknown itt export options {sorted(options)}; valid options: {list(_VALID_OPTIONS)}"
            )
        if not isinstance(domain, str) or not domain:
            raise ValueError(f"domain must be a non-empty str, not {domain!r}")
        if not isinstance(pace, bool):
            raise TypeError(f"pace must be a bool, not {pace!r}")
        path = os.fspath(path) if path else ""
        ittapi = _import_ittapi()
        plans = replay_plan(trace)
        collector = os.environ.get("INTEL_LIBITTNOTIFY64") or None
        if collector is None:
            log.warning(
                "itt_no_collector",
                hint="INTEL_LIBITTNOTIFY64 is not set, so no ITT collector (VTune) receives the tasks; "
                "run the program under VTune",
            )
        started = time.perf_counter()
        _replay(ittapi, plans, domain, pace)
        seconds = time.perf_counter() - started
        tasks = sum(p.task_count for p in plans)
        log.debug("itt_replayed", tasks=tasks, threads=len(plans), seconds=seconds, domain=domain)
        if not path:
            return ""
        summary = {
            "exporter": NAME,
            "domain": domain,
            "paced": pace,
            "collector": collector,
            "tasks": tasks,
            "threads": [{"tid": p.tid, "tasks": p.task_count} for p in plans],
            "replay_seconds": round(seconds, 6),
        }
        with atomic_writer(path) as f:
            f.write(json.dumps(summary, indent=2) + "\n")
        return path


def _import_ittapi() -> Any:
    try:
        import ittapi
    except ImportError as exc:
        raise PluginUnavailable(
            f"the itt exporter needs the ittapi package ({exc}); install it with: pip install 'polyprof[itt]'"
        ) from exc
    return ittapi


def _replay(ittapi: Any, plans: Sequence[ThreadReplay], domain_name: str, pace: bool) -> None:
    """Replay each recorded thread on its own thread (ITT task stacks are per thread)."""
    if not plans:
        return
    domain = ittapi.domain(domain_name)
    used = np.unique(np.concatenate([p.names[p.names != END] for p in plans]))
    table = plans[0].name_table
    handles = {int(i): ittapi.string_handle(table[i]) for i in used.tolist()}
    ready = threading.Barrier(len(plans))
    t0: list[int] = []
    errors: list[BaseException] = []

    def run(plan: ThreadReplay) -> None:
        try:
            ittapi.thread_set_name(f"polyprof replay of thread {plan.tid}")
            if ready.wait() == 0:
                t0.append(time.perf_counter_ns())
            ready_t0.wait()
            _replay_thread(ittapi, domain, handles, plan, t0[0] if pace else None)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the exporting thread
            ready.abort()
            ready_t0.abort()
            errors.append(exc)

    ready_t0 = threading.Barrier(len(plans))
    threads = [
        threading.Thread(target=run, args=(p,), name=f"polyprof-itt-replay-{p.tid}", daemon=True)
        for p in plans
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]


def _replay_thread(
    ittapi: Any, domain: Any, handles: dict[int, Any], plan: ThreadReplay, t0_ns: int | None
) -> None:
    begin, end = ittapi.task_begin, ittapi.task_end
    for offset, name in zip(plan.offsets_ns.tolist(), plan.names.tolist(), strict=True):
        if t0_ns is not None:
            delay = t0_ns + offset - time.perf_counter_ns()
            if delay > 0:
                time.sleep(delay / 1e9)
        if name == END:
            end(domain)
        else:
            begin(domain, handles[name])


@hookimpl(trylast=True)
def polyprof_make_exporter(config: ProfileConfig, name: str) -> Exporter | None:
    return IttExporter() if name == NAME else None


@hookimpl(trylast=True)
def polyprof_capabilities() -> Capabilities:
    return Capabilities(exporters=(NAME,), unavailable_reason=ittapi_unavailable_reason())
