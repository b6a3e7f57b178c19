"""Boundary IoU (Cheng et al., CVPR 2021), as LVIS Challenge 2021 evaluates masks with it.

A mask's boundary region is the band of its pixels within d of its contour, d = 2% of the
image diagonal (``max(1, round(0.02 * sqrt(h^2 + w^2)))`` pixels): the mask minus its
erosion by a (2d+1) x (2d+1) square, with everything outside the image counted as
background (so a mask cut by the image border has a boundary along it). Boundary AP matches
detections to GTs with min(mask IoU, IoU of the two bands), as the paper's evaluation does.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

DILATION_RATIO = 0.02
# pixels decoded at once: the (h, w, n) mask and band buffers stay at 64 MB each
_CHUNK_PIXELS = 1 << 26


def band_width(height: int, width: int, ratio: float = DILATION_RATIO) -> int:
    """d in pixels for an image of ``height`` x ``width``: ratio x diagonal, rounded, >= 1."""
    return max(1, int(round(ratio * math.sqrt(height ** 2 + width ** 2))))


def _erode_axis(m: np.ndarray, d: int, axis: int) -> np.ndarray:
    """Erosion by a 2d+1 window along ``axis``; beyond the array is background."""
    outside = (~m).astype(np.int32)
    pad = [(0, 0), (0, 0)]
    pad[axis] = (d + 1, d)  # one extra leading zero makes the cumulative sum's origin
    cs = np.cumsum(np.pad(outside, pad, constant_values=1), axis=axis)
    cs = np.moveaxis(cs, axis, 0)
    cs[0] = 0
    holes = cs[2 * d + 1:] - cs[:-2 * d - 1]  # background pixels in each window
    return np.moveaxis(holes == 0, 0, axis)


def boundary_band(mask: np.ndarray, d: int) -> np.ndarray:
    """The boundary region of a 2-D mask: its pixels with background (or the image's edge)
    within Chebyshev distance ``d``."""
    m = np.asarray(mask).astype(bool)
    if m.ndim != 2 or d < 1:
        raise ValueError(f"boundary_band takes a 2-D mask and d >= 1, got shape {m.shape}, d {d}")
    if not m.any():
        return m
    # a square erosion is a row erosion, then a column erosion
    inner = _erode_axis(_erode_axis(m, d, 0), d, 1)
    return m & ~inner


def boundary_rles(rles: Sequence[dict], ratio: float = DILATION_RATIO) -> list[dict]:
    """The boundary region of each compressed RLE mask, as a compressed RLE of the same size."""
    import pycocotools.mask as mask_utils

    out: list[dict | None] = [None] * len(rles)
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, r in enumerate(rles):
        by_size.setdefault((int(r["size"][0]), int(r["size"][1])), []).append(i)
    for (h, w), idx in by_size.items():
        d = band_width(h, w, ratio)
        chunk = max(1, _CHUNK_PIXELS // max(h * w, 1))
        for s in range(0, len(idx), chunk):
            part = idx[s:s + chunk]
            group = [rles[i] for i in part]
            masks = mask_utils.decode(group)  # [h, w, n], Fortran order
            boxes = np.asarray(mask_utils.toBbox(group), dtype=np.float64).reshape(-1, 4)
            bands = np.zeros_like(masks)
            for j, (x, y, bw, bh) in enumerate(boxes):
                if bw <= 0 or bh <= 0:
                    continue
                # the band lies inside the mask's box; outside it, inside the image, is background too
                x0, y0, x1, y1 = int(x), int(y), int(x + bw), int(y + bh)
                bands[y0:y1, x0:x1, j] = boundary_band(masks[y0:y1, x0:x1, j], d)
            for i, r in zip(part, mask_utils.encode(bands)):
                out[i] = r
    return out  # type: ignore[return-value]


__all__ = ["DILATION_RATIO", "band_width", "boundary_band", "boundary_rles"]
