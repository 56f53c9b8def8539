"""The demand package stays acyclic: leaves (affinity, outcomes, workload) <- fold <- correlation <- forecast.

A cycle between these parts would make import order matter and hide a module that no longer
has one responsibility; this reads every import statement (module level and inside functions).
A subpackage (forecast) is one part: the imports of all its files.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import grid.demand
from tests.parse_source import parse_source

PACKAGE = "grid.demand"
ROOT = Path(grid.demand.__file__).parent
MODULES = sorted(
    [p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"]
    + [p.parent.name for p in ROOT.glob("*/__init__.py")]
)


def _files(module: str) -> list[Path]:
    package = ROOT / module
    return sorted(package.rglob("*.py")) if package.is_dir() else [ROOT / f"{module}.py"]


def _imported_names(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        return [module] + [f"{module}.{a.name}" for a in node.names]
    return []


def demand_imports(module: str) -> set[str]:
    """Sibling modules of grid.demand that `module` imports, anywhere in its file(s)."""
    out: set[str] = set()
    for path in _files(module):
        rel = path.relative_to(ROOT).with_suffix("").parts
        package = ".".join((PACKAGE, *rel[:-1]))
        for node in ast.walk(parse_source(path.read_text())):
            for name in _imported_names(node, package):
                parts = name.split(".")
                if parts[:2] == ["grid", "demand"] and len(parts) > 2 and parts[2] in MODULES:
                    out.add(parts[2])
    out.discard(module)
    return out


def test_the_demand_package_has_no_import_cycle() -> None:
    graph = {m: demand_imports(m) for m in MODULES}
    # The reader sees the edges the docstring names (so an unreadable import is not a pass).
    assert {"fold", "correlation", "affinity", "outcomes"} <= graph["forecast"]
    assert "fold" in graph["correlation"]
    assert {"affinity", "outcomes"} <= graph["fold"]
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle in {PACKAGE}: {' -> '.join(exc.args[1])}") from None
    assert order.index("fold") < order.index("correlation") < order.index("forecast")


def test_leaf_modules_import_no_sibling() -> None:
    # affinity and outcomes are folded by fold; workload runs in the gateway: none needs a sibling.
    assert {m: demand_imports(m) for m in ("affinity", "outcomes", "workload")} == {
        "affinity": set(), "outcomes": set(), "workload": set(),
    }
