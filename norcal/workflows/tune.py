"""Tune NorCal's gamma: run the network once, then re-score cached head outputs per gamma.

NorCal only changes the box classifier's scores, and it acts before class-wise NMS and the
top-K cut. So the expensive part (backbone, RPN, box head) is computed once per image and
cached as the box predictor's inputs (proposals, class logits, box deltas, image sizes); each
gamma then re-runs only the model's own post-processing (``FastRCNNOutputLayers.inference``:
scores, per-class decoding, clipping, score threshold, class-wise NMS, top-K) on the cache,
batched, and the detections are evaluated with LVIS AP.

    from norcal.workflows.tune import tune
    result = tune("model_final.pth", "train_5k.json", "train_images/", gammas=[0, 0.5, 1.0],
                  table="lvis_v1", config="config.yaml")
    result.best.gamma, [p.stats["AP"] for p in result.points]

The cache holds per image P x (C+1) logits and P x 4C deltas (float32): 48 images of the
60-class fixture take 28 MiB, an LVIS model (1203 classes, 1000 proposals) ~24 MB per image.
``tune`` therefore streams: images go through in chunks that fit a memory budget, each chunk
is re-scored at every gamma and dropped, and only the detections (<= 300 per image and
gamma) are kept for the evaluation at the end.

RetinaNet has no box predictor to re-run: its per-level candidates (the top-k (anchor, class)
pairs above the score threshold, per level) are chosen by the calibrated scores themselves, so
they change with gamma. Its cache (:class:`CandidateCache`) holds, per image and per gamma of
the sweep, those candidates (boxes, scores, classes: levels x top-k, ~120 kB per image and
gamma); re-scoring is then the class-wise NMS and the top-K cut.

With ``iou_type`` segm or boundary (mask models), each gamma's detections also need their
masks, from the mask head on that gamma's boxes: the cache then holds one network batch and
the maps the mask head pools from, and every gamma's masks are pasted and RLE-encoded (as
``norcal infer`` writes them) before the next batch runs.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from norcal.core import calibration
from norcal.core.calibration import check_gamma, log_prior
from norcal.core.errors import NorcalError
from norcal.core.tables import CalibrationTable
from norcal.export.spec import RETINANET

MAX_CACHE_BYTES = 1 << 40  # a cache budget beyond 1 TiB is a typo, not a machine
MASK_IOU_TYPES = ("segm", "boundary")


def resolve_table(arg: str | os.PathLike | CalibrationTable) -> CalibrationTable:
    """A table as given, or what :func:`norcal.core.tables.load_table` makes of a name or path
    (a built-in, a table JSON, or a COCO/LVIS training annotation file)."""
    from norcal.core.tables import load_table

    return arg if isinstance(arg, CalibrationTable) else load_table(arg)


# ----------------------------------------------------------------------------- the cache

@dataclass
class HeadCache:
    """The box predictor's inputs for N images (resized-image coordinates).

    proposals float32 [N, P, 4] (x0, y0, x1, y1); valid bool [N, P]; cls_logits float32
    [N, P, C+1] (background last); box_deltas float32 [N, P, K*4]; image_sizes int64 [N, 2]
    resized (h, w); original_sizes int64 [N, 2]; image_ids [N]. A cascade caches every stage's
    logits, [N, P, S, C+1], and its last stage's proposals and deltas (the final boxes').
    features: for mask IoU types, the maps the ROI heads pool from (one per level, [N, ...],
    edge-replicated into the batch padding); the cache then holds one network batch.
    """

    image_ids: list
    proposals: Any
    valid: Any
    cls_logits: Any
    box_deltas: Any
    image_sizes: np.ndarray
    original_sizes: np.ndarray
    features: list | None = None

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def nbytes(self) -> int:
        return sum(int(t.numel() * t.element_size()) for t in
                   (self.proposals, self.valid, self.cls_logits, self.box_deltas, *(self.features or ())))


@dataclass
class CandidateCache:
    """RetinaNet's per-level candidates for N images at each gamma of a sweep (resized-image
    coordinates): boxes float32 [N, G, R, 4], scores float32 [N, G, R] (0: none), classes int64
    [N, G, R], R = levels x top-k; ``priors`` the G log priors they were chosen with."""

    image_ids: list
    boxes: Any
    scores: Any
    classes: Any
    image_sizes: np.ndarray
    original_sizes: np.ndarray
    priors: list
    mechanism: str

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def nbytes(self) -> int:
        return sum(int(t.numel() * t.element_size()) for t in (self.boxes, self.scores, self.classes))


def estimate_cache_bytes(spec, num_images: int, num_gammas: int = 1) -> int:
    """Upper bound of the cache for ``num_images``: P = the RPN's post-NMS top-k proposals,
    each with C+1 logits, K*4 deltas, a box and a valid flag (float32 / bool). RetinaNet: per
    gamma, levels x top-k candidates, each a box, a score and a class (float32 / int64)."""
    if spec.meta_architecture == RETINANET:
        levels = 5  # P3-P7
        return int(num_images) * int(num_gammas) * levels * spec.retinanet_topk_candidates * (16 + 4 + 8)
    k = 1 if spec.cls_agnostic_bbox_reg else spec.num_classes
    stages = max(len(spec.cascade_bbox_reg_weights), 1)
    per_proposal = 4 * (stages * (spec.num_classes + 1) + 4 * k + 4) + 1
    return int(num_images) * int(spec.rpn_post_nms_topk_test) * per_proposal


@contextmanager
def _heads_only(model):
    """Skip work the cache pass does not need: the mask head, and the baseline NMS (a score
    threshold no probability reaches leaves NMS nothing to do). Restored on exit."""
    heads = model.roi_heads
    predictor = final_predictor(heads.box_predictor)
    mask_head, thresh = heads.mask_head, predictor.score_thresh
    heads.mask_head, predictor.score_thresh = None, 2.0
    try:
        yield
    finally:
        heads.mask_head, predictor.score_thresh = mask_head, thresh


def final_predictor(predictor):
    """The predictor whose inference gives the detections: a cascade's last stage's."""
    from torch import nn

    return predictor[-1] if isinstance(predictor, nn.ModuleList) else predictor


def _head_inputs(out: dict) -> dict:
    """The cached tensors from one batch's intermediates (a cascade: all stages' logits, stacked
    on axis 2, with the last stage's proposals and deltas)."""
    import torch

    keys = ("proposals", "proposal_valid", "cls_logits", "box_deltas")
    if "stage_cls_logits" not in out:
        return {k: out[k] for k in keys}
    return {"proposals": out["stage_proposals"][-1], "proposal_valid": out["proposal_valid"],
            "cls_logits": torch.stack(out["stage_cls_logits"], dim=2), "box_deltas": out["box_deltas"]}


def _pad_to(t, p: int, value=0):
    """Pad dim 1 of t to p entries (batches may differ in proposal count)."""
    import torch

    if t.shape[1] == p:
        return t
    pad = torch.full((t.shape[0], p - t.shape[1]) + tuple(t.shape[2:]), value, dtype=t.dtype)
    return torch.cat([t, pad], dim=1)


def _batches(spec, images: Sequence[tuple[Any, os.PathLike]], batch_size: int):
    """(image ids, prepared batch) for ``images`` ((image_id, path) pairs), padded and batched
    as the exported graph's host code does (:func:`norcal.runtime.preprocess.prepare_batch`)."""
    from norcal.runtime.images import read_images, unreadable_error
    from norcal.runtime.preprocess import prepare_batch

    if batch_size < 1:
        raise NorcalError(f"batch_size must be >= 1, got {batch_size}", param="batch_size")
    if not images:
        raise NorcalError("no images to cache")
    for s in range(0, len(images), batch_size):
        chunk = images[s:s + batch_size]
        bad: list = []
        arrays = read_images([path for _, path in chunk], skipped=bad,
                             sizes=(spec.min_size_test, spec.max_size_test))
        if bad:  # name the first, count the unreadable ones in the whole rest
            rest = [Path(p) for _, p in images[s:]]
            rest = rest[rest.index(bad[0][0]) + 1:]
            raise unreadable_error(bad[0][0], bad[0][1], rest, skippable=False)
        yield [i for i, _ in chunk], prepare_batch(arrays, spec.min_size_test, spec.max_size_test,
                                                   "BGR", spec.size_divisibility)


def cache_head_outputs(model, spec, images: Sequence[tuple[Any, os.PathLike]], batch_size: int = 4,
                       on_done: Callable[[int], None] | None = None,
                       keep_features: bool = False) -> HeadCache:
    """Run ``model`` (our PyTorch R-CNN, eval mode) once over ``images`` ((image_id, path)
    pairs) in padded batches and cache the box predictor's inputs. keep_features: also the
    maps the mask head pools from (``images`` must then fit one batch: maps of batches padded
    to different sizes do not stack)."""
    import torch

    if keep_features and len(images) > batch_size:
        raise NorcalError(f"a cache with features holds one batch: {len(images)} images, "
                          f"batch_size {batch_size}")
    parts: dict[str, list] = {k: [] for k in ("proposals", "proposal_valid", "cls_logits", "box_deltas")}
    sizes, originals, ids = [], [], []
    features = None
    seen: dict = {}
    hook = None
    if keep_features:  # the ROI heads' inputs (their maps and padding masks), as the model passes them
        hook = model.roi_heads.register_forward_pre_hook(
            lambda module, args: seen.update(features=args[0], masks=args[4]))
    try:
        with torch.no_grad(), _heads_only(model):
            for chunk_ids, b in _batches(spec, images, batch_size):
                out = model.inference(torch.from_numpy(b.images), torch.from_numpy(b.image_sizes),
                                      intermediates=True)
                for k, v in _head_inputs(out).items():
                    parts[k].append(v.detach().cpu())
                if keep_features:  # what the mask pooler reads, edge-replicated as in the model's pass
                    features = [f.detach().cpu() for f in
                                model.roi_heads.edge_replicated(list(seen["features"]), seen["masks"])]
                sizes.append(b.image_sizes)
                originals.append(b.original_sizes)
                ids.extend(chunk_ids)
                if on_done:
                    on_done(len(chunk_ids))
    finally:
        if hook is not None:
            hook.remove()
    p = max(t.shape[1] for t in parts["proposals"])
    cat = {k: torch.cat([_pad_to(t, p, False if k == "proposal_valid" else 0) for t in v])
           for k, v in parts.items()}
    return HeadCache(image_ids=ids, proposals=cat["proposals"], valid=cat["proposal_valid"],
                     cls_logits=cat["cls_logits"], box_deltas=cat["box_deltas"],
                     image_sizes=np.concatenate(sizes), original_sizes=np.concatenate(originals),
                     features=features)


def cache_candidates(model, spec, images: Sequence[tuple[Any, os.PathLike]], priors: Sequence,
                     mechanism: str = "exp", batch_size: int = 4,
                     on_done: Callable[[int], None] | None = None) -> CandidateCache:
    """Run a RetinaNet (our PyTorch model, eval mode) once over ``images`` and keep, for each
    of ``priors`` ([C] log a_c, background none; None: the plain sigmoid), the levels'
    candidates chosen by the scores NorCal gives at that prior, as the graph's NorCal node
    (in place of the one Sigmoid) gives them."""
    import torch

    parts: dict[str, list] = {"boxes": [], "scores": [], "classes": []}
    sizes, originals, ids = [], [], []
    with torch.no_grad():
        for chunk_ids, b in _batches(spec, images, batch_size):
            levels = model.head_outputs(torch.from_numpy(b.images), torch.from_numpy(b.image_sizes))
            logits = torch.cat([lv[0] for lv in levels], dim=1)
            per_prior = [model.candidates(levels, torch.sigmoid(logits) if prior is None else
                                          calibration.calibrate(logits, prior, mechanism, False,
                                                                "sigmoid", "none"))
                         for prior in priors]
            for k, key in enumerate(("boxes", "scores", "classes")):
                parts[key].append(torch.stack([c[k] for c in per_prior], dim=1))
            sizes.append(b.image_sizes)
            originals.append(b.original_sizes)
            ids.extend(chunk_ids)
            if on_done:
                on_done(len(chunk_ids))
    cat = {k: torch.cat(v) for k, v in parts.items()}
    return CandidateCache(image_ids=ids, boxes=cat["boxes"], scores=cat["scores"], classes=cat["classes"],
                          image_sizes=np.concatenate(sizes), original_sizes=np.concatenate(originals),
                          priors=list(priors), mechanism=mechanism)


def cache_images(model, spec, images: Sequence[tuple[Any, os.PathLike]], priors: Sequence,
                 mechanism: str = "exp", batch_size: int = 4,
                 on_done: Callable[[int], None] | None = None,
                 keep_features: bool = False) -> HeadCache | CandidateCache:
    """What the sweep re-scores for ``images``: a RetinaNet's candidates at each of ``priors``
    (:func:`cache_candidates`), an R-CNN's head outputs (:func:`cache_head_outputs`; with
    the mask head's maps when ``keep_features``)."""
    if spec.meta_architecture == RETINANET:
        return cache_candidates(model, spec, images, priors, mechanism, batch_size, on_done)
    return cache_head_outputs(model, spec, images, batch_size, on_done, keep_features)


def concat_caches(parts: Sequence[HeadCache | CandidateCache]) -> HeadCache | CandidateCache:
    """Caches of consecutive batches as one, as :func:`cache_images` would have made it for
    all their images (head outputs padded to the most proposals)."""
    import torch

    first = parts[0]
    ids = [i for c in parts for i in c.image_ids]
    sizes = np.concatenate([c.image_sizes for c in parts])
    originals = np.concatenate([c.original_sizes for c in parts])
    if isinstance(first, CandidateCache):
        return CandidateCache(ids, *(torch.cat([getattr(c, k) for c in parts]) for k in
                                     ("boxes", "scores", "classes")),
                              sizes, originals, first.priors, first.mechanism)
    p = max(c.proposals.shape[1] for c in parts)
    cat = {k: torch.cat([_pad_to(getattr(c, k), p, False if k == "valid" else 0) for c in parts])
           for k in ("proposals", "valid", "cls_logits", "box_deltas")}
    return HeadCache(ids, cat["proposals"], cat["valid"], cat["cls_logits"], cat["box_deltas"], sizes,
                     originals)


# ----------------------------------------------------------------------------- re-scoring

def calibrated_logits(logits, prior: np.ndarray, mechanism: str = "exp", activation: str = "softmax"):
    """Logits whose plain softmax/sigmoid is NorCal's score, as the graph's NorCal node computes
    it (norcal.core.calibration.calibrated_logits, background last); ``prior`` [C+1] is cast to
    the logits' dtype first, as the node's initializer is."""
    return calibration.calibrated_logits(logits, prior, mechanism, activation, "last")


def rescore(predictor, cache: HeadCache, prior: np.ndarray | None, mechanism: str = "exp",
            batch_size: int = 16, threads: int | None = 1, roi_heads=None):
    """Detections of every cached image with NorCal ``prior`` ([C+1] log a_c, background
    last; None: the plain classifier), through the predictor's own inference.

    roi_heads: the model's ROI heads, to run its mask head on the detections (the cache must
    hold ``features``); their ``mask_probs`` are then set.

    threads: torch threads while re-scoring (None: leave as is). The work is many small ops
    and a per-class NMS loop; measured on the fixture, 1 thread is ~3x faster than 2.
    Returns a list of :class:`norcal.runtime.postprocess.ImageDetections` in original image
    coordinates (boxes rescaled and clipped as detectron2's ``detector_postprocess``).
    """
    import torch

    from norcal.runtime.postprocess import split_outputs
    from norcal.export.torch_runner import predictor_state

    saved_threads = torch.get_num_threads()
    out = []
    try:
        with torch.no_grad(), predictor_state(predictor):
            predictor.set_log_prior(None)  # NorCal enters through the logits, exactly as in the graph
            if threads:
                torch.set_num_threads(int(threads))
            for s in range(0, len(cache), batch_size):
                sl = slice(s, s + batch_size)
                logits = cache.cls_logits[sl]
                if prior is not None:
                    logits = calibrated_logits(logits, prior, mechanism,
                                               "sigmoid" if predictor.use_sigmoid else "softmax")
                final = final_predictor(predictor)
                if logits.dim() == 4:  # a cascade: the mean of its stages' probabilities
                    probs = [final.probs(logits[:, :, k]) for k in range(logits.shape[2])]
                    probs = sum(probs[1:], probs[0]) * (1.0 / len(probs))
                else:
                    probs = final.probs(logits)
                num, boxes, scores, classes = final.inference_from_probs(
                    probs, cache.box_deltas[sl], cache.proposals[sl], cache.valid[sl],
                    torch.from_numpy(cache.image_sizes[sl]))
                outputs = {"num_detections": num.numpy(), "boxes": boxes.numpy(),
                           "scores": scores.numpy(), "classes": classes.numpy()}
                if roi_heads is not None:
                    feats = [f[sl] for f in cache.features]
                    outputs["masks"] = roi_heads.with_masks(feats, num, boxes, scores, classes)["masks"].numpy()
                out.extend(split_outputs(outputs, cache.image_sizes[sl], cache.original_sizes[sl]))
    finally:
        torch.set_num_threads(saved_threads)
    return out


def rescore_candidates(model, cache: CandidateCache, index: int, batch_size: int = 16,
                       threads: int | None = 1):
    """RetinaNet's detections at the ``index``-th prior of ``cache``: class-wise NMS over the
    cached candidates and the top K, as the model's own; a list of
    :class:`norcal.runtime.postprocess.ImageDetections` in original image coordinates."""
    import torch

    from norcal.runtime.postprocess import split_outputs

    saved_threads = torch.get_num_threads()
    out = []
    try:
        if threads:
            torch.set_num_threads(int(threads))
        with torch.no_grad():
            for s in range(0, len(cache), batch_size):
                sl = slice(s, s + batch_size)
                det = model.nms(cache.boxes[sl, index], cache.scores[sl, index], cache.classes[sl, index])
                outputs = {k: det[k].numpy() for k in ("num_detections", "boxes", "scores", "classes")}
                out.extend(split_outputs(outputs, cache.image_sizes[sl], cache.original_sizes[sl]))
    finally:
        torch.set_num_threads(saved_threads)
    return out


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


def _same_priors(a: Sequence, b: Sequence) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in zip(a, b))


def _concat(parts: list):
    """Concatenate :class:`norcal.evaluation.Detections` chunks (boxes, and masks if they have them)."""
    from norcal.evaluation import Detections

    rles = None if parts[0].rles is None else [r for d in parts for r in d.rles]
    return Detections(*(np.concatenate([getattr(d, k) for d in parts])
                        for k in ("image_ids", "category_ids", "scores", "boxes")), rles)


def sweep_predictor(spec, model):
    """What re-scores the cache: an R-CNN's box predictor, a RetinaNet itself."""
    return model if spec.meta_architecture == RETINANET else model.roi_heads.box_predictor


def rescore_gamma(predictor, cache: HeadCache | CandidateCache, index: int, prior, mechanism: str,
                  batch_size: int, category_ids: Sequence[int], roi_heads=None):
    """The sweep's ``index``-th gamma (log prior ``prior``) on one cache -> its
    :class:`norcal.evaluation.Detections` (with masks when ``roi_heads`` is given)."""
    if isinstance(cache, CandidateCache):
        dets = rescore_candidates(predictor, cache, index, batch_size)
    else:
        dets = rescore(predictor, cache, prior, mechanism, batch_size, roi_heads=roi_heads)
    return to_eval_detections(cache.image_ids, dets, category_ids, masks=roi_heads is not None)


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

    def __init__(self, predictor, table: CalibrationTable, gammas: Sequence[float], factor: str,
                 mechanism: str, batch_size: int, min_count: float | None = None,
                 iou_type: str = "bbox", roi_heads=None):
        if predictor.num_classes != table.num_classes:
            raise NorcalError(f"the model has {predictor.num_classes} classes but table "
                              f"{table.name!r} has {table.num_classes}")
        self.predictor, self.table, self.mechanism = predictor, table, mechanism
        self.gammas = [float(g) for g in gammas]
        # a sigmoid detector without a background slot (RetinaNet) takes a [C] prior
        background = "none" if hasattr(predictor, "candidates") else "last"
        self.priors, self.clamped = _priors(table, gammas, factor, min_count, background)
        self.batch_size = batch_size
        self.iou_type, self.roi_heads = iou_type, roi_heads  # roi_heads: masks for mask IoU types
        self.parts: list[list] = [[] for _ in self.gammas]
        self.seconds = [0.0] * len(self.gammas)

    def add(self, cache: HeadCache | CandidateCache, on_step: Callable[[int], None] | None = None) -> None:
        if isinstance(cache, CandidateCache) and not (
                cache.mechanism == self.mechanism and _same_priors(cache.priors, self.priors)):
            raise NorcalError("the candidate cache was made for other gammas, counts or mechanism "
                              "than this sweep's")
        for k, prior in enumerate(self.priors):
            t0 = time.perf_counter()
            self.parts[k].append(rescore_gamma(self.predictor, cache, k, prior, self.mechanism,
                                               self.batch_size, self.table.category_ids, self.roi_heads))
            self.seconds[k] += time.perf_counter() - t0
            if on_step:
                on_step(len(cache))

    @property
    def topk(self) -> int:
        return final_predictor(self.predictor).topk

    def evaluate(self, gt, on_gamma: Callable[[SweepPoint], None] | None = None) -> list[SweepPoint]:
        points = []
        for k, g in enumerate(self.gammas):
            point = evaluate_gamma(gt, self.parts[k], g, self.topk, self.seconds[k], self.iou_type)
            self.parts[k] = []  # free as we go
            points.append(point)
            if on_gamma:
                on_gamma(point)
        return points


def sweep(predictor, cache: HeadCache | CandidateCache, gt, table: CalibrationTable, gammas: Sequence[float],
          factor: str = "cdt", mechanism: str = "exp", batch_size: int = 16,
          on_gamma: Callable[[SweepPoint], None] | None = None,
          min_count: float | None = None) -> list[SweepPoint]:
    """Evaluate (LVIS bbox AP, top 300 per image) NorCal at each gamma on cached images.

    gt: a prepared GT (:func:`norcal.evaluation.prepare_gt`) or its path; table: N_c and the
    class -> category id map (the model's class order). predictor: the box predictor (a
    RetinaNet: the model, with a :class:`CandidateCache` made for these gammas)."""
    from norcal.evaluation import prepare_gt

    acc = _Accumulator(predictor, table, gammas, factor, mechanism, batch_size, min_count)
    acc.add(cache)
    return acc.evaluate(prepare_gt(gt, table), on_gamma)


def images_from_gt(gt_path: os.PathLike | dict, image_dir: os.PathLike,
                   where: str | None = None) -> list[tuple[int, Path]]:
    """(image_id, path) for every GT image whose file (by base name) is in ``image_dir``.

    gt_path: the annotation file or its already loaded dict (``where`` then names it)."""
    from norcal.runtime.results import category_ids_from_annotations

    _, by_name = category_ids_from_annotations(gt_path, where)
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
    return found


@dataclass
class TunePlan:
    """What :func:`tune` settles before the network pass, checked: the images, the detector,
    the prepared GT, the chunks, and the accumulator holding the sweep's priors.
    :func:`norcal.workflows.ray_tune.tune_ray` carries out the same plan on Ray."""

    weights: Path
    config: Path | None
    pairs: list[tuple[Any, Path]]
    spec: Any
    model: Any
    table: CalibrationTable
    gt: Any  # prepared (norcal.evaluation.prepare_gt)
    chunk: int  # images per chunk: a multiple of batch_size
    batch_size: int
    factor: str
    mechanism: str
    min_count: float | None
    acc: _Accumulator
    iou_type: str = "bbox"

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
    from norcal.export.detector import load_detector
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
    unreadable_files([p for _, p in pairs], skippable=False)  # a bad image fails now, not mid-pass
    spec, model = load_detector(weights, config)
    masks = iou_type in MASK_IOU_TYPES
    if masks and getattr(getattr(model, "roi_heads", None), "mask_head", None) is None:
        raise NorcalError(f"iou_type {iou_type} needs a model with a mask head; {weights} has "
                          "none (use bbox)", param="iou_type")
    if table is None:
        from norcal.export.calibrate_onnx import default_table

        table = default_table(spec.num_classes)
    if spec.num_classes != table.num_classes:
        raise NorcalError(f"the model has {spec.num_classes} classes but table {table.name!r} "
                          f"has {table.num_classes}")
    prepared = prepare_gt(gt_data, table, where=str(gt))
    check_table_matches(table, prepared)
    if masks:
        prepared.rles()  # a GT without masks fails now, not after the network pass
    per_image = estimate_cache_bytes(spec, 1, len(gammas))
    chunk = max(1, int(max_cache_bytes // per_image))
    if chunk < batch_size:
        raise NorcalError(f"one batch of {batch_size} images needs up to "
                          f"{batch_size * per_image / 2**20:.0f} MiB of cache, over the "
                          f"{max_cache_bytes / 2**20:.0f} MiB limit: lower batch_size or raise "
                          f"max_cache_bytes", param=("batch_size", "max_cache_bytes"))
    chunk -= chunk % batch_size  # whole batches only: chunking then changes nothing
    if masks:  # the mask head's maps of batches padded to different sizes do not stack
        chunk = batch_size
    acc = _Accumulator(sweep_predictor(spec, model), table, gammas, factor, mechanism,
                       max(batch_size, 8), min_count, iou_type, model.roi_heads if masks else None)
    return TunePlan(Path(weights), None if config is None else Path(config), pairs, spec, model, table,
                    prepared, chunk, batch_size, factor, mechanism, min_count, acc, iou_type)


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
        cache = cache_images(plan.model, plan.spec, pairs[s:s + plan.chunk], acc.priors, mechanism,
                             batch_size, net_step, plan.with_masks)
        network += time.perf_counter() - t0
        peak = max(peak, cache.nbytes)
        acc.add(cache, sweep_step)
        del cache
    eval_step = progress_step(progress, "evaluation", len(acc.gammas))
    points = acc.evaluate(plan.gt, lambda p: eval_step())
    return TuneResult(points, factor, mechanism, plan.table.name, len(pairs), network, peak,
                      min_count, acc.clamped, iou_type)


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
