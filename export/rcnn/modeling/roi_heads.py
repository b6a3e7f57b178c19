"""detectron2's ROI heads at inference: box features -> predictor -> detections, then masks of
the final detections. ``StandardROIHeads`` (FPN, DC5): box pooler + head; ``Res5ROIHeads``
(C4): one pooler and res5 shared by the box and mask branches."""

from __future__ import annotations

import torch
from torch import nn

from norcal.core.contract import MASK_HEAD_ROIS_VALUES

from .box_head import FastRCNNConvFCHead
from .box_predictor import FastRCNNOutputLayers
from .mask_head import MaskRCNNConvUpsampleHead
from .poolers import ROIPooler, replicate_edge

# the mask head runs on the detections only (data-dependent count) or on all K slots, padding
# included (no data-dependent shapes); the values are the metadata's (norcal.core.contract)
MASK_ROIS = MASK_HEAD_ROIS_VALUES
MASK_ROIS_VALID, MASK_ROIS_STATIC = MASK_ROIS


class _ROIHeads(nn.Module):
    """The inference both heads share; subclasses say how boxes become features."""

    box_predictor: FastRCNNOutputLayers
    mask_head: MaskRCNNConvUpsampleHead | None
    # which ROIs the mask head runs on (MASK_ROIS); the export may choose the static form
    mask_rois: str = MASK_ROIS_VALID

    @property
    def num_levels(self) -> int:
        """How many of the backbone's leading feature maps the heads pool from."""
        raise NotImplementedError

    @property
    def pooler_strides(self) -> list[int]:
        raise NotImplementedError

    def box_features(self, features, boxes, masks) -> torch.Tensor:
        raise NotImplementedError

    def mask_features(self, features, boxes, batch_idx) -> torch.Tensor:
        """Mask head input of boxes [M, 4] of images ``batch_idx`` int64 [M] (features as
        returned by :meth:`edge_replicated`)."""
        raise NotImplementedError

    def edge_replicated(self, features, masks) -> list[torch.Tensor]:
        """The features the poolers read: each image's edge replicated into the batch padding
        (see ``poolers.replicate_edge``) once for the box and mask poolers; then pass them
        ``masks=None``. Unchanged where no map holds padding."""
        if masks is None or not masks.enabled:
            return features
        return [replicate_edge(f, masks.extent(s)) for f, s in zip(features, self.pooler_strides)]

    def forward(self, features, proposals, valid, image_sizes, masks=None,
                intermediates: dict | None = None):
        """features (the first ``num_levels`` maps), proposals [B, R, 4] + valid [B, R] -> dict
        of the graph outputs."""
        b, r = proposals.shape[0], proposals.shape[1]
        features = self.edge_replicated(features, masks)
        logits, deltas = self.box_predictor(self.box_features(features, proposals, None))
        logits = logits.reshape(b, r, -1)
        deltas = deltas.reshape(b, r, -1)
        if intermediates is not None:
            intermediates.update(cls_logits=logits, box_deltas=deltas)
        num, boxes, scores, classes = self.box_predictor.inference(
            logits, deltas, proposals, valid, image_sizes)
        return self.with_masks(features, num, boxes, scores, classes)

    def with_masks(self, features, num, boxes, scores, classes) -> dict[str, torch.Tensor]:
        """The graph outputs for these detections, with the mask head's masks where it has one
        (``features`` from :meth:`edge_replicated`): [B, K, M, M], zero in the padded slots."""
        out = {"num_detections": num, "boxes": boxes, "scores": scores, "classes": classes}
        if self.mask_head is None:
            return out
        b, k = boxes.shape[0], boxes.shape[1]
        flat_boxes, flat_classes = boxes.reshape(-1, 4), classes.reshape(-1)
        if self.mask_rois == MASK_ROIS_STATIC:
            batch_idx = torch.arange(b, device=boxes.device)[:, None].expand(b, k).reshape(-1)
            m = self.mask_head(self.mask_features(features, flat_boxes, batch_idx), flat_classes)
            m = m.reshape(b, k, m.shape[-2], m.shape[-1])
            out["masks"] = m * (scores > 0).to(m.dtype)[:, :, None, None]
            return out
        # detections score > 0, padded slots exactly 0: pool and run the head on those only
        # (NonZero, Gather) and scatter the masks back into the zeroed [B*K, M, M] grid
        idx = torch.nonzero(scores.reshape(-1) > 0).reshape(-1)
        batch_idx = torch.div(idx, k, rounding_mode="trunc")
        m = self.mask_head(self.mask_features(features, flat_boxes[idx], batch_idx),
                           flat_classes[idx])
        full = m.new_zeros((b * k, m.shape[-2], m.shape[-1])).index_put((idx,), m)
        out["masks"] = full.reshape(b, k, m.shape[-2], m.shape[-1])
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

    @property
    def pooler_strides(self) -> list[int]:
        return self.box_pooler.strides

    def box_features(self, features, boxes, masks):
        return self.box_head(self.box_pooler(features, boxes, masks))

    def mask_features(self, features, boxes, batch_idx):
        return self.mask_pooler.pool(features, boxes, batch_idx)


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

    @property
    def pooler_strides(self) -> list[int]:
        return self.pooler.strides

    def _res5(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.res5:
            x = block(x)
        return x

    def box_features(self, features, boxes, masks):
        return self._res5(self.pooler(features, boxes, masks)).mean(dim=(2, 3))

    def mask_features(self, features, boxes, batch_idx):
        return self._res5(self.pooler.pool(features, boxes, batch_idx))
