"""scripts/gpu_check.sh carries in only what a GPU image lacks, never a newer copy of what it has.

On the nvidia-h200 image (pluggy 1.6.0) a carried pluggy 1.7 once hid that polyprof broke with the
image's own pluggy. ``select_wheels`` decides by wheel file names and the installed distributions, so
it is checked here with this venv standing in for the image.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def select(wheels: list[str], tmp_path: Path, hta_needs: str | None = None) -> tuple[list[str], str]:
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name in wheels:
        (folder / name).write_bytes(b"")  # only the name is read
    script = f'source "{ROOT}/scripts/gpu_check.sh"; PY="{sys.executable}"; WHEELS="{folder}"; '
    if hta_needs is not None:
        script += f'HTA_NEEDS="{hta_needs}"; '
    result = subprocess.run(
        ["bash", "-c", script + "select_wheels"], capture_output=True, text=True, check=True, timeout=60
    )
    return [Path(line).name for line in result.stdout.split()], result.stderr


def test_a_wheel_of_what_the_machine_has_in_a_satisfying_version_is_not_carried(tmp_path: Path) -> None:
    have = importlib.metadata.version("pluggy")
    newer = f"pluggy-{int(have.split('.')[0]) + 1}.0.0-py3-none-any.whl"
    carried, why = select(["pluggy-1.5.0-py3-none-any.whl", newer], tmp_path)
    assert carried == []
    assert f"skip {newer}: the machine's pluggy {have} satisfies what is declared" in why


def test_what_the_machine_lacks_is_carried(tmp_path: Path) -> None:
    carried, why = select(["polyprof_never_installed-1.0-py3-none-any.whl"], tmp_path)
    assert carried == ["polyprof_never_installed-1.0-py3-none-any.whl"]
    assert "the machine has no polyprof-never-installed" in why


def test_a_machine_copy_that_does_not_satisfy_is_replaced_by_one_that_does(tmp_path: Path) -> None:
    """As pandas<3 for HTA 0.5 where the image has pandas 3 (here: pytest, with a need it cannot meet)."""
    have = importlib.metadata.version("pytest")
    major = int(have.split(".")[0])
    carried, why = select(
        [f"pytest-{major + 1}.0.0-py3-none-any.whl"], tmp_path, hta_needs=f"pytest>={major + 1}"
    )
    assert carried == [f"pytest-{major + 1}.0.0-py3-none-any.whl"]
    assert f"the machine's pytest {have} does not satisfy pytest>={major + 1}" in why


def test_a_wheel_that_satisfies_nothing_is_not_carried(tmp_path: Path) -> None:
    major = int(importlib.metadata.version("pytest").split(".")[0])
    carried, why = select(["pytest-1.0.0-py3-none-any.whl"], tmp_path, hta_needs=f"pytest>={major + 1}")
    assert carried == [] and "skip pytest-1.0.0-py3-none-any.whl: neither it nor" in why


def test_of_two_wheels_of_one_distribution_the_newest_is_weighed(tmp_path: Path) -> None:
    """pip refuses two wheels of one distribution in one install."""
    names = ["polyprof_never_installed-1.0-py3-none-any.whl", "polyprof_never_installed-1.2-py3-none-any.whl"]
    carried, _ = select(names, tmp_path)
    assert carried == ["polyprof_never_installed-1.2-py3-none-any.whl"]


@pytest.mark.parametrize("name", ["polyprof-0.2.0-py3-none-any.whl", "polyprof_cuda-0.2.0-py3-none-any.whl"])
def test_polyprof_itself_comes_from_the_checkout(name: str, tmp_path: Path) -> None:
    carried, why = select([name], tmp_path)
    assert carried == [] and "polyprof comes from this checkout" in why
