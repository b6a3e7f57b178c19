"""LVIS evaluation against the official lvis-api (0.5.3) and hand-computed AP^Fixed."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pycocotools.mask as mask_utils

from conftest import SYNTH
from norcal.core.errors import NorcalError
from norcal.evaluation import (Detections, evaluate, evaluate_fixed, from_results, prepare_gt)
from norcal.core.calibration.tables import CalibrationTable

FIXTURE = SYNTH / "val.json"
TOL = 1e-4


@pytest.fixture(scope="module")
def lvis_api():
    if not hasattr(np, "float"):
        np.float = float  # lvis 0.5.3 uses the alias removed in numpy 1.24
    import lvis

    return lvis


# ---------------------------------------------------------------- inputs
def _jitter_poly(poly, rng, s):
    p = np.asarray(poly, dtype=np.float64).reshape(-1, 2)
    return (p + rng.normal(size=p.shape) * s).reshape(-1).tolist()


def _rle(polys, h, w):
    r = mask_utils.merge(mask_utils.frPyObjects(polys, h, w))
    r["counts"] = r["counts"].decode()
    return r


def make_results(gt: dict, seed: int, segm: bool, ties: bool = False) -> list[dict]:
    """Detections near the GT (some with the wrong class, duplicates) plus false positives."""
    rng = np.random.default_rng(seed)
    imgs = {im["id"]: im for im in gt["images"]}
    cats = [c["id"] for c in gt["categories"]]
    out = []

    def add(img, cat, box, polys, score):
        im = imgs[img]
        d = {"image_id": img, "category_id": int(cat), "bbox": [float(v) for v in box],
             "score": round(float(score), 2) if ties else float(score)}
        if segm:
            d["segmentation"] = _rle(polys, im["height"], im["width"])
        out.append(d)

    for a in gt["annotations"]:
        x, y, w, h = a["bbox"]
        for _ in range(rng.integers(0, 4)):
            s = max(w, h) * rng.uniform(0.0, 0.25)
            dx, dy = rng.normal(size=2) * s
            box = [x + dx, y + dy, w * np.exp(rng.normal() * 0.15), h * np.exp(rng.normal() * 0.15)]
            polys = [_jitter_poly(np.asarray(p).reshape(-1, 2) + [dx, dy], rng, s * 0.3)
                     for p in a["segmentation"]] if segm else None
            cat = a["category_id"] if rng.random() < 0.85 else rng.choice(cats)
            add(a["image_id"], cat, box, polys, rng.random())
    for im in gt["images"]:
        for _ in range(rng.integers(0, 25)):
            w, h = rng.uniform(2, im["width"] / 2), rng.uniform(2, im["height"] / 2)
            x, y = rng.uniform(0, im["width"] - w), rng.uniform(0, im["height"] - h)
            polys = [[x, y, x + w, y, x + w * rng.uniform(0.3, 1), y + h, x, y + h]]
            add(im["id"], rng.choice(cats), [x, y, w, h], polys, rng.random())
    return out


def synthetic_gt(seed: int = 0) -> dict:
    """A small LVIS GT with every federated field in use: crowded images (many GTs of one
    class), nested GTs, not-exhaustive classes, negatives, an ignored GT and a zero-area GT."""
    rng = np.random.default_rng(seed)
    freqs = ["r", "c", "f", "f", "c", "r"]
    cats = [{"id": i + 1, "name": f"class{i + 1}", "frequency": f} for i, f in enumerate(freqs)]
    images, anns = [], []
    for i in range(10):
        iid = 500 + 3 * i
        hh, ww = 300, 400
        pos = rng.choice(len(cats), size=rng.integers(1, 4), replace=False) + 1
        rest = [c["id"] for c in cats if c["id"] not in pos]
        neg = rng.choice(rest, size=rng.integers(0, len(rest) + 1), replace=False)
        nel = [int(c) for c in pos if rng.random() < 0.3]
        images.append({"id": iid, "height": hh, "width": ww, "neg_category_ids": sorted(int(c) for c in neg),
                       "not_exhaustive_category_ids": nel})
        for c in pos:
            for _ in range(rng.integers(1, 9)):
                side = np.exp(rng.uniform(np.log(8), np.log(200)))
                w, h = side * rng.uniform(0.6, 1.4), side * rng.uniform(0.6, 1.4)
                x, y = rng.uniform(0, ww - w), rng.uniform(0, hh - h)
                poly = [x, y, x + w, y + h * rng.uniform(0, 0.3), x + w * rng.uniform(0.7, 1), y + h, x, y + h]
                anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": int(c),
                             "bbox": [x, y, w, h], "area": float(w * h * 0.8),
                             "segmentation": [poly], "iscrowd": 0})
        # nested twins across the small/medium border (area 0.8 * side^2 vs 32^2): a detection
        # overlaps both, and in one area range only one of them counts
        for side in (34.0, 38.0):
            x, y = 50.0, 60.0
            anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": int(pos[0]),
                         "bbox": [x, y, side, side], "area": 0.8 * side * side, "iscrowd": 0,
                         "segmentation": [[x, y, x + side, y, x + side, y + side, x, y + side]]})
    anns[3]["ignore"] = 1
    anns[7]["area"] = 0.0
    return {"images": images, "annotations": anns, "categories": cats}


# ---------------------------------------------------------------- reference
def reference(lvis_api, gt: dict, results: list, iou_type: str, tmp_path: Path, max_dets: int = 300):
    path = tmp_path / "gt_ref.json"
    path.write_text(json.dumps(gt))
    g = lvis_api.LVIS(str(path))
    r = lvis_api.LVISResults(g, copy.deepcopy(results), max_dets=max_dets)
    e = lvis_api.LVISEval(g, r, iou_type)
    e.run()
    return e


def assert_same(e, ours) -> None:
    for key, value in e.results.items():
        mine = ours.stats[key.split("@")[0]]
        assert mine == pytest.approx(value, abs=TOL), key
    # AR per frequency group, from lvis-api's own recall array
    for idx, g in enumerate("rcf"):
        s = e.eval["recall"][:, e.freq_groups[idx], 0]
        want = float(np.mean(s[s > -1])) if (s > -1).any() else -1.0
        assert ours.stats[f"AR{g}"] == pytest.approx(want, abs=TOL)
    np.testing.assert_allclose(ours.precision, e.eval["precision"], atol=1e-9)
    np.testing.assert_allclose(ours.recall, e.eval["recall"], atol=1e-9)
    # per-class AP as lvis-api's precision gives it
    p = e.eval["precision"][:, :, :, 0]
    for k in range(p.shape[2]):
        want = p[:, :, k].mean() if (p[:, :, k] > -1).all() else -1.0
        assert ours.class_ap()[k] == pytest.approx(want, abs=TOL)


# ---------------------------------------------------------------- vs lvis-api
@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("ties", [False, True])
def test_fixture_matches_lvis_api(lvis_api, tmp_path, iou_type, ties):
    gt = json.loads(FIXTURE.read_text())
    assert any(im["neg_category_ids"] for im in gt["images"])
    res = make_results(gt, seed=1, segm=iou_type == "segm", ties=ties)
    ours = evaluate(FIXTURE, res, iou_type)
    assert ours.stats["AP"] > 0.05  # a meaningful case, not all zeros
    assert_same(reference(lvis_api, gt, res, iou_type, tmp_path), ours)


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_synthetic_federated_matches_lvis_api(lvis_api, tmp_path, iou_type):
    gt = synthetic_gt(seed=3)
    assert any(im["not_exhaustive_category_ids"] for im in gt["images"])
    res = make_results(gt, seed=4, segm=iou_type == "segm", ties=True)
    ours = evaluate(gt, res, iou_type)
    assert_same(reference(lvis_api, gt, res, iou_type, tmp_path), ours)


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_mask_only_results_match_lvis_api(lvis_api, tmp_path, iou_type):
    # without 'bbox', lvis-api takes the mask's area and box (toBbox): so must we
    gt = synthetic_gt(seed=11)
    res = make_results(gt, seed=12, segm=True)
    for d in res:
        del d["bbox"]
    ours = evaluate(gt, res, iou_type)
    assert_same(reference(lvis_api, gt, res, iou_type, tmp_path), ours)


def test_per_image_cap_matches_lvis_api(lvis_api, tmp_path):
    gt = synthetic_gt(seed=5)
    res = make_results(gt, seed=6, segm=False, ties=True)
    per_image = np.bincount([d["image_id"] - 500 for d in res])
    assert per_image.max() > 12  # the cap cuts
    ours = evaluate(prepare_gt(gt), res, "bbox", max_dets=12)
    assert_same(reference(lvis_api, gt, res, "bbox", tmp_path, max_dets=12), ours)


def test_fixed_matches_lvis_api_with_manual_cap(lvis_api, tmp_path):
    gt = synthetic_gt(seed=7)
    res = make_results(gt, seed=8, segm=False)
    cap = 15
    kept = []
    for c in {d["category_id"] for d in res}:
        mine = sorted((d for d in res if d["category_id"] == c), key=lambda d: -d["score"])
        kept += mine[:cap]
    ours = evaluate_fixed(gt, res, "bbox", per_class=cap)
    assert ours.num_detections == len(kept) < len(res)
    assert_same(reference(lvis_api, gt, kept, "bbox", tmp_path, max_dets=-1), ours)


# ---------------------------------------------------------------- AP^Fixed by hand
def _hand_case():
    images = [{"id": 1, "height": 100, "width": 100, "neg_category_ids": [2], "not_exhaustive_category_ids": []},
              {"id": 2, "height": 100, "width": 100, "neg_category_ids": [], "not_exhaustive_category_ids": []},
              {"id": 3, "height": 100, "width": 100, "neg_category_ids": [1], "not_exhaustive_category_ids": []}]
    cats = [{"id": 1, "name": "a", "frequency": "f"}, {"id": 2, "name": "b", "frequency": "r"}]
    box_a, box_b = [0, 0, 10, 10], [50, 50, 20, 20]
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": box_a, "area": 100.0},
            {"id": 2, "image_id": 2, "category_id": 1, "bbox": box_a, "area": 100.0},
            {"id": 3, "image_id": 3, "category_id": 2, "bbox": box_b, "area": 400.0}]
    res = [{"image_id": 1, "category_id": 1, "bbox": box_a, "score": 0.9},   # TP
           {"image_id": 3, "category_id": 1, "bbox": box_a, "score": 0.8},   # FP (a is negative on 3)
           {"image_id": 2, "category_id": 1, "bbox": box_a, "score": 0.7},   # TP
           {"image_id": 3, "category_id": 2, "bbox": box_b, "score": 0.95},  # TP
           {"image_id": 1, "category_id": 2, "bbox": box_b, "score": 0.3},   # FP (b negative on 1)
           {"image_id": 2, "category_id": 2, "bbox": box_b, "score": 0.2}]   # unannotated: dropped
    return {"images": images, "annotations": anns, "categories": cats}, res


def test_fixed_by_hand():
    gt, res = _hand_case()
    # cap 2: class a keeps TP, FP -> recall 1/2 at precision 1: 51 of 101 recall points
    ap_a, ap_b = 51 / 101, 1.0
    r = evaluate_fixed(gt, res, per_class=2)
    assert r.class_ap() == pytest.approx([ap_a, ap_b], abs=1e-12)
    assert r.stats["AP"] == pytest.approx((ap_a + ap_b) / 2, abs=1e-12)
    assert r.stats["APf"] == pytest.approx(ap_a, abs=1e-12)
    assert r.stats["APr"] == pytest.approx(ap_b, abs=1e-12)
    assert r.stats["AR"] == pytest.approx((0.5 + 1.0) / 2, abs=1e-12)
    # no cut: the second TP arrives at precision 2/3 -> 50 recall points at 2/3
    full = evaluate_fixed(gt, res, per_class=10000)
    assert full.class_ap()[0] == pytest.approx((51 + 50 * 2 / 3) / 101, abs=1e-12)
    # the per-image cap does not apply to AP^Fixed: 400 copies on one image survive
    many = res + [dict(res[4], score=0.01)] * 400
    assert evaluate_fixed(gt, many, per_class=10000).num_detections == len(many)
    assert evaluate(gt, many, max_dets=300).num_detections == 300 + 4


# ---------------------------------------------------------------- API behaviour
def test_inputs_in_every_form_agree(tmp_path):
    gt, res = _hand_case()
    gpath, rpath = tmp_path / "gt.json", tmp_path / "res.json"
    gpath.write_text(json.dumps(gt))
    rpath.write_text(json.dumps(res))
    want = evaluate(gt, res).stats
    assert evaluate(str(gpath), rpath).stats == want
    prepared = prepare_gt(gpath)
    dets = from_results(res)
    assert isinstance(dets, Detections)
    assert evaluate(prepared, dets).stats == want
    assert evaluate(prepared, dets).stats == want  # a prepared GT is reusable


def test_frequency_from_table_when_gt_lacks_it():
    gt, res = _hand_case()
    plain = copy.deepcopy(gt)
    for c in plain["categories"]:
        del c["frequency"]
    assert evaluate(plain, res).stats["APr"] == -1
    table = CalibrationTable("t", "test", "image", [
        {"id": 1, "name": "a", "image_count": 500, "instance_count": 900, "frequency": "f"},
        {"id": 2, "name": "b", "image_count": 3, "instance_count": 3, "frequency": "r"}])
    got = evaluate(plain, res, table=table)
    assert got.stats == evaluate(gt, res).stats
    assert list(got.image_count) == [500, 3]


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.append(dict(r[0], image_id=999)), "image id"),
    (lambda r: r.append(dict(r[0], category_id=77)), "category id"),
    (lambda r: r.clear(), "empty"),
    (lambda r: r[1].pop("score"), r"results: \[1\]: score: missing"),
])
def test_bad_results_are_clear_errors(mutate, message):
    gt, res = _hand_case()
    mutate(res)
    with pytest.raises(NorcalError, match=message):
        evaluate(gt, res)


def test_unknown_ids_in_a_results_file_name_the_file_and_record(tmp_path):
    gt, res = _hand_case()
    n = len(res)
    res.append(dict(res[0], category_id=77))
    path = tmp_path / "res.json"
    path.write_text(json.dumps(res))
    with pytest.raises(NorcalError) as e:
        evaluate(gt, str(path))
    assert str(e.value).startswith(f"{path}: record {n}: category_id 77: ")
    with pytest.raises(NorcalError) as e:  # loaded first, evaluated later: still the file's name
        evaluate(gt, from_results(str(path)))
    assert str(e.value).startswith(f"{path}: record {n}: ")


@pytest.mark.parametrize("mutate, message", [
    (lambda g: g["annotations"][1].pop("image_id"), r"GT: annotations\[1\] \(id 2\): image_id: missing"),
    (lambda g: g["annotations"][0].pop("category_id"), r"GT: annotations\[0\] \(id 1\): category_id: missing"),
    (lambda g: g["categories"][1].pop("id"), r"GT: categories\[1\]: id: missing"),
    (lambda g: g["images"][0].pop("id"), r"GT: images\[0\]: id: missing"),
])
def test_malformed_gt_entries_are_clear_errors(mutate, message):
    gt, res = _hand_case()
    mutate(gt)
    with pytest.raises(NorcalError, match=message):
        prepare_gt(gt)


def test_results_that_are_not_objects_are_clear_errors():
    gt, _ = _hand_case()
    with pytest.raises(NorcalError, match=r"results: \[0\]: expected an object, got 1"):
        evaluate(gt, [1, 2])


def test_polygon_segmentation_in_results_is_a_clear_error():
    gt, res = _hand_case()
    for d in res:
        x, y, w, h = d["bbox"]
        d["segmentation"] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
    with pytest.raises(NorcalError, match="results must be RLE"):
        evaluate(gt, res, iou_type="segm")
    # Detections built in code are checked too
    dets = Detections(np.array([1]), np.array([1]), np.array([0.9]), None,
                      [[[0, 0, 10, 0, 10, 10, 0, 10]]])
    with pytest.raises(NorcalError, match="results must be RLE"):
        evaluate(gt, dets, iou_type="segm")


def test_evaluate_leaves_mask_only_detections_unchanged():
    # bbox AP of mask-only results derives boxes from the masks: on a copy, not the caller's object
    gt = synthetic_gt(seed=11)
    res = make_results(gt, seed=12, segm=True)
    for d in res:
        del d["bbox"]
    dets = from_results(res)
    first = evaluate(gt, dets, "bbox")
    assert dets.boxes is None
    assert evaluate_fixed(gt, dets, "bbox").num_detections == len(dets)
    assert evaluate(gt, dets, "bbox").stats == first.stats


def test_missing_files_and_segm_without_masks(tmp_path):
    gt, res = _hand_case()
    with pytest.raises(NorcalError, match="no such file"):
        evaluate(tmp_path / "nope.json", res)
    with pytest.raises(NorcalError, match="no such file"):
        evaluate(gt, tmp_path / "nope.json")
    with pytest.raises(NorcalError, match="segmentation"):
        evaluate(gt, res, iou_type="segm")
    with pytest.raises(NorcalError, match="not an LVIS"):
        evaluate({"images": []}, res)


# ---------------------------------------------------------------- CLI
def test_cli_writes_json_csv_plots(tmp_path):
    gt = synthetic_gt(seed=9)
    res = make_results(gt, seed=10, segm=False)
    gpath, rpath = tmp_path / "gt.json", tmp_path / "res.json"
    gpath.write_text(json.dumps(gt))
    rpath.write_text(json.dumps(res))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "norcal", "eval", "--gt", str(gpath), "--results", str(rpath),
           "--json", str(out / "m.json"), "--per-class-csv", str(out / "ap.csv"), "--plots", str(out / "plots")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    data = json.loads((out / "m.json").read_text())
    want = evaluate(gt, res)
    assert data["stats"]["AP"] == pytest.approx(want.stats["AP"], abs=1e-12)
    assert data["fixed"]["stats"]["AP"] == pytest.approx(evaluate_fixed(gt, res).stats["AP"], abs=1e-12)
    lines = (out / "ap.csv").read_text().splitlines()
    assert lines[0].startswith("category_id,name,frequency,image_count,num_gt,AP")
    assert len(lines) == 1 + len(gt["categories"])
    pngs = sorted(q.name for q in (out / "plots").glob("*.png"))
    assert pngs == ["ap_by_frequency.png", "ap_vs_count.png"]
    assert all((out / "plots" / n).read_bytes()[:4] == b"\x89PNG" for n in pngs)
    bad = subprocess.run([sys.executable, "-m", "norcal", "eval", "--gt", str(tmp_path / "x.json"),
                          "--results", str(rpath)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and len(bad.stderr.splitlines()) == 1


# ---------------------------------------------------------------- hostile inputs
def test_table_must_match_the_gt_categories():
    from norcal.evaluation.ground_truth import check_table_matches

    gt, _ = _hand_case()
    prepared = prepare_gt(gt)
    cats = [{"id": 1, "name": "a", "image_count": 500, "instance_count": 900, "frequency": "f"},
            {"id": 2, "name": "b", "image_count": 3, "instance_count": 3, "frequency": "r"}]
    check_table_matches(CalibrationTable("t", "test", "image", cats), prepared)
    renamed = copy.deepcopy(cats)
    renamed[1]["name"] = "bee"
    with pytest.raises(NorcalError, match="table 't' does not match GT: category 2 is 'bee' in the table but 'b' in the GT"):
        check_table_matches(CalibrationTable("t", "test", "image", renamed), prepared)
    other = copy.deepcopy(cats) + [{"id": 9, "name": "z", "image_count": 1, "instance_count": 1}]
    with pytest.raises(NorcalError, match=r"category ids differ, 1 only in the table \(e\.g\. \[9\]\)"):
        check_table_matches(CalibrationTable("t", "test", "image", other), prepared)
    with pytest.raises(NorcalError, match=r"1 only in the GT \(e\.g\. \[2\]\)"):
        check_table_matches(CalibrationTable("t", "test", "image", cats[:1]), prepared)


@pytest.mark.parametrize("mutate, message", [
    # refused at load: none of these reaches the AP computation
    (lambda g, r: [a.pop("area") for a in g["annotations"]], r"GT: annotations\[0\] \(id 1\): area: missing"),
    (lambda g, r: g["annotations"][2].update(category_id=7),
     r"GT: annotations\[2\] \(id 3\): category_id: 7 is not the id of any entry in categories"),
    (lambda g, r: r[3].update(image_id="3"), r"results: \[3\]: image_id: expected an integer, got string '3'"),
    (lambda g, r: r[0].update(bbox=[0, 0, -10, 10]), r"results: \[0\]: bbox: negative width or height \(-10 x 10\)"),
    (lambda g, r: r[2].update(score=float("nan")), r"results: \[2\]: score: expected a finite number, got nan"),
])
def test_hostile_inputs_are_refused_before_evaluation(mutate, message):
    gt, res = _hand_case()
    mutate(gt, res)
    with pytest.raises(NorcalError, match=f"^{message}$"):
        evaluate(gt, res)


def test_cli_names_the_bad_record_in_one_line(tmp_path):
    gt, res = _hand_case()
    res[4]["bbox"] = [50, 50, 20]
    gpath, rpath = tmp_path / "gt.json", tmp_path / "res.json"
    gpath.write_text(json.dumps(gt))
    rpath.write_text(json.dumps(res))
    p = subprocess.run([sys.executable, "-m", "norcal", "eval", "--gt", str(gpath), "--results", str(rpath)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [f"error: {rpath}: [4]: bbox: expected 4 numbers, got 3"]
