"""CUPTI timestamps on polyprof's clock (Unix-epoch ns, ``time.time_ns()``).

On Linux CUPTI's default clock is ``CLOCK_REALTIME`` in ns, the clock
``time.time_ns()`` reads, so no conversion is needed. That is checked, not
assumed: at start (and again at stop) ``cupti.get_timestamp()`` is bracketed
between two ``time.time_ns()`` reads. When it falls inside the bracket (with
``REALTIME_TOLERANCE_NS`` of slack) the offset is 0; otherwise (another tool
registered a timestamp callback, a platform whose CUPTI clock differs) the
offset ``bracket midpoint - CUPTI timestamp`` is added to every record, and a
note in the trace says so. A change of offset between start and stop beyond
``DRIFT_NOTE_NS`` (clock stepped by NTP, clocks drifting) is noted as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

#: Slack around the bracket within which CUPTI's clock counts as CLOCK_REALTIME.
REALTIME_TOLERANCE_NS = 1_000_000
#: Offset changes between start and stop above this are reported in the trace's notes.
DRIFT_NOTE_NS = 100_000
#: Bracketing attempts; the narrowest bracket wins.
SAMPLES = 5


@attrs.frozen
class ClockSync:
    """How to turn CUPTI timestamps into Unix-epoch ns."""

    #: Add to a CUPTI timestamp to get Unix-epoch ns.
    offset_ns: int
    #: Half the width of the bracket the offset was measured in.
    uncertainty_ns: int
    #: True when CUPTI's clock read as CLOCK_REALTIME (offset 0).
    realtime: bool

    def describe(self) -> str:
        if self.realtime:
            return "CUPTI clock is CLOCK_REALTIME (no conversion)"
        return (
            f"CUPTI clock is not CLOCK_REALTIME; converted with an offset of {self.offset_ns} ns "
            f"(+/- {self.uncertainty_ns} ns) sampled at start"
        )


IDENTITY = ClockSync(offset_ns=0, uncertainty_ns=0, realtime=True)


def sample_clock(cupti_now: Callable[[], int], wall_now: Callable[[], int] = time.time_ns) -> ClockSync:
    """Bracket ``cupti_now()`` between two ``wall_now()`` reads and derive the offset."""
    best: tuple[int, int, int] | None = None
    for _ in range(SAMPLES):
        before = wall_now()
        cupti = int(cupti_now())
        after = wall_now()
        if best is None or after - before < best[2] - best[0]:
            best = (before, cupti, after)
    assert best is not None
    before, cupti, after = best
    if before - REALTIME_TOLERANCE_NS <= cupti <= after + REALTIME_TOLERANCE_NS:
        return IDENTITY
    midpoint = before + (after - before) // 2
    return ClockSync(offset_ns=midpoint - cupti, uncertainty_ns=(after - before) // 2 + 1, realtime=False)


def drift_note(start: ClockSync, stop: ClockSync) -> str | None:
    """A note when the offset moved by more than ``DRIFT_NOTE_NS`` during the recording."""
    drift = stop.offset_ns - start.offset_ns
    if abs(drift) <= max(DRIFT_NOTE_NS, start.uncertainty_ns + stop.uncertainty_ns):
        return None
    return (
        f"cuda: CUPTI's clock moved {drift / 1000:+.1f} us against time.time_ns() during the recording; "
        "GPU and CPU events may be misaligned by up to that much (see docs/cuda.md, clock skew)"
    )
