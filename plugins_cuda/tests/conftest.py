"""polyprof-cuda tests: every one runs without a GPU (torch's results are stand-ins).

They run in the same pytest run as polyprof's own (tests/) and polyprof-xpu's,
so this file is never imported by name: helpers are fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The differential subset (``-m torch_oracle``) lives in tests/: none of it is here, and the
    other torch versions' venvs (scripts/torch_matrix.py) do not install polyprof-cuda."""
    return True if config.getoption("markexpr", "") == "torch_oracle" else None


@pytest.fixture(autouse=True)
def _fresh_mode() -> Iterator[None]:
    """Each test sees the mode computed anew (tests may fake torch's build)."""
    from polyprof_cuda import mode

    mode.forget_cached_mode()
    yield
    mode.forget_cached_mode()
