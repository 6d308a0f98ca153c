"""Helpers for polyprof-xpu's tests.

No Intel GPU exists here, and polyprof-xpu records XPU only through an XPU
build of torch: the tests stand in for that build's record
(``torch_support.installed_build``) and for torch's ``_KinetoEvent``
(``kineto_standins.py``). Nothing here has run on Intel hardware.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

#: Environment variables the plugin reads; cleared around the tests that use ``xpu_env``.
TEST_ENV = ("IPEX_ZE_TRACING", "ZE_ENABLE_TRACING_LAYER")


@pytest.fixture
def xpu_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The plugin's environment variables unset for the test."""
    for name in TEST_ENV:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def run_python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``env`` added to a copy of this environment."""
    full = {k: v for k, v in os.environ.items() if k not in TEST_ENV}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=timeout, check=False
    )
