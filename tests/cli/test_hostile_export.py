"""Hostile input, export side: option values a user can type that once reached a traceback or
were silently changed, and inputs given in the wrong place. Each case is checked as in
test_hostile.py: exit 2, one line naming the file, field or flag, nothing written."""

import functools

import pytest

from test_hostile import _run, check_hostile_case, register_case, world  # noqa: F401

CASES = {}
case = functools.partial(register_case, CASES)


def _export(w, t, *extra, model="model_final.pth"):
    return ["export", str(w / model), *extra, "-o", str(t / "o.onnx")]


# --opset: torch's TorchScript exporter writes opsets 7..23 and our graphs need >= 17; outside
# that range the export went on to a torch traceback, and 0 was silently taken as 17
for value in ("99", "24", "16", "0"):
    case(f"export-opset-{value}")(lambda w, t, v=value: (
        _export(w, t, "--config", str(w / "config.yaml"), "--gamma", "0.5", "--opset", v),
        "--opset must be a whole number >= 17 and <= ", [t / "o.onnx"]))

# a fixed input shape the trace cannot allocate: torch's allocation traceback
case("export-batch-huge")(lambda w, t: (
    _export(w, t, "--gamma", "0.5", "--batch", "100000000"),
    "--batch must be a whole number >= 1 and <= 256, got 100000000", [t / "o.onnx"]))
case("export-height-huge")(lambda w, t: (
    _export(w, t, "--gamma", "0.5", "--height", "100000000"),
    "--height must be a whole number >= 1 and <= 8192, got 100000000", [t / "o.onnx"]))
case("export-input-beyond-tensorrt")(lambda w, t: (
    _export(w, t, "--gamma", "0.5", "--batch", "256", "--height", "8192", "--width", "8192"),
    "a fixed input of 256x3x8192x8192 = 51539607552 values exceeds TensorRT's 2147483647 per tensor",
    [t / "o.onnx"]))

# gamma * log N_c beyond float32: the node's prior initializer was written as inf
case("export-gamma-overflows-the-prior")(lambda w, t: (
    _export(w, t, "--gamma", "1e300", "--table", str(w / "two.json"), model="cls.onnx"),
    "--gamma 1e+300 makes the prior log a_c", [t / "o.onnx"]))

# a detectron2 config given as the table: say what the file is and what the table takes
case("export-table-is-a-detectron2-config")(lambda w, t: (
    _export(w, t, "--config", str(w / "config.yaml"), "--gamma", "0.5", "--table", str(w / "config.yaml")),
    "config.yaml: a detectron2 config, not class counts: --table takes a built-in name", [t / "o.onnx"]))
case("export-table-is-another-yaml")(lambda w, t: (
    _export(w, t, "--gamma", "0.5", "--table", str(_yaml(t, "other.yaml", "a: 1\n")), model="cls.onnx"),
    "other.yaml: field 'names' missing (not an Ultralytics data.yaml): --table takes", [t / "o.onnx"]))

# a folder as the model
case("export-model-is-a-folder")(lambda w, t: (
    _export(w, t, "--gamma", "0.5", model=str(_folder(t, "m.pth"))), "m.pth: is a folder", [t / "o.onnx"]))
case("build-model-is-a-folder")(lambda w, t: (
    ["build", str(_folder(t, "m.onnx")), "--trtexec-only", "-o", str(t / "e.engine")], "m.onnx: is a folder",
    [t / "e.engine", t / "e.engine.json"]))

# an output name that gives no Triton model name (the name is the output's up to its first dot):
# it was looked up as the repository itself ("REPO exists; pass --force to replace it")
case("export-triton-name-empty")(lambda w, t: (
    ["export", str(w / "cls.onnx"), "--gamma", "0.5", "--table", str(w / "two.json"),
     "--triton-repo", str(_folder(t, "repo")), "-o", str(t / ".hidden.onnx")],
    "Triton model name '': use letters, digits", [t / ".hidden.onnx"]))

# checkpoint-only flags on ONNX input: they apply to every checkpoint family, not detectron2 alone
case("export-onnx-with-opset")(lambda w, t: (
    _export(w, t, "--gamma", "0.5", "--table", str(w / "two.json"), "--opset", "18", model="cls.onnx"),
    "--opset apply to checkpoints, not ONNX input", [t / "o.onnx"]))

# decoding flags on a checkpoint that decodes as its own post-processing: the refusal named
# --decoding, which was not given; it names the flags that were
case("export-d2-conf")(lambda w, t: (
    _export(w, t, "--config", str(w / "config.yaml"), "--gamma", "0.5", "--conf", "0.3"),
    "detectron2 checkpoints decode as their own post-processing: they take no decoding (--conf) option",
    [t / "o.onnx"]))
case("export-d2-decoding-and-conf")(lambda w, t: (
    _export(w, t, "--config", str(w / "config.yaml"), "--gamma", "0.5", "--decoding", "best-class",
            "--agnostic-nms", "--conf", "0.3"),
    "they take no --decoding option", [t / "o.onnx"]))
# --agnostic-nms alone: said with the families that take the best-class decoding, not only
# "needs the best-class decoding" (a detectron2 user would add it and be refused again)
case("export-d2-agnostic-nms")(lambda w, t: (
    _export(w, t, "--config", str(w / "config.yaml"), "--gamma", "0.5", "--agnostic-nms"),
    "--agnostic-nms needs --decoding best-class (one label per box), which only ultralytics models take",
    [t / "o.onnx"]))


def _yaml(t, name, text):
    p = t / name
    p.write_text(text)
    return p


def _folder(t, name):
    p = t / name
    p.mkdir()
    return p


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_export_is_one_line_and_writes_nothing(name, world, tmp_path, capsys, monkeypatch):  # noqa: F811
    check_hostile_case(CASES[name], world, tmp_path, capsys, monkeypatch)


def test_ultralytics_checkpoint_refuses_an_old_opset(tmp_path, monkeypatch, capsys):
    """The Ultralytics family had no opset check of its own: opset 9 reached the ONNX checker's
    traceback (no NonMaxSuppression before opset 10)."""
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "cfg"))
    from yolo_models import make_checkpoint, write_table

    pt = make_checkpoint(tmp_path / "det.pt", "yolo11n.yaml", imgsz=64)
    table, _ = write_table(tmp_path / "t.json")
    rc = _run(["export", str(pt), "--gamma", "0.5", "--table", str(table), "--opset", "9",
               "-o", str(tmp_path / "o.onnx")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "--opset must be a whole number >= 17" in err and "got 9" in err
    assert not (tmp_path / "o.onnx").exists()

