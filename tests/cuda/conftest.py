"""polyprof-cuda tests: every one runs without a GPU or a driver (see cupti_fakes.py)."""

from __future__ import annotations

import pytest
from polyprof_cuda import mode, probe


@pytest.fixture(autouse=True)
def _fresh_probe():
    """Each test sees the real probe answer and mode computed anew (tests may swap facades)."""
    probe.forget_cached_probe()
    mode.forget_cached_mode()
    yield
    probe.forget_cached_probe()
    mode.forget_cached_mode()
