"""polyprof-cuda tests: every one runs without a GPU or a driver (see cupti_fakes.py)."""

from __future__ import annotations

import pytest
from polyprof_cuda import probe


@pytest.fixture(autouse=True)
def _fresh_probe():
    """Each test sees the real probe answer computed anew (tests may swap facades)."""
    probe.forget_cached_probe()
    yield
    probe.forget_cached_probe()
