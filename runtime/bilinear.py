"""torch's float32 bilinear resize (``F.interpolate(mode="bilinear", align_corners=False)``),
one axis at a time, for host code that must reproduce torch's pixels exactly."""

from __future__ import annotations

import numpy as np


def interp_taps(n_in: int, n_out: int):
    """``F.interpolate(mode="bilinear", align_corners=False)`` along one axis, as torch's CPU
    kernel computes it in float32: source cells i0, i1 and their weights per output pixel."""
    scale = np.float32(n_in) / np.float32(n_out)
    src = np.maximum(scale * (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5),
                     np.float32(0))
    i0 = np.floor(src).astype(np.int64)
    i1 = i0 + (i0 < n_in - 1)
    l1 = np.clip(src - i0.astype(np.float32), np.float32(0), np.float32(1))
    return i0, i1, np.float32(1) - l1, l1
