"""norcal-export on a detectron2 checkpoint, end to end through the CLI."""

import shutil

import onnx
import pytest

from conftest import TINY
from norcal.cli import export_main
from norcal.export.graph.surgery import norcal_metadata

pytestmark = pytest.mark.slow  # exports a checkpoint end to end, several times


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    out = tmp / "tiny.norcal.onnx"
    argv = [str(TINY / "model_final.pth"), "--config", str(TINY / "config.yaml"), "--gamma", "0.5",
            "-o", str(out), "--verify", str(TINY / "images" / "img0.png"), str(TINY / "images" / "img2.png"),
            "--triton-repo", str(tmp / "triton")]
    return tmp, out, argv


def test_export_verify_and_triton(exported, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    tmp, out, argv = exported
    assert export_main(argv) == 0
    text = capsys.readouterr().out
    for row in ("architecture", "R50-FPN, 1203 classes, mask head", "short edge 320, max 512",
                "gamma 0.5, factor cdt", "images: float [batch, 3, height, width]",
                "boxes: float [batch, 300, 4]", "TensorRT 10.15 parser", "compatible"):
        assert row in text, row
    assert "NOT compatible" not in text
    assert "img0.png" in text or "2 images" in text  # the --verify report names what it ran
    model = onnx.load(str(out))
    meta = norcal_metadata(model)
    assert meta["norcal.gamma"] == "0.5" and meta["norcal.table"] == "lvis_v1"
    assert meta["norcal.min_size_test"] == "320" and meta["norcal.max_size_test"] == "512"
    config = tmp / "triton" / "tiny" / "config.pbtxt"
    assert config.is_file() and (tmp / "triton" / "tiny" / "1" / "model.onnx").is_file()
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    cfg = text_format.Parse(config.read_text(), pb.ModelConfig())
    assert cfg.platform == "onnxruntime_onnx" and cfg.HasField("dynamic_batching")
    assert [i.name for i in cfg.input] == ["images", "image_sizes"]


def test_configless_export_uses_lvis_defaults(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one summary row per line
    src = tmp_path / "model_final.pth"
    shutil.copy(TINY / "model_final.pth", src)
    assert export_main([str(src), "--gamma", "1.0", "--factor", "cdt", "--classifier", "softmax"]) == 0
    out = tmp_path / "model_final.norcal.onnx"  # the default output name
    meta = norcal_metadata(onnx.load(str(out)))
    # architecture from the weights, test settings from detectron2's LVIS configs
    assert meta["norcal.num_classes"] == "1203"
    assert meta["norcal.min_size_test"] == "800" and meta["norcal.max_size_test"] == "1333"
    text = capsys.readouterr().out
    assert "short edge 800, max 1333, score > 0.0001, NMS 0.5, 300 detections" in text
    row = next(line for line in text.splitlines() if "(use_sigmoid_ce)" in line)
    assert "softmax classifier: given by the user (classifier softmax)" in row


def test_checkpoint_refuses_onnx_only_options(tmp_path, capsys):
    out = tmp_path / "o.onnx"
    rc = export_main([str(TINY / "model_final.pth"), "--gamma", "0.5", "--logits", "x", "-o", str(out)])
    assert rc == 2 and "--logits applies to ONNX input" in capsys.readouterr().err
    assert not out.exists()


def test_detections_per_image_and_static_mask_head(tmp_path, capsys, monkeypatch):
    """--detections-per-image K sets the outputs' K (the PyTorch model's too: --verify agrees);
    --mask-head-rois static is recorded and keeps the graph free of NonZero in the mask head."""
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "k50.onnx"
    assert export_main([str(TINY / "model_final.pth"), "--config", str(TINY / "config.yaml"), "--gamma", "0.5",
                        "--detections-per-image", "50", "--mask-head-rois", "static", "--batch", "1",
                        "--verify", str(TINY / "images" / "img0.png"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "50 detections" in text and "boxes: float [1, 50, 4]" in text and "NOT compatible" not in text
    model = onnx.load(str(out))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["norcal.mask_head_rois"] == "static" and meta["norcal.padding_masks"] == "false"
    assert not any(n.op_type == "NonZero" and "mask" in n.name for n in model.graph.node)


@pytest.mark.parametrize("flag, message", [
    (["--detections-per-image", "0"], "--detections-per-image"),
])
def test_bad_detections_per_image_is_refused_before_work(tmp_path, capsys, flag, message):
    out = tmp_path / "o.onnx"
    rc = export_main([str(TINY / "model_final.pth"), "--gamma", "0.5", "--classifier", "softmax", *flag, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def _authors_config(tmp_path, calibration: str | None):
    """The checkpoint's config with the NorCal authors' head name and, optionally, their keys."""
    text = (TINY / "config.yaml").read_text().replace("StandardROIHeads", "CalibrationROIHeads")
    assert "CalibrationROIHeads" in text
    if calibration:
        text += "\n" + calibration
    path = tmp_path / "norcal_authors.yaml"
    path.write_text(text)
    return path


def test_gamma_from_the_authors_config(tmp_path, capsys, monkeypatch):
    """No --gamma: the config's TEST.CALIBRATION settings are baked in, and the summary says so."""
    monkeypatch.setenv("COLUMNS", "200")
    config = _authors_config(tmp_path, "TEST:\n  CALIBRATION:\n    METHOD: cb\n    GAMMA: 0.9\n")
    out = tmp_path / "m.onnx"
    assert export_main([str(TINY / "model_final.pth"), "--config", str(config), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "taken from the config's TEST.CALIBRATION" in text and "gamma 0.9, factor ens" in text
    meta = norcal_metadata(onnx.load(str(out)))
    assert meta["norcal.gamma"] == "0.9" and meta["norcal.factor"] == "ens"


def test_no_gamma_and_no_calibration_in_config_is_refused(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert export_main([str(TINY / "model_final.pth"), "--config", str(TINY / "config.yaml"),
                        "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --gamma is required") and "TEST.CALIBRATION" in err
    assert len(err.splitlines()) == 1 and not out.exists()
