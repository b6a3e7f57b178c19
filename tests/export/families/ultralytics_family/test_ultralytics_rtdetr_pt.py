"""RT-DETR checkpoints (``.pt``) through the Ultralytics family, against Ultralytics itself.

The checkpoint is the tiny RT-DETR of tests/yolo_models.py saved by Ultralytics' own
``RTDETR.save``. The reference is Ultralytics alone, as in tests/export/families/ultralytics_family/test_ultralytics_rtdetr.py
(whose ``reference`` / ``matched`` this reuses): its LetterBox(scale_fill) input, its model's
forward, its decoder's top K and its predictor's conf filter, NorCal applied by hand to its class
logits. Ours: the family's export of the file, calibrated, in ONNX Runtime on our host's batches.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from yolo_models import IMAGES, NUM_CLASSES, RTDETR_IMGSZ  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

import torch  # noqa: E402

from norcal.core import contract  # noqa: E402
from norcal.core.errors import NorcalError  # noqa: E402
from norcal.export.families import family_of, load_detector  # noqa: E402
from norcal.export.families.ultralytics.family import UltralyticsFamily  # noqa: E402
from norcal.export.families.ultralytics.rtdetr import RtdetrDetector  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from test_ultralytics_rtdetr import matched, reference, ultralytics_forward  # noqa: E402

S = RTDETR_IMGSZ
CONF = 0.04  # Ultralytics' conf for the comparison: at gamma 0.5 it cuts the top 300


def _load_rtdetr_pt(path):
    """The model as Ultralytics would run it from our test file (unpickled in full: ours)."""
    return torch.load(path, weights_only=False)["model"].float().eval()


# --- loading -------------------------------------------------------------------------------

@pytest.mark.slow
def test_rtdetr_checkpoints_load_and_are_claimed(yolo_work, tmp_path):
    """model.save() of rtdetr-l.yaml and of the tiny model, and a trainer's last.pt, load as
    RT-DETR detectors with the file's classes and trained size."""
    from ultralytics import RTDETR
    from ultralytics.utils import DEFAULT_CFG_DICT, IterableSimpleNamespace

    large = tmp_path / "rtdetr-l.pt"
    RTDETR("rtdetr-l.yaml").save(str(large))  # built offline, 80 classes, as Ultralytics writes it
    model = _load_rtdetr_pt(yolo_work.rtdetr)
    model.names = {0: "a", 1: "b", 2: "c", 3: "d", 4: "e", 5: "f"}
    model.args = IterableSimpleNamespace(**{**DEFAULT_CFG_DICT, "imgsz": 160})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    trainer = tmp_path / "last.pt"
    torch.save({"epoch": 3, "best_fitness": np.float64(0.25), "model": None, "ema": model.half(), "updates": 7,
                "optimizer": opt.state_dict(), "train_args": {**DEFAULT_CFG_DICT, "imgsz": 160},
                "train_metrics": {"metrics/mAP50(B)": np.float64(0.1), "fitness": np.float32(0.2)},
                "date": "2026-01-01", "version": "8.4.190", "license": "AGPL-3.0", "docs": "x"}, trainer)
    for path, nc, size, names in ((yolo_work.rtdetr, NUM_CLASSES, S, [f"class{i}" for i in range(NUM_CLASSES)]),
                                  (large, 80, 640, None), (trainer, NUM_CLASSES, 160, list("abcdef"))):
        assert isinstance(family_of(path), UltralyticsFamily)
        det = load_detector(path)
        assert isinstance(det, RtdetrDetector) and det.num_classes == nc and det.num_queries == 300
        assert names is None or det.names == names
        assert det.classifier.background == "none" and det.classifier.activation == "sigmoid"
        assert det.preprocessing.resize == contract.RESIZE_STRETCH and det.preprocessing.input_size == size
        assert (det.topk, det.score_thresh) == (300, 0.001)  # Ultralytics' max_det and validation conf
    with pytest.raises(NorcalError, match="nms_thresh does not apply"):
        load_detector(yolo_work.rtdetr, nms_thresh=0.5)
    with pytest.raises(NorcalError, match=r"detections_per_image must be in 1\.\.1800 \(queries x classes\)"):
        load_detector(yolo_work.rtdetr, detections_per_image=1801)


# --- parity through the .pt ----------------------------------------------------------------

@pytest.mark.slow
def test_rtdetr_pt_onnx_matches_ultralytics_with_norcal(yolo_work):
    import onnxruntime as ort
    from ultralytics.data.augment import LetterBox

    from norcal.runtime.inference import prepare
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    det = load_detector(yolo_work.rtdetr, score_thresh=CONF)
    plain = det.export(None)
    model = _load_rtdetr_pt(yolo_work.rtdetr)
    images = [read_rgb(p) for p in IMAGES]
    assert len(images) == 4 and len({im.shape for im in images}) == 4
    # Ultralytics' own pre-processing (the RT-DETR predictor's), RGB 0-255
    theirs = np.stack([LetterBox((S, S), auto=False, scale_fill=True)(image=im.copy()) for im in images])
    forward = ultralytics_forward(model, theirs.transpose(0, 3, 1, 2).astype(np.float32))
    for gamma in (0.0, 0.5):
        graph = calibrate_onnx(plain, NorCal(gamma=gamma, table=str(yolo_work.table)))
        meta = {p.key: p.value for p in graph.metadata_props}
        assert meta[contract.RESIZE] == "stretch" and meta[contract.INPUT_SIZE] == str(S)
        sess = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        spec = contract.input_spec(meta)
        batch = prepare(images, spec)
        np.testing.assert_array_equal(batch.images, theirs.transpose(0, 3, 1, 2))  # the same input
        out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, batch.feeds())))
        ref = reference(model, forward, gamma, counts=yolo_work.counts, imgsz=S, conf=CONF)
        hits = total = 0
        for b in range(len(images)):
            n = int(out["num_detections"][b])
            assert n == len(ref[b]) > 0, (gamma, b, n, len(ref[b]))
            hits += matched(ref[b], out["boxes"][b, :n], out["scores"][b, :n], out["classes"][b, :n])
            total += len(ref[b])
        assert hits >= 0.99 * total, (gamma, hits, total)
        # a batch of two images of different sizes equals each image alone
        both = sess.run(None, prepare(images[1:3], spec).feeds())
        for b in range(2):
            alone = sess.run(None, prepare(images[1 + b:2 + b], spec).feeds())
            for x, y in zip(both, alone):
                np.testing.assert_allclose(x[b], y[0], rtol=0, atol=2e-4)
    assert hits < 4 * 300  # the conf cut took part


# --- the CLI -------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_export_verify_infer_check_parity_rtdetr(yolo_work, tmp_path):
    from norcal.cli import export_main, main

    best, out = tmp_path / "best.pt", tmp_path / "best.norcal.onnx"
    best.write_bytes(yolo_work.rtdetr.read_bytes())
    # verify: the family's PyTorch runner against ONNX Runtime on the stretched images
    assert export_main([str(best), "--gamma", "0.5", "--table", str(yolo_work.table), "-o", str(out),
                        "--verify", *map(str, IMAGES)]) == 0
    results = tmp_path / "results.json"
    assert main(["infer", str(out), *map(str, IMAGES), "-o", str(results)]) == 0
    rows = json.loads(results.read_text())
    assert rows and {r["category_id"] for r in rows} <= set(range(1, NUM_CLASSES + 1))
    assert main(["check", str(out)]) == 0
    report = tmp_path / "parity.json"
    assert main(["parity", str(out), *map(str, IMAGES), "--checkpoint", str(best), "--batch", "2",
                 "--json", str(report)]) == 0
    text = json.dumps(json.loads(report.read_text()))
    assert '"fp32"' in text and '"passed": true' in text and '"passed": false' not in text
    # a size it cannot take is refused in one line, nothing written
    bad = tmp_path / "bad.onnx"
    assert export_main([str(best), "--gamma", "0", "--table", str(yolo_work.table), "--height", "100",
                        "--width", "100", "-o", str(bad)]) == 2
    assert not bad.exists()
