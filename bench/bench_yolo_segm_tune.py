"""Tune's segm re-scoring speed on a YOLO segment model against its box re-scoring, and both
against what ``norcal infer`` spends after the network on the same images: each gamma's
re-scored detections, with their masks pasted and RLE-encoded for segm (what `norcal tune
--iou-type segm` does per gamma; its gammas share one memo of the cache's masks, as tune's sweep
does), and infer's decode of the exported graph calibrated at one of the gammas, to results
JSON text with and without masks.

    python bench/bench_yolo_segm_tune.py [--images 4] [--imgsz 640] [--repeat 3] [--gammas 0,0.5,1,1.5,2]
                                         [--infer-gamma 0.5] [--no-memo]

A YOLO11n-seg built from Ultralytics' yaml offline (random weights, class biases raised as the
tests' checkpoints have them, so it detects: 300 detections per image at the 0.001 threshold),
the d2_lvis_tiny images, the tests' calibration table (tune's priors: its log prior at each
gamma); the cache is made once (untimed), then each repeat times the sweep over --gammas
(bbox: rescore_gamma(masks=False); segm: masks=True, one memo per repeat; decode: the family's
re-scoring alone) and prints the medians per gamma, and segm's ratio to bbox.

Infer: the checkpoint exported and calibrated at --infer-gamma, run by the runner ``norcal
infer`` opens, one batch of the images; timed per repeat: the whole graph, the network alone
(the head's ONNX Runtime session tune's cache runs, traced from the code the export traces), the
host's split to per-image detections and ``results_fragment`` (what infer writes per image) with
and without masks. Infer's decode in the graph is the whole graph's median less the network's.
The ratios printed: tune's per gamma cost over infer's cost after the network (in-graph decode +
host), for segm (with masks) and bbox.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _median_time(fn, repeat: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def _runs(times) -> str:
    return ", ".join(f"{x:.3f}" for x in times)


def _infer_costs(det, table: Path, gamma: float, paths, repeat: int, tmp: Path) -> dict:
    """Seconds (medians) infer spends on one batch of ``paths`` with the export calibrated at
    ``gamma``: graph, network, host split, results with masks, results without; and the
    detections it gives."""
    from norcal.core.contract import MASK_PASTE, input_spec, mask_paste
    from norcal.runtime.images import read_rgb
    from norcal.runtime.inference import prepare, runner_metadata
    from norcal.runtime.postprocess import split_outputs
    from norcal.runtime.results import results_fragment
    from norcal.runtime.runners import open_runner
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    onnx_path = tmp / "seg.norcal.onnx"
    onnx_path.write_bytes(calibrate_onnx(det.export(None), NorCal(gamma=gamma, table=str(table))).SerializeToString())
    runner = open_runner(onnx_path)
    meta = runner_metadata(runner)
    batch = prepare([read_rgb(p) for p in paths], input_spec(meta))
    feeds = batch.feeds()
    paste = mask_paste(meta) if MASK_PASTE in meta else batch.mask_paste
    outputs = runner.infer(feeds)  # warm-up
    det._head_outputs(batch.images)

    def split():
        return split_outputs(outputs, batch.image_sizes, batch.original_sizes, batch.keep_empty_boxes, paste,
                             batch.clip_boxes)

    dets = split()
    cats = list(range(1, det.num_classes + 1))
    out = {"detections": sum(len(d) for d in dets)}
    out["graph"] = _median_time(lambda: runner.infer(feeds), repeat)
    out["network"] = _median_time(lambda: det._head_outputs(batch.images), repeat)
    out["split"] = _median_time(split, repeat)
    for key, masks in (("segm", True), ("bbox", False)):
        out[key] = _median_time(lambda: [results_fragment(i, d, cats, masks) for i, d in enumerate(dets)], repeat)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4, help="images (default 4, max 4)")
    ap.add_argument("--imgsz", type=int, default=640, help="letterbox size (default 640)")
    ap.add_argument("--repeat", type=int, default=3, help="timed repeats (default 3)")
    ap.add_argument("--gammas", default="0,0.5,1,1.5,2", help="gammas of the sweep (default 0,0.5,1,1.5,2)")
    ap.add_argument("--infer-gamma", type=float, default=0.5, help="infer's gamma, one of --gammas (default 0.5)")
    ap.add_argument("--no-memo", action="store_true", help="every gamma pastes all its masks (no memo)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import fixture_store

    fixture_store.materialize()  # the fixtures' images, as the tests' conftest makes them
    from yolo_models import IMAGES, make_checkpoint, write_table  # sets YOLO_OFFLINE

    from norcal.core.calibration.formula import log_prior
    from norcal.export.families import load_detector
    from norcal.runtime.postprocess import split_outputs
    from norcal.workflows.tune_cache import cache_images, rescore_gamma

    gammas = [float(g) for g in args.gammas.split(",")]
    if args.infer_gamma not in gammas:
        ap.error(f"--infer-gamma {args.infer_gamma} is not one of --gammas {args.gammas}")
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "seg.pt"
        make_checkpoint(ckpt, "yolo11n-seg.yaml", imgsz=args.imgsz)
        det = load_detector(ckpt)
        table, counts = write_table(Path(tmp) / "table.json", det.num_classes)
        images = [(i + 1, p) for i, p in enumerate(IMAGES[:args.images])]
        priors = [None if g == 0 else log_prior(counts, g, background="none") for g in gammas]
        cache = cache_images(det, images, priors, batch_size=len(images), with_masks=True)
        cats = list(range(1, det.num_classes + 1))
        at = gammas.index(args.infer_gamma)
        head = f"{len(images)} images at {args.imgsz}, {len(gammas)} gammas"
        per_gamma, counted = {}, {}
        for kind in ("bbox", "segm", "decode"):
            times = []
            for _ in range(args.repeat):
                memo: dict = {}
                t = time.perf_counter()
                for k, prior in enumerate(priors):
                    if kind == "decode":  # the family's re-scoring and the host's split, no results
                        out = split_outputs(det.rescore(cache, k, prior, "exp", len(images)), cache.image_sizes,
                                            cache.original_sizes, cache.keep_empty_boxes, cache.mask_paste,
                                            cache.clip_boxes)
                    else:
                        out = rescore_gamma(det, cache, k, prior, "exp", len(images), cats, masks=kind == "segm",
                                            **({} if args.no_memo else {"mask_memo": memo}))
                        counted[kind] = len(out) if k == at else counted.get(kind)
                times.append((time.perf_counter() - t) / len(gammas))
            per_gamma[kind] = statistics.median(times)
            print(f"{head}: tune {kind} re-scoring per gamma median {per_gamma[kind]:.3f} s (runs {_runs(times)})")
        print(f"tune segm / bbox: {per_gamma['segm'] / per_gamma['bbox']:.2f} x")
        inf = _infer_costs(det, table, args.infer_gamma, [p for _, p in images], args.repeat, Path(tmp))
        print(f"infer at gamma {args.infer_gamma}: {inf['detections']} detections "
              f"(tune's re-scoring at that gamma: {counted['bbox']})")
        for key in ("graph", "network", "split", "segm", "bbox"):
            name = {"segm": "results with masks", "bbox": "results without masks"}.get(key, key)
            print(f"  infer {name}: median {inf[key][0]:.3f} s (runs {_runs(inf[key][1])})")
        decode = max(inf["graph"][0] - inf["network"][0], 0.0)
        print(f"  infer decode in the graph (graph - network): {decode:.3f} s")
        for kind in ("segm", "bbox"):
            after = decode + inf["split"][0] + inf[kind][0]
            print(f"{kind}: tune per gamma {per_gamma[kind]:.3f} s / infer after the network {after:.3f} s = "
                  f"{per_gamma[kind] / after:.2f} x")
        masks_tune = per_gamma["segm"] - per_gamma["bbox"]
        masks_infer = inf["segm"][0] - inf["bbox"][0]
        print(f"masks alone: tune {masks_tune:.3f} s per gamma / infer {masks_infer:.3f} s = "
              f"{masks_tune / masks_infer:.2f} x; decode alone: tune {per_gamma['decode']:.3f} s per gamma / "
              f"infer {decode + inf['split'][0]:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
