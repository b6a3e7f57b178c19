"""The letterbox rule against Ultralytics' own LetterBox (and OpenCV's resize it calls)."""

import yolo_models  # noqa: F401 - imports Ultralytics offline, leaving PIL unpatched

from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from ultralytics.data.augment import LetterBox  # noqa: E402

from norcal.core.contract import input_spec, letterbox_preprocessing  # noqa: E402
from norcal.runtime.inference import prepare  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from norcal.runtime.preprocess import letterbox_size, prepare_batch, resize_linear_uint8  # noqa: E402

TINY = Path(__file__).parents[1] / "fixtures" / "d2_lvis_tiny" / "images"
SHAPES = [(37, 53, 64, 92), (33, 47, 99, 141), (123, 77, 160, 100), (100, 80, 64, 51), (480, 640, 120, 160),
          (100, 80, 50, 40), (1, 5, 3, 7), (7, 1, 20, 2), (3, 1000, 1, 160), (200, 300, 107, 160)]


@pytest.mark.parametrize("h,w,nh,nw", SHAPES)
def test_resize_equals_opencv_inter_linear(h, w, nh, nw):
    img = np.random.default_rng(h * 1000 + w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    ref = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(resize_linear_uint8(img, nh, nw), ref)


def _ultralytics(img_rgb, size):
    return LetterBox((size, size), auto=False, center=True)(image=img_rgb.copy())


@pytest.mark.parametrize("size", [64, 160])
def test_letterbox_batch_equals_ultralytics(size):
    rng = np.random.default_rng(size)
    imgs = [read_rgb(p) for p in sorted(TINY.glob("*.png"))[:3]]
    imgs += [rng.integers(0, 256, s, dtype=np.uint8) for s in ((31, 90, 3), (90, 31, 3), (size, size, 3))]
    spec = letterbox_preprocessing(size)
    batch = prepare(imgs, spec)
    assert batch.images.shape == (len(imgs), 3, size, size) and batch.images.dtype == np.float32
    for b, img in enumerate(imgs):
        ref = _ultralytics(img, size)  # HWC in the given (RGB) order, 114 padding
        np.testing.assert_array_equal(batch.images[b], ref.transpose(2, 0, 1).astype(np.float32))
        assert tuple(batch.image_sizes[b]) == letterbox_size(*img.shape[:2], size)
    alone = prepare_batch([imgs[3]], spec)
    np.testing.assert_array_equal(alone.images[0], batch.images[3])


def test_letterbox_bgr_order_and_metadata_round_trip():
    img = np.random.default_rng(1).integers(0, 256, (40, 70, 3), dtype=np.uint8)
    spec = input_spec(letterbox_preprocessing(64, "BGR").metadata())
    batch = prepare_batch([img], spec)
    ref = _ultralytics(img[:, :, ::-1], 64)  # Ultralytics' own order: it reads BGR with cv2
    np.testing.assert_array_equal(batch.images[0], ref.transpose(2, 0, 1).astype(np.float32))
