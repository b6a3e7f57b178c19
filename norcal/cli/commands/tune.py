"""norcal tune: choose NorCal's gamma on training images from one network pass."""

from __future__ import annotations

import math
from pathlib import Path

from norcal.cli.options import (CLASSIFIER_FLAGS, DECODING_FLAGS, add_calibration_options, add_classifier_option,
                                add_decoding_options, add_ray_arguments, add_split_argument, checkpoint_help,
                                decoding_option, min_count_line, ray_options, table_help)
from norcal.core.files.fileio import readable_file
from norcal.core.errors import NorcalError

HELP = "sweep NorCal's gamma on (a subset of) training images and recommend the best"
DESCRIPTION = """Tune NorCal's gamma the way the paper does: on training images (a 5k subset
is enough), picking the gamma with the best box AP (--iou-type: or mask AP, or AP with
Boundary IoU, the paper's LVIS Challenge 2021 metric).

  norcal tune model_final.pth --config config.yaml --gt train_5k.json --images train2017/ \\
              --table lvis_v1 --gammas 0:1.5:0.1 --json sweep.json --plot sweep.png
  norcal tune best.pt --gt train_subset.json --images train/ --table train.json --gammas 0:1:0.1

The network runs once over the images, batched and resized as the exported model's host
code does (the model's rule: detectron2's ResizeShortestEdge with zero padding, Ultralytics'
letterbox). What is cached depends on the family. A detectron2 R-CNN (backbone, RPN, box head
run once) caches the box predictor's inputs per image (proposal boxes, class logits, box
deltas, image sizes; ~24 MB per image for an LVIS model, so images go through in chunks that
fit --max-cache-gb); then, for each gamma, NorCal is re-applied to the cached logits and the
model's own post-processing runs again (per-class box decoding, clipping, score > 1e-4,
class-wise NMS 0.5, top 300), boxes are mapped to original image coordinates and evaluated
(--rules below). Calibration acts before NMS and the top-300 cut, so the detections equal
a full run of the model exported with that gamma; a gamma costs a fraction of a network pass.
A RetinaNet caches each gamma's per-level candidates and re-runs NMS; an Ultralytics YOLO the
anchors that pass the score threshold at some gamma (boxes, class logits, mask coefficients)
and re-runs its class-wise NMS 0.7 and top 300.

MODEL must be a checkpoint (norcal export --help lists the families): ONNX models are not
accepted, because tuning needs the pre-NMS head outputs, which an exported graph does not
expose (it ends in NMS), and re-running a whole graph per gamma is what the cache avoids. Export the chosen
gamma afterwards with `norcal-export MODEL --gamma G`.

--iou-type segm / boundary (mask models; --gt needs masks): each gamma's detections also get
their masks from the mask head, pasted and RLE-encoded as `norcal infer` writes them, and AP
is mask AP / Boundary AP. That costs a mask-head pass per gamma and batch (the cache then
holds one batch and the maps the mask head reads); not with --ray.
--gt: LVIS-format annotations of the tuning images; images are those of --gt found in
--images by file name (GT images not found there are left out of the evaluation, as
lvis-api does with params.img_ids, and the count is printed).
--rules: as `norcal eval --rules` (see `norcal eval --help`): auto (default) applies LVIS
federated rules when the GT's images carry neg_category_ids / not_exhaustive_category_ids and
COCO rules (exhaustive labels: every detection counts, iscrowd as pycocotools) otherwise; lvis
or coco forces them. The first output line says which and why; --json records it.
An Ultralytics data.yaml as --gt: the images of its --split (default val) with their YOLO
labels; --images may be left out (if given, it must hold every image of the split).
--table: N_c, the training counts (see --table below); default: the built-in table with the
model's class count.
A tie (APs within 1e-12, e.g. every gamma 0) recommends the smallest gamma.
The rows print in %; --json writes {"rules", "rules_reason", "factor", "mechanism", "table", "iou_type", "num_images",
"network_seconds", "cache_bytes", "best": {"gamma", "AP"}, "sweep": [{"gamma",
"num_detections", "seconds", "stats": {AP, AP50, AP75, APs, APm, APl, APr, APc, APf, AR, ...}}]}
(fractions in [0, 1], -1 where undefined); --plot writes AP, APr, APc, APf against gamma.

--ray runs on a Ray cluster (pip install 'norcal-deploy[ray]'): --num-workers
workers (one detector each, 1 torch thread) run the network pass and keep the cached head
outputs in Ray's object store; for each chunk, one task per gamma re-scores them, and one task
per gamma evaluates. The sweep equals the single-process one. --ray-address as for `norcal infer`;
the checkpoint, config and images must be readable at the same paths on every node.
"""

# parameters of norcal.workflows.tune named in its errors -> the flags here
FLAGS = {"batch_size": "--batch", "max_cache_bytes": "--max-cache-gb", "gammas": "--gammas",
         "iou_type": "--iou-type", "rules": "--rules", "images": "--images",
         "table": "--table", "address": "--ray-address", "num_workers": "--num-workers",
         "max_retries": "--max-retries", **DECODING_FLAGS, **CLASSIFIER_FLAGS}


def _budget(text: str) -> float:
    """--max-cache-gb as typed (NaN and inf included): run() refuses anything but a finite
    number > 0 with one message that says so."""
    import argparse

    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def add_arguments(p):
    p.add_argument("model", metavar="MODEL", help=checkpoint_help() + "; not ONNX (see above)")
    p.add_argument("--config", help="detectron2 only: its config yaml (default: inferred from the weights)")
    add_classifier_option(p)
    p.add_argument("--gt", required=True, metavar="ANNOTATIONS.json|data.yaml",
                   help="LVIS/COCO annotations of the tuning images (e.g. a 5k training subset), or an "
                        "Ultralytics data.yaml (see --split)")
    add_split_argument(p, "--gt")
    p.add_argument("--images", metavar="DIR", help="folder holding those images (with a data.yaml: "
                                                   "default its split's images; a DIR must hold them all)")
    p.add_argument("--gammas", default="0:1.5:0.1",
                   help="start:stop:step (stop included) or a comma list (default 0:1.5:0.1)")
    p.add_argument("--table", help=table_help("N_c; default: the built-in table matching the class count"))
    add_calibration_options(p)
    add_decoding_options(p)
    p.add_argument("--iou-type", choices=("bbox", "segm", "boundary"), default="bbox",
                   help="AP the best gamma is chosen on: box, mask or Boundary IoU (default bbox)")
    p.add_argument("--rules", choices=("auto", "lvis", "coco"), default="auto",
                   help="evaluation rules: LVIS federated or COCO (exhaustive); auto: lvis when the "
                        "GT's images carry neg_category_ids / not_exhaustive_category_ids, else coco")
    p.add_argument("--batch", type=int, default=4, help="images per network batch (default 4)")
    p.add_argument("--max-cache-gb", type=_budget, default=2.0,
                   help="memory for cached head outputs; images are processed in chunks that fit "
                        "(default 2; an LVIS model takes ~24 MB per image)")
    p.add_argument("--json", metavar="FILE", help="write the sweep as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write AP / APr / APc / APf against gamma")
    add_ray_arguments(p, gpus=False)


def run(args) -> int:
    from norcal.cli.terminal import SafeConsole as Console

    src, gammas, ray = _check_flags(args)
    console = Console(soft_wrap=True)
    result = _sweep(args, src, gammas, ray, console)
    if args.min_count is not None:
        console.print(min_count_line(args.min_count, result.min_count_clamped))
    console.print(sweep_table(result))
    _print_summary(args, console, result)
    _write_outputs(args, console, result)
    return 0


def _check_flags(args):
    """Refuse a bad MODEL, bad flags and unwritable outputs before anything runs; the checkpoint
    path, the parsed gammas and the Ray options (None without --ray)."""
    from norcal.cli.options import check_outputs, parse_valid_gammas
    from norcal.workflows.tune import MAX_CACHE_BYTES

    src = Path(args.model)
    if src.suffix.lower() == ".onnx":
        raise NorcalError(f"{src}: tune needs a checkpoint, not ONNX: an "
                          "exported graph ends in NMS and hides the pre-NMS head outputs the sweep "
                          "re-scores (see `norcal tune --help`)")
    from norcal.export.families import checkpoint_suffixes

    if src.suffix.lower() not in checkpoint_suffixes():
        raise NorcalError(f"{src}: expected a checkpoint ({', '.join(checkpoint_suffixes())})")
    readable_file(src)
    if args.batch < 1:
        raise NorcalError(f"--batch must be >= 1, got {args.batch}")
    if not (math.isfinite(args.max_cache_gb) and 0 < args.max_cache_gb <= MAX_CACHE_BYTES / 2**30):
        raise NorcalError(f"--max-cache-gb must be a finite number > 0 and <= {MAX_CACHE_BYTES / 2**30:g}, "
                          f"got {args.max_cache_gb:g}")
    gammas = parse_valid_gammas(args.gammas, args.factor)
    # the user's flags before the environment: a conflict is reported whether Ray is installed or not
    if (args.ray or args.ray_address is not None) and args.iou_type != "bbox":
        raise NorcalError(f"--iou-type {args.iou_type} runs without --ray (the Ray sweep evaluates bbox)")
    ray = ray_options(args)
    check_outputs([src, args.config, args.gt, args.table, args.images],
                  files={"--json": args.json, "--plot": args.plot})
    return src, gammas, ray


def _sweep(args, src: Path, gammas, ray, console):
    """The sweep (in this process, or on Ray when ``ray`` is given) under progress bars."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from norcal.cli.options import progress_bars
    from norcal.workflows.tune import tune

    table = args.table  # None: tune picks the built-in table matching the model's class count
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        def on_rules(line: str) -> None:  # the first output line, once the GT is read
            console.print(line, markup=False, highlight=False)
            if ray is not None:
                console.print(f"on Ray ({ray.address or 'default address'}, {ray.num_workers} "
                              f"worker{'s' if ray.num_workers > 1 else ''})")

        kwargs = dict(config=args.config, factor=args.factor, mechanism=args.mechanism,
                      batch_size=args.batch, max_cache_bytes=int(args.max_cache_gb * 2**30),
                      progress=progress_bars(progress), min_count=args.min_count, split=args.split, rules=args.rules,
                      on_rules=on_rules, decoding=decoding_option(args), classifier=args.classifier)
        if ray is None:
            return tune(src, args.gt, args.images, gammas, table, iou_type=args.iou_type, **kwargs)
        from norcal.workflows.ray_tune import tune_ray

        return tune_ray(src, args.gt, args.images, gammas, table, options=ray, **kwargs)


def _print_summary(args, console, result) -> None:
    """The lines after the table: images left out, timings and the recommended gamma."""
    from norcal.evaluation.report import percent

    per_gamma = sum(p.seconds for p in result.points) / len(result.points)
    if result.gt_images and result.gt_images > result.num_images:
        console.print(f"{args.gt} lists {result.gt_images} images; the {result.num_images} found in "
                      f"{args.images} are evaluated, the others left out")
    console.print(f"network pass {result.network_seconds:.1f} s ({result.num_images} images, cache "
                  f"{result.cache_bytes / 2**20:.1f} MiB at most); {per_gamma:.2f} s per gamma")
    best = result.best
    console.print(f"recommended gamma: [bold]{best.gamma:g}[/bold] (AP {percent(best.stats['AP'])}, "
                  f"APr {percent(best.stats['APr'])}; gamma 0: AP "
                  f"{percent(result.points[0].stats['AP'])})" if result.points[0].gamma == 0 else
                  f"recommended gamma: [bold]{best.gamma:g}[/bold] (AP {percent(best.stats['AP'])})")


def _write_outputs(args, console, result) -> None:
    """--json and --plot, each file named as it is written."""
    from norcal.core.files.fileio import write_json
    from norcal.workflows.tune import write_sweep_plot

    if args.json:
        write_json(args.json, result.to_json())
        console.print(f"wrote {args.json}")
    if args.plot:
        write_sweep_plot(args.plot, {result.iou_type: [(p.gamma, p.stats) for p in result.points]},
                         best=result.best.gamma,
                         title=f"NorCal gamma sweep ({result.factor}, {result.num_images} images)")
        console.print(f"wrote {args.plot}")


def sweep_table(result, title: str | None = None):
    """A rich Table of a :class:`norcal.workflows.tune.TuneResult`: gamma, AP, AP50, APr, APc,
    APf (in %), detections; the best row marked."""
    from rich.table import Table

    from norcal.evaluation.report import percent

    best = result.best.gamma
    t = Table(title=title or f"NorCal gamma sweep ({result.factor}, {result.mechanism}, "
                             f"{result.num_images} images, {result.iou_type})")
    t.add_column("gamma", justify="right")
    for k in ("AP", "AP50", "APr", "APc", "APf"):
        t.add_column(k, justify="right")
    t.add_column("detections", justify="right")
    for p in result.points:
        row = [f"{p.gamma:g}"] + [percent(p.stats[k]) for k in ("AP", "AP50", "APr", "APc", "APf")]
        row.append(str(p.num_detections))
        t.add_row(*row, style="bold green" if p.gamma == best else None)
    return t
