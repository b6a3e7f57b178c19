"""Every Python package in the source tree is listed for the wheel (a missing one breaks installs)."""

import os
import re
import shutil
import subprocess
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


def _rule(line: str) -> tuple[bool, bool, re.Pattern]:
    """(negated, directories only, regex over the root-relative path) of one .gitignore line."""
    negated, line = line.startswith("!"), line.removeprefix("!")
    dir_only, line = line.endswith("/"), line.rstrip("/")
    anchored = "/" in line
    out = ""
    for part in re.split(r"(\*\*/|\*\*|\*|\?)", line.lstrip("/")):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
    return negated, dir_only, re.compile(out if anchored else f"(?:.*/)?{out}")


def ignored(rel: str, is_dir: bool, rules) -> bool:
    """Whether git's rules (the last matching line wins) ignore the root-relative path ``rel``."""
    hit = False
    for negated, dir_only, pattern in rules:
        if (is_dir or not dir_only) and pattern.fullmatch(rel):
            hit = not negated
    return hit


def unignored_files(root: Path) -> set[str]:
    """The files under ``root`` that its .gitignore does not ignore: what git would track if all
    were added, so at least the tracked files (a checkout without .git measures these)."""
    text = (root / ".gitignore").read_text() if (root / ".gitignore").exists() else ""
    rules = [_rule(ln) for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    found = set()
    for folder, dirs, files in os.walk(root):
        base = "" if Path(folder) == root else Path(folder).relative_to(root).as_posix()
        rel = [f"{base}/{n}".lstrip("/") for n in dirs]
        dirs[:] = [n for n, r in zip(dirs, rel) if n != ".git" and not ignored(r, True, rules)]
        found |= {r for r in (f"{base}/{n}".lstrip("/") for n in files) if r != ".git" and not ignored(r, False, rules)}
    return found


def git_tracked(root: Path) -> set[str] | None:
    """The files git tracks under ``root``; None where there is no git or no repository."""
    if shutil.which("git") is None or not (root / ".git").exists():
        return None
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True).stdout
    return {n for n in names.decode().split("\0") if n}


def test_tracked_tree_travels():
    """The checkout stays small enough to clone quickly and to copy to a GPU machine (64 MiB).
    Without git (a copied tree) it measures every file .gitignore lets through, which holds the
    tracked ones."""
    walked = unignored_files(ROOT)
    tracked = git_tracked(ROOT)
    if tracked is not None:
        assert not tracked - walked, f"tracked but ignored by .gitignore's rules here: {sorted(tracked - walked)}"
    names, what = (tracked, "tracked files") if tracked is not None else (walked, "files .gitignore lets through")
    size = sum((ROOT / n).lstat().st_size for n in names if (ROOT / n).is_file())
    assert size <= 60 * 2**20, f"{what} take {size / 2**20:.1f} MiB (limit 60)"


def test_the_walk_follows_gitignore(tmp_path):
    (tmp_path / ".gitignore").write_text("# note\n__pycache__/\n/out/\n*.onnx\n!tests/fixtures/**/packed/**/*.onnx\n"
                                         "/tests/fixtures/d2_*/images/\nbuild/\n*.tmp\n")
    for rel in ["a.py", "a.onnx", "out/x.txt", "sub/out/y.txt", "pkg/__pycache__/m.pyc", "pkg/m.py",
                "tests/fixtures/d2_t/packed/m.onnx", "tests/fixtures/d2_t/packed/q/m.onnx", "tests/fixtures/m.onnx",
                "tests/fixtures/d2_t/images/1.png", "tests/fixtures/d3/images/1.png", "x/build/lib.so",
                "build", "n.tmp", ".git/HEAD"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    # what `git add -A; git ls-files` lists for this tree
    assert unignored_files(tmp_path) == {
        ".gitignore", "a.py", "sub/out/y.txt", "pkg/m.py", "tests/fixtures/d2_t/packed/m.onnx",
        "tests/fixtures/d2_t/packed/q/m.onnx", "tests/fixtures/d3/images/1.png", "build"}
