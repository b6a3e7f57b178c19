"""Benchmark: `norcal infer --ray` throughput with 1 and 2 workers, and what Ray's data path
adds per image, against a single process doing the same work in the same run.

Work per image, the same in every mode: read, prepare (resize, BGR, pad), ONNX Runtime
(1 intra-op thread), results JSON text (mask paste + RLE). Reported:
  single process: images/s; the model's time per image (runner.infer alone);
  Ray, 1 and 2 workers: images/s in steady state (from the first image out to the last;
    the start, when Ray launches its workers and each loads the model, is shown apart);
  Ray's data-path overhead per image = Ray 1-worker steady time per image - single-process
    time per image, as a share of the model's time (target <= 10%). With 1 worker Ray reads
    and prepares in separate tasks, so overlap can make it negative.

Default: the bundled example's Mask R-CNN (exported here; needs torch) over its 48 validation
images, batch 2, on a local Ray instance with 2 CPUs. On a real cluster, start Ray there
(`ray start --head` on one node, `ray start --address HEAD:6379` on the others) and pass its
address; the model and the images must be at the same paths on every node:

  .venv/bin/python bench/bench_ray.py
  .venv/bin/python bench/bench_ray.py --model model.onnx --images val/ --workers 1,2,8 \\
      --ray ray://head:10001 --provider cuda --gpus-per-worker 1
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from norcal.examples import example_dir  # noqa: E402

EXAMPLE = example_dir()  # images drawn on first use


def export_example(out: Path) -> Path:
    import onnx

    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model

    spec, model = load_model(EXAMPLE / "model_final.pth", EXAMPLE / "config.yaml")
    onnx.save(export_detector(model, spec), out)
    return out


def single_process(model: Path, paths: list[Path], batch: int, provider: str) -> tuple[float, float, int]:
    """(seconds, seconds inside runner.infer, detections) for the whole list, one process."""
    from norcal.core.contract import input_spec
    from norcal.runtime.inference import prepared_batches
    from norcal.runtime.images import iter_images
    from norcal.runtime.postprocess import split_outputs
    from norcal.runtime.results import results_fragment
    from norcal.runtime.runners import open_runner

    runner = open_runner(model, provider, 1)
    spec = input_spec(runner.metadata)
    with_masks = "masks" in runner.output_names
    warm = next(prepared_batches(iter_images(paths[:batch]), spec, batch))
    runner.infer(warm.feeds())  # first-run allocations are not steady state
    t_model, dets, i = 0.0, 0, 0
    t0 = time.perf_counter()
    for b in prepared_batches(iter_images(paths), spec, batch):
        t1 = time.perf_counter()
        out = runner.infer(b.feeds())
        t_model += time.perf_counter() - t1
        for det in split_outputs(out, b.image_sizes, b.original_sizes):
            dets += results_fragment(i, det, None, with_masks)[1]
            i += 1
    return time.perf_counter() - t0, t_model, dets


def on_ray(model: Path, paths: list[Path], batch: int, provider: str, workers: int, options):
    """(seconds to the first image, steady seconds per image after it, detections)."""
    from dataclasses import replace

    from norcal.core.contract import input_spec
    from norcal.runtime.ray_inference import ResultsFormat, run_images_ray
    from norcal.runtime.runners import open_runner

    meta_runner = open_runner(model, "cpu", 1)
    spec = input_spec(meta_runner.metadata)
    fmt = ResultsFormat(None, "masks" in meta_runner.output_names)
    make = functools.partial(open_runner, model, provider, 1)
    stamps, dets = [], 0
    t0 = time.perf_counter()
    for image in run_images_ray(make, paths, list(range(len(paths))), spec, fmt, batch,
                                replace(options, num_workers=workers)):
        stamps.append(time.perf_counter())
        dets += image.count
    # steady state: from the first batch out to the last image (the first batch's own time is
    # in "first")
    steady = (stamps[-1] - stamps[batch - 1]) / max(len(paths) - batch, 1)
    return stamps[0] - t0, steady, dets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a contract ONNX model (default: the bundled example, exported)")
    ap.add_argument("--images", help="folder of images (default: the bundled example's val/)")
    ap.add_argument("--count", type=int, default=48, help="images to run (the folder repeated if short)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--workers", default="1,2", help="comma list of worker counts (default 1,2)")
    ap.add_argument("--provider", default="cpu", choices=("cpu", "cuda", "tensorrt"))
    ap.add_argument("--gpus-per-worker", type=float, default=0.0)
    ap.add_argument("--ray", metavar="ADDRESS", help="an existing cluster ('auto', ray://HOST:10001); "
                                                      "default: a local instance with --cpus CPUs")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local instance (default 2)")
    args = ap.parse_args(argv)

    import ray

    from norcal.runtime.image_files import expand_inputs
    from norcal.runtime.ray_inference import RayOptions

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else export_example(Path(tmp) / "example.onnx")
        found = expand_inputs([args.images or EXAMPLE / "val"])
        paths = [found[i % len(found)].resolve() for i in range(args.count)]
        options = RayOptions(address=args.ray, gpus_per_worker=args.gpus_per_worker, threads=1)
        if args.ray:
            ray.init(address=args.ray, include_dashboard=False)
        else:
            ray.init(num_cpus=args.cpus, object_store_memory=500 * 2**20, include_dashboard=False)
        try:
            n = len(paths)
            print(f"{n} images, batch {args.batch}, {args.provider}, 1 thread per runner; model {model.name}")
            total, t_model, dets = single_process(model, paths, args.batch, args.provider)
            rays = {}
            for w in (int(x) for x in args.workers.split(",")):
                first, steady, d = on_ray(model, paths, args.batch, args.provider, w, options)
                assert d == dets, f"Ray found {d} detections, the single process {dets}"
                rays[w] = (first, steady)
            # the single process again: on a shared machine the load drifts; keep its faster run
            again = single_process(model, paths, args.batch, args.provider)
            print(f"single process: {n / total:6.2f} and {n / again[0]:6.2f} images/s (before and after "
                  f"the Ray runs; model {1e3 * t_model / n:.0f} and {1e3 * again[1] / n:.0f} ms/image)")
            total, t_model = min((total, t_model), again[:2])
            steady1 = rays.get(1, (None, None))[1]
            for w, (first, steady) in rays.items():
                ratio = f"; {steady1 / steady:.2f}x 1 worker" if steady1 and w != 1 else ""
                print(f"Ray, {w} worker{'s' if w > 1 else ' '}: {1 / steady:6.2f} images/s steady "
                      f"({1e3 * steady:.0f} ms/image; first image after {first:.1f} s){ratio}; "
                      f"{total / n / steady:.2f}x the single process's throughput")
            if steady1 is not None:
                overhead = steady1 - total / n
                print(f"Ray data-path overhead per image (1 worker - single process): "
                      f"{1e3 * overhead:+.1f} ms = {100 * overhead / (t_model / n):+.1f}% of the model's "
                      f"time (target <= 10%)")
            print(f"load average now: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
                  f"on {os.cpu_count()} cores")
        finally:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
