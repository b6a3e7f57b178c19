"""detectron2's multi-level ``ROIPooler`` (ROIAlignV2: aligned=True) for FPN features."""

from __future__ import annotations

import math
import sys

import torch
from torch import nn

from norcal.core.errors import NorcalError

from .layers import PaddingMasks
from norcal.export.pytorch.ops import roi_align


def replicate_edge(f: torch.Tensor, extent: torch.Tensor) -> torch.Tensor:
    """Copy each image's last valid column and row of f [B, C, H, W] one step outward.

    ROIAlign clamps samples past a map's last pixel to that pixel; in a batch an image's map
    continues into padding, so bilinear sampling would blend in the pixel beyond. A box lies
    inside its image, so only that one pixel is ever read: replicating the edge into it gives
    detectron2's per-image result. ``extent`` int64 [B, 2] is the valid (rows, cols).
    """
    # one column, then one row, gathered and written back: a whole-map select would read and
    # write every feature twice per axis. Where the image fills the map (extent == size) the
    # last column is written onto itself.
    for axis, size, e in ((3, f.shape[-1], extent[:, 1]), (2, f.shape[-2], extent[:, 0])):
        shape = [f.shape[0], f.shape[1], f.shape[2], f.shape[3]]
        shape[axis] = 1
        # Max / Min, not Clip: TensorRT clips floats only
        src = torch.maximum(e - 1, torch.zeros_like(e))[:, None, None, None].expand(shape)
        dst = torch.minimum(e, torch.as_tensor(size - 1, device=e.device))  # traced: a Shape
        f = f.scatter(axis, dst[:, None, None, None].expand(shape), torch.gather(f, axis, src))
    return f


def assign_boxes_to_levels(boxes: torch.Tensor, min_level: int, max_level: int,
                           canonical_box_size: float = 224.0, canonical_level: int = 4,
                           eps_after_log: bool = False):
    """boxes [..., 4] -> int64 [...] level index from 0 (= min_level), detectron2's eq. (1):
    floor(canonical_level + log2(sqrt(area) / canonical_box_size + eps)), clamped;
    ``eps_after_log`` (torchvision's ``LevelMapper``):
    floor(canonical_level + log2(sqrt(area) / canonical_box_size) + 1e-6)."""
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    if eps_after_log:
        lvl = torch.floor(canonical_level + torch.log2(torch.sqrt(area) / canonical_box_size)
                          + torch.tensor(1e-6, dtype=area.dtype))
        return torch.clamp(lvl, min=min_level, max=max_level).to(torch.int64) - min_level
    eps = sys.float_info.epsilon  # keeps log2 finite for empty boxes
    lvl = torch.floor(canonical_level + torch.log2(torch.sqrt(area) / canonical_box_size + eps))
    return torch.clamp(lvl, min=min_level, max=max_level).to(torch.int64) - min_level


class ROIPooler(nn.Module):
    """Pool boxes [B, R, 4] from features [p_min .. p_max] -> [B*R, C, S, S].

    ``select_rois`` (default): each level pools only its own boxes (NonZero, Gather: data-
    dependent shapes, as detectron2), and one Gather puts them back in box order. False (the
    export's static form): every level runs on every box, a box of another level replaced by
    an empty box, for which ROIAlign's adaptive sampling takes no samples, and the levels'
    results are masked and summed: no data-dependent shapes, but four times the elementwise
    work on [B*R, C, S, S].
    """

    select_rois: bool = True

    def __init__(self, output_size: int, strides, sampling_ratio: int = 0,
                 pooler_type: str = "ROIAlignV2", canonical_box_size: float = 224.0,
                 canonical_level: int = 4, level_eps_after_log: bool = False):
        super().__init__()
        if pooler_type not in ("ROIAlignV2", "ROIAlign"):
            raise NorcalError(f"pooler type {pooler_type!r} is not supported; "
                              "use ROIAlignV2 (detectron2's default) or ROIAlign")
        if sampling_ratio < 0:
            raise NorcalError(f"pooler sampling ratio must be >= 0, got {sampling_ratio}")
        self.output_size = int(output_size)
        self.strides = list(strides)
        self.scales = [1.0 / s for s in strides]
        self.aligned = pooler_type == "ROIAlignV2"
        self.sampling_ratio = int(sampling_ratio)
        self.min_level = int(round(math.log2(strides[0])))
        self.max_level = int(round(math.log2(strides[-1])))
        self.canonical_box_size = canonical_box_size
        self.canonical_level = canonical_level
        self.level_eps_after_log = bool(level_eps_after_log)

    def forward(self, features: list[torch.Tensor], boxes: torch.Tensor,
                masks: PaddingMasks | None = None) -> torch.Tensor:
        b, r = boxes.shape[0], boxes.shape[1]
        batch_idx = torch.arange(b, device=boxes.device)[:, None].expand(b, r).reshape(-1)
        return self.pool(features, boxes.reshape(-1, 4), batch_idx, masks)

    def pool(self, features: list[torch.Tensor], boxes: torch.Tensor, batch_idx: torch.Tensor,
             masks: PaddingMasks | None = None) -> torch.Tensor:
        """Pool boxes [M, 4] of images ``batch_idx`` int64 [M] -> [M, C, S, S]."""
        if masks is not None and masks.enabled:
            features = [replicate_edge(f, masks.extent(s))
                        for f, s in zip(features, self.strides)]
        if len(features) == 1:
            return roi_align(features[0], boxes, batch_idx, self.output_size, self.scales[0],
                             self.sampling_ratio, self.aligned)
        levels = assign_boxes_to_levels(boxes, self.min_level, self.max_level,
                                        self.canonical_box_size, self.canonical_level,
                                        self.level_eps_after_log)
        if self.select_rois:
            parts, order = [], []
            for i, (f, scale) in enumerate(zip(features, self.scales)):
                idx = torch.nonzero(levels == i).reshape(-1)
                parts.append(roi_align(f, boxes[idx], batch_idx[idx], self.output_size, scale,
                                       self.sampling_ratio, self.aligned))
                order.append(idx)
            perm = torch.cat(order)
            # where each box's row landed: the inverse of perm (a 1-D scatter, not an argsort)
            inverse = torch.zeros_like(perm).scatter(0, perm, torch.arange(perm.shape[0], device=perm.device))
            return torch.cat(parts)[inverse]
        out = None
        for i, (f, scale) in enumerate(zip(features, self.scales)):
            on = (levels == i)[:, None]
            lvl_boxes = torch.where(on, boxes, torch.zeros_like(boxes))
            pooled = roi_align(f, lvl_boxes, batch_idx, self.output_size, scale,
                               self.sampling_ratio, self.aligned)
            pooled = pooled * on.to(pooled.dtype)[:, :, None, None]
            out = pooled if out is None else out + pooled
        return out
