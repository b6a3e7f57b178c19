"""The host's "ultralytics" mask paste against Ultralytics' own ``process_mask_native`` (its
predictor with ``retina_masks``): pixel-exact where both multiply the same logit maps."""

from __future__ import annotations

import itertools

import numpy as np

from yolo_models import IMGSZ  # noqa: F401  (sets YOLO_OFFLINE / YOLO_CONFIG_DIR)
from yolo_mask_reference import mask_ious, ultralytics_masks
from norcal.runtime.postprocess import ImageDetections, paste_masks
from norcal.runtime.proto_masks import _letterbox_geometry

# image shapes: letterbox padding on either axis, none, odd, extreme aspect; the upsampling
# factor Ultralytics picks covers 1, 2 and 4 over them (asserted below)
SHAPES = ((240, 320), (333, 500), (480, 360), (300, 300), (37, 1000), (1000, 37), (161, 97), (640, 640))


def _case(rng, h, w, nm):
    x0, y0 = rng.uniform(-0.2 * w, w, nm), rng.uniform(-0.2 * h, h, nm)
    boxes = np.stack([x0, y0, x0 + rng.uniform(0, w, nm), y0 + rng.uniform(0, h, nm)], 1).astype(np.float32)
    boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, w)
    boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, h)
    boxes[:3] = [[3, 4, 3, 9], [0, 0, w, h], [10, 7, 30, 21]]  # no area; the whole image; whole pixels
    return boxes


def test_pixel_exact_against_process_mask_native():
    rng = np.random.default_rng(0)
    nm, factors = 8, set()
    for side, (h, w) in itertools.product((96, 640), SHAPES):
        ph = side // 4
        protos = rng.normal(size=(nm, ph, ph)).astype(np.float32)
        coefs = np.eye(nm, dtype=np.float32)  # each map one prototype: the same floats on both sides
        boxes = _case(rng, h, w, nm)
        ours = paste_masks(coefs, boxes, (h, w), rule="ultralytics", protos=protos)
        theirs = ultralytics_masks(protos, coefs, boxes, (h, w))
        assert theirs[1].any() and not theirs[0].any()
        np.testing.assert_array_equal(ours, theirs)
        factors.add(_letterbox_geometry(ph, ph, h, w)[0])
    assert factors == {1, 2, 4}


def test_random_coefficients_and_the_threshold():
    """Mixed coefficients: the maps' float32 products may differ in the last bit between numpy
    and torch; measured: no pixel differs here. A threshold t keeps logits above logit(t)."""
    rng = np.random.default_rng(3)
    nm, ph, (h, w) = 32, 24, (333, 500)
    protos = rng.normal(size=(nm, ph, ph)).astype(np.float32)
    coefs = rng.normal(size=(12, nm)).astype(np.float32)
    boxes = _case(rng, h, w, 12)
    dets = ImageDetections(boxes, np.ones(12, np.float32), np.zeros(12, np.int64), coefs, (h, w),
                           mask_paste="ultralytics", mask_protos=protos)
    theirs = ultralytics_masks(protos, coefs, boxes, (h, w))
    assert (dets.masks() != theirs).sum() == 0
    shift = np.float32(np.log(0.8 / 0.2))  # logit(0.8), subtracted through the first prototype
    protos_t = np.concatenate([protos, np.ones((1, ph, ph), np.float32)])
    coefs_t = np.concatenate([coefs, np.full((12, 1), -shift, np.float32)], 1)
    high = dets.masks(0.8)
    assert (high <= dets.masks()).all() and high.sum() < theirs.sum()
    assert mask_ious(high, ultralytics_masks(protos_t, coefs_t, boxes, (h, w)))[1:].min() >= 0.999


def test_a_map_the_size_of_the_image_is_not_resized():
    """scale_masks returns a map of the image's own size as it is (no crop, no resize)."""
    rng = np.random.default_rng(4)
    for (h, w), ph in itertools.product(((96, 96), (384, 384)), (24, 96)):
        protos = rng.normal(size=(4, ph, ph)).astype(np.float32)
        boxes = _case(rng, h, w, 4)
        coefs = np.eye(4, dtype=np.float32)
        np.testing.assert_array_equal(paste_masks(coefs, boxes, (h, w), rule="ultralytics", protos=protos),
                                      ultralytics_masks(protos, coefs, boxes, (h, w)))
