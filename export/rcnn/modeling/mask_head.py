"""detectron2's ``MaskRCNNConvUpsampleHead``: 3x3 convs, 2x deconv, 1x1 per-class predictor."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .layers import Conv2d


class MaskRCNNConvUpsampleHead(nn.Module):
    """Pooled features [M, C, 14, 14] + classes int64 [M] -> mask probabilities [M, 28, 28].

    Its convs and deconv run on each ROI's own pooled grid, whose border is the convs' zero
    padding alone or batched: no batch padding can reach them, and a GN normalises each ROI
    over its own grid, so nothing here needs a mask."""

    def __init__(self, in_channels: int, *, num_conv: int, conv_dim: int, num_classes: int,
                 cls_agnostic: bool = False, norm: str = "", class_offset: int = 0):
        """``class_offset`` 1: channel 0 is the background's (torchvision), so class c's mask is
        channel c + 1 (``num_classes`` then counts the background)."""
        super().__init__()
        self.class_offset = int(class_offset)
        self.num_conv = num_conv
        ch = in_channels
        for k in range(num_conv):
            self.add_module(f"mask_fcn{k + 1}", Conv2d(ch, conv_dim, 3, padding=1, bias=not norm,
                                                       norm=norm, relu=True))
            ch = conv_dim
        self.deconv = nn.ConvTranspose2d(ch, conv_dim, kernel_size=2, stride=2)
        self.cls_agnostic = cls_agnostic
        self.predictor = nn.Conv2d(conv_dim, 1 if cls_agnostic else num_classes, 1)

    def forward(self, x: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        for k in range(self.num_conv):
            x = getattr(self, f"mask_fcn{k + 1}")(x)
        x = F.relu(self.deconv(x))
        # only each detection's own class channel is needed: gather its 1x1 filter instead
        # of predicting all C channels (300 x 1203 x 28 x 28 would be 1 GB)
        w = self.predictor.weight[:, :, 0, 0]
        if self.cls_agnostic:
            logits = (x * w[0][None, :, None, None]).sum(1) + self.predictor.bias[0]
        else:
            if self.class_offset:
                classes = classes + self.class_offset
            bias = self.predictor.bias[classes][:, None, None]
            logits = (x * w[classes][:, :, None, None]).sum(1) + bias
        return torch.sigmoid(logits)
