"""Only norcal.cli draws: no module of the library layers imports rich (they return data,
report progress through callbacks and raise one-line errors; the CLI renders)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = [ROOT / "norcal" / "core", ROOT / "norcal" / "workflows", ROOT / "norcal" / "evaluation",
           ROOT / "export", ROOT / "runtime"]


def rich_imports(source: str) -> list[int]:
    """Lines of every import of rich (or a submodule), at any depth (function-level too)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(n == "rich" or n.startswith("rich.") for n in names):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_finds_rich_imports():
    sample = "import os\ndef f():\n    from rich.table import Table\nimport rich\nimport richer\nfrom .rich import x\n"
    assert rich_imports(sample) == [3, 4]


def test_no_library_module_imports_rich():
    files = [p for top in LIBRARY for p in sorted(top.rglob("*.py"))]
    assert any(p.parent.name == "workflows" for p in files) and any(p.parent.name == "core" for p in files)
    found = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in rich_imports(p.read_text())]
    assert not found, "rich imported outside norcal.cli: " + ", ".join(found)
