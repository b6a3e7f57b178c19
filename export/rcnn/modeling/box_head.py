"""detectron2's ``FastRCNNConvFCHead``: conv1..convN (3x3) then fc1..fcM, all with ReLU."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .layers import Conv2d


class FastRCNNConvFCHead(nn.Module):
    """Pooled features [M, C, S, S] -> box features [M, fc_dim] (or [M, C', S, S] without fcs).

    The convs (``NUM_CONV``) and a GN here see each ROI's own S x S grid, as in detectron2:
    pooled features hold no batch padding (the pooler replicates each image's edge into it),
    so nothing here needs a mask."""

    def __init__(self, in_channels: int, pooler_resolution: int, *, num_conv: int, conv_dim: int,
                 num_fc: int, fc_dim: int, norm: str = ""):
        super().__init__()
        ch = in_channels
        self.num_conv, self.num_fc = num_conv, num_fc
        for k in range(num_conv):
            self.add_module(f"conv{k + 1}", Conv2d(ch, conv_dim, 3, padding=1, bias=not norm,
                                                   norm=norm, relu=True))
            ch = conv_dim
        dim = ch * pooler_resolution * pooler_resolution
        for k in range(num_fc):
            self.add_module(f"fc{k + 1}", nn.Linear(dim, fc_dim))
            dim = fc_dim
        self.output_size = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k in range(self.num_conv):
            x = getattr(self, f"conv{k + 1}")(x)
        if self.num_fc:
            x = torch.flatten(x, 1)
            for k in range(self.num_fc):
                x = F.relu(getattr(self, f"fc{k + 1}")(x))
        return x
