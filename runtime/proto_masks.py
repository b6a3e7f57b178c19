"""Image masks from prototypes and per-detection coefficients (the contract's "ultralytics"
mask paste), as Ultralytics' predictor makes them with ``retina_masks`` (``process_mask_native``).

A detection's logit map is its coefficients . the prototypes [nm, h, w] (stride 4 over the
letterboxed input). It is upsampled bilinearly by f (1, 2 or 4: the least factor that puts the
letterbox padding on whole pixels), the padding cut off (``scale_masks``), resized bilinearly to
the original image, kept where > logit(threshold) (0 at 0.5: Ultralytics' ``> 0``) and inside
the box as ``crop_mask`` keeps it (columns x0 <= c < x1, rows y0 <= r < y1). Only the box's
pixels are computed, with torch's float32 bilinear arithmetic (:func:`interp_taps`), so a
region equals the same pixels of Ultralytics' full-image mask.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from norcal.runtime.bilinear import interp_taps


def _letterbox_geometry(ph: int, pw: int, img_h: int, img_w: int) -> tuple[int, int, int, int, int]:
    """(f, top, left, height, width): the upsampling factor and the content's rows and columns
    in the f-upsampled map, as ``process_mask_native`` and ``scale_masks`` compute them."""
    gain = min(4 * ph / img_h, 4 * pw / img_w)
    pad = (4 * ph - max(round(img_h * gain), 1)) | (4 * pw - max(round(img_w * gain), 1))
    f = 4 // math.gcd(4, pad | pad // 2)
    uh, uw = ph * f, pw * f
    if (uh, uw) == (img_h, img_w):  # scale_masks leaves a map of the image's size as it is
        return f, 0, 0, uh, uw
    gain = min(uh / img_h, uw / img_w)
    ch, cw = max(round(img_h * gain), 1), max(round(img_w * gain), 1)
    top, left = round((uh - ch) / 2 - 0.1), round((uw - cw) / 2 - 0.1)
    return f, top, left, ch, cw


@functools.lru_cache(maxsize=32)
def _taps(n_in: int, n_out: int) -> tuple[np.ndarray, ...]:
    """:func:`interp_taps`, made once per axis (every detection of an image reads the same), read-only."""
    taps = interp_taps(n_in, n_out)
    for t in taps:
        t.flags.writeable = False
    return taps


def _axis(n_proto: int, f: int, start: int, size: int, n_img: int, lo: int, hi: int):
    """For image pixels lo..hi-1 on one axis: the prototype cells and weights of the f-upsampling
    at the upsampled cells those pixels read, and the image pixels' taps into those cells."""
    r0, r1, w0, w1 = (t[lo:hi] for t in _taps(size, n_img))
    r0, r1 = r0 + start, r1 + start  # content rows of the f-upsampled map
    need = np.unique(np.concatenate([r0, r1]))
    if f > 1:
        p0, p1, v0, v1 = (t[need] for t in _taps(n_proto, n_proto * f))
    else:
        p0, p1, v0, v1 = need, need, np.ones(len(need), np.float32), np.zeros(len(need), np.float32)
    return (p0, p1, v0, v1), (np.searchsorted(need, r0), np.searchsorted(need, r1), w0, w1)


def _bilinear(grid: np.ndarray, rows, cols) -> np.ndarray:
    """torch's bilinear sum on gathered taps: columns first, then rows, in float32."""
    a0, a1, wy0, wy1 = rows
    b0, b1, wx0, wx1 = cols
    across = grid[:, b0] * wx0 + grid[:, b1] * wx1
    return wy0[:, None] * across[a0] + wy1[:, None] * across[a1]


def proto_maps(coefs: np.ndarray, protos: np.ndarray) -> np.ndarray:
    """Each detection's logit map [N, h, w]: its coefficients ``coefs`` [N, nm] . ``protos`` [nm, h, w]."""
    nm, ph, pw = protos.shape
    return (np.asarray(coefs, np.float32) @ np.asarray(protos, np.float32).reshape(nm, -1)).reshape(-1, ph, pw)


def proto_mask_regions(coefs: np.ndarray, protos: np.ndarray, boxes: np.ndarray, image_hw,
                       threshold: float = 0.5):
    """Masks of detections (``coefs`` [N, nm], ``boxes`` [N, 4] x0,y0,x1,y1 in original
    coordinates) over ``protos`` [nm, h, w]; yields per detection (bool region, y0, x0) as
    :func:`norcal.runtime.postprocess.paste_mask_regions` does (every pixel outside is False)."""
    yield from map_regions(proto_maps(coefs, protos), boxes, image_hw, threshold)


def region_taps(maps_hw, boxes: np.ndarray, image_hw) -> list:
    """Per detection (boxes [N, 4] in original coordinates) over logit maps of ``maps_hw``: None
    where its crop is empty, else (y0, x0, f, the rows' and the columns' taps (:func:`_axis`))."""
    img_h, img_w = int(image_hw[0]), int(image_hw[1])
    ph, pw = int(maps_hw[0]), int(maps_hw[1])
    f, top, left, ch, cw = _letterbox_geometry(ph, pw, img_h, img_w)
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    # crop_mask keeps pixel index c where x0 <= c < x1: c from ceil(x0) to ceil(x1) - 1
    xa = np.clip(np.ceil(b[:, 0]), 0, img_w).astype(np.int64)
    xb = np.clip(np.ceil(b[:, 2]), 0, img_w).astype(np.int64)
    ya = np.clip(np.ceil(b[:, 1]), 0, img_h).astype(np.int64)
    yb = np.clip(np.ceil(b[:, 3]), 0, img_h).astype(np.int64)
    return [None if xb[i] <= xa[i] or yb[i] <= ya[i] else
            (int(ya[i]), int(xa[i]), f, _axis(ph, f, top, ch, img_h, ya[i], yb[i]),
             _axis(pw, f, left, cw, img_w, xa[i], xb[i])) for i in range(len(b))]


def read_bytes(m: np.ndarray, taps) -> bytes:
    """The cells of its logit map ``m`` a detection's region reads (its :func:`region_taps` entry,
    not None; rows and columns included) as bytes: two detections with equal ones and equal boxes
    have equal regions."""
    _, _, _, (up_rows, _), (up_cols, _) = taps
    rows, cols = np.union1d(up_rows[0], up_rows[1]), np.union1d(up_cols[0], up_cols[1])
    return m[np.ix_(rows, cols)].tobytes() + rows.tobytes() + cols.tobytes()


def map_regions(maps: np.ndarray, boxes: np.ndarray, image_hw, threshold: float = 0.5, taps: list | None = None):
    """:func:`proto_mask_regions` from the detections' logit maps (:func:`proto_maps`) [N, h, w];
    each region depends on its own box and on its map's :func:`read_bytes` only. ``taps``: the
    boxes' :func:`region_taps` where already made."""
    # probability > threshold is logit > logit(threshold); Ultralytics' "> 0" at 0.5
    cut = -math.inf if threshold <= 0 else math.inf if threshold >= 1 else math.log(threshold / (1 - threshold))
    for m, t in zip(maps, region_taps(maps.shape[1:], boxes, image_hw) if taps is None else taps):
        if t is None:
            yield np.zeros((0, 0), bool), 0, 0
            continue
        y0, x0, f, (up_rows, rows), (up_cols, cols) = t
        upsampled = _bilinear(m, up_rows, up_cols) if f > 1 else m[np.ix_(up_rows[0], up_cols[0])]
        yield _bilinear(upsampled, rows, cols) > cut, y0, x0
