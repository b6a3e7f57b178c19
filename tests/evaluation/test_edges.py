"""Defaults and edges against lvis-api, pycocotools and hand-computed values: the 300
detections per image of LVIS rules, LVIS's rare / common / frequent edges, the area-range
edges 32^2 and 96^2, and AP^Fixed's per-class cap without COCOeval's per-image cap."""

from __future__ import annotations

import copy
import json

import numpy as np
import pycocotools.mask as mask_utils
import pytest

from norcal.core.calibration.tables import frequency_group, load_table
from norcal.evaluation import evaluate, evaluate_fixed
from test_coco_rules import COCO_STATS, pycocotools_eval
from test_evaluation import assert_same, lvis_api, make_results, reference, synthetic_gt  # noqa: F401

# measured: the area-edge cases equal pycocotools exactly (0.0); 1e-12 leaves room for summation order
TOL = 1e-12


def test_lvis_rules_keep_300_detections_per_image_by_default(lvis_api, tmp_path):
    # one image with 360 detections: 250 confident false ones, half the true ones, about 100
    # false ones, the other half: a cap of 100 drops every true one, no cap keeps the last ones
    gt = synthetic_gt(seed=5)
    res = make_results(gt, seed=6, segm=False)
    img = gt["images"][0]
    rng = np.random.default_rng(0)
    mine = [d for d in res if d["image_id"] == img["id"]]
    assert len(mine) >= 4
    for k, d in enumerate(mine):
        d["score"] = (0.4 if k % 2 else 0.01) + 0.05 * d["score"]
    cats = sorted({d["category_id"] for d in mine})
    extra = []
    for k in range(360 - len(mine)):
        x, y = rng.uniform(0, 300), rng.uniform(0, 200)
        score = 0.9 + 0.1 * rng.random() if k < 250 else 0.1 + 0.1 * rng.random()
        extra.append({"image_id": img["id"], "category_id": int(cats[k % len(cats)]),
                      "bbox": [x, y, 20.0, 20.0], "score": score})
    res += extra
    assert sum(d["image_id"] == img["id"] for d in res) == 360
    ours = evaluate(gt, res, "bbox")
    assert ours.max_dets == 300
    e = reference(lvis_api, gt, res, "bbox", tmp_path)  # LVISResults' default max_dets=300
    assert_same(e, ours)
    for cap in (100, -1):  # the case tells 300 from either
        other = reference(lvis_api, gt, res, "bbox", tmp_path, max_dets=cap)
        assert abs(other.results["AP"] - e.results["AP"]) > 1e-3 or abs(other.results["AR@300"] - e.results["AR@300"]) > 1e-3


@pytest.mark.parametrize("name", ["lvis_v1", "lvis_v0_5"])
def test_frequency_group_is_lvis_own_for_every_bundled_category(name):
    table = load_table(name)
    counts = [c["image_count"] for c in table.categories]
    assert counts.count(10) >= 20 and 100 in counts  # both edges occur
    wrong = [(c["id"], c["image_count"], c["frequency"]) for c in table.categories
             if frequency_group(c["image_count"]) != c["frequency"]]
    assert wrong == []


# ---------------------------------------------------------------- area-range edges
EDGES = (32, 96)  # areas 32^2 and 96^2 belong to both neighbouring ranges in both references


def _edge_case(federated: bool, masks: bool) -> tuple[dict, list[dict]]:
    """Per image, a GT of area exactly side^2 found by a detection of area side^2, and a more
    confident false detection of area side^2 elsewhere; plus a small GT missed."""
    images, anns, res = [], [], []
    for i, side in enumerate(EDGES * 2):
        iid, cat = i + 1, 1 + i % 2
        im = {"id": iid, "height": 300, "width": 300}
        if federated:
            im.update(neg_category_ids=[], not_exhaustive_category_ids=[])
        images.append(im)
        x, y = 10.0, 10.0
        anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": cat, "iscrowd": 0,
                     "bbox": [x, y, side, side], "area": float(side * side),
                     "segmentation": [[x, y, x + side, y, x + side, y + side, x, y + side]]})
        anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": cat, "iscrowd": 0,
                     "bbox": [250.0, 250.0, 8.0, 8.0], "area": 64.0,
                     "segmentation": [[250, 250, 258, 250, 258, 258, 250, 258]]})
        for (dx, dy), score in (((x, y), 0.5 + 0.1 * i), ((150.0, 150.0 - side / 2 * (i > 1)), 0.9 - 0.1 * i)):
            d = {"image_id": iid, "category_id": cat, "score": score}
            if masks:  # a mask-only result: its area is its pixel count, side^2
                m = np.zeros((300, 300), dtype=np.uint8, order="F")
                m[int(dy):int(dy) + side, int(dx):int(dx) + side] = 1
                rle = mask_utils.encode(m)
                assert mask_utils.area(rle) == side * side
                rle["counts"] = rle["counts"].decode()
                d["segmentation"] = rle
            else:
                d["bbox"] = [dx, dy, float(side), float(side)]
            res.append(d)
    cats = [{"id": 1, "name": "a", "frequency": "r"}, {"id": 2, "name": "b", "frequency": "f"}]
    return {"images": images, "annotations": anns, "categories": cats}, res


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_area_edges_match_pycocotools(iou_type):
    gt, res = _edge_case(federated=False, masks=iou_type == "segm")
    ours = evaluate(gt, copy.deepcopy(res), iou_type)
    assert ours.rules == "coco"
    e = pycocotools_eval(gt, res, iou_type)
    for i, key in enumerate(COCO_STATS):
        assert abs(ours.stats[key] - e.stats[i]) <= TOL, (key, ours.stats[key], e.stats[i])
    np.testing.assert_allclose(ours.precision, e.eval["precision"][..., -1], rtol=0, atol=TOL)
    np.testing.assert_allclose(ours.recall, e.eval["recall"][..., -1], rtol=0, atol=TOL)


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_area_edges_match_lvis_api(lvis_api, tmp_path, iou_type):
    gt, res = _edge_case(federated=True, masks=iou_type == "segm")
    ours = evaluate(gt, copy.deepcopy(res), iou_type)
    assert ours.rules == "lvis"
    e = reference(lvis_api, gt, res, iou_type, tmp_path)
    for r in ("APs", "APm", "APl"):  # every range holds an edge GT and edge detections
        assert e.results[r] > 0
    assert_same(e, ours)


# ---------------------------------------------------------------- AP^Fixed's cap
def _one_true_among_many(federated: bool, n: int = 10001):
    """One GT; n detections of its class on its image, the true one ranked 10,000th: kept by
    a per-class cap of 10,000 (AP = its precision 1/10,000 at every recall), lost below it."""
    im = {"id": 1, "height": 1000, "width": 1000}
    if federated:
        im.update(neg_category_ids=[], not_exhaustive_category_ids=[])
    gt = {"images": [im], "categories": [{"id": 1, "name": "a"}],
          "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [500.0, 500.0, 50.0, 50.0],
                           "area": 2500.0, "iscrowd": 0}]}
    res = []
    for k in range(n):
        box = [500.0, 500.0, 50.0, 50.0] if k == 9999 else [float(k % 90) * 5, float(k // 90 % 90) * 5, 4.0, 4.0]
        res.append({"image_id": 1, "category_id": 1, "bbox": box, "score": 1.0 - k / (2 * n)})
    return gt, res


@pytest.mark.parametrize("federated", [True, False])
def test_fixed_keeps_10000_per_class_and_no_per_image_cap(federated):
    gt, res = _one_true_among_many(federated)
    r = evaluate_fixed(gt, res)
    assert r.rules == ("lvis" if federated else "coco")
    assert r.num_detections == 10000 and r.per_class == 10000
    assert r.stats["AP"] == pytest.approx(1e-4, rel=1e-12)


def test_cli_fixed_per_class_default_is_10000(tmp_path, capsys):
    from norcal.cli import main

    gt, res = _one_true_among_many(federated=False)
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(res))
    out = tmp_path / "m.json"
    assert main(["eval", "--gt", str(tmp_path / "gt.json"), "--results", str(tmp_path / "res.json"),
                 "--json", str(out)]) == 0
    fixed = json.loads(out.read_text())["fixed"]
    assert fixed["per_class_cap"] == 10000 and fixed["num_detections"] == 10000
    assert fixed["stats"]["AP"] == pytest.approx(1e-4, rel=1e-12)
