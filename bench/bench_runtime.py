"""Benchmark: batched ONNX Runtime CPU inference and the host's share of the time.

For batch sizes 1, 2 and 4 (one run, same machine, same images), measures
  images/s end to end (preprocess + ONNX Runtime + postprocess incl. mask paste + RLE),
  host preprocessing (resize, BGR, pad) and postprocessing time per image,
  the host share = (pre + post) / total; the target is <= 10%.

The model is the d2_lvis_tiny fixture exported with norcal.export (needs torch and
norcal.export.rcnn.onnx_export), or any contract model given with --model.

  /work/venv/bin/python bench/bench_runtime.py
  /work/venv/bin/python bench/bench_runtime.py --model model.onnx --images val/ --batches 1,4
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from fixture_files import fixture_dir  # noqa: E402
FIXTURE = fixture_dir("d2_lvis_tiny")


def export_fixture(out: Path) -> Path:
    """The fixture checkpoint exported to ONNX."""
    import onnx

    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model

    spec, model = load_model(FIXTURE / "model_final.pth", FIXTURE / "config.yaml")
    onnx.save(export_detector(model, spec), out)
    return out


def bench(model: Path, image_paths: list[Path], batches: list[int], rounds: int, threads: int | None):
    from norcal.core.contract import Preprocessing, input_spec
    from norcal.runtime.images import read_rgb
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
    from norcal.runtime.postprocess import split_outputs
    from norcal.runtime.preprocess import prepare_batch
    from norcal.runtime.results import detections_to_results

    runner = OnnxRuntimeRunner(model, "cpu", threads=threads)
    spec = input_spec(runner.metadata)
    images = [read_rgb(p) for p in image_paths]
    with_masks = "masks" in runner.output_names
    rows = []
    for bs in batches:
        n = max(bs, len(images)) * rounds
        n = -(-n // bs) * bs  # whole batches only
        pool = [images[i % len(images)] for i in range(n)]
        warm = prepare_batch(pool[:bs], Preprocessing(spec.min_size, spec.max_size, spec.input_format, spec.divisibility))
        runner.infer(warm.feeds())  # first-run allocations are not steady state
        t_pre = t_inf = t_post = 0.0
        dets = 0
        t0 = time.perf_counter()
        for s in range(0, n, bs):
            a = time.perf_counter()
            batch = prepare_batch(pool[s:s + bs], Preprocessing(spec.min_size, spec.max_size, spec.input_format, spec.divisibility))
            b = time.perf_counter()
            outputs = runner.infer(batch.feeds())
            c = time.perf_counter()
            for k, det in enumerate(split_outputs(outputs, batch.image_sizes, batch.original_sizes)):
                dets += len(detections_to_results(s + k, det, None, with_masks))
            d = time.perf_counter()
            t_pre, t_inf, t_post = t_pre + b - a, t_inf + c - b, t_post + d - c
        total = time.perf_counter() - t0
        rows.append({"batch": bs, "images": n, "images_per_s": n / total,
                     "pre_ms_per_image": 1e3 * t_pre / n, "infer_ms_per_image": 1e3 * t_inf / n,
                     "post_ms_per_image": 1e3 * t_post / n, "host_share": (t_pre + t_post) / total,
                     "detections_per_image": dets / n})
    return runner, rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="contract ONNX model (default: export the fixture)")
    p.add_argument("--images", type=Path, default=FIXTURE / "images", help="image folder")
    p.add_argument("--batches", default="1,2,4", help="comma-separated batch sizes (default 1,2,4)")
    p.add_argument("--rounds", type=int, default=1, help="passes over the images per batch size")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: all cores)")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from norcal.runtime.image_files import expand_inputs

    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # keep the table on one line per row in logs
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or export_fixture(Path(tmp) / "d2_lvis_tiny.onnx")
        runner, rows = bench(model, expand_inputs([args.images]),
                             [int(b) for b in args.batches.split(",")], args.rounds, args.threads)
    table = Table("batch", "images", "images/s", "pre ms/img", "infer ms/img", "post ms/img", "host share",
                  "dets/img", title=f"{runner.name}: {model.name}")
    for r in rows:
        share = f"{100 * r['host_share']:.1f}%" + ("" if r["host_share"] <= 0.10 else " (> 10% target)")
        table.add_row(str(r["batch"]), str(r["images"]), f"{r['images_per_s']:.2f}",
                      f"{r['pre_ms_per_image']:.1f}", f"{r['infer_ms_per_image']:.1f}",
                      f"{r['post_ms_per_image']:.1f}", share, f"{r['detections_per_image']:.0f}")
    console.print(table)
    base = rows[0]["images_per_s"]
    console.print("throughput vs batch " + str(rows[0]["batch"]) + ": " +
                  ", ".join(f"batch {r['batch']} x{r['images_per_s'] / base:.2f}" for r in rows))
    if args.json:
        from norcal.core.files.fileio import write_json

        write_json(args.json, {"model": str(model), "runner": runner.name, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
