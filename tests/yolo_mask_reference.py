"""Ultralytics' own image masks of given detections: its predictor's with ``retina_masks``
(``ultralytics.utils.ops.process_mask_native``), the reference for our "ultralytics" mask paste."""

from __future__ import annotations

import numpy as np


def ultralytics_masks(protos, coefs, boxes, image_hw) -> np.ndarray:
    """bool [n, H, W]: Ultralytics' masks of detections with mask coefficients ``coefs`` [n, nm]
    and boxes [n, 4] (x0,y0,x1,y1, original image pixels) over ``protos`` [nm, h, w]."""
    import torch
    from ultralytics.utils import ops

    masks = ops.process_mask_native(torch.as_tensor(np.asarray(protos, np.float32)),
                                    torch.as_tensor(np.asarray(coefs, np.float32)),
                                    torch.as_tensor(np.array(boxes, np.float32)), tuple(int(v) for v in image_hw))
    return masks.numpy().astype(bool)


def mask_ious(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of each pair of bool masks [n, H, W] (1 where both are empty)."""
    inter = (a & b).sum(axis=(1, 2))
    union = (a | b).sum(axis=(1, 2))
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)
