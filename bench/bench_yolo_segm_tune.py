"""Tune's segm re-scoring speed on a YOLO segment model: one gamma's re-scored detections with
their masks pasted and RLE-encoded (what `norcal tune --iou-type segm` does per gamma).

    python bench/bench_yolo_segm_tune.py [--images 4] [--imgsz 640] [--repeat 3]

A YOLO11n-seg built from Ultralytics' yaml offline (random weights, class biases raised as the
tests' checkpoints have them, so it detects: 300 detections per image at the 0.001 threshold),
the d2_lvis_tiny images; the cache is made once (untimed), then each repeat times
rescore_gamma(masks=True) at gamma 0.5 and prints the median and the detection count.
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
        prior = -0.5 * np.log(counts)
        cache = cache_images(det, images, [prior], batch_size=len(images), with_masks=True)
        cats = list(range(1, det.num_classes + 1))
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            out = rescore_gamma(det, cache, 0, prior, "exp", len(images), cats, masks=True)
            times.append(time.perf_counter() - t)
        print(f"{len(images)} images at {args.imgsz}: {len(out.rles)} detections; segm re-scoring per gamma "
              f"median {statistics.median(times):.3f} s (runs {', '.join(f'{x:.3f}' for x in times)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
