"""Every Python package in the source tree is listed for the wheel (a missing one breaks installs)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _source_packages() -> set[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, folder in conf["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "fixtures" in rel.parts:
                continue
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    return found


def test_every_package_is_listed():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    missing = _source_packages() - set(conf["packages"])
    assert not missing, f"add to [tool.setuptools] packages: {sorted(missing)}"


def test_tracked_tree_travels():
    """The checkout stays small enough to clone quickly and to copy to a GPU machine (64 MiB)."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        import pytest
        pytest.skip("not a git checkout (an installed package has no tracked tree)")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    size = sum((ROOT / n).stat().st_size for n in names.decode().split("\0") if n and (ROOT / n).is_file())
    assert size <= 60 * 2**20, f"tracked files take {size / 2**20:.1f} MiB (limit 60)"
