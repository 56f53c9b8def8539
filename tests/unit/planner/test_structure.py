"""The planner's modules form a layered graph: no import cycle, even a deferred one."""

from __future__ import annotations

import ast
from pathlib import Path

import grid.planner
from tests.parse_source import parse_source

PACKAGE = Path(grid.planner.__file__).parent


def planner_imports(path: Path) -> set[str]:
    """Planner modules imported anywhere in the file (function-level imports included)."""
    out: set[str] = set()
    for node in ast.walk(parse_source(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "grid.planner":
                out.update(a.name for a in node.names)
            elif node.module.startswith("grid.planner."):
                out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("grid.planner."):
                    out.add(a.name.split(".")[2])
    return out


def test_planner_modules_have_no_import_cycle():
    graph = {p.stem: planner_imports(p) for p in sorted(PACKAGE.glob("*.py"))}
    done: set[str] = set()

    def visit(mod: str, path: tuple[str, ...]) -> None:
        assert mod not in path, "import cycle: " + " -> ".join((*path, mod))
        if mod in done:
            return
        for dep in sorted(graph.get(mod, ())):
            visit(dep, (*path, mod))
        done.add(mod)

    for mod in graph:
        visit(mod, ())
