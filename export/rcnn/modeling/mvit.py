"""detectron2's MViT bottom-up (``detectron2.modeling.backbone.mvit.MViT``, MViTv2): a 7x7/4 patch
embedding, then MultiScaleBlocks whose attention pools q, k and v (depthwise conv + LayerNorm per
head), adds decomposed relative positions and (residual pooling) the pooled queries back; window
attention everywhere but in the last block of stages 3-5; a LayerNorm per output stage.

State-dict names follow detectron2: ``patch_embed.proj``, ``blocks.{i}.norm1`` / ``attn.qkv`` /
``attn.pool_{q,k,v}`` / ``attn.norm_{q,k,v}`` / ``attn.rel_pos_{h,w}`` / ``attn.proj`` / ``norm2`` /
``mlp.fc{1,2}`` / ``proj``, ``scale{2..5}_norm``.

Every size is taken from the input as a Python int, as detectron2 takes it: an exported graph is
fixed to the size it was traced at, which the square-padded input of detectron2's MViT configs
makes the only size the model sees.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from norcal.core.errors import NorcalError

from ..spec import MViTSpec
from .layers import Mlp, PaddingMasks

STAGES = 4  # scale2..scale5, the FPN's inputs


def _pool(x: torch.Tensor, pool: nn.Module, norm: nn.Module | None = None) -> torch.Tensor:
    """``pool`` (a conv or max pool over [N, C, H, W]) of x [N, H, W, C], then ``norm``."""
    x = pool(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    return norm(x) if norm is not None else x


def _windows(x: torch.Tensor, size: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """x [N, H, W, C] zero-padded at the bottom/right to multiples of ``size``, cut into
    [N * windows, size, size, C] (row-major windows); also the padded (H, W)."""
    h, w, c = (int(d) for d in x.shape[1:])
    hp, wp = -(-h // size) * size, -(-w // size) * size
    if (hp, wp) != (h, w):
        x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
    x = x.reshape(-1, hp // size, size, wp // size, size, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, size, size, c), (hp, wp)


def _unwindows(x: torch.Tensor, size: int, padded: tuple[int, int], hw: tuple[int, int]) -> torch.Tensor:
    """The inverse of :func:`_windows`: [N, H, W, C] with the padding cut off."""
    (hp, wp), c = padded, int(x.shape[-1])
    x = x.reshape(-1, hp // size, wp // size, size, size, c).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(-1, hp, wp, c)
    return x[:, :hw[0], :hw[1]] if (hp, wp) != tuple(hw) else x


def linear_resample(length: int, rows: int) -> np.ndarray:
    """[rows, length] float32: F.interpolate(mode="linear", align_corners=False) from ``length``
    samples to ``rows`` as a matrix (each row weighs the two nearest samples)."""
    f32 = np.float32
    # float32 source positions, as PyTorch computes them for a float32 input
    src = np.maximum(f32(f32(length) / f32(rows)) * (np.arange(rows, dtype=f32) + f32(0.5)) - f32(0.5), f32(0))
    lo = np.minimum(np.floor(src).astype(np.int64), length - 1)
    hi = np.minimum(lo + 1, length - 1)
    frac = (src - lo.astype(f32)).astype(f32)
    m = np.zeros((rows, length), f32)
    np.add.at(m, (np.arange(rows), lo), f32(1) - frac)
    np.add.at(m, (np.arange(rows), hi), frac)
    return m


def _rel_pos(table: torch.Tensor, q: int, k: int) -> torch.Tensor:
    """[q, k, C]: the table's embedding for each (query, key) offset along one axis.

    The table [L, C] is linearly resampled to 2 * max(q, k) - 1 rows when it has another
    length (a constant matrix, so that the graph holds a MatMul, not a Resize), and the shorter
    axis's coordinates are stretched to the longer's before the offset is truncated to a row."""
    rows = 2 * max(q, k) - 1
    if table.shape[0] != rows:
        table = torch.from_numpy(linear_resample(int(table.shape[0]), rows)).to(table) @ table
    sq, sk = max(k / q, 1.0), max(q / k, 1.0)
    # float32 arithmetic and truncation, as detectron2's get_rel_pos takes them
    offsets = (torch.arange(q, device=table.device)[:, None] * sq
               - torch.arange(k, device=table.device)[None, :] * sk) + (k - 1) * sk
    return table[offsets.long()]


def add_rel_pos(attn: torch.Tensor, q: torch.Tensor, rel_h: torch.Tensor, rel_w: torch.Tensor,
                q_hw: tuple[int, int], k_hw: tuple[int, int]) -> torch.Tensor:
    """attn [N, qh*qw, kh*kw] plus q's products with the height and the width tables (MViTv2's
    decomposed relative positions); q [N, qh*qw, C]. Batched MatMuls rather than einsum."""
    (qh, qw), (kh, kw) = q_hw, k_hw
    c = int(q.shape[-1])
    r_h, r_w = _rel_pos(rel_h, qh, kh), _rel_pos(rel_w, qw, kw)
    rq = q.reshape(-1, qh, qw, c)
    # per query row h: [N*qw, C] @ [C, kh]; per query column w: [N*qh, C] @ [C, kw]
    by_h = torch.matmul(rq.permute(1, 0, 2, 3).reshape(qh, -1, c), r_h.transpose(1, 2))
    by_h = by_h.reshape(qh, -1, qw, kh).permute(1, 0, 2, 3)  # [N, qh, qw, kh]
    by_w = torch.matmul(rq.permute(2, 0, 1, 3).reshape(qw, -1, c), r_w.transpose(1, 2))
    by_w = by_w.reshape(qw, -1, qh, kw).permute(1, 2, 0, 3)  # [N, qh, qw, kw]
    attn = attn.reshape(-1, qh, qw, kh, kw) + by_h[..., None] + by_w[:, :, :, None, :]
    return attn.reshape(-1, qh * qw, kh * kw)


class MultiScaleAttention(nn.Module):
    """Pooling attention: q pooled with stride ``stride_q``, k and v with ``stride_kv``; window
    attention when ``window`` > 0 (windows of window // stride after pooling)."""

    def __init__(self, dim: int, dim_out: int, num_heads: int, *, kernel: tuple[int, int], stride_q: int,
                 stride_kv: int, window: int, rel_size: int | None, qkv_bias: bool, residual_pooling: bool,
                 eps: float):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim_out // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim_out * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim_out, dim_out)
        hd, pad = self.head_dim, [k // 2 for k in kernel]
        for name, stride in (("q", stride_q), ("k", stride_kv), ("v", stride_kv)):
            conv = nn.Conv2d(hd, hd, kernel, stride=stride, padding=pad, groups=hd, bias=False)  # per channel
            self.add_module(f"pool_{name}", conv)
            self.add_module(f"norm_{name}", nn.LayerNorm(hd, eps=eps))
        self.windows = (window // stride_q, window // stride_kv) if window else None
        self.residual_pooling = residual_pooling
        self.rel_pos_h = self.rel_pos_w = None
        if rel_size is not None:  # detectron2 sizes the tables for the pretraining input
            rows = 2 * max(rel_size // stride_q, rel_size // stride_kv) - 1
            self.rel_pos_h = nn.Parameter(torch.zeros(rows, hd))
            self.rel_pos_w = nn.Parameter(torch.zeros(rows, hd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[1]), int(x.shape[2])
        qkv = self.qkv(x).reshape(-1, h, w, 3, self.num_heads, self.head_dim).permute(3, 0, 4, 1, 2, 5)
        q, k, v = qkv.reshape(3, -1, h, w, self.head_dim).unbind(0)  # [B*heads, H, W, hd] each
        q = _pool(q, self.pool_q, self.norm_q)
        k = _pool(k, self.pool_k, self.norm_k)
        v = _pool(v, self.pool_v, self.norm_v)
        pooled_q, q_full = q, (int(q.shape[1]), int(q.shape[2]))
        padded = q_full
        if self.windows:
            qs, ks = self.windows
            q, padded = _windows(q, qs)
            k, _ = _windows(k, ks)
            v, _ = _windows(v, ks)
            q_hw, k_hw = (qs, qs), (ks, ks)
        else:
            q_hw, k_hw = q_full, (int(k.shape[1]), int(k.shape[2]))
        q = q.reshape(-1, q_hw[0] * q_hw[1], self.head_dim)
        k = k.reshape(-1, k_hw[0] * k_hw[1], self.head_dim)
        v = v.reshape(-1, k_hw[0] * k_hw[1], self.head_dim)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        if self.rel_pos_h is not None:
            attn = add_rel_pos(attn, q, self.rel_pos_h, self.rel_pos_w, q_hw, k_hw)
        x = (attn.softmax(dim=-1) @ v).reshape(-1, q_hw[0], q_hw[1], self.head_dim)
        if self.windows:
            x = _unwindows(x, self.windows[0], padded, q_full)
        if self.residual_pooling:
            x = x + pooled_q
        ho, wo = q_full
        x = x.reshape(-1, self.num_heads, ho, wo, self.head_dim).permute(0, 2, 3, 1, 4)
        return self.proj(x.reshape(-1, ho, wo, self.num_heads * self.head_dim))


class MultiScaleBlock(nn.Module):
    """x + attn(norm1(x)), then + mlp(norm2(.)); where the width changes the shortcut is
    ``proj(norm1(x))``, where the queries are strided it is max-pooled alike."""

    def __init__(self, dim: int, dim_out: int, num_heads: int, *, mlp_ratio: float, stride_q: int, eps: float,
                 **attn):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = MultiScaleAttention(dim, dim_out, num_heads, stride_q=stride_q, eps=eps, **attn)
        self.norm2 = nn.LayerNorm(dim_out, eps=eps)
        self.mlp = Mlp(dim_out, int(dim_out * mlp_ratio))
        self.proj = nn.Linear(dim, dim_out) if dim != dim_out else None
        self.pool_skip = nn.MaxPool2d(stride_q + 1, stride_q, (stride_q + 1) // 2) if stride_q > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_norm = self.norm1(x)
        x_block = self.attn(x_norm)
        if self.proj is not None:
            x = self.proj(x_norm)
        if self.pool_skip is not None:
            x = _pool(x, self.pool_skip)
        x = x + x_block
        return x + self.mlp(self.norm2(x))


def _check(spec: MViTSpec) -> None:
    ends = spec.last_block_indexes
    if len(ends) != STAGES or list(ends) != sorted(set(ends)) or ends[0] < 0 or ends[-1] != spec.depth - 1:
        raise NorcalError(f"MViT last_block_indexes {tuple(ends)} must be {STAGES} increasing block indexes "
                          f"ending at the last block ({spec.depth - 1})")
    if spec.patch_stride[0] != spec.patch_stride[1]:
        raise NorcalError(f"MViT patch stride {spec.patch_stride} must be square")


class MViT(nn.Module):
    """Returns ``{"scale2": [B,C,H/4,W/4], ..., "scale5": [B,8C,H/32,W/32]}`` (the FPN's inputs)."""

    def __init__(self, spec: MViTSpec):
        super().__init__()
        _check(spec)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, spec.embed_dim, spec.patch_kernel, stride=spec.patch_stride,
                                          padding=spec.patch_padding)
        ends = set(spec.last_block_indexes)
        self.last_block_indexes = tuple(spec.last_block_indexes)
        self.stage_names = [f"scale{k + 2}" for k in range(STAGES)]
        self.out_strides: dict[str, int] = {}
        self.out_channels: dict[str, int] = {}
        dim = dim_out = spec.embed_dim
        heads, stride_kv, window = spec.num_heads, spec.adaptive_kv_stride, spec.adaptive_window_size
        rel_size = spec.img_size // spec.patch_stride[0]
        stride, stage = spec.patch_stride[0], 0
        self.blocks = nn.ModuleList()
        for i in range(spec.depth):
            global_attn = i in spec.last_block_indexes[1:]  # stages 3-5 end with a global block
            # ... whose keys, in stages 3 and 4, are pooled twice as much
            kv = stride_kv * 2 if i in spec.last_block_indexes[1:3] else stride_kv
            self.blocks.append(MultiScaleBlock(
                dim, dim_out, heads, mlp_ratio=spec.mlp_ratio, stride_q=2 if i - 1 in ends else 1, eps=spec.norm_eps,
                kernel=spec.qkv_pool_kernel, stride_kv=kv,
                window=0 if global_attn else window, rel_size=rel_size if spec.use_rel_pos else None,
                qkv_bias=spec.qkv_bias, residual_pooling=spec.residual_pooling))
            dim = dim_out
            if i in ends:
                name = self.stage_names[stage]
                self.out_channels[name], self.out_strides[name] = dim_out, stride
                self.add_module(f"{name}_norm", nn.LayerNorm(dim_out, eps=spec.norm_eps))
                dim_out, heads, stride, stage = dim_out * 2, heads * 2, stride * 2, stage + 1
                stride_kv = max(stride_kv // 2, 1)
            if i - 1 in ends:  # the stage's first block pooled its queries: later ones see half the size
                window, rel_size = window // 2, rel_size // 2

    def forward(self, x: torch.Tensor, masks: PaddingMasks | None = None) -> dict[str, torch.Tensor]:
        """``masks`` plays no part: detectron2 runs MViT on the square-padded image as a whole."""
        x = self.patch_embed.proj(x).permute(0, 2, 3, 1)
        out = {}
        names = iter(self.stage_names)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in self.last_block_indexes:
                name = next(names)
                out[name] = getattr(self, f"{name}_norm")(x).permute(0, 3, 1, 2)
        return out
