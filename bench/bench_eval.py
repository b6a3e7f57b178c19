"""Evaluation speed, ours vs the official lvis-api and faster-coco-eval.

    python bench/bench_eval.py [--images 1000] [--gamma 0.75] [--iou-type bbox|segm]
    python bench/bench_eval.py --iou-type boundary [--results RESULTS.json]

bbox / segm run on the simulated LVIS benchmark: every evaluator starts from the same GT
file and the same result list (LVIS dicts) and reports the same metrics; the script prints
the timings, their ratios, and the largest difference between our numbers and lvis-api's.
It also times the gamma-sweep path (a prepared GT reused, detections as arrays).

boundary (Boundary IoU, which lvis-api lacks) runs on the bundled example's 48 validation
images with the trained model's detections (exported and run by ONNX Runtime first, or
--results): ours and faster-coco-eval's boundary mode (dilation ratio 0.02), both from the
files, and the largest difference on AP, APr, APc, APf.
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

# "the same": float rounding apart (measured differences are below 1e-15); a single detection
# matched differently moves an AP by far more
SAME = 1e-12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1000, help="simulated val images (default 1000)")
    ap.add_argument("--gamma", type=float, default=0.75, help="NorCal gamma of the evaluated detections")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iou-type", choices=("bbox", "segm", "boundary"), default="bbox",
                    help="segm gives each detection its box as an RLE mask; boundary runs on the "
                         "bundled example")
    ap.add_argument("--results", help="boundary: the example's validation results (default: run the model)")
    args = ap.parse_args()
    if args.iou_type == "boundary":
        return boundary(args.results)

    if not hasattr(np, "float"):
        np.float = float  # lvis 0.5.3 uses the alias removed in numpy 1.24
    logging.getLogger("lvis").setLevel(logging.ERROR)
    from lvis import LVIS, LVISEval, LVISResults

    from norcal.core.calibration.formula import log_prior
    from norcal.evaluation import evaluate, prepare_gt
    from norcal.evaluation.simulate import SimConfig, detect, make_split
    from norcal.core.calibration.tables import load_table

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

        t_fce = time_faster_coco_eval(gt_path, results, args.iou_type)[1]

        prepared = prepare_gt(str(gt_path))
        t0 = time.perf_counter()
        sweep = evaluate(prepared, dets, args.iou_type)
        t_sweep = time.perf_counter() - t0

    diffs = {k: abs(ours.stats[k.split("@")[0]] - v) for k, v in e.results.items()}
    worst = max(diffs, key=diffs.get)
    same = all(d <= SAME for d in diffs.values()) and sweep.stats == ours.stats
    print(f"{'metric':<8} {'lvis-api':>10} {'ours':>10}")
    for k, v in e.results.items():
        print(f"{k:<8} {v:>10.6f} {ours.stats[k.split('@')[0]]:>10.6f}")
    print(f"lvis-api  (load GT + results + evaluate): {t_ref:8.2f} s")
    print(f"ours      (load GT + results + evaluate): {t_ours:8.2f} s   speed-up {t_ref / t_ours:5.1f}x")
    print(f"ours, prepared GT + array detections:    {t_sweep:8.2f} s   speed-up {t_ref / t_sweep:5.1f}x")
    print(f"faster-coco-eval (load GT + results + evaluate): {t_fce:8.2f} s   ours {t_fce / t_ours:5.1f}x faster")
    print(f"numbers {'the same' if same else 'DIFFER'} (largest difference {diffs[worst]:.2e} on {worst})")
    return 0 if same else 1


def time_faster_coco_eval(gt_path: Path, results: list[dict], iou_type: str) -> tuple[dict, float]:
    """faster-coco-eval's LVIS-style evaluation from the GT file: (its stats, seconds)."""
    from faster_coco_eval import COCO, COCOeval_faster

    res = copy.deepcopy(results)
    t0 = time.perf_counter()
    g = COCO(str(gt_path))
    e = COCOeval_faster(g, g.loadRes(res), iou_type, lvis_style=True, print_function=lambda *_: None)
    e.params.maxDets = [300]
    e.run()
    return e.stats_as_dict, time.perf_counter() - t0


def example_results(out: Path) -> Path:
    """The bundled trained model (plain softmax) on its validation images -> results JSON."""
    from norcal.core.files.onnx_io import save_onnx
    from norcal.core.calibration.tables import build_table
    from norcal.examples import example_dir
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model
    from norcal.runtime.inference import run_images
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
    from norcal.runtime.results import detections_to_results
    from norcal.workflows.tune import images_from_gt

    d = example_dir()
    table = build_table(d / "train_annotations.json")
    spec, model = load_model(d / "model_final.pth", d / "config.yaml")
    save_onnx(export_detector(model, spec), out / "model.onnx")
    pairs = images_from_gt(d / "val.json", d / "val")
    ids = {str(p): i for i, p in pairs}
    results = []
    for p, det in run_images(OnnxRuntimeRunner(out / "model.onnx"), [p for _, p in pairs], 8):
        results += detections_to_results(ids[str(p)], det, table.category_ids)
    (out / "results.json").write_text(json.dumps(results))
    return out / "results.json"


def boundary(results_path: str | None) -> int:
    from norcal.evaluation import evaluate
    from norcal.examples import example_dir

    gt_path = example_dir() / "val.json"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(results_path) if results_path else example_results(Path(tmp))
        results = json.loads(path.read_text())
        print(f"bundled example: {len(json.loads(gt_path.read_text())['images'])} validation images, "
              f"{len(results)} detections, boundary IoU (dilation ratio 0.02)")
        theirs, t_fce = time_faster_coco_eval(gt_path, results, "boundary")
        t0 = time.perf_counter()
        ours = evaluate(str(gt_path), str(path), "boundary").stats
        t_ours = time.perf_counter() - t0
    names = {"AP": "AP_all", "AP50": "AP_50", "AP75": "AP_75", "APr": "APr", "APc": "APc", "APf": "APf"}
    print(f"{'metric':<8} {'faster-coco-eval':>17} {'ours':>10}")
    for k, n in names.items():
        print(f"{k:<8} {theirs[n]:>17.6f} {ours[k]:>10.6f}")
    worst = max(abs(ours[k] - theirs[n]) for k, n in names.items())
    print(f"faster-coco-eval (load GT + results + evaluate): {t_fce:8.2f} s")
    print(f"ours             (load GT + results + evaluate): {t_ours:8.2f} s   speed-up {t_fce / t_ours:5.1f}x")
    print(f"numbers {'the same' if worst <= SAME else 'DIFFER'} (largest difference {worst:.2e})")
    return 0 if worst <= SAME else 1


if __name__ == "__main__":
    raise SystemExit(main())
