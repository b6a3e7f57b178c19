"""detectron2's ``Box2BoxTransform``: (dx, dy, dw, dh) deltas <-> XYXY boxes."""

from __future__ import annotations

import math

import torch

# detectron2 caps dw/dh so exp() cannot blow up: a box grows at most 1000/16 times
SCALE_CLAMP = math.log(1000.0 / 16)


class BoxCoder:
    """Decode deltas with weights (wx, wy, ww, wh), e.g. (1,1,1,1) RPN, (10,10,5,5) box head."""

    def __init__(self, weights, scale_clamp: float = SCALE_CLAMP):
        self.weights = tuple(float(w) for w in weights)
        self.scale_clamp = scale_clamp

    def decode(self, deltas: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """deltas [..., k*4], boxes [..., 4] (x0, y0, x1, y1) -> boxes [..., k, 4]."""
        boxes = boxes.to(deltas.dtype)
        d = deltas.reshape(deltas.shape[:-1] + (-1, 4))
        widths = boxes[..., 2] - boxes[..., 0]
        heights = boxes[..., 3] - boxes[..., 1]
        ctr_x = boxes[..., 0] + 0.5 * widths
        ctr_y = boxes[..., 1] + 0.5 * heights
        wx, wy, ww, wh = self.weights
        dx = d[..., 0] / wx
        dy = d[..., 1] / wy
        dw = torch.clamp(d[..., 2] / ww, max=self.scale_clamp)
        dh = torch.clamp(d[..., 3] / wh, max=self.scale_clamp)
        # same operation order as detectron2, so fp32 rounding matches
        pred_ctr_x = dx * widths[..., None] + ctr_x[..., None]
        pred_ctr_y = dy * heights[..., None] + ctr_y[..., None]
        pred_w = torch.exp(dw) * widths[..., None]
        pred_h = torch.exp(dh) * heights[..., None]
        x1 = pred_ctr_x - 0.5 * pred_w
        y1 = pred_ctr_y - 0.5 * pred_h
        x2 = pred_ctr_x + 0.5 * pred_w
        y2 = pred_ctr_y + 0.5 * pred_h
        return torch.stack((x1, y1, x2, y2), dim=-1)


def clip_boxes(boxes: torch.Tensor, image_sizes: torch.Tensor) -> torch.Tensor:
    """Clip boxes [B, ..., 4] to each image's (h, w) from ``image_sizes`` int64 [B, 2]."""
    shape = (boxes.shape[0],) + (1,) * (boxes.dim() - 2)
    h = image_sizes[:, 0].to(boxes.dtype).reshape(shape)
    w = image_sizes[:, 1].to(boxes.dtype).reshape(shape)
    zero = torch.zeros((), dtype=boxes.dtype, device=boxes.device)
    x1 = torch.minimum(torch.maximum(boxes[..., 0], zero), w)
    y1 = torch.minimum(torch.maximum(boxes[..., 1], zero), h)
    x2 = torch.minimum(torch.maximum(boxes[..., 2], zero), w)
    y2 = torch.minimum(torch.maximum(boxes[..., 3], zero), h)
    return torch.stack((x1, y1, x2, y2), dim=-1)
