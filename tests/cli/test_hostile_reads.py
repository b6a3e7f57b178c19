"""Every file a command reads goes through one reader that says what a path is when it is not a
regular file (a folder, a FIFO or device, a symlink loop), and tables or flags that cannot mean
anything are refused at load. Checked as in test_hostile.py: exit 2, one line, nothing written."""

import functools
import os

import pytest

from test_hostile import _json, check_hostile_case, register_case, world  # noqa: F401

CASES = {}
case = functools.partial(register_case, CASES)


def special(t, kind):
    """A path beside ``t`` that is not a regular file, and the words the error must hold (beside:
    the check that nothing changed reads every file in ``t``, and a FIFO would block it)."""
    t = t.parent / f"{t.name}-special"
    t.mkdir()
    if kind == "fifo":
        os.mkfifo(t / "p")
        return t / "p", "is not a regular file (a FIFO or pipe)"
    if kind == "loop":
        (t / "p").symlink_to(t / "p")
        return t / "p", "symlink loop"
    if kind == "folder":
        (t / "p").mkdir()
        return t / "p", "is a folder, not a file"
    return "/dev/zero", "is not a regular file (a character device)"


def _as(argv_of, out_name=None):
    def build(w, t, kind):
        p, words = special(t, kind)
        out = t / out_name if out_name else None
        return argv_of(w, str(p), out), f"{p}: {words}", [out] if out else []
    return build


READERS = {
    "export-config": _as(lambda w, p, o: ["export", str(w / "model_final.pth"), "--config", p, "--gamma", "0.5",
                                          "-o", str(o)], "o.onnx"),
    "export-model": _as(lambda w, p, o: ["export", p, "--gamma", "0.5", "-o", str(o)], "o.onnx"),
    "table-show": _as(lambda w, p, o: ["table", "show", p]),
    "table-build": _as(lambda w, p, o: ["table", "build", p, "-o", str(o)], "t.json"),
    "eval-gt": _as(lambda w, p, o: ["eval", "--gt", p, "--results", str(w / "results.json")]),
    "infer-image": _as(lambda w, p, o: ["infer", str(w / "cls.onnx"), p, "-o", str(o)], "r.json"),
}


def _special_named(t, kind, name):
    """:func:`special`'s path under another name (a model's suffix picks its runtime)."""
    p, words = special(t, kind)
    if isinstance(p, str):  # the device, through a link with the name
        named = t.parent / f"{t.name}-special" / name
        named.symlink_to(p)
        return named, words
    named = p.parent / name
    os.rename(p, named) if kind != "loop" else named.symlink_to(named)
    return named, words


def _base_config(w, t, kind):
    """A config whose _BASE_ is not a regular file: it was "not found"."""
    p, words = special(t, kind)
    (t / "child.yaml").write_text(f'_BASE_: "{p}"\n')
    argv = ["export", str(w / "model_final.pth"), "--config", str(t / "child.yaml"), "--gamma", "0.5",
            "-o", str(t / "o.onnx")]
    return argv, f"child.yaml: _BASE_ file {p}: {words}", [t / "o.onnx"]


def _model(argv_of, name, out_name):
    """A model (ONNX, engine) that is not a regular file: a FIFO was "no such model file"."""
    def build(w, t, kind):
        p, words = _special_named(t, kind, name)
        return argv_of(w, str(p), t / out_name), f"{p}: {words}", [t / out_name]
    return build


READERS.update({
    "infer-model": _model(lambda w, p, o: ["infer", p, str(w / "images"), "-o", str(o)], "m.onnx", "r.json"),
    "export-onnx-model": _model(lambda w, p, o: ["export", p, "--gamma", "0.5", "--table", str(w / "two.json"),
                                                 "-o", str(o)], "m.onnx", "o.onnx"),
})
for kind in ("fifo", "loop", "folder", "device"):
    case(f"export-config-base-{kind}")(functools.partial(_base_config, kind=kind))

for reader, build in READERS.items():
    for kind in ("fifo", "loop", "folder", "device"):
        if reader == "infer-image" and kind == "folder":
            continue  # a folder of images is an input
        case(f"{reader}-{kind}")(functools.partial(lambda w, t, b, k: b(w, t, k), b=build, k=kind))


def _table(t, categories):
    (t / "tab.json").write_bytes(_json({"name": "x", "categories": categories}))
    return ["table", "show", str(t / "tab.json")]


case("table-show-no-classes")(lambda w, t: (_table(t, []), "tab.json: categories: must not be empty", []))
case("table-show-negative-id")(lambda w, t: (
    _table(t, [{"id": -3, "name": "a", "image_count": 4}]), "tab.json: categories[0]: id: must be >= 0", []))
case("infer-draw-count-without-draw")(lambda w, t: (
    ["infer", str(w / "cls.onnx"), str(w / "images"), "-o", str(t / "r.json"), "--draw-count", "3"],
    "--draw-count needs --draw", [t / "r.json"]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_unreadable_path_is_named_for_what_it_is(name, world, tmp_path, capsys, monkeypatch):
    check_hostile_case(CASES[name], world, tmp_path, capsys, monkeypatch)
