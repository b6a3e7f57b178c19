"""Gamma tuning speed: the cached sweep (norcal tune) vs a full re-inference per gamma.

    python bench/bench_tune.py [--images 16] [--gammas 0.5,1] [--batch 4]

On the bundled d2_synth_trained model and its validation images. Both paths give the same
detections (tests/test_tune.py) and end in the same bbox evaluation; the script measures,
in one run, per gamma:
  full:   NorCal surgery on the exported graph + ONNX Runtime on the images (padded batches,
          boxes mapped back) + LVIS bbox AP, i.e. tuning without the cache;
  cached: NorCal on the cached head outputs + the model's NMS / top-300 + the same AP,
and prints both times and their ratio (the one-time network pass of the cache is printed
apart, with the number of gammas after which the cache has paid for itself). The full path
includes its ONNX Runtime session creation, which a new gamma needs; the cached path gets
one untimed warm-up call.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from norcal.examples import example_dir  # noqa: E402

SYNTH = example_dir()  # images drawn on first use


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16, help="validation images to use (default 16, max 48)")
    ap.add_argument("--gammas", default="0.5,1", help="gammas to time (default 0.5,1)")
    ap.add_argument("--batch", type=int, default=4, help="images per batch, both paths (default 4)")
    args = ap.parse_args()

    import torch

    from norcal.core.calibration.formula import log_prior
    from norcal.evaluation import evaluate, prepare_gt
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model
    from norcal.core.files.onnx_io import save_onnx
    from norcal.runtime.inference import run_images
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
    from norcal.core.calibration.tables import build_table
    from norcal.cli.options import parse_gammas
    from norcal.export.families.detectron2.family import detector_of
    from norcal.workflows.tune import images_from_gt
    from norcal.workflows.tune_cache import cache_images, rescore_images, to_eval_detections

    gammas = parse_gammas(args.gammas)
    table = build_table(SYNTH / "train_annotations.json")
    gt = prepare_gt(SYNTH / "val.json", table)
    pairs = images_from_gt(SYNTH / "val.json", SYNTH / "val")[: args.images]
    ids = [i for i, _ in pairs]
    spec, model = load_model(SYNTH / "model_final.pth", SYNTH / "config.yaml")
    plain = export_detector(model, spec)
    detector = detector_of(spec, model)
    print(f"d2_synth_trained: {len(pairs)} images, batch {args.batch}, gammas {gammas}, "
          f"torch threads {torch.get_num_threads()}")

    t0 = time.perf_counter()
    cache = cache_images(detector, pairs, [None], "exp", args.batch)
    cache_s = time.perf_counter() - t0

    def ap_of(dets):
        return evaluate(gt, to_eval_detections(ids, dets, table.category_ids), "bbox", 300).stats["AP"]

    rescore_images(detector, cache, 0, None, "exp", 16)  # warm-up (lazy initialisation), not timed
    full, cached = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for g in gammas:
            # full re-inference, as tuning without a cache must do it
            t0 = time.perf_counter()
            path = Path(tmp) / f"g{g:g}.onnx"
            save_onnx(calibrate_graph(plain, g, table), path)
            runner = OnnxRuntimeRunner(path)
            dets = [d for _, d in run_images(runner, [p for _, p in pairs], args.batch)]
            ap_full = ap_of(dets)
            full.append(time.perf_counter() - t0)
            # the cached sweep's step
            t0 = time.perf_counter()
            ap_cached = ap_of(rescore_images(detector, cache, 0, log_prior(table.counts(), g), "exp", 16))
            cached.append(time.perf_counter() - t0)
            print(f"gamma {g:g}: full {full[-1]:7.2f} s (AP {100 * ap_full:.2f})   "
                  f"cached {cached[-1]:6.3f} s (AP {100 * ap_cached:.2f})   "
                  f"ratio {full[-1] / cached[-1]:5.1f}x")
    f, c = statistics.mean(full), statistics.mean(cached)
    print(f"per gamma: full re-inference {f:.2f} s, cached sweep {c:.3f} s -> {f / c:.1f}x faster")
    print(f"one-time network pass for the cache: {cache_s:.2f} s ({cache.nbytes / 2**20:.1f} MiB); "
          f"it pays off from {cache_s / max(f - c, 1e-9):.2f} gammas on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
