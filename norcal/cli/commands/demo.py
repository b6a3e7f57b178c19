"""norcal demo: the bundled long-tailed Mask R-CNN, gamma tuned on training data, measured end to end."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from norcal.workflows.demo import DemoResult

FLAGS = {"data": "--data", "output_dir": "--output"}  # parameters the demo's errors name -> the flags here
HELP = "run the bundled example: tune gamma on training images, export with NorCal, compare LVIS AP"
DESCRIPTION = """The whole product on a small real model, in about a minute on a CPU.

The bundled d2_synth_trained checkpoint (package data) is a Mask R-CNN that detectron2 trained
on a synthetic long-tailed dataset (60 classes: 20 rare, 24 common, 16 frequent); it has
learned to favour frequent classes. The demo
  1. builds the calibration table (N_c = training images per class) from train_annotations.json,
  2. chooses gamma as the paper does, on training images: the code of `norcal tune` sweeps
     --gammas on the 120-image training subset (train_subset/, train_subset.json) from one
     network pass and cached re-scoring, and keeps the gamma with the best box AP,
  3. exports the checkpoint (with its config.yaml) to ONNX once and inserts the NorCal node at
     that gamma (graph surgery only; the plain export is the baseline),
  4. runs the models with ONNX Runtime on the validation images (val/) in padded batches,
     maps boxes to original image coordinates, pastes masks, writes LVIS results JSON,
  5. evaluates bbox and segm AP, AP_r, AP_c, AP_f against val.json (LVIS federated rules),
     and AP^Fixed with Boundary IoU (the paper's LVIS Challenge 2021 metric),
  6. for reference, sweeps the same grid on the validation images: the best validation gamma
     (also exported and run) shows the transfer gap, what tuning on test images would gain,
  7. prints baseline vs tuned NorCal side by side and writes into --output:
     model_baseline.onnx, model_norcal_g<G>.onnx, results_*.json, table.json,
     ap_vs_gamma.png (AP / APr / APc / APf against gamma on train and val, the tuned gamma
     marked), pictures/<image_id>.png (baseline and NorCal detections side by side on the
     validation images where NorCal finds the most rare objects) and summary.json.

  norcal demo                                    # output ./norcal-demo
  norcal demo --gammas 0:1.5:0.1 --output /tmp/demo   # a finer grid, ~2 s more per gamma

--data DIR defaults to the bundled example; elsewhere pass a folder holding model_final.pth,
config.yaml, train_annotations.json, train_subset.json, train_subset/, val.json and val/.
"""


def add_arguments(p):
    from norcal.workflows.demo import DEFAULT_GAMMAS, PICTURES

    gammas = ",".join(f"{g:g}" for g in DEFAULT_GAMMAS)
    p.add_argument("--data", metavar="DIR", help="example folder (default: the bundled example)")
    p.add_argument("--output", "-o", default="norcal-demo", metavar="DIR",
                   help="where models, results, plot, pictures and summary go (default ./norcal-demo)")
    p.add_argument("--gammas", default=gammas,
                   help="the gammas tuned over on the training subset: comma list or "
                        f"start:stop:step (default {gammas})")
    p.add_argument("--batch", type=int, default=8, help="images per ONNX Runtime batch (default 8)")
    p.add_argument("--pictures", type=int, default=PICTURES, metavar="N",
                   help=f"validation images to draw, baseline beside NorCal (default {PICTURES})")


def run(args) -> int:
    from norcal.cli.terminal import SafeConsole as Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from norcal.workflows.demo import run_demo
    from norcal.cli.options import parse_gammas, progress_bars

    console = Console(soft_wrap=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        result = run_demo(args.data, args.output, parse_gammas(args.gammas), args.batch,
                          args.pictures, progress=progress_bars(progress), log=console.print)
    console.print(comparison_table(result))
    b, t, ref = result.baseline, result.tuned, result.best_val
    console.print(f"NorCal γ={t.gamma or 0:g}, tuned on {result.tuning.num_images} training images: "
                  f"val bbox AP_r {100 * b.bbox['APr']:.2f} -> {100 * t.bbox['APr']:.2f}, "
                  f"AP {100 * b.bbox['AP']:.2f} -> {100 * t.bbox['AP']:.2f}")
    console.print(f"transfer gap: the best validation gamma {ref.gamma or 0:g} gives val bbox AP "
                  f"{100 * ref.bbox['AP']:.2f} ({100 * (ref.bbox['AP'] - t.bbox['AP']):+.2f} over the "
                  "tuned gamma); it is chosen on the reported images, so it is a reference, not a result")
    s = result.seconds
    console.print(f"time: tuning {s['tune']:.1f} s, validation sweep {s['validation_sweep']:.1f} s, "
                  f"export {s['export']:.1f} s, inference + evaluation {s['infer_and_eval']:.1f} s, "
                  f"pictures {s.get('pictures', 0):.1f} s, total {s['total']:.1f} s")
    console.print(f"wrote {result.output_dir}/ (models, results, table.json, {result.plot_path.name}, "
                  f"{len(result.pictures)} pictures in pictures/, summary.json)")
    return 0


def comparison_table(result: DemoResult):
    """The demo's numbers as a rich Table, one row per metric (bbox and segm AP, AP_r, AP_c, AP_f on the validation
    images, then AP^Fixed with Boundary IoU as the paper's table has it, in %, then the
    detection count), one column per model: the baseline, NorCal at the
    gamma tuned on training images and its change over the baseline, and, for reference,
    NorCal at the best validation gamma."""
    from rich.table import Table

    from norcal.evaluation.report import percent
    from norcal.workflows.demo import METRICS

    b, tuned, ref = result.baseline, result.tuned, result.best_val
    t = Table(title=f"{result.num_images} validation images, LVIS AP (%): baseline vs NorCal "
                    f"tuned on {result.tuning.num_images} training images")
    cols = [("baseline", b), (f"tuned γ={tuned.gamma or 0:g}", tuned)]
    t.add_column("metric")
    for name, _ in cols:
        t.add_column(name, justify="right")
    t.add_column("Δ tuned", justify="right", style="bold")
    t.add_column(f"best val γ={ref.gamma or 0:g}", justify="right", style="dim")
    for kind, label in (("bbox", "bbox"), ("segm", "segm"), ("boundary_fixed", "boundary AP^Fixed")):
        for k in METRICS:
            vals = [getattr(s, kind)[k] for s in (b, tuned, ref)]
            t.add_row(f"{label} {k}", percent(vals[0]), percent(vals[1]),
                      f"{100 * (vals[1] - vals[0]):+.2f}", percent(vals[2]),
                      end_section=(k == METRICS[-1]))
    t.add_row("detections", str(b.num_detections), str(tuned.num_detections), "",
              str(ref.num_detections))
    return t
