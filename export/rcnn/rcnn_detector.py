"""detectron2's R-CNNs (FPN, C4, DC5, Cascade; with or without a mask head) as a detector
family member, and what ``norcal tune`` caches for them.

NorCal changes only the box classifier's scores, before class-wise NMS and the top-K cut.
So the network (backbone, RPN, box head) runs once per image and the box predictor's inputs
are cached (proposals, class logits, box deltas, image sizes); each gamma then re-runs only
the predictor's own post-processing (scores, per-class decoding, clipping, score threshold,
class-wise NMS, top K) on the cache. A Cascade caches every stage's logits and averages the
stages' calibrated probabilities, as the graph's NorCal nodes do. The cache holds per image
P x (C+1) logits and P x 4C deltas (float32): an LVIS model (1203 classes, 1000 proposals)
takes ~24 MB per image.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from norcal.core.calibration import formula as calibration
from norcal.core.errors import NorcalError
from norcal.export.families.base import Classifier, TuneCache
from norcal.export.pytorch.tools import join_outputs, torch_threads
from norcal.export.rcnn.detector import SpecDetector
from norcal.export.rcnn.spec import box_classifier

_KEYS = ("proposals", "valid", "cls_logits", "box_deltas")


@dataclass
class HeadCache(TuneCache):
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

    @classmethod
    def concat(cls, parts: Sequence["HeadCache"]) -> "HeadCache":
        """Head outputs padded to the most proposals (no features: those are one batch's)."""
        import torch

        p = max(c.proposals.shape[1] for c in parts)
        cat = {k: torch.cat([_pad_to(getattr(c, k), p, False if k == "valid" else 0) for c in parts])
               for k in _KEYS}
        return cls([i for c in parts for i in c.image_ids], *(cat[k] for k in _KEYS),
                   np.concatenate([c.image_sizes for c in parts]),
                   np.concatenate([c.original_sizes for c in parts]))


def estimate_cache_bytes(spec, num_images: int) -> int:
    """Upper bound of the cache: P = the RPN's post-NMS top-k proposals, each with C+1 logits
    per stage, K*4 deltas, a box and a valid flag (float32 / bool)."""
    # a background slot first comes with a box regressed for it too
    k = 1 if spec.cls_agnostic_bbox_reg else spec.num_classes + (spec.convention.background == "first")
    stages = max(len(spec.cascade_bbox_reg_weights), 1)
    per_proposal = 4 * (stages * (spec.num_classes + 1) + 4 * k + 4) + 1
    return int(num_images) * int(spec.rpn_post_nms_topk_test) * per_proposal


def final_predictor(predictor):
    """The predictor whose inference gives the detections: a cascade's last stage's."""
    from torch import nn

    return predictor[-1] if isinstance(predictor, nn.ModuleList) else predictor


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


def _head_inputs(out: dict) -> dict:
    """The cached tensors from one batch's intermediates (a cascade: all stages' logits, stacked
    on axis 2, with the last stage's proposals and deltas)."""
    import torch

    if "stage_cls_logits" not in out:
        return {"proposals": out["proposals"], "valid": out["proposal_valid"],
                "cls_logits": out["cls_logits"], "box_deltas": out["box_deltas"]}
    return {"proposals": out["stage_proposals"][-1], "valid": out["proposal_valid"],
            "cls_logits": torch.stack(out["stage_cls_logits"], dim=2), "box_deltas": out["box_deltas"]}


def _pad_to(t, p: int, value=0):
    """Pad dim 1 of t to p entries (batches may differ in proposal count)."""
    import torch

    if t.shape[1] == p:
        return t
    pad = torch.full((t.shape[0], p - t.shape[1]) + tuple(t.shape[2:]), value, dtype=t.dtype)
    return torch.cat([t, pad], dim=1)


def cache_head_outputs(model, batches: Iterable[tuple[list, Any]],
                       on_done: Callable[[int], None] | None = None,
                       keep_features: bool = False) -> HeadCache:
    """Run ``model`` (our PyTorch R-CNN, eval mode) once over ``batches`` (image ids, prepared
    batch; see :meth:`norcal.export.families.Detector.cache`) and cache the box predictor's
    inputs. keep_features: also the maps the mask head pools from (one batch only)."""
    import torch

    parts: dict[str, list] = {k: [] for k in _KEYS}
    sizes, originals, ids = [], [], []
    features = None
    seen: dict = {}
    hook = None
    if keep_features:  # the ROI heads' inputs (their maps and padding masks), as the model passes them
        hook = model.roi_heads.register_forward_pre_hook(
            lambda module, args: seen.update(features=args[0], masks=args[4]))
    try:
        with torch.no_grad(), _heads_only(model):
            for chunk_ids, b in batches:
                if keep_features and features is not None:
                    raise NorcalError("a cache with features holds one batch")
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
    if not ids:
        raise NorcalError("no images to cache")
    p = max(t.shape[1] for t in parts["proposals"])
    cat = {k: torch.cat([_pad_to(t, p, False if k == "valid" else 0) for t in v]) for k, v in parts.items()}
    return HeadCache(ids, *(cat[k] for k in _KEYS), np.concatenate(sizes), np.concatenate(originals),
                     features=features)


def rescore(predictor, cache: HeadCache, prior: np.ndarray | None, mechanism: str = "exp",
            batch_size: int = 16, threads: int | None = 1, roi_heads=None) -> dict[str, np.ndarray]:
    """The graph's outputs for every cached image with NorCal ``prior`` ([C+1] log a_c,
    background where the predictor has it; None: the plain classifier), through the predictor's own inference.

    NorCal enters through the logits (norcal.core.calibration.formula.calibrated_logits, the prior cast
    to the logits' dtype first, as the node's initializer is), exactly as in the graph.
    roi_heads: the model's ROI heads, to run its mask head on the detections (the cache must
    hold ``features``). threads: torch threads while re-scoring (None: leave as is)."""
    import torch

    from norcal.export.pytorch.runner import predictor_state

    activation = "sigmoid" if predictor.use_sigmoid else "softmax"
    final = final_predictor(predictor)
    out = []
    with torch.no_grad(), predictor_state(predictor), torch_threads(threads):
        predictor.set_log_prior(None)
        for s in range(0, len(cache), batch_size):
            sl = slice(s, s + batch_size)
            logits = cache.cls_logits[sl]
            if prior is not None:
                logits = calibration.calibrated_logits(logits, prior, mechanism, activation, final.background)
            if logits.dim() == 4:  # a cascade: the mean of its stages' probabilities
                probs = [final.probs(logits[:, :, k]) for k in range(logits.shape[2])]
                probs = sum(probs[1:], probs[0]) * (1.0 / len(probs))
            else:
                probs = final.probs(logits)
            num, boxes, scores, classes = final.inference_from_probs(
                probs, cache.box_deltas[sl], cache.proposals[sl], cache.valid[sl],
                torch.from_numpy(cache.image_sizes[sl]))
            batch = {"num_detections": num, "boxes": boxes, "scores": scores, "classes": classes}
            if roi_heads is not None:
                feats = [f[sl] for f in cache.features]
                batch["masks"] = roi_heads.with_masks(feats, num, boxes, scores, classes)["masks"]
            out.append({k: v.numpy() for k, v in batch.items()})
    return join_outputs(out)


class RCNNDetector(SpecDetector):
    """A detectron2 GeneralizedRCNN (Cascade included): softmax (or sigmoid) box classifier
    with the background last, one classifier per cascade stage."""

    def __init__(self, spec, model):
        super().__init__(spec, model)
        self.topk = int(final_predictor(model.roi_heads.box_predictor).topk)

    @property
    def classifier(self) -> Classifier:
        return box_classifier(self.spec)

    @property
    def has_masks(self) -> bool:
        return self.model.roi_heads.mask_head is not None

    def cache_bytes(self, num_images: int, num_gammas: int = 1) -> int:
        return estimate_cache_bytes(self.spec, num_images)  # one cache serves every gamma

    def cache(self, batches, priors, mechanism, on_step=None, with_masks=False) -> HeadCache:
        cache = cache_head_outputs(self.model, batches, on_step, with_masks)
        cache.mask_paste = self.spec.convention.mask_paste  # the re-scored masks pasted as the trainer pastes them
        return cache

    def rescore(self, cache: HeadCache, index: int, prior, mechanism: str, batch_size: int):
        heads = self.model.roi_heads if cache.features is not None else None
        return rescore(self.model.roi_heads.box_predictor, cache, prior, mechanism, batch_size, roi_heads=heads)
