"""Tune's mask memo: a class-agnostic mask head gives one mask input to several
class-specific boxes; each box gets its own pasted mask, as without the memo."""

from __future__ import annotations

import numpy as np
import pycocotools.mask as mask_utils
import pytest

from norcal.runtime.postprocess import ImageDetections
from norcal.runtime.results import image_mask_rles


@pytest.mark.parametrize("rule", ["detectron2", "torchvision"])
def test_one_mask_at_two_boxes_is_pasted_at_each(rule):
    rng = np.random.default_rng(0)
    mask = (0.6 + 0.4 * rng.random((28, 28))).astype(np.float32)  # above 0.5 everywhere
    boxes = np.array([[10, 12, 40, 50], [60, 20, 110, 90]], np.float32)

    def det(i):  # the same mask input, class i's box
        return ImageDetections(boxes=boxes[i:i + 1], scores=np.array([0.9], np.float32),
                               classes=np.array([i]), mask_probs=mask[None], image_size=(120, 140),
                               mask_paste=rule)

    memo: dict = {}
    first = image_mask_rles(det(0), memo=memo)
    second = image_mask_rles(det(1), memo=memo)
    assert second == image_mask_rles(det(1))  # as without the memo
    assert first != second
    for rle, (x0, y0, x1, y1) in zip(first + second, boxes):
        # a mask above threshold everywhere fills its box; torchvision pads the mask by one cell
        # and widens the box to match (measured: 1 px each side, so the width 2 px more)
        np.testing.assert_allclose(mask_utils.toBbox(rle), [x0, y0, x1 - x0, y1 - y0], atol=2)
