"""detectron2's RetinaNet as a detector family member, and what ``norcal tune`` caches for it.

RetinaNet has no box predictor to re-run: its per-level candidates (the top-k (anchor, class)
pairs above the score threshold, per level) are chosen by the calibrated scores themselves,
so they change with gamma. Its cache (:class:`CandidateCache`) holds, per image and per prior
of the sweep, those candidates (boxes, scores, classes: levels x top-k, ~120 kB per image and
gamma); re-scoring is then the class-wise NMS and the top-K cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from norcal.core.calibration import formula as calibration
from norcal.core.errors import NorcalError
from norcal.export.families.base import Classifier, TuneCache
from norcal.export.pytorch.tools import join_outputs, torch_threads
from norcal.export.rcnn.detector import SpecDetector
from norcal.export.rcnn.spec import box_classifier

_KEYS = ("boxes", "scores", "classes")
_LEVELS = 5  # P3-P7


@dataclass
class CandidateCache(TuneCache):
    """RetinaNet's per-level candidates for N images at each prior of a sweep (resized-image
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

    @classmethod
    def concat(cls, parts: Sequence["CandidateCache"]) -> "CandidateCache":
        import torch

        first = parts[0]
        return cls([i for c in parts for i in c.image_ids],
                   *(torch.cat([getattr(c, k) for c in parts]) for k in _KEYS),
                   np.concatenate([c.image_sizes for c in parts]),
                   np.concatenate([c.original_sizes for c in parts]), first.priors, first.mechanism)


def estimate_cache_bytes(spec, num_images: int, num_gammas: int = 1) -> int:
    """Upper bound of the cache: per gamma, levels x top-k candidates, each a box, a score and
    a class (float32 / int64)."""
    return int(num_images) * int(num_gammas) * _LEVELS * spec.retinanet_topk_candidates * (16 + 4 + 8)


def cache_candidates(model, batches: Iterable[tuple[list, Any]], priors: Sequence, mechanism: str = "exp",
                     on_done: Callable[[int], None] | None = None) -> CandidateCache:
    """Run a RetinaNet (our PyTorch model, eval mode) once over ``batches`` (image ids,
    prepared batch) and keep, for each of ``priors`` ([C] log a_c, background none; None: the
    plain sigmoid), the levels' candidates chosen by the scores NorCal gives at that prior, as
    the graph's NorCal node (in place of the one Sigmoid) gives them."""
    import torch

    parts: dict[str, list] = {k: [] for k in _KEYS}
    sizes, originals, ids = [], [], []
    with torch.no_grad():
        for chunk_ids, b in batches:
            sizes_t = torch.from_numpy(b.image_sizes)
            levels = model.head_outputs(torch.from_numpy(b.images), sizes_t)
            logits = torch.cat([lv[0] for lv in levels], dim=1)
            per_prior = [model.candidates(levels, torch.sigmoid(logits) if prior is None else
                                          calibration.calibrate(logits, prior, mechanism, False,
                                                                "sigmoid", "none"), sizes_t)
                         for prior in priors]
            for k, key in enumerate(_KEYS):
                parts[key].append(torch.stack([c[k] for c in per_prior], dim=1))
            sizes.append(b.image_sizes)
            originals.append(b.original_sizes)
            ids.extend(chunk_ids)
            if on_done:
                on_done(len(chunk_ids))
    if not ids:
        raise NorcalError("no images to cache")
    return CandidateCache(ids, *(torch.cat(parts[k]) for k in _KEYS), np.concatenate(sizes),
                          np.concatenate(originals), list(priors), mechanism)


def rescore_candidates(model, cache: CandidateCache, index: int, batch_size: int = 16,
                       threads: int | None = 1) -> dict[str, np.ndarray]:
    """RetinaNet's outputs at the ``index``-th prior of ``cache``: class-wise NMS over the
    cached candidates and the top K, as the model's own."""
    import torch

    out = []
    with torch.no_grad(), torch_threads(threads):
        for s in range(0, len(cache), batch_size):
            sl = slice(s, s + batch_size)
            det = model.nms(cache.boxes[sl, index], cache.scores[sl, index], cache.classes[sl, index])
            out.append({k: det[k].numpy() for k in ("num_detections", "boxes", "scores", "classes")})
    return join_outputs(out)


def _same_prior(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


class RetinaNetDetector(SpecDetector):
    """A detectron2 RetinaNet: one sigmoid over all levels' class logits, no background."""

    def __init__(self, spec, model):
        super().__init__(spec, model)
        self.topk = int(model.topk)

    def with_nms(self, decoding) -> "RetinaNetDetector":
        """With Decoding(nms="host") the graph ends at the levels' top candidates (no
        NonMaxSuppression; :mod:`norcal.runtime.host_nms` selects them as the graph would)."""
        self.host_nms = decoding is not None and decoding.host_nms
        return self

    @property
    def classifier(self) -> Classifier:
        return box_classifier(self.spec)

    def cache_bytes(self, num_images: int, num_gammas: int = 1) -> int:
        return estimate_cache_bytes(self.spec, num_images, num_gammas)

    def cache(self, batches, priors, mechanism, on_step=None, with_masks=False) -> CandidateCache:
        return cache_candidates(self.model, batches, priors, mechanism, on_step)

    def rescore(self, cache: CandidateCache, index: int, prior, mechanism: str, batch_size: int):
        """The candidates were chosen at the cache's priors: the sweep's ``index``-th must be
        the one the cache holds there."""
        if not (cache.mechanism == mechanism and index < len(cache.priors)
                and _same_prior(cache.priors[index], prior)):
            raise NorcalError("the candidate cache was made for other gammas, counts or mechanism "
                              "than this sweep's")
        return rescore_candidates(self.model, cache, index, batch_size)
