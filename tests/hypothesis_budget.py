"""Example budgets of the property tests: the whole budget, or a tenth of it under the "fast" profile.

tests/conftest.py loads the hypothesis profile ``fast`` for the fast subset (``pytest -m "not slow"``);
every other run (CI's whole suite, the torch matrix's ``-m torch_oracle``) keeps hypothesis's default
profile and tries every example. ``pytest --hypothesis-profile=default`` tries them all in the fast
subset too.
"""

from __future__ import annotations

from hypothesis import settings

FAST_PROFILE = "fast"
#: The fast subset tries one example in FAST_SHARE, but never fewer than FAST_MINIMUM (or than the
#: whole budget, where that is smaller).
FAST_SHARE = 10
FAST_MINIMUM = 10

# Tests that set no budget of their own get FAST_MINIMUM examples instead of hypothesis's 100.
settings.register_profile(FAST_PROFILE, max_examples=FAST_MINIMUM)


def examples(budget: int) -> int:
    """``max_examples`` for a property test whose whole budget is ``budget``."""
    if settings.get_current_profile_name() != FAST_PROFILE:
        return budget
    return max(min(budget, FAST_MINIMUM), budget // FAST_SHARE)
