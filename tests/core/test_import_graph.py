"""The library's import graph, function-level imports included: no circles, no oversized modules.

An import inside a function still makes two modules depend on each other; a circle hidden that
way breaks as soon as someone moves the import to the top. The graph is read from the source
(ast), so nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# import package -> folder (pyproject's package-dir)
PACKAGES = {"norcal.export": ROOT / "export", "norcal.runtime": ROOT / "runtime", "norcal": ROOT / "norcal"}
MAX_LINES = 450


def module_files() -> dict[str, Path]:
    """Every library module by its dotted name (package ``__init__`` under the package's name)."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if package == "norcal" and parts and parts[0] == "examples" or ".venv" in path.parts:
                continue
            found.setdefault(name, path)
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The library module ``name`` refers to (itself, or its package when it names an object)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The library modules ``path`` imports anywhere in it (top level, functions, TYPE_CHECKING
    blocks excepted: they never run)."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import sub`` imports the submodule when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            hit = _resolve(t, modules)
            if hit is not None and hit != name:
                out.add(hit)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_circles_finds_a_circle_hidden_in_a_function(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("import norcal.b\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from norcal import a\n")
    modules = {"norcal.a": a, "norcal.b": b}
    graph = {n: imports_of(n, p, modules) for n, p in modules.items()}
    assert circles(graph) == [["norcal.a", "norcal.b"]]
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from norcal import a\n")
    graph = {n: imports_of(n, p, modules) for n, p in modules.items()}
    assert circles(graph) == []


def test_the_scan_sees_the_whole_library():
    graph = import_graph()
    assert {"norcal.core.contract", "norcal.export.graph.surgery", "norcal.runtime.preprocess",
            "norcal.cli", "norcal.export.families"} <= set(graph)
    assert "norcal.core.contract" in graph["norcal.export.graph.surgery"]


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles (function-level imports included):\n" + "\n".join(
        " <-> ".join(c) for c in found)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_module_over_the_size_limit(package):
    big = {str(p.relative_to(ROOT)): n for p in PACKAGES[package].rglob("*.py")
           if ".venv" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split by what they hold): {big}"
