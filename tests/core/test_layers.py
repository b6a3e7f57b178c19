"""The one-way layers (core <- export | runtime | evaluation <- workflows <- cli) and, inside
norcal.export, families that never import each other over shared parts that know no family,
by import-linter (the contracts in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _package_tree(dest: Path) -> Path:
    """The import package as a wheel lays it out: export/ and runtime/ inside norcal/."""
    pkg = dest / "norcal"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "cpp", "d2_synth_trained")
    shutil.copytree(ROOT / "norcal", pkg, ignore=ignore)
    for sub in ("export", "runtime"):
        shutil.copytree(ROOT / sub, pkg / sub, ignore=ignore)
    return dest


def test_layers_contract_is_kept(tmp_path):
    tree = _package_tree(tmp_path / "src")
    lint = Path(sys.executable).with_name("lint-imports")
    # run from the copied tree so that it, not the editable checkout, is the package analysed
    proc = subprocess.run([str(lint), "--no-cache", str(ROOT / "pyproject.toml")], cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "4 kept, 0 broken" in proc.stdout


def test_contract_catches_an_upward_import(tmp_path):
    """The check can fail: a core module importing a workflow breaks the contract."""
    tree = _package_tree(tmp_path / "src")
    bad = tree / "norcal" / "core" / "errors.py"
    bad.write_text(bad.read_text() + "\nimport norcal.workflows.tune  # noqa\n")
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache", str(ROOT / "pyproject.toml")], cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "BROKEN" in proc.stdout


def _lint(tree: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--no-cache", str(ROOT / "pyproject.toml")], cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)


def test_contract_catches_a_family_importing_another(tmp_path):
    """A family reusing another family's module (as torchvision once did detectron2's) breaks it."""
    tree = _package_tree(tmp_path / "src")
    bad = tree / "norcal" / "export" / "families" / "torchvision" / "family.py"
    bad.write_text(bad.read_text() + "\nimport norcal.export.families.detectron2.yacs_config.spec  # noqa\n")
    proc = _lint(tree)
    assert proc.returncode != 0
    assert "Detector families never import each other BROKEN" in proc.stdout


def test_contract_catches_shared_code_importing_a_family(tmp_path):
    tree = _package_tree(tmp_path / "src")
    bad = tree / "norcal" / "export" / "rcnn" / "spec.py"
    bad.write_text(bad.read_text() + "\nimport norcal.export.families.ultralytics.yolo  # noqa\n")
    proc = _lint(tree)
    assert proc.returncode != 0
    assert "What families share never depends on a family BROKEN" in proc.stdout
