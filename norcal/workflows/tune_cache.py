"""The tuning job's two halves on one chunk of images: the network pass into the detector's cache,
and re-scoring that cache at one of the sweep's priors into evaluation detections.

What is cached and re-run is the detector family's business (:meth:`norcal.export.families.Detector.cache` /
``rescore``: an R-CNN caches its box predictor's inputs and re-runs the predictor's inference,
a RetinaNet each gamma's per-level candidates and re-runs NMS); this module reads and prepares
the images as the deployed graph's host code does, and turns the detections into what the
evaluation takes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from norcal.core.errors import NorcalError

if TYPE_CHECKING:
    from norcal.export.families import Detector, TuneCache


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



def rescore_images(detector: Detector, cache: TuneCache, index: int, prior: np.ndarray | None,
                   mechanism: str = "exp", batch_size: int = 16):
    """The detections of every cached image at the sweep's ``index``-th prior (``prior``; None:
    the plain classifier), as a list of :class:`norcal.runtime.postprocess.ImageDetections` in
    original image coordinates (boxes rescaled, and clipped where the family clips, as for the
    graph's outputs)."""
    from norcal.runtime.postprocess import split_outputs

    outputs = detector.rescore(cache, index, prior, mechanism, batch_size)
    return split_outputs(outputs, cache.image_sizes, cache.original_sizes, cache.keep_empty_boxes,
                         cache.mask_paste, cache.clip_boxes, cache.drop_empty_masks)


def to_eval_detections(image_ids: Sequence, dets, category_ids: Sequence[int], masks: bool = False,
                       mask_memo: dict | None = None):
    """Per-image detections -> :class:`norcal.evaluation.Detections` (bbox as x, y, w, h with
    w, h computed in float32, as the results JSON of ``norcal infer`` has them; with
    ``masks``, the masks pasted and RLE-encoded as there too). ``mask_memo``: a dict kept
    across the gammas of the same images, so a mask seen at another gamma is not pasted again
    (:func:`norcal.runtime.results.image_mask_rles`)."""
    from norcal.evaluation import Detections
    from norcal.runtime.results import image_mask_rles

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
        rles = [r for i, d in zip(image_ids, dets) if len(d)
                for r in image_mask_rles(d, memo=None if mask_memo is None else mask_memo.setdefault(i, {}))]
    return Detections(img, cats[classes], scores, xywh, rles)



def rescore_gamma(detector: Detector, cache: TuneCache, index: int, prior, mechanism: str,
                  batch_size: int, category_ids: Sequence[int], masks: bool = False,
                  mask_memo: dict | None = None):
    """The sweep's ``index``-th gamma (log prior ``prior``) on one cache -> its
    :class:`norcal.evaluation.Detections` (with masks when ``masks``: the cache was made
    ``with_masks``; ``mask_memo``: one dict across the gammas of this cache, see
    :func:`to_eval_detections`)."""
    dets = rescore_images(detector, cache, index, prior, mechanism, batch_size)
    return to_eval_detections(cache.image_ids, dets, category_ids, masks=masks, mask_memo=mask_memo)
