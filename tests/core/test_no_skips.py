"""Tests cannot skip what the README's install line installs: a broken install must fail, not
turn the independent-reference tests into skips. Only what a machine may lack (TensorRT, a CUDA
GPU) may be skipped.

The session guard (tests/skip_guard.py) fails any run in which a test skips or xfails for
another reason, whatever spells it. This static scan adds what a run cannot see: an ImportError
of an installed package swallowed without a skip, and skips in tests a run deselected
(``-m "not slow"``, the GPU tests).

Also: every third-party package that the library imports is declared in pyproject.toml."""

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the extras of the README's install line: pip install -e '.[cpu,torch,eval,test,triton,ray,ultralytics,tensorrt-rtx]'
INSTALL_LINE_EXTRAS = ("cpu", "torch", "eval", "test", "triton", "ray", "ultralytics", "tensorrt-rtx")


def _dist_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extras=INSTALL_LINE_EXTRAS) -> set[str]:
    """Normalized distribution names: pyproject's dependencies plus the given extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return {_normalize(_dist_name(r)) for r in reqs}


def import_names(dists: set[str]) -> dict[str, str]:
    """Top-level import name -> distribution, for the installed ``dists``; a declared distribution
    that is not installed fails here (the install is broken)."""
    by_dist: dict[str, set[str]] = {}
    for module, owners in md.packages_distributions().items():
        for owner in owners:
            by_dist.setdefault(_normalize(owner), set()).add(module)
    missing = sorted(d for d in dists if not by_dist.get(d))
    assert not missing, f"declared but not installed (or providing no module): {missing}"
    return {module: d for d in dists for module in by_dist[d]}


def _constant_modules(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _imported(node: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            out += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out.append(n.module)
    return out


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def skips_of_installed(source: str, installed: set[str]) -> list[str]:
    """What in ``source`` skips (or swallows the ImportError of) a module of ``installed``
    (top-level names): importorskip, skipif conditions and find_spec naming one, and
    ``try: import X / except ImportError``."""
    def hit(name: str) -> bool:
        return name.split(".")[0] in installed

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in ("importorskip", "find_spec") and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str) and hit(first.value):
                    found.append(f"line {node.lineno}: {name}({first.value!r})")
            elif name == "skipif":
                condition = node.args[:1] + [k.value for k in node.keywords if k.arg == "condition"]
                for c in condition:
                    found += [f"line {node.lineno}: skipif on {m!r}" for m in _constant_modules(c) if hit(m)]
        elif isinstance(node, ast.Try):
            caught = {n.id for h in node.handlers if h.type is not None for n in ast.walk(h.type)
                      if isinstance(n, ast.Name)}
            if caught & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}:
                found += [f"line {node.lineno}: except ImportError around import {m}"
                          for m in _imported(ast.Module(body=node.body, type_ignores=[])) if hit(m)]
    return found


@pytest.fixture(scope="module")
def installed() -> set[str]:
    """Top-level modules the install line provides, the project's own included."""
    return set(import_names(declared())) | {"norcal"}


def test_install_line_covers_what_it_must(installed):
    # the mapping itself is real: the packages the tests rely on most are in it
    assert {"onnxruntime", "lvis", "tritonclient", "ray", "torch", "torchvision", "yaml", "PIL",
            "faster_coco_eval", "norcal"} <= installed
    assert "tensorrt" not in installed


def test_no_test_skips_what_the_install_line_installs(installed):
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "fixtures" in path.relative_to(ROOT / "tests").parts:
            continue
        bad += [f"{path.relative_to(ROOT)} {hit}" for hit in skips_of_installed(path.read_text(), installed)]
    assert not bad, "import what the install line installs, skip only what a machine may lack:\n" + "\n".join(bad)


# the samples spell the call in two pieces, so that a plain grep of tests/ for skipped imports
# finds the real ones only
SKIP = "importor" + "skip"


@pytest.mark.parametrize("source", [
    f"import pytest\nort = pytest.{SKIP}('onnxruntime')\n",
    f"from pytest import {SKIP}\n{SKIP}('tritonclient.grpc.model_config_pb2', reason='x')\n",
    "import importlib.util, pytest\n@pytest.mark.skipif(importlib.util.find_spec('lvis') is None, reason='r')\n"
    "def test_x(): pass\n",
    "import pytest\n@pytest.mark.skipif(condition='ray' not in dir(), reason='r')\ndef test_x(): pass\n",
    "import pytest\ndef f():\n    try:\n        import torch.nn\n    except ImportError:\n        pytest.skip('no torch')\n",
    f"import pytest\nsurgery = pytest.{SKIP}('norcal.export.graph.surgery')\n",
])
def test_checker_finds_skips_of_installed_packages(source, installed):
    assert skips_of_installed(source, installed)


@pytest.mark.parametrize("source", [
    f"import pytest\ntrt = pytest.{SKIP}('tensorrt')\n",
    "import pytest, shutil\n@pytest.mark.skipif(not shutil.which('cmake'), reason='needs torch and cmake')\n"
    "def test_x(): pass\n",
    "def f():\n    try:\n        import tensorrt\n    except ImportError:\n        return 'no tensorrt'\n",
])
def test_checker_allows_what_a_machine_may_lack(source, installed):
    assert skips_of_installed(source, installed) == []


# -- every third-party import of the library is declared ----------------------------------------

LIBRARY = ("norcal", "export", "runtime")


def library_imports() -> dict[str, set[str]]:
    """Top-level module -> the library files importing it (absolute imports only)."""
    out: dict[str, set[str]] = {}
    for folder in LIBRARY:
        for path in (ROOT / folder).rglob("*.py"):
            for module in _imported(ast.parse(path.read_text())):
                out.setdefault(module.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return out


def undeclared(imports: dict[str, set[str]], providers: dict[str, str]) -> dict[str, set[str]]:
    """The imports that neither the standard library, the project nor a declared distribution
    (``providers``: import name -> distribution) provides."""
    own = {"norcal", "tensorrt"}  # tensorrt: the declared `tensorrt` extra, not installable here
    return {m: files for m, files in imports.items()
            if m not in sys.stdlib_module_names and m not in own and m not in providers}


def test_every_third_party_import_is_declared():
    providers = import_names(declared(INSTALL_LINE_EXTRAS))
    missing = undeclared(library_imports(), providers)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_import_check_can_fail():
    providers = import_names(declared(INSTALL_LINE_EXTRAS))
    imports = library_imports()
    assert {"numpy", "onnx", "onnxruntime", "yaml", "PIL", "torch"} <= set(imports)
    # a distribution left out of pyproject makes its imports undeclared
    without_yaml = {m: d for m, d in providers.items() if d != "pyyaml"}
    assert set(undeclared(imports, without_yaml)) == {"yaml"}
