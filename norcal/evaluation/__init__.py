"""Evaluation: AP, AP_r/c/f, AR, AP^Fixed (numpy) under LVIS federated rules (the numbers of
lvis-api 0.5.3) or COCO rules (pycocotools' COCOeval), chosen from the GT or forced
(``rules``: :mod:`norcal.evaluation.rules`), with box, mask or Boundary IoU (``iou_type``
bbox, segm, boundary); precision / recall at a threshold: :mod:`norcal.evaluation.deployment`.

    from norcal.evaluation import evaluate, evaluate_fixed, prepare_gt
    gt = prepare_gt("lvis_v1_val.json")          # index once, reuse for many evaluations
    res = evaluate(gt, "results.json", iou_type="bbox", max_dets=300)
    res.stats["AP"], res.stats["APr"]
"""

from norcal.evaluation.detections import Detections, cap_per_class, cap_per_image, from_results
from norcal.evaluation.ground_truth import LvisGT, prepare_gt
from norcal.evaluation.lvis_eval import IOU_TYPES, STAT_KEYS, EvalResult, evaluate, evaluate_fixed

__all__ = ["Detections", "EvalResult", "IOU_TYPES", "LvisGT", "STAT_KEYS", "cap_per_class", "cap_per_image",
           "evaluate", "evaluate_fixed", "from_results", "prepare_gt"]
