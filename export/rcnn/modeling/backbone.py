"""detectron2's ResNet / ResNeXt bottom-up backbone (``build_resnet_backbone``), depth 18-152.

State-dict names follow detectron2: ``stem.conv1``, ``res2.0.conv1``, ``res2.0.conv1.norm``,
``res2.0.shortcut`` ...
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from norcal.core.errors import NorcalError

from .layers import Conv2d, PaddingMasks

BLOCKS_PER_STAGE = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3],
                    101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}


class BasicStem(nn.Module):
    """7x7/2 conv + norm + ReLU, then 3x3/2 max-pool: stride 4."""

    def __init__(self, in_channels: int, out_channels: int, norm: str):
        super().__init__()
        self.conv1 = Conv2d(in_channels, out_channels, 7, stride=2, padding=3, bias=False,
                            norm=norm, relu=True)

    def forward(self, x: torch.Tensor, masks: PaddingMasks | None = None) -> torch.Tensor:
        x = self.conv1(x, masks, 2)
        if masks is not None:
            # an unpadded image (C4/DC5) ends at an odd stride-2 column the max-pool reads past
            x = masks.apply(x, 2)
        # inputs are >= 0 after ReLU, so the max-pool's -inf padding and our zero padding agree
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


class BasicBlock(nn.Module):
    """Two 3x3 convs (ResNet-18/34)."""

    def __init__(self, in_channels, out_channels, *, stride, in_stride, norm):
        super().__init__()
        self.in_stride, self.out_stride = in_stride, in_stride * stride
        self.shortcut = (Conv2d(in_channels, out_channels, 1, stride=stride, bias=False, norm=norm)
                         if in_channels != out_channels else None)
        self.conv1 = Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False,
                            norm=norm, relu=True)
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1, bias=False, norm=norm)

    def forward(self, x: torch.Tensor, masks: PaddingMasks) -> torch.Tensor:
        x = masks.apply(x, self.in_stride)
        s = self.out_stride
        out = self.conv2(masks.apply(self.conv1(x, masks, s), s), masks, s)
        short = self.shortcut(x, masks, s) if self.shortcut is not None else x
        return F.relu(out + short)


class BottleneckBlock(nn.Module):
    """1x1 -> 3x3 (grouped, dilated) -> 1x1, stride on the 1x1 or the 3x3 (``stride_in_1x1``)."""

    def __init__(self, in_channels, out_channels, *, bottleneck_channels, stride, in_stride,
                 num_groups, norm, stride_in_1x1, dilation):
        super().__init__()
        s1, s3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.mid_stride = in_stride * s1  # stride of conv2's input
        self.out_stride = in_stride * stride
        self.shortcut = (Conv2d(in_channels, out_channels, 1, stride=stride, bias=False, norm=norm)
                         if in_channels != out_channels else None)
        self.conv1 = Conv2d(in_channels, bottleneck_channels, 1, stride=s1, bias=False,
                            norm=norm, relu=True)
        self.conv2 = Conv2d(bottleneck_channels, bottleneck_channels, 3, stride=s3,
                            padding=dilation, dilation=dilation, groups=num_groups, bias=False,
                            norm=norm, relu=True)
        self.conv3 = Conv2d(bottleneck_channels, out_channels, 1, bias=False, norm=norm)

    def forward(self, x: torch.Tensor, masks: PaddingMasks | None = None) -> torch.Tensor:
        mid, s = self.mid_stride, self.out_stride
        out = self.conv1(x, masks, mid)
        if masks is not None:  # None: pooled boxes (C4's res5 head), nothing to mask
            out = masks.apply(out, mid)  # only the 3x3 reads past an edge
        out = self.conv3(self.conv2(out, masks, s), masks, s)
        short = self.shortcut(x, masks, s) if self.shortcut is not None else x
        return F.relu(out + short)


class ResNet(nn.Module):
    """Returns ``{"res2": [B,C2,H/4,W/4], ..., "res5": [B,C5,H/32,W/32]}`` (res5 at H/16 when
    dilated), stages up to ``last_stage`` (detectron2 builds none past its last output)."""

    def __init__(self, *, depth=50, norm="FrozenBN", stem_out_channels=64, res2_out_channels=256,
                 num_groups=1, width_per_group=64, stride_in_1x1=True, res5_dilation=1,
                 in_channels=3, last_stage=5):
        super().__init__()
        if depth not in BLOCKS_PER_STAGE:
            raise NorcalError(f"ResNet depth {depth} is not one of {sorted(BLOCKS_PER_STAGE)}")
        if res5_dilation not in (1, 2):
            raise NorcalError(f"res5 dilation must be 1 or 2, got {res5_dilation}")
        basic = depth in (18, 34)
        if basic and (res2_out_channels != 64 or num_groups != 1 or res5_dilation != 1):
            raise NorcalError(f"ResNet-{depth} needs RES2_OUT_CHANNELS 64, 1 group, no dilation")
        self.stem = BasicStem(in_channels, stem_out_channels, norm)
        self.stage_names: list[str] = []
        self.out_strides: dict[str, int] = {}
        self.out_channels: dict[str, int] = {}
        in_ch, out_ch = stem_out_channels, res2_out_channels
        bottleneck = num_groups * width_per_group
        stride = 4
        if last_stage not in (4, 5):
            raise NorcalError(f"the ResNet must end at res4 or res5, not res{last_stage}")
        for idx, n_blocks in enumerate(BLOCKS_PER_STAGE[depth][:last_stage - 1]):
            stage = idx + 2
            dilation = res5_dilation if stage == 5 else 1
            first_stride = 1 if idx == 0 or (stage == 5 and dilation == 2) else 2
            blocks = []
            for i in range(n_blocks):
                s = first_stride if i == 0 else 1
                if basic:
                    blocks.append(BasicBlock(in_ch, out_ch, stride=s, in_stride=stride, norm=norm))
                else:
                    blocks.append(BottleneckBlock(
                        in_ch, out_ch, bottleneck_channels=bottleneck, stride=s, in_stride=stride,
                        num_groups=num_groups, norm=norm, stride_in_1x1=stride_in_1x1,
                        dilation=dilation))
                stride *= s
                in_ch = out_ch
            name = f"res{stage}"
            self.add_module(name, nn.ModuleList(blocks))
            self.stage_names.append(name)
            self.out_strides[name] = stride
            self.out_channels[name] = out_ch
            out_ch *= 2
            bottleneck *= 2

    def forward(self, x: torch.Tensor, masks: PaddingMasks) -> dict[str, torch.Tensor]:
        x = self.stem(x, masks)
        out = {}
        for name in self.stage_names:
            for block in getattr(self, name):
                x = block(x, masks)
            out[name] = x
        return out


class ResNetBackbone(ResNet):
    """detectron2's ``build_resnet_backbone`` with one output stage (C4: res4, DC5: res5), as
    the model's backbone: features ``[that stage]``; state-dict names ``stem.*``, ``res2.*``...

    detectron2 pads each image to no multiple (``size_divisibility`` 0) before this backbone.
    """

    def __init__(self, out_feature: str, **kwargs):
        if out_feature not in ("res4", "res5"):
            raise NorcalError(f"a ResNet backbone without FPN must output res4 or res5, not {out_feature!r}")
        super().__init__(last_stage=int(out_feature[-1]), **kwargs)
        self.out_feature = out_feature
        self.strides = [self.out_strides[out_feature]]
        self.size_divisibility = 1

    def forward(self, x: torch.Tensor, masks: PaddingMasks) -> list[torch.Tensor]:
        return [super().forward(x, masks)[self.out_feature]]


def res5_head(in_channels: int, *, num_groups: int, width_per_group: int, norm: str,
              stride_in_1x1: bool) -> nn.ModuleList:
    """C4's res5 in the ROI heads (detectron2 ``Res5ROIHeads._build_res5_block``): 3 bottleneck
    blocks, the first with stride 2, no dilation, widths 8x res2's; runs on pooled boxes."""
    out_channels = 2 * in_channels
    bottleneck = num_groups * width_per_group * 8
    return nn.ModuleList(BottleneckBlock(
        in_channels if i == 0 else out_channels, out_channels, bottleneck_channels=bottleneck,
        stride=2 if i == 0 else 1, in_stride=1, num_groups=num_groups, norm=norm,
        stride_in_1x1=stride_in_1x1, dilation=1) for i in range(3))
