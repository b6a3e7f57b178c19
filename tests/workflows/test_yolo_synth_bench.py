"""bench/train_yolo_synth.py's conversion to Ultralytics' layout and bench/measure_yolo_synth.py's
hand-made NorCal (the independent path the README's YOLO numbers come from)."""

import importlib.util
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

# Ultralytics reads these at import: no download, no settings file in $HOME
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="yolo_cfg_"))

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_write_split_labels_by_sorted_category_id(tmp_path):
    train = _load("train_yolo_synth")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.png").write_bytes(b"png")
    (src / "b.png").write_bytes(b"png")
    coco = {"images": [{"id": 7, "file_name": "a.png", "width": 200, "height": 100},
                       {"id": 8, "file_name": "b.png", "width": 200, "height": 100}],
            "annotations": [{"id": 1, "image_id": 7, "category_id": 30, "bbox": [10, 20, 50, 40]},
                            {"id": 2, "image_id": 7, "category_id": 5, "bbox": [0, 0, 200, 100]},
                            {"id": 3, "image_id": 7, "category_id": 5, "bbox": [3, 3, 0, 9]}]}  # no width: dropped
    n = train.write_split(coco, src, tmp_path / "y", "train", [5, 12, 30])
    assert n == 2
    lines = (tmp_path / "y" / "labels" / "train" / "a.txt").read_text().split("\n")
    # category 30 is the 3rd sorted id -> class 2; centre (35, 40) / (200, 100), size (50, 40) / (200, 100)
    assert lines[0].split() == ["2", "0.175000", "0.400000", "0.250000", "0.400000"]
    assert lines[1].split() == ["0", "0.500000", "0.500000", "1.000000", "1.000000"]
    assert lines[2] == ""
    assert (tmp_path / "y" / "labels" / "train" / "b.txt").read_text() == "\n"  # a background image
    assert (tmp_path / "y" / "images" / "train" / "b.png").read_bytes() == b"png"


def test_gamma_grid_includes_stop():
    measure = _load("measure_yolo_synth")
    assert measure.gamma_grid("0:1.5:0.5") == [0.0, 0.5, 1.0, 1.5]
    assert measure.gamma_grid("0,0.3") == [0.0, 0.3]


def test_hand_norcal_scores_are_sigmoid_of_shifted_logits(tmp_path):
    """The bias shift gives, for every anchor and class, sigmoid(logit - gamma log N_c), with the
    logit recovered from the unshifted model's score (a tiny model, 3 classes)."""
    import torch
    from ultralytics import YOLO
    from ultralytics.nn.tasks import DetectionModel

    measure = _load("measure_yolo_synth")
    torch.manual_seed(0)
    net = DetectionModel("yolov8n.yaml", nc=3, verbose=False)
    torch.save({"model": net, "train_args": {}}, tmp_path / "m.pt")
    counts = np.array([1.0, 20.0, 400.0])
    hand = measure.HandNorcal(tmp_path / "m.pt", np.log(counts), 64)
    img = tmp_path / "x.png"
    from PIL import Image
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(img)
    hand.detect([img], 0.0)  # builds the predictor, gamma 0

    net_run = hand.yolo.predictor.model.model
    x = torch.from_numpy(np.random.default_rng(1).random((1, 3, 64, 64), dtype=np.float32))
    with torch.no_grad():
        p0 = net_run(x)[0][:, 4:].double()
    gamma = 0.7
    hand._set_gamma(gamma)
    with torch.no_grad():
        p1 = net_run(x)[0][:, 4:].double()
    logit0 = torch.log(p0) - torch.log1p(-p0)
    want = torch.sigmoid(logit0 - gamma * torch.log(torch.tensor(counts)).view(1, 3, 1))
    assert torch.allclose(p1, want, rtol=1e-4, atol=1e-7)
    assert torch.equal(p1[:, 0], p0[:, 0])  # N_c = 1: log N_c = 0, untouched
    hand._set_gamma(0.0)  # back to the trained biases exactly
    with torch.no_grad():
        assert torch.equal(net_run(x)[0][:, 4:].double(), p0)
