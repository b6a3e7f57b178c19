"""Host-side preprocessing: the model's resize rule (norcal.core.contract.RESIZE), channel
order, batching.

"shortest_edge": detectron2's test-time ResizeShortestEdge. detectron2 resizes uint8 images
with PIL's bilinear filter (``ResizeTransform.apply_image``), so this module does too: the
pixels match detectron2 exactly. The graph normalises and zeroes the padding itself (see
docs/architecture.md, "The ONNX contract"), so the host pads raw pixels with zeros.

"letterbox": Ultralytics' LetterBox (fixed square, aspect kept, centred, grey padding). It
resizes with cv2.INTER_LINEAR, whose uint8 fixed-point arithmetic :func:`resize_linear_uint8`
reproduces bit for bit in numpy (no OpenCV needed at run time).

"torchvision": torchvision's GeneralizedRCNNTransform (Faster / Mask R-CNN): the scale in float32,
floor of each side, bilinear interpolation of the float pixels as ``F.interpolate`` computes it
(:func:`resize_bilinear_float`, float32, torch's operation order; no uint8 rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from norcal.core.contract import RESIZE_STRETCH, RESIZE_TORCHVISION, Preprocessing
from norcal.core.errors import NorcalError
from norcal.core.letterbox import letterbox_images, letterbox_offset, letterbox_size, resize_linear_uint8  # noqa: F401


def resized_size(h: int, w: int, min_size: int, max_size: int) -> tuple[int, int]:
    """(new_h, new_w) of detectron2's ``ResizeShortestEdge.get_output_shape``.

    The short edge goes to ``min_size`` unless the long edge would then exceed ``max_size``.
    """
    size = float(min_size)
    scale = size / min(h, w)
    if h < w:
        newh, neww = size, scale * w
    else:
        newh, neww = scale * h, size
    if max(newh, neww) > max_size:
        scale = max_size * 1.0 / max(newh, neww)
        newh, neww = newh * scale, neww * scale
    return int(newh + 0.5), int(neww + 0.5)


def torchvision_size(h: int, w: int, min_size: int, max_size: int) -> tuple[int, int]:
    """(new_h, new_w) of torchvision's ``_resize_image_and_masks`` (eager): the scale
    min(min_size / short, max_size / long) and each side floor(side * scale), in double
    (``F.interpolate``'s output size with ``recompute_scale_factor``)."""
    scale = min(min_size / min(h, w), max_size / max(h, w))
    return int(math.floor(h * scale)), int(math.floor(w * scale))


def _linear_taps(n_in: int, n_out: int):
    """Source indices and weights of torch's linear upsampling along one axis (align_corners
    False, the scale recomputed as n_in / n_out), in float32 as torch computes them."""
    scale = np.float32(n_in) / np.float32(n_out)
    # torch's compiled kernel fuses scale * (i + 0.5) - 0.5 into one multiply-add: one rounding
    src = (np.float64(scale) * (np.arange(n_out) + 0.5) - 0.5).astype(np.float32)
    src = np.maximum(src, np.float32(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam1 = np.clip(src - i0.astype(np.float32), 0, 1).astype(np.float32)
    i1 = np.where(i0 < n_in - 1, i0 + 1, i0)
    return i0, i1, (np.float32(1) - lam1).astype(np.float32), lam1


def resize_bilinear_float(image: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """[H, W, C] pixels -> float32 [new_h, new_w, C] as torch's ``F.interpolate(mode="bilinear",
    align_corners=False)`` with a recomputed scale: rows' weights outside, columns' inside."""
    x = image.astype(np.float32)
    y0, y1, wy0, wy1 = _linear_taps(x.shape[0], new_h)
    x0, x1, wx0, wx1 = _linear_taps(x.shape[1], new_w)
    wx0, wx1 = wx0[None, :, None], wx1[None, :, None]
    top = x[y0][:, x0] * wx0 + x[y0][:, x1] * wx1
    bottom = x[y1][:, x0] * wx0 + x[y1][:, x1] * wx1
    return top * wy0[:, None, None] + bottom * wy1[:, None, None]


def resize_problem(h: int, w: int, min_size: int, max_size: int, rule: str = "shortest_edge") -> str | None:
    """Why an h x w image cannot be resized for the model (a side would round to 0 pixels:
    a 10000x1 strip at max_size 1333), or None."""
    nh, nw = _SIZE_OF[rule](h, w, min_size, max_size)
    if nh >= 1 and nw >= 1:
        return None
    return (f"{w}x{h} pixels would resize to {nw}x{nh} (short edge {min_size}, long edge at most "
            f"{max_size}): a side under 1 pixel")


def resize_uint8(image: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """uint8 [H,W,C] -> uint8 [new_h,new_w,C] with PIL bilinear, exactly as detectron2 does."""
    from PIL import Image

    if image.shape[:2] == (new_h, new_w):
        return image
    if image.ndim == 3 and image.shape[2] == 1:
        out = Image.fromarray(image[:, :, 0], mode="L").resize((new_w, new_h), Image.BILINEAR)
        return np.asarray(out)[:, :, None]
    return np.asarray(Image.fromarray(image).resize((new_w, new_h), Image.BILINEAR))


@dataclass
class Batch:
    """One model input batch and what is needed to map outputs back.

    images: float32 [B,3,H,W] (H, W multiples of the divisibility; zero padding);
    image_sizes: int64 [B,2] resized (h, w) of each image before padding;
    original_sizes: int64 [B,2] (h, w) of each image as read;
    keep_empty_boxes: keep detections whose clipped box has no area (Ultralytics' letterbox and
    stretch models, as Ultralytics keeps them; detectron2 and torchvision drop them);
    mask_paste: whose mask paste the detections follow ("torchvision" for torchvision's resize);
    clip_boxes: the boxes are clipped to the original image (the model's preprocessing says).
    """

    images: np.ndarray
    image_sizes: np.ndarray
    original_sizes: np.ndarray
    keep_empty_boxes: bool = False
    mask_paste: str = "detectron2"
    clip_boxes: bool = True

    def feeds(self) -> dict[str, np.ndarray]:
        return {"images": self.images, "image_sizes": self.image_sizes}

    def __len__(self) -> int:
        return len(self.images)


def _check_image(i: int, image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 \
            or image.shape[2] != 3:
        desc = f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray) else type(image).__name__
        raise NorcalError(f"image {i}: expected RGB uint8 [H,W,3], got {desc}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise NorcalError(f"image {i}: empty ({image.shape[0]}x{image.shape[1]})")


def prepare_batch(images_rgb: list[np.ndarray], spec: Preprocessing) -> Batch:
    """RGB uint8 [H,W,3] images -> one float32 batch per the ONNX contract, as the model's
    resize rule (``spec.resize``) prepares them; the batch carries what maps its outputs back
    (the rule's empty-box and mask-paste defaults, the model's box clipping)."""
    if not images_rgb:
        raise NorcalError("prepare_batch needs at least one image")
    if spec.input_format not in ("BGR", "RGB"):
        raise NorcalError(f"channel format must be BGR or RGB, got {spec.input_format!r}")
    for i, img in enumerate(images_rgb):
        _check_image(i, img)
    batch = _BATCH_OF[spec.resize](images_rgb, spec)
    rule = spec.rule
    batch.keep_empty_boxes, batch.mask_paste, batch.clip_boxes = rule.keeps_empty_boxes, rule.mask_paste, spec.clip_boxes
    return batch


def _padded_batch(images_rgb: list[np.ndarray], spec: Preprocessing) -> Batch:
    """The edge rules ("shortest_edge", "torchvision"): each image resized by its rule, put in
    the spec's channel order, and zero-padded at the bottom/right to the batch's largest size
    rounded up to a multiple of the divisibility, as detectron2's ``ImageList.from_tensors``."""
    size_of, resize = _SIZE_OF[spec.resize], _RESIZE_OF[spec.resize]
    resized = []
    for i, img in enumerate(images_rgb):
        problem = resize_problem(img.shape[0], img.shape[1], spec.min_size, spec.max_size, spec.resize)
        if problem:
            raise NorcalError(f"image {i}: {problem}")
        resized.append(resize(img, *size_of(img.shape[0], img.shape[1], spec.min_size, spec.max_size)))
    d = max(int(spec.divisibility), 1)
    H = -(-max(r.shape[0] for r in resized) // d) * d
    W = -(-max(r.shape[1] for r in resized) // d) * d
    out = np.zeros((len(resized), 3, H, W), np.float32)
    for b, r in enumerate(resized):
        chw = r.transpose(2, 0, 1)
        out[b, :, : r.shape[0], : r.shape[1]] = chw[::-1] if spec.input_format == "BGR" else chw
    return Batch(
        images=out,
        image_sizes=np.array([r.shape[:2] for r in resized], np.int64).reshape(-1, 2),
        original_sizes=np.array([im.shape[:2] for im in images_rgb], np.int64).reshape(-1, 2),
    )


def letterbox_batch(images_rgb: list[np.ndarray], size: int, fmt: str = "RGB", pad_value: int = 114) -> Batch:
    """RGB uint8 [H,W,3] images -> float32 [B,3,size,size], each as Ultralytics' LetterBox
    (auto=False, centre=True) makes it; image_sizes holds each resized (h, w) before padding."""
    if not images_rgb:
        raise NorcalError("prepare_batch needs at least one image")
    for i, img in enumerate(images_rgb):
        _check_image(i, img)
    images, sizes = letterbox_images(images_rgb, size, fmt, pad_value)
    return Batch(images=images, image_sizes=sizes,
                 original_sizes=np.array([im.shape[:2] for im in images_rgb], np.int64).reshape(-1, 2),
                 keep_empty_boxes=True)


def prepare_stretch_batch(images_rgb: list[np.ndarray], height: int, width: int,
                          fmt: str = "RGB") -> Batch:
    """RGB uint8 [H,W,3] images -> one float32 batch [B,3,height,width] for a model whose
    metadata says ``norcal.resize`` = stretch (Ultralytics RT-DETR): each image resized to
    exactly height x width (aspect ratio not kept, no padding; :func:`resize_linear_uint8`) and
    put in ``fmt`` channel order, 0-255 (the graph divides by 255). ``image_sizes`` are all
    (height, width): boxes come back in that frame and map to the original per axis."""
    if not images_rgb:
        raise NorcalError("prepare_stretch_batch needs at least one image")
    if fmt not in ("BGR", "RGB"):
        raise NorcalError(f"channel format must be BGR or RGB, got {fmt!r}")
    if height <= 0 or width <= 0:
        raise NorcalError(f"stretch size must be positive, got {height}x{width}")
    out = np.zeros((len(images_rgb), 3, height, width), np.float32)
    for b, img in enumerate(images_rgb):
        _check_image(b, img)
        chw = resize_linear_uint8(img, height, width).transpose(2, 0, 1)
        out[b] = chw[::-1] if fmt == "BGR" else chw
    return Batch(
        images=out,
        image_sizes=np.array([[height, width]] * len(images_rgb), np.int64).reshape(-1, 2),
        original_sizes=np.array([im.shape[:2] for im in images_rgb], np.int64).reshape(-1, 2),
        keep_empty_boxes=True,
    )


# Each rule's host resize (its contract facts: norcal.core.contract.RESIZE_RULE_TABLE). The new
# (h, w) of an h x w image given (min_size, max_size); a square rule's sizes are its square's.
_SIZE_OF = {
    "shortest_edge": resized_size,
    "letterbox": lambda h, w, size, _max: letterbox_size(h, w, size),
    RESIZE_STRETCH: lambda h, w, size, _max: (size, size),
    RESIZE_TORCHVISION: torchvision_size,
}
# the edge rules' pixel resize: detectron2's PIL uint8 bilinear; torchvision's float bilinear
_RESIZE_OF = {"shortest_edge": resize_uint8, RESIZE_TORCHVISION: resize_bilinear_float}
_BATCH_OF = {
    "shortest_edge": _padded_batch,
    "letterbox": lambda images, spec: letterbox_batch(images, spec.input_size, spec.input_format, spec.pad_value),
    RESIZE_STRETCH: lambda images, spec: prepare_stretch_batch(images, spec.input_size, spec.input_size,
                                                               spec.input_format),
    RESIZE_TORCHVISION: _padded_batch,
}
