"""GeneralizedRCNN: the composition. Input contract (norcal.core.contract): images float32 [B,3,H,W]
BGR 0-255, resized and zero-padded to a multiple of 32; image_sizes int64 [B,2] (h, w)."""

from __future__ import annotations

import torch
from torch import nn

from norcal.core.contract import OUTPUT_NAMES

from .layers import PaddingMasks


class GeneralizedRCNN(nn.Module):
    def __init__(self, backbone, proposal_generator, roi_heads, *, pixel_mean, pixel_std,
                 size_divisibility: int = 32):
        """``size_divisibility``: what detectron2 pads each image to on its own (FPN 32; C4 and
        DC5 1: no padding); the batch's own padding is masked back to that per image."""
        super().__init__()
        self.backbone = backbone
        self.proposal_generator = proposal_generator
        self.roi_heads = roi_heads
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(1, -1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(1, -1, 1, 1), False)
        self.size_divisibility = size_divisibility
        # False: every image arrives padded to its own multiple of size_divisibility only (one
        # image per batch), so no map needs masking (see PaddingMasks); the export decides
        self.padding_masks = True

    def inference(self, images: torch.Tensor, image_sizes: torch.Tensor,
                  intermediates: bool = False, front: tuple | None = None) -> dict[str, torch.Tensor]:
        """Detections by name (see OUTPUT_NAMES); with ``intermediates`` also ``proposals``
        [B, P, 4], ``proposal_logits`` / ``proposal_valid`` [B, P], ``cls_logits`` [B, P, C+1]
        and ``box_deltas`` [B, P, K*4]. ``front``: what :meth:`front` gave for these images (it
        does not depend on the box classifier's prior, so runs at several priors may share it)."""
        features, props, logits, valid, masks = front if front is not None else self.front(images, image_sizes)
        extra = {} if intermediates else None
        # FPN's P6 feeds only the RPN; C4 and DC5 have one map for both
        roi_features = features[:self.roi_heads.num_levels]
        out = self.roi_heads(roi_features, props, valid, image_sizes, masks, extra)
        if intermediates:
            out.update(extra, proposals=props, proposal_logits=logits, proposal_valid=valid)
        return out

    def front(self, images: torch.Tensor, image_sizes: torch.Tensor) -> tuple:
        """The backbone's features and the RPN's proposals: (features, proposals, proposal
        logits, proposal valid, the batch's PaddingMasks)."""
        masks = PaddingMasks(image_sizes, self.size_divisibility, self.padding_masks)
        # detectron2 pads after normalising: the padded area must be 0, not -mean/std
        x = masks.apply_image((images - self.pixel_mean) / self.pixel_std)
        features = self.backbone(x, masks)
        return (features, *self.proposal_generator(features, image_sizes, masks), masks)

    def forward(self, images: torch.Tensor, image_sizes: torch.Tensor, with_cls_logits: bool = False):
        """The outputs in OUTPUT_NAMES order; ``with_cls_logits`` appends the box classifier's
        logits, one per stage for a cascade (the ONNX export names those tensors)."""
        out = self.inference(images, image_sizes, intermediates=with_cls_logits)
        outputs = tuple(out[k] for k in OUTPUT_NAMES if k in out)
        if not with_cls_logits:
            return outputs
        return (*outputs, *out.get("stage_cls_logits", [out["cls_logits"]]))
