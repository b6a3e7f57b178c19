"""norcal demo: the bundled long-tailed Mask R-CNN, baseline vs NorCal, measured end to end."""

from __future__ import annotations

HELP = "run the bundled example: export with NorCal, run with ONNX Runtime, compare LVIS AP"
DESCRIPTION = """The whole product on a small real model, in a few minutes on a CPU.

The bundled d2_synth_trained checkpoint is a Mask R-CNN that detectron2 trained on a
synthetic long-tailed dataset (60 classes: 20 rare, 24 common, 16 frequent); it has learned
to favour frequent classes. The demo
  1. builds the calibration table (N_c = training images per class) from train_annotations.json,
  2. exports the checkpoint (with its config.yaml) to ONNX once, and inserts the NorCal node
     for each --gammas value (graph surgery only; the plain export is the baseline),
  3. runs every model with ONNX Runtime on the validation images (val/) in padded batches,
     maps boxes to original image coordinates, pastes masks, writes LVIS results JSON,
  4. evaluates bbox and segm AP, AP_r, AP_c, AP_f against val.json (LVIS federated rules),
  5. prints baseline vs NorCal side by side and writes into --output:
     model_baseline.onnx, model_norcal_g<G>.onnx, results_*.json, table.json,
     ap_vs_gamma.png (AP / APr / APc / APf against gamma, bbox and segm) and summary.json.

  norcal demo                          # data from the source tree, output ./norcal-demo
  norcal demo --gammas 0.25:1.5:0.25 --output /tmp/demo   # more gammas, ~25 s each

--data DIR defaults to tests/fixtures/d2_synth_trained of the source tree this package runs
from; elsewhere pass a folder holding model_final.pth, config.yaml, train_annotations.json,
val.json and val/.
"""


def add_arguments(p):
    from norcal.workflows.demo import DEFAULT_GAMMAS

    gammas = ",".join(f"{g:g}" for g in DEFAULT_GAMMAS)
    p.add_argument("--data", metavar="DIR", help="example folder (default: the source tree's "
                                                 "tests/fixtures/d2_synth_trained)")
    p.add_argument("--output", "-o", default="norcal-demo", metavar="DIR",
                   help="where models, results, plot and summary go (default ./norcal-demo)")
    p.add_argument("--gammas", default=gammas,
                   help="NorCal gammas besides the baseline: comma list or start:stop:step "
                        f"(default {gammas})")
    p.add_argument("--batch", type=int, default=8, help="images per ONNX Runtime batch (default 8)")


def run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from norcal.workflows.demo import comparison_table, run_demo
    from norcal.cli.options import parse_gammas

    console = Console(soft_wrap=True)
    gammas = [g for g in parse_gammas(args.gammas) if g != 0]
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        result = run_demo(args.data, args.output, gammas, args.batch, progress=progress,
                          log=console.print)
    console.print(comparison_table(result))
    b, best = result.baseline, result.best
    console.print(f"* NorCal γ={best.gamma:g} (best bbox AP): bbox AP_r {100 * b.bbox['APr']:.2f} -> "
                  f"{100 * best.bbox['APr']:.2f}, AP {100 * b.bbox['AP']:.2f} -> {100 * best.bbox['AP']:.2f}")
    s = result.seconds
    console.print(f"time: export {s['export']:.1f} s, surgery {s['surgery']:.1f} s, inference + "
                  f"evaluation {s['infer_and_eval']:.1f} s, total {s['total']:.1f} s")
    console.print(f"wrote {result.output_dir}/ (models, results, table.json, {result.plot_path.name}, "
                  "summary.json)")
    return 0
