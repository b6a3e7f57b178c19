"""The export summary's rows about the model: each family's ``Detector.describe``, printed by
``norcal export``; the values are the checkpoint's config (detectron2) or Ultralytics' documented
defaults (conf 0.001 for validation, NMS IoU 0.7, max_det 300), written out by hand, and what the
exported graph's ``norcal.detector`` records."""

import json

import onnx
import pytest

from conftest import TINY
from norcal.cli import export_main
from norcal.core import contract
from norcal.core.decoding import Decoding
from norcal.export.families import load_detector


def summary_rows(text: str) -> dict[str, str]:
    """The summary table's rows (label -> value), from rich's box-drawn lines."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_detectron2_rows_are_its_config():
    """d2_lvis_tiny's config.yaml: GeneralizedRCNN, R-50 FPN, 1203 LVIS classes, masks;
    MIN_SIZE_TEST 320, MAX_SIZE_TEST 512, SCORE_THRESH_TEST 0.0001, NMS 0.5, 300 per image."""
    det = load_detector(TINY / "model_final.pth", TINY / "config.yaml")
    rows = det.describe()
    assert rows[:2] == [("architecture", "GeneralizedRCNN R50-FPN, 1203 classes, mask head"),
                        ("test settings", "short edge 320, max 512, score > 0.0001, NMS 0.5, 300 detections")]
    # then where the values came from, one "(key)" row each
    assert dict(rows)["(source)"] == f"config {TINY / 'config.yaml'}"
    assert all(label.startswith("(") for label, _ in rows[2:])


def test_rtdetr_rows(yolo_work):
    """tests/yolo_models.py's RT-DETR: 300 queries, the table's 6 classes, trained at 128;
    Ultralytics' validation conf 0.001 and max_det 300; no NMS."""
    det = load_detector(yolo_work.rtdetr, decoding=Decoding("best-class", conf=0.3))
    assert det.describe() == [("architecture", "RT-DETR (300 queries), 6 classes, box head"),
                              ("input rule", "RGB stretched to 128 x 128"),
                              ("decoding", "best-class, no NMS, conf > 0.3, max_det 300")]


def test_end_to_end_yolo_rows(yolo_work):
    """YOLO26 with its one-to-one head selected: a top-k, no NMS (Ultralytics' end2end predict)."""
    det = load_detector(yolo_work.y26e2e)
    rows = dict(det.describe())
    assert rows["architecture"] == "YOLO detect end-to-end (one-to-one) (stride 32), 6 classes, box head"
    assert rows["decoding"] == "one-to-one top-k, no NMS, conf > 0.001, max_det 300"


@pytest.mark.parametrize("flags, decoding", [
    pytest.param([], "multi-label NMS IoU 0.7, conf > 0.001, max_det 300", marks=pytest.mark.slow),
    (["--decoding", "best-class", "--agnostic-nms", "--conf", "0.25", "--height", "64", "--width", "64"],
     "best-class, class-agnostic NMS IoU 0.7, conf > 0.25, max_det 300")])
def test_yolo_export_summary_shows_what_it_baked_in(yolo_work, tmp_path, capsys, monkeypatch, flags, decoding):
    monkeypatch.setenv("COLUMNS", "200")  # one summary row per line
    out = tmp_path / "det.norcal.onnx"
    assert export_main([str(yolo_work.det), "--gamma", "0.5", "--table", str(yolo_work.table), "-o", str(out),
                        *flags]) == 0
    rows = summary_rows(capsys.readouterr().out)
    size = 64 if flags else 96  # the export's letterbox square: --height = --width, else the trained imgsz
    assert rows["architecture"] == "YOLO detect (stride 32), 6 classes, box head"
    assert rows["input rule"] == f"RGB letterboxed to {size} x {size} (padding 114)"
    assert rows["decoding"] == decoding
    # the graph records the same (what infer, parity and tune read back)
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    settings = json.loads(meta[contract.DETECTOR])
    assert f"NMS IoU {settings['nms_thresh_test']:g}" in decoding
    assert f"conf > {settings['score_thresh_test']:g}" in decoding
    assert f"max_det {settings['detections_per_image']}" in decoding
    assert settings["input_size"] == size
    assert settings.get("decoding", "multi-label") == decoding.split(",")[0].split(" ")[0]
