"""The layer order of polyprof's modules (docs/architecture.md, "Layers"): imports run down, never up.

Every module of the four packages belongs to exactly one layer, and a module may import only from its
own layer or the layers below it, at import time or inside a function. The exceptions are named:
type annotations that name a type of a higher layer (the hook specifications name the session and
the plugin manager they hand to plugins, as pytest's hookspec names its Session). A new module gets a
row here; an import that runs up fails with the line to change. The scan is scripts/import_graph.py.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Bottom up: each layer is a subpackage of polyprof (its ``__init__`` says what lives there and what
#: it may import), and a few modules of the package's root. A pattern names modules (fnmatch on
#: dotted names); a module matches exactly one layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("polyprof._version", "polyprof.base", "polyprof.base.*")),
    ("compat", ("polyprof._compat",)),
    ("native", ("polyprof.native", "polyprof.native.*")),
    ("formats", ("polyprof.formats", "polyprof.formats.*")),
    ("analysis", ("polyprof.analysis", "polyprof.analysis.*")),
    ("hooks", ("polyprof.hooks", "polyprof.hooks.*")),
    ("runtime", ("polyprof.runtime", "polyprof.runtime.*")),
    ("contract", ("polyprof.plugin", "polyprof.testing")),
    ("plugins", ("polyprof_builtins", "polyprof_builtins.*", "polyprof_cuda", "polyprof_cuda.*",
                 "polyprof_xpu", "polyprof_xpu.*")),
    ("frontends", ("polyprof.frontends", "polyprof.frontends.*")),
    ("ranks", ("polyprof.ranks", "polyprof.ranks.*")),
    ("public", ("polyprof", "polyprof.legacy", "polyprof.itt", "polyprof.shim")),
    ("cli", ("polyprof.cli", "polyprof.cli.*", "polyprof.__main__")),
)  # fmt: skip

#: (importer, imported): type annotations that name a higher layer's type, and why each may.
TYPING_UP = {
    (
        "polyprof.hooks.hookspecs",
        "polyprof.runtime.session",
    ): "the hooks receive the session (pytest's shape)",
}


#: The one circle allowed: closed by annotations only (pytest's hookspec names its Session the same way).
TYPING_CIRCLES = [["polyprof.hooks.hookspecs", "polyprof.hooks.registry", "polyprof.runtime.session"]]
#: Issue 25's ceiling on arrows that point up (scripts/import_graph.py counts them).
MAX_ARROWS_BACK_UP = 3


def _graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    modules = module.package_modules(ROOT)
    return module, modules, module.import_edges(modules)


GRAPH, MODULES, EDGES = _graph()


def layer_of(module: str) -> list[int]:
    return [
        i for i, (_, patterns) in enumerate(LAYERS) if any(fnmatch.fnmatchcase(module, p) for p in patterns)
    ]


def test_every_module_is_in_exactly_one_layer() -> None:
    unplaced = sorted(m for m in MODULES if len(layer_of(m)) != 1)
    assert not unplaced, f"give each a row in tests/test_layers.py LAYERS (or fix a double match): {unplaced}"


def test_every_pattern_names_a_module() -> None:
    stale = [
        p for _, patterns in LAYERS for p in patterns if not any(fnmatch.fnmatchcase(m, p) for m in MODULES)
    ]
    assert not stale, f"LAYERS names modules that no longer exist: {stale}"


def test_imports_run_down_the_layers() -> None:
    up = []
    for (importer, imported), kinds in sorted(EDGES.items()):
        [a], [b] = layer_of(importer) or [-1], layer_of(imported) or [-1]
        if a >= b:
            continue
        runtime = {k: lines for k, lines in kinds.items() if k != "typing"}
        if not runtime and (importer, imported) in TYPING_UP:
            continue
        where = "; ".join(
            f"{kind} import at line {','.join(map(str, lines))}" for kind, lines in kinds.items()
        )
        up.append(f"{importer} ({LAYERS[a][0]}) -> {imported} ({LAYERS[b][0]}): {where}")
    assert not up, "imports that run up the layers:\n" + "\n".join(up)


@pytest.mark.parametrize("pair", sorted(TYPING_UP))
def test_each_named_exception_is_still_needed(pair: tuple[str, str]) -> None:
    assert pair in EDGES and set(EDGES[pair]) == {"typing"}, (
        f"{pair} no longer imports for typing only: drop it"
    )


def test_no_circle_but_the_named_typing_one_and_few_arrows_up() -> None:
    """Layers allow imports inside a layer; this keeps circles from coming back there too."""
    measured = GRAPH.measure(ROOT)
    assert measured["circle_members"] == TYPING_CIRCLES, measured["circle_members"]
    assert measured["typing_only_circles"] == measured["circles"], "a circle closed by imports that run"
    assert measured["arrows_back_up"] <= MAX_ARROWS_BACK_UP, measured["arrows_back_up_list"]


def test_the_scan_finds_circles_floors_and_the_arrow_that_points_up(tmp_path: Path) -> None:
    """scripts/import_graph.py on a tiny package: a -> b -> c at run time, c -> a in an annotation."""
    package = tmp_path / "core" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import thing\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\nthing = 1\n"
    )
    (package / "d.py").write_text("if not TYPE_CHECKING:\n    import pkg.a\n")  # runs: not typing
    measured = GRAPH.measure(tmp_path)
    assert measured["circle_members"] == [["pkg.a", "pkg.b", "pkg.c"]]
    assert measured["typing_only_circles"] == 1
    assert measured["arrows_back_up_list"] == [["pkg.c", "pkg.a", {"typing": [3]}]]
    assert measured["floor_of"] == {"pkg": 1, "pkg.a": 3, "pkg.b": 2, "pkg.c": 1, "pkg.d": 4}


#: Issue 25's ceiling on floors, counted on the rooms: each layer subpackage drawn as one.
MAX_ROOM_FLOORS = 10


def test_the_rooms_stand_on_few_floors_with_no_circle_but_pytests_shape() -> None:
    """Drawn a subpackage to a room (``scripts/import_graph.py --rooms``): few floors, arrows down."""
    measured = GRAPH.measure(ROOT, rooms=True)
    assert measured["floors"] <= MAX_ROOM_FLOORS, measured["floor_of"]
    assert measured["arrows_back_up"] <= MAX_ARROWS_BACK_UP, measured["arrows_back_up_list"]
    assert measured["typing_only_circles"] == measured["circles"], measured["circle_members"]


@pytest.mark.parametrize(
    "package", sorted({GRAPH.room_of(m) for m in MODULES if m.count(".") >= 2 and m.startswith("polyprof.")})
)
def test_each_layer_subpackage_says_what_lives_there_and_what_it_may_import(package: str) -> None:
    init = ROOT / "core" / Path(*package.split(".")) / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    assert "What lives" in docstring and "May import" in docstring, f"{init}: say both in its docstring"
