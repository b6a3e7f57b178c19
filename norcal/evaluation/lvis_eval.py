"""AP computed with numpy, under LVIS federated rules (the numbers of lvis-api 0.5.3) or COCO
rules (the numbers of pycocotools' COCOeval), chosen from the GT or forced (``rules``; what
each set counts: :mod:`norcal.evaluation.rules`).

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

COCO rules: the same keys, AR... at 100 per image and category (COCOeval's AR@100, ARs@100
...), plus AR1 and AR10 (COCOeval's AR@1, AR@10); APr... and ARr... are reported
(:meth:`EvalResult.stat_keys`) only where the categories have frequency groups.
"""

from __future__ import annotations

import os

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from norcal.core.errors import NorcalError
from norcal.evaluation.detections import (Detections, cap_per_class, cap_per_image, check_rle,
                                          from_results)
from norcal.evaluation.ground_truth import FREQUENCIES, LvisGT, prepare_gt, rle_problem
from norcal.evaluation.matching import IOU_THRS, REC_THRS
from norcal.evaluation.rules import COCO_MAX_DETS, Matched, RuleChoice, Rules, choose_rules, match_detections

IOU_TYPES = ("bbox", "segm", "boundary")
STAT_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "APr", "APc", "APf",
             "AR", "ARs", "ARm", "ARl", "ARr", "ARc", "ARf")
_GROUP_KEYS = ("APr", "APc", "APf", "ARr", "ARc", "ARf")
COCO_STAT_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "APr", "APc", "APf",
                  "AR1", "AR10", "AR", "ARs", "ARm", "ARl", "ARr", "ARc", "ARf")


@dataclass
class EvalResult:
    """What one evaluation gives.

    stats: the metrics named in :data:`STAT_KEYS` (COCO rules: :data:`COCO_STAT_KEYS`).
    precision [T=10, R=101, K, A=4] and recall [T, K, A] are lvis-api's ``eval['precision']`` /
    ``eval['recall']`` (COCOeval's at maxDets=100; -1 where a category has no GT in that area
    range). Per category (K, sorted by id): ``cat_ids``, ``cat_names``, ``frequency``,
    ``image_count`` (N_c, nan when unknown), ``num_gt``. ``rules`` (lvis or coco) and
    ``rules_reason``: what was applied and why; ``matched``: the matched detections.
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
    rules: str = "lvis"
    rules_reason: str = ""
    matched: Matched | None = field(default=None, repr=False)

    def stat_keys(self) -> tuple[str, ...]:
        """The stats reported: LVIS all of :data:`STAT_KEYS`; COCO :data:`COCO_STAT_KEYS`
        without the frequency groups where the categories have none."""
        if self.rules != "coco":
            return STAT_KEYS
        grouped = all(f in FREQUENCIES for f in self.frequency)
        return tuple(k for k in COCO_STAT_KEYS if grouped or k not in _GROUP_KEYS)

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
            "rules": self.rules,
            "rules_reason": self.rules_reason,
            "iou_type": self.iou_type,
            "max_dets": self.max_dets,
            "per_class_cap": self.per_class,
            "num_detections": self.num_detections,
            "stats": {k: float(self.stats[k]) for k in self.stat_keys()},
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


def _inputs(gt, results, iou_type: str, table, rules: Rules | RuleChoice) -> tuple[LvisGT, Detections, RuleChoice]:
    """The prepared GT, the checked detections and the rules."""
    _check_iou_type(iou_type)
    gt = prepare_gt(gt, table)
    choice = choose_rules(gt, rules)
    dets = from_results(results)
    if len(dets) == 0:
        raise NorcalError("no detections (empty results)")
    _check_ids(gt, dets, gt.img_index(dets.image_ids), gt.cat_index(dets.category_ids), results)
    return gt, _check_masks(gt, dets, iou_type), choice


def evaluate(gt, results, iou_type: str = "bbox", max_dets: int | None = None, table=None,
             rules: Rules | RuleChoice = "auto") -> EvalResult:
    """AP of ``results`` against ``gt``, under LVIS federated or COCO rules.

    gt: an annotation path, a loaded LVIS/COCO dict, or :func:`prepare_gt`'s LvisGT (reuse
    one for many evaluations). results: a result path, a list of result dicts, or
    :class:`Detections`. max_dets: detections kept per image by score (< 0: all; None: 300
    under LVIS rules, all under COCO rules, which then keep the top 100 per image and
    category as COCOeval). table: a CalibrationTable giving frequency groups when the GT's
    categories lack them. rules: auto (from the GT), lvis or coco, or a RuleChoice (see
    :func:`norcal.evaluation.rules.choose_rules`).
    """
    gt, dets, choice = _inputs(gt, results, iou_type, table, rules)
    if max_dets is None:
        max_dets = 300 if choice.name == "lvis" else -1
    dets = cap_per_image(dets, max_dets, gt.img_index(dets.image_ids))
    return _evaluate(gt, dets, iou_type, max_dets, -1, choice)


def evaluate_fixed(gt, results, iou_type: str = "bbox", per_class: int = 10000, table=None,
                   rules: Rules | RuleChoice = "auto") -> EvalResult:
    """AP^Fixed (Dave et al. 2021): no per-image cap, the top ``per_class`` detections of
    each category over the whole set, then AP (COCO rules: no per-image-and-category cap
    either). Arguments as :func:`evaluate`."""
    _check_iou_type(iou_type)
    if per_class < 1:
        raise NorcalError(f"per-class cap must be >= 1, got {per_class}")
    gt, dets, choice = _inputs(gt, results, iou_type, table, rules)
    dets = cap_per_class(dets, per_class)
    return _evaluate(gt, dets, iou_type, -1, per_class, choice)


def _evaluate(gt: LvisGT, dets: Detections, iou_type: str, max_dets: int, per_class: int,
              choice: RuleChoice) -> EvalResult:
    segm = iou_type in ("segm", "boundary")
    if segm and dets.rles is None:
        raise NorcalError(f"{iou_type} evaluation needs 'segmentation' (RLE) in the results")
    area = dets.area()  # before boxes are derived: mask-only results keep the mask area
    if not segm and dets.boxes is None:
        import pycocotools.mask as mask_utils

        # a copy: the caller's Detections (often evaluated again, e.g. for AP^Fixed) stay as given
        dets = replace(dets, boxes=np.asarray(mask_utils.toBbox(dets.rles), dtype=np.float64).reshape(-1, 4),
                       areas=area)
    coco = choice.name == "coco"
    # COCOeval's maxDets=100 per image and category; AP^Fixed (per_class >= 0) has no such cap
    cap = COCO_MAX_DETS if coco and per_class < 0 else -1
    m = match_detections(gt, dets, iou_type, choice.name, area, cap)
    # accumulate per category: detections by category, descending score, then image id, input order
    acc = np.lexsort((m.order, m.img, -m.score, m.cat))
    precision, recall = _accumulate(m.cat[acc], m.tp[:, :, acc], m.fp[:, :, acc], m.num_gt)
    stats = _summarize(precision, recall, gt.frequency)
    if coco:  # COCOeval's AR@1 and AR@10: the top 1 / 10 per image and category
        for top in (1, 10):
            stats[f"AR{top}"] = _mean_valid(_recall_at(m, top))
    return EvalResult(stats=stats, precision=precision, recall=recall, cat_ids=gt.cat_ids,
                      cat_names=gt.cat_names, frequency=gt.frequency, image_count=gt.image_count,
                      num_gt=m.num_gt, iou_type=iou_type, max_dets=max_dets, per_class=per_class,
                      num_detections=len(dets), rules=choice.name, rules_reason=choice.reason,
                      matched=m)


def _recall_at(m: Matched, top: int) -> np.ndarray:
    """Recall [T, K] (all areas) of the top ``top`` detections per image and category; -1
    where a category has no GT."""
    tp = m.tp[0] & (m.rank < top)[None, :]
    k = m.num_gt.shape[0]
    hits = np.stack([np.bincount(m.cat, weights=t, minlength=k) for t in tp])
    n = m.num_gt[:, 0]
    return np.where(n > 0, hits / np.maximum(n, 1), -1.0)


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


__all__ = ["COCO_STAT_KEYS", "EvalResult", "IOU_TYPES", "STAT_KEYS", "evaluate", "evaluate_fixed"]
