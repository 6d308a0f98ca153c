"""polyprof's import graph, measured from the source: modules, arrows, floors, arrows back up, circles.

    python scripts/import_graph.py                 # the numbers, for this checkout
    python scripts/import_graph.py --circles       # and each circle's modules and the imports that tie it
    python scripts/import_graph.py --json          # everything, as JSON

Reads the packages under core/, plugins/, plugins_cuda/ and plugins_xpu/ (tests left out) with ``ast``
alone: nothing is imported or run. Every ``import`` or ``from ... import`` of another package module is
an arrow, whether it runs at import time ("top"), inside a function ("local") or only for the type
checker (under ``if TYPE_CHECKING:``, "typing"); ``from polyprof import log`` names the module
``polyprof.base.log``. A package's ``__init__`` is a module of its own.

- circles: the strongly connected components of more than one module, over all arrows; "typing-only
  circles" are those that go away when typing arrows are left out (pytest's own shape: a hook
  specification naming the session type it receives).
- arrows back up: inside each circle, the modules are ordered (importers above) so that few arrows
  point up (a greedy heuristic for the smallest such set; in a circle that only annotations close,
  on the other arrows, so that an annotation naming a higher module is what points up); those that
  still do, per module pair.
- floors: every other arrow runs down; a module that imports nothing is on floor 1, any other one
  floor above the highest module it imports at run time (typing-only imports order nothing then).
  The number of floors is the longest such chain of imports.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOTS = ("core", "plugins", "plugins_cuda", "plugins_xpu")
KINDS = ("top", "local", "typing")


def package_modules(repo: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every package module outside tests."""
    modules: dict[str, Path] = {}
    for root in ROOTS:
        base = repo / root
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(base)
            if "tests" in relative.parts or not (base / relative.parts[0] / "__init__.py").exists():
                continue
            name = ".".join(relative.with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


class _Imports(ast.NodeVisitor):
    """The package modules one module imports, each with the kind of its import and its line."""

    def __init__(self, module: str, modules: dict[str, Path], is_package: bool) -> None:
        self.module, self.modules, self.is_package = module, modules, is_package
        self.context: list[str] = []
        self.found: list[tuple[str, str, int]] = []

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        typing = "TYPE_CHECKING" in test and not test.startswith("not ")
        self.context.append("typing" if typing else "")
        for child in node.body:
            self.visit(child)
        self.context.pop()
        for child in node.orelse:
            self.visit(child)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.context.append("local")
        self.generic_visit(node)
        self.context.pop()

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.visit_FunctionDef(node)

    def _add(self, target: str, line: int) -> None:
        while target and target not in self.modules:
            target = target.rpartition(".")[0]
        if target and target != self.module:
            kind = "typing" if "typing" in self.context else "local" if "local" in self.context else "top"
            self.found.append((target, kind, line))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:  # relative: resolve against this module's package
            parts = self.module.split(".")
            keep = len(parts) - node.level + (1 if self.is_package else 0)
            base = ".".join(parts[:keep])
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        for alias in node.names:
            self._add(f"{source}.{alias.name}", node.lineno)


def import_edges(modules: dict[str, Path]) -> dict[tuple[str, str], dict[str, list[int]]]:
    """(importer, imported) -> kind -> lines."""
    edges: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for module, path in modules.items():
        visitor = _Imports(module, modules, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for target, kind, line in visitor.found:
            edges[(module, target)][kind].append(line)
    return edges


def strongly_connected(nodes: list[str], arrows: set[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's components (iterative), each sorted; singletons included."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(arrows):
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            successors = graph[node]
            if child < len(successors):
                work.append((node, child + 1))
                nxt = successors[child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return components


def feedback_order(members: list[str], arrows: set[tuple[str, str]]) -> list[str]:
    """An order of one circle's modules, importers first, that leaves few arrows pointing back up
    (Eades, Lin and Smyth's greedy heuristic for a small feedback arc set)."""
    inside = {(a, b) for a, b in arrows if a in members and b in members and a != b}
    left = set(members)
    head: list[str] = []  # from the top down
    tail: list[str] = []  # from the bottom up, reversed at the end

    def imports(m: str) -> int:
        return sum(1 for a, b in inside if a == m and b in left)

    def imported_by(m: str) -> int:
        return sum(1 for a, b in inside if b == m and a in left)

    while left:
        sinks = [m for m in sorted(left) if imports(m) == 0]
        sources = [m for m in sorted(left) if imported_by(m) == 0]
        if sinks:
            tail.extend(sinks)
            left.difference_update(sinks)
        elif sources:
            head.extend(sources)
            left.difference_update(sources)
        else:
            best = max(sorted(left), key=lambda m: imports(m) - imported_by(m))
            head.append(best)
            left.discard(best)
    return head + tail[::-1]


def room_of(module: str) -> str:
    """The room a module stands in: its layer subpackage (``polyprof.analysis.tree`` is in
    ``polyprof.analysis``), the module itself at the package's root, or its plugin distribution."""
    parts = module.split(".")
    if parts[0] != "polyprof":
        return parts[0]
    return ".".join(parts[:2])


def room_edges(
    edges: dict[tuple[str, str], dict[str, list[int]]],
) -> dict[tuple[str, str], dict[str, list[int]]]:
    """The arrows between rooms: every import from one room into another, with its kinds."""
    rooms: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for (a, b), kinds in edges.items():
        if room_of(a) != room_of(b):
            for kind, lines in kinds.items():
                rooms[(room_of(a), room_of(b))][kind].extend(lines)
    return {pair: dict(kinds) for pair, kinds in rooms.items()}


def measure(repo: Path, rooms: bool = False) -> dict:
    """The numbers of the module graph, or (``rooms``) of the graph of rooms: subpackages drawn whole."""
    found = package_modules(repo)
    edges = import_edges(found)
    modules = set(found)
    if rooms:
        modules, edges = {room_of(m) for m in found}, room_edges(edges)
    arrows = set(edges)
    components = strongly_connected(sorted(modules), arrows)
    circles = [members for members in components if len(members) > 1]
    without_typing = {pair for pair, kinds in edges.items() if set(kinds) - {"typing"}}
    # inside each circle, the arrows that run back up in the order that leaves fewest (heuristic)
    back_up: list[tuple[str, str]] = []
    for members in circles:
        # a circle that only annotations close: order it on the other arrows, so that an annotation
        # naming a higher module is what points up (pytest's hookspec naming its Session)
        runtime_inside = {(a, b) for a, b in without_typing if a in members and b in members}
        typing_only = not any(len(c) > 1 for c in strongly_connected(members, runtime_inside))
        order = feedback_order(members, runtime_inside if typing_only else arrows)
        position = {m: i for i, m in enumerate(order)}
        back_up.extend(
            (a, b) for a, b in arrows if a in position and b in position and position[a] > position[b]
        )
    # floors: the chain of imports that run at import time or in a function (an annotation orders
    # nothing when the program runs)
    downward = without_typing - set(back_up)
    # floors: 1 for a module that imports nothing (downward), else one above the highest it imports
    imports: dict[str, set[str]] = defaultdict(set)
    for a, b in downward:
        imports[a].add(b)
    floor: dict[str, int] = {}
    for start in sorted(modules):
        pending = [start]
        while pending:
            top = pending[-1]
            if top in floor:
                pending.pop()
                continue
            missing = [d for d in imports[top] if d not in floor]
            if missing:
                pending.extend(missing)
                continue
            pending.pop()
            floor[top] = 1 + max((floor[d] for d in imports[top]), default=0)
    runtime_circles = [m for m in strongly_connected(sorted(modules), without_typing) if len(m) > 1]
    return {
        "modules": len(modules),
        "arrows": len(arrows),
        "arrows_by_kind": {k: sum(1 for kinds in edges.values() if k in kinds) for k in KINDS},
        "floors": max(floor.values(), default=0),
        "arrows_back_up": len(back_up),
        "typing_arrows_back_up": sum(1 for pair in back_up if pair not in without_typing),
        "circles": len(circles),
        "circle_sizes": [len(c) for c in circles],
        "typing_only_circles": len(circles) - len(runtime_circles),
        "circle_members": circles,
        "arrows_back_up_list": [[a, b, dict(edges[(a, b)])] for a, b in sorted(back_up)],
        "floor_of": dict(sorted(floor.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--circles", action="store_true", help="list each circle and its arrows")
    parser.add_argument("--json", action="store_true", help="everything, as JSON")
    parser.add_argument(
        "--rooms", action="store_true", help="rooms, not modules: each layer subpackage drawn whole"
    )
    args = parser.parse_args(argv)
    result = measure(args.repo, rooms=args.rooms)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return 0
    print(
        f"{'rooms' if args.rooms else 'modules'} {result['modules']}, arrows {result['arrows']} "
        f"(top {result['arrows_by_kind']['top']}, local {result['arrows_by_kind']['local']}, "
        f"typing {result['arrows_by_kind']['typing']}), floors {result['floors']}, "
        f"arrows back up {result['arrows_back_up']} ({result['typing_arrows_back_up']} typing-only), "
        f"circles {result['circles']} "
        f"{result['circle_sizes']} ({result['typing_only_circles']} typing-only)"
    )
    if args.circles:
        for members in result["circle_members"]:
            print(f"circle of {len(members)}: {', '.join(members)}")
        print("arrows back up:")
        for a, b, kinds in result["arrows_back_up_list"]:
            where = "; ".join(f"{k} :{','.join(map(str, lines))}" for k, lines in kinds.items())
            print(f"  {a} -> {b} ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
