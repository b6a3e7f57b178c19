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


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)


class _Module:
    """One module's scopes: each node's innermost scope, each scope's parent, each scope's
    assignments by name (a module constant is the module scope's)."""

    def __init__(self, source: str):
        self.tree = ast.parse(source)
        self.owner: dict[int, ast.AST] = {}
        self.parent: dict[int, ast.AST] = {}
        self.assigned: dict[tuple[int, str], list[ast.expr]] = {}
        for scope in (n for n in ast.walk(self.tree) if isinstance(n, _SCOPES)):  # outermost first
            for sub in ast.walk(scope):
                if sub is not scope and isinstance(sub, _SCOPES):
                    self.parent[id(sub)] = scope
                self.owner[id(sub)] = scope  # the innermost scope wins
                targets = sub.targets if isinstance(sub, ast.Assign) else \
                    [sub.target] if isinstance(sub, (ast.AnnAssign, ast.AugAssign)) and sub.value else []
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.assigned.setdefault((id(scope), target.id), []).append(sub.value)

    def values(self, node: ast.AST, name: str) -> list[ast.expr]:
        """What ``name`` is assigned in ``node``'s scope or, failing that, the nearest enclosing one."""
        scope = self.owner.get(id(node))
        while scope is not None:
            if (id(scope), name) in self.assigned:
                return self.assigned[(id(scope), name)]
            scope = self.parent.get(id(scope))
        return []

    def roots(self, calls: dict[str, set | None]):
        """(node, expression) of every message: a raise's exception, a message call's arguments
        (those ``calls`` names for it: positions and keywords, or None for all)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and _name(node.func) in calls:
                which = calls[_name(node.func)]
                yield from ((node, a) for i, a in enumerate(node.args) if which is None or i in which)
                yield from ((node, k.value) for k in node.keywords if which is None or k.arg in which)
            elif isinstance(node, ast.Raise) and node.exc is not None:
                yield node, node.exc

    def reaching(self, node: ast.AST, root: ast.expr):
        """``root`` and what the names in it were assigned (one step, any enclosing scope)."""
        yield root
        for sub in ast.walk(root):
            if isinstance(sub, ast.Name):
                yield from self.values(node, sub.id)


def _text_params(func: ast.FunctionDef) -> dict[str, int | None]:
    """A function's parameters that may hold text (annotated ``str``, or not at all) -> their
    position in a call (None: keyword-only); ``self`` and ``cls`` are not counted."""
    args = func.args
    positional = [a for a in [*args.posonlyargs, *args.args] if a.arg not in ("self", "cls")]
    out: dict[str, int | None] = {}
    for i, a in [*enumerate(positional), *((None, a) for a in args.kwonlyargs)]:
        if a.annotation is None or "str" in {n.id for n in ast.walk(a.annotation) if isinstance(n, ast.Name)}:
            out[a.arg] = i
    return out


def message_helpers(sources: list[str]) -> dict[str, set | None]:
    """:data:`MESSAGE_CALLS` plus the functions that put a text parameter into a message (``def
    fail(why: str): raise NorcalError(why)``), or pass one on to such a function: name -> the
    positions and keywords of those parameters, whose strings at a call are messages too."""
    modules = [_Module(s) for s in sources]
    calls: dict[str, set | None] = dict.fromkeys(MESSAGE_CALLS)
    grown = True
    while grown:
        grown = False
        for m in modules:
            for node, root in list(m.roots(calls)):
                scope = m.owner.get(id(node))
                if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or calls.get(scope.name, 0) is None:
                    continue
                params = _text_params(scope)
                used = {n.id for expr in m.reaching(node, root) for n in ast.walk(expr)
                        if isinstance(n, ast.Name) and n.id in params}
                known = calls.setdefault(scope.name, set())
                new = {params[u] for u in used if params[u] is not None} | used
                if not new <= known:
                    known |= new
                    grown = True
    return calls


def message_literals(source: str, calls: dict[str, set | None] = dict.fromkeys(MESSAGE_CALLS)) -> list[tuple[int, str]]:
    """(line, text) of every string literal that may end up in a library error message: in a
    raise, in the message arguments of ``calls`` (:func:`message_helpers`), or in what a name
    there was assigned (in the function or as a module constant)."""
    m = _Module(source)
    return sorted({(c.lineno, c.value) for node, root in m.roots(calls)
                   for expr in m.reaching(node, root) for c in _strings(expr)})


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
    calls = message_helpers([p.read_text() for p in library_modules()])
    for path in library_modules():
        for line, text in message_literals(path.read_text(), calls):
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


@pytest.mark.parametrize("source", [
    # a module constant, whole or formatted
    'HINT = "pass --table FILE"\n\ndef f():\n    raise NorcalError(HINT)\n',
    'MSG = "{} boxes: raise --max-dets"\n\ndef f(n):\n    raise NorcalError(MSG.format(n), param="x")\n',
    'HINT: str = "pass --table"\n\ndef f():\n    def g():\n        return NorcalError(f"no table; {HINT}")\n    raise g()\n',
    # an f-string given to a helper that raises, directly or through another helper, or a method
    'def _fail(why: str):\n    raise NorcalError(f"bad input: {why}")\n\ndef g(n):\n    _fail(f"{n} boxes; raise --max-dets")\n',
    'def _fail(why):\n    raise NorcalError(why)\n\ndef _check(x, why: str):\n    if x:\n        _fail(why)\n\n'
    'def g(x):\n    _check(x, why=f"{x}: use --force")\n',
    'class C:\n    def refuse(self, key, why: str | None = None):\n        msg = f"{key}: {why}"\n        raise NorcalError(msg)\n'
    '\n    def g(self):\n        self.refuse("k", f"pass --y {self}")\n',
])
def test_the_scan_finds_a_flag_in_a_constant_or_a_helpers_message(source):
    """Planted bad messages of each kind a scan of function-local assignments misses."""
    assert any("--" in text for _, text in message_literals(source, message_helpers([source])))


def test_a_planted_helper_message_in_a_library_module_is_found():
    """A real raising helper of the library (calibration's _refuse_counts), called with a flag in
    its message from a copy of its module, is reported; its other arguments are not messages."""
    path = ROOT / "norcal" / "core" / "calibration" / "formula.py"
    planted = path.read_text() + '\n\ndef planted(arr, bad):\n    _refuse_counts(arr, bad, ["a--b"], f"use --min-count {1}")\n'
    calls = message_helpers([p.read_text() if p != path else planted for p in library_modules()])
    flagged = [text for _, text in message_literals(planted, calls) if "--" in text]
    assert flagged == ["a--b", "use --min-count "]  # names: parameter 2; rule: parameter 3


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
