"""detectron2's ViTDet backbone (``modeling/backbone/vit.py``, ``utils.py``): a plain ViT
(patch embedding, absolute positions, blocks with windowed or global attention and decomposed
relative positions, optional residual conv blocks) under a SimpleFeaturePyramid (P2-P5 from its
last map by deconvolution / max pooling, each through a 1x1 and a 3x3 conv with LN; P6 by max pooling).

State-dict names follow detectron2: ``net.patch_embed.proj``, ``net.pos_embed``,
``net.blocks.{i}.{norm1,attn.qkv,attn.proj,attn.rel_pos_h,attn.rel_pos_w,norm2,mlp.fc1,mlp.fc2}``,
``net.blocks.{i}.residual.{conv1,norm1,...}``, ``simfp_{2..5}.{k}``.

Every image is padded to one square (detectron2's ``square_pad``), so the token grid is fixed:
the absolute positions interpolated to it are a constant, computed when the weights are loaded.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from norcal.core.errors import NorcalError

from ..spec import ViTSpec
from .layers import Conv2d, LayerNorm, Mlp, PaddingMasks

SCALE_FACTORS = (4.0, 2.0, 1.0, 0.5)  # detectron2's ViTDet configs: P2-P5 at strides 4-32 from patch 16


def rel_pos_table(q_size: int, k_size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    """detectron2's ``get_rel_pos``: the [q, k, C] embeddings of each query-key offset, the
    table linearly resized where its length is not 2 * max(q, k) - 1."""
    max_dist = int(2 * max(q_size, k_size) - 1)
    if rel_pos.shape[0] != max_dist:
        rel_pos = F.interpolate(rel_pos.reshape(1, rel_pos.shape[0], -1).permute(0, 2, 1), size=max_dist,
                                mode="linear").reshape(-1, max_dist).permute(1, 0)
    q_coords = torch.arange(q_size)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size)[None, :] * max(q_size / k_size, 1.0)
    offsets = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return rel_pos[offsets.long()]


def abs_pos(pos_embed: torch.Tensor, has_cls_token: bool, hw: tuple[int, int]) -> torch.Tensor:
    """detectron2's ``get_abs_pos``: [1, N(+1), C] pretraining positions -> [1, H, W, C], resized
    bicubically (align_corners False) where the grid differs."""
    if has_cls_token:
        pos_embed = pos_embed[:, 1:]
    n = pos_embed.shape[1]
    size = math.isqrt(n)
    if size * size != n:
        raise NorcalError(f"pos_embed holds {n} positions, not a square grid")
    grid = pos_embed.reshape(1, size, size, -1)
    if (size, size) == tuple(hw):
        return grid
    return F.interpolate(grid.permute(0, 3, 1, 2), size=hw, mode="bicubic", align_corners=False).permute(0, 2, 3, 1)


class Attention(nn.Module):
    """Multi-head attention over x [B, H, W, C] with decomposed relative positions (``rel_size``:
    the side their tables are sized for; 0: none)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, rel_size: int):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.use_rel_pos = rel_size > 0
        if self.use_rel_pos:
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_size - 1, head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_size - 1, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, _ = x.shape
        qkv = self.qkv(x).reshape(b, h * w, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, b * self.num_heads, h * w, -1).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        if self.use_rel_pos:
            attn = self._add_rel_pos(attn, q, h, w)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).view(b, self.num_heads, h, w, -1).permute(0, 2, 3, 1, 4).reshape(b, h, w, -1)
        return self.proj(x)

    def _add_rel_pos(self, attn: torch.Tensor, q: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """detectron2's ``add_decomposed_rel_pos`` for equal query and key grids, its two einsums
        as batched MatMuls (which every ONNX consumer takes)."""
        rh = rel_pos_table(h, h, self.rel_pos_h)  # [h, h', C]
        rw = rel_pos_table(w, w, self.rel_pos_w)  # [w, w', C]
        n = q.shape[0]
        r_q = q.reshape(n, h, w, -1)
        rel_h = r_q @ rh.transpose(1, 2)  # [n, h, w, h']: row i's queries against rh[i]
        rel_w = (r_q.transpose(1, 2) @ rw.transpose(1, 2)).transpose(1, 2)  # [n, h, w, w']
        attn = attn.view(n, h, w, h, w) + rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]
        return attn.view(n, h * w, h * w)


class ResBottleneckBlock(nn.Module):
    """vit.py's residual block: 1x1, 3x3, 1x1 convs (no bias) each with LN, GELU after the first
    two, added to its input."""

    def __init__(self, dim: int):
        super().__init__()
        mid = dim // 2
        self.conv1 = nn.Conv2d(dim, mid, 1, bias=False)
        self.norm1 = LayerNorm(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False)
        self.norm2 = LayerNorm(mid)
        self.conv3 = nn.Conv2d(mid, dim, 1, bias=False)
        self.norm3 = LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.gelu(self.norm1(self.conv1(x)))
        out = F.gelu(self.norm2(self.conv2(out)))
        return x + self.norm3(self.conv3(out))


def window_partition(x: torch.Tensor, window: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """detectron2's ``window_partition``: [B, H, W, C] zero-padded to multiples of ``window`` at
    the bottom / right, as [B * windows, window, window, C]; and the padded (Hp, Wp)."""
    b, h, w, c = x.shape
    pad_h, pad_w = (window - h % window) % window, (window - w % window) % window
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    hp, wp = h + pad_h, w + pad_w
    x = x.view(b, hp // window, window, wp // window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window, window, c), (hp, wp)


def window_unpartition(windows: torch.Tensor, window: int, pad_hw: tuple[int, int],
                       hw: tuple[int, int]) -> torch.Tensor:
    """The inverse of :func:`window_partition`, the padding cut off."""
    hp, wp = pad_hw
    h, w = hw
    b = windows.shape[0] // (hp * wp // window // window)
    x = windows.view(b, hp // window, wp // window, window, window, -1)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, -1)
    return x[:, :h, :w, :] if (hp > h or wp > w) else x


class Block(nn.Module):
    """A transformer block: LN, attention (within windows of ``window`` tokens, or global), LN,
    MLP, each residual; then the residual conv block where there is one."""

    def __init__(self, spec: ViTSpec, window: int, residual: bool, tokens: int):
        super().__init__()
        dim = spec.embed_dim
        self.window = window
        self.norm1 = nn.LayerNorm(dim, eps=spec.ln_eps)
        rel = (window or tokens) if spec.use_rel_pos else 0
        self.attn = Attention(dim, spec.num_heads, spec.qkv_bias, rel)
        self.norm2 = nn.LayerNorm(dim, eps=spec.ln_eps)
        self.mlp = Mlp(dim, int(dim * spec.mlp_ratio))
        self.residual = ResBottleneckBlock(dim) if residual else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.window > 0:
            h, w = x.shape[1], x.shape[2]
            x, pad_hw = window_partition(x, self.window)
            x = window_unpartition(self.attn(x), self.window, pad_hw, (h, w))
        else:
            x = self.attn(x)
        x = shortcut + x
        x = x + self.mlp(self.norm2(x))
        if self.residual is not None:
            x = self.residual(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return x


class ViT(nn.Module):
    """The plain ViT: [B, 3, S, S] -> its last map [B, C, S/p, S/p] (S: the square)."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        if spec.square_pad <= 0 or spec.square_pad % spec.patch_size:
            raise NorcalError(f"ViT square_pad {spec.square_pad} is not a positive multiple of its patch size "
                              f"{spec.patch_size}")
        if spec.embed_dim % spec.num_heads:
            raise NorcalError(f"ViT embed_dim {spec.embed_dim} is not a multiple of num_heads {spec.num_heads}")
        self.spec = spec
        self.tokens = spec.square_pad // spec.patch_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, spec.embed_dim, spec.patch_size, stride=spec.patch_size)
        self.pos_embed = None
        if spec.use_abs_pos:
            side = spec.pretrain_img_size // spec.patch_size
            self.pos_embed = nn.Parameter(torch.zeros(1, side * side + int(spec.pretrain_use_cls_token),
                                                      spec.embed_dim))
            # the positions on this square's grid: a constant once the weights are loaded
            self.register_buffer("grid_pos", torch.zeros(1, self.tokens, self.tokens, spec.embed_dim), False)
            self.register_load_state_dict_post_hook(lambda module, _: module.resize_positions())
        windowed, residual = set(spec.window_block_indexes), set(spec.residual_block_indexes)
        self.blocks = nn.ModuleList(
            Block(spec, spec.window_size if i in windowed else 0, i in residual, self.tokens)
            for i in range(spec.depth))

    @torch.no_grad()
    def resize_positions(self) -> None:
        """Set the grid's absolute positions from ``pos_embed`` (called when weights are loaded)."""
        if self.pos_embed is not None:
            self.grid_pos.copy_(abs_pos(self.pos_embed, self.spec.pretrain_use_cls_token, (self.tokens, self.tokens)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed.proj(x).permute(0, 2, 3, 1)
        if self.pos_embed is not None:
            x = x + self.grid_pos
        for block in self.blocks:
            x = block(x)
        return x.permute(0, 3, 1, 2)


class SimpleFeaturePyramid(nn.Module):
    """Returns ``[p2, p3, p4, p5, p6]``, each [B, out_channels, S/s, S/s]."""

    def __init__(self, spec: ViTSpec, out_channels: int, norm: str):
        super().__init__()
        self.net = ViT(spec)
        dim = spec.embed_dim
        strides = [int(spec.patch_size / s) for s in SCALE_FACTORS]
        if strides != [4, 8, 16, 32]:
            raise NorcalError(f"ViT patch size {spec.patch_size} gives pyramid strides {strides}; the RPN and ROI "
                              "heads read P2-P5 at strides 4-32 (patch 16)")
        bias = norm == ""
        for scale, stride in zip(SCALE_FACTORS, strides):
            layers: list[nn.Module] = []
            out_dim = dim
            if scale == 4.0:
                layers = [nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), _norm(norm, dim // 2), nn.GELU(),
                          nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2)]
                out_dim = dim // 4
            elif scale == 2.0:
                layers = [nn.ConvTranspose2d(dim, dim // 2, 2, stride=2)]
                out_dim = dim // 2
            elif scale == 0.5:
                layers = [nn.MaxPool2d(kernel_size=2, stride=2)]
            layers += [Conv2d(out_dim, out_channels, 1, bias=bias, norm=norm),
                       Conv2d(out_channels, out_channels, 3, padding=1, bias=bias, norm=norm)]
            self.add_module(f"simfp_{int(math.log2(stride))}", nn.Sequential(*layers))
        self.in_strides = strides
        self.strides = strides + [strides[-1] * 2]  # LastLevelMaxPool's P6
        # every image is padded to the square: the graph's fixed input size
        self.size_divisibility = self.square = spec.square_pad

    def forward(self, x: torch.Tensor, masks: PaddingMasks | None = None) -> list[torch.Tensor]:
        """``masks`` play no part: every image fills the square, padded alike alone or batched."""
        feature = self.net(x)
        results = [getattr(self, f"simfp_{int(math.log2(s))}")(feature) for s in self.in_strides]
        results.append(F.max_pool2d(results[-1], kernel_size=1, stride=2, padding=0))
        return results


def _norm(norm: str, channels: int) -> nn.Module:
    if norm != "LN":
        raise NorcalError(f"SimpleFeaturePyramid norm {norm!r} is not supported (ViTDet's LN)")
    return LayerNorm(channels)
