"""Deployment metrics (precision / recall at a score threshold) by hand and against pycocotools'
per-image matching."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from norcal.core.errors import NorcalError
from norcal.evaluation import evaluate, prepare_gt
from norcal.evaluation.deployment import deployment_metrics
from test_coco_rules import _two_boxes, coco_gt, coco_results, pycocotools_eval


def _rows(gt, res, thresh, **kw):
    return deployment_metrics(evaluate(gt, res, **kw), thresh).rows


def test_two_boxes_by_hand():
    gt, res = _two_boxes(federated=False)
    for c, f in zip(gt["categories"], "rf"):
        c["frequency"] = f
    # a crowd A on image 1, found by an A at 0.8: neither a hit nor a miss
    gt["annotations"].append({"id": 3, "image_id": 1, "category_id": 1, "bbox": [60, 60, 30, 30],
                              "area": 900, "iscrowd": 1})
    res = res + [{"image_id": 1, "category_id": 1, "bbox": [61, 61, 30, 30], "score": 0.8}]
    # COCO, T 0.5: A hit (0.9), B hit (0.9), the false B (0.95); 2 GTs not crowd
    rows = _rows(gt, res, 0.5)
    assert rows["all"] == {"tp": 2, "fp": 1, "num_gt": 2, "precision": 2 / 3, "recall": 1.0}
    assert rows["r"] == {"tp": 1, "fp": 0, "num_gt": 1, "precision": 1.0, "recall": 1.0}
    assert rows["f"] == {"tp": 1, "fp": 1, "num_gt": 1, "precision": 0.5, "recall": 1.0}
    assert rows["c"] == {"tp": 0, "fp": 0, "num_gt": 0, "precision": -1.0, "recall": -1.0}
    # T 0.92: only the false B
    assert _rows(gt, res, 0.92)["all"] == {"tp": 0, "fp": 1, "num_gt": 2, "precision": 0.0, "recall": 0.0}
    # federated: B is neither annotated nor negative on image 1, so the false B does not count
    fed, _ = _two_boxes(federated=True)
    fed["images"][0]["not_exhaustive_category_ids"] = [1]
    extra = res[:3] + [{"image_id": 1, "category_id": 1, "bbox": [70, 5, 20, 20], "score": 0.7}]
    rows = _rows(fed, extra, 0.5)  # the unmatched A on a not-exhaustive image is ignored
    assert rows["all"] == {"tp": 2, "fp": 0, "num_gt": 2, "precision": 1.0, "recall": 1.0}
    assert "r" not in rows  # no frequency groups
    assert _rows(fed, extra, 0.92)["all"]["precision"] == -1.0


@pytest.mark.parametrize("thresh", [0.3, 0.7])
@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_coco_rules_equal_pycocotools_per_image_matches(iou_type, thresh):
    gt = coco_gt()
    res = coco_results(coco_gt(rle=False), seed=4, segm=iou_type == "segm")
    rows = _rows(prepare_gt(gt), copy.deepcopy(res), thresh, iou_type=iou_type)
    e = pycocotools_eval(gt, res, iou_type)
    freq = {c["id"]: c["frequency"] for c in gt["categories"]}
    want = {g: np.zeros(3, dtype=np.int64) for g in ("all", "r", "c", "f")}
    for ev in e.evalImgs:
        if ev is None or ev["aRng"] != e.params.areaRng[0] or ev["maxDet"] != 100:
            continue
        over = np.asarray(ev["dtScores"]) >= thresh
        hit = np.asarray(ev["dtMatches"][0]) > 0  # IoU 0.50
        ign = np.asarray(ev["dtIgnore"][0], dtype=bool)
        counts = np.array([(over & hit & ~ign).sum(), (over & ~hit & ~ign).sum(),
                           (~np.asarray(ev["gtIgnore"], dtype=bool)).sum()])
        want["all"] += counts
        want[freq[ev["category_id"]]] += counts
    assert want["all"][0] > 10 and want["all"][1] > 10  # hits and false positives both
    for g, (tp, fp, n) in want.items():
        assert (rows[g]["tp"], rows[g]["fp"], rows[g]["num_gt"]) == (tp, fp, n), g
        assert rows[g]["precision"] == tp / (tp + fp) and rows[g]["recall"] == tp / n


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.1, 1.0, 1.5])
def test_threshold_must_lie_in_0_1(value):
    gt, res = _two_boxes(federated=False)
    with pytest.raises(NorcalError, match=r"^score_thresh must be a number in \[0, 1\), got ") as e:
        deployment_metrics(evaluate(gt, res), value)
    assert e.value.param == "score_thresh"
