"""Building blocks shared by the backbone and the heads: detectron2's Conv2d-with-norm,
FrozenBatchNorm2d, and the padding masks that make a batched graph behave per image."""

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


def get_norm(norm: str, channels: int) -> nn.Module | None:
    """detectron2's ``get_norm``: '' -> None, FrozenBN, BN / SyncBN (eval: same), GN (32 groups)."""
    if not norm:
        return None
    if norm == "FrozenBN":
        return FrozenBatchNorm2d(channels)
    if norm in ("BN", "SyncBN", "nnSyncBN", "naiveSyncBN"):
        return nn.BatchNorm2d(channels)
    if norm == "GN":
        return nn.GroupNorm(32, channels)
    raise NorcalError(f"unsupported norm {norm!r}; expected one of '', FrozenBN, BN, SyncBN, GN")


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` with an optional ``norm`` submodule (key ``<name>.norm.*``) and ReLU."""

    def __init__(self, *args, norm: str = "", relu: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm = get_norm(norm, self.out_channels)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        if self.norm is not None:
            x = self.norm(x)
        return F.relu(x) if self.relu else x


class PaddingMasks:
    """Per-image validity masks of feature maps, one per stride, computed once per forward.

    detectron2 runs each image padded to its own multiple of ``divisibility``; a batch pads to
    the largest image, so a 3x3 convolution at an image's right/bottom edge would read the
    neighbour's padding (non-zero after the first conv) instead of the zero padding it saw in
    detectron2. Multiplying a conv's input by ``mask(stride)`` restores exactly that.
    """

    def __init__(self, image_sizes: torch.Tensor, divisibility: int):
        d = max(int(divisibility), 1)
        self.image_sizes = image_sizes
        # each image's padded extent in input pixels, int64 [B, 2]
        # sizes are >= 0, so truncating division is floor division (and a plain ONNX Div)
        self.padded = torch.div(image_sizes + (d - 1), d, rounding_mode="trunc") * d
        self._cache: dict[int, torch.Tensor] = {}

    def extent(self, stride: int) -> torch.Tensor:
        """Valid rows/cols of a stride-``stride`` map per image, int64 [B, 2] (ceil division)."""
        return torch.div(self.padded + (stride - 1), stride, rounding_mode="trunc")

    def mask(self, stride: int, like: torch.Tensor) -> torch.Tensor:
        """Float mask [B, 1, H, W] of ``like``'s spatial size: 1 inside each image's extent."""
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
        return x * self.mask(stride, x)

    def apply_image(self, x: torch.Tensor) -> torch.Tensor:
        """Zero x [B, C, H, W] outside each image's own (h, w), e.g. the host's pixel padding."""
        h, w = x.shape[-2], x.shape[-1]
        rows = torch.arange(h, device=x.device)[None, :] < self.image_sizes[:, 0:1]
        cols = torch.arange(w, device=x.device)[None, :] < self.image_sizes[:, 1:2]
        return x * (rows[:, None, :, None] & cols[:, None, None, :]).to(x.dtype)
