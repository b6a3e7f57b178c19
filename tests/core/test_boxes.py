"""Box IoU against values computed by hand and against pycocotools' own bbIou."""

import numpy as np
import pycocotools.mask as mask_utils
import pytest

from norcal.core.boxes import box_iou, box_iou_paired

UNIT = [0, 0, 2, 2]  # area 4


@pytest.mark.parametrize("other, expected", [
    ([0, 0, 2, 2], 1.0),          # identical
    ([1, 1, 3, 3], 1 / 7),        # corner overlap: 1 / (4 + 4 - 1)
    ([0, 0, 1, 2], 0.5),          # inside: 2 / 4
    ([1, 0, 3, 2], 1 / 3),        # half across: 2 / (4 + 4 - 2)
    ([2, 0, 4, 2], 0.0),          # touching an edge: no area in common
    ([2, 2, 4, 4], 0.0),          # touching a corner
    ([10, 10, 12, 12], 0.0),      # disjoint
    ([1, 1, 1, 1], 0.0),          # a point inside
    ([1, 0, 1, 2], 0.0),          # a zero-width line across it
    ([2, 2, 0, 0], 0.0),          # inverted (x1 < x0): no area
])
def test_pairwise_by_hand(other, expected):
    iou = box_iou([UNIT], [other])
    assert iou.shape == (1, 1)
    assert iou[0, 0] == pytest.approx(expected, abs=1e-15)
    assert box_iou([other], [UNIT])[0, 0] == pytest.approx(expected, abs=1e-15)  # symmetric


def test_matrix_shape_and_empty_inputs():
    iou = box_iou(np.array([UNIT, [1, 1, 3, 3]], np.float32), [[0, 0, 2, 2], [1, 1, 3, 3], [5, 5, 6, 6]])
    np.testing.assert_allclose(iou, [[1, 1 / 7, 0], [1 / 7, 1, 0]])
    assert iou.dtype == np.float64
    assert box_iou(np.zeros((0, 4)), [UNIT]).shape == (0, 1)
    assert box_iou([UNIT], np.zeros((0, 4))).shape == (1, 0)


def test_zero_area_boxes():
    point, line = [1, 1, 1, 1], [1, 0, 1, 2]
    # an empty union is no overlap ...
    assert box_iou([point], [point])[0, 0] == 0.0
    assert box_iou([point], [line])[0, 0] == 0.0
    # ... unless identical boxes are asked to count as the same box (parity's matching)
    assert box_iou([point, line], [point, line], identical_empty=True).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert box_iou([UNIT], [[1, 1, 3, 3]], identical_empty=True)[0, 0] == pytest.approx(1 / 7)


def test_xywh_by_hand():
    assert box_iou([[0, 0, 2, 2]], [[1, 1, 2, 2]], "xywh")[0, 0] == pytest.approx(1 / 7)
    # [0.5, 0, 1.5, 3] against [0, 0, 2, 2]: 1 x 2 in common, 3 + 4 - 2 in all
    assert box_iou([[0.5, 0, 1, 3]], [[0, 0, 2, 2]], "xywh")[0, 0] == pytest.approx(0.4)
    assert box_iou([[1, 1, 0, 0]], [[1, 1, 0, 0]], "xywh")[0, 0] == 0.0
    with pytest.raises(ValueError):
        box_iou([UNIT], [UNIT], "cxcywh")


def test_paired_is_the_diagonal():
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 50, (40, 2))
    a = np.concatenate([xy, xy + rng.uniform(0, 30, (40, 2))], axis=1)
    b = a + rng.uniform(-10, 10, (40, 4))
    np.testing.assert_array_equal(box_iou_paired(a, b), np.diag(box_iou(a, b)))
    with pytest.raises(ValueError):
        box_iou_paired(a, b[:3])


def test_xywh_equals_pycocotools_bit_for_bit():
    # the evaluation must give lvis-api's numbers: pycocotools' bbIou (in double) is the reference
    rng = np.random.default_rng(1)
    d = np.concatenate([rng.uniform(0, 100, (30, 2)), rng.uniform(0, 40, (30, 2))], axis=1)
    g = np.concatenate([rng.uniform(0, 100, (20, 2)), rng.uniform(0, 40, (20, 2))], axis=1)
    d[0, 2] = 0.0  # a zero-width detection
    g[:3] = d[:3]  # identical pairs, the zero-width one included
    ref = np.asarray(mask_utils.iou(d.tolist(), g.tolist(), [0] * len(g)), np.float64)
    np.testing.assert_array_equal(box_iou(d, g, "xywh"), ref)
