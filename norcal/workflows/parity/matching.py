"""Detections of two sources paired as sets: one image at a time, same class, box IoU.

The one matcher of the project: parity judges backends with it, and the tests match
detectron2's golden detections with it (tests/golden.py).
"""

from __future__ import annotations

import numpy as np

from norcal.core.boxes import box_iou


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
    # identical zero-area boxes (a detection clipped to the border on both sides) pair up
    iou = box_iou(ref_boxes, cand_boxes, identical_empty=True)
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
