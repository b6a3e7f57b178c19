"""detectron2's FPN (``build_resnet_fpn_backbone``): P2-P5 from res2-res5, P6 by max-pool.

Names: ``bottom_up.*``, ``fpn_lateral{2..5}``, ``fpn_output{2..5}``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from norcal.core.errors import NorcalError

from .layers import Conv2d, PaddingMasks


class FPN(nn.Module):
    """Returns features ``[p2, p3, p4, p5, p6]``, each [B, out_channels, H/s, W/s]."""

    def __init__(self, bottom_up: nn.Module, out_channels: int = 256, norm: str = "",
                 fuse_type: str = "sum", in_features: list[str] | None = None):
        """``in_features``: the ResNet stages FPN reads (default all; RetinaNet: res3-res5)."""
        super().__init__()
        if fuse_type not in ("sum", "avg"):
            raise NorcalError(f"FPN fuse type must be 'sum' or 'avg', got {fuse_type!r}")
        self.bottom_up = bottom_up
        self.in_features = list(in_features or bottom_up.stage_names)
        self.fuse_type = fuse_type
        self.in_strides = [bottom_up.out_strides[n] for n in self.in_features]
        if any(b != 2 * a for a, b in zip(self.in_strides, self.in_strides[1:])):
            raise NorcalError(f"FPN needs strides that double level by level, got {self.in_strides}"
                              " (a dilated res5 cannot feed an FPN)")
        use_bias = norm == ""
        for name, stride in zip(self.in_features, self.in_strides):
            level = int(math.log2(stride))
            in_ch = bottom_up.out_channels[name]
            self.add_module(f"fpn_lateral{level}",
                            Conv2d(in_ch, out_channels, 1, bias=use_bias, norm=norm))
            self.add_module(f"fpn_output{level}", Conv2d(out_channels, out_channels, 3, padding=1,
                                                          bias=use_bias, norm=norm))
        # LastLevelMaxPool: P6 = max_pool(P5, kernel 1, stride 2)
        self.strides = self.in_strides + [self.in_strides[-1] * 2]

    def forward(self, x: torch.Tensor, masks: PaddingMasks) -> list[torch.Tensor]:
        results = self.top_down(self.bottom_up(x, masks), masks)
        results.append(F.max_pool2d(results[-1], kernel_size=1, stride=2, padding=0))
        return results

    def top_down(self, feats: dict[str, torch.Tensor], masks: PaddingMasks) -> list[torch.Tensor]:
        """The FPN outputs of the bottom-up features, finest first (no extra top level)."""
        levels = [int(math.log2(s)) for s in self.in_strides]
        prev = None
        results: list[torch.Tensor] = []
        for name, stride, level in reversed(list(zip(self.in_features, self.in_strides, levels))):
            lateral = getattr(self, f"fpn_lateral{level}")(feats[name], masks, stride)
            if prev is None:
                prev = lateral
            else:
                prev = lateral + F.interpolate(prev, scale_factor=2.0, mode="nearest")
                if self.fuse_type == "avg":
                    prev = prev / 2
            out = getattr(self, f"fpn_output{level}")(masks.apply(prev, stride), masks, stride)
            results.insert(0, out)
        return results
