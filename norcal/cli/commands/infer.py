"""norcal infer: run a detector on images and write COCO/LVIS results JSON."""

from __future__ import annotations

import functools
from pathlib import Path

from norcal.cli.options import add_ray_arguments, ray_options
from norcal.core.errors import NorcalError

HELP = "run a model (.onnx or TensorRT engine) on images; write LVIS/COCO results JSON"
DESCRIPTION = """Run an exported detector on images, batched, and write results JSON that lvis-api
and pycocotools load (bbox as [x, y, w, h] in original image pixels, score, category_id,
and an RLE segmentation for mask models).

  norcal infer model.onnx val/ -o results.json
  norcal infer model.onnx a.jpg b.jpg --batch 4 --provider cuda -o results.json
  norcal infer model.engine val2017/ --image-ids lvis_v1_val.json -o results.json

Images are resized as the model's metadata says (norcal.min_size_test / max_size_test,
detectron2's ResizeShortestEdge); --min-size/--max-size override it. Folders are searched
recursively for image files. A file that cannot be read as an image is an error (the first is
named, the rest counted); --skip-unreadable runs the others, lists the skipped files at the
end and writes them to RESULTS.skipped.json ({"skipped": [{"file", "reason"}], ...}) next to
the results, which stay a plain result list.

Image ids: with --image-ids, from the annotation file (matched by file name; files it does
not list are skipped and reported); otherwise the file name's stem as an integer
(000000397133.jpg -> 397133), or the stem itself.
Category ids (class index i -> the i-th category id in id order): from --image-ids's
categories, else --table, else the model's metadata (norcal.category_ids, norcal.table),
else i + 1 (detectron2's LVIS convention).

--draw DIR also writes DIR/<image>.png for the first --draw-count images: the detections (box,
mask, class and score, coloured by frequency group), beside those of the same model with its
NorCal node stripped when it has one (the baseline). Class names and groups come from --table
or the model's built-in table.

--ray runs on a Ray cluster (pip install 'norcal-deploy[ray]'): Ray Data reads and
prepares the batches, --num-workers actors (each one runner, --gpus-per-worker GPUs,
--threads ONNX Runtime threads, default 1) run them, and the results stream to -o in image
order: the same file as without --ray. --ray alone joins the cluster of $RAY_ADDRESS or of
`ray start` on this machine, else starts Ray here; --ray-address auto joins such a cluster,
HOST:6379 a given one, ray://HOST:10001 connects through Ray Client (an address where nothing
answers within a few seconds is refused). --ray takes no value, so it may go before the
inputs (norcal infer --ray MODEL IMAGES). The model and the
images must be readable at the same paths on every node. A batch whose worker dies or
raises is retried (--max-retries, default 3); --draw is not available with --ray.
"""

# parameters of the runtime named in its errors -> the flags here
FLAGS = {"provider": "--provider", "batch_size": "--batch", "skip_unreadable=True": "--skip-unreadable",
         "address": "--ray-address", "num_workers": "--num-workers", "gpus_per_worker": "--gpus-per-worker",
         "threads": "--threads", "max_retries": "--max-retries"}


def add_arguments(p):
    p.add_argument("model", help="model file: .onnx (ONNX Runtime) or .engine/.plan (TensorRT)")
    p.add_argument("inputs", nargs="+", metavar="IMAGES_OR_DIRS", help="image files and/or folders")
    p.add_argument("-o", "--output", required=True, help="results JSON to write")
    p.add_argument("--batch", type=int, default=1, help="images per batch (default 1)")
    p.add_argument("--provider", choices=("auto", "cpu", "cuda", "tensorrt"), default="auto",
                   help="ONNX Runtime execution provider for .onnx models (default auto: cuda where "
                        "the installed onnxruntime has it, else cpu)")
    p.add_argument("--min-size", type=int, help="override the resize short edge (norcal.min_size_test)")
    p.add_argument("--max-size", type=int, help="override the resize long-edge cap (norcal.max_size_test)")
    p.add_argument("--image-ids", metavar="ANNOTATIONS.json",
                   help="COCO/LVIS annotations giving image ids (by file name) and category ids")
    p.add_argument("--table", help="calibration table (built-in name or JSON) giving category ids")
    p.add_argument("--no-masks", action="store_true", help="write boxes only, even for mask models")
    p.add_argument("--draw", metavar="DIR", help="also draw the first images' detections into DIR "
                                                 "(beside the baseline for a NorCal model)")
    p.add_argument("--draw-count", type=int, default=8, metavar="N",
                   help="how many images --draw draws (default 8)")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="skip files that cannot be read as images (listed in RESULTS.skipped.json) "
                        "instead of stopping")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: one per core; "
                                               "with --ray: 1 per worker)")
    add_ray_arguments(p, gpus=True)


def _image_id(path: Path, by_name: dict[str, int] | None):
    if by_name is not None:
        return by_name[path.name]
    return int(path.stem) if path.stem.isdigit() else path.stem


def skipped_path(output) -> Path:
    """``results.json`` -> ``results.skipped.json``: the files --skip-unreadable left out."""
    p = Path(output)
    return p.with_name((p.stem if p.suffix == ".json" else p.name) + ".skipped.json")


def _category_ids(args, meta, from_annotations):
    from norcal.core.contract import NUM_CLASSES, TABLE, metadata_category_ids
    from norcal.core.tables import builtin_names, load_table

    ids, source = from_annotations, "--image-ids"
    if ids is None and args.table:
        ids, source = load_table(args.table).category_ids, f"table {args.table}"
    if ids is None:
        ids, source = metadata_category_ids(meta), "model metadata"
    if ids is None and meta.get(TABLE) in builtin_names():
        ids, source = load_table(meta[TABLE]).category_ids, f"table {meta[TABLE]} (model metadata)"
    n = meta.get(NUM_CLASSES)
    if ids is not None and n and n.isdigit() and int(n) != len(ids):
        raise NorcalError(f"the model has {n} classes but {source} lists {len(ids)} categories")
    return ids, source if ids is not None else "class index + 1"


def _draw_table(args, meta):
    """The table naming and grouping classes in --draw's pictures: --table, else the model's."""
    from norcal.core.contract import TABLE
    from norcal.core.tables import builtin_names, load_table

    if args.draw_count < 1:
        raise NorcalError(f"--draw-count must be >= 1, got {args.draw_count}")
    if args.table:
        return load_table(args.table)
    if meta.get(TABLE) in builtin_names():
        return load_table(meta[TABLE])
    raise NorcalError("--draw needs class names and training counts: pass --table (built-in name, "
                      "table JSON or training annotation file)")


def run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, \
        TimeElapsedColumn
    from rich.text import Text

    from norcal.cli.options import check_outputs
    from norcal.core.fileio import write_json
    from norcal.core.contract import check_detector, input_spec
    from norcal.runtime.images import expand_inputs, unreadable_files
    from norcal.runtime.inference import run_images, runner_metadata
    from norcal.runtime.results import category_ids_from_annotations, results_fragment, results_writer
    from norcal.runtime.runners import ENGINE_SUFFIXES, open_runner

    console = Console(stderr=True, soft_wrap=True)
    if args.batch < 1:
        raise NorcalError(f"--batch must be >= 1, got {args.batch}")
    if args.threads is not None and args.threads < 1:
        raise NorcalError(f"--threads must be >= 1, got {args.threads}")
    gpu = args.provider in ("cuda", "tensorrt") or Path(args.model).suffix.lower() in ENGINE_SUFFIXES
    ray = ray_options(args, gpu)
    if ray is not None and args.draw:
        raise NorcalError("--draw is not available with --ray: draw with a run on this machine")
    paths = expand_inputs(args.inputs)
    if not paths:
        raise NorcalError("no image files found in " + ", ".join(args.inputs))
    check_outputs([args.model, *args.inputs, *paths, args.image_ids, args.table],
                  files={"-o": args.output,
                         "skipped list": skipped_path(args.output) if args.skip_unreadable else None},
                  folders={"--draw": args.draw})
    by_name, ann_cats = None, None
    if args.image_ids:
        ann_cats, by_name = category_ids_from_annotations(args.image_ids)
        unknown = [p for p in paths if p.name not in by_name]
        paths = [p for p in paths if p.name in by_name]
        if not paths:
            raise NorcalError(f"none of the {len(unknown)} image files is in {args.image_ids} "
                              f"(matched by file name, e.g. {unknown[0].name})")
    if ray is None:
        runner = open_runner(args.model, args.provider, args.threads)
    else:  # only for the metadata here: the workers, maybe on GPU nodes, open their own
        runner = open_runner(args.model, "cpu" if Path(args.model).suffix.lower() == ".onnx" else None, 1)
    meta = runner_metadata(runner)
    check_detector(Path(args.model).name, runner.input_names, runner.output_names, meta)
    spec = input_spec(meta, args.min_size, args.max_size)
    cat_ids, cat_source = _category_ids(args, meta, ann_cats)
    unreadable = unreadable_files(paths, skip=args.skip_unreadable,  # before any work
                                  sizes=(spec.min_size, spec.max_size))
    if unreadable:
        gone = {p for p, _ in unreadable}
        paths = [p for p in paths if p not in gone]
        if not paths:
            raise NorcalError(f"none of the {len(gone)} image files could be read, e.g. "
                              f"{unreadable[0][0]}: {unreadable[0][1]}")
    with_masks = not args.no_masks and "masks" in runner.output_names
    draw_table, drawn = (_draw_table(args, meta) if args.draw else None), []
    where = "" if ray is None else (f" on Ray ({ray.address or 'default address'}, {ray.num_workers} "
                                    f"worker{'s' if ray.num_workers > 1 else ''})")
    name = runner.name if ray is None or not runner.name.startswith("onnxruntime") else \
        f"onnxruntime-{args.provider or 'cpu'}"
    console.print(f"{name}{where}: {len(paths)} images, batch {args.batch}, resize "
                  f"{spec.min_size}/{spec.max_size} {spec.input_format}, categories from {cat_source}")
    if ray is not None:
        del runner  # the workers open their own

    class Rate(ProgressColumn):
        def render(self, task):
            return Text(f"{task.speed:.1f} images/s" if task.speed else "- images/s")

    done_images = 0
    failed = [(p, f"not in {args.image_ids}") for p in unknown] if args.image_ids else []
    failed += unreadable
    skipped = failed if args.skip_unreadable else None
    with Progress(TextColumn("infer"), BarColumn(), MofNCompleteColumn(), Rate(), TimeElapsedColumn(),
                  console=console, transient=False) as progress, results_writer(args.output) as out:
        task = progress.add_task("infer", total=len(paths))
        step = lambda n: progress.advance(task, n)  # noqa: E731
        if ray is None:
            for path, det in run_images(runner, paths, args.batch, spec, failed, on_done=step,
                                        skip_unreadable=args.skip_unreadable):
                out.add(*results_fragment(_image_id(path, by_name), det, cat_ids, with_masks))
                done_images += 1
                if draw_table is not None and len(drawn) < args.draw_count:
                    drawn.append((path, det))
        else:
            from norcal.runtime.ray_inference import ResultsFormat, run_images_ray

            make_runner = functools.partial(open_runner, Path(args.model).resolve(), args.provider,
                                            ray.threads)
            ids = [_image_id(p, by_name) for p in paths]
            for image in run_images_ray(make_runner, [p.resolve() for p in paths], ids, spec,
                                        ResultsFormat(cat_ids, with_masks), args.batch, ray,
                                        failed=skipped, on_done=step):
                out.add(image.text, image.count)
                done_images += 1
        if not done_images:
            raise NorcalError(f"none of the {len(paths) + len(unreadable)} image files could be read, "
                              f"e.g. {failed[-1][0]}: {failed[-1][1]}")
    console.print(f"wrote {args.output}: {out.count} detections on {done_images} images")
    if args.skip_unreadable:
        write_json(skipped_path(args.output), {
            "results": str(args.output), "images_run": done_images,
            "skipped": [{"file": str(p), "reason": why} for p, why in failed]})
        console.print(f"wrote {skipped_path(args.output)}: {len(failed)} file(s) skipped")
    if drawn:
        from norcal.workflows.pictures import draw_model_pictures

        pictures = draw_model_pictures(args.model, drawn, args.draw, draw_table, args.provider)
        console.print(f"wrote {len(pictures)} pictures to {args.draw}")
    if failed:
        console.print(f"[yellow]{len(failed)} file(s) skipped:[/yellow]")
        for p, why in failed:
            console.print(f"  {p}: {why}")
    return 0
