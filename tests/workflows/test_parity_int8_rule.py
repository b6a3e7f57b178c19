"""The int8 preset judges what a user sees: the share of detections paired one-to-one (same
class, IoU >= 0.5) and the median / 99th percentile of the paired scores' differences, not their
max. Hand-made outputs of the ONNX contract, so each verdict can be worked out by hand."""

import numpy as np
import pytest

from norcal.workflows.parity import PRESETS, compare, tolerances_for

N = 250  # detections in one image, 20 px apart: pairs are unambiguous


def outputs(scores, shift=0.0, k=300):
    """One image's contract outputs: N boxes on a grid (moved by ``shift`` px) with ``scores``."""
    out = {"num_detections": np.array([N]), "boxes": np.zeros((1, k, 4), np.float32),
           "scores": np.zeros((1, k), np.float32), "classes": np.zeros((1, k), np.int64)}
    for i in range(N):
        x, y = 20 * (i % 25), 20 * (i // 25)
        out["boxes"][0, i] = (x + shift, y + shift, x + 16 + shift, y + 16 + shift)
        out["scores"][0, i] = scores[i]
        out["classes"][0, i] = i % 6
    return out


@pytest.fixture
def reference():
    return np.linspace(0.9, 0.06, N).astype(np.float32)


def test_a_few_saturated_scores_and_one_lost_detection_pass(reference):
    """YOLO11 int8 as measured: 99.6% paired and two scores clipped at the int8 range's end,
    the rest within 0.005."""
    cand_scores = reference - 0.005
    cand_scores[[240, 245]] = 1.0  # saturated: ~0.9 off
    cand = outputs(cand_scores, shift=0.5)
    cand["boxes"][0, 100] += 400  # one detection lost (paired with nothing)
    rep = compare(outputs(reference), cand, "int8")
    assert rep.passed, rep.failures
    det = rep.detections
    assert det.matched == N - 1 and det.matched_fraction == pytest.approx(0.996)
    assert det.max_score_diff > 0.8 and det.median_score_diff == pytest.approx(0.005, abs=1e-6)
    assert det.p99_score_diff <= 0.06
    # the max rule this replaces fails the same outputs
    assert not compare(outputs(reference), cand, tolerances_for("int8", score_quantiles={})).passed


def test_paired_scores_off_at_the_median_fail(reference):
    rep = compare(outputs(reference), outputs(reference - 0.05), "int8")
    assert not rep.passed
    assert rep.failures == ["detections: matched scores' median difference 0.05 > 0.01"]


def test_paired_scores_off_at_the_99th_percentile_fail(reference):
    cand = reference - 0.005
    cand[::20] -= 0.04 + 0.2 * (np.arange(len(cand[::20])) % 2)  # 5% of pairs, half of them 0.21 off
    rep = compare(outputs(reference), outputs(cand), "int8")
    assert not rep.passed and rep.detections.median_score_diff < 0.01
    assert len(rep.failures) == 1 and rep.failures[0].startswith("detections: matched scores' p99 difference 0.2")


def test_too_few_paired_fail(reference):
    cand = outputs(reference)
    cand["classes"][0, :60] += 1  # 24% of detections another class: no partner
    rep = compare(outputs(reference), cand, "int8")
    assert not rep.passed and rep.detections.matched_fraction == pytest.approx(0.76)
    assert rep.failures[0].startswith("detections: 76.0% matched (IoU >= 0.5, same class), need 80%")


def test_int8_thresholds_are_stated():
    tol = PRESETS["int8"]
    assert tol.score_quantiles == {0.5: 0.01, 0.99: 0.06} and tol.min_matched == 0.8 and tol.match_iou == 0.5
    assert not tol.elementwise and PRESETS["fp32"].score_quantiles is None
