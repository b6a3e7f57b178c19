"""detectron2's RegNet bottom-up (``detectron2.modeling.backbone.regnet.RegNet``, the AnyNet it
builds): SimpleStem, then stages of ResBottleneckBlock with grouped 3x3 convs, SE for RegNetY.

State-dict names follow detectron2: ``stem.conv``, ``stem.bn``, ``s1.b1.proj``, ``s1.b1.bn``,
``s1.b1.f.a`` / ``f.a_bn`` / ``f.b`` / ``f.b_bn`` / ``f.se.f_ex.{0,2}`` / ``f.c`` / ``f.c_bn``.
Every stage halves the map (detectron2's RegNet ``stride`` 2), so s1..s4 have strides 4..32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from norcal.core.errors import NorcalError

from ..spec import RegNetSpec
from .layers import PaddingMasks, get_norm

# per-channel norms: a padded batch changes none of their outputs (GN's statistics would need masks)
REGNET_NORMS = ("FrozenBN", "BN", "SyncBN", "nnSyncBN", "naiveSyncBN")


def _conv(w_in: int, w_out: int, k: int, stride: int = 1, groups: int = 1, bias: bool = False) -> nn.Conv2d:
    return nn.Conv2d(w_in, w_out, k, stride=stride, padding=(k - 1) // 2, groups=groups, bias=bias)


class SimpleStem(nn.Module):
    """3x3/2 conv, norm, ReLU: stride 2."""

    def __init__(self, w_out: int, norm: str):
        super().__init__()
        self.conv = _conv(3, w_out, 3, stride=2)
        self.bn = get_norm(norm, w_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class SE(nn.Module):
    """Squeeze-and-excitation: x * sigmoid(fc(relu(fc(mean of x)))), the mean taken over each
    image's own map (``mask``: 1 there; None: the whole map, as detectron2 takes it)."""

    def __init__(self, w_in: int, w_se: int):
        super().__init__()
        # Sequential indices keep detectron2's names (f_ex.0, f_ex.2)
        self.f_ex = nn.Sequential(_conv(w_in, w_se, 1, bias=True), nn.ReLU(), _conv(w_se, w_in, 1, bias=True),
                                  nn.Sigmoid())

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            pooled = x.mean(dim=(2, 3), keepdim=True)
        else:
            # detectron2 averages over the image padded to its own multiple of 32, which is
            # exactly where the mask is 1; a batch pads further (an image has a valid pixel)
            valid = torch.clamp(mask.mean(dim=(2, 3), keepdim=True), min=1e-12)
            pooled = (x * mask).mean(dim=(2, 3), keepdim=True) / valid
        return x * self.f_ex(pooled)


class BottleneckTransform(nn.Module):
    """1x1, 3x3 (grouped, strided) [+ SE], 1x1, each conv with its norm."""

    def __init__(self, w_in: int, w_out: int, w_b: int, group_w: int, w_se: int, stride: int, norm: str):
        super().__init__()
        if w_b % group_w:
            raise NorcalError(f"RegNet bottleneck width {w_b} is not a multiple of its group width {group_w}")
        self.a = _conv(w_in, w_b, 1)
        self.a_bn = get_norm(norm, w_b)
        self.b = _conv(w_b, w_b, 3, stride=stride, groups=w_b // group_w)
        self.b_bn = get_norm(norm, w_b)
        self.se = SE(w_b, w_se) if w_se else None
        self.c = _conv(w_b, w_out, 1)
        self.c_bn = get_norm(norm, w_out)


class ResBottleneckBlock(nn.Module):
    """relu(proj(x) + f(x)); ``proj`` (1x1 conv + norm) where the width or the stride changes."""

    def __init__(self, w_in: int, w_out: int, *, w_b: int, group_w: int, w_se: int, stride: int,
                 in_stride: int, norm: str):
        super().__init__()
        self.in_stride, self.out_stride = in_stride, in_stride * stride
        self.proj = self.bn = None
        if w_in != w_out or stride != 1:
            self.proj = _conv(w_in, w_out, 1, stride=stride)
            self.bn = get_norm(norm, w_out)
        self.f = BottleneckTransform(w_in, w_out, w_b, group_w, w_se, stride, norm)

    def forward(self, x: torch.Tensor, masks: PaddingMasks) -> torch.Tensor:
        f = self.f
        short = self.bn(self.proj(x)) if self.proj is not None else x
        # only the 3x3 reads past an image's edge, and the SE's mean reads its whole map
        out = masks.apply(F.relu(f.a_bn(f.a(x))), self.in_stride)
        out = F.relu(f.b_bn(f.b(out)))
        if f.se is not None:
            out = f.se(out, masks.mask(self.out_stride, out))
        out = f.c_bn(f.c(out))
        return F.relu(short + out)


class RegNet(nn.Module):
    """Returns ``{"s1": [B,W1,H/4,W/4], ..., "s4": [B,W4,H/32,W/32]}`` (the FPN's inputs)."""

    def __init__(self, spec: RegNetSpec, norm: str):
        super().__init__()
        if norm not in REGNET_NORMS:
            raise NorcalError(f"RegNet norm {norm!r} is not supported; expected one of {', '.join(REGNET_NORMS)}")
        n = len(spec.depths)
        if not (len(spec.widths) == len(spec.bottleneck_widths) == len(spec.group_widths) == len(spec.se_widths) == n):
            raise NorcalError(f"RegNet spec gives {n} stage depths but other per-stage lists of another length")
        self.stem = SimpleStem(spec.stem_width, norm)
        self.stage_names: list[str] = []
        self.out_strides: dict[str, int] = {}
        self.out_channels: dict[str, int] = {}
        w_in, stride = spec.stem_width, 2
        for k in range(n):
            if len(spec.se_widths[k]) != spec.depths[k]:
                raise NorcalError(f"RegNet stage s{k + 1} has {spec.depths[k]} blocks but {len(spec.se_widths[k])} SE widths")
            stage = nn.Module()
            for i in range(spec.depths[k]):
                s = 2 if i == 0 else 1
                stage.add_module(f"b{i + 1}", ResBottleneckBlock(
                    w_in, spec.widths[k], w_b=spec.bottleneck_widths[k], group_w=spec.group_widths[k],
                    w_se=spec.se_widths[k][i], stride=s, in_stride=stride, norm=norm))
                stride *= s
                w_in = spec.widths[k]
            name = f"s{k + 1}"
            self.add_module(name, stage)
            self.stage_names.append(name)
            self.out_strides[name] = stride
            self.out_channels[name] = w_in

    def forward(self, x: torch.Tensor, masks: PaddingMasks) -> dict[str, torch.Tensor]:
        x = self.stem(x)
        out = {}
        for name in self.stage_names:
            for block in getattr(self, name).children():
                x = block(x, masks)
            out[name] = x
        return out
