"""detectron2's ``CascadeROIHeads`` at inference (Cascade Mask R-CNN, Cai & Vasconcelos).

Each stage pools its proposals, runs its own box head and predictor; stage k+1's proposals
are stage k's class-agnostic regressed boxes clipped to the image. The final class
probabilities are the mean over the stages of each stage's (NorCal-calibrated, where set)
probabilities, the final boxes the last stage's; the mask head runs on the final detections.
"""

from __future__ import annotations

from torch import nn

from norcal.core.errors import NorcalError

from .box_coder import clip_boxes
from .box_head import FastRCNNConvFCHead
from .box_predictor import FastRCNNOutputLayers
from .mask_head import MaskRCNNConvUpsampleHead
from .poolers import ROIPooler
from .roi_heads import StandardROIHeads


class StagePredictors(nn.ModuleList):
    """The stages' ``FastRCNNOutputLayers`` (detectron2's ``roi_heads.box_predictor.K``).

    NorCal's state is shared: setting it on the list sets it on every stage, because the NorCal
    authors calibrate inside each stage's ``predict_probs``.
    """

    def set_log_prior(self, log_prior, mechanism: str = "exp", renormalize: bool | None = None) -> None:
        for pred in self:
            pred.set_log_prior(log_prior, mechanism, renormalize)

    def _shared(self, name: str):
        return getattr(self[0], name)

    def _set_all(self, name: str, value) -> None:
        for pred in self:
            setattr(pred, name, value)

    log_prior = property(lambda self: self._shared("log_prior"), lambda self, v: self._set_all("log_prior", v))
    mechanism = property(lambda self: self._shared("mechanism"), lambda self, v: self._set_all("mechanism", v))
    renormalize = property(lambda self: self._shared("renormalize"),
                           lambda self, v: self._set_all("renormalize", v))
    use_sigmoid = property(lambda self: self._shared("use_sigmoid"))
    num_classes = property(lambda self: self._shared("num_classes"))


class CascadeROIHeads(StandardROIHeads):
    """Box pooler shared by the stages; ``box_head`` and ``box_predictor`` hold one per stage."""

    def __init__(self, box_pooler: ROIPooler, box_heads: list[FastRCNNConvFCHead],
                 box_predictors: list[FastRCNNOutputLayers], mask_pooler: ROIPooler | None = None,
                 mask_head: MaskRCNNConvUpsampleHead | None = None):
        super().__init__(box_pooler, nn.ModuleList(box_heads), StagePredictors(box_predictors),
                         mask_pooler, mask_head)
        if any(p.num_reg_classes != 1 for p in box_predictors):
            raise NorcalError("cascade stages regress class-agnostic boxes (cls_agnostic_bbox_reg)")

    def forward(self, features, proposals, valid, image_sizes, masks=None,
                intermediates: dict | None = None):
        """As ``StandardROIHeads.forward``; ``intermediates`` also gets each stage's
        ``stage_proposals``, ``stage_cls_logits`` and ``stage_box_deltas`` (lists, [B, R, ...])."""
        b, r = proposals.shape[0], proposals.shape[1]
        features = self.edge_replicated(features, masks)
        boxes, deltas = proposals, None
        stage = {"stage_proposals": [], "stage_cls_logits": [], "stage_box_deltas": []}
        probs = []
        for k, (head, pred) in enumerate(zip(self.box_head, self.box_predictor)):
            if k > 0:
                # the previous stage's regressed boxes, clipped (detectron2's _create_proposals_from_boxes)
                prev = self.box_predictor[k - 1]
                boxes = clip_boxes(prev.box_coder.decode(deltas, boxes)[:, :, 0, :], image_sizes)
            logits, deltas = pred(head(self.box_pooler(features, boxes)))
            logits = logits.reshape(b, r, -1)
            deltas = deltas.reshape(b, r, -1)
            probs.append(pred.probs(logits))
            for key, v in zip(stage, (boxes, logits, deltas)):
                stage[key].append(v)
        # detectron2: sum(scores per stage) * (1.0 / num_stages)
        mean = sum(probs[1:], probs[0]) * (1.0 / len(probs))
        if intermediates is not None:
            intermediates.update(stage, cls_logits=logits, box_deltas=deltas)
        last = self.box_predictor[-1]
        num, det, scores, classes = last.inference_from_probs(mean, deltas, boxes, valid, image_sizes)
        return self.with_masks(features, num, det, scores, classes)
