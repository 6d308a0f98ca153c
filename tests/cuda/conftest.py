"""polyprof-cuda tests: every one runs without a GPU (torch's results are stand-ins)."""

from __future__ import annotations

import pytest
from polyprof_cuda import mode


@pytest.fixture(autouse=True)
def _fresh_mode():
    """Each test sees the mode computed anew (tests may fake torch's build)."""
    mode.forget_cached_mode()
    yield
    mode.forget_cached_mode()
