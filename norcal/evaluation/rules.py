"""The evaluation rules: which detections and GTs count, and how detections match GTs.

Two rule sets, chosen from the ground truth (:func:`choose_rules`):

``lvis`` (federated, lvis-api 0.5.3): a detection counts only on images where its category
is annotated (a GT of positive area) or verified absent (``neg_category_ids``); an
unmatched detection of a category in the image's ``not_exhaustive_category_ids`` is
ignored; GTs flagged ``ignore`` are ignored; detections and GTs of area 0 are dropped.
The per-image cap (``max_dets``, default 300) is LVISResults'.

``coco`` (exhaustive labels, pycocotools' COCOeval): every detection on every image counts;
``iscrowd`` GTs are ignored, may match any number of detections, and their IoU with a
detection divides by the detection's area; the ``ignore`` field is not read (COCOeval
overwrites it with ``iscrowd``); nothing is dropped for its area. The top
:data:`COCO_MAX_DETS` (100) detections per image and category count, COCOeval's
``maxDets=100``, after the per-image cap (``max_dets``, default none).

Both: area ranges from the GT's ``area`` field and the detection's area (box w*h when the
results carry boxes, else the mask's), greedy matching by score at each IoU threshold
(:mod:`norcal.evaluation.matching`).

The LVIS-distinguishing fields are the image-level federated lists: a GT where some image
carries ``neg_category_ids`` or ``not_exhaustive_category_ids`` (even empty) is federated;
any other is COCO (category ``frequency`` alone does not decide: it only gives groups).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from norcal.core.errors import NorcalError
from norcal.evaluation.detections import Detections
from norcal.evaluation.ground_truth import LvisGT
from norcal.evaluation.matching import AREA_RNGS, greedy_match, pair_ious

Rules = Literal["auto", "lvis", "coco"]
RULES = ("auto", "lvis", "coco")
COCO_MAX_DETS = 100  # COCOeval's maxDets[-1]: detections per image and category
_LABEL = {"lvis": "LVIS federated", "coco": "COCO"}


@dataclass(frozen=True)
class RuleChoice:
    """The rules an evaluation applies (``name``: lvis or coco) and why (``reason``)."""

    name: str
    reason: str

    @property
    def line(self) -> str:
        """The first line of eval and tune output, e.g. ``rules: COCO (exhaustive labels: ...)``."""
        return f"rules: {_LABEL[self.name]} ({self.reason})"


def choose_rules(gt: LvisGT, rules: "str | RuleChoice" = "auto") -> RuleChoice:
    """The rules for ``gt``: ``auto`` picks lvis when some image carries an LVIS federated
    list, else coco; ``lvis`` on a GT without those lists is refused (every detection of a
    class not annotated in its image would be dropped unscored); ``coco`` is always possible.
    A RuleChoice made for this GT comes back as it is."""
    if isinstance(rules, RuleChoice):
        choose_rules(gt, rules.name)  # refused as its name would be
        return rules
    if rules not in RULES:
        raise NorcalError(f"rules must be auto, lvis or coco, got {rules!r}", param="rules")
    fields = " / ".join(gt.federated_fields)
    if rules == "lvis" and not fields:
        raise NorcalError(f"rules lvis: {gt.source} has no neg_category_ids or not_exhaustive_category_ids "
                          "on any image, so every detection of a class not annotated in its image would "
                          "be dropped unscored; use rules coco (exhaustive labels)", param="rules")
    if rules == "lvis":
        return RuleChoice("lvis", f"as asked; {gt.source}'s images carry {fields}")
    if rules == "coco":
        why = f"; {gt.source}'s {fields} are not used" if fields else ""
        return RuleChoice("coco", f"exhaustive labels, as asked{why}")
    if fields:
        return RuleChoice("lvis", f"{gt.source}'s images carry {fields}")
    return RuleChoice("coco", f"exhaustive labels: {gt.source} has no neg_category_ids or "
                              "not_exhaustive_category_ids")


@dataclass
class Matched:
    """The counted detections, sorted by (image, category) group then descending score, matched.

    ``order`` [N]: their indices in the evaluated Detections; ``cat`` / ``img`` [N]: category
    and image indices; ``score`` [N]; ``rank`` [N]: place in its (image, category) group;
    ``tp`` / ``fp`` [A, T, N]: a true positive / a false positive per area range and IoU
    threshold (neither: ignored); ``num_gt`` [K, A]: GTs not ignored.
    """

    order: np.ndarray
    cat: np.ndarray
    img: np.ndarray
    score: np.ndarray
    rank: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    num_gt: np.ndarray


def _runs(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of the runs of equal values in a sorted ``key``."""
    n = len(key)
    start = np.r_[0, np.flatnonzero(key[1:] != key[:-1]) + 1] if n else np.zeros(0, dtype=np.int64)
    return start, np.diff(np.r_[start, n]).astype(np.int64)


def match_detections(gt: LvisGT, dets: Detections, iou_type: str, rules: str, area: np.ndarray,
                     group_cap: int = -1) -> Matched:
    """Apply ``rules`` (lvis or coco) to ``dets`` (ids known to ``gt``; boxes present for bbox)
    and match them at every IoU threshold and area range. ``area``: the detections' areas;
    group_cap: detections kept per (image, category) by score (< 0: all)."""
    k = gt.num_cats
    coco = rules == "coco"
    img_idx = gt.img_index(dets.image_ids)
    key = img_idx * k + gt.cat_index(dets.category_ids)
    g_key_all = gt.ann_img * k + gt.ann_cat
    crowd = gt.ann_crowd if gt.ann_crowd is not None else np.zeros(len(g_key_all), dtype=bool)
    if coco:
        g_ok = np.arange(len(g_key_all))
        keep = np.arange(len(dets))
    else:
        g_ok = np.flatnonzero((gt.ann_area > 0) & (gt.ann_area < np.inf))
        # lvis-api takes "annotated in the image" from GTs of positive area only
        federated = np.isin(key, g_key_all[g_ok]) | np.isin(key, gt.neg_keys)
        keep = np.flatnonzero(federated & (area > 0) & (area < np.inf))
    order = keep[np.lexsort((keep, -dets.scores[keep], key[keep]))]
    group_start, group_len = _runs(key[order])
    rank = np.arange(len(order)) - np.repeat(group_start, group_len)
    if group_cap >= 0 and (rank >= group_cap).any():
        order = order[rank < group_cap]
        group_start, group_len = _runs(key[order])
        rank = np.arange(len(order)) - np.repeat(group_start, group_len)
    d_key, d_area = key[order], area[order]
    d_nel = np.zeros(len(order), dtype=bool) if coco else np.isin(d_key, gt.nel_keys)

    g_sel = g_ok[np.argsort(g_key_all[g_ok], kind="stable")]
    g_key, g_area = g_key_all[g_sel], gt.ann_area[g_sel]
    g_crowd = crowd[g_sel] if coco else None
    lo, hi = AREA_RNGS[:, 0:1], AREA_RNGS[:, 1:2]
    flagged = g_crowd if coco else gt.ann_ignore[g_sel]
    g_ignore = flagged[None, :] | (g_area[None, :] < lo) | (g_area[None, :] > hi)  # [A, G]

    gstart = np.searchsorted(g_key, d_key, "left")
    ng = np.searchsorted(g_key, d_key, "right") - gstart
    if iou_type in ("segm", "boundary"):
        d_rles = [dets.rles[i] for i in order]
        gt_rles = gt.rles()
        g_rles = [gt_rles[i] for i in g_sel]
        iou, off = pair_ious(ng, gstart, None, None, d_rles, g_rles, group_start, group_len, g_crowd)
        if iou_type == "boundary":
            iou = np.minimum(iou, _band_ious(gt, g_sel, d_rles, ng, gstart, group_start, group_len,
                                             g_crowd))
    else:
        iou, off = pair_ious(ng, gstart, dets.boxes[order], gt.ann_bbox[g_sel], gt_crowd=g_crowd)
    matched, matched_ign = greedy_match(iou, off, ng, gstart, group_start, group_len, g_ignore, g_crowd)

    d_out = (d_area[None, :] < lo) | (d_area[None, :] > hi)  # [A, N]
    tp = matched & ~matched_ign
    fp = ~matched & ~(d_out | d_nel[None, :])[:, None, :]
    num_gt = np.zeros((k, len(AREA_RNGS)), dtype=np.int64)
    g_cat = gt.ann_cat[g_sel]
    for a in range(len(AREA_RNGS)):
        num_gt[:, a] = np.bincount(g_cat[~g_ignore[a]], minlength=k)
    return Matched(order, gt.cat_index(dets.category_ids)[order], img_idx[order], dets.scores[order],
                   rank, tp, fp, num_gt)


def _band_ious(gt: LvisGT, g_sel, d_rles, ng, gstart, group_start, group_len, g_crowd) -> np.ndarray:
    """IoU of the boundary bands, laid out as :func:`pair_ious`' mask IoUs; bands only for the
    detections that meet a GT (the others have no pair)."""
    from norcal.evaluation.boundary import boundary_rles

    g_bands = gt.boundary_rles()
    need = np.flatnonzero(ng > 0)
    d_bands: list = [None] * len(d_rles)
    for i, b in zip(need, boundary_rles([d_rles[i] for i in need])):
        d_bands[i] = b
    iou, _ = pair_ious(ng, gstart, None, None, d_bands, [g_bands[i] for i in g_sel],
                       group_start, group_len, g_crowd)
    return iou


__all__ = ["COCO_MAX_DETS", "Matched", "RULES", "RuleChoice", "Rules", "choose_rules", "match_detections"]
