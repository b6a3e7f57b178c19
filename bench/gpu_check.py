"""GPU check: our PyTorch detectors on CUDA against their NorCal ONNX exports run by ONNX Runtime
on the CPU (and by every other execution provider the machine's onnxruntime offers), the same
images, judged by the parity presets; then each CUDA model alone vs in a padded batch; then the
RTX-engine step (bench/gpu_check_rtx.py): TensorRT for RTX engines built ahead of time where its
package is installed and run where the GPU is RTX-class (else one line says why not).

usage: bench/gpu_check.sh [--device cuda] [--models lvis,cascade,...] [--images N] [--no-rtx]

Models: the five detectron2 fixtures (R50-FPN Mask R-CNN, Cascade, C4, DC5, RetinaNet at
LVIS's 1203 classes) and the bundled trained Mask R-CNN (60 classes, 8 validation images), each
exported with a NorCal node (gamma 0.5, the fixture's counts) and the PyTorch model given the
same prior. TF32 is off, so the fp32 preset judges CUDA. Prints one table (and the RTX step's
lines); exit 1 if a row or the RTX step fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_files import TESTS, fixture_dir  # noqa: E402
from gpu_check_rtx import rtx_step  # noqa: E402

MODELS = {"lvis": "d2_lvis_tiny", "cascade": "d2_cascade_tiny", "c4": "d2_c4_tiny",
          "dc5": "d2_dc5_tiny", "retinanet": "d2_retinanet_tiny", "synth": "d2_synth_trained"}
GAMMA = 0.5


def _model_inputs(name: str, max_images: int):
    """(weights, config, table, image paths) of one model."""
    from norcal.core.calibration.tables import build_table
    from norcal.examples import example_dir

    if name == "d2_synth_trained":
        d = example_dir()
        images = sorted((d / "val").glob("*.png"))[:max_images]
        return d / "model_final.pth", d / "config.yaml", build_table(d / "train_annotations.json"), images
    d = fixture_dir(name)
    sys.path.insert(0, str(TESTS))
    from golden import manifest_table

    from norcal.core.calibration.tables import load_table

    # d2_lvis_tiny's NorCal settings used LVIS v1's own counts (its README), the others their manifest's
    table = load_table("lvis_v1") if name == "d2_lvis_tiny" else manifest_table(d)
    return d / "model_final.pth", d / "config.yaml", table, sorted((d / "images").glob("*.png"))[:max_images]


def _row(model: str, rep, seconds: dict[str, float], what: str) -> list[str]:
    det = rep.detections
    return [model, what, rep.precision, f"{det.images}", f"{det.reference_count}/{det.candidate_count}",
            f"{100 * det.matched_fraction:.1f}%", f"{det.max_score_diff:.1e}", f"{det.max_box_diff:.1e}",
            f"{seconds[rep.reference]:.2f}/{seconds[rep.candidate]:.2f}", "PASS" if rep.passed else "FAIL"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="torch device of the PyTorch model (default cuda)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--images", type=int, default=8, help="images per model (fixtures have 3-4)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--no-rtx", action="store_true", help="leave out the RTX-engine step")
    args = ap.parse_args()

    import onnxruntime as ort
    import torch
    from rich.console import Console
    from rich.table import Table

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    console = Console(width=160)
    dev = torch.device(args.device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    console.print(f"torch {torch.__version__} on {gpu}; onnxruntime {ort.__version__}, providers "
                  f"{', '.join(ort.get_available_providers())}")
    table = Table(title=f"PyTorch ({args.device}) vs ONNX Runtime, NorCal gamma {GAMMA}, batch {args.batch}")
    for col in ("model", "comparison", "preset", "images", "detections ref/cand", "paired",
                "max |d score|", "max |d box| px", "seconds ref/cand", "verdict"):
        table.add_column(col)
    failed = 0
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models.split(","):
            name = MODELS[key.strip()]
            t0 = time.perf_counter()
            try:
                failed += _check(key, name, args, dev, table, console, tmp)
            except Exception:  # one model's failure must not hide the others' figures
                failed += 1
                console.print(f"{key}: [red]error[/red]\n{traceback.format_exc()}")
                table.add_row(key, "error (see above)", *[""] * 7, "FAIL")
            console.print(f"{key}: {time.perf_counter() - t0:.1f} s")
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    console.print(table)
    if not args.no_rtx:
        failed += rtx_step(args.device, say=lambda line: console.print(line, markup=False, highlight=False))
    console.print(f"{failed} failed, {time.perf_counter() - t_all:.0f} s in all")
    return 1 if failed else 0


def _check(key, name, args, dev, table, console, tmp) -> int:
    """One model's rows; the number of failed rows."""
    import onnxruntime as ort

    from norcal.core.files.onnx_io import save_onnx
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model
    from norcal.export.pytorch.runner import TorchRunner, onnx_calibration
    from norcal.runtime.images import read_rgb
    from norcal.runtime.backends.onnxruntime.runner import PROVIDERS, OnnxRuntimeRunner
    from norcal.workflows.parity import run_parity
    from norcal.workflows.parity.compare import compare

    providers = [k for k, v in PROVIDERS.items() if v[0] in ort.get_available_providers()]
    failed = 0
    weights, config, cal_table, image_paths = _model_inputs(name, args.images)
    spec, model = load_model(weights, config)
    path = Path(tmp) / f"{name}.onnx"
    save_onnx(calibrate_graph(export_detector(model, spec), GAMMA, cal_table), path)
    cal = onnx_calibration(path)
    images = [read_rgb(p) for p in image_paths]
    common = dict(min_size=spec.min_size_test, max_size=spec.max_size_test,
                  divisibility=spec.size_divisibility, score_thresh=spec.score_thresh_test)
    runners = [OnnxRuntimeRunner(path, provider="cpu")]
    runners += [OnnxRuntimeRunner(path, provider=p) for p in providers if p != "cpu"]
    runners.append(TorchRunner(model, name=f"pytorch-{dev.type}", calibration=cal, device=args.device))
    run = run_parity(runners, images, batch_size=args.batch, **common)
    for rep in run.reports:
        table.add_row(*_row(key, rep, run.seconds, f"{rep.candidate} vs {rep.reference}"))
        failed += not rep.passed
        for f in rep.failures[:3]:
            console.print(f"  {key} {rep.candidate}: {f}")
    # the CUDA model alone vs in one padded batch of all the (differently sized) images
    torch_runner = runners[-1]
    t1 = time.perf_counter()
    alone = _outputs(torch_runner, images, spec, 1)
    t2 = time.perf_counter()
    batched = _outputs(torch_runner, images, spec, len(images))
    t3 = time.perf_counter()
    rep = compare(alone, batched, "fp32", reference_name="alone", candidate_name="batched",
                  score_thresh=spec.score_thresh_test)
    table.add_row(*_row(key, rep, {"alone": t2 - t1, "batched": t3 - t2},
                        f"{torch_runner.name}: batch of {len(images)} vs alone"))
    failed += not rep.passed
    for f in rep.failures[:3]:
        console.print(f"  {key} batched: {f}")
    console.print(f"{key}: {len(images)} images, {run.outputs[runners[0].name]['num_detections'].sum()} "
                  "detections by ONNX Runtime")
    return failed


def _outputs(runner, images, spec, batch_size: int) -> dict[str, np.ndarray]:
    """The runner's outputs for every image, in batches of ``batch_size``, concatenated."""
    from norcal.core.contract import Preprocessing
    from norcal.runtime.inference import prepared_batches

    chunks = []
    for batch in prepared_batches(images, Preprocessing(spec.min_size_test, spec.max_size_test, spec.input_format,
                                                    spec.size_divisibility), batch_size):
        out = runner.infer(batch.feeds())
        chunks.append({k: np.asarray(v)[: len(batch)] for k, v in out.items()})
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


if __name__ == "__main__":
    sys.exit(main())
