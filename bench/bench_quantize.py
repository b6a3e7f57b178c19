"""Benchmark: fp32 / fp16 / int8 of the bundled trained Mask R-CNN, baseline and NorCal.

On the d2_synth_trained example (norcal/examples): exports the checkpoint once, inserts NorCal
at the demo's gamma, and makes each model's fp16 variant and int8 variants (Q/DQ, calibrated
on the training-subset images, never on the validation images): int8-trt (TensorRT's form,
what `norcal build --int8` takes), int8-ort (ONNX Runtime's form, `--form ort`: QLinearConv /
QGemm kernels on CPU) and int8-ort+mh (the same with the mask head's convolutions int8,
`--int8-mask-head`). All run through ONNX Runtime (CPU, --threads intra-op threads) on the
validation images in this one process, interleaved image by image (--repeats times) so that
the machine's load falls on all of them alike, and are evaluated with LVIS box AP (--segm:
mask AP too). Prints per model AP / APr / APc / APf, the latency ratio to the fp32 model of
the same setting (median of the per-image ratios), and NorCal's APr gain over the baseline at
each precision: does it survive quantization?

--fullsize MODEL.onnx: latency only, on another fp32 export (e.g. a full-size R50-FPN): its
int8 variants (calibrated on the example's training images, prepared at the
model's own resize) against it on the example's validation images.

  .venv/bin/python bench/bench_quantize.py
  .venv/bin/python bench/bench_quantize.py --gamma 0.8 --calibration-images 120 --json q.json
  .venv/bin/python bench/bench_quantize.py --calibration-images 8 --profile   # where the time goes
  .venv/bin/python bench/bench_quantize.py --fullsize r50_fpn.onnx --calibration-images 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PRECISIONS = ("fp32", "fp16", "int8-trt", "int8-ort", "int8-ort+mh")
INT8 = {"int8-trt": dict(form="tensorrt"), "int8-ort": dict(form="ort"),
        "int8-ort+mh": dict(form="ort", mask_head=True)}
METRICS = ("AP", "APr", "APc", "APf")


def variants(fp32, cal_paths, precisions, say, setting=""):
    """{precision: model} for one fp32 model: itself, fp16, the int8 forms asked for."""
    from norcal.core.contract import input_spec
    from norcal.export.graph.quantize import convert_fp16, quantize_int8
    from norcal.runtime.images import iter_images
    from norcal.runtime.inference import prepared_batches

    meta = {p.key: p.value for p in fp32.metadata_props}
    out = {"fp32": fp32}
    for prec in precisions:
        t0 = time.perf_counter()
        if prec == "fp16":
            out[prec] = convert_fp16(fp32)
        elif prec in INT8:
            feeds = (b.feeds() for b in prepared_batches(iter_images(cal_paths), input_spec(meta), 1))
            out[prec], n = quantize_int8(fp32, feeds, **INT8[prec])
            say(f"{setting} {prec}: {n} calibration images, {time.perf_counter() - t0:.1f} s")
    return out


def build_models(gamma: float, n_cal: int, say, precisions=PRECISIONS):
    from norcal.core.calibration.tables import build_table
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model
    from norcal.workflows.demo import FIXTURE_NAME, default_data_dir

    d = default_data_dir()
    table = build_table(d / "train_annotations.json", name=f"{FIXTURE_NAME}_train")
    spec, torch_model = load_model(d / "model_final.pth", d / "config.yaml")
    plain = export_detector(torch_model, spec)
    cal_paths = sorted((d / "train_subset").glob("*.png"))[:n_cal]
    models = {}
    for setting, fp32 in (("baseline", plain), (f"NorCal g={gamma:g}", calibrate_graph(plain, gamma, table))):
        models[setting] = variants(fp32, cal_paths, precisions, say, setting)
    return d, table, spec, models


def run(models, d, table, spec, out_dir: Path, say, threads: int = 2, repeats: int = 3, segm: bool = False):
    import numpy as np

    from norcal.core.contract import input_spec
    from norcal.core.files.fileio import read_json
    from norcal.core.files.onnx_io import save_onnx
    from norcal.evaluation import evaluate, prepare_gt
    from norcal.runtime.images import read_rgb
    from norcal.runtime.inference import prepare
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
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
            runners[(setting, prec)] = OnnxRuntimeRunner(path, threads=threads)
    spec_in = input_spec(next(iter(runners.values())).metadata)
    batches = [(image_id, prepare([read_rgb(p)], spec_in)) for image_id, p in pairs]
    seconds = timed_runs(runners, [b.feeds() for _, b in batches], repeats)
    results = {k: [] for k in runners}
    for image_id, batch in batches:
        for key, r in runners.items():
            det = split_outputs(r.infer(batch.feeds()), batch.image_sizes, batch.original_sizes)[0]
            results[key].extend(detections_to_results(image_id, det, table.category_ids, with_masks=segm))
    rows = {}
    for key in runners:
        stats = evaluate(gt, results[key], "bbox", spec.detections_per_image).stats
        rows[key] = {"stats": {m: float(stats[m]) for m in METRICS},
                     **latency(seconds[key], seconds[(key[0], "fp32")])}
        if segm:
            rows[key]["mask_AP"] = float(evaluate(gt, results[key], "segm", spec.detections_per_image).stats["AP"])
    say(f"ran {len(runners)} models on {len(batches)} validation images, {repeats} times")
    return rows


def timed_runs(runners, feeds, repeats: int):
    """{key: [seconds]}: every model on every input, interleaved input by input, ``repeats`` times."""
    for r in runners.values():  # first-run allocations are not steady state
        r.infer(feeds[0])
    seconds = {k: [] for k in runners}
    for _ in range(repeats):
        for f in feeds:
            for key, r in runners.items():
                t0 = time.perf_counter()
                r.infer(f)
                seconds[key].append(time.perf_counter() - t0)
    return seconds


def latency(seconds, base) -> dict:
    """Median of the per-run ratios to the same input's fp32 run, and the median seconds."""
    import numpy as np

    return {"latency_ratio": float(np.median(np.array(seconds) / np.array(base))),
            "seconds_per_image": float(np.median(seconds))}


def kernel_ops(model, feeds) -> dict[str, int]:
    """How many nodes of each int8 kernel ONNX Runtime's CPU provider runs (its profiler, one run)."""
    import collections
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        path.write_bytes(model.SerializeToString())
        opts = ort.SessionOptions()
        opts.enable_profiling, opts.profile_file_prefix = True, str(Path(tmp) / "p")
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    nodes = collections.defaultdict(set)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            nodes[e["args"]["op_name"]].add(e["name"])
    return {op: len(nodes[op]) for op in ("QLinearConv", "QGemm", "ConvInteger", "MatMulInteger",
                                          "QLinearMatMul", "Conv", "FusedConv") if nodes[op]}


def fullsize(path: Path, n_cal: int, threads: int, repeats: int, say) -> None:
    """Latency of another fp32 export's int8 forms, on the example's validation images."""
    from norcal.core.contract import input_spec
    from norcal.core.files.onnx_io import load_onnx, save_onnx
    from norcal.runtime.images import read_rgb
    from norcal.runtime.inference import prepare
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
    from norcal.workflows.demo import default_data_dir

    import tempfile

    d = default_data_dir()
    fp32 = load_onnx(path)
    models = variants(fp32, sorted((d / "train_subset").glob("*.png"))[:n_cal], list(INT8), say)
    spec = input_spec({p.key: p.value for p in fp32.metadata_props})
    feeds = [prepare([read_rgb(p)], spec).feeds() for p in sorted((d / "val").glob("*.png"))[:6]]
    with tempfile.TemporaryDirectory() as tmp:
        runners = {}
        for prec, model in models.items():
            save_onnx(model, Path(tmp) / f"{prec}.onnx")
            runners[prec] = OnnxRuntimeRunner(Path(tmp) / f"{prec}.onnx", threads=threads)
        seconds = timed_runs(runners, feeds, repeats)
    for prec in models:
        row = latency(seconds[prec], seconds["fp32"])
        print(f"{path.name} {prec:<12}{row['seconds_per_image']:8.3f} s/image{row['latency_ratio']:8.2f}x"
              + (f"  kernels: {kernel_ops(models[prec], feeds[0])}" if prec != "fp32" else ""))


def op_shares(models, d, images: int = 6) -> dict[str, list[tuple[str, float]]]:
    """ONNX Runtime's profiler on the baseline's models: each op type's share of kernel time."""
    import collections
    import tempfile

    import onnxruntime as ort

    from norcal.core.contract import input_spec
    from norcal.core.files.onnx_io import save_onnx
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
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes over the images (default 3)")
    p.add_argument("--precisions", default=",".join(PRECISIONS[1:]),
                   help=f"variants besides fp32, comma-separated (default {','.join(PRECISIONS[1:])})")
    p.add_argument("--segm", action="store_true", help="also mask AP (pastes and encodes every mask)")
    p.add_argument("--fullsize", metavar="MODEL.onnx", help="latency only, on this fp32 export (see above)")
    args = p.parse_args(argv)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    if args.fullsize:
        fullsize(Path(args.fullsize), args.calibration_images, args.threads, args.repeats, say)
        return 0
    precisions = [x for x in args.precisions.split(",") if x]
    d, table, spec, models = build_models(args.gamma, args.calibration_images, say, precisions)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(models, d, table, spec, Path(tmp), say, args.threads, args.repeats, args.segm)
    settings = list(models)
    print(f"{'setting':<16}{'precision':<13}" + "".join(f"{m:>8}" for m in METRICS)
          + (f"{'maskAP':>8}" if args.segm else "") + f"{'latency/fp32':>14}{'s/image':>9}")
    for (setting, prec), row in rows.items():
        print(f"{setting:<16}{prec:<13}" + "".join(f"{100 * row['stats'][m]:8.2f}" for m in METRICS)
              + (f"{100 * row['mask_AP']:8.2f}" if args.segm else "")
              + f"{row['latency_ratio']:13.2f}x{row['seconds_per_image']:9.3f}")
    gains = {prec: 100 * (rows[(settings[1], prec)]["stats"]["APr"] - rows[(settings[0], prec)]["stats"]["APr"])
             for prec in ["fp32", *precisions]}
    print("NorCal's APr gain: " + ", ".join(f"{prec} {g:+.2f}" for prec, g in gains.items()))
    print(f"(box AP in %, LVIS evaluation of the validation images; latency: median per-image ratio "
          f"to the same setting's fp32 model, ONNX Runtime CPU, {args.threads} threads, batch 1, "
          f"{args.repeats} passes; {time.perf_counter() - t0:.0f} s)")
    from norcal.core.contract import input_spec
    from norcal.runtime.images import read_rgb
    from norcal.runtime.inference import prepare

    fp32 = models[settings[1]]["fp32"]
    feeds = prepare([read_rgb(sorted((d / "val").glob("*.png"))[0])],
                    input_spec({p.key: p.value for p in fp32.metadata_props})).feeds()
    for prec in precisions:
        if prec.startswith("int8"):
            print(f"{prec} nodes run per kernel (ONNX Runtime profiler, one image): "
                  f"{kernel_ops(models[settings[1]][prec], feeds)}")
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
