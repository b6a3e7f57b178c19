"""norcal parity: PyTorch vs ONNX Runtime vs TensorRT on the same batches, judged per output."""

from __future__ import annotations

from pathlib import Path

from norcal.cli.options import CLASSIFIER_FLAGS, add_classifier_option, add_split_argument, checkpoint_help
from norcal.core.errors import NorcalError

HELP = "check that ONNX Runtime / TensorRT give the same detections as the PyTorch model"
DESCRIPTION = """Run the same prepared batches through every backend and compare their outputs.

Backends: PyTorch (the model of --checkpoint, by its family: our detectron2-compatible model
rebuilt from a detectron2 .pth/.pkl, or an Ultralytics .pt in our export wrapper), ONNX Runtime
(MODEL.onnx) and TensorRT (--engine, when TensorRT and a GPU are present; otherwise a note).
The reference is PyTorch when --checkpoint is given, else ONNX Runtime. For a NorCal model the
PyTorch side gets the same calibration: the ONNX's norcal.log_prior initializer and norcal.*
metadata (gamma, factor, mechanism, table) are applied to its classifier.

How outputs are judged (norcal.workflows.parity):
  * detections are matched as sets per image (same class, box IoU >= a threshold), because
    scores that tie to 1e-6 reorder outputs between two correct backends; boxes, scores and
    masks are compared on the matched pairs (column "in order" shows the naive view);
  * a detection on one side only is excused when its score sits on the other side's boundary
    (its lowest kept score when all K slots are full, else the score threshold);
  * tolerances per precision:
    fp32 (ONNX Runtime): element level, boxes 1e-2 px, scores 1e-4, masks 1e-3, and >= 99% of
      detections paired at IoU >= 0.99 (a near-tie inside the graph, e.g. at the RPN's
      per-level top-1000, can swap one proposal and so one detection); AP within 0.001.
      With --checkpoint, where a candidate fails at that preset alone, the PyTorch model also
      runs in float64 on the same batches: its float32 outputs' distance from that is the
      reference's own noise floor (deep YOLO / RT-DETR heads reach 1e-3 in scores, pixels in
      boxes), and the candidate is judged again with score and box tolerances the larger of
      the preset and 6 x that floor (both printed, and in --json); one within the preset says
      "within the preset (floor not measured)";
    tf32 (TensorRT fp32 engines: TF32 is TensorRT's default) and fp16: detection level only,
      >= 95% / 90% paired at IoU >= 0.9 / 0.8, scores within 1e-2 / 2e-2, AP within 0.005 / 0.01.
    int8 (a `norcal quantize` model, from its metadata, or an int8 engine): >= 80% paired at
      IoU >= 0.5, paired scores' differences: median within 0.01 and 99th percentile within
      0.06 (a few saturated int8 scores do not decide it), AP within 0.03.
IMAGES come right after MODEL (argparse takes positionals in one run). With --gt data.yaml
(an Ultralytics dataset) IMAGES default to the images of its --split (default val), ids and
category ids as `norcal eval --gt data.yaml` gives them; given IMAGES must be in that split.
Exit status: 0 when every comparison passes, 1 when one fails, 2 on bad input.

examples:
  norcal parity model.norcal.onnx val/*.jpg --checkpoint model_final.pth --config config.yaml
  norcal parity model.norcal.onnx --checkpoint model_final.pth            (3 synthetic images)
  norcal parity model.norcal.onnx val/ --engine model.fp16.engine --gt lvis_v1_val.json --batch 4
"""


def add_arguments(p):
    p.add_argument("model", help="the ONNX model (run with ONNX Runtime)")
    p.add_argument("images", nargs="*", metavar="IMAGES_OR_DIRS",
                   help="images and/or folders (default: synthetic images, see --synthetic)")
    p.add_argument("--checkpoint", metavar="MODEL.pth", help=checkpoint_help("the checkpoint the ONNX was exported from")
                                                        + " (adds PyTorch, the reference)")
    p.add_argument("--config", help="its detectron2 config yaml (default: inferred, as norcal export does)")
    add_classifier_option(p)
    p.add_argument("--engine", help="a TensorRT engine built from MODEL.onnx (norcal build)")
    p.add_argument("--engine-precision", choices=("fp32", "tf32", "fp16", "int8"),
                   help="tolerance preset for the engine (default: int8 engines int8, fp16 engines fp16, "
                        "others tf32)")
    from norcal.runtime.backends import ONNXRUNTIME, provider_choices

    p.add_argument("--provider", choices=provider_choices(ONNXRUNTIME), default="cpu",
                   help="ONNX Runtime execution provider (default cpu)")
    p.add_argument("--gt", metavar="ANNOTATIONS.json|data.yaml",
                   help="COCO/LVIS annotations of the images (matched by file name), or an Ultralytics "
                        "data.yaml (its --split's images, the default IMAGES; matched by path): adds box "
                        "AP per backend")
    add_split_argument(p, "--gt")
    p.add_argument("--batch", type=int, default=1, help="images per batch, the same for every backend (default 1)")
    p.add_argument("--synthetic", type=int, default=3, metavar="N",
                   help="how many synthetic images to use when no IMAGES are given (default 3)")
    p.add_argument("--limit", type=int, metavar="N", help="use only the first N images")
    p.add_argument("--json", metavar="OUT.json", help="also write the comparison as JSON")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="leave out files that cannot be read as images (counted, and listed under "
                        "\"skipped\" in --json) instead of stopping")


# parameters named in the library's errors -> the flags here
FLAGS = {"skip_unreadable=True": "--skip-unreadable", "batch_size": "--batch", "checkpoint": "--checkpoint",
         "config": "--config", "engine": "--engine", "engine_precision": "--engine-precision", **CLASSIFIER_FLAGS}


def _load_images(args, console, skipped, split_ids=None):
    from rich.markup import escape

    from norcal.runtime.image_files import expand_inputs
    from norcal.runtime.images import read_images
    from norcal.workflows.parity import synthetic_images

    if not args.images and split_ids is None:
        if args.gt:
            raise NorcalError("--gt needs the annotated images as IMAGES")
        if args.synthetic < 1:
            raise NorcalError(f"--synthetic must be >= 1, got {args.synthetic}")
        console.print(f"no images given: using {args.synthetic} synthetic images (shapes on a smooth "
                      f"background, seed 0)")
        return synthetic_images(args.synthetic), None
    paths = expand_inputs(args.images) if args.images else list(split_ids)
    if args.limit is not None:
        paths = paths[: args.limit]
    if not paths:
        raise NorcalError("no image files found in " + ", ".join(args.images))
    images = read_images(paths, skipped=skipped if args.skip_unreadable else None)
    if skipped:
        console.print(f"[yellow]{len(skipped)} unreadable file(s) skipped[/yellow], e.g. "
                      f"{escape(str(skipped[0][0]))}: {escape(skipped[0][1])}")
        gone = {p for p, _ in skipped}
        paths = [p for p in paths if p not in gone]
    if not images:
        raise NorcalError(f"none of the {len(skipped)} image files could be read")
    return images, paths


def run(args) -> int:
    from norcal.cli.terminal import SafeConsole as Console

    from norcal.core.datasets.ultralytics_dataset import is_dataset_description
    from norcal.core.datasets.yolo_ground_truth import split_image_ids
    from norcal.workflows.parity import build_runners

    request = _check_flags(args)
    console = Console(soft_wrap=True)
    skipped: list = []
    by_path = split_image_ids(args.gt, args.split) if args.gt and is_dataset_description(args.gt) else None
    images, paths = _load_images(args, console, skipped, by_path)
    gt, image_ids, cat_ids, gt_names = _ground_truth(args, paths, by_path)
    built = build_runners(request, stage=console.status)
    if cat_ids is not None:  # the GT's category ids are taken for the model's classes in order
        from norcal.core.contract import check_class_names, metadata_class_names

        check_class_names(metadata_class_names(built.onnx.metadata), gt_names, cat_ids, args.gt)
    _print_setup(args, console, built, images, paths)
    result = _compare(args, console, built, images, gt, image_ids, cat_ids)
    _report(args, console, result, skipped)
    return 0 if result.passed else 1


def _check_flags(args):
    """The ParityRequest of the flags, refused (as are unwritable outputs and a bad --limit)
    before any file is read."""
    from norcal.cli.options import check_outputs
    from norcal.workflows.parity import ParityRequest

    request = ParityRequest(args.model, checkpoint=args.checkpoint, config=args.config, engine=args.engine,
                            engine_precision=args.engine_precision, provider=args.provider,
                            batch_size=args.batch, classifier=args.classifier)
    request.check()
    check_outputs([args.model, args.checkpoint, args.config, args.engine, args.gt, *args.images],
                  files={"--json": args.json})
    if args.limit is not None and args.limit < 1:
        raise NorcalError(f"--limit must be >= 1, got {args.limit}")
    return request


def _ground_truth(args, paths, by_path):
    """--gt's annotations, the image id of each path, the category ids and their names (all None,
    names [], without --gt); ``by_path`` maps a data.yaml split's image paths to their ids."""
    from norcal.core.datasets.schemas import GROUND_TRUTH
    from norcal.core.datasets.yolo_ground_truth import dataset_categories, read_annotations

    gt = image_ids = cat_ids = None
    gt_names: list = []
    if args.gt:  # read before the models load: a bad file fails in a second
        gt = read_annotations(args.gt, "annotations", GROUND_TRUTH, args.split)
    if by_path is not None:  # a data.yaml: its split's images, matched by path
        cat_ids, gt_names = dataset_categories(args.gt)
        unknown = [p for p in paths if p.resolve() not in by_path]
        if unknown:
            raise NorcalError(f"{len(unknown)} image(s) are not in {args.gt}'s split {args.split!r} (by "
                              f"path), e.g. {unknown[0]}")
        image_ids = [by_path[p.resolve()] for p in paths]
    elif args.gt:
        from norcal.runtime.results import category_ids_from_annotations

        cat_ids, by_name = category_ids_from_annotations(gt, args.gt, names=gt_names)
        unknown = [p.name for p in paths if p.name not in by_name]
        if unknown:
            raise NorcalError(f"{len(unknown)} image(s) are not in {args.gt} (by file name), e.g. {unknown[0]}")
        image_ids = [by_name[p.name] for p in paths]
    return gt, image_ids, cat_ids, gt_names


def _print_setup(args, console, built, images, paths) -> None:
    """The lines before the comparison: PyTorch's calibration, notes, batch and presets
    (the images are checked against the model in between, as they were loaded)."""
    from rich.markup import escape

    if args.checkpoint:
        calibration = built.calibration
        console.print(f"PyTorch: {Path(args.checkpoint).name} with "
                      f"{calibration.describe() if calibration else 'plain scores (the ONNX has no NorCal node)'}")
    for note in built.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    built.check_images(images, paths)
    runners, spec, tolerances = built.runners, built.spec, built.tolerances
    if built.batch_size != args.batch:
        console.print(f"the model's batch is fixed at {built.batch_size}: using batch {built.batch_size}")
    console.print(f"{len(images)} images, batch {built.batch_size}, resize {spec.min_size}/{spec.max_size} "
                  f"{spec.input_format}; reference {runners[0].name}; "
                  + ", ".join(f"{r.name}: {tolerances[r.name].precision}" for r in runners[1:]))


def _compare(args, console, built, images, gt, image_ids, cat_ids):
    """run_parity over the built runners, one progress bar per backend."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from norcal.workflows.parity import run_parity

    runners = built.runners
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        tasks = {r.name: progress.add_task(r.name, total=len(images)) for r in runners}

        def on_batch(name, done):
            if name not in tasks:  # the noise runner, run only where a preset alone failed
                tasks[name] = progress.add_task(name, total=len(images))
            progress.update(tasks[name], completed=done)

        return run_parity(runners, images, spec=built.spec, noise_runner=built.noise,
                          batch_size=built.batch_size, tolerances=built.tolerances,
                          score_thresh=built.score_thresh, gt=gt, image_ids=image_ids, category_ids=cat_ids,
                          fixed_shape=built.fixed_shape, split=args.split, on_batch=on_batch)


def _report(args, console, result, skipped) -> None:
    """The tables, the verdict lines and --json (with the skipped files under --skip-unreadable)."""
    from rich.markup import escape

    from norcal.cli.parity_tables import render_tables
    from norcal.core.files.fileio import write_json
    from norcal.workflows.parity import report_json, verdict_lines

    for t in render_tables(result):
        console.print(t)
    for line in verdict_lines(result):
        style = "green" if line.startswith("PASS") else "red"
        console.print(f"[{style}]{escape(line)}[/{style}]", highlight=False)
    if args.json:
        report = report_json(result)
        if args.skip_unreadable:
            report["skipped"] = [{"file": str(p), "reason": why} for p, why in skipped]
        write_json(args.json, report)
        console.print(f"wrote {args.json}")
