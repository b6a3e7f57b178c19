"""Building blocks shared by the backbone and the heads: detectron2's Conv2d-with-norm,
FrozenBatchNorm2d, its channel LayerNorm, a GroupNorm whose statistics skip batch padding, and the padding masks
that make a batched graph behave per image."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from norcal.core.errors import NorcalError


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm with fixed statistics and affine terms (detectron2's ``FrozenBN``).

    Buffers, not parameters, so the state-dict names are detectron2's
    (``weight``, ``bias``, ``running_mean``, ``running_var``); eps 1e-5.
    """

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features) - eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # detectron2 uses F.batch_norm at inference: same op, same rounding
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, eps=self.eps)


class LayerNorm(nn.Module):
    """detectron2's ``LN`` (``layers/batch_norm.py`` LayerNorm): each position of x [B, C, H, W]
    normalised over its C channels (biased variance), then a per-channel affine; eps 1e-6.

    Per position, so batch padding never reaches an image's statistics: it needs no mask."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        centred = x - u
        s = (centred * centred).mean(1, keepdim=True)
        x = centred / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


def masked_group_norm(x: torch.Tensor, mask: torch.Tensor, num_groups: int,
                      weight: torch.Tensor | None, bias: torch.Tensor | None,
                      eps: float) -> torch.Tensor:
    """``F.group_norm`` of x [B, C, H, W] with each image's statistics taken where mask
    [B, 1, H, W] is 1: mean, then variance of the centred values (biased, like PyTorch's).

    Outside the mask the output is normalised with the same statistics and means nothing;
    the next spatial op must mask it. In ONNX: Reshape, Mul, ReduceMean, Sqrt, Div, which
    TensorRT's parser takes for any batch and map size.
    """
    b, _, h, w = x.shape
    g = x.reshape(b, num_groups, -1, h, w)
    m = mask[:, :, None]  # [B, 1, 1, H, W]
    axes = (2, 3, 4)
    # means over the whole map divided by the valid fraction = sums over the valid region
    # divided by its size, with no channel count to carry through the trace; an image has at
    # least one valid pixel, the clamp only keeps a degenerate size finite
    valid = torch.clamp(m.mean(dim=axes, keepdim=True), min=1e-12)
    mean = (g * m).mean(dim=axes, keepdim=True) / valid
    centred = g - mean
    # two passes, not E[x^2] - mean^2: no cancellation where |mean| >> std
    var = (centred * centred * m).mean(dim=axes, keepdim=True) / valid
    scale = torch.rsqrt(var + eps)  # [B, G, 1, 1, 1]
    if weight is not None:
        scale = scale * weight.reshape(1, num_groups, -1, 1, 1)
    y = centred * scale
    if bias is not None:
        y = y + bias.reshape(1, num_groups, -1, 1, 1)
    return y.reshape(x.shape)


class GroupNorm(nn.GroupNorm):
    """detectron2's GN (``nn.GroupNorm``, same parameters and eps) that can skip padding.

    detectron2 normalises each image over its own map, padded only to its own multiple of
    32. In a batch padded to the largest image the map runs on, so given ``mask`` (1 on the
    image's own padded extent, see ``PaddingMasks.mask``) the statistics come from there
    alone. Without a mask it is stock GroupNorm: ROI features hold no padding.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            return super().forward(x)
        return masked_group_norm(x, mask, self.num_groups, self.weight, self.bias, self.eps)


def get_norm(norm: str, channels: int) -> nn.Module | None:
    """detectron2's ``get_norm``: '' -> None, FrozenBN, BN / SyncBN (eval: same), GN (32 groups),
    LN (channel LayerNorm)."""
    if not norm:
        return None
    if norm == "FrozenBN":
        return FrozenBatchNorm2d(channels)
    if norm in ("BN", "SyncBN", "nnSyncBN", "naiveSyncBN"):
        return nn.BatchNorm2d(channels)
    if norm == "GN":
        return GroupNorm(32, channels)
    if norm == "LN":
        return LayerNorm(channels)
    raise NorcalError(f"unsupported norm {norm!r}; expected one of '', FrozenBN, BN, SyncBN, GN, LN")


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` with an optional ``norm`` submodule (key ``<name>.norm.*``) and ReLU."""

    def __init__(self, *args, norm: str = "", relu: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm = get_norm(norm, self.out_channels)
        self.relu = relu

    def forward(self, x: torch.Tensor, masks: PaddingMasks | None = None,
                stride: int = 0) -> torch.Tensor:
        """``masks`` and the output's feature ``stride`` (image-aligned maps only) confine a
        GroupNorm's statistics to each image; other norms are per channel and need neither."""
        x = super().forward(x)
        if isinstance(self.norm, GroupNorm) and masks is not None:
            if stride <= 0:
                raise NorcalError("a GroupNorm on a padded map needs the map's stride")
            x = self.norm(x, masks.mask(stride, x))  # None when disabled: stock GroupNorm
        elif self.norm is not None:
            x = self.norm(x)
        return F.relu(x) if self.relu else x


class PaddingMasks:
    """Per-image validity masks of feature maps, one per stride, computed once per forward.

    detectron2 runs each image padded to its own multiple of ``divisibility``; a batch pads to
    the largest image, so a 3x3 convolution at an image's right/bottom edge would read the
    neighbour's padding (non-zero after the first conv) instead of the zero padding it saw in
    detectron2. Multiplying a conv's input by ``mask(stride)`` restores exactly that.

    ``enabled`` False: the caller knows no map holds padding beyond each image's own multiple
    of ``divisibility`` (one image per batch, padded by the host to that multiple only), so
    every mask would be all ones: :meth:`apply` passes maps through, :meth:`mask` returns None
    and the graph keeps no masking ops.
    The pixel padding (:meth:`apply_image`) is zeroed either way.
    """

    def __init__(self, image_sizes: torch.Tensor, divisibility: int, enabled: bool = True):
        d = max(int(divisibility), 1)
        self.enabled = bool(enabled)
        self.image_sizes = image_sizes
        # each image's padded extent in input pixels, int64 [B, 2]
        # sizes are >= 0, so truncating division is floor division (and a plain ONNX Div)
        self.padded = torch.div(image_sizes + (d - 1), d, rounding_mode="trunc") * d
        self._cache: dict[int, torch.Tensor] = {}

    def extent(self, stride: int) -> torch.Tensor:
        """Valid rows/cols of a stride-``stride`` map per image, int64 [B, 2] (ceil division)."""
        return torch.div(self.padded + (stride - 1), stride, rounding_mode="trunc")

    def mask(self, stride: int, like: torch.Tensor) -> torch.Tensor | None:
        """Float mask [B, 1, H, W] of ``like``'s spatial size: 1 inside each image's extent
        (None when disabled: all ones)."""
        if not self.enabled:
            return None
        # one map size per stride within a forward, so the stride is the cache key
        if stride in self._cache:
            return self._cache[stride]
        h, w = like.shape[-2], like.shape[-1]
        ext = self.extent(stride)
        rows = torch.arange(h, device=like.device)[None, :] < ext[:, 0:1]  # [B, H]
        cols = torch.arange(w, device=like.device)[None, :] < ext[:, 1:2]  # [B, W]
        m = (rows[:, None, :, None] & cols[:, None, None, :]).to(like.dtype)
        self._cache[stride] = m
        return m

    def apply(self, x: torch.Tensor, stride: int) -> torch.Tensor:
        m = self.mask(stride, x)
        return x if m is None else x * m

    def apply_image(self, x: torch.Tensor) -> torch.Tensor:
        """Zero x [B, C, H, W] outside each image's own (h, w), e.g. the host's pixel padding."""
        h, w = x.shape[-2], x.shape[-1]
        rows = torch.arange(h, device=x.device)[None, :] < self.image_sizes[:, 0:1]
        cols = torch.arange(w, device=x.device)[None, :] < self.image_sizes[:, 1:2]
        return x * (rows[:, None, :, None] & cols[:, None, None, :]).to(x.dtype)


class Mlp(nn.Module):
    """timm's Mlp as detectron2's ViT and MViT build it: fc1, exact GELU, fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))
