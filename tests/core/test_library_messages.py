"""The library names its parameters, never the CLI's flags: only norcal.cli maps them.

An AST walk over every module outside norcal/cli collects the string literals of each
NorcalError(...) call, of each ``raise`` statement, of each check Finding (what ``norcal check``
prints) and of the variables such a call is given, and none may contain "--".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from norcal.cli.options import error_line
from norcal.core.errors import NorcalError

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = [ROOT / "norcal", ROOT / "export", ROOT / "runtime"]
MESSAGE_CALLS = {"NorcalError", "Finding"}


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def _strings(node: ast.AST):
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub


def message_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal that may end up in a library error message."""
    tree = ast.parse(source)
    # each function's assignments, so that `msg = f"..."; raise NorcalError(msg)` is seen too
    assigned: dict[tuple[int, str], list[ast.expr]] = {}
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))]
    owner: dict[int, int] = {}
    for scope in scopes:
        for sub in ast.walk(scope):
            owner[id(sub)] = id(scope)  # scopes come outermost first: the innermost one wins
            if isinstance(sub, ast.Assign):
                for target in sub.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault((id(scope), target.id), []).append(sub.value)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        roots: list[ast.AST] = []
        if isinstance(node, ast.Call) and _name(node.func) in MESSAGE_CALLS:
            roots = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.Raise) and node.exc is not None:
            roots = [node.exc]
        for root in roots:
            for sub in ast.walk(root):
                if isinstance(sub, ast.Name):
                    for value in assigned.get((owner.get(id(node)), sub.id), []):
                        found += [(c.lineno, c.value) for c in _strings(value)]
            found += [(c.lineno, c.value) for c in _strings(root)]
    return sorted(set(found))


def library_modules() -> list[Path]:
    files = []
    for top in LIBRARY:
        for path in sorted(top.rglob("*.py")):
            if (ROOT / "norcal" / "cli") in path.parents or "examples" in path.parts:
                continue
            files.append(path)
    return files


def test_the_scan_covers_every_library_layer():
    rel = {p.relative_to(ROOT).parts[:2] for p in library_modules()}
    for part in [("norcal", "core"), ("norcal", "workflows"), ("norcal", "evaluation"),
                 ("export", "graph"), ("export", "families"), ("export", "rcnn"), ("export", "trt_check"), ("runtime", "tensorrt_build.py")]:
        assert part in rel, part
    assert not any(p.parts[:2] == ("norcal", "cli") for p in (q.relative_to(ROOT) for q in library_modules()))


def test_no_library_message_names_a_flag():
    offenders = []
    for path in library_modules():
        for line, text in message_literals(path.read_text()):
            if "--" in text:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert not offenders, "library messages must name parameters, not flags:\n" + "\n".join(offenders)


@pytest.mark.parametrize("source", [
    'raise NorcalError("pass --table FILE")',
    'raise NorcalError(f"{x}: rebuild with a wider --batch")',
    'raise ValueError("use --force")',
    'def f():\n    msg = f"choose one with --logits {n}"\n    raise NorcalError(msg)\n',
    'findings.append(Finding("error", w, "-", "pass --profile"))',
])
def test_the_scan_finds_a_flag_in_a_message(source):
    """The check can fail: each way a flag can reach a message is seen."""
    assert any("--" in text for _, text in message_literals(source))


def test_the_scan_leaves_other_strings_alone():
    source = 'cmd = ["trtexec", "--onnx=m.onnx"]\nraise NorcalError(f"no such file {p}", param="table")\n'
    assert not any("--" in text for _, text in message_literals(source))


@pytest.mark.parametrize("message, param, flags, shown", [
    # the messages this theme rewrote: the CLI still shows the flag
    ("found no box classifier (a Softmax over the last axis or a Sigmoid fed by a Gemm/MatMul); "
     "name the classifier's input tensor as logits", "logits", {"logits": "--logits"},
     "name the classifier's input tensor as --logits"),
    ("ambiguous: 2 classifier candidates: Softmax node 'a' on 'cls_logits'; name the one to "
     "calibrate as logits", "logits", {"logits": "--logits"},
     "on 'cls_logits'; name the one to calibrate as --logits"),
    ("none of the built-in class counts (LVIS v1: 1203, v0.5: 1230) is for 7 classes; pass table "
     "(the training annotations, or a JSON of counts built from them)", "table", {},
     "is for 7 classes; pass --table (the training annotations"),
])
def test_cli_maps_the_parameters_to_flags(message, param, flags, shown):
    line = error_line(NorcalError(message, param=param), flags)
    assert shown in line and line.count("--") == 1, line


def test_default_table_error_names_its_parameter():
    from norcal.export.graph.calibrate import default_table

    with pytest.raises(NorcalError) as e:
        default_table(7)
    assert e.value.param == "table" and "--" not in str(e.value)
    assert "pass --table (" in error_line(e.value)
