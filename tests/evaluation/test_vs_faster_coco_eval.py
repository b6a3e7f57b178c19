"""Our LVIS box and mask AP against a second independent implementation: faster-coco-eval's
LVIS-style COCOeval_faster (C++ matching; federated rules: neg_category_ids,
not_exhaustive_category_ids, frequency groups).

faster-coco-eval departs from lvis-api (our reference in test_evaluation.py) on two things the
synthetic GT there tests on purpose: it takes a GT's ignore flag from iscrowd alone, and it
treats a zero `area` differently; the synthetic case here leaves those two out."""

from __future__ import annotations

import copy
import json

import pytest
from faster_coco_eval import COCO, COCOeval_faster

from norcal.evaluation import evaluate
from test_evaluation import FIXTURE, make_results, synthetic_gt

# measured: largest difference 6.1e-16 over the nine stats of the four cases here (3.7e-16 in
# test_boundary.py): float summation order. Bound 1e-12: 1600x margin for other summation
# orders, far below what one detection matched differently moves (1e-5 and more)
TOL = 1e-12
# our stat -> faster-coco-eval's name for it
STATS = {"AP": "AP_all", "AP50": "AP_50", "AP75": "AP_75", "APs": "AP_small", "APm": "AP_medium",
         "APl": "AP_large", "APr": "APr", "APc": "APc", "APf": "APf"}


def faster_coco_eval(gt: dict, results: list[dict], iou_type: str) -> dict[str, float]:
    coco_gt = COCO(copy.deepcopy(gt))
    e = COCOeval_faster(coco_gt, coco_gt.loadRes(copy.deepcopy(results)), iou_type, lvis_style=True,
                        print_function=lambda *_: None)
    e.params.maxDets = [300]  # LVIS: 300 detections per image
    e.run()
    return e.stats_as_dict


def _federated_gt() -> dict:
    gt = synthetic_gt(seed=3)
    assert any(im["not_exhaustive_category_ids"] for im in gt["images"])
    for a in gt["annotations"]:
        a.pop("ignore", None)
        if a["area"] == 0:
            a["area"] = 0.8 * a["bbox"][2] * a["bbox"][3]  # as synthetic_gt's other annotations
    return gt


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("case", ["example", "federated"])
def test_ap_matches_faster_coco_eval(case, iou_type):
    if case == "example":  # the bundled example's validation GT, detections near it
        gt, seed = json.loads(FIXTURE.read_text()), 1
    else:
        gt, seed = _federated_gt(), 4
    assert len({im["id"] for im in gt["images"]}) <= 64  # a small case
    results = make_results(gt, seed=seed, segm=iou_type == "segm")
    ours = evaluate(copy.deepcopy(gt), copy.deepcopy(results), iou_type).stats
    theirs = faster_coco_eval(gt, results, iou_type)
    assert ours["AP"] > 0.05 and ours["APr"] > 0  # a meaningful case, not all zeros
    assert_same_stats(ours, theirs, STATS)


def assert_same_stats(ours: dict, theirs: dict, names: dict[str, str]) -> None:
    """The largest difference over the stats `names` maps (ours -> theirs) is within TOL."""
    diffs = {k: abs(ours[k] - theirs[name]) for k, name in names.items()}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= TOL, (worst, ours[worst], theirs[names[worst]], diffs[worst])
