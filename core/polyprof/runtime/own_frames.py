"""Which Python frames of torch's tracer are polyprof's own, so that ``with_stack`` shows none.

torch's Python tracer records every frame that runs while its collector is on,
the profiler's own included: torch.profiler's trace shows its ``__enter__`` /
``stop`` chain and what that calls. polyprof enters and leaves the collector
through more code (session, bus, recording), and its bus thread runs beside the
user's. Those frames, and every frame they call, are left out of polyprof's
events, traces and op stacks, so a user's call tree shows no more of the
profiler than torch's shows of torch's. Frames that polyprof calls on the
user's behalf (a function decorated with ``record_function``, the script of
``polyprof run``, the user's ``schedule``, torch's ``destroy_process_group`` under
``polyprof run``) stay, under the user's frame that called polyprof.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Callable

import numpy as np

#: polyprof's import packages: the core and the plugins shipped with it.
OWN_PACKAGES = ("polyprof", "polyprof_builtins", "polyprof_cuda", "polyprof_xpu")
#: Frames that only polyprof's own bus threads run: the loop thread's root, and the closer.
#: Their whole thread is left out (its ``threading`` frames too): torch.profiler has no such thread.
_OWN_THREAD_FRAME = re.compile(r"(^|/)polyprof/runtime/bus\.py\(\d+\): (_run_bus_loop|_shut_down)$")
#: The first frame of every ``threading.Thread``. torch chains the stacks of the threads it never
#: saw run (blocked all along) into one: each such thread's entry names the previous thread's
#: innermost frame as its parent. Call trees are cut here so each thread is its own tree.
_THREAD_ENTRY_FRAME = re.compile(r"(^|/)threading\.py\(\d+\): _bootstrap$")
#: polyprof's frames that call the user's (or torch's) code: what they call is not the profiler's.
#: ``step`` calls the user's ``schedule`` and torch's step tracker, as torch's ``step`` does;
#: ``polyprof run``'s ``destroy_process_group`` wrapper calls torch's teardown, its optimizer step
#: wrapper the optimizer's ``step``, its ``_patch_step_function`` torch's.
_HAND_OVER_FRAME = re.compile(
    r"(^|/)(record\.py\(\d+\): wrapped|run_target\.py\(\d+\): run_target"
    r"|polyprof/frontends/profiler\.py\(\d+\): step"
    r"|polyprof/cli/whole_script\.py\(\d+\): "
    r"(destroy_process_group|optimizer_step_after_the_range|_patch_step_function))$"
)


@functools.cache
def own_code_prefixes() -> tuple[str, ...]:
    """The file-name prefixes of polyprof's packages, as torch's tracer writes them.

    torch cuts the longest ``sys.path`` / site-packages prefix off a frame's
    file (``torch/profiler/python_tracer.py``); an editable install keeps its
    absolute path. Both forms are listed.
    """
    prefixes: set[str] = set()
    cut_off = _torch_path_prefixes()
    for package in OWN_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for path in {folder, os.path.abspath(folder)}:
                prefixes.add(path + os.sep)
                prefixes.update(path[len(cut) :] + os.sep for cut in cut_off if path.startswith(cut))
    return tuple(sorted(prefixes))


def _torch_path_prefixes() -> list[str]:
    try:
        from torch.profiler.python_tracer import _prefix_regex

        return list(_prefix_regex())
    except Exception:  # noqa: BLE001 - without torch's list only the untrimmed forms are matched
        return []


def is_own_code(frame: str) -> bool:
    """Whether a frame name (``file(line): function``) is code of polyprof's packages."""
    return frame.startswith(own_code_prefixes())


def profiler_frames(
    python: np.ndarray, names: tuple, name_idx: np.ndarray, py_id: np.ndarray, py_parent: np.ndarray
) -> np.ndarray:
    """Mask over ``python`` (rows of python_function events) of polyprof's own frames.

    Those are the frames of polyprof's code and every frame they call (hand-over
    frames aside), and the whole call tree of polyprof's bus threads.
    """
    n = len(python)
    if not n:
        return np.zeros(0, dtype=bool)
    own_code = _marks(names, is_own_code)[name_idx[python]]
    own_thread = _marks(names, lambda name: bool(_OWN_THREAD_FRAME.search(name)))[name_idx[python]]
    if not (own_code.any() or own_thread.any()):
        return np.zeros(n, dtype=bool)
    hand_over = _marks(names, lambda name: bool(_HAND_OVER_FRAME.search(name)))[name_idx[python]]
    entry = thread_entries(names, name_idx[python])
    parent_row = _parent_rows(py_id[python], np.where(entry, -1, py_parent[python]))
    # The nearest ancestor that is polyprof code says whether a frame is the profiler's (it is,
    # unless that ancestor hands over to the user's code); the root says whose thread it runs on.
    nearest_own, _ = _nearest_ancestors(parent_row, own_code)
    found = nearest_own >= 0
    inside = own_code | (found & ~hand_over[np.maximum(nearest_own, 0)])
    top, _ = _nearest_ancestors(parent_row, parent_row < 0)
    root = np.where(parent_row < 0, np.arange(n), top)
    return inside | np.isin(root, root[own_thread])


def thread_entries(names: tuple, name_idx: np.ndarray) -> np.ndarray:
    """Mask of the frames that start a ``threading.Thread`` (``name_idx`` -1: none)."""
    return _marks(names, lambda name: bool(_THREAD_ENTRY_FRAME.search(name)))[name_idx]


def kept_parents(
    own: np.ndarray,
    py_id: np.ndarray,
    py_parent: np.ndarray,
    entry: np.ndarray,
    tid: np.ndarray | None = None,
) -> np.ndarray:
    """Every frame's Python parent once ``own`` frames are gone: the nearest kept ancestor, or -1.

    A frame keeps a kept parent as torch recorded it. One whose path up through dropped frames
    leaves its thread (a thread's first frame, ``entry``, chained by torch under another thread's
    frame, or a parent on another ``tid``) becomes a root: each thread stays its own tree.
    """
    parent_row = _parent_rows(py_id, py_parent)
    has_parent = parent_row >= 0
    up = np.maximum(parent_row, 0)
    crosses = entry.copy()
    if tid is not None:
        crosses |= has_parent & (tid != tid[up])
    nearest, crossed = _nearest_ancestors(parent_row, ~own, crosses)
    parent_dropped = has_parent & own[up]
    new_parent = np.where(nearest >= 0, py_id[np.maximum(nearest, 0)], -1)
    new_parent = np.where(crossed, -1, new_parent)
    return np.where(parent_dropped, new_parent, py_parent)


def _nearest_ancestors(
    parent_row: np.ndarray, stop: np.ndarray, crosses: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's nearest strict ancestor where ``stop`` holds (-1: none), and whether ``crosses``
    holds for the row or for any ancestor passed on the way there.

    Pointer doubling: each pass jumps every unsettled row to its link's link, so a chain of depth
    d settles in log2(d) passes over the rows still unsettled (frames x depth for a walk by levels).
    """
    link = parent_row.copy()
    acc = crosses.copy() if crosses is not None else np.zeros(len(link), dtype=bool)
    active = np.flatnonzero((link >= 0) & ~stop[np.maximum(link, 0)])
    for _ in range(64):  # log2 of any depth; a bound should torch ever record a cycle of parent ids
        if not len(active):
            break
        via = link[active]
        link[active] = link[via]
        acc[active] |= acc[via]
        active = active[(link[active] >= 0) & ~stop[np.maximum(link[active], 0)]]
    link[active] = -1  # on a cycle: no stop ancestor
    return link, acc


def without_own_frames(stack: tuple[str, ...]) -> tuple[str, ...]:
    """An op's stack (innermost frame first) without polyprof's frames and what they called."""
    if not any(map(is_own_code, stack)):
        return stack
    kept: list[str] = []
    inside = False
    for frame in reversed(stack):  # outermost first
        if is_own_code(frame):
            inside = not _HAND_OVER_FRAME.search(frame)
        elif not inside:
            kept.append(frame)
    return tuple(reversed(kept))


def _marks(names: tuple, predicate: Callable[[str], bool]) -> np.ndarray:
    """A bool per name, plus False for the missing name (index -1)."""
    return np.array([bool(predicate(name)) for name in names] + [False], dtype=bool)


def _parent_rows(ids: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Each frame's parent as a row index (-1: none recorded)."""
    if not len(ids):
        return np.full(len(parents), -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    pos = np.minimum(np.searchsorted(sorted_ids, parents), len(ids) - 1)
    return np.where((parents >= 0) & (sorted_ids[pos] == parents), order[pos], -1)
