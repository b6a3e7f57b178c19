"""detectron2's ``DefaultAnchorGenerator``: per-level cell anchors shifted over the grid."""

from __future__ import annotations

import math

import torch
from torch import nn

from norcal.core.errors import NorcalError


def cell_anchors(sizes, aspect_ratios) -> torch.Tensor:
    """Anchors [len(sizes)*len(ratios), 4] centred on 0, sizes outer, ratios inner (detectron2)."""
    out = []
    for size in sizes:
        area = size ** 2.0
        for ratio in aspect_ratios:
            w = math.sqrt(area / ratio)
            h = ratio * w
            out.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(out, dtype=torch.float32)


def rounded_cell_anchors(sizes, aspect_ratios) -> torch.Tensor:
    """Ratios outer, sizes inner, float32 arithmetic, corners rounded to integers (torchvision's
    ``AnchorGenerator.generate_anchors``)."""
    scales = torch.as_tensor(list(sizes), dtype=torch.float32)
    ratios = torch.as_tensor(list(aspect_ratios), dtype=torch.float32)
    h_ratios = torch.sqrt(ratios)
    w_ratios = 1 / h_ratios
    ws = (w_ratios[:, None] * scales[None, :]).reshape(-1)
    hs = (h_ratios[:, None] * scales[None, :]).reshape(-1)
    return (torch.stack([-ws, -hs, ws, hs], dim=1) / 2).round()


class AnchorGenerator(nn.Module):
    """Anchors for each feature map: [H*W*A, 4], location-major then anchor (detectron2 order)."""

    def __init__(self, sizes, aspect_ratios, strides, offset: float = 0.0,
                 rounded: bool = False, per_image_strides: bool = False):
        """``rounded``: :func:`rounded_cell_anchors` (else :func:`cell_anchors`).
        ``per_image_strides``: each level's stride taken per image as torchvision does for a
        batch of that image alone: its padded size // the level's grid size (P6 of an
        800-pixel side: 800 // 13 = 61, not 64); anchors then come per image, [B, H*W*A, 4]."""
        super().__init__()
        self.per_image = bool(per_image_strides)
        n = len(strides)
        sizes = list(sizes) * n if len(sizes) == 1 else list(sizes)
        ratios = list(aspect_ratios) * n if len(aspect_ratios) == 1 else list(aspect_ratios)
        if len(sizes) != n or len(ratios) != n:
            raise NorcalError(f"anchor sizes ({len(sizes)}) and aspect ratios ({len(ratios)}) "
                              f"must be given once or per feature level ({n})")
        if not 0.0 <= offset < 1.0:
            raise NorcalError(f"anchor offset must lie in [0, 1), got {offset}")
        self.strides = list(strides)
        self.offset = float(offset)
        make = rounded_cell_anchors if rounded else cell_anchors
        cells = [make(s, r) for s, r in zip(sizes, ratios)]
        counts = {len(c) for c in cells}
        if len(counts) != 1:
            raise NorcalError("every feature level needs the same number of anchors per location")
        self.num_anchors = counts.pop()
        for i, c in enumerate(cells):
            self.register_buffer(f"cell{i}", c, persistent=False)

    def forward(self, features: list[torch.Tensor], padded: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Per level [H*W*A, 4]; per image [B, H*W*A, 4] with ``per_image_strides``, from
        ``padded`` int64 [B, 2]: each image's own padded (h, w) in input pixels."""
        if self.per_image:
            return self._per_image(features, padded)
        out = []
        for i, (f, stride) in enumerate(zip(features, self.strides)):
            h, w = f.shape[-2], f.shape[-1]
            shift_x = (torch.arange(w, device=f.device).to(torch.float32) + self.offset) * stride
            shift_y = (torch.arange(h, device=f.device).to(torch.float32) + self.offset) * stride
            sy, sx = torch.meshgrid(shift_y, shift_x, indexing="ij")
            sx, sy = sx.reshape(-1), sy.reshape(-1)
            shifts = torch.stack((sx, sy, sx, sy), dim=1)
            cell = getattr(self, f"cell{i}")
            out.append((shifts[:, None, :] + cell[None, :, :]).reshape(-1, 4))
        return out

    def _per_image(self, features: list[torch.Tensor], padded: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for i, (f, stride) in enumerate(zip(features, self.strides)):
            h, w = f.shape[-2], f.shape[-1]
            # the image's own grid at this level is ceil(padded / stride); sizes >= 0 so
            # truncating division is floor division
            grid = torch.div(padded + (stride - 1), stride, rounding_mode="trunc")
            step = torch.div(padded, grid, rounding_mode="trunc").to(torch.float32)  # [B, 2]
            xs = torch.arange(w, device=f.device).to(torch.float32)[None, :] * step[:, 1:2]  # [B, W]
            ys = torch.arange(h, device=f.device).to(torch.float32)[None, :] * step[:, 0:1]  # [B, H]
            b = padded.shape[0]
            sx = xs[:, None, :].expand(b, h, w).reshape(b, -1)
            sy = ys[:, :, None].expand(b, h, w).reshape(b, -1)
            shifts = torch.stack((sx, sy, sx, sy), dim=2)  # [B, H*W, 4]
            cell = getattr(self, f"cell{i}")
            out.append((shifts[:, :, None, :] + cell[None, None, :, :]).reshape(b, -1, 4))
        return out
