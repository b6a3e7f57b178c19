"""Box IoU: the one numpy implementation of the project.

Parity's detection matching, the evaluation's LVIS matching (with pycocotools' arithmetic)
and the pictures' de-duplication all measure overlap here. The torch model never needs a box
IoU of its own: NMS inside the graph is ONNX's NonMaxSuppression (torchvision's nms in eager
mode), which computes its IoU itself.

Arithmetic, the same as pycocotools' ``bbIou``: the intersection is ``w * h`` of the
overlap rectangle (0 when its width or height is <= 0), the union ``area_a + area_b -
intersection`` in float64. An empty union (two zero-area boxes) gives 0, or 1 for two
identical boxes with ``identical_empty=True`` (parity: a degenerate detection clipped to the
image border on both backends is the same detection).
"""

from __future__ import annotations

import numpy as np

FORMATS = ("xyxy", "xywh")


def _corners(boxes, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(top-left [..., 2], bottom-right [..., 2], area [...]) of boxes [..., 4] in float64."""
    if fmt not in FORMATS:
        raise ValueError(f"box format must be one of {FORMATS}, got {fmt!r}")
    b = np.asarray(boxes, np.float64)
    lt = b[..., :2]
    if fmt == "xywh":  # x + w as pycocotools adds it; a negative size is refused at load
        rb, wh = b[..., 2:] + lt, b[..., 2:]
    else:  # an inverted box (x1 < x0) has no area
        rb, wh = b[..., 2:], np.clip(b[..., 2:] - lt, 0, None)
    return lt, rb, wh[..., 0] * wh[..., 1]


def _iou(a: np.ndarray, b: np.ndarray, fmt: str, identical_empty: bool) -> np.ndarray:
    """IoU of float64 boxes a and b (shapes [..., 4] that broadcast against each other)."""
    lt_a, rb_a, area_a = _corners(a, fmt)
    lt_b, rb_b, area_b = _corners(b, fmt)
    wh = np.minimum(rb_a, rb_b) - np.maximum(lt_a, lt_b)
    overlaps = (wh[..., 0] > 0) & (wh[..., 1] > 0)
    inter = np.where(overlaps, wh[..., 0] * wh[..., 1], 0.0)
    union = area_a + area_b - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(overlaps & (union > 0), inter / np.where(union > 0, union, 1.0), 0.0)
    if identical_empty:
        same = (union <= 0) & np.all(a == b, axis=-1)
        iou = np.where(same, 1.0, iou)
    return iou


def box_iou(a, b, fmt: str = "xyxy", identical_empty: bool = False) -> np.ndarray:
    """Pairwise IoU [N, M] of boxes a [N, 4] and b [M, 4] (``fmt`` xyxy: x0, y0, x1, y1;
    xywh: x, y, w, h as COCO/LVIS files hold them)."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    return _iou(a[:, None, :], b[None, :, :], fmt, identical_empty)


def box_iou_paired(a, b, fmt: str = "xyxy", identical_empty: bool = False) -> np.ndarray:
    """IoU [P] of paired boxes a[i], b[i] (both [P, 4]): the diagonal of :func:`box_iou`
    without computing the rest."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    if len(a) != len(b):
        raise ValueError(f"paired boxes need equal counts, got {len(a)} and {len(b)}")
    return _iou(a, b, fmt, identical_empty)
