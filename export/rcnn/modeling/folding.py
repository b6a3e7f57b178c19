"""Export-time folding of frozen normalisations into the convolutions before them."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from .layers import Conv2d, FrozenBatchNorm2d


def _foldable(m: nn.Module) -> bool:
    norm = getattr(m, "norm", None)
    if not isinstance(m, Conv2d):
        return False
    if isinstance(norm, FrozenBatchNorm2d):
        return True
    # eval-mode BatchNorm with running statistics is the same affine map
    return isinstance(norm, nn.BatchNorm2d) and not norm.training and norm.running_var is not None


def _folded(conv: Conv2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of conv followed by its norm:
    (conv(x) - mean) * g / sqrt(var + eps) + b = conv_{w * s}(x) + (b - mean * s), s = g / sqrt(var + eps),
    computed in float64 and rounded once."""
    norm = conv.norm
    var, mean = norm.running_var.double(), norm.running_mean.double()
    g = norm.weight.double() if norm.weight is not None else torch.ones_like(var)
    b = norm.bias.double() if norm.bias is not None else torch.zeros_like(mean)
    scale = g / torch.sqrt(var + norm.eps)
    bias = b - mean * scale
    if conv.bias is not None:
        bias = bias + conv.bias.double() * scale
    weight = conv.weight.double() * scale.reshape(-1, 1, 1, 1)
    return weight.to(conv.weight.dtype), bias.to(conv.weight.dtype)


@contextmanager
def frozen_bn_folded(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with each ``Conv2d``'s FrozenBN (or eval-mode BatchNorm) folded into the conv's
    weight and bias, restored on exit: a traced graph gets one Conv instead of Conv +
    BatchNormalization, and ONNX Runtime / TensorRT have one fusion less to find. Equal up to
    float rounding. In place (no copy of a 170 MB model): each conv's own tensors are put back.
    """
    saved = []
    with torch.no_grad():
        for m in model.modules():
            if _foldable(m):
                weight, bias = _folded(m)
                saved.append((m, m.weight, m.bias, m.norm))
                m.weight = nn.Parameter(weight, requires_grad=False)
                m.bias = nn.Parameter(bias, requires_grad=False)
                m.norm = None
    try:
        yield model
    finally:
        for m, weight, bias, norm in saved:
            m.weight, m.bias, m.norm = weight, bias, norm
