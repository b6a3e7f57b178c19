"""Host-side postprocessing: model outputs -> detections in original image coordinates.

Numpy versions of detectron2's ``detector_postprocess`` (box rescale, clip, drop empty boxes)
and ``paste_masks_in_image`` (``_do_paste_mask``: ``grid_sample`` bilinear,
``align_corners=False``, zero padding, threshold 0.5), so inference needs no torch; torchvision
models' masks are pasted as torchvision's ``paste_masks_in_image`` pastes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from norcal.core.contract import MASK_PROTOS
from norcal.runtime.bilinear import interp_taps


@dataclass
class ImageDetections:
    """One image's detections in original image coordinates.

    boxes: float32 [N,4] (x0,y0,x1,y1); scores: float32 [N]; classes: int64 [N] (0-based);
    mask_probs: float32 [N,M,M] mask head probabilities (or [N,nm] coefficients, see
    ``mask_protos``) or None (box-only model);
    image_size: (h, w) of the original image.
    """

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    mask_probs: np.ndarray | None
    image_size: tuple[int, int]
    mask_paste: str = "detectron2"  # how the masks become image masks (norcal.core.contract.MASK_PASTE)
    mask_protos: np.ndarray | None = None  # "ultralytics": the prototypes [nm, h, w] (mask_probs: coefficients)

    def __len__(self) -> int:
        return len(self.boxes)

    def masks(self, threshold: float = 0.5) -> np.ndarray:
        """bool [N,H,W] full-image masks (memory: N*H*W bytes)."""
        if self.mask_probs is None:
            raise ValueError("this model has no mask output")
        return paste_masks(self.mask_probs, self.boxes, self.image_size, threshold, self.mask_paste,
                           self.mask_protos)


def rescale_boxes(boxes: np.ndarray, resized_hw, original_hw, clip: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Boxes [N,4] in resized coords -> (boxes [N,4] float32 in original coords, keep bool [N]).

    As ``detector_postprocess``: scale x by W/w and y by H/h (float32), clip to [0,W]x[0,H]
    (unless not ``clip``: Ultralytics' RT-DETR predictor); ``keep`` marks boxes that still have
    positive width and height (detectron2 drops the rest).
    """
    oh, ow = int(original_hw[0]), int(original_hw[1])
    rh, rw = int(resized_hw[0]), int(resized_hw[1])
    out = np.array(boxes, dtype=np.float32, copy=True).reshape(-1, 4)
    out[:, 0::2] *= np.float32(ow / rw)
    out[:, 1::2] *= np.float32(oh / rh)
    if clip:
        np.clip(out[:, 0::2], 0, ow, out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, oh, out=out[:, 1::2])
    keep = (out[:, 2] - out[:, 0] > 0) & (out[:, 3] - out[:, 1] > 0)
    return out, keep


def _axis_taps(lo: np.ndarray, hi: np.ndarray, start: np.ndarray, stop: np.ndarray, m: int):
    """Bilinear taps for many boxes on one axis, concatenated over pixels start[i]..stop[i]-1.

    grid_sample(align_corners=False) samples the mask at src = ((g+1)*m - 1)/2 with
    g = (p + 0.5 - lo) / (hi - lo) * 2 - 1 (float32). Returns (i0, i1, w0, w1) [sum(stop-start)]:
    cells floor(src) and floor(src)+1 (clipped into the mask) and their weights, 0 for a cell
    outside the mask (zero padding).
    """
    lengths = stop - start
    owner = np.repeat(np.arange(len(lo)), lengths)
    offsets = np.cumsum(lengths) - lengths
    p = (start[owner] + np.arange(lengths.sum()) - offsets[owner]).astype(np.float32) + np.float32(0.5)
    g = (p - lo[owner]) / (hi[owner] - lo[owner]) * np.float32(2) - np.float32(1)
    src = ((g + np.float32(1)) * np.float32(m) - np.float32(1)) / np.float32(2)
    f = np.floor(src)
    i0 = f.astype(np.int64)
    i1 = i0 + 1
    w0 = np.where((i0 >= 0) & (i0 < m), (f + np.float32(1)) - src, np.float32(0))
    w1 = np.where((i1 >= 0) & (i1 < m), src - f, np.float32(0))
    return np.clip(i0, 0, m - 1), np.clip(i1, 0, m - 1), w0, w1


def _torchvision_regions(masks: np.ndarray, boxes: np.ndarray, image_hw, threshold: float):
    """torchvision's ``paste_masks_in_image``: each mask padded by one zero cell, its box widened
    by (M+2)/M about its centre and cut to integers, the mask resized bilinearly onto the
    box's (w+1) x (h+1) pixels and pasted there, then ``> threshold``."""
    img_h, img_w = int(image_hw[0]), int(image_hw[1])
    m = masks.shape[-1]
    scale = np.float32((m + 2) / m)
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    half = (b[:, 2:] - b[:, :2]) * np.float32(0.5) * scale
    centre = (b[:, 2:] + b[:, :2]) * np.float32(0.5)
    ib = np.concatenate([centre - half, centre + half], 1).astype(np.int64)  # truncation, as .to(int64)
    for i in range(len(b)):
        x0, y0, x1, y1 = (int(v) for v in ib[i])
        w, h = max(x1 - x0 + 1, 1), max(y1 - y0 + 1, 1)
        ya, yb = max(y0, 0), min(y1 + 1, img_h)
        xa, xb = max(x0, 0), min(x1 + 1, img_w)
        if yb <= ya or xb <= xa:
            yield np.zeros((0, 0), bool), 0, 0
            continue
        mk = np.pad(np.asarray(masks[i], np.float32), 1)
        r0, r1, wy0, wy1 = (t[ya - y0:yb - y0] for t in interp_taps(m + 2, h))
        c0, c1, wx0, wx1 = (t[xa - x0:xb - x0] for t in interp_taps(m + 2, w))
        # torch's order: rows weight (columns weight * v + columns weight * v)
        top = wx0 * mk[r0][:, c0] + wx1 * mk[r0][:, c1]
        bottom = wx0 * mk[r1][:, c0] + wx1 * mk[r1][:, c1]
        probs = wy0[:, None] * top + wy1[:, None] * bottom
        yield probs > threshold, ya, xa


def paste_mask_regions(masks: np.ndarray, boxes: np.ndarray, image_hw, threshold: float = 0.5,
                       rule: str = "detectron2", protos: np.ndarray | None = None):
    """Paste masks [N,M,M] at boxes [N,4] (x0,y0,x1,y1, original coords); yields per mask
    (bool [h,w] region, y0, x0): the thresholded mask on image rows y0..y0+h, columns x0..x0+w.

    Every pixel outside a region is below threshold (detectron2's skip_empty region:
    floor(box)-1 .. ceil(box)+1 clipped to the image), so regions are the whole answer.
    ``rule`` "torchvision": as torchvision's ``paste_masks_in_image`` (:func:`_torchvision_regions`);
    "ultralytics": ``masks`` [N, nm] are coefficients over ``protos`` [nm, h, w]
    (:func:`norcal.runtime.proto_masks.proto_mask_regions`).
    """
    yield from _REGIONS_OF[rule](masks, boxes, image_hw, threshold, protos)


def _detectron2_regions(masks: np.ndarray, boxes: np.ndarray, image_hw, threshold: float):
    """detectron2's ``paste_masks_in_image`` (grid_sample of each mask over its box's region)."""
    img_h, img_w = int(image_hw[0]), int(image_hw[1])
    n, m = len(masks), masks.shape[-1]
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    xs = np.maximum(np.floor(b[:, 0]).astype(np.int64) - 1, 0)
    ys = np.maximum(np.floor(b[:, 1]).astype(np.int64) - 1, 0)
    xe = np.maximum(np.minimum(np.ceil(b[:, 2]).astype(np.int64) + 1, img_w), xs)
    ye = np.maximum(np.minimum(np.ceil(b[:, 3]).astype(np.int64) + 1, img_h), ys)
    # a box with no area (kept for Ultralytics models) has an empty mask, as Ultralytics' crop
    # gives it; an empty region also keeps its zero extent out of the taps' division
    empty = (b[:, 2] <= b[:, 0]) | (b[:, 3] <= b[:, 1])
    xe, ye = np.where(empty, xs, xe), np.where(empty, ys, ye)
    ty = _axis_taps(b[:, 1], b[:, 3], ys, ye, m)
    tx = _axis_taps(b[:, 0], b[:, 2], xs, xe, m)
    oy = np.cumsum(ye - ys) - (ye - ys)
    ox = np.cumsum(xe - xs) - (xe - xs)
    for i in range(n):
        sy = slice(oy[i], oy[i] + ye[i] - ys[i])
        sx = slice(ox[i], ox[i] + xe[i] - xs[i])
        a0, a1, wy0, wy1 = (t[sy] for t in ty)
        b0, b1, wx0, wx1 = (t[sx] for t in tx)
        mk = np.asarray(masks[i], np.float32)
        # grid_sample's grid is separable here and each pixel reads 2 cells per axis:
        # interpolate rows, then columns (gathers; no BLAS call per mask).
        rows = wy0[:, None] * mk[a0] + wy1[:, None] * mk[a1]
        probs = rows[:, b0] * wx0 + rows[:, b1] * wx1
        yield probs >= threshold, int(ys[i]), int(xs[i])


def _ultralytics_regions(coefs, boxes, image_hw, threshold, protos):
    from norcal.runtime.proto_masks import proto_mask_regions

    return proto_mask_regions(coefs, protos, boxes, image_hw, threshold)


# each norcal.core.contract.MASK_PASTES value's paste
_REGIONS_OF = {
    "detectron2": lambda masks, boxes, hw, threshold, _protos: _detectron2_regions(masks, boxes, hw, threshold),
    "torchvision": lambda masks, boxes, hw, threshold, _protos: _torchvision_regions(masks, boxes, hw, threshold),
    "ultralytics": _ultralytics_regions,
}


def paste_masks(masks: np.ndarray, boxes: np.ndarray, image_hw, threshold: float = 0.5,
                rule: str = "detectron2", protos: np.ndarray | None = None) -> np.ndarray:
    """Masks [N,M,M] + boxes [N,4] (original coords) -> bool [N,H,W], as ``paste_masks_in_image``
    (detectron2's, or as ``rule`` says: :func:`paste_mask_regions`)."""
    h, w = int(image_hw[0]), int(image_hw[1])
    out = np.zeros((len(masks), h, w), bool)
    for i, (region, y0, x0) in enumerate(paste_mask_regions(masks, boxes, (h, w), threshold, rule, protos)):
        out[i, y0:y0 + region.shape[0], x0:x0 + region.shape[1]] = region
    return out


def split_outputs(outputs: dict[str, np.ndarray], image_sizes: np.ndarray,
                  original_sizes: np.ndarray, keep_empty: bool = False,
                  mask_paste: str = "detectron2", clip_boxes: bool = True,
                  drop_empty_masks: bool = False) -> list[ImageDetections]:
    """Batched model outputs -> per-image :class:`ImageDetections` in original coordinates.

    outputs: num_detections int64 [B], boxes float32 [B,K,4] (resized coords), scores [B,K],
    classes int64 [B,K], optional masks float32 [B,K,M,M] (or [B,K,nm] with mask_protos
    [B,nm,h,w]: the "ultralytics" mask paste). Only the first num_detections[b]
    rows of image b are valid (EfficientNMS-style padding). Boxes left with no area by the
    clip are dropped (detectron2) unless ``keep_empty`` (Ultralytics keeps them); ``mask_paste``
    says whose paste the masks follow (:class:`ImageDetections`); ``clip_boxes`` False leaves
    the boxes unclipped (the model's :data:`norcal.core.contract.CLIP_BOXES`); ``drop_empty_masks``
    drops the detections whose pasted mask is empty (:data:`norcal.core.contract.DROP_EMPTY_MASKS`).
    """
    num = np.asarray(outputs["num_detections"]).reshape(-1)
    masks, protos = outputs.get("masks"), outputs.get(MASK_PROTOS)
    result = []
    for b in range(len(image_sizes)):
        n = int(num[b])
        boxes, keep = rescale_boxes(outputs["boxes"][b, :n], image_sizes[b], original_sizes[b], clip_boxes)
        if keep_empty:
            keep = np.ones(len(boxes), bool)
        result.append(ImageDetections(
            boxes=boxes[keep],
            scores=np.asarray(outputs["scores"][b, :n], np.float32)[keep],
            classes=np.asarray(outputs["classes"][b, :n], np.int64)[keep],
            mask_probs=None if masks is None else np.asarray(masks[b, :n], np.float32)[keep],
            image_size=(int(original_sizes[b][0]), int(original_sizes[b][1])),
            mask_paste=mask_paste,
            mask_protos=None if protos is None else np.asarray(protos[b], np.float32),
        ))
        if drop_empty_masks and result[-1].mask_probs is not None:
            result[-1] = _with_masks_only(result[-1])
    return result


def _with_masks_only(det: ImageDetections, threshold: float = 0.5) -> ImageDetections:
    """``det`` without the detections whose mask, pasted at ``threshold``, has no pixel."""
    if not len(det):
        return det
    keep = np.array([region.any() for region, _, _ in paste_mask_regions(
        det.mask_probs, det.boxes, det.image_size, threshold, det.mask_paste, det.mask_protos)], bool)
    if keep.all():
        return det
    return ImageDetections(det.boxes[keep], det.scores[keep], det.classes[keep], det.mask_probs[keep],
                           det.image_size, det.mask_paste, det.mask_protos)
