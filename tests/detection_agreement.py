"""How far a quantized model's detections agree with its float model's (one image at a time)."""
from __future__ import annotations

import numpy as np


def agreement(reference, candidate, score: float = 0.05) -> tuple[float, int, float]:
    """Fraction of the reference's detections scoring >= ``score`` that the candidate has too
    (same class, IoU >= 0.5, candidate score >= score / 2, paired one to one), the number of
    those reference detections, and the largest score difference over the pairs."""
    from norcal.workflows.parity.matching import match_detections

    matched = total = 0
    worst = 0.0
    for r, c in zip(reference, candidate):
        keep, ck = r.scores >= score, c.scores >= score / 2
        ri, ci, _ = match_detections(r.boxes[keep], r.scores[keep], r.classes[keep],
                                     c.boxes[ck], c.scores[ck], c.classes[ck], 0.5)
        if len(ri):
            worst = max(worst, float(np.abs(r.scores[keep][ri] - c.scores[ck][ci]).max()))
        matched, total = matched + len(ri), total + int(keep.sum())
    return matched / total, total, worst
