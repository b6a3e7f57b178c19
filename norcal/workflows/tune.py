"""Tune NorCal's gamma: run the network once, then re-score what it left per gamma.

NorCal only changes the classifier's scores, and it acts before NMS and the top-K cut. So the
expensive part runs once per image and its results are cached; each gamma then re-runs only
the rest on the cache, batched, and the detections are evaluated with AP (LVIS federated or
COCO rules, from the GT or forced: :mod:`norcal.evaluation.rules`). The network
pass and the re-scoring: :mod:`norcal.workflows.tune_cache`; the priors, the per-gamma
detections and their AP: :mod:`norcal.workflows.tune_sweep`; this module checks the arguments,
cuts the job into chunks and runs it.

    from norcal.workflows.tune import tune
    result = tune("model_final.pth", "train_5k.json", "train_images/", gammas=[0, 0.5, 1.0],
                  table="lvis_v1", config="config.yaml")
    result.best.gamma, [p.stats["AP"] for p in result.points]

A cache can be large (an LVIS R-CNN: ~24 MB per image). ``tune`` therefore streams: images go
through in chunks whose cache (:meth:`~norcal.export.families.Detector.cache_bytes`) fits a
memory budget, each chunk is re-scored at every gamma and dropped, and only the detections
(<= 300 per image and gamma) are kept for the evaluation at the end.

With ``iou_type`` segm or boundary (mask models), each gamma's detections also need their
masks, from the mask head on that gamma's boxes: the cache then holds one network batch and
the maps the mask head pools from, and every gamma's masks are pasted and RLE-encoded (as
``norcal infer`` writes them) before the next batch runs.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from norcal.core.calibration.formula import check_gamma
from norcal.core.calibration.classifier_option import ClassifierActivation, check_classifier
from norcal.core.decoding import Decoding
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import CalibrationTable
from norcal.workflows.tune_cache import cache_images
from norcal.workflows.tune_sweep import MASK_IOU_TYPES, SweepAccumulator, TuneResult

if TYPE_CHECKING:
    from norcal.export.families import Detector

MAX_CACHE_BYTES = 1 << 40  # a cache budget beyond 1 TiB is a typo, not a machine


def resolve_table(arg: str | os.PathLike | CalibrationTable) -> CalibrationTable:
    """A table as given, or what :func:`norcal.core.calibration.tables.load_table` makes of a name or path
    (a built-in, a table JSON, or a COCO/LVIS training annotation file)."""
    from norcal.core.calibration.tables import load_table

    return arg if isinstance(arg, CalibrationTable) else load_table(arg)


def images_from_gt(gt_path: os.PathLike | dict, image_dir: os.PathLike,
                   where: str | None = None) -> list[tuple[int, Path]]:
    """(image_id, path) for every GT image whose file (by base name) is in ``image_dir``.

    gt_path: the annotation file or its already loaded dict (``where`` then names it)."""
    from norcal.runtime.images import check_annotated_sizes
    from norcal.runtime.results import category_ids_from_annotations

    sizes: dict[str, tuple[int, int]] = {}
    _, by_name = category_ids_from_annotations(gt_path, where, sizes)
    if where is None:
        where = str(gt_path)
    d = Path(image_dir)
    if not d.is_dir():
        raise NorcalError(f"{d}: no such folder")
    found = [(i, d / name) for name, i in sorted(by_name.items(), key=lambda kv: kv[1])
             if (d / name).is_file()]
    if not found:
        example = next(iter(by_name), "?")
        raise NorcalError(f"none of the {len(by_name)} images of {where} is in {d} "
                          f"(matched by file name, e.g. {example})")
    check_annotated_sizes([p for _, p in found], by_name, sizes, where)
    return found


def gt_of_images(gt_data: dict, image_ids) -> dict:
    """The validated GT restricted to ``image_ids`` (their images and annotations; categories
    as they are): lvis-api's evaluation with ``params.img_ids`` set to them."""
    keep = set(image_ids)
    return {**gt_data, "images": [im for im in gt_data["images"] if im["id"] in keep],
            "annotations": [a for a in gt_data["annotations"] if a["image_id"] in keep]}


@dataclass
class TunePlan:
    """What :func:`tune` settles before the network pass, checked: the images, the detector,
    the prepared GT, the chunks, and the accumulator holding the sweep's priors.
    :func:`norcal.workflows.ray_tune.tune_ray` carries out the same plan on Ray."""

    weights: Path
    config: Path | None
    pairs: list[tuple[Any, Path]]
    detector: Detector
    table: CalibrationTable
    gt: Any  # prepared (norcal.evaluation.prepare_gt)
    chunk: int  # images per chunk: a multiple of batch_size
    batch_size: int
    factor: str
    mechanism: str
    min_count: float | None
    acc: SweepAccumulator
    iou_type: str = "bbox"
    gt_images: int = 0  # images the GT lists (the evaluation covers only those in pairs)
    rules: Any = None  # the evaluation rules (norcal.evaluation.rules.RuleChoice)
    decoding: Decoding | None = None  # the detector's (None: its family's own)
    classifier: ClassifierActivation | None = None  # the activation the user named (load_detector's)

    @property
    def gammas(self) -> list[float]:
        return self.acc.gammas

    @property
    def with_masks(self) -> bool:
        """Each gamma's masks are computed (mask IoU types): one network batch per cache."""
        return self.iou_type in MASK_IOU_TYPES


def _checked_gammas(gammas: Sequence[float], factor: str, iou_type: str, max_cache_bytes,
                    classifier: ClassifierActivation | None) -> list[float]:
    """The gammas to sweep, once the arguments that need no file pass."""
    from norcal.evaluation import IOU_TYPES

    check_classifier(classifier)
    gammas = [check_gamma(g, factor) for g in gammas]
    if not gammas:
        raise NorcalError("gammas: none to sweep", param="gammas")
    if iou_type not in IOU_TYPES:
        raise NorcalError(f"iou_type must be {', '.join(IOU_TYPES[:-1])} or {IOU_TYPES[-1]}, "
                          f"got {iou_type!r}", param="iou_type")
    if not (isinstance(max_cache_bytes, (int, float)) and math.isfinite(max_cache_bytes)
            and 0 < max_cache_bytes <= MAX_CACHE_BYTES):
        raise NorcalError(f"max_cache_bytes must be a finite number > 0 and <= {MAX_CACHE_BYTES} (1 TiB), "
                          f"got {max_cache_bytes:g}", param="max_cache_bytes")
    return gammas


def _tune_images(gt: os.PathLike, images: os.PathLike | None, split: str) -> tuple[dict, list, int]:
    """The GT (cut down to the images found), the (image_id, path) pairs, every one readable,
    and how many images the GT lists."""
    from norcal.core.datasets.schemas import GROUND_TRUTH
    from norcal.core.datasets.ultralytics_dataset import is_dataset_description
    from norcal.core.datasets.yolo_ground_truth import read_annotations, split_pairs
    from norcal.runtime.images import unreadable_files

    gt_data = read_annotations(gt, "GT", GROUND_TRUTH, split)
    if is_dataset_description(gt):  # the split names its images
        pairs = split_pairs(gt, split, images)
    elif images is None:
        raise NorcalError("images: the folder of the GT's pictures is needed with a COCO/LVIS GT",
                          param="images")
    else:
        pairs = images_from_gt(gt_data, images, str(gt))
    gt_images = len(gt_data["images"])
    if len(pairs) < gt_images:  # else their objects would count as missed
        gt_data = gt_of_images(gt_data, [i for i, _ in pairs])
    unreadable_files([p for _, p in pairs], skippable=False)  # a bad image fails now, not mid-pass
    return gt_data, pairs, gt_images


def _checked_detector(weights, config, decoding, classifier, iou_type: str,
                      table: CalibrationTable | None) -> tuple[Detector, CalibrationTable]:
    """The loaded detector and the table (None: the built-in one for its class count), refused
    where the model lacks the mask head ``iou_type`` needs or the class counts differ."""
    from norcal.export.families import load_detector

    detector = load_detector(weights, config, decoding, classifier)
    if iou_type in MASK_IOU_TYPES and not detector.has_masks:
        raise NorcalError(f"iou_type {iou_type} needs a model with a mask head; {weights} has "
                          "none (use bbox)", param="iou_type")
    if table is None:
        from norcal.export.graph.calibrate import default_table

        table = default_table(detector.num_classes)
    if detector.num_classes != table.num_classes:
        raise NorcalError(f"the model has {detector.num_classes} classes but table {table.name!r} "
                          f"has {table.num_classes}")
    return detector, table


def _prepared_gt(gt_data: dict, table: CalibrationTable, gt, rules: str, masks: bool):
    """The prepared GT, checked against the table, and the evaluation rules chosen for it."""
    from norcal.evaluation import prepare_gt
    from norcal.evaluation.ground_truth import check_table_matches
    from norcal.evaluation.rules import choose_rules

    prepared = prepare_gt(gt_data, table, where=str(gt))
    check_table_matches(table, prepared)
    choice = choose_rules(prepared, rules)
    if masks:
        prepared.rles()  # a GT without masks fails now, not after the network pass
    return prepared, choice


def _chunk_size(detector: Detector, gammas: list[float], batch_size: int, max_cache_bytes, masks: bool) -> int:
    """Images per chunk: whole batches whose cache fits ``max_cache_bytes`` (one batch with masks)."""
    per_image = detector.cache_bytes(1, len(gammas))
    chunk = max(1, int(max_cache_bytes // per_image))
    if chunk < batch_size:
        raise NorcalError(f"one batch of {batch_size} images needs up to "
                          f"{batch_size * per_image / 2**20:.0f} MiB of cache, over the "
                          f"{max_cache_bytes / 2**20:.0f} MiB limit: lower batch_size or raise "
                          f"max_cache_bytes", param=("batch_size", "max_cache_bytes"))
    chunk -= chunk % batch_size  # whole batches only: chunking then changes nothing
    if masks:  # the mask head's maps of batches padded to different sizes do not stack
        chunk = batch_size
    return chunk


def plan_tune(weights: os.PathLike, gt: os.PathLike, images: os.PathLike | None, gammas: Sequence[float],
              table: str | os.PathLike | CalibrationTable | None = None, *,
              config: os.PathLike | None = None, factor: str = "cdt", mechanism: str = "exp",
              batch_size: int = 4, max_cache_bytes: int = 2 << 30,
              min_count: float | None = None, iou_type: str = "bbox", split: str = "val",
              rules: str = "auto", decoding: Decoding | None = None,
              classifier: ClassifierActivation | None = None) -> TunePlan:
    """Check :func:`tune`'s arguments, read the GT and the checkpoint once, and cut the job."""
    gammas = _checked_gammas(gammas, factor, iou_type, max_cache_bytes, classifier)
    if table is not None:
        table = resolve_table(table)
    gt_data, pairs, gt_images = _tune_images(gt, images, split)
    detector, table = _checked_detector(weights, config, decoding, classifier, iou_type, table)
    masks = iou_type in MASK_IOU_TYPES
    prepared, choice = _prepared_gt(gt_data, table, gt, rules, masks)
    chunk = _chunk_size(detector, gammas, batch_size, max_cache_bytes, masks)
    acc = SweepAccumulator(detector, table, gammas, factor, mechanism, max(batch_size, 8), min_count, iou_type,
                           choice)
    return TunePlan(Path(weights), None if config is None else Path(config), pairs, detector, table,
                    prepared, chunk, batch_size, factor, mechanism, min_count, acc, iou_type, gt_images,
                    choice, decoding, classifier)


def tune(weights: os.PathLike, gt: os.PathLike, images: os.PathLike | None, gammas: Sequence[float],
         table: str | os.PathLike | CalibrationTable | None = None, *, config: os.PathLike | None = None,
         factor: str = "cdt", mechanism: str = "exp", batch_size: int = 4,
         max_cache_bytes: int = 2 << 30,
         progress: Callable[[str, int, int], None] | None = None,
         min_count: float | None = None, iou_type: str = "bbox", split: str = "val",
         rules: str = "auto", on_rules: Callable[[str], None] | None = None,
         decoding: Decoding | None = None, classifier: ClassifierActivation | None = None) -> TuneResult:
    """The whole job: build the detector, run it once over the GT's images, sweep gammas.

    table: N_c (see :func:`resolve_table`); None: the built-in table with the model's class
    count. The checkpoint and the GT file are each read once.
    The images go through in chunks whose cache fits ``max_cache_bytes``; each chunk is
    re-scored at every gamma before the next is computed, so memory holds one chunk's cache
    plus the (small) detections of every gamma, whatever the number of images.
    progress: called as ``progress(stage, n, total)`` when n more units of a stage are done
    (stages "network pass" and "re-scoring" count images, "evaluation" gammas; ``total`` is
    the stage's total).
    min_count: counts below it are raised to it (the result says how many classes).
    iou_type: what AP (and so the best gamma) is measured with: bbox, or for a mask model segm
    or boundary (Boundary IoU); the mask types run the mask head on every gamma's detections.
    split: the split of ``gt`` when it is an Ultralytics data.yaml (its images and YOLO labels).
    images: the folder holding the GT's images (matched by file name); with a data.yaml, None
    (the split's images) or a folder holding all of them.
    rules: the evaluation rules, auto (from the GT), lvis or coco
    (:func:`norcal.evaluation.rules.choose_rules`); on_rules: called with the line saying
    which and why once the GT is read, before the network pass.
    decoding: how scores become detections (:class:`norcal.core.decoding.Decoding`, as the
    export's; None: the family's own): every gamma is re-decoded under it from the cache.
    classifier: "softmax" or "sigmoid", the box head's activation where the checkpoint cannot
    tell it (a detectron2 R-CNN without its config: refused without it;
    :func:`norcal.export.families.load_detector`).
    """
    plan = plan_tune(weights, gt, images, gammas, table, config=config, factor=factor,
                     mechanism=mechanism, batch_size=batch_size, max_cache_bytes=max_cache_bytes,
                     min_count=min_count, iou_type=iou_type, split=split, rules=rules,
                     decoding=decoding, classifier=classifier)
    if on_rules:
        on_rules(plan.rules.line)
    pairs, acc = plan.pairs, plan.acc
    net_step = progress_step(progress, "network pass", len(pairs))
    sweep_step = progress_step(progress, "re-scoring", len(pairs) * len(acc.gammas))
    network, peak = 0.0, 0
    for s in range(0, len(pairs), plan.chunk):
        t0 = time.perf_counter()
        cache = cache_images(plan.detector, pairs[s:s + plan.chunk], acc.priors, mechanism,
                             batch_size, net_step, plan.with_masks)
        network += time.perf_counter() - t0
        peak = max(peak, cache.nbytes)
        acc.add(cache, sweep_step)
        del cache
    eval_step = progress_step(progress, "evaluation", len(acc.gammas))
    points = acc.evaluate(plan.gt, lambda p: eval_step())
    return TuneResult(points, factor, mechanism, plan.table.name, len(pairs), network, peak,
                      min_count, acc.clamped, iou_type, plan.gt_images, plan.rules.name, plan.rules.reason)


def progress_step(progress: Callable[[str, int, int], None] | None, stage: str, total: int):
    """``step(n=1)``: report n more units of ``stage`` to a ``progress(stage, n, total)``
    callback (nothing without one)."""
    if progress is None:
        return lambda n=1: None
    return lambda n=1: progress(stage, n, total)


# ----------------------------------------------------------------------------- output

def write_sweep_plot(path: os.PathLike, panels: dict[str, Sequence[tuple[float, dict]]],
                     best: float | None = None, title: str = "NorCal gamma sweep") -> Path:
    """AP, AP_r, AP_c, AP_f (in %) against gamma as a PNG (matplotlib Agg): one panel per
    entry of ``panels`` ({panel title: [(gamma, stats)]}, e.g. {"bbox": ..., "segm": ...})."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from norcal.evaluation.report import save_figure

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels) + 1, 4), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items()):
        g = [x for x, _ in series]
        for key, style in (("AP", "k-o"), ("APr", "r-s"), ("APc", "-^"), ("APf", "b-v")):
            ax.plot(g, [100 * max(s[key], 0) for _, s in series], style, label=key, ms=4)
        if best is not None:
            ax.axvline(best, color="gray", ls="--", lw=1,
                       label=f"best {next(iter(panels))} AP: gamma {best:g}")
        ax.set_xlabel("gamma (0 = plain softmax)")
        ax.set_ylabel(f"{name} AP (%)")
        ax.set_title(f"{title}: {name}" if len(panels) > 1 else title)
        ax.grid(alpha=0.3)
    # one legend, right of the last panel: inside, it hides curves
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save_figure(fig, path)
