"""Benchmark: fp32 / fp16 / int8 of the bundled trained Mask R-CNN, baseline and NorCal.

On the d2_synth_trained example (norcal/examples): exports the checkpoint once, inserts NorCal
at the demo's gamma, and makes each model's fp16 variant and int8 variant (Q/DQ, calibrated on
the training-subset images, never on the validation images). All six run through ONNX Runtime
(CPU) on the validation images in this one process, interleaved image by image so that the
machine's load falls on all of them alike, and are evaluated with LVIS box AP. Prints per
model AP / APr / APc / APf, the latency ratio to the fp32 model of the same setting (median
of the per-image ratios), and NorCal's APr gain over the baseline at each precision: does it
survive quantization?

  .venv/bin/python bench/bench_quantize.py
  .venv/bin/python bench/bench_quantize.py --gamma 0.8 --calibration-images 120 --json q.json
  .venv/bin/python bench/bench_quantize.py --calibration-images 8 --profile   # where the time goes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PRECISIONS = ("fp32", "fp16", "int8")
METRICS = ("AP", "APr", "APc", "APf")


def build_models(gamma: float, n_cal: int, say):
    from norcal.core.tables import build_table
    from norcal.export.calibrate_onnx import calibrate_onnx
    from norcal.export.detector import export_detector, load_detector
    from norcal.export.quantize import convert_fp16, quantize_int8
    from norcal.runtime.images import iter_images
    from norcal.runtime.inference import prepared_batches
    from norcal.core.contract import input_spec
    from norcal.workflows.demo import FIXTURE_NAME, default_data_dir

    d = default_data_dir()
    table = build_table(d / "train_annotations.json", name=f"{FIXTURE_NAME}_train")
    spec, torch_model = load_detector(d / "model_final.pth", d / "config.yaml")
    plain = export_detector(torch_model, spec)
    cal_paths = sorted((d / "train_subset").glob("*.png"))[:n_cal]
    models = {}
    for setting, fp32 in (("baseline", plain), (f"NorCal g={gamma:g}", calibrate_onnx(plain, gamma, table))):
        t0 = time.perf_counter()
        meta = {p.key: p.value for p in fp32.metadata_props}
        feeds = (b.feeds() for b in prepared_batches(iter_images(cal_paths), input_spec(meta), 1))
        int8, n = quantize_int8(fp32, feeds)
        models[setting] = {"fp32": fp32, "fp16": convert_fp16(fp32), "int8": int8}
        say(f"{setting}: fp16 and int8 ({n} calibration images) made in {time.perf_counter() - t0:.1f} s")
    return d, table, spec, models


def run(models, d, table, spec, out_dir: Path, say):
    import numpy as np

    from norcal.core.contract import input_spec
    from norcal.core.fileio import read_json
    from norcal.core.onnx_io import save_onnx
    from norcal.evaluation import evaluate, prepare_gt
    from norcal.runtime.images import read_rgb
    from norcal.runtime.inference import prepare
    from norcal.runtime.onnxruntime_runner import OnnxRuntimeRunner
    from norcal.runtime.postprocess import split_outputs
    from norcal.runtime.results import detections_to_results
    from norcal.workflows.tune import images_from_gt

    gt_data = read_json(d / "val.json", "GT")
    gt = prepare_gt(gt_data, table)
    pairs = images_from_gt(gt_data, d / "val", str(d / "val.json"))
    runners = {}
    for setting, by_prec in models.items():
        for prec, model in by_prec.items():
            path = out_dir / f"{setting.split()[0].lower()}_{prec}.onnx"
            save_onnx(model, path)
            runners[(setting, prec)] = OnnxRuntimeRunner(path)
    spec_in = input_spec(next(iter(runners.values())).metadata)
    batches = [(image_id, prepare([read_rgb(p)], spec_in)) for image_id, p in pairs]
    for r in runners.values():  # first-run allocations are not steady state
        r.infer(batches[0][1].feeds())
    seconds = {k: [] for k in runners}
    results = {k: [] for k in runners}
    for image_id, batch in batches:
        for key, r in runners.items():
            t0 = time.perf_counter()
            out = r.infer(batch.feeds())
            seconds[key].append(time.perf_counter() - t0)
            det = split_outputs(out, batch.image_sizes, batch.original_sizes)[0]
            results[key].extend(detections_to_results(image_id, det, table.category_ids))
    rows = {}
    for key in runners:
        stats = evaluate(gt, results[key], "bbox", spec.detections_per_image).stats
        base = np.array(seconds[(key[0], "fp32")])
        rows[key] = {"stats": {m: float(stats[m]) for m in METRICS},
                     "latency_ratio": float(np.median(np.array(seconds[key]) / base)),
                     "seconds_per_image": float(np.median(seconds[key]))}
    say(f"ran {len(runners)} models on {len(batches)} validation images")
    return rows


def op_shares(models, d, images: int = 6) -> dict[str, list[tuple[str, float]]]:
    """ONNX Runtime's profiler on the baseline's models: each op type's share of kernel time."""
    import collections
    import tempfile

    import onnxruntime as ort

    from norcal.core.contract import input_spec
    from norcal.core.onnx_io import save_onnx
    from norcal.runtime.images import read_rgb
    from norcal.runtime.inference import prepare

    out = {}
    paths = sorted((d / "val").glob("*.png"))[:images]
    with tempfile.TemporaryDirectory() as tmp:
        for prec, model in next(iter(models.values())).items():
            path = Path(tmp) / f"{prec}.onnx"
            save_onnx(model, path)
            opts = ort.SessionOptions()
            opts.enable_profiling, opts.profile_file_prefix = True, str(Path(tmp) / prec)
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            spec = input_spec({p.key: p.value for p in model.metadata_props})
            for p in paths:
                sess.run(None, prepare([read_rgb(p)], spec).feeds())
            events = json.loads(Path(sess.end_profiling()).read_text())
            per_op = collections.Counter()
            for e in events:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                    per_op[e["args"]["op_name"]] += e["dur"]
            total = sum(per_op.values())
            out[prec] = [(op, t / total) for op, t in per_op.most_common(6)]
    return out


def main(argv=None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gamma", type=float, default=0.8, help="NorCal gamma (default 0.8, the demo's tuned one)")
    p.add_argument("--calibration-images", type=int, default=120,
                   help="int8: the first N training-subset images calibrate (default all 120)")
    p.add_argument("--profile", action="store_true",
                   help="also print each op type's share of ONNX Runtime's kernel time (baseline models)")
    p.add_argument("--json", help="write the rows as JSON")
    args = p.parse_args(argv)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    d, table, spec, models = build_models(args.gamma, args.calibration_images, say)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(models, d, table, spec, Path(tmp), say)
    settings = list(models)
    print(f"{'setting':<16}{'precision':<10}" + "".join(f"{m:>8}" for m in METRICS) + f"{'latency/fp32':>14}")
    for (setting, prec), row in rows.items():
        print(f"{setting:<16}{prec:<10}" + "".join(f"{100 * row['stats'][m]:8.2f}" for m in METRICS)
              + f"{row['latency_ratio']:13.2f}x")
    gains = {prec: 100 * (rows[(settings[1], prec)]["stats"]["APr"] - rows[(settings[0], prec)]["stats"]["APr"])
             for prec in PRECISIONS}
    print("NorCal's APr gain: " + ", ".join(f"{prec} {g:+.2f}" for prec, g in gains.items()))
    print(f"(box AP in %, LVIS evaluation of the validation images; latency: median per-image ratio "
          f"to the same setting's fp32 model, ONNX Runtime CPU, batch 1; {time.perf_counter() - t0:.0f} s)")
    if args.profile:
        for prec, shares in op_shares(models, d).items():
            print(f"{prec} kernel time: " + ", ".join(f"{op} {100 * f:.0f}%" for op, f in shares))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"gamma": args.gamma, "calibration_images": args.calibration_images, "apr_gain": gains,
             "rows": [{"setting": s, "precision": pr, **row} for (s, pr), row in rows.items()]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
