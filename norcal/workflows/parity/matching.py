"""Detections of two sources paired as sets: one image at a time, same class, box IoU.

The one matcher of the project: parity judges backends with it, and the tests match
detectron2's golden detections with it (tests/golden.py).
"""

from __future__ import annotations

import numpy as np


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU [N, M] of boxes a [N, 4] and b [M, 4] (x0, y0, x1, y1)."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    # two identical empty boxes (a degenerate detection clipped to the border) are the same box
    same = (union <= 0) & np.all(a[:, None, :] == b[None, :, :], axis=-1)
    return np.where(same, 1.0, iou)


def match_detections(ref_boxes, ref_scores, ref_classes, cand_boxes, cand_scores, cand_classes,
                     iou_threshold: float, max_score_diff: float | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pair one image's detections as sets: greedily in descending reference score, each
    reference detection takes the unpaired candidate of the same class with the highest
    IoU >= ``iou_threshold`` (equal IoU: the closer score). With ``max_score_diff`` a
    candidate whose score differs by more is no partner (a score check folded into pairing).

    Returns (ref_index [P], cand_index [P], iou [P]), in the order the pairs were made.
    """
    nr, nc = len(ref_scores), len(cand_scores)
    if nr == 0 or nc == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0)
    iou = box_iou(ref_boxes, cand_boxes)
    iou[np.asarray(ref_classes)[:, None] != np.asarray(cand_classes)[None, :]] = -1.0
    sdiff = np.abs(np.asarray(ref_scores, np.float64)[:, None] - np.asarray(cand_scores, np.float64)[None, :])
    if max_score_diff is not None:
        iou[sdiff > max_score_diff] = -1.0
    taken = np.zeros(nc, bool)
    ri, ci, ious = [], [], []
    for r in np.argsort(-np.asarray(ref_scores, np.float64), kind="stable"):
        row = np.where(taken | (iou[r] < iou_threshold), -np.inf, iou[r])
        best = row.max()
        if not np.isfinite(best):
            continue
        ties = np.flatnonzero(row == best)
        c = int(ties[np.argmin(sdiff[r, ties])])
        taken[c] = True
        ri.append(int(r))
        ci.append(c)
        ious.append(float(best))
    return np.array(ri, np.int64), np.array(ci, np.int64), np.array(ious)
