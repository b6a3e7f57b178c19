"""Ultralytics' LetterBox as pixel arithmetic (norcal.core.contract RESIZE = "letterbox").

Both the host (``norcal.runtime.preprocess``) and the Ultralytics family's tuning pass
(``norcal.export.families``) prepare images this way, so it lives here, below both. The resize
is cv2.INTER_LINEAR's, whose uint8 fixed-point arithmetic :func:`resize_linear_uint8`
reproduces bit for bit in numpy (no OpenCV needed at run time).
"""

from __future__ import annotations

import numpy as np

from norcal.core.errors import NorcalError


def letterbox_size(h: int, w: int, size: int) -> tuple[int, int]:
    """(new_h, new_w) of Ultralytics' LetterBox to a ``size`` square: scale min(S/h, S/w),
    Python's round, each side at least 1 pixel."""
    r = min(size / h, size / w)
    return max(round(h * r), 1), max(round(w * r), 1)


def letterbox_offset(new_h: int, new_w: int, size: int) -> tuple[int, int]:
    """(top, left) padding of a centred letterbox: LetterBox's round(d/2 - 0.1) for an
    integer d is d // 2 (the graph computes the same from image_sizes)."""
    return (size - new_h) // 2, (size - new_w) // 2


_COEF_BITS = 11  # cv2's INTER_RESIZE_COEF_BITS: weights are shorts summing to 2048


def _linear_taps(src: int, dst: int, clamp_weights: bool):
    f = ((np.arange(dst) + 0.5) * (1.0 / (dst / src)) - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = f - s
    if clamp_weights:  # horizontally cv2 moves an outside tap onto the edge pixel, weight 1
        lo, hi = s < 0, s >= src - 1
        f[lo | hi] = 0
        s[lo], s[hi] = 0, src - 1
    w0 = np.rint((1 - f) * (1 << _COEF_BITS)).astype(np.int64)
    return np.clip(s, 0, src - 1), np.clip(s + 1, 0, src - 1), w0, (1 << _COEF_BITS) - w0


def resize_linear_uint8(image: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """uint8 [H,W,C] -> uint8 [new_h,new_w,C] equal to cv2.resize(..., INTER_LINEAR).

    cv2 computes half-pixel-centred taps in float32, rounds the weights to 11-bit shorts,
    sums each row horizontally in integers, then blends two rows with its SIMD kernel:
    ((row0 >> 4) * b0 >> 16) + ((row1 >> 4) * b1 >> 16), rounded by (+2) >> 2. Vertically an
    outside tap reads the edge row with its unclamped weight; horizontally the weight moves."""
    h, w = image.shape[:2]
    if (h, w) == (new_h, new_w):
        return image
    x0, x1, a0, a1 = _linear_taps(w, new_w, True)
    y0, y1, b0, b1 = _linear_taps(h, new_h, False)
    im = image.astype(np.int64)
    rows = im[:, x0] * a0[None, :, None] + im[:, x1] * a1[None, :, None]
    v = (((rows[y0] >> 4) * b0[:, None, None]) >> 16) + (((rows[y1] >> 4) * b1[:, None, None]) >> 16)
    return np.clip((v + 2) >> 2, 0, 255).astype(np.uint8)


def letterbox_images(images_rgb: list[np.ndarray], size: int, fmt: str = "RGB",
                     pad_value: int = 114) -> tuple[np.ndarray, np.ndarray]:
    """RGB uint8 [H,W,3] images -> (float32 [B,3,size,size] in ``fmt`` order, int64 [B,2]
    resized (h, w)): each resized to fit, centred, the rest ``pad_value``."""
    if fmt not in ("BGR", "RGB"):
        raise NorcalError(f"channel format must be BGR or RGB, got {fmt!r}")
    out = np.full((len(images_rgb), 3, size, size), float(pad_value), np.float32)
    sizes = []
    for b, img in enumerate(images_rgb):
        nh, nw = letterbox_size(img.shape[0], img.shape[1], size)
        top, left = letterbox_offset(nh, nw, size)
        chw = resize_linear_uint8(img, nh, nw).transpose(2, 0, 1)
        out[b, :, top:top + nh, left:left + nw] = chw[::-1] if fmt == "BGR" else chw
        sizes.append((nh, nw))
    return out, np.array(sizes, np.int64).reshape(-1, 2)
