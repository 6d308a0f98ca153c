"""Warnings addressed to the profiled program's author, at their own line.

polyprof's frames (the core's and every plugin's: modules named ``polyprof*``)
sit between the user's call and the place a warning is raised, at depths
that differ by entry point (``profile.__enter__``, ``start``, ``step``, the
legacy profile, the shims) and by plugin. ``user_stacklevel()`` gives the
``stacklevel`` that skips them all, so ``warnings`` reports the user's line
and its filters match the user's module. Plugins use these as the core does.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType

from polyprof.base.activity import ProfilerActivity
from polyprof.base.errors import PolyprofWarning
from polyprof.base.log import get_logger

log = get_logger(__name__)


class ActivityUnavailableWarning(PolyprofWarning):
    """An activity's plugin is installed but cannot record here; profiling goes on without it.

    Plugins may subclass it for their own "not recorded here" cases (polyprof-cuda's
    ``NvmlUnavailableWarning``), so that one filter silences them all.
    """


class ProfilerStoppedOutsideWarning(PolyprofWarning):
    """Code outside polyprof stopped torch's profiler while a polyprof recording was using it.

    torch's collector keeps one session per process, and torch's private
    ``torch.autograd._disable_profiler()`` ends it whoever started it (PyTorch
    Lightning's ``PyTorchProfiler`` calls it before starting a profiler of its own).
    The recording keeps what torch collected until then; torch collects nothing
    more for it. Given once per recording, when the recording stops.
    """

    def __init__(self, what: str = "", consequence: str = "", *, stopped_by: str | None = None) -> None:
        super().__init__(f"polyprof: {what}; {consequence}" if consequence else what)
        #: What happened, as a clause ("lightning.pytorch.profilers.pytorch (...) stopped torch's ...").
        self.what = what
        #: What it means for the results, as a clause.
        self.consequence = consequence
        #: The code that stopped it (``module (function, line N)``); None where polyprof could not
        #: see the call.
        self.stopped_by = stopped_by

    def trace_note(self) -> ProfilerStoppedOutsideNote:
        """The same news as a note of the recording's trace (``Trace.notes``)."""
        return ProfilerStoppedOutsideNote(f"{self.what}; {self.consequence}", self)


class ProfilerStoppedOutsideNote(str):
    """A ``ProfilerStoppedOutsideWarning`` as a trace note: its text, a ``str``, and the warning.

    ``polyprof run`` reads it from the trace of the cycle it belongs to (its
    ``warning`` keeps the clauses apart); to everything else it is the text.
    A copy or a pickle is the plain text.
    """

    warning: ProfilerStoppedOutsideWarning

    def __new__(cls, text: str, warning: ProfilerStoppedOutsideWarning) -> ProfilerStoppedOutsideNote:
        note = super().__new__(cls, text)
        note.warning = warning
        return note

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return (str, (str(self),))


def _internal_frame(frame: FrameType) -> bool:
    """polyprof's own frames (core and plugins: modules named ``polyprof*``) and contextlib's."""
    module = frame.f_globals.get("__name__", "")
    return module.startswith("polyprof") or module == "contextlib"


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called by the caller: its first frame outside polyprof.

    Call it in the function that calls ``warnings.warn``, as its argument.
    """
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and _internal_frame(frame):
        frame = frame.f_back
        level += 1
    return level


def warn_activity_unavailable(
    activity: ProfilerActivity, reason: str, category: type[Warning] = ActivityUnavailableWarning
) -> None:
    """Say, at the user's line, that ``activity`` is not recorded and why; profiling goes on without it.

    Also logs ``activity_unavailable`` with the activity and the reason.
    ``category``: a subclass of ``ActivityUnavailableWarning`` for a plugin's own case.
    """
    log.warning("activity_unavailable", activity=activity.name, reason=reason)
    warnings.warn(
        f"{activity.name} profiling is not available here ({reason}); profiling continues without "
        f"ProfilerActivity.{activity.name}",
        category,
        stacklevel=user_stacklevel(),
    )


__all__ = [
    "ActivityUnavailableWarning",
    "ProfilerStoppedOutsideNote",
    "ProfilerStoppedOutsideWarning",
    "user_stacklevel",
    "warn_activity_unavailable",
]
