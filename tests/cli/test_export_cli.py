"""norcal-export on ONNX input: happy path, and bad input -> one line on stderr, exit 2, no file."""

import json
import subprocess
import sys

import onnx
import pytest

from norcal.cli import export_main, main
from norcal.export.graph.surgery import norcal_metadata

from conftest import TINY
from onnx_graphs import classifier_graph

TINY_PTH = TINY / "model_final.pth"


@pytest.fixture
def model_path(tmp_path):
    p = tmp_path / "det.onnx"
    onnx.save(classifier_graph(num_classes=4), str(p))
    return p


def write_table(tmp_path, counts, name="t.json"):
    cats = [{"id": i + 1, "name": f"class{i}", "image_count": c, "instance_count": 1}
            for i, c in enumerate(counts)]
    p = tmp_path / name
    p.write_text(json.dumps({"name": "toy", "categories": cats}))
    return p


def call_fails(capsys, argv, message):
    rc = export_main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert message in err, err
    return err


def test_export_writes_calibrated_model(tmp_path, model_path, capsys):
    table = write_table(tmp_path, [1, 5, 50, 500])
    assert export_main([str(model_path), "--gamma", "0.5", "--table", str(table)]) == 0
    out = tmp_path / "det.norcal.onnx"
    meta = norcal_metadata(onnx.load(str(out)))
    assert meta["norcal.gamma"] == "0.5" and meta["norcal.table"] == "toy"
    assert "ai.norcal::NorCal" in capsys.readouterr().out
    # re-run on its own output with a new gamma replaces the node
    out2 = tmp_path / "det2.onnx"
    assert export_main([str(out), "--gamma", "1.0", "--table", str(table), "-o", str(out2)]) == 0
    m2 = onnx.load(str(out2))
    assert sum(n.op_type == "NorCal" for n in m2.graph.node) == 1
    assert norcal_metadata(m2)["norcal.gamma"] == "1.0"
    out3 = tmp_path / "det3.onnx"
    assert export_main([str(out2), "--strip", "-o", str(out3)]) == 0
    # strip takes the calibration out; what runners need (the table's classes -> category ids
    # and their names, write_table's class0..class3) stays
    assert norcal_metadata(onnx.load(str(out3))) == {
        "norcal.category_ids": "[1, 2, 3, 4]", "norcal.table": "toy", "norcal.num_classes": "4",
        "norcal.class_names": '["class0", "class1", "class2", "class3"]'}


@pytest.mark.parametrize("case", ["text", "truncated", "missing"])
def test_not_onnx(tmp_path, model_path, capsys, case):
    bad = tmp_path / "bad.onnx"
    if case == "text":
        bad.write_text("this is not a model\n")
    elif case == "truncated":
        bad.write_bytes(model_path.read_bytes()[:150])
    out = tmp_path / "out.onnx"
    msg = "no such file" if case == "missing" else "not an ONNX model or truncated"
    call_fails(capsys, [bad, "--gamma", "0.5", "--table", "lvis_v1", "-o", out], msg)
    assert not out.exists()


@pytest.mark.parametrize("argv,message", [
    (["--gamma", "-0.5"], "gamma must be a finite number >= 0"),
    (["--gamma", "1.0", "--factor", "ens"], "ENS gamma must lie in [0, 1)"),
    (["--gamma", "0.5", "--table", "lvis_v1"], "the table has 1203 classes"),
])
def test_bad_settings(tmp_path, model_path, capsys, argv, message):
    out = tmp_path / "out.onnx"
    call_fails(capsys, [model_path, *argv, "-o", out], message)
    assert not out.exists()


@pytest.mark.parametrize("value,who,shown", [
    (0, "'class2'", "count 0.0"),  # a valid file; the math refuses the count, naming the class
    (-3, "categories[2] (id 3)", "image_count: must be >= 0, got -3"),  # refused at load
    ("Infinity", "categories[2] (id 3)", "image_count: expected a finite number"),
])
def test_bad_count_names_class(tmp_path, model_path, capsys, value, who, shown):
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"name": "toy", "categories": [
        {"id": i + 1, "name": f"class{i}", "image_count": v, "instance_count": 1}
        for i, v in enumerate([4, 9, 2, 1])]}).replace('"image_count": 2', f'"image_count": {value}'))
    out = tmp_path / "out.onnx"
    err = call_fails(capsys, [model_path, "--gamma", "0.5", "--table", table, "-o", out], who)
    assert shown in err
    assert not out.exists()


def test_output_equal_to_input(tmp_path, model_path, capsys):
    before = model_path.read_bytes()
    call_fails(capsys, [model_path, "--gamma", "0.5", "-o", model_path], "is the input file")
    assert model_path.read_bytes() == before
    leftovers = [p for p in tmp_path.iterdir() if p.name != model_path.name]
    assert not leftovers


def test_console_scripts_and_module(tmp_path):
    for cmd in (["norcal-export", "--help"], ["norcal", "--help"], [sys.executable, "-m", "norcal", "table", "--help"]):
        exe = cmd if cmd[0] == sys.executable else [str(__import__("pathlib").Path(sys.executable).parent / cmd[0]), *cmd[1:]]
        r = subprocess.run(exe, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "usage" in r.stdout


def test_table_show_lvis_v1(capsys):
    assert main(["table", "show", "lvis_v1", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "classes: 1203" in out
    assert "│ rare     │ 337" in out and "│ common   │ 461" in out and "│ frequent │ 405" in out


def test_missing_torch_is_one_clear_line(tmp_path):
    """Without the [torch] extra, checkpoint export says what to install (exit 2, no trace)."""
    code = ("import sys; sys.modules['torch'] = None; from norcal.cli import export_main; "
            f"raise SystemExit(export_main([{str(TINY_PTH)!r}, '--gamma', '0.5', '-o', {str(tmp_path / 'o.onnx')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: this needs the optional package 'torch': pip install 'norcal-deploy[torch]'"
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("flag", [["--batch", "2"], ["--opset", "18"], ["--config", "c.yaml"],
                                  ["--detections-per-image", "50"], ["--mask-head-rois", "static"]])
def test_checkpoint_only_options_refused_for_onnx(tmp_path, model_path, capsys, flag):
    out = tmp_path / "out.onnx"
    call_fails(capsys, [model_path, "--gamma", "0.5", "--table", write_table(tmp_path, [1, 2, 3, 4]), *flag,
                        "-o", out], f"{flag[0]} apply to checkpoints, not ONNX input")
    assert not out.exists()


def test_triton_repo_refused_before_any_work_then_forced(tmp_path, model_path, capsys):
    table = write_table(tmp_path, [1, 2, 3, 4])
    repo = tmp_path / "triton"
    args = [str(model_path), "--gamma", "0.5", "--table", str(table), "--triton-repo", str(repo)]
    assert export_main([*args, "-o", str(tmp_path / "det.norcal.onnx")]) == 0
    assert (repo / "det" / "config.pbtxt").is_file()
    capsys.readouterr()
    again = tmp_path / "again" / "det.norcal.onnx"
    call_fails(capsys, [*args, "-o", again], "pass --force to replace it")
    assert not again.exists()  # refused before exporting anything
    assert export_main([*args, "-o", str(again), "--force"]) == 0
    assert again.exists()


def test_missing_onnxruntime_names_both_builds(tmp_path):
    """ONNX Runtime is an extra (cpu or gpu build): without it, running a model says which to install."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["boxes"])], "g",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 3, 8, 8])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(model))
    from PIL import Image
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    code = ("import sys; sys.modules['onnxruntime'] = None; from norcal.cli import main; "
            f"raise SystemExit(main(['infer', {str(model)!r}, {str(tmp_path / 'a.png')!r}, "
            f"'-o', {str(tmp_path / 'r.json')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("error: this needs the optional package 'onnxruntime': pip install "
                                "'norcal-deploy[cpu]' (or 'norcal-deploy[gpu]' with CUDA)")
    assert not (tmp_path / "r.json").exists()
