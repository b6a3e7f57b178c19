"""Inference on images into LVIS/COCO results JSON: the job behind ``norcal infer``.

Two steps, so that a caller can show what will run before it runs: :func:`prepare_infer`
checks everything that can be checked before any image goes through the network (the image
files, their ids, the category ids, the model against the ONNX contract, every image
readable) and opens the runner; :func:`run_infer` runs the images here or on Ray, streams the
results to the output in image order, writes the list of skipped files and the pictures, and
returns what it did.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from norcal.core.errors import NorcalError

if TYPE_CHECKING:
    from norcal.runtime.ray_inference import RayOptions


@dataclass(frozen=True)
class InferOptions:
    """What to run and where the results go.

    model: .onnx (ONNX Runtime, ``provider``, ``threads`` intra-op threads) or a TensorRT
    engine. inputs: image files and folders (searched recursively). output: the results JSON.
    min_size / max_size: override the model's resize. image_ids: COCO/LVIS annotations giving
    image ids by file name (and category ids), or an Ultralytics data.yaml (its ``split``: its
    images, matched by path, run when ``inputs`` is empty); files it does not list are skipped. table:
    calibration table giving category ids (and, for ``draw_dir``, class names and groups).
    masks: write masks of mask models. skip_unreadable: leave out files that are not images
    (listed in :func:`skipped_path`) instead of stopping. draw_dir / draw_count: pictures of the
    first images' detections beside the stripped baseline. ray: run on a Ray cluster.
    """

    model: str | os.PathLike
    inputs: Sequence[str | os.PathLike]
    output: str | os.PathLike
    batch_size: int = 1
    provider: str | None = "auto"
    threads: int | None = None
    min_size: int | None = None
    max_size: int | None = None
    image_ids: str | os.PathLike | None = None
    split: str = "val"
    table: str | os.PathLike | None = None
    masks: bool = True
    skip_unreadable: bool = False
    draw_dir: str | os.PathLike | None = None
    draw_count: int | None = None  # None: DRAW_COUNT
    ray: RayOptions | None = None

    def check(self) -> None:
        """The options on their own (no file is read)."""
        if self.batch_size < 1:
            raise NorcalError(f"batch_size must be >= 1, got {self.batch_size}", param="batch_size")
        if self.threads is not None and self.threads < 1:
            raise NorcalError(f"threads must be >= 1, got {self.threads}", param="threads")
        if self.ray is not None and self.draw_dir is not None:
            raise NorcalError("draw_dir is not available with ray: draw with a run on this machine",
                              param=("draw_dir", "ray"))
        if self.draw_dir is None and self.draw_count is not None:
            raise NorcalError("draw_count needs draw_dir: it says how many images to draw there",
                              param=("draw_count", "draw_dir"))
        if self.draw_dir is not None and self.draw_count is not None and self.draw_count < 1:
            raise NorcalError(f"draw_count must be >= 1, got {self.draw_count}", param="draw_count")


DRAW_COUNT = 8  # pictures drawn when draw_dir is given without draw_count


def skipped_path(output: str | os.PathLike) -> Path:
    """``results.json`` -> ``results.skipped.json``: the files ``skip_unreadable`` left out."""
    p = Path(output)
    return p.with_name((p.stem if p.suffix == ".json" else p.name) + ".skipped.json")


@dataclass
class InferJob:
    """A checked run, ready to go: the images to run, the runner (None on Ray: the workers
    open their own), how inputs are prepared, the category ids and where they come from
    (``category_source``: "image_ids", "table NAME", "model metadata", "table NAME (model
    metadata)" or "class index + 1"), and the files already left out as (path, reason):
    not in the annotations (``not_listed``), or not readable as images (``unreadable``)."""

    options: InferOptions
    paths: list[Path]
    image_ids: list[Any]
    runner: Any
    runner_name: str
    spec: Any  # norcal.core.contract.Preprocessing
    category_ids: list[int] | None
    category_source: str
    with_masks: bool
    draw_table: Any = None  # norcal.core.calibration.tables.CalibrationTable
    not_listed: list[tuple[Path, str]] = field(default_factory=list)
    unreadable: list[tuple[Path, str]] = field(default_factory=list)
    prepare_seconds: float = 0.0

    @property
    def skipped(self) -> list[tuple[Path, str]]:
        """Every file left out so far, as (path, reason)."""
        return self.not_listed + self.unreadable


@dataclass
class InferResult:
    """What a run did: detections and images written to ``results_path``, every file left out
    (``skipped``: not in the annotations, unreadable), the skipped list's path (with
    ``skip_unreadable``), the pictures drawn, and seconds per stage (prepare, infer, draw)."""

    results_path: Path
    num_detections: int
    num_images: int
    skipped: list[tuple[Path, str]]
    skipped_path: Path | None = None
    pictures: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def _category_ids(options: InferOptions, meta: dict, from_annotations, annotation_names=None):
    """The category ids of the model's classes and where they come from; ids taken from
    ``image_ids`` (``annotation_names``: its category names in id order) or ``table`` are refused
    unless their names are the class names the model records."""
    from norcal.core.contract import NUM_CLASSES, TABLE, check_class_names, metadata_category_ids, \
        metadata_class_names
    from norcal.core.calibration.tables import builtin_names, load_table

    model_names = metadata_class_names(meta)  # checked whatever the ids' source
    ids, source, param = from_annotations, "image_ids", ("image_ids",)
    names, where = annotation_names, str(options.image_ids)
    if ids is None and options.table:
        table = load_table(options.table)
        ids, source, param = table.category_ids, f"table {options.table}", ()
        names, where = table.names, f"table {options.table}"
    if ids is None:
        ids, source = metadata_category_ids(meta), "model metadata"
    if ids is None and meta.get(TABLE) in builtin_names():
        ids, source = load_table(meta[TABLE]).category_ids, f"table {meta[TABLE]} (model metadata)"
    n = meta.get(NUM_CLASSES)
    if ids is not None and n and n.isdigit() and int(n) != len(ids):
        raise NorcalError(f"the model has {n} classes but {source} lists {len(ids)} categories",
                          param=param if source == "image_ids" else ())
    if ids is not None and names is not None:
        check_class_names(model_names, names, ids, where,
                          "image_ids" if source == "image_ids" else "table")
    return ids, source if ids is not None else "class index + 1"


def _draw_table(options: InferOptions, meta: dict):
    """The table naming and grouping classes in the pictures: ``table``, else the model's."""
    from norcal.core.contract import TABLE
    from norcal.core.calibration.tables import builtin_names, load_table

    if options.table:
        return load_table(options.table)
    if meta.get(TABLE) in builtin_names():
        return load_table(meta[TABLE])
    raise NorcalError("draw_dir needs class names and training counts: pass table (built-in name, "
                      "calibration JSON or training annotation file)", param=("draw_dir", "table"))


def _split_image_ids(options: InferOptions) -> dict[Path, int] | None:
    """With ``image_ids`` an Ultralytics data.yaml: its split's images (real paths) -> ids."""
    from norcal.core.datasets.ultralytics_dataset import is_dataset_description
    from norcal.core.datasets.yolo_ground_truth import split_image_ids

    if options.image_ids and is_dataset_description(options.image_ids):
        return split_image_ids(options.image_ids, options.split)
    if not options.inputs:
        raise NorcalError("inputs: no image files or folders given (only an image_ids data.yaml "
                          "names its own: its split's)", param=("inputs", "image_ids"))
    return None


def _image_id(path: Path, by_name: dict[str, int] | None, by_path: dict[Path, int] | None = None):
    if by_path is not None:
        return by_path[path.resolve()]
    if by_name is not None:
        return by_name[path.name]
    return int(path.stem) if path.stem.isdigit() else path.stem


def _check_unique_ids(paths: list[Path], by_name: dict[str, int] | None, annotations=None,
                      by_path: dict[Path, int] | None = None) -> None:
    """Refuse two files that get one image id: their detections would merge into one image's
    results (1.png and 001.jpg, a file given twice, one base name in two folders)."""
    seen: dict = {}
    for p in paths:
        iid = _image_id(p, by_name, by_path)
        if iid in seen:
            how = "the same file given twice" if seen[iid].resolve() == p.resolve() else \
                (f"{p.name} in {annotations}" if by_name is not None else "by file name")
            raise NorcalError(f"{seen[iid]} and {p} get one image id {iid} ({how}): their detections "
                              "would merge; rename one or run them separately")
        seen[iid] = p


def _check_outputs(options: InferOptions, paths: list[Path]) -> None:
    from norcal.core.files.outputs import check_apart, check_output_dir, check_output_file

    check_apart([Path(p) for p in (options.model, *options.inputs, *paths, options.image_ids, options.table)
                 if p is not None and Path(p).exists()],
                {"output": options.output,
                 "skipped list": skipped_path(options.output) if options.skip_unreadable else None},
                {"draw_dir": options.draw_dir})
    check_output_file(options.output, "output")
    if options.skip_unreadable:
        check_output_file(skipped_path(options.output), "skipped list")
    if options.draw_dir is not None:
        check_output_dir(options.draw_dir, "draw_dir")


@dataclass
class _Listed:
    """The image files the annotations list, and what the annotations give about them: ids by
    file name (COCO/LVIS) or by path (a data.yaml's split), category ids and names, sizes, and
    the files they do not list as (path, reason)."""

    paths: list[Path]
    by_name: dict[str, int] | None = None
    categories: list[int] | None = None
    names: list = field(default_factory=list)
    sizes: dict = field(default_factory=dict)
    not_listed: list[tuple[Path, str]] = field(default_factory=list)


def _listed_images(options: InferOptions, paths: list[Path], by_path: dict[Path, int] | None) -> _Listed:
    """``paths`` cut down to the images ``image_ids`` lists (all of them without it)."""
    from norcal.runtime.results import category_ids_from_annotations

    listed = _Listed(paths)
    if by_path is not None:  # a data.yaml: its split's images, matched by path
        from norcal.core.datasets.yolo_ground_truth import dataset_categories

        listed.categories, listed.names = dataset_categories(options.image_ids)
        where = f"{options.image_ids}'s split {options.split!r}"
        listed.not_listed = [(p, f"not in {where}") for p in paths if p.resolve() not in by_path]
        listed.paths = [p for p in paths if p.resolve() in by_path]
        if not listed.paths:
            raise NorcalError(f"none of the {len(listed.not_listed)} image files is in {where} (matched by "
                              f"path, e.g. {listed.not_listed[0][0]})")
    elif options.image_ids:
        listed.categories, listed.by_name = category_ids_from_annotations(
            options.image_ids, sizes=listed.sizes, names=listed.names, split=options.split)
        unknown = [p for p in paths if p.name not in listed.by_name]
        listed.paths = [p for p in paths if p.name in listed.by_name]
        if not listed.paths:
            raise NorcalError(f"none of the {len(unknown)} image files is in {options.image_ids} "
                              f"(matched by file name, e.g. {unknown[0].name})")
        listed.not_listed = [(p, f"not in {options.image_ids}") for p in unknown]
    return listed


def _open_checked_runner(options: InferOptions):
    """The runner (on Ray one on the CPU, only for the metadata here: the workers, maybe on GPU
    nodes, open their own), its backend on Ray (None here), and the model's metadata, checked
    against the ONNX contract."""
    from norcal.core.contract import check_detector
    from norcal.runtime.inference import runner_metadata
    from norcal.runtime.runners import backend_of, open_runner

    backend = None
    if options.ray is None:
        runner = open_runner(options.model, options.provider, options.threads)
    else:
        backend = backend_of(options.model)
        runner = open_runner(options.model, backend.cpu_provider, 1)
    meta = runner_metadata(runner)
    check_detector(Path(options.model).name, runner.input_names, runner.output_names, meta)
    return runner, backend, meta


def _readable_images(options: InferOptions, paths: list[Path], spec) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The files readable as images (checked before any work), and the others as (path, reason)."""
    from norcal.runtime.images import unreadable_files

    unreadable = unreadable_files(paths, skip=options.skip_unreadable, sizes=(spec.min_size, spec.max_size))
    if unreadable:
        gone = {p for p, _ in unreadable}
        paths = [p for p in paths if p not in gone]
        if not paths:
            raise NorcalError(f"none of the {len(gone)} image files could be read, e.g. "
                              f"{unreadable[0][0]}: {unreadable[0][1]}")
    return paths, unreadable


def prepare_infer(options: InferOptions,
                  check_outputs: Callable[[list[Path]], None] | None = None) -> InferJob:
    """Check the options and inputs and open the runner; nothing is run or written yet.

    check_outputs(image_paths): called once the image files are known, before any file is
    read, to refuse outputs that cannot be written or touch an input (default: the output,
    the skipped list and draw_dir checked against the model, the inputs and the annotations).
    """
    from norcal.core.contract import input_spec
    from norcal.runtime.image_files import expand_inputs
    from norcal.runtime.images import check_annotated_sizes

    t0 = time.perf_counter()
    options.check()
    ray = options.ray
    by_path = _split_image_ids(options)
    paths = expand_inputs(list(options.inputs)) if options.inputs or by_path is None else list(by_path)
    if not paths:
        raise NorcalError("no image files found in " + ", ".join(map(str, options.inputs)))
    (check_outputs or functools.partial(_check_outputs, options))(paths)
    listed = _listed_images(options, paths, by_path)
    paths, by_name = listed.paths, listed.by_name
    _check_unique_ids(paths, by_name, options.image_ids, by_path)
    runner, backend, meta = _open_checked_runner(options)
    spec = input_spec(meta, options.min_size, options.max_size)
    cat_ids, cat_source = _category_ids(options, meta, listed.categories, listed.names)
    paths, unreadable = _readable_images(options, paths, spec)
    if listed.sizes:
        check_annotated_sizes(paths, by_name, listed.sizes, options.image_ids)
    with_masks = options.masks and "masks" in runner.output_names
    draw_table = _draw_table(options, meta) if options.draw_dir is not None else None
    name = runner.name
    if ray is not None and backend.name_for is not None:  # the workers' runners, not this one
        name = backend.name_for(options.provider)
    return InferJob(options, paths, [_image_id(p, by_name, by_path) for p in paths],
                    runner if ray is None else None, name, spec, cat_ids, cat_source, with_masks,
                    draw_table, listed.not_listed, unreadable, time.perf_counter() - t0)


def run_infer(job: InferJob, on_done: Callable[[int], None] | None = None) -> InferResult:
    """Run the prepared job: results streamed to ``options.output`` in image order, then the
    skipped list (with ``skip_unreadable``) and the pictures (with ``draw_dir``).
    on_done(n): n more image files finished (progress)."""
    from norcal.core.files.fileio import write_json
    from norcal.runtime.inference import run_images
    from norcal.runtime.results import results_fragment, results_writer

    options, ray = job.options, job.options.ray
    failed = list(job.skipped)
    drawn: list = []
    to_draw = (options.draw_count or DRAW_COUNT) if job.draw_table is not None else 0
    pixels: dict[Path, object] = {}  # the first decoded images, kept for the pictures

    def keep(path, image):
        if len(drawn) + len(pixels) < to_draw:
            pixels[path] = image

    done_images = 0
    t0 = time.perf_counter()
    with results_writer(options.output) as out:
        if ray is None:
            id_of = dict(zip(job.paths, job.image_ids))
            for path, det in run_images(job.runner, job.paths, options.batch_size, job.spec, failed,
                                        on_done=on_done, skip_unreadable=options.skip_unreadable,
                                        on_image=keep if to_draw else None):
                out.add(*results_fragment(id_of[path], det, job.category_ids, job.with_masks))
                done_images += 1
                if path in pixels:
                    drawn.append((path, pixels.pop(path), det))
        else:
            from norcal.runtime.ray_inference import ResultsFormat, run_images_ray
            from norcal.runtime.runners import open_runner

            make_runner = functools.partial(open_runner, Path(options.model).resolve(), options.provider,
                                            ray.threads)
            for image in run_images_ray(make_runner, [p.resolve() for p in job.paths], job.image_ids,
                                        job.spec, ResultsFormat(job.category_ids, job.with_masks),
                                        options.batch_size, ray,
                                        failed=failed if options.skip_unreadable else None, on_done=on_done):
                out.add(image.text, image.count)
                done_images += 1
        if not done_images:
            raise NorcalError(f"none of the {len(job.paths) + len(job.unreadable)} image files could be read, "
                              f"e.g. {failed[-1][0]}: {failed[-1][1]}")
    seconds = {"prepare": job.prepare_seconds, "infer": time.perf_counter() - t0}
    result = InferResult(Path(options.output), out.count, done_images, failed, seconds=seconds)
    if options.skip_unreadable:
        result.skipped_path = skipped_path(options.output)
        write_json(result.skipped_path, {
            "results": str(options.output), "images_run": done_images,
            "skipped": [{"file": str(p), "reason": why} for p, why in failed]})
    if drawn:
        from norcal.workflows.pictures import draw_model_pictures

        t0 = time.perf_counter()
        result.pictures = draw_model_pictures(options.model, drawn, options.draw_dir, job.draw_table,
                                              options.provider)
        seconds["draw"] = time.perf_counter() - t0
    return result
