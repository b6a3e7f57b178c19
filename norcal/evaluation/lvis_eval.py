"""LVIS AP with the federated rules, computed with numpy; the same numbers as lvis-api 0.5.3.

Federated rules (as lvis-api): a detection counts only on images where its category is
annotated (a GT of it) or verified absent (``neg_category_ids``); on other images it is
dropped. An unmatched detection of a category listed in the image's
``not_exhaustive_category_ids`` is ignored, not a false positive. Detections and GTs of
area 0 are dropped (lvis-api's index does so).

IoU types: ``bbox`` (boxes), ``segm`` (RLE masks), ``boundary`` (Boundary IoU, LVIS Challenge
2021: min of the mask IoU and the IoU of the masks' boundary bands, see
:mod:`norcal.evaluation.boundary`; the numbers of faster-coco-eval's boundary mode).

Metric keys (:attr:`EvalResult.stats`; AP values are fractions in [0, 1], -1 where no
category defines them):

    AP      mean over IoU 0.50:0.95 and categories, all areas
    AP50    AP at IoU 0.50          AP75   AP at IoU 0.75
    APs     small (< 32^2) GTs      APm    medium          APl   large (> 96^2)
    APr     rare categories         APc    common          APf   frequent
    AR      recall at max_dets (lvis-api's AR@300), all areas and categories
    ARs ARm ARl                     AR per area range (lvis-api's ARs@300 ...)
    ARr ARc ARf                     AR per frequency group (not in lvis-api's summary)
"""

from __future__ import annotations

import os

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from norcal.core.errors import NorcalError
from norcal.evaluation.detections import (Detections, cap_per_class, cap_per_image, check_rle,
                                          from_results)
from norcal.evaluation.ground_truth import FREQUENCIES, LvisGT, prepare_gt, rle_problem
from norcal.evaluation.matching import AREA_RNGS, IOU_THRS, REC_THRS, greedy_match, pair_ious

IOU_TYPES = ("bbox", "segm", "boundary")
STAT_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "APr", "APc", "APf",
             "AR", "ARs", "ARm", "ARl", "ARr", "ARc", "ARf")


@dataclass
class EvalResult:
    """What one evaluation gives.

    stats: the metrics named in :data:`STAT_KEYS`. precision [T=10, R=101, K, A=4] and
    recall [T, K, A] are lvis-api's ``eval['precision']`` / ``eval['recall']`` (-1 where a
    category has no GT in that area range). Per category (K, sorted by id): ``cat_ids``,
    ``cat_names``, ``frequency``, ``image_count`` (N_c, nan when unknown), ``num_gt``.
    """

    stats: dict[str, float]
    precision: np.ndarray
    recall: np.ndarray
    cat_ids: np.ndarray
    cat_names: list[str]
    frequency: list[str | None]
    image_count: np.ndarray
    num_gt: np.ndarray
    iou_type: str = "bbox"
    max_dets: int = 300
    per_class: int = -1
    num_detections: int = 0

    def class_ap(self) -> np.ndarray:
        """Per-category AP [K] (all areas, IoU 0.50:0.95), -1 where undefined."""
        p = self.precision[..., 0]
        p = p.reshape(-1, p.shape[2])
        defined = (p > -1).all(axis=0)
        return np.where(defined, np.where(p > -1, p, 0).mean(axis=0), -1.0)

    def to_json(self) -> dict[str, Any]:
        """Every reported number under documented keys (see the module docstring)."""
        ap = self.class_ap()
        return {
            "iou_type": self.iou_type,
            "max_dets": self.max_dets,
            "per_class_cap": self.per_class,
            "num_detections": self.num_detections,
            "stats": {k: float(v) for k, v in self.stats.items()},
            "per_class": [
                {"category_id": int(c), "name": n, "frequency": f,
                 "image_count": None if not np.isfinite(nc) else float(nc),
                 "num_gt": int(g), "AP": float(a)}
                for c, n, f, nc, g, a in zip(self.cat_ids, self.cat_names, self.frequency,
                                             self.image_count, self.num_gt[:, 0], ap)
            ],
        }


def _mean_valid(s: np.ndarray) -> float:
    v = s[s > -1]
    return float(np.mean(v)) if v.size else -1.0


def _check_iou_type(iou_type: str) -> None:
    if iou_type not in IOU_TYPES:
        raise NorcalError(f"iou_type must be bbox, segm or boundary, got {iou_type!r}", param="iou_type")


def _check_ids(gt: LvisGT, dets: Detections, img_idx, cat_idx, results) -> None:
    """Refuse results naming images or categories the GT lacks, naming the results file (when
    given as a path), the first such record and the field."""
    source = dets.source or (str(results) if isinstance(results, (str, os.PathLike)) else "results")
    where = f"{source}: "
    for field, ids, idx, what in (("image_id", dets.image_ids, img_idx, "image"),
                                  ("category_id", dets.category_ids, cat_idx, "category")):
        if (idx < 0).any():
            first = int(np.flatnonzero(idx < 0)[0])
            bad = np.unique(ids[idx < 0])
            raise NorcalError(f"{where}record {first}: {field} {ids[first]}: the results have {bad.size} "
                              f"{what} id(s) not in the GT, e.g. {bad[:5].tolist()}")


def _check_masks(gt: LvisGT, dets: Detections, iou_type: str) -> Detections:
    """The results' masks, where the evaluation reads them (mask IoU, or mask-only results),
    checked before any cap so that errors give the record's index: RLE only, of its image's
    size (lvis-api scores another size IoU -1, so AP drops with no word why), run lengths
    covering the image; uncompressed masks (counts a list, which pycocotools' IoU and area
    take only compressed) come back compressed, in a copy (the caller's Detections stay)."""
    segm = iou_type in ("segm", "boundary")
    if segm and dets.rles is None:
        raise NorcalError(f"{iou_type} evaluation needs 'segmentation' (RLE) in the results")
    if dets.rles is None or not (segm or dets.boxes is None):
        return dets
    for i, r in enumerate(dets.rles):
        check_rle(r, "results", i)
    hw = gt.img_hw[gt.img_index(dets.image_ids)]
    sizes = np.array([r["size"] for r in dets.rles], dtype=np.int64).reshape(-1, 2)
    lists = [i for i, r in enumerate(dets.rles) if isinstance(r["counts"], list)]
    bad = np.flatnonzero((sizes != hw).any(axis=1)).tolist()
    bad += [i for i in lists if rle_problem(dets.rles[i], *map(int, hw[i]), 0)]
    if bad:
        i = min(bad)
        problem = rle_problem(dets.rles[i], int(hw[i, 0]), int(hw[i, 1]), int(dets.image_ids[i]))
        raise NorcalError(f"{dets.source or 'results'}: [{i}]: segmentation: {problem}")
    if not lists:
        return dets
    import pycocotools.mask as mask_utils

    rles = list(dets.rles)
    for i in lists:
        rles[i] = mask_utils.frPyObjects(rles[i], *rles[i]["size"])
    return replace(dets, rles=rles)


def evaluate(gt, results, iou_type: str = "bbox", max_dets: int = 300, table=None) -> EvalResult:
    """LVIS evaluation of ``results`` against ``gt``.

    gt: an annotation path, a loaded LVIS dict, or :func:`prepare_gt`'s LvisGT (reuse one
    for many evaluations). results: a result path, a list of LVIS result dicts, or
    :class:`Detections`. max_dets: detections kept per image by score (300; < 0: all).
    table: a CalibrationTable giving frequency groups when the GT's categories lack them.
    """
    _check_iou_type(iou_type)
    gt = prepare_gt(gt, table)
    dets = from_results(results)
    if len(dets) == 0:
        raise NorcalError("no detections (empty results)")
    img_idx = gt.img_index(dets.image_ids)
    _check_ids(gt, dets, img_idx, gt.cat_index(dets.category_ids), results)
    dets = _check_masks(gt, dets, iou_type)
    dets = cap_per_image(dets, max_dets, img_idx)
    return _evaluate(gt, dets, iou_type, max_dets, -1)


def evaluate_fixed(gt, results, iou_type: str = "bbox", per_class: int = 10000, table=None) -> EvalResult:
    """AP^Fixed (Dave et al. 2021): no per-image cap, the top ``per_class`` detections of
    each category over the whole set, then LVIS AP. Arguments as :func:`evaluate`."""
    _check_iou_type(iou_type)
    if per_class < 1:
        raise NorcalError(f"per-class cap must be >= 1, got {per_class}")
    gt = prepare_gt(gt, table)
    dets = from_results(results)
    if len(dets) == 0:
        raise NorcalError("no detections (empty results)")
    _check_ids(gt, dets, gt.img_index(dets.image_ids), gt.cat_index(dets.category_ids), results)
    dets = _check_masks(gt, dets, iou_type)
    dets = cap_per_class(dets, per_class)
    return _evaluate(gt, dets, iou_type, -1, per_class)


def _evaluate(gt: LvisGT, dets: Detections, iou_type: str, max_dets: int, per_class: int) -> EvalResult:
    k = gt.num_cats
    segm = iou_type in ("segm", "boundary")
    if segm and dets.rles is None:
        raise NorcalError(f"{iou_type} evaluation needs 'segmentation' (RLE) in the results")
    area = dets.area()  # before boxes are derived: mask-only results keep the mask area
    if not segm and dets.boxes is None:
        import pycocotools.mask as mask_utils

        # a copy: the caller's Detections (often evaluated again, e.g. for AP^Fixed) stay as given
        dets = replace(dets, boxes=np.asarray(mask_utils.toBbox(dets.rles), dtype=np.float64).reshape(-1, 4),
                       areas=area)
    img_idx = gt.img_index(dets.image_ids)
    cat_idx = gt.cat_index(dets.category_ids)
    key = img_idx * k + cat_idx
    g_ok = np.flatnonzero((gt.ann_area > 0) & (gt.ann_area < np.inf))
    g_key_all = gt.ann_img * k + gt.ann_cat
    # lvis-api takes "annotated in the image" from GTs of positive area only
    federated = np.isin(key, g_key_all[g_ok]) | np.isin(key, gt.neg_keys)
    keep = np.flatnonzero(federated & (area > 0) & (area < np.inf))
    order = keep[np.lexsort((keep, -dets.scores[keep], key[keep]))]
    d_key, d_area, d_score = key[order], area[order], dets.scores[order]
    d_cat, d_img = cat_idx[order], img_idx[order]
    d_nel = np.isin(d_key, gt.nel_keys)

    g_sel = g_ok[np.argsort(g_key_all[g_ok], kind="stable")]
    g_key, g_area = g_key_all[g_sel], gt.ann_area[g_sel]
    lo, hi = AREA_RNGS[:, 0:1], AREA_RNGS[:, 1:2]
    g_ignore = gt.ann_ignore[g_sel][None, :] | (g_area[None, :] < lo) | (g_area[None, :] > hi)  # [A, G]

    # detections grouped by (image, category): runs of equal key
    n = len(order)
    if n:
        group_start = np.r_[0, np.flatnonzero(d_key[1:] != d_key[:-1]) + 1]
    else:
        group_start = np.zeros(0, dtype=np.int64)
    group_len = np.diff(np.r_[group_start, n]).astype(np.int64)
    gstart = np.searchsorted(g_key, d_key, "left")
    ng = np.searchsorted(g_key, d_key, "right") - gstart
    if segm:
        all_rles = dets.rles
        d_rles = [all_rles[i] for i in order]
        gt_rles = gt.rles()
        g_rles = [gt_rles[i] for i in g_sel]
        iou, off = pair_ious(ng, gstart, None, None, d_rles, g_rles, group_start, group_len)
        if iou_type == "boundary":
            iou = np.minimum(iou, _band_ious(gt, g_sel, d_rles, ng, gstart, group_start, group_len))
    else:
        iou, off = pair_ious(ng, gstart, dets.boxes[order], gt.ann_bbox[g_sel])
    matched, matched_ign = greedy_match(iou, off, ng, gstart, group_start, group_len, g_ignore)

    d_out = (d_area[None, :] < lo) | (d_area[None, :] > hi)  # [A, N]
    tp = matched & ~matched_ign
    fp = ~matched & ~(d_out | d_nel[None, :])[:, None, :]
    num_gt = np.zeros((k, len(AREA_RNGS)), dtype=np.int64)
    g_cat = gt.ann_cat[g_sel]
    for a in range(len(AREA_RNGS)):
        num_gt[:, a] = np.bincount(g_cat[~g_ignore[a]], minlength=k)

    # accumulate per category: detections by category, descending score, then image id, input order
    acc = np.lexsort((order, d_img, -d_score, d_cat))
    precision, recall = _accumulate(d_cat[acc], tp[:, :, acc], fp[:, :, acc], num_gt)
    stats = _summarize(precision, recall, gt.frequency)
    return EvalResult(stats=stats, precision=precision, recall=recall, cat_ids=gt.cat_ids,
                      cat_names=gt.cat_names, frequency=gt.frequency, image_count=gt.image_count,
                      num_gt=num_gt, iou_type=iou_type, max_dets=max_dets, per_class=per_class,
                      num_detections=len(dets))


def _band_ious(gt: LvisGT, g_sel, d_rles, ng, gstart, group_start, group_len) -> np.ndarray:
    """IoU of the boundary bands, laid out as :func:`pair_ious`' mask IoUs; bands only for the
    detections that meet a GT (the others have no pair)."""
    from norcal.evaluation.boundary import boundary_rles

    g_bands = gt.boundary_rles()
    need = np.flatnonzero(ng > 0)
    d_bands: list = [None] * len(d_rles)
    for i, b in zip(need, boundary_rles([d_rles[i] for i in need])):
        d_bands[i] = b
    iou, _ = pair_ious(ng, gstart, None, None, d_bands, [g_bands[i] for i in g_sel],
                       group_start, group_len)
    return iou


def _recall_steps(n: np.ndarray) -> np.ndarray:
    """[K, R]: the fewest true positives k with k / n >= each recall threshold, in float
    arithmetic exactly as lvis-api compares tp / n with np.searchsorted."""
    nf = np.maximum(n, 1).astype(np.float64)[:, None]
    k = np.ceil(REC_THRS[None, :] * nf)
    k = np.where((k - 1 >= 0) & ((k - 1) / nf >= REC_THRS[None, :]), k - 1, k)
    k = np.where(k / nf < REC_THRS[None, :], k + 1, k)
    return k.astype(np.int64)


def _accumulate(cat, tp, fp, num_gt):
    """lvis-api's accumulate(): precision [T, R, K, A] and recall [T, K, A]."""
    a_n, t_n = tp.shape[:2]
    k = num_gt.shape[0]
    r_n = len(REC_THRS)
    precision = -np.ones((t_n, r_n, k, a_n))
    recall = -np.ones((t_n, k, a_n))
    for a in range(a_n):
        has_gt = num_gt[:, a] > 0
        steps = _recall_steps(num_gt[:, a])
        precision[:, :, has_gt, a] = 0.0
        recall[:, has_gt, a] = 0.0
        for t in range(t_n):
            # ignored detections only repeat the previous precision/recall: drop them
            live = np.flatnonzero((tp[a, t] | fp[a, t]) & has_gt[cat])
            if live.size == 0:
                continue
            c = cat[live]
            seg = np.r_[0, np.flatnonzero(c[1:] != c[:-1]) + 1]
            seg_len = np.diff(np.r_[seg, live.size])
            seg_id = np.repeat(np.arange(seg.size), seg_len)
            tpc = np.cumsum(tp[a, t, live])
            fpc = np.cumsum(fp[a, t, live])
            tpc -= np.repeat(np.r_[0, tpc[seg[1:] - 1]], seg_len)
            fpc -= np.repeat(np.r_[0, fpc[seg[1:] - 1]], seg_len)
            pr = tpc / (fpc + tpc + np.spacing(1))
            # precision envelope: suffix maximum within each category (offsets keep runs apart)
            shift = 2.0 * (seg.size - 1 - seg_id)
            env = np.maximum.accumulate((pr + shift)[::-1])[::-1] - shift
            seg_cat = c[seg]
            big = int(num_gt[:, a].max()) + 2
            hay = tpc + seg_id.astype(np.int64) * big
            need = steps[seg_cat] + (np.arange(seg.size) * big)[:, None]  # [S, R]
            pos = np.searchsorted(hay, need, "left")
            inside = pos < (seg + seg_len)[:, None]
            precision[t, :, seg_cat, a] = np.where(inside, env[np.minimum(pos, live.size - 1)], 0.0)
            recall[t, seg_cat, a] = tpc[seg + seg_len - 1] / num_gt[seg_cat, a]
    return precision, recall


def _summarize(precision, recall, frequency) -> dict[str, float]:
    def ap(t=None, area=0, cats=None):
        s = precision if t is None else precision[np.flatnonzero(np.isclose(IOU_THRS, t))]
        s = s[..., area]
        if cats is not None:
            s = s[:, :, cats]
        return _mean_valid(s)

    def ar(area=0, cats=None):
        s = recall[..., area]
        return _mean_valid(s if cats is None else s[:, cats])

    groups = {g: np.array([f == g for f in frequency], dtype=bool) for g in FREQUENCIES}
    known = all(f in FREQUENCIES for f in frequency)
    out = {"AP": ap(), "AP50": ap(0.5), "AP75": ap(0.75),
           "APs": ap(area=1), "APm": ap(area=2), "APl": ap(area=3)}
    for g in FREQUENCIES:
        out[f"AP{g}"] = ap(cats=groups[g]) if known else -1.0
    out.update({"AR": ar(), "ARs": ar(1), "ARm": ar(2), "ARl": ar(3)})
    for g in FREQUENCIES:
        out[f"AR{g}"] = ar(cats=groups[g]) if known else -1.0
    return out


__all__ = ["EvalResult", "IOU_TYPES", "STAT_KEYS", "evaluate", "evaluate_fixed"]
