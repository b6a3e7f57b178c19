"""norcal tune on an Ultralytics checkpoint: the sweep runs end to end through the YOLO
family's cache and re-scoring, and its gamma-0 detections are those of ``norcal infer`` on the
gamma-0 export (the host's own letterbox and box mapping on both sides)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from norcal.core.boxes import box_iou

from yolo_models import IMAGES, NUM_CLASSES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

# hand-written GT: a few boxes per image (x, y, w, h, category id); sizes are the files' own (h, w)
_SIZES = {"img0.png": (240, 320), "img1.png": (333, 500), "img2.png": (480, 360), "img3.png": (300, 300)}
_BOXES = {"img0.png": [(20, 30, 100, 80, 1), (150, 60, 120, 140, 3)],
          "img1.png": [(50, 40, 200, 150, 1), (300, 100, 120, 180, 5)],
          "img2.png": [(30, 200, 150, 200, 2), (100, 20, 200, 120, 1)],
          "img3.png": [(60, 60, 180, 180, 4), (10, 10, 50, 40, 6)]}


def _gt(path):
    images = [{"id": i + 1, "file_name": n, "height": h, "width": w, "neg_category_ids": [],
               "not_exhaustive_category_ids": []} for i, (n, (h, w)) in enumerate(sorted(_SIZES.items()))]
    ids = {im["file_name"]: im["id"] for im in images}
    anns = [{"image_id": ids[n], "bbox": [x, y, w, h], "area": w * h, "category_id": c, "iscrowd": 0}
            for n, boxes in sorted(_BOXES.items()) for (x, y, w, h, c) in boxes]
    anns = [dict(a, id=j + 1) for j, a in enumerate(anns)]
    cats = [{"id": c + 1, "name": f"class{c}", "frequency": "rcf"[c % 3]} for c in range(NUM_CLASSES)]
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


def _xyxy(b):
    return np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], 1)


def _tune_sweep(checkpoint, table, tmp_path):
    """`norcal tune` of a copy of ``checkpoint`` on the 4 images and the hand-written GT, gammas
    0, 0.5, 1: (the copy, gt, images folder, table, the sweep's JSON)."""
    from norcal.cli import main

    images = IMAGES[0].parent
    gt = _gt(tmp_path / "gt.json")
    best = tmp_path / "best.pt"
    best.write_bytes(checkpoint.read_bytes())
    table = str(table)
    sweep = tmp_path / "sweep.json"
    assert main(["tune", str(best), "--gt", str(gt), "--images", str(images), "--gammas", "0,0.5,1",
                 "--table", table, "--batch", "3", "--json", str(sweep)]) == 0
    res = json.loads(sweep.read_text())
    assert [p["gamma"] for p in res["sweep"]] == [0.0, 0.5, 1.0] and res["num_images"] == 4
    return best, gt, images, table, res


@pytest.mark.slow
def test_tune_yolo_checkpoint_end_to_end_and_gamma_0_is_infer(yolo_work, tmp_path):
    assert sorted(p.name for p in IMAGES) == sorted(_SIZES) and len(IMAGES) >= 4
    best, gt, images, table, res = _tune_sweep(yolo_work.det, yolo_work.table, tmp_path)
    assert res["best"]["gamma"] in (0.0, 0.5, 1.0) and all(p["num_detections"] > 0 for p in res["sweep"])
    # NorCal moves the sweep: its gammas do not all give the same detections
    assert len({(p["num_detections"], p["stats"]["AP"]) for p in res["sweep"]}) > 1

    _gamma_0_is_infer(best, gt, images, table, tmp_path)


def _gamma_0_is_infer(best, gt, images, table, tmp_path):
    """gamma 0 as tune computes it (the same plan, cache and re-scoring, gammas 0 and 0.5)
    against norcal infer of the gamma-0 export: >= 99% of the detections matched. Returns the
    plan and its cache."""
    from norcal.cli import main
    from norcal.workflows.tune import plan_tune
    from norcal.workflows.tune_cache import cache_images, rescore_gamma

    plan = plan_tune(best, gt, images, [0.0, 0.5], table, batch_size=3)
    cache = cache_images(plan.detector, plan.pairs, plan.acc.priors, "exp", 3)
    ours = rescore_gamma(plan.detector, cache, 0, plan.acc.priors[0], "exp", 2, plan.table.category_ids)
    onnx_path, results = tmp_path / "g0.onnx", tmp_path / "g0.json"
    assert main(["export", str(best), "--gamma", "0", "--table", table, "-o", str(onnx_path)]) == 0
    assert main(["infer", str(onnx_path), str(images), "--image-ids", str(gt), "-o", str(results)]) == 0
    rows = json.loads(results.read_text())
    assert len(rows) == len(ours) > 0
    matched = 0
    for image_id in {int(i) for i in ours.image_ids}:
        mine = ours.image_ids == image_id
        theirs = [r for r in rows if r["image_id"] == image_id]
        assert len(theirs) == int(mine.sum())
        b = _xyxy(np.array([r["bbox"] for r in theirs], np.float64).reshape(-1, 4))
        same = (box_iou(_xyxy(ours.boxes[mine]), b) >= 0.99) \
            & (ours.category_ids[mine][:, None] == np.array([r["category_id"] for r in theirs])[None]) \
            & (np.abs(ours.scores[mine][:, None] - np.array([r["score"] for r in theirs])[None]) <= 1e-4)
        matched += int(same.any(1).sum())
    # as sets: torch's and ONNX Runtime's float32 kernels differ by ~1e-5, near-ties may swap slots
    assert matched / len(rows) >= 0.99, (matched, len(rows))
    return plan, cache


@pytest.mark.slow
def test_tune_end_to_end_yolo_gamma_0_is_infer(yolo_work, tmp_path):
    """An end-to-end head (YOLO26, end2end True): tune's cache and re-scoring re-run the
    one-to-one top-k per gamma; at gamma 0 that is norcal infer of the gamma-0 export."""
    from norcal.export.families import load_detector

    best = tmp_path / "best.pt"
    best.write_bytes(yolo_work.y26e2e.read_bytes())
    assert load_detector(best).model.end2end
    _gamma_0_is_infer(best, _gt(tmp_path / "gt.json"), IMAGES[0].parent, str(yolo_work.table), tmp_path)


@pytest.mark.slow
def test_tune_yolo_on_two_ray_workers_gives_the_single_process_sweep(yolo_work, tmp_path, local_ray):
    """The workers cache with the family's methods, the driver's gammas re-score the joined
    caches (YoloTuneCache.concat): the sweep is the single process's, number for number."""
    from norcal.export.families import load_detector
    from test_ray_tune import tune_here_and_on_ray

    gt = _gt(tmp_path / "gt.json")
    per_image = load_detector(yolo_work.det).cache_bytes(1, 3)
    args = (yolo_work.det, gt, IMAGES[0].parent, [0.0, 0.5, 1.0], str(yolo_work.table))
    kwargs = dict(batch_size=1, max_cache_bytes=2 * per_image)  # 2 chunks of 2 one-image batches
    want, got = tune_here_and_on_ray(args, kwargs)
    assert [(p.gamma, p.num_detections, p.stats) for p in got.points] == \
        [(p.gamma, p.num_detections, p.stats) for p in want.points]
    assert got.best.gamma == want.best.gamma and len({p.num_detections for p in got.points}) > 1
