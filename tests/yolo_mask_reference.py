"""Ultralytics' segment masks as our contract carries them, computed from Ultralytics' own
prototypes and coefficients apart from our graph's code.

Our masks are box-relative M x M grids (M 28): each bin holds the sigmoid of the mean, over that
bin of the box, of Ultralytics' logit map coefficients . prototypes as its ``process_mask``
upsamples it (bilinear, half-pixel, edge values beyond the border). Here that mean is the
trapezoid rule on the map's linear pieces between prototype centres (exact for a piecewise-
linear function), not the graph's closed-form antiderivative (``yolo_graph.bin_weights``).
"""

from __future__ import annotations

import numpy as np


def _bin_means(lo: float, hi: float, n: int, m: int) -> np.ndarray:
    """[m, n]: row j holds the mean over bin j of [lo, hi] (m equal bins, prototype units, pixel
    i's centre at i) of each of the n prototype pixels' bilinear hat, held beyond the border."""
    knots = np.arange(n, dtype=np.float64)
    edges = lo + (hi - lo) * np.arange(m + 1, dtype=np.float64) / m
    w = np.zeros((m, n))
    if hi <= lo:  # a box with no extent: an empty mask
        return w
    for j in range(m):
        a, b = edges[j], edges[j + 1]
        xs = np.concatenate([[a], knots[(knots > a) & (knots < b)], [b]])
        hat = np.maximum(0.0, 1.0 - np.abs(np.clip(xs, 0.0, n - 1.0)[:, None] - knots))
        w[j] = np.trapezoid(hat, xs, axis=0) / (b - a)
    return w


def mask_grids(protos: np.ndarray, coefs: np.ndarray, boxes: np.ndarray, size: int, m: int = 28) -> np.ndarray:
    """[n, m, m] float64 probabilities: for each detection (``coefs`` [n, nm], ``boxes`` [n, 4]
    x0,y0,x1,y1 in the ``size`` square's pixels) the sigmoid of its logit map's mean over each
    of its box's m x m bins (``protos`` [nm, h, w], stride size / h)."""
    nm, ph, pw = protos.shape
    maps = (np.asarray(coefs, np.float64) @ protos.reshape(nm, -1)).reshape(-1, ph, pw)
    out = np.zeros((len(maps), m, m))
    for i, (x0, y0, x1, y1) in enumerate(np.asarray(boxes, np.float64)):
        wy = _bin_means(y0 * ph / size - 0.5, y1 * ph / size - 0.5, ph, m)
        wx = _bin_means(x0 * pw / size - 0.5, x1 * pw / size - 0.5, pw, m)
        out[i] = wy @ maps[i] @ wx.T
    return 1.0 / (1.0 + np.exp(-out))
