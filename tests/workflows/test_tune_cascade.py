"""norcal tune on a Cascade Mask R-CNN: the cache holds every stage's logits and the last
stage's boxes; re-scoring averages the stages' calibrated probabilities, as the exported
graph's three NorCal nodes do. Checked against full ONNX Runtime runs of the export."""

import json

import numpy as np
import pytest

from conftest import FIXTURES
from golden import match_detections

pytestmark = pytest.mark.slow  # caches a Cascade model's stage outputs and sweeps gamma

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

FIXTURE = FIXTURES / "d2_cascade_tiny"
PAIRS = [(k, FIXTURE / "images" / f"img{k}.png") for k in range(3)]


@pytest.fixture(scope="module")
def detector():
    from norcal.export.detector import load_detector

    return load_detector(FIXTURE / "model_final.pth", FIXTURE / "config.yaml")


@pytest.fixture(scope="module")
def table():
    # the counts the fixture's NorCal settings used (its manifest)
    from norcal.core.tables import CalibrationTable, frequency_group

    counts = json.loads((FIXTURE / "manifest.json").read_text())["lvis_v1_image_counts"]
    cats = [{"id": i + 1, "name": f"class{i}", "image_count": n, "frequency": frequency_group(n)}
            for i, n in enumerate(counts)]
    return CalibrationTable(name=FIXTURE.name, source="manifest.json", count_type="image", categories=cats)


@pytest.fixture(scope="module")
def cache(detector):
    from norcal.workflows.tune import cache_head_outputs

    spec, model = detector
    return cache_head_outputs(model, spec, PAIRS, batch_size=2)  # a partial last batch


@pytest.fixture(scope="module")
def plain_onnx(detector):
    from norcal.export.detector import export_detector

    return export_detector(detector[1], detector[0])


def rescored(detector, cache, table, gamma, mechanism="exp", factor="cdt"):
    from norcal.core.calibration import log_prior
    from norcal.workflows.tune import rescore

    prior = None if gamma == 0 else log_prior(table.counts(), gamma, factor)
    return rescore(detector[1].roi_heads.box_predictor, cache, prior, mechanism, batch_size=2)


def onnx_detections(model, tmp_path):
    from norcal.core.onnx_io import save_onnx
    from norcal.runtime.inference import run_images
    from norcal.runtime.onnxruntime_runner import OnnxRuntimeRunner

    path = tmp_path / "model.onnx"
    save_onnx(model, path)
    return [d for _, d in run_images(OnnxRuntimeRunner(path), [p for _, p in PAIRS], 2)]


def test_cache_holds_every_stage(detector, cache):
    from norcal.workflows.tune import estimate_cache_bytes

    spec = detector[0]
    p = cache.proposals.shape[1]
    assert cache.cls_logits.shape == (3, p, 3, spec.num_classes + 1)
    assert cache.box_deltas.shape == (3, p, 4)
    assert cache.nbytes <= estimate_cache_bytes(spec, 3)


def test_cached_stage_logits_are_the_models(detector, cache):
    """img0's three stages' logits and the last stage's boxes, against detectron2's goldens."""
    from golden import box_iou, golden

    g = golden(0, FIXTURE)
    valid = cache.valid[0].numpy()
    j = box_iou(g["stage2/proposal_boxes"], cache.proposals[0].numpy()[valid]).argmax(1)
    for k in range(3):
        assert np.abs(cache.cls_logits[0, :, k].numpy()[valid][j] - g[f"stage{k}/cls_logits"]).max() <= 1e-3


@pytest.mark.parametrize("gamma, mechanism, factor", [(0.0, "exp", "cdt"), (0.5, "exp", "cdt"),
                                                      (1.0, "logit", "cdt"), (0.999, "exp", "ens")])
def test_rescoring_equals_exported_model(gamma, mechanism, factor, detector, cache, table, plain_onnx,
                                         tmp_path):
    from norcal.export.calibrate_onnx import calibrate_onnx

    model = plain_onnx if gamma == 0 else calibrate_onnx(plain_onnx, gamma, table, factor=factor,
                                                          mechanism=mechanism)
    full = onnx_detections(model, tmp_path)
    ours = rescored(detector, cache, table, gamma, mechanism, factor)
    for (image_id, _), a, b in zip(PAIRS, full, ours):
        assert len(a) > 50
        frac, _ = match_detections(a.boxes, a.scores, a.classes, b.boxes, b.scores, b.classes)
        assert frac >= 0.99, f"gamma {gamma} {mechanism} {factor} img{image_id}: {frac:.3f}"
        assert abs(len(a) - len(b)) <= max(1, len(a) // 100)


def test_rescoring_matches_detectron2(detector, cache, table):
    """At the fixture's NorCal settings the re-scored detections are detectron2's (original
    image coordinates)."""
    from golden import GAMMAS, golden

    for setting in ("baseline", "cdt_g1.0"):
        factor, gamma = GAMMAS[setting]
        for (k, _), det in zip(PAIRS, rescored(detector, cache, table, gamma, factor=factor)):
            g = golden(k, FIXTURE)
            frac, _ = match_detections(g[f"{setting}/boxes_orig"], g[f"{setting}/scores"],
                                       g[f"{setting}/classes"], det.boxes, det.scores, det.classes)
            assert frac >= 0.99, f"{setting} img{k}: {frac:.3f}"


def test_rescoring_differs_between_gammas(detector, cache, table):
    a = rescored(detector, cache, table, 0.0)[0]
    b = rescored(detector, cache, table, 1.0)[0]
    frac, _ = match_detections(a.boxes, a.scores, a.classes, b.boxes, b.scores, b.classes)
    assert frac < 0.9
