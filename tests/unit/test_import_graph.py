"""The import graph of grid/ and replay/ has no cycles, and every import points down the layers.

A cycle between files makes import order matter and hides a missing seam; a cycle between
packages (say projections <-> planner) means two subjects are really one. Imports inside
functions and under `if TYPE_CHECKING:` count too: a deferred or type-only import that exists
only to dodge a cycle is still a cycle.

LAYERS names each package's layer, lowest first (docs/GLOSSARY.md says what each layer is). A
package imports only from strictly lower layers, so an upward import (say the agent reaching
into the controller for a type) fails here rather than growing into a cycle later.
"""

from __future__ import annotations

import ast
from pathlib import Path
from tests.parse_source import parse_source

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("grid", "replay")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        # The longest known module that `name` names or lies inside.
        while name:
            if name in known:
                return name
            name = name.rpartition(".")[0]
        return None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := resolve(alias.name)) is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".") if is_package else module.split(".")[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                target = resolve(f"{base}.{alias.name}") or resolve(base)
                if target is not None:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def _graph() -> dict[str, set[str]]:
    files = {p: _module_name(p) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}
    known = set(files.values())
    return {
        name: _imports(parse_source(path.read_text(), str(path)), name, path.name == "__init__.py", known)
        for path, name in files.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(out)


def _package(module: str) -> str:
    """grid.<sub> for the grid packages and top-level modules; replay whole."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "grid" and len(parts) > 1 else parts[0]


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's own __init__ re-exporting its members is not a dependency between packages.
    packages: dict[str, set[str]] = {}
    for src, targets in graph.items():
        deps = packages.setdefault(_package(src), set())
        deps.update(_package(t) for t in targets if _package(t) != _package(src))
    return packages


# Lowest to highest. A package may import only packages of a strictly lower layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("grid", "grid.clock", "grid.secrets", "grid.tasks", "grid.procstart", "grid.eventloop",
                     "grid.http_limits", "grid.logs", "grid.gcpause", "grid.netaddr", "grid.backoff")),
    ("events and settings", ("grid.events", "grid.config", "grid.serving")),
    ("vocabulary", ("grid.fleet",)),
    ("transport", ("grid.transport",)),
    ("identity", ("grid.identity",)),
    ("protocols over the transport", ("grid.infer", "grid.metrics")),
    ("folds and forecasts", ("grid.projections", "grid.demand")),
    ("derived stores and the placer", ("grid.analytics", "grid.planner")),
    ("services", ("grid.controller", "grid.agent", "grid.gateway")),
    ("compositions", ("grid.dashboard", "grid.sim", "grid.localgrid", "replay")),
    ("test fleet", ("grid.testfleet",)),
    ("cli", ("grid.cli",)),
)


def _layer_of() -> dict[str, int]:
    return {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}


def _upward_imports(packages: dict[str, set[str]], layer_of: dict[str, int]) -> list[str]:
    """Every package import that does not point to a strictly lower layer, named for the reader."""
    names = [name for name, _ in LAYERS]
    out = []
    for src in sorted(packages):
        for dst in sorted(packages[src]):
            if layer_of[dst] >= layer_of[src]:
                out.append(f"{src} ({names[layer_of[src]]}) -> {dst} ({names[layer_of[dst]]})")
    return out


def test_every_package_has_a_layer() -> None:
    assert sorted(set(_package_graph(_graph())) - set(_layer_of())) == []


def test_imports_point_down_the_layers() -> None:
    assert _upward_imports(_package_graph(_graph()), _layer_of()) == []


def test_the_checker_finds_an_upward_import() -> None:
    layers = {"low": 0, "mid": 1, "high": 2}
    assert _upward_imports({"low": {"high"}, "high": {"mid"}, "mid": {"mid2"}, "mid2": set()},
                           {**layers, "mid2": 1}) == ["low (foundations) -> high (vocabulary)",
                                                      "mid (events and settings) -> mid2 (events and settings)"]


def test_no_cycles_between_files() -> None:
    assert _cycles(_graph()) == []


def test_no_cycles_between_packages() -> None:
    assert _cycles(_package_graph(_graph())) == []


def test_replay_does_not_import_the_cli() -> None:
    graph = _graph()
    offenders = sorted(m for m, deps in graph.items() if m.startswith("replay") and any(d.startswith("grid.cli") for d in deps))
    assert offenders == []


def test_the_checker_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Libraries that open connections, start processes or touch stores: the transport's business.
IO_LIBRARIES = ("nats", "httpx", "httptools", "subprocess", "socket", "ssl", "duckdb", "uvicorn", "psutil")


def _third_party_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(parse_source(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_event_types_and_vocabulary_import_no_io() -> None:
    offenders = sorted(
        f"{_module_name(path)} imports {lib}"
        for pkg in ("grid/events", "grid/fleet")
        for path in sorted((ROOT / pkg).rglob("*.py"))
        for lib in sorted(_third_party_imports(path) & set(IO_LIBRARIES))
    )
    assert offenders == []
