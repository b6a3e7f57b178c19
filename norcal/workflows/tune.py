"""Tune NorCal's gamma: run the network once, then re-score what it left per gamma.

NorCal only changes the classifier's scores, and it acts before NMS and the top-K cut. So the
expensive part runs once per image and its results are cached; each gamma then re-runs only
the rest on the cache, batched, and the detections are evaluated with LVIS AP. What is cached
and re-run is the detector family's business (:meth:`norcal.export.families.Detector.cache` /
``rescore``: an R-CNN caches its box predictor's inputs and re-runs the predictor's inference,
a RetinaNet each gamma's per-level candidates and re-runs NMS); this module only reads and
prepares the images as the deployed graph's host code does, cuts the job, and evaluates.

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

import numpy as np

from norcal.core.calibration import check_gamma, log_prior
from norcal.core.errors import NorcalError
from norcal.core.tables import CalibrationTable

if TYPE_CHECKING:
    from norcal.export.families import Detector, TuneCache

MAX_CACHE_BYTES = 1 << 40  # a cache budget beyond 1 TiB is a typo, not a machine
MASK_IOU_TYPES = ("segm", "boundary")


def resolve_table(arg: str | os.PathLike | CalibrationTable) -> CalibrationTable:
    """A table as given, or what :func:`norcal.core.tables.load_table` makes of a name or path
    (a built-in, a table JSON, or a COCO/LVIS training annotation file)."""
    from norcal.core.tables import load_table

    return arg if isinstance(arg, CalibrationTable) else load_table(arg)


# ----------------------------------------------------------------------------- the cache

def image_batches(preprocessing, images: Sequence[tuple[Any, os.PathLike]], batch_size: int):
    """(image ids, prepared batch) for ``images`` ((image_id, path) pairs), resized, padded and
    batched per ``preprocessing`` (the detector's :class:`norcal.core.contract.Preprocessing`:
    ResizeShortestEdge or letterbox) as the exported graph's host code does (:func:`norcal.runtime.preprocess.prepare_batch`)."""
    from norcal.runtime.images import read_images, unreadable_error
    from norcal.runtime.preprocess import prepare_batch

    if batch_size < 1:
        raise NorcalError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
    if not images:
        raise NorcalError("no images to cache")
    sizes = (preprocessing.min_size, preprocessing.max_size)
    for s in range(0, len(images), batch_size):
        chunk = images[s:s + batch_size]
        bad: list = []
        arrays = read_images([path for _, path in chunk], skipped=bad, sizes=sizes)
        if bad:  # name the first, count the unreadable ones in the whole rest
            rest = [Path(p) for _, p in images[s:]]
            rest = rest[rest.index(bad[0][0]) + 1:]
            raise unreadable_error(bad[0][0], bad[0][1], rest, skippable=False)
        yield [i for i, _ in chunk], prepare_batch(arrays, preprocessing)


def cache_images(detector: Detector, images: Sequence[tuple[Any, os.PathLike]], priors: Sequence,
                 mechanism: str = "exp", batch_size: int = 4,
                 on_done: Callable[[int], None] | None = None, with_masks: bool = False) -> TuneCache:
    """One network pass of ``detector`` over ``images`` ((image_id, path) pairs) in batches:
    what the sweep re-scores at each of ``priors`` (:meth:`Detector.cache`). with_masks: also
    the mask head's maps (``images`` must then fit one batch)."""
    if with_masks and len(images) > batch_size:
        raise NorcalError(f"a cache with features holds one batch: {len(images)} images, "
                          f"batch_size {batch_size}")
    return detector.cache(image_batches(detector.preprocessing, images, batch_size), priors, mechanism,
                          on_done, with_masks)


def concat_caches(parts: Sequence[TuneCache]) -> TuneCache:
    """Caches of consecutive batches as one, as :func:`cache_images` would have made it for
    all their images."""
    return type(parts[0]).concat(parts)


# ----------------------------------------------------------------------------- re-scoring

def rescore_images(detector: Detector, cache: TuneCache, index: int, prior: np.ndarray | None,
                   mechanism: str = "exp", batch_size: int = 16):
    """The detections of every cached image at the sweep's ``index``-th prior (``prior``; None:
    the plain classifier), as a list of :class:`norcal.runtime.postprocess.ImageDetections` in
    original image coordinates (boxes rescaled and clipped as for the graph's outputs)."""
    from norcal.runtime.postprocess import split_outputs

    outputs = detector.rescore(cache, index, prior, mechanism, batch_size)
    return split_outputs(outputs, cache.image_sizes, cache.original_sizes, cache.keep_empty_boxes,
                         cache.mask_paste)


def to_eval_detections(image_ids: Sequence, dets, category_ids: Sequence[int], masks: bool = False):
    """Per-image detections -> :class:`norcal.evaluation.Detections` (bbox as x, y, w, h with
    w, h computed in float32, as the results JSON of ``norcal infer`` has them; with
    ``masks``, the masks pasted and RLE-encoded as there too)."""
    from norcal.evaluation import Detections
    from norcal.runtime.results import detections_to_results

    cats = np.asarray(category_ids, dtype=np.int64)
    n = [len(d) for d in dets]
    img = np.repeat(np.asarray([int(i) for i in image_ids], dtype=np.int64), n)
    if sum(n) == 0:
        return Detections(img, np.zeros(0, np.int64), np.zeros(0), np.zeros((0, 4)), [] if masks else None)
    boxes = np.concatenate([d.boxes for d in dets]).astype(np.float32)
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1).astype(np.float64)
    classes = np.concatenate([d.classes for d in dets])
    if classes.size and (classes.min() < 0 or classes.max() >= len(cats)):
        raise NorcalError(f"class index {int(classes.max())} out of range: {len(cats)} categories")
    scores = np.concatenate([d.scores for d in dets]).astype(np.float32).astype(np.float64)
    rles = None
    if masks:
        rles = [r["segmentation"] for i, d in zip(image_ids, dets)
                for r in detections_to_results(int(i), d, list(category_ids))]
    return Detections(img, cats[classes], scores, xywh, rles)


# ----------------------------------------------------------------------------- the sweep

@dataclass
class SweepPoint:
    gamma: float
    stats: dict[str, float]
    num_detections: int
    seconds: float


@dataclass
class TuneResult:
    """The sweep as data: one :class:`SweepPoint` per gamma, in gamma order."""

    points: list[SweepPoint]
    factor: str
    mechanism: str
    table: str
    num_images: int
    network_seconds: float
    cache_bytes: int  # the largest chunk's cache
    min_count: float | None = None  # counts below it were raised to it
    min_count_clamped: int = 0  # how many classes that raised
    iou_type: str = "bbox"  # what the sweep's AP is measured with
    gt_images: int | None = None  # images the GT lists; those not found were left out

    @property
    def best(self) -> SweepPoint:
        """The gamma with the highest AP (the smallest such gamma on a tie)."""
        return max(self.points, key=lambda p: (p.stats["AP"], -p.gamma))

    def to_json(self) -> dict[str, Any]:
        return {
            "factor": self.factor, "mechanism": self.mechanism, "table": self.table,
            "iou_type": self.iou_type, "num_images": self.num_images, "network_seconds": self.network_seconds,
            "cache_bytes": self.cache_bytes,
            "best": {"gamma": self.best.gamma, "AP": self.best.stats["AP"]},
            "sweep": [{"gamma": p.gamma, "num_detections": p.num_detections, "seconds": p.seconds,
                       "stats": {k: float(v) for k, v in p.stats.items()}} for p in self.points],
        }


def _priors(table: CalibrationTable, gammas: Sequence[float], factor: str,
            min_count: float | None = None, background: str = "last") -> tuple[list, int]:
    counts, clamped = table.clamped_counts(None, min_count)
    return [None if g == 0 else log_prior(counts, check_gamma(g, factor), factor, background,
                                          names=table.names) for g in gammas], clamped


def _concat(parts: list):
    """Concatenate :class:`norcal.evaluation.Detections` chunks (boxes, and masks if they have them)."""
    from norcal.evaluation import Detections

    rles = None if parts[0].rles is None else [r for d in parts for r in d.rles]
    return Detections(*(np.concatenate([getattr(d, k) for d in parts])
                        for k in ("image_ids", "category_ids", "scores", "boxes")), rles)


def rescore_gamma(detector: Detector, cache: TuneCache, index: int, prior, mechanism: str,
                  batch_size: int, category_ids: Sequence[int], masks: bool = False):
    """The sweep's ``index``-th gamma (log prior ``prior``) on one cache -> its
    :class:`norcal.evaluation.Detections` (with masks when ``masks``: the cache was made
    ``with_masks``)."""
    dets = rescore_images(detector, cache, index, prior, mechanism, batch_size)
    return to_eval_detections(cache.image_ids, dets, category_ids, masks=masks)


def evaluate_gamma(gt, parts: list, gamma: float, topk: int, seconds: float = 0.0,
                   iou_type: str = "bbox") -> SweepPoint:
    """One gamma's detections (chunks of :class:`norcal.evaluation.Detections`) -> its
    :class:`SweepPoint` (LVIS AP with ``iou_type``); ``seconds`` already spent on it are added."""
    from norcal.evaluation import evaluate

    t0 = time.perf_counter()
    ev = _concat(parts)
    if len(ev) == 0:
        raise NorcalError(f"gamma {gamma:g}: no detections on any image")
    res = evaluate(gt, ev, iou_type, topk)
    return SweepPoint(gamma, dict(res.stats), len(ev), seconds + time.perf_counter() - t0)


class _Accumulator:
    """Per-gamma detections gathered chunk by chunk, then evaluated; seconds per gamma."""

    def __init__(self, detector: Detector, table: CalibrationTable, gammas: Sequence[float], factor: str,
                 mechanism: str, batch_size: int, min_count: float | None = None,
                 iou_type: str = "bbox"):
        if detector.num_classes != table.num_classes:
            raise NorcalError(f"the model has {detector.num_classes} classes but table "
                              f"{table.name!r} has {table.num_classes}")
        self.detector, self.table, self.mechanism = detector, table, mechanism
        self.gammas = [float(g) for g in gammas]
        # the prior's layout is the classifier's: [C+1] with a background slot, [C] without
        self.priors, self.clamped = _priors(table, gammas, factor, min_count, detector.classifier.background)
        self.batch_size = batch_size
        self.iou_type = iou_type
        self.parts: list[list] = [[] for _ in self.gammas]
        self.seconds = [0.0] * len(self.gammas)

    @property
    def with_masks(self) -> bool:
        return self.iou_type in MASK_IOU_TYPES

    def add(self, cache: TuneCache, on_step: Callable[[int], None] | None = None) -> None:
        for k, prior in enumerate(self.priors):
            t0 = time.perf_counter()
            self.parts[k].append(rescore_gamma(self.detector, cache, k, prior, self.mechanism,
                                               self.batch_size, self.table.category_ids, self.with_masks))
            self.seconds[k] += time.perf_counter() - t0
            if on_step:
                on_step(len(cache))

    @property
    def topk(self) -> int:
        return self.detector.topk

    def evaluate(self, gt, on_gamma: Callable[[SweepPoint], None] | None = None) -> list[SweepPoint]:
        points = []
        for k, g in enumerate(self.gammas):
            point = evaluate_gamma(gt, self.parts[k], g, self.topk, self.seconds[k], self.iou_type)
            self.parts[k] = []  # free as we go
            points.append(point)
            if on_gamma:
                on_gamma(point)
        return points


def sweep(detector: Detector, cache: TuneCache, gt, table: CalibrationTable, gammas: Sequence[float],
          factor: str = "cdt", mechanism: str = "exp", batch_size: int = 16,
          on_gamma: Callable[[SweepPoint], None] | None = None,
          min_count: float | None = None) -> list[SweepPoint]:
    """Evaluate (LVIS bbox AP, top K per image) NorCal at each gamma on cached images.

    gt: a prepared GT (:func:`norcal.evaluation.prepare_gt`) or its path; table: N_c and the
    class -> category id map (the model's class order); cache: the detector's, made for these
    gammas' priors (:func:`cache_images`)."""
    from norcal.evaluation import prepare_gt

    acc = _Accumulator(detector, table, gammas, factor, mechanism, batch_size, min_count)
    acc.add(cache)
    return acc.evaluate(prepare_gt(gt, table), on_gamma)


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
    acc: _Accumulator
    iou_type: str = "bbox"
    gt_images: int = 0  # images the GT lists (the evaluation covers only those in pairs)

    @property
    def gammas(self) -> list[float]:
        return self.acc.gammas

    @property
    def with_masks(self) -> bool:
        """Each gamma's masks are computed (mask IoU types): one network batch per cache."""
        return self.iou_type in MASK_IOU_TYPES


def plan_tune(weights: os.PathLike, gt: os.PathLike, images: os.PathLike, gammas: Sequence[float],
              table: str | os.PathLike | CalibrationTable | None = None, *,
              config: os.PathLike | None = None, factor: str = "cdt", mechanism: str = "exp",
              batch_size: int = 4, max_cache_bytes: int = 2 << 30,
              min_count: float | None = None, iou_type: str = "bbox") -> TunePlan:
    """Check :func:`tune`'s arguments, read the GT and the checkpoint once, and cut the job."""
    from norcal.core.fileio import read_json
    from norcal.core.schemas import GROUND_TRUTH
    from norcal.evaluation import IOU_TYPES, prepare_gt
    from norcal.evaluation.ground_truth import check_table_matches
    from norcal.export.families import load_detector
    from norcal.runtime.images import unreadable_files

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
    if table is not None:
        table = resolve_table(table)
    gt_data = read_json(gt, "GT", GROUND_TRUTH)
    pairs = images_from_gt(gt_data, images, str(gt))
    gt_images = len(gt_data["images"])
    if len(pairs) < gt_images:  # else their objects would count as missed
        gt_data = gt_of_images(gt_data, [i for i, _ in pairs])
    unreadable_files([p for _, p in pairs], skippable=False)  # a bad image fails now, not mid-pass
    detector = load_detector(weights, config)
    masks = iou_type in MASK_IOU_TYPES
    if masks and not detector.has_masks:
        raise NorcalError(f"iou_type {iou_type} needs a model with a mask head; {weights} has "
                          "none (use bbox)", param="iou_type")
    if table is None:
        from norcal.export.graph.calibrate import default_table

        table = default_table(detector.num_classes)
    if detector.num_classes != table.num_classes:
        raise NorcalError(f"the model has {detector.num_classes} classes but table {table.name!r} "
                          f"has {table.num_classes}")
    prepared = prepare_gt(gt_data, table, where=str(gt))
    check_table_matches(table, prepared)
    if masks:
        prepared.rles()  # a GT without masks fails now, not after the network pass
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
    acc = _Accumulator(detector, table, gammas, factor, mechanism, max(batch_size, 8), min_count, iou_type)
    return TunePlan(Path(weights), None if config is None else Path(config), pairs, detector, table,
                    prepared, chunk, batch_size, factor, mechanism, min_count, acc, iou_type, gt_images)


def tune(weights: os.PathLike, gt: os.PathLike, images: os.PathLike, gammas: Sequence[float],
         table: str | os.PathLike | CalibrationTable | None = None, *, config: os.PathLike | None = None,
         factor: str = "cdt", mechanism: str = "exp", batch_size: int = 4,
         max_cache_bytes: int = 2 << 30,
         progress: Callable[[str, int, int], None] | None = None,
         min_count: float | None = None, iou_type: str = "bbox") -> TuneResult:
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
    """
    plan = plan_tune(weights, gt, images, gammas, table, config=config, factor=factor,
                     mechanism=mechanism, batch_size=batch_size, max_cache_bytes=max_cache_bytes,
                     min_count=min_count, iou_type=iou_type)
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
                      min_count, acc.clamped, iou_type, plan.gt_images)


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
