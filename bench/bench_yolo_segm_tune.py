"""Tune's segm re-scoring speed on a YOLO segment model against its box re-scoring: each gamma's
re-scored detections, with their masks pasted and RLE-encoded for segm (what `norcal tune
--iou-type segm` does per gamma; its gammas share one memo of the cache's masks, as tune's sweep does).

    python bench/bench_yolo_segm_tune.py [--images 4] [--imgsz 640] [--repeat 3] [--gammas 0,0.5,1,1.5,2] [--no-memo]

A YOLO11n-seg built from Ultralytics' yaml offline (random weights, class biases raised as the
tests' checkpoints have them, so it detects: 300 detections per image at the 0.001 threshold),
the d2_lvis_tiny images; the cache is made once (untimed), then each repeat times the sweep
over --gammas (bbox: rescore_gamma(masks=False); segm: masks=True, one memo per repeat) and
prints the medians per gamma, and segm's ratio to bbox.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4, help="images (default 4, max 4)")
    ap.add_argument("--imgsz", type=int, default=640, help="letterbox size (default 640)")
    ap.add_argument("--repeat", type=int, default=3, help="timed repeats (default 3)")
    ap.add_argument("--gammas", default="0,0.5,1,1.5,2", help="gammas of the sweep (default 0,0.5,1,1.5,2)")
    ap.add_argument("--no-memo", action="store_true", help="every gamma pastes all its masks (no memo)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import numpy as np
    from yolo_models import IMAGES, make_checkpoint  # sets YOLO_OFFLINE

    from norcal.export.families import load_detector
    from norcal.workflows.tune_cache import cache_images, rescore_gamma

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "seg.pt"
        make_checkpoint(ckpt, "yolo11n-seg.yaml", imgsz=args.imgsz)
        det = load_detector(ckpt)
        images = [(i + 1, p) for i, p in enumerate(IMAGES[:args.images])]
        counts = np.arange(1, det.num_classes + 1, dtype=np.float64) * 10
        gammas = [float(g) for g in args.gammas.split(",")]
        priors = [None if g == 0 else -g * np.log(counts) for g in gammas]
        cache = cache_images(det, images, priors, batch_size=len(images), with_masks=True)
        cats = list(range(1, det.num_classes + 1))
        per_gamma = {}
        for kind in ("bbox", "segm"):
            times = []
            for _ in range(args.repeat):
                memo: dict = {}
                t = time.perf_counter()
                for k, prior in enumerate(priors):
                    out = rescore_gamma(det, cache, k, prior, "exp", len(images), cats, masks=kind == "segm",
                                        **({} if args.no_memo else {"mask_memo": memo}))
                times.append((time.perf_counter() - t) / len(gammas))
            per_gamma[kind] = statistics.median(times)
            print(f"{len(images)} images at {args.imgsz}, {len(gammas)} gammas: {len(out)} detections at the last; "
                  f"{kind} re-scoring per gamma median {per_gamma[kind]:.3f} s (runs {', '.join(f'{x:.3f}' for x in times)})")
        print(f"segm / bbox: {per_gamma['segm'] / per_gamma['bbox']:.2f} x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
