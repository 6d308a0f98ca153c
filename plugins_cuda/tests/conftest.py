"""polyprof-cuda tests: every one runs without a GPU (torch's results are stand-ins).

They run in the same pytest run as polyprof's own (tests/) and polyprof-xpu's,
so this file is never imported by name: helpers are fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """These tests belong to the ``optional_extras`` subset only (tests/conftest.py): a run of the
    other subsets imports nothing here, since the venvs of scripts/torch_matrix.py's other runs do
    not install polyprof-cuda."""
    chosen = getattr(config, "polyprof_selected_subsets", None)
    return True if chosen is not None and "optional_extras" not in chosen else None


@pytest.fixture(autouse=True)
def _fresh_mode() -> Iterator[None]:
    """Each test sees the mode computed anew (tests may fake torch's build)."""
    from polyprof_cuda import mode

    mode.forget_cached_mode()
    yield
    mode.forget_cached_mode()
