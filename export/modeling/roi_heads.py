"""detectron2's ROI heads at inference: box features -> predictor -> detections, then masks of
the final detections. ``StandardROIHeads`` (FPN, DC5): box pooler + head; ``Res5ROIHeads``
(C4): one pooler and res5 shared by the box and mask branches."""

from __future__ import annotations

import torch
from torch import nn

from .box_head import FastRCNNConvFCHead
from .box_predictor import FastRCNNOutputLayers
from .mask_head import MaskRCNNConvUpsampleHead
from .poolers import ROIPooler


class _ROIHeads(nn.Module):
    """The inference both heads share; subclasses say how boxes become features."""

    box_predictor: FastRCNNOutputLayers
    mask_head: MaskRCNNConvUpsampleHead | None

    @property
    def num_levels(self) -> int:
        """How many of the backbone's leading feature maps the heads pool from."""
        raise NotImplementedError

    def box_features(self, features, boxes, masks) -> torch.Tensor:
        raise NotImplementedError

    def mask_features(self, features, boxes, masks) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, features, proposals, valid, image_sizes, masks=None,
                intermediates: dict | None = None):
        """features (the first ``num_levels`` maps), proposals [B, R, 4] + valid [B, R] -> dict
        of the graph outputs."""
        b, r = proposals.shape[0], proposals.shape[1]
        logits, deltas = self.box_predictor(self.box_features(features, proposals, masks))
        logits = logits.reshape(b, r, -1)
        deltas = deltas.reshape(b, r, -1)
        if intermediates is not None:
            intermediates.update(cls_logits=logits, box_deltas=deltas)
        num, boxes, scores, classes = self.box_predictor.inference(
            logits, deltas, proposals, valid, image_sizes)
        return self.with_masks(features, num, boxes, scores, classes, masks)

    def with_masks(self, features, num, boxes, scores, classes, masks) -> dict[str, torch.Tensor]:
        """The graph outputs for these detections, with the mask head's masks where it has one."""
        out = {"num_detections": num, "boxes": boxes, "scores": scores, "classes": classes}
        if self.mask_head is not None:
            b, k = boxes.shape[0], boxes.shape[1]
            m = self.mask_head(self.mask_features(features, boxes, masks), classes.reshape(-1))
            m = m.reshape(b, k, m.shape[-2], m.shape[-1])
            out["masks"] = m * (scores > 0).to(m.dtype)[:, :, None, None]
        return out


class StandardROIHeads(_ROIHeads):
    def __init__(self, box_pooler: ROIPooler, box_head: FastRCNNConvFCHead,
                 box_predictor: FastRCNNOutputLayers, mask_pooler: ROIPooler | None = None,
                 mask_head: MaskRCNNConvUpsampleHead | None = None):
        super().__init__()
        self.box_pooler = box_pooler
        self.box_head = box_head
        self.box_predictor = box_predictor
        self.mask_pooler = mask_pooler
        self.mask_head = mask_head

    @property
    def num_levels(self) -> int:
        return len(self.box_pooler.strides)

    def box_features(self, features, boxes, masks):
        return self.box_head(self.box_pooler(features, boxes, masks))

    def mask_features(self, features, boxes, masks):
        return self.mask_pooler(features, boxes, masks)


class Res5ROIHeads(_ROIHeads):
    """C4: pool each box from res4, run res5 on it; the box predictor reads res5's output
    averaged over its grid, the mask head reads it as is (detectron2's ``_shared_roi_transform``)."""

    def __init__(self, pooler: ROIPooler, res5: nn.ModuleList, box_predictor: FastRCNNOutputLayers,
                 mask_head: MaskRCNNConvUpsampleHead | None = None):
        super().__init__()
        self.pooler = pooler
        self.res5 = res5
        self.box_predictor = box_predictor
        self.mask_head = mask_head

    @property
    def num_levels(self) -> int:
        return len(self.pooler.strides)

    def _shared_roi_transform(self, features, boxes, masks) -> torch.Tensor:
        x = self.pooler(features, boxes, masks)
        for block in self.res5:
            x = block(x)
        return x

    def box_features(self, features, boxes, masks):
        return self._shared_roi_transform(features, boxes, masks).mean(dim=(2, 3))

    def mask_features(self, features, boxes, masks):
        return self._shared_roi_transform(features, boxes, masks)
