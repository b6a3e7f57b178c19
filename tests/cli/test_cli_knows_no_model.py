"""The CLI knows no model: no module under norcal/cli imports the shared R-CNN
(norcal.export.rcnn) or a family's own package (norcal.export.families.<name>); what it prints
about a model comes from the family registry and ``Detector.describe``."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "norcal" / "cli"


def forbidden_prefixes() -> list[str]:
    """The shared R-CNN and every family package on disk (a new family is covered unlisted)."""
    families = ROOT / "export" / "families"
    return ["norcal.export.rcnn", *(f"norcal.export.families.{d.name}" for d in sorted(families.iterdir())
                                    if (d / "__init__.py").is_file())]


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """Every module the ``source`` of a module in ``package`` imports (top level or inside
    functions; ``from A import b`` also as A.b; relative imports resolved), and every literal
    importlib.import_module name."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            out.append((node.lineno, str(node.args[0].value)))
    return out


def model_imports(source: str, package: str) -> list[str]:
    prefixes = forbidden_prefixes()
    return [f"{line}: {name}" for line, name in imported_modules(source, package)
            if any(name == p or name.startswith(p + ".") for p in prefixes)]


def cli_model_imports() -> list[str]:
    """Each model import of every module under norcal/cli, as "file:line: module"."""
    return [f"{path.relative_to(ROOT)}:{found}" for path in sorted(CLI.rglob("*.py"))
            for found in model_imports(path.read_text(), ".".join(path.relative_to(ROOT).parts[:-1]))]


def test_no_cli_module_imports_a_model_package():
    assert cli_model_imports() == []


def test_the_families_on_disk_are_forbidden():
    prefixes = forbidden_prefixes()
    for name in ("detectron2", "foreign", "torchvision", "ultralytics"):
        assert f"norcal.export.families.{name}" in prefixes


def test_a_planted_import_is_caught():
    """The check can fail: each way of importing a model package, planted in a CLI module."""
    planted = ["from norcal.export.rcnn.spec import architecture_label",
               "import norcal.export.families.ultralytics.yolo",
               "from norcal.export.families import torchvision",
               "from norcal.export import rcnn",
               "from ...export.families.detectron2 import family",  # relative, from norcal.cli.commands
               "importlib.import_module('norcal.export.families.detectron2')"]
    for code in planted:
        assert model_imports(f"def f():\n    {code}\n", "norcal.cli.commands"), code
    allowed = "from norcal.export.families import FAMILIES\nfrom norcal.export.trt_check import check_model\n"
    assert model_imports(allowed, "norcal.cli.commands") == []
