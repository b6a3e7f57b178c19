"""COCO rules (exhaustive labels) against pycocotools' COCOeval and faster-coco-eval's COCO mode,
and the choice of rules from the ground truth."""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
import pytest

from norcal.core.errors import NorcalError
from norcal.evaluation import evaluate, evaluate_fixed, prepare_gt
from test_evaluation import make_results, synthetic_gt

# measured: largest difference 8.9e-16 over every stat and array entry of the cases here
# (float summation order); one detection matched differently moves AP by 1e-4 and more
TOL = 1e-12
# COCOeval.stats[i] -> our stat
COCO_STATS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR", "ARs", "ARm", "ARl")
# our stat -> faster-coco-eval's name for it (its AR@1, @10, @100 are AR_all, _second, _third;
# its AR_50 / AR_75 we do not report)
FASTER = {"AP": "AP_all", "AP50": "AP_50", "AP75": "AP_75", "APs": "AP_small", "APm": "AP_medium",
          "APl": "AP_large", "AR1": "AR_all", "AR10": "AR_second", "AR": "AR_third", "ARs": "AR_small",
          "ARm": "AR_medium", "ARl": "AR_large"}


def coco_gt(seed: int = 3, zero_area: bool = True, rle: bool = True) -> dict:
    """synthetic_gt without the federated lists, with crowd GTs (one an uncompressed RLE), an
    `ignore` flag COCOeval must not read, and an area-0 GT COCOeval keeps (zero_area)."""
    gt = synthetic_gt(seed)
    for im in gt["images"]:
        del im["neg_category_ids"], im["not_exhaustive_category_ids"]
    anns = gt["annotations"]
    assert anns[3].get("ignore") == 1
    for i in (1, 9, 16, 30):
        anns[i]["iscrowd"] = 1
    import pycocotools.mask as mask_utils

    a = anns[16]
    if not rle:  # make_results reads polygons
        return gt
    im = next(im for im in gt["images"] if im["id"] == a["image_id"])
    m = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(a["segmentation"], im["height"], im["width"])))
    flat = m.ravel(order="F")
    change = np.flatnonzero(np.diff(np.r_[0, flat, 1 - flat[-1]]))
    a["segmentation"] = {"size": [im["height"], im["width"]], "counts": np.diff(np.r_[0, change]).tolist()}
    if not zero_area:
        anns[7]["area"] = 0.8 * anns[7]["bbox"][2] * anns[7]["bbox"][3]
    return gt


def coco_results(gt: dict, seed: int, segm: bool) -> list[dict]:
    """make_results plus 130 detections of one class on one image (over COCOeval's 100)."""
    res = make_results(gt, seed=seed, segm=segm, ties=True)
    rng = np.random.default_rng(seed)
    a = gt["annotations"][5]
    near = [d for d in res if d["image_id"] == a["image_id"] and d["category_id"] == a["category_id"]]
    for k in range(130):
        d = copy.deepcopy(near[k % len(near)] if near else res[0])
        d.update(image_id=a["image_id"], category_id=a["category_id"], score=float(rng.random()))
        d["bbox"] = [v + rng.normal() * 2 for v in a["bbox"][:2]] + list(a["bbox"][2:])
        res.append(d)
    return res


def pycocotools_eval(gt: dict, results: list[dict], iou_type: str, max_dets=(1, 10, 100)):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        g = COCO()
        g.dataset = copy.deepcopy(gt)
        g.createIndex()
        e = COCOeval(g, g.loadRes(copy.deepcopy(results)), iou_type)
        e.params.maxDets = list(max_dets)
        e.evaluate()
        e.accumulate()
        if len(max_dets) == 3:
            e.summarize()
    return e


@pytest.fixture(scope="module", params=["bbox", "segm"])
def case(request):
    gt = coco_gt()
    res = coco_results(coco_gt(rle=False), seed=4, segm=request.param == "segm")
    return request.param, gt, res, prepare_gt(gt)


def test_coco_rules_equal_pycocotools(case):
    iou_type, gt, res, prepared = case
    ours = evaluate(prepared, copy.deepcopy(res), iou_type)
    assert ours.rules == "coco" and ours.max_dets == -1
    e = pycocotools_eval(gt, res, iou_type)
    assert ours.stats["AP"] > 0.05 and ours.stats["AR1"] < ours.stats["AR10"] < ours.stats["AR"]
    for i, key in enumerate(COCO_STATS):
        assert abs(ours.stats[key] - e.stats[i]) <= TOL, (key, ours.stats[key], e.stats[i])
    np.testing.assert_allclose(ours.precision, e.eval["precision"][..., -1], rtol=0, atol=TOL)
    np.testing.assert_allclose(ours.recall, e.eval["recall"][..., -1], rtol=0, atol=TOL)


def test_case_exercises_every_rule(case):
    """Without crowds, or with the federated lists, the numbers move: the case tests them."""
    iou_type, gt, res, prepared = case
    ours = evaluate(prepared, copy.deepcopy(res), iou_type).stats["AP"]
    plain = copy.deepcopy(gt)
    for a in plain["annotations"]:
        a["iscrowd"] = 0
    assert abs(evaluate(plain, copy.deepcopy(res), iou_type, rules="coco").stats["AP"] - ours) > 1e-4
    fed = copy.deepcopy(gt)
    for im in fed["images"]:
        im["neg_category_ids"] = []
    assert abs(evaluate(fed, copy.deepcopy(res), iou_type).stats["AP"] - ours) > 1e-4
    per_group = np.bincount([(d["image_id"] - 500) * 10 + d["category_id"] for d in res])
    assert per_group.max() > 100  # COCOeval's cap cuts


def test_coco_rules_equal_faster_coco_eval(case):
    from faster_coco_eval import COCO, COCOeval_faster

    iou_type, _, res, _ = case
    gt = coco_gt(zero_area=False)  # faster-coco-eval treats an area-0 GT apart
    coco = COCO(copy.deepcopy(gt))
    e = COCOeval_faster(coco, coco.loadRes(copy.deepcopy(res)), iou_type, print_function=lambda *_: None)
    e.run()
    ours = evaluate(gt, copy.deepcopy(res), iou_type).stats
    for key, name in FASTER.items():
        assert abs(ours[key] - e.stats_as_dict[name]) <= TOL, (key, ours[key], e.stats_as_dict[name])


def test_coco_fixed_equals_pycocotools_without_caps(case):
    # AP^Fixed under COCO rules: the top per_class per category, no per-image(-category) cap
    iou_type, gt, res, prepared = case
    cap = 40
    kept = []
    for c in sorted({d["category_id"] for d in res}):
        kept += sorted((d for d in res if d["category_id"] == c), key=lambda d: -d["score"])[:cap]
    ours = evaluate_fixed(prepared, copy.deepcopy(res), iou_type, per_class=cap)
    e = pycocotools_eval(gt, kept, iou_type, max_dets=(10 ** 6,))
    np.testing.assert_allclose(ours.precision, e.eval["precision"][..., 0], rtol=0, atol=TOL)


def _two_boxes(federated: bool) -> tuple[dict, list[dict]]:
    """Class A on image 1, class B on image 2, each found; a false B (0.95) on image 1."""
    images = [{"id": i, "height": 100, "width": 100} for i in (1, 2)]
    if federated:
        for im in images:
            im["neg_category_ids"] = []
    gt = {"images": images, "categories": [{"id": 1, "name": "A"}, {"id": 2, "name": "B"}],
          "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40], "area": 1600,
                           "iscrowd": 0},
                          {"id": 2, "image_id": 2, "category_id": 2, "bbox": [10, 10, 40, 40], "area": 1600,
                           "iscrowd": 0}]}
    res = [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40], "score": 0.9},
           {"image_id": 2, "category_id": 2, "bbox": [10, 10, 40, 40], "score": 0.9},
           {"image_id": 1, "category_id": 2, "bbox": [60, 60, 30, 30], "score": 0.95}]
    return gt, res


def test_the_two_box_example_by_hand():
    # by hand: A's AP 1; B's detections by score are a miss then a hit, precision 1/2 at every
    # recall: AP 1/2; the mean 3/4 (pycocotools prints 0.750)
    gt, res = _two_boxes(federated=False)
    r = evaluate(gt, res)
    assert r.rules == "coco" and r.stats["AP"] == pytest.approx(0.75, abs=1e-12)
    assert pycocotools_eval(gt, res, "bbox").stats[0] == pytest.approx(0.75, abs=1e-12)
    from norcal.evaluation.rules import RuleChoice

    line = RuleChoice(r.rules, r.rules_reason).line  # the first line of eval and tune output
    assert "no neg_category_ids" in line and line.startswith("rules: COCO (")
    # federated: B is neither annotated nor negative on image 1, so the false B is dropped
    fed_gt, _ = _two_boxes(federated=True)
    fed = evaluate(fed_gt, res)
    assert fed.rules == "lvis" and fed.stats["AP"] == pytest.approx(1.0, abs=1e-12)
    assert evaluate(fed_gt, res, rules="coco").stats["AP"] == pytest.approx(0.75, abs=1e-12)


def test_forcing_lvis_without_federated_lists_is_refused():
    gt, res = _two_boxes(federated=False)
    with pytest.raises(NorcalError, match=r"^rules lvis: GT has no neg_category_ids") as e:
        evaluate(gt, res, rules="lvis")
    assert e.value.param == "rules" and "\n" not in str(e.value)
    with pytest.raises(NorcalError, match="rules must be auto, lvis or coco"):
        evaluate(gt, res, rules="federated")


def test_frequency_groups_reported_under_coco_only_when_present():
    gt, res = _two_boxes(federated=False)
    r = evaluate(gt, res)
    assert "APr" not in r.stat_keys() and "APr" not in r.to_json()["stats"]
    assert r.to_json()["rules"] == "coco" and "AR1" in r.to_json()["stats"]
    for c, f in zip(gt["categories"], "rf"):
        c["frequency"] = f
    r = evaluate(gt, res)
    assert r.stats["APr"] == pytest.approx(1.0) and r.stats["APf"] == pytest.approx(0.5)
    assert "APr" in r.to_json()["stats"]
