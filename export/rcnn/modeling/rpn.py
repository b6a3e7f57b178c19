"""detectron2's RPN: ``StandardRPNHead`` and ``find_top_rpn_proposals``, batched.

Per level: top-k anchors by objectness, decode, then over all levels: clip, drop empty boxes,
NMS within each level, keep the post-NMS top-k. Every per-image quantity is a fixed-size
tensor with a validity mask instead of a Python list, so one graph serves any batch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from norcal.export.trt_check.support import TOPK_K_LIMIT
from .anchors import AnchorGenerator
from .box_coder import BoxCoder, clip_boxes
from .layers import PaddingMasks
from norcal.export.pytorch.ops import FLOAT_LOWEST, non_max_suppression

NEG_INF = float("-inf")
TOPK_STEP = TOPK_K_LIMIT - 1  # TensorRT's TopK takes K < 3840


def topk_in_steps(x: torch.Tensor, k: int, step: int = TOPK_STEP):
    """``x.topk(k, dim=1)`` as TopKs of at most ``step`` each: after each, the values taken are
    set to -inf and the next TopK picks the following ones (C4/DC5 take 6000 anchors)."""
    values, indices = [], []
    while k > 0:
        n = min(k, step)
        v, i = x.topk(n, dim=1)
        values.append(v)
        indices.append(i)
        k -= n
        if k:
            x = x.scatter(1, i, torch.full_like(v, NEG_INF))
    if len(values) == 1:
        return values[0], indices[0]
    return torch.cat(values, dim=1), torch.cat(indices, dim=1)


class StandardRPNHead(nn.Module):
    """3x3 conv(s) + ReLU, then 1x1 objectness [A] and 1x1 deltas [A*4] per location."""

    def __init__(self, in_channels: int, num_anchors: int, conv_dims=(-1,)):
        super().__init__()
        dims = [in_channels if d == -1 else int(d) for d in conv_dims]
        if len(dims) == 1:
            self.conv = nn.Conv2d(in_channels, dims[0], 3, padding=1)
        else:
            self.conv = nn.Sequential()
            prev = in_channels
            for k, d in enumerate(dims):
                self.conv.add_module(f"conv{k}", nn.Conv2d(prev, d, 3, padding=1))
                self.conv.add_module(f"relu{k}", nn.ReLU())
                prev = d
        self.objectness_logits = nn.Conv2d(dims[-1], num_anchors, 1)
        self.anchor_deltas = nn.Conv2d(dims[-1], num_anchors * 4, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """x [B, C, H, W] -> logits [B, H*W*A], deltas [B, H*W*A, 4] (detectron2 order).

        ``mask`` [B, 1, H, W] (``PaddingMasks.mask``; None: no batch padding) is applied before
        every 3x3 conv: after the first, the batch padding holds ReLU(bias + ...), not the
        zeros the next conv reads at an image's edge in detectron2."""
        if isinstance(self.conv, nn.Conv2d):
            t = F.relu(self.conv(x if mask is None else x * mask))
        else:
            t = x
            for layer in self.conv:
                t = layer(t * mask) if mask is not None and isinstance(layer, nn.Conv2d) else layer(t)
        b = x.shape[0]
        logits = self.objectness_logits(t).permute(0, 2, 3, 1).reshape(b, -1)
        d = self.anchor_deltas(t)
        a = d.shape[1] // 4
        deltas = d.reshape(b, a, 4, d.shape[-2], d.shape[-1]).permute(0, 3, 4, 1, 2)
        deltas = deltas.reshape(b, -1, 4)
        return logits, deltas


class RPN(nn.Module):
    """Proposals [B, post_nms_topk, 4] sorted by objectness, with a validity mask [B, post]."""

    def __init__(self, head: StandardRPNHead, anchors: AnchorGenerator, *, box_weights,
                 pre_nms_topk: int, post_nms_topk: int, nms_thresh: float, min_size: float,
                 min_size_inclusive: bool = False):
        super().__init__()
        self.rpn_head = head
        self.anchor_generator = anchors
        self.box_coder = BoxCoder(box_weights)
        self.pre_nms_topk = int(pre_nms_topk)
        self.post_nms_topk = int(post_nms_topk)
        self.nms_thresh = float(nms_thresh)
        self.min_size = float(min_size)
        self.min_size_inclusive = bool(min_size_inclusive)

    def forward(self, features: list[torch.Tensor], image_sizes: torch.Tensor,
                masks: PaddingMasks):
        """Returns (boxes [B, P, 4], logits [B, P], valid bool [B, P]), P = post_nms_topk."""
        k = self.pre_nms_topk
        anchors = self.anchor_generator(features, masks.padded)
        boxes, scores = [], []
        for f, stride, anc in zip(features, self.anchor_generator.strides, anchors):
            m = masks.mask(stride, f)
            logits, deltas = self.rpn_head(f, m)
            b = logits.shape[0]
            a = self.anchor_generator.num_anchors
            # anchors on another image's padding do not exist for this image in detectron2
            if m is not None:
                inside = m[:, 0, :, :, None].expand(-1, -1, -1, a).reshape(b, -1)
                logits = torch.where(inside > 0, logits, torch.full_like(logits, NEG_INF))
            # pad with k dummies so top-k needs no min(k, H*W*A) and works for any input size
            logits = torch.cat([logits, logits.new_full((b, k), NEG_INF)], dim=1)
            deltas = torch.cat([deltas, deltas.new_zeros((b, k, 4))], dim=1)
            top, idx = topk_in_steps(logits, k)
            d = torch.gather(deltas, 1, idx[:, :, None].expand(-1, -1, 4))
            if anc.dim() == 3:  # per-image anchors (torchvision's strides)
                anc = torch.cat([anc, anc.new_zeros((b, k, 4))], dim=1)
                anc = torch.gather(anc, 1, idx[:, :, None].expand(-1, -1, 4))
            else:
                anc = torch.cat([anc, anc.new_zeros((k, 4))], dim=0)[idx]
            boxes.append(self.box_coder.decode(d, anc)[:, :, 0, :])
            scores.append(top)
        boxes = clip_boxes(torch.cat(boxes, dim=1), image_sizes)  # [B, L*k, 4]
        scores = torch.cat(scores, dim=1)  # [B, L*k]
        w = boxes[..., 2] - boxes[..., 0]
        h = boxes[..., 3] - boxes[..., 1]
        # detectron2 keeps w > min_size; torchvision's remove_small_boxes w >= min_size
        if self.min_size_inclusive:
            nonempty = (w >= self.min_size) & (h >= self.min_size)
        else:
            nonempty = (w > self.min_size) & (h > self.min_size)
        scores = torch.where(nonempty, scores, torch.full_like(scores, NEG_INF))
        # NMS within each level: fold the level into NMS's batch axis ([B*L, k, 4]), so each
        # NMS batch item holds at most k boxes (TensorRT considers <= 5000 per item; with
        # C4/DC5's k = 6000 the kept top 1000 still match unless fewer survive from the top 5000)
        sel = non_max_suppression(boxes.reshape(-1, k, 4), scores.reshape(-1, 1, k),
                                  self.post_nms_topk, self.nms_thresh, FLOAT_LOWEST)
        n = scores.shape[1]
        flat = sel[:, 0] * k + sel[:, 2]  # (b*L + l)*k + i indexes the [B, L*k] grid
        kept = torch.full_like(scores, NEG_INF).reshape(-1)
        kept = kept.scatter(0, flat, scores.reshape(-1)[flat]).reshape(scores.shape)
        top, idx = kept.topk(min(self.post_nms_topk, n), dim=1)
        props = torch.gather(boxes, 1, idx[:, :, None].expand(-1, -1, 4))
        return props, top, top > FLOAT_LOWEST
