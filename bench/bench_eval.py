"""Evaluation speed, ours vs the official lvis-api, on the simulated LVIS benchmark.

    python bench/bench_eval.py [--images 1000] [--gamma 0.75] [--iou-type bbox|segm]

Both start from the same GT file and the same result list (LVIS dicts) and report the
same metrics; the script prints both timings, their ratio, and the largest difference
between the two sets of numbers. It also times the gamma-sweep path (a prepared GT
reused, detections as arrays).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1000, help="simulated val images (default 1000)")
    ap.add_argument("--gamma", type=float, default=0.75, help="NorCal gamma of the evaluated detections")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iou-type", choices=("bbox", "segm"), default="bbox",
                    help="segm gives each detection its box as an RLE mask")
    args = ap.parse_args()

    if not hasattr(np, "float"):
        np.float = float  # lvis 0.5.3 uses the alias removed in numpy 1.24
    logging.getLogger("lvis").setLevel(logging.ERROR)
    from lvis import LVIS, LVISEval, LVISResults

    from norcal.core.calibration import log_prior
    from norcal.evaluation import evaluate, prepare_gt
    from norcal.evaluation.simulate import SimConfig, detect, make_split
    from norcal.core.tables import load_table

    table = load_table("lvis_v1")
    counts = table.counts()
    split = make_split(table, args.images, args.seed, SimConfig())
    dets, = detect(split, [log_prior(counts, args.gamma)], SimConfig(), np.log(counts))
    results = [{"image_id": int(i), "category_id": int(c), "bbox": [float(v) for v in b],
                "score": float(s)}
               for i, c, b, s in zip(dets.image_ids, dets.category_ids, dets.boxes, dets.scores)]
    if args.iou_type == "segm":
        import pycocotools.mask as mask_utils

        from norcal.evaluation.simulate import HEIGHT, WIDTH

        rles = mask_utils.frPyObjects(np.ascontiguousarray(dets.boxes), HEIGHT, WIDTH)
        for r, rle in zip(results, rles):
            r["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
        dets.rles = [r["segmentation"] for r in results]
    print(f"simulated LVIS v1: {args.images} images, {len(split.gt['annotations'])} GT boxes, "
          f"{len(results)} detections (gamma {args.gamma:g}), 1203 classes, {args.iou_type}")

    with tempfile.TemporaryDirectory() as tmp:
        gt_path = Path(tmp) / "gt.json"
        gt_path.write_text(json.dumps(split.gt))

        res_ref = copy.deepcopy(results)
        t0 = time.perf_counter()
        g = LVIS(str(gt_path))
        e = LVISEval(g, LVISResults(g, res_ref), args.iou_type)
        e.run()
        t_ref = time.perf_counter() - t0

        t0 = time.perf_counter()
        ours = evaluate(str(gt_path), results, args.iou_type)
        t_ours = time.perf_counter() - t0

        prepared = prepare_gt(str(gt_path))
        t0 = time.perf_counter()
        sweep = evaluate(prepared, dets, args.iou_type)
        t_sweep = time.perf_counter() - t0

    diffs = {k: abs(ours.stats[k.split("@")[0]] - v) for k, v in e.results.items()}
    worst = max(diffs, key=diffs.get)
    same = all(d <= 1e-4 for d in diffs.values()) and sweep.stats == ours.stats
    print(f"{'metric':<8} {'lvis-api':>10} {'ours':>10}")
    for k, v in e.results.items():
        print(f"{k:<8} {v:>10.6f} {ours.stats[k.split('@')[0]]:>10.6f}")
    print(f"lvis-api  (load GT + results + evaluate): {t_ref:8.2f} s")
    print(f"ours      (load GT + results + evaluate): {t_ours:8.2f} s   speed-up {t_ref / t_ours:5.1f}x")
    print(f"ours, prepared GT + array detections:    {t_sweep:8.2f} s   speed-up {t_ref / t_sweep:5.1f}x")
    print(f"numbers {'the same' if same else 'DIFFER'} (largest difference {diffs[worst]:.2e} on {worst})")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
