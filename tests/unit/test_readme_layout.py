"""The repository's maps stay true to the tree they describe.

README's Layout section names every package, and every file, directory or module that README's
Layout, CONTRIBUTING.md, docs/INVARIANTS.md and docs/GLOSSARY.md name exists; CONTRIBUTING's
benchmark list is exactly the runnable modules under bench/. These documents are read before the
code, so a moved module that they still name sends a reader to a file that is not there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from tests.parse_source import parse_source

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
DOCS = ("docs/INVARIANTS.md", "docs/GLOSSARY.md", "CONTRIBUTING.md")

# Top-level directories whose paths the documents name. A match must not follow a word
# character, dot, slash or hyphen, so `localgrid.py` or a URL's path is not read as a path here.
_PATH = re.compile(r"(?<![\w./-])((?:grid|replay|bench|tests|docs|deploy)/[\w./-]*)")
# Dotted module names (`grid.fleet.states`, `grid.planner.placement.Placer`, `replay.gate`).
_MODULE = re.compile(r"(?<![\w./-])((?:grid|replay|bench|tests)(?:\.[A-Za-z_]\w*)+)")
# NATS subjects share the `grid.` prefix (grid/events/subjects.py): a dotted name whose second
# token is one of these subject families is a subject, not a module.
_SUBJECT_FAMILIES = frozenset({"host", "req", "ctl", "plan", "cmd", "authority", "ingress", "enrol"})


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _layout() -> str:
    return _section(README.read_text(), "## Layout")


def _paths(text: str) -> set[str]:
    # A sentence may end right after a path ("... in grid/fleet/states.py.").
    return {m.rstrip(".,") for m in _PATH.findall(text)}


def _packages() -> set[str]:
    """Every directory under grid/ that holds Python modules (regular or namespace packages),
    as `grid/.../`, and the two top-level packages the Layout covers beside grid."""
    found = {"replay/", "bench/"}
    for module in (ROOT / "grid").rglob("*.py"):
        directory = module.parent
        if directory != ROOT / "grid" and "__pycache__" not in directory.parts:
            found.add(directory.relative_to(ROOT).as_posix() + "/")
    return found


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.is_dir() and any(base.glob("*.py")):  # a namespace package (grid/dashboard/)
        return base
    return None


def _defines(source: Path, names: list[str]) -> bool:
    """Whether `names` (an attribute, or a class and its attribute) is defined in `source`."""
    if source.is_dir():
        return False
    body = parse_source(source.read_text()).body
    for name in names:
        found = None
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = node
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                found = node
            elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                found = node
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _module_resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        source = _module_file(parts[:i])
        if source is not None:
            return i == len(parts) or _defines(source, parts[i:])
    return False


def test_subject_families_are_not_modules() -> None:
    # Otherwise skipping subjects below could hide a reference to a module that moved.
    assert not [f for f in _SUBJECT_FAMILIES if _module_file(["grid", f]) is not None]


def test_layout_names_every_package() -> None:
    named = _paths(_layout())
    missing = sorted(p for p in _packages() if p not in named)
    assert not missing, f"README's Layout does not describe {missing}"


def test_layout_names_only_paths_that_exist() -> None:
    gone = sorted(p for p in _paths(_layout()) if not (ROOT / p).exists())
    assert not gone, f"README's Layout names paths that do not exist: {gone}"


@pytest.mark.parametrize("doc", DOCS)
def test_doc_names_only_paths_that_exist(doc: str) -> None:
    gone = sorted(p for p in _paths((ROOT / doc).read_text()) if not (ROOT / p).exists())
    assert not gone, f"{doc} names paths that do not exist: {gone}"


@pytest.mark.parametrize("doc", DOCS)
def test_doc_names_only_modules_that_exist(doc: str) -> None:
    names = {m for m in _MODULE.findall((ROOT / doc).read_text())
             if not (m.startswith("grid.") and m.split(".")[1] in _SUBJECT_FAMILIES)}
    gone = sorted(m for m in names if not _module_resolves(m))
    assert not gone, f"{doc} names modules or attributes that do not exist: {gone}"


def test_contributing_lists_every_runnable_benchmark() -> None:
    section = _section(CONTRIBUTING.read_text(), "## Benchmarks")
    listed = set(re.findall(r"^- `(\w+)`:", section, flags=re.MULTILINE))
    runnable = {p.stem for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")}
    assert listed == runnable, (
        f"CONTRIBUTING's benchmark list: missing {sorted(runnable - listed)}, "
        f"not in bench/ {sorted(listed - runnable)}")
