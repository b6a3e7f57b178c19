"""A LazyConfig's ``CascadeROIHeads`` (``box_heads``, ``box_predictors``, ``proposal_matchers``:
one per stage, as projects/ViTDet/configs/LVIS/cascade_mask_rcnn_*.py set them) as the yaml-era
cascade keys: ``ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS`` / ``IOUS`` and one box head and predictor
setting for all stages.

detectron2 builds each stage from its own entry; the export runs one head shape and one set of
test settings for all of them, so the stages must agree on everything but their box regression
weights (and training-only arguments): a disagreement is refused naming the stage's key path.
"""

from __future__ import annotations

from typing import Callable

from norcal.core.errors import shown

CASCADE = "CascadeROIHeads"
STAGE_LISTS = ("box_heads", "box_predictors", "proposal_matchers")


def _stages(lz, p: str) -> int:
    for key in ("box_head", "box_predictor", "proposal_matcher"):
        if lz.get(f"{p}.{key}", None) is not None:  # detectron2 refuses them too
            raise lz.bad(f"{p}.{key}", f"CascadeROIHeads take one per stage, in {key}s (or proposal_matchers)")
    counts = []
    for key in STAGE_LISTS:
        stages = lz.get(f"{p}.{key}")
        if not isinstance(stages, list) or not stages:
            raise lz.bad(f"{p}.{key}", f"expected one entry per cascade stage, got {shown(stages)}")
        counts.append(len(stages))
    if len(set(counts)) != 1:  # detectron2 asserts it too
        raise lz.bad(p, f"{', '.join(STAGE_LISTS)} must have one entry per stage, got {counts}")
    return counts[0]


def _agree(lz, path: str, values: list[dict]) -> dict:
    """Stage 0's values, after checking that every stage gives the same."""
    for k, v in enumerate(values[1:], 1):
        for key, first in values[0].items():
            if v[key] != first:
                raise lz.bad(f"{path}.{k}", f"{key} {shown(v[key])} differs from stage 0's {shown(first)}: "
                                            "the cascade's stages must agree (only their box2box_transform "
                                            "weights may differ)")
    return values[0]


def cascade_heads(lz, p: str, read_head: Callable[[str], dict], read_predictor: Callable[[str], dict]
                  ) -> tuple[dict, dict, dict]:
    """(the stages' box head keys, their predictor values, ``ROI_BOX_CASCADE_HEAD`` keys) of the
    ``CascadeROIHeads`` at ``p``; ``read_head`` / ``read_predictor`` read one stage's box head
    keys / predictor values from its key path."""
    n = _stages(lz, p)
    head = _agree(lz, f"{p}.box_heads", [read_head(f"{p}.box_heads.{k}") for k in range(n)])
    pred = _agree(lz, f"{p}.box_predictors", [read_predictor(f"{p}.box_predictors.{k}") for k in range(n)])
    if not pred["cls_agnostic_bbox_reg"]:  # detectron2's yaml path asserts it; the stages share boxes
        raise lz.bad(f"{p}.box_predictors.0.cls_agnostic_bbox_reg", "CascadeROIHeads regress class-agnostic "
                                                                    "boxes: expected true")
    weights, ious = [], []
    for k in range(n):
        transform = f"{p}.box_predictors.{k}.box2box_transform"
        lz.expect(transform, ("Box2BoxTransform",), "the box regression")
        lz.only(transform, {"weights"})
        weights.append(lz.get(f"{transform}.weights"))
        lz.expect(f"{p}.proposal_matchers.{k}", ("Matcher",), "the stage's proposal matcher")
        thresholds = lz.get(f"{p}.proposal_matchers.{k}.thresholds")  # training only: kept as given
        ious.append(thresholds[0] if isinstance(thresholds, list) and len(thresholds) == 1 else thresholds)
    return head, pred, {"BBOX_REG_WEIGHTS": weights, "IOUS": ious}
