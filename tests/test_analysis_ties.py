"""The ground floor and the analysis modules import only downwards (issue 25, "untie first").

* ``polyprof.hooks.components`` (the interfaces plugins implement) imports nothing of the analysis
  layer; ``Aggregator`` lives in ``polyprof.analysis.averages``, next to what it returns (its old path,
  ``polyprof.hooks.components.Aggregator``, is ``polyprof._compat``'s: tests/test_module_jobs.py).
* ``polyprof.base.events`` does not import ``polyprof.base.kineto_format`` (which imports it).
* ``function_events`` -> ``event_list`` -> ``results`` is one way: no import back, even for typing.

Imports inside functions and under ``TYPE_CHECKING`` count; a module ``__getattr__`` defined as a
function is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import polyprof

CORE = Path(polyprof.__file__).parent


def polyprof_modules_imported(module: str) -> set[str]:
    """The ``polyprof.*`` modules that ``module``'s source imports, anywhere but a module ``__getattr__``."""
    [path] = CORE.rglob(f"{module}.py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(node)
        for top in tree.body
        if isinstance(top, ast.FunctionDef) and top.name == "__getattr__"
        for node in ast.walk(top)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "polyprof":
                found |= {f"polyprof.{alias.name}" for alias in node.names}
            elif node.module.startswith("polyprof."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("polyprof.")}
    return found


@pytest.mark.parametrize(
    ("module", "never"),
    [
        ("components", {"averages", "results", "tree", "event_list", "function_events", "table"}),
        ("events", {"kineto_format"}),
        ("function_events", {"results", "event_list", "averages"}),
        ("event_list", {"results"}),
        ("averages", {"results", "event_list"}),
    ],
)
def test_no_import_runs_back_up(module: str, never: set[str]) -> None:
    back = polyprof_modules_imported(module) & {f"polyprof.{name}" for name in never}
    assert not back, f"polyprof.{module} imports {sorted(back)}"
