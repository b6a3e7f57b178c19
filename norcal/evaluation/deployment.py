"""Deployment metrics: precision and recall at one confidence threshold, per frequency group.

A deployed detector keeps the detections with score >= T. Here those of an evaluation (after
its caps) are matched one-to-one, greedily by score, to GTs at IoU >= 0.5 (all areas), under
the evaluation's rules (:mod:`norcal.evaluation.rules`): what AP ignores (detections dropped
by federated rules, unmatched not-exhaustive ones, matches to crowd or ignored GTs) is
neither a true nor a false positive, and ignored GTs are not counted. Greedy matching by score
makes the matches of the detections over T those of the whole evaluation, so they are read
from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from norcal.core.errors import NorcalError
from norcal.evaluation.ground_truth import FREQUENCIES

MATCH_IOU = 0.5  # IOU_THRS[0]
GROUPS = ("all",) + FREQUENCIES  # frequency groups only where every category has one


@dataclass
class DeploymentMetrics:
    """Per group (``all``, and ``r``, ``c``, ``f`` when the categories have groups): true and
    false positives, GTs, and precision = tp / (tp + fp), recall = tp / num_gt (-1 where the
    denominator is 0), at ``score_thresh``."""

    score_thresh: float
    rows: dict[str, dict[str, float]]

    def to_json(self) -> dict[str, Any]:
        return {"score_thresh": self.score_thresh, "iou": MATCH_IOU, "groups": self.rows}


def check_score_thresh(score_thresh: float) -> None:
    """A score threshold lies in [0, 1), as a model's conf does (scores are probabilities)."""
    if not (isinstance(score_thresh, (int, float)) and 0 <= score_thresh < 1):
        raise NorcalError(f"score_thresh must be a number in [0, 1), got {score_thresh!r}", param="score_thresh")


def deployment_metrics(result, score_thresh: float) -> DeploymentMetrics:
    """Precision and recall at ``score_thresh`` of an :class:`norcal.evaluation.EvalResult`
    (its rules, caps and IoU type; all areas, IoU >= 0.5)."""
    check_score_thresh(score_thresh)
    m = result.matched
    if m is None:
        raise NorcalError("the evaluation kept no matches (evaluate() keeps them)")
    over = m.score >= score_thresh
    tp = m.tp[0, 0] & over  # all areas, IoU 0.50
    fp = m.fp[0, 0] & over
    k = m.num_gt.shape[0]
    tp_k = np.bincount(m.cat[tp], minlength=k)
    fp_k = np.bincount(m.cat[fp], minlength=k)
    gt_k = m.num_gt[:, 0]
    groups = {"all": np.ones(k, dtype=bool)}
    if all(f in FREQUENCIES for f in result.frequency):
        groups.update({g: np.array([f == g for f in result.frequency], dtype=bool) for g in FREQUENCIES})
    rows = {}
    for name, sel in groups.items():
        t, f, n = int(tp_k[sel].sum()), int(fp_k[sel].sum()), int(gt_k[sel].sum())
        rows[name] = {"tp": t, "fp": f, "num_gt": n,
                      "precision": t / (t + f) if t + f else -1.0,
                      "recall": t / n if n else -1.0}
    return DeploymentMetrics(float(score_thresh), rows)


__all__ = ["DeploymentMetrics", "GROUPS", "MATCH_IOU", "deployment_metrics"]
