"""Fixtures for polyprof-xpu's tests.

No Intel GPU exists here, and polyprof-xpu records XPU only through an XPU
build of torch: the tests stand in for that build's record
(``torch_support.installed_build``) and for torch's ``_KinetoEvent``
(``kineto_standins.py``). Nothing here has run on Intel hardware.

These tests run in the same pytest run as polyprof's own (tests/) and
polyprof-cuda's, so this file is never imported by name: helpers are fixtures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

#: Environment variables the plugin reads; cleared around the tests that use ``xpu_env``.
TEST_ENV = ("IPEX_ZE_TRACING", "ZE_ENABLE_TRACING_LAYER")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """These tests belong to the ``optional_extras`` subset only (tests/conftest.py): a run of the
    other subsets imports nothing here, since the venvs of scripts/torch_matrix.py's other runs do
    not install polyprof-xpu."""
    chosen = getattr(config, "polyprof_selected_subsets", None)
    return True if chosen is not None and "optional_extras" not in chosen else None


@pytest.fixture
def xpu_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The plugin's environment variables unset for the test."""
    for name in TEST_ENV:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def _run_python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in TEST_ENV}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout, check=False
    )


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """``run_python(code, env, timeout=120)``: run ``code`` in a fresh interpreter with ``env`` added to
    a copy of this environment, less the plugin's variables."""
    return _run_python
