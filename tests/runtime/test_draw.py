"""Pictures of detections: layout, colours by frequency group, detections left untouched."""

import copy

import numpy as np
import pytest
from PIL import Image

from norcal.core.errors import NorcalError
from norcal.runtime.draw import (GROUP_COLOURS, HEADER, DrawOptions, draw_panels,
                                 picture_size, save_panels, shown_indices)
from norcal.runtime.postprocess import ImageDetections

H, W = 48, 64  # enlarged 8x (512 // 64)
NAMES = ["rare_thing", "common_thing", "frequent_thing"]
GROUPS = ["r", "c", "f"]


def _dets(with_masks=True):
    boxes = np.array([[4, 4, 30, 40], [5, 5, 29, 39], [36, 8, 60, 30], [40, 30, 50, 44]], np.float32)
    return ImageDetections(boxes=boxes, scores=np.array([0.9, 0.6, 0.5, 0.05], np.float32),
                           classes=np.array([0, 2, 1, 2], np.int64),
                           mask_probs=np.full((4, 28, 28), 0.9, np.float32) if with_masks else None,
                           image_size=(H, W))


def _image():
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (H, W, 3), dtype=np.uint8)


def test_one_label_per_object_best_first():
    # det 1 sits on det 0 (IoU ~0.85) and is left out; det 3 is under the score threshold
    assert shown_indices(_dets(), DrawOptions(score_thresh=0.1)).tolist() == [0, 2]
    assert shown_indices(_dets(), DrawOptions(score_thresh=0.01, overlap=1.01)).tolist() == [0, 1, 2, 3]
    assert shown_indices(_dets(), DrawOptions(score_thresh=0.01, max_dets=1)).tolist() == [0]


def test_picture_size_and_group_colours():
    det = _dets()
    img = draw_panels(_image(), [("a", det), ("b", det)], NAMES, GROUPS)
    assert img.size == picture_size((H, W), 2) == (2 * 8 * W + 10, HEADER + 8 * H + 24)
    px = np.asarray(img)
    # the bottom edge of the rare detection's box (x 4..30, y 40, enlarged 8x), in both panels
    for x0 in (0, 8 * W + 10):
        assert tuple(px[HEADER + 8 * 40 - 1, x0 + 8 * 17]) == GROUP_COLOURS["r"]
        assert tuple(px[HEADER + 8 * 30 - 1, x0 + 8 * 48]) == GROUP_COLOURS["c"]


def test_saved_png_is_valid_and_detections_unchanged(tmp_path):
    det = _dets()
    before = copy.deepcopy(det)
    image = _image()
    image_before = image.copy()
    path = save_panels(tmp_path / "sub" / "p.png", image, [("baseline", det), ("NorCal", det)],
                       NAMES, GROUPS, caption="ground truth: rare_thing (r)")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.size == picture_size((H, W), 2) and im.mode == "RGB"
    for k in ("boxes", "scores", "classes", "mask_probs"):
        np.testing.assert_array_equal(getattr(det, k), getattr(before, k))
    np.testing.assert_array_equal(image, image_before)


def test_box_only_model_and_no_groups(tmp_path):
    img = draw_panels(_image(), [("boxes", _dets(with_masks=False))], NAMES, None,
                      DrawOptions(scale=2))
    assert img.size == picture_size((H, W), 1, 2) == (2 * W, HEADER + 2 * H + 24)


def test_mismatched_image_is_an_error():
    with pytest.raises(NorcalError, match="detections are for a"):
        draw_panels(np.zeros((10, 10, 3), np.uint8), [("x", _dets())], NAMES, GROUPS)
    with pytest.raises(NorcalError, match="no panels"):
        draw_panels(_image(), [], NAMES, GROUPS)
