"""Hostile use of quantize / check / build: refusals in one line, exit 2, nothing written."""

import onnx
import pytest

from norcal.cli import main
from onnx_graphs import classifier_graph


def _one_line_exit_2(argv, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "400")
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_check_refuses_a_profile_given_twice_for_one_input(tmp_path, capsys, monkeypatch):
    # two different profiles for x: which one holds is a guess, so refuse
    onnx.save(classifier_graph(), str(tmp_path / "cls.onnx"))
    err = _one_line_exit_2(["check", str(tmp_path / "cls.onnx"), "--profile", "x:1x8:2x8:4x8",
                            "--profile", "x:1x8:8x8:16x8"], capsys, monkeypatch)
    assert "'x'" in err and "--profile" in err and "twice" in err


def _zip_checkpoint(path):
    # torch.save's container is a zip archive; any zip has the same first bytes
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    return path


def _pickle_checkpoint(path):
    import pickle

    path.write_bytes(pickle.dumps({"model": {}}, protocol=2))
    return path


@pytest.mark.parametrize("name", ["model_final.pth", "model.pt"])
def test_build_on_a_checkpoint_says_to_export_it_first(name, tmp_path, capsys, monkeypatch):
    ckpt = _zip_checkpoint(tmp_path / name)
    err = _one_line_exit_2(["build", str(ckpt), "--trtexec-only", "-o", str(tmp_path / "e.engine")],
                           capsys, monkeypatch)
    assert "PyTorch checkpoint" in err and "norcal export" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("make, what", [(_zip_checkpoint, "torch.save zip"), (_pickle_checkpoint, "pickle")])
@pytest.mark.parametrize("cmd", ["check", "quantize-fp16", "export"])
def test_a_checkpoint_without_suffix_is_named_as_one(make, what, cmd, tmp_path, capsys, monkeypatch):
    ckpt = make(tmp_path / "model_final")
    argv = {"check": ["check", str(ckpt)],
            "quantize-fp16": ["quantize", str(ckpt), "--precision", "fp16", "-o", str(tmp_path / "q.onnx")],
            "export": ["export", str(ckpt), "--gamma", "0.5", "-o", str(tmp_path / "x.onnx")]}[cmd]
    err = _one_line_exit_2(argv, capsys, monkeypatch)
    assert what in err and "suffix" in err and "truncated" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_final"]


@pytest.mark.parametrize("h, w", [(96, None), (None, 96)])
@pytest.mark.parametrize("family", ["yolo", "rtdetr"])
def test_a_square_input_given_one_side_names_the_missing_side(family, h, w):
    # a YOLO letterbox / RT-DETR stretch input is square: one side alone is refused, and the
    # message says which side is missing instead of "got 96 and None"
    from types import SimpleNamespace

    from norcal.core.errors import NorcalError
    from norcal.export.families.ultralytics.yolo import YoloDetector
    from norcal.export.families.ultralytics.rtdetr import RtdetrDetector

    options = SimpleNamespace(height=h, width=w, batch=None)
    with pytest.raises(NorcalError) as e:
        if family == "yolo":
            YoloDetector._input_size(SimpleNamespace(imgsz=64, stride=32), options)
        else:
            RtdetrDetector.export_options(SimpleNamespace(), options)
    missing = "width" if w is None else "height"
    assert "None" not in str(e.value) and f"no {missing}" in str(e.value), str(e.value)
    assert set(e.value.params) == {"height", "width"}


def _two_input_graph(path):
    # images [batch,3,H,W] and image_sizes [batch,2] share the symbolic dim "batch"
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["images"], ["s"], keepdims=0),
         helper.make_node("Identity", ["image_sizes"], ["sizes_out"])], "two",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "h", "w"]),
         helper.make_tensor_value_info("image_sizes", TensorProto.INT64, ["batch", 2])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("sizes_out", TensorProto.INT64, ["batch", 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_check_refuses_given_profiles_that_disagree_on_a_shared_dim(tmp_path, capsys, monkeypatch):
    model = _two_input_graph(tmp_path / "m.onnx")
    err = _one_line_exit_2(["check", str(model), "--profile", "images:1x3x32x32:2x3x64x64:4x3x64x64",
                            "--profile", "image_sizes:1x2:1x2:1x2"], capsys, monkeypatch)
    assert "'batch'" in err and "images" in err and "image_sizes" in err and "--profile" in err, err


def test_a_default_profile_takes_the_given_range_of_a_shared_dim(tmp_path):
    # only images is given (batch 1:2:4): image_sizes' default must follow (1:2:4), not keep
    # the default 1:4:8 that TensorRT would refuse next to it
    from norcal.core.profiles import make_profile
    from norcal.export.trt_check import check_model

    model = _two_input_graph(tmp_path / "m.onnx")
    report = check_model(str(model), [make_profile("images", (1, 3, 32, 32), (2, 3, 64, 64), (4, 3, 64, 64))])
    p = report.profiles["image_sizes"]
    assert (p.min, p.opt, p.max) == ((1, 2), (2, 2), (4, 2))


def test_int8_mask_head_on_a_model_without_masks_is_refused(tmp_path, capsys, monkeypatch):
    # the flag would do nothing: say so rather than write a model the user thinks has int8 masks
    import numpy as np
    from PIL import Image

    from norcal.core import contract

    model = classifier_graph()
    onnx.helper.set_model_props(model, {contract.MIN_SIZE_TEST: "32", contract.MAX_SIZE_TEST: "64",
                                        contract.CLASSIFIER_LOGITS: "logits0"})
    onnx.save(model, str(tmp_path / "det.onnx"))
    (tmp_path / "cal").mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "cal" / "a.png")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    err = _one_line_exit_2(["quantize", str(tmp_path / "det.onnx"), "--images", str(tmp_path / "cal"),
                            "--int8-mask-head", "-o", str(tmp_path / "q.onnx")], capsys, monkeypatch)
    assert "--int8-mask-head" in err and "masks" in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("text", ["x:1x8:8x8:4x8", "x:1x8:2x8:4x8x1"])
def test_check_names_the_profile_flag_for_an_inconsistent_profile(text, tmp_path, capsys, monkeypatch):
    onnx.save(classifier_graph(), str(tmp_path / "cls.onnx"))
    err = _one_line_exit_2(["check", str(tmp_path / "cls.onnx"), "--profile", text], capsys, monkeypatch)
    assert f"--profile {text!r}" in err, err


@pytest.mark.parametrize("name", ["model_final.pth", "model_final"])
def test_infer_on_a_checkpoint_says_to_export_it_first(name, tmp_path, capsys, monkeypatch):
    import numpy as np
    from PIL import Image

    ckpt = _zip_checkpoint(tmp_path / name)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    err = _one_line_exit_2(["infer", str(ckpt), str(tmp_path / "a.png"), "-o", str(tmp_path / "r.json")],
                           capsys, monkeypatch)
    assert "PyTorch checkpoint" in err and "norcal export" in err, err
    assert not (tmp_path / "r.json").exists()


def test_simulate_names_the_gammas_flag_for_a_negative_gamma(capsys, monkeypatch):
    err = _one_line_exit_2(["simulate", "--gammas", "0,-1", "--images", "1", "--train-images", "1"],
                           capsys, monkeypatch)
    assert "--gammas" in err and "-1" in err, err


def test_tune_names_the_gammas_flag_for_a_gamma_the_factor_refuses(tmp_path, capsys, monkeypatch):
    # ENS needs gamma < 1 (a_c = (1 - gamma^N) / (1 - gamma)); refused before any work
    ckpt = _zip_checkpoint(tmp_path / "m.pth")
    (tmp_path / "gt.json").write_text("{}")
    (tmp_path / "im").mkdir()
    err = _one_line_exit_2(["tune", str(ckpt), "--gt", str(tmp_path / "gt.json"), "--images", str(tmp_path / "im"),
                            "--factor", "ens", "--gammas", "0,1"], capsys, monkeypatch)
    assert "--gammas '0,1'" in err and "ENS" in err, err
