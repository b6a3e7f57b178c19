"""No function in the product runs past 60 lines unless its docstring says why (a sentence
starting "Long because"), and none past 80 at all, except those listed here (to be split; the
list may only shrink: a listed function now short enough fails until it is taken off)."""

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
LIMIT = 60  # longer needs a reason in the docstring
HARD_LIMIT = 80  # longer is split, whatever the reason
REASON = "Long because"
KNOWN: set[tuple[str, str]] = set()  # (file, function): functions over HARD_LIMIT left to split


def _long_functions(root: Path) -> dict[tuple[str, str], tuple[int, bool]]:
    """(file, function) -> (lines, whether its docstring gives a reason), for those over LIMIT."""
    found = {}
    for folder in ("norcal", "export", "runtime"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > LIMIT:
                        reason = REASON in (ast.get_docstring(node) or "")
                        found[(path.relative_to(root).as_posix(), node.name)] = (lines, reason)
    return found


def test_no_new_long_function_and_the_list_only_shrinks():
    found = _long_functions(ROOT)
    over = {k: n for k, (n, _) in found.items() if n > HARD_LIMIT}
    new = {k: v for k, v in over.items() if k not in KNOWN}
    assert not new, f"functions over {HARD_LIMIT} lines: split them: {new}"
    assert set(over) == KNOWN, f"split already, take them off KNOWN: {sorted(KNOWN - set(over))}"


def test_a_function_over_the_limit_says_why():
    found = _long_functions(ROOT)
    silent = {k: n for k, (n, reason) in found.items() if not reason and k not in KNOWN}
    assert not silent, (f"functions over {LIMIT} lines whose docstring has no '{REASON} ...' "
                        f"sentence: split them or say why: {silent}")


def test_the_check_sees_a_long_function(tmp_path):
    (tmp_path / "norcal").mkdir()
    body = "    x = 1\n" * LIMIT
    (tmp_path / "norcal" / "m.py").write_text(
        "def f():\n" + body + f'def g():\n    """{REASON} it must."""\n' + body)
    assert _long_functions(tmp_path) == {("norcal/m.py", "f"): (LIMIT + 1, False),
                                         ("norcal/m.py", "g"): (LIMIT + 2, True)}
