"""norcal infer: run a detector on images and write COCO/LVIS results JSON."""

from __future__ import annotations

from norcal.cli.options import add_ray_arguments, add_split_argument, ray_options, table_help

HELP = "run a model (.onnx or TensorRT engine) on images; write LVIS/COCO results JSON"
DESCRIPTION = """Run an exported detector on images, batched, and write results JSON that lvis-api
and pycocotools load (bbox as [x, y, w, h] in original image pixels, score, category_id,
and an RLE segmentation for mask models).

  norcal infer model.onnx val/ -o results.json
  norcal infer model.onnx a.jpg b.jpg --batch 4 --provider cuda -o results.json
  norcal infer model.engine val2017/ --image-ids lvis_v1_val.json -o results.json
  norcal infer best.onnx --image-ids data.yaml --split val -o results.json

Images are resized as the model's metadata records (norcal.resize): detectron2's
ResizeShortestEdge to norcal.min_size_test / max_size_test, zero padding (--min-size/--max-size
override them), or Ultralytics' letterbox to the norcal.input_size square, grey padding (no
override: the graph is built for that square). Folders are searched recursively for image
files (hidden files and folders, such as macOS's ._name.jpg, left out). A file that cannot be
read as an image is an error (the first is named, the rest counted); --skip-unreadable runs
the others, lists the skipped files at the
end and writes them to RESULTS.skipped.json ({"skipped": [{"file", "reason"}], ...}) next to
the results, which stay a plain result list.

Image ids: with --image-ids, from the annotation file (matched by file name; files it does
not list are skipped and reported); otherwise the file name's stem as an integer
(000000397133.jpg -> 397133), or the stem itself. Two files with one id (1.png and
001.jpg, one name in two folders) are refused: their detections would merge.
--image-ids data.yaml (an Ultralytics dataset): the images of its --split (default val) are
run when no IMAGES_OR_DIRS are given; given ones are matched to the split by path (others
skipped and reported). Image ids as `norcal eval --gt data.yaml` numbers them (the stem as an
integer when every stem of the split is digits and none repeat, else 1..N in path order);
category id = class index + 1.
Category ids (class index i -> the i-th category id in id order): from --image-ids's
categories, else --table, else the model's metadata (norcal.category_ids, norcal.table),
else i + 1 (detectron2's LVIS convention). When the model records its class names
(norcal.class_names: the calibration table's, or an Ultralytics model's), the categories of
--image-ids or --table must carry those names in the model's order (case, '_' and spaces
ignored), else the run is refused naming the first class that differs.

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
         "threads": "--threads", "cpus_per_worker": "--threads", "max_retries": "--max-retries", "image_ids": "--image-ids",
         "inputs": "IMAGES_OR_DIRS",
         "draw_dir": "--draw", "draw_count": "--draw-count", "ray": "--ray"}


def add_arguments(p):
    p.add_argument("model", help="model file: .onnx (ONNX Runtime) or .engine/.plan (TensorRT)")
    p.add_argument("inputs", nargs="*", metavar="IMAGES_OR_DIRS",
                   help="image files and/or folders (may be left out with --image-ids data.yaml: its "
                        "split's images)")
    p.add_argument("-o", "--output", required=True, help="results JSON to write")
    p.add_argument("--batch", type=int, default=1, help="images per batch (default 1)")
    from norcal.runtime.backends import provider_choices

    p.add_argument("--provider", choices=provider_choices(), default="auto",
                   help="ONNX Runtime execution provider for .onnx models (default auto: cuda where "
                        "the installed onnxruntime has it, else cpu)")
    p.add_argument("--min-size", type=int, help="override the resize short edge (norcal.min_size_test)")
    p.add_argument("--max-size", type=int, help="override the resize long-edge cap (norcal.max_size_test)")
    p.add_argument("--image-ids", metavar="ANNOTATIONS.json|data.yaml",
                   help="COCO/LVIS annotations giving image ids (by file name) and category ids, or an "
                        "Ultralytics data.yaml (see --split)")
    add_split_argument(p, "--image-ids")
    p.add_argument("--table", help=table_help("its category ids"))
    p.add_argument("--no-masks", action="store_true", help="write boxes only, even for mask models")
    p.add_argument("--draw", metavar="DIR", help="also draw the first images' detections into DIR "
                                                 "(beside the baseline for a NorCal model)")
    p.add_argument("--draw-count", type=int, metavar="N",
                   help="how many images --draw draws (default 8)")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="skip files that cannot be read as images (listed in RESULTS.skipped.json) "
                        "instead of stopping")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads (default: one per core; "
                                               "with --ray: 1 per worker)")
    add_ray_arguments(p, gpus=True)


def run(args) -> int:
    from dataclasses import replace

    from norcal.cli.terminal import SafeConsole as Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, \
        TimeElapsedColumn
    from rich.text import Text

    from norcal.cli.options import check_outputs
    from norcal.runtime.backends import backend_for, needs_gpu
    from norcal.workflows.infer import InferOptions, prepare_infer, run_infer, skipped_path

    console = Console(stderr=True, soft_wrap=True)
    options = InferOptions(args.model, args.inputs, args.output, batch_size=args.batch, provider=args.provider,
                           threads=args.threads, min_size=args.min_size, max_size=args.max_size,
                           image_ids=args.image_ids, split=args.split, table=args.table, masks=not args.no_masks,
                           skip_unreadable=args.skip_unreadable, draw_dir=args.draw, draw_count=args.draw_count)
    options.check()
    options = replace(options, ray=ray_options(args, needs_gpu(args.model, args.provider)))
    if options.ray is not None and options.ray.gpus_per_worker and args.gpus_per_worker is None:
        # the GPUs each worker asks for come from the provider or the engine, not a flag
        backend = backend_for(args.model)  # a GPU backend without a CPU provider: its file asks for the GPU
        why = (f"--provider {args.provider}" if backend.cpu_provider is not None
               else f"the {backend.title} {backend.file_noun} {args.model}")
        args._flags = {**FLAGS, "gpus_per_worker": why}

    def outputs(paths):  # before any file is read; the errors name the flags
        check_outputs([args.model, *args.inputs, *paths, args.image_ids, args.table],
                      files={"-o": args.output,
                             "skipped list": skipped_path(args.output) if args.skip_unreadable else None},
                      folders={"--draw": args.draw})

    job = prepare_infer(options, check_outputs=outputs)
    ray, spec = options.ray, job.spec
    where = "" if ray is None else (f" on Ray ({ray.address or 'default address'}, {ray.num_workers} "
                                    f"worker{'s' if ray.num_workers > 1 else ''})")
    source = FLAGS.get(job.category_source, job.category_source)
    console.print(f"{job.runner_name}{where}: {len(job.paths)} images, batch {args.batch}, resize "
                  f"{spec.min_size}/{spec.max_size} {spec.input_format}, categories from {source}")

    class Rate(ProgressColumn):
        def render(self, task):
            return Text(f"{task.speed:.1f} images/s" if task.speed else "- images/s")

    with Progress(TextColumn("infer"), BarColumn(), MofNCompleteColumn(), Rate(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("infer", total=len(job.paths))
        result = run_infer(job, on_done=lambda n: progress.advance(task, n))
    console.print(f"wrote {args.output}: {result.num_detections} detections on {result.num_images} images")
    if result.skipped_path is not None:
        console.print(f"wrote {result.skipped_path}: {len(result.skipped)} file(s) skipped")
    if result.pictures:
        console.print(f"wrote {len(result.pictures)} pictures to {args.draw}")
    if result.skipped:
        console.print(f"[yellow]{len(result.skipped)} file(s) skipped:[/yellow]")
        for p, why in result.skipped:
            console.print(f"  {p}: {why}")
    return 0
