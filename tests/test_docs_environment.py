"""Every environment variable polyprof reads is in the user guide's table, with its default.

The variables are found in the code (string constants of the four packages, docstrings left out),
so a new one cannot ship undocumented; the defaults the table gives are checked against the
constants the code uses.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "core/polyprof",
    "plugins/polyprof_builtins",
    "plugins_cuda/polyprof_cuda",
    "plugins_xpu/polyprof_xpu",
)
GUIDE = ROOT / "docs" / "user-guide.md"
VARIABLE = re.compile(r"\bPOLYPROF_[A-Z0-9_]+\b")


def _code_strings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def variables_read() -> set[str]:
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for text in _code_strings(path):
                found.update(VARIABLE.findall(text))
    return found


def guide_table() -> dict[str, list[str]]:
    """The "Environment variables" section's table: variable -> its cells (default, effect)."""
    text = GUIDE.read_text()
    start = text.index("## Environment variables")
    end = text.find("\n## ", start + 1)
    rows = {}
    for line in text[start : end if end != -1 else None].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`POLYPROF_"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_scan_finds_the_variables_polyprof_is_known_to_read() -> None:
    assert {"POLYPROF_PLUGINS", "POLYPROF_EXPORT_TIMEOUT_S", "POLYPROF_REPORT_MAX_BYTES"} <= variables_read()


@pytest.mark.parametrize("variable", sorted(variables_read()))
def test_every_variable_is_in_the_guides_table_with_a_default(variable: str) -> None:
    table = guide_table()
    assert variable in table, f"{variable} is read by polyprof but missing from docs/user-guide.md's table"
    default, effect = table[variable]
    assert default and effect, f"{variable}: the guide's table gives no default or effect"


def test_the_guides_table_names_no_variable_polyprof_does_not_read() -> None:
    assert set(guide_table()) <= variables_read()


def test_the_defaults_in_the_table_are_the_codes() -> None:
    from polyprof.formats.chrome_reader import DEFAULT_MAX_BYTES
    from polyprof.runtime.exporting import EXPORT_TIMEOUT_BASE_S, EXPORT_TIMEOUT_PER_EVENT_S

    table = guide_table()
    assert str(DEFAULT_MAX_BYTES) in table["POLYPROF_REPORT_MAX_BYTES"][0]
    timeout_default = table["POLYPROF_EXPORT_TIMEOUT_S"][0]
    assert f"{EXPORT_TIMEOUT_BASE_S:g} s" in timeout_default
    assert f"{EXPORT_TIMEOUT_PER_EVENT_S * 1e6:g} µs per event" in timeout_default
