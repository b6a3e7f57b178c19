"""detectron2's ``StandardROIHeads`` at inference: box pooler + head + predictor, then the
mask pooler + head on the final detections."""

from __future__ import annotations

from torch import nn

from .box_head import FastRCNNConvFCHead
from .box_predictor import FastRCNNOutputLayers
from .mask_head import MaskRCNNConvUpsampleHead
from .poolers import ROIPooler


class StandardROIHeads(nn.Module):
    def __init__(self, box_pooler: ROIPooler, box_head: FastRCNNConvFCHead,
                 box_predictor: FastRCNNOutputLayers, mask_pooler: ROIPooler | None = None,
                 mask_head: MaskRCNNConvUpsampleHead | None = None):
        super().__init__()
        self.box_pooler = box_pooler
        self.box_head = box_head
        self.box_predictor = box_predictor
        self.mask_pooler = mask_pooler
        self.mask_head = mask_head

    def forward(self, features, proposals, valid, image_sizes, masks=None,
                intermediates: dict | None = None):
        """features [p2..p5], proposals [B, R, 4] + valid [B, R] -> dict of the graph outputs."""
        b, r = proposals.shape[0], proposals.shape[1]
        x = self.box_head(self.box_pooler(features, proposals, masks))
        logits, deltas = self.box_predictor(x)
        logits = logits.reshape(b, r, -1)
        deltas = deltas.reshape(b, r, -1)
        if intermediates is not None:
            intermediates.update(cls_logits=logits, box_deltas=deltas)
        num, boxes, scores, classes = self.box_predictor.inference(
            logits, deltas, proposals, valid, image_sizes)
        out = {"num_detections": num, "boxes": boxes, "scores": scores, "classes": classes}
        if self.mask_head is not None:
            k = boxes.shape[1]
            m = self.mask_head(self.mask_pooler(features, boxes, masks), classes.reshape(-1))
            m = m.reshape(b, k, m.shape[-2], m.shape[-1])
            out["masks"] = m * (scores > 0).to(m.dtype)[:, :, None, None]
        return out
