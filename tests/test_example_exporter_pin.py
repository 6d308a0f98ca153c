"""The worked example of the plugin author guide keeps to the contract it teaches.

Section 5 of the guide says what a plugin may import (``polyprof.plugin``) and that the contract
holds within a minor series of polyprof, so a plugin pins one (``polyprof>=0.2.1,<0.3``, as
polyprof-cuda and polyprof-xpu do: 0.2.1 is the first with ``polyprof.plugin``). The example
distribution (docs/examples/polyprof-example-exporter) and the guide's copy of its ``pyproject.toml``
(section 2, step 2) must do what they teach.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

import polyprof
from test_plugin_contract import GUIDE, outside_the_contract

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "polyprof-example-exporter"


def _polyprof_pin(dependencies: list[str]) -> Requirement:
    [pin] = [Requirement(d) for d in dependencies if Requirement(d).name == "polyprof"]
    return pin


def _guide_step_2_dependencies() -> list[str]:
    text = GUIDE.read_text()
    step = text[text.index("### Step 2") : text.index("### Step 3")]
    [toml] = re.findall(r"```toml\n(.*?)```", step, re.DOTALL)
    return tomllib.loads(toml)["project"]["dependencies"]


def test_the_example_pins_the_minor_series_of_this_polyprof() -> None:
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    pin = _polyprof_pin(project["project"]["dependencies"])
    major, minor, _ = (int(part) for part in polyprof.__version__.split("."))
    assert pin.specifier.contains(polyprof.__version__), f"{pin} excludes this polyprof"
    assert not pin.specifier.contains(f"{major}.{minor + 1}.0"), f"{pin} has no upper bound"


def test_the_guide_shows_the_examples_dependencies() -> None:
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert _guide_step_2_dependencies() == project["project"]["dependencies"]


def test_the_example_imports_only_the_contract() -> None:
    outside = []
    for path in sorted((EXAMPLE / "polyprof_example_exporter").rglob("*.py")):
        outside += outside_the_contract(path)
    assert not outside, "imports outside polyprof.plugin (the guide's section 5):\n" + "\n".join(outside)
