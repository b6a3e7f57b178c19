"""Postprocessing against detectron2's golden box mapping and its mask-pasting formula."""

from pathlib import Path

import numpy as np
import pytest

from norcal.runtime.postprocess import paste_masks, rescale_boxes, split_outputs

TINY = Path(__file__).parents[1] / "fixtures" / "d2_lvis_tiny"
SETTINGS = ["baseline", "cdt_g0.5", "cdt_g1.0", "ens_g0.999"]


def golden(i):
    return np.load(TINY / "golden" / f"img{i}.npz")


@pytest.mark.parametrize("i", range(4))
@pytest.mark.parametrize("setting", SETTINGS)
def test_box_mapping_matches_detectron2(i, setting):
    g = golden(i)
    orig = tuple(g["input_rgb_shape"])
    resized = tuple(g["resized_chw"][1:])
    boxes, keep = rescale_boxes(g[f"{setting}/boxes"], resized, orig)
    assert keep.all()  # detectron2 kept all 300
    np.testing.assert_allclose(boxes, g[f"{setting}/boxes_orig"], rtol=0, atol=1e-4)


def test_box_clip_and_empty_drop_hand_computed():
    boxes = np.array([[-5, 10, 50, 700], [10, 10, 10, 20], [100, 100, 300, 120]], np.float32)
    out, keep = rescale_boxes(boxes, (200, 100), (400, 300))  # x scale 3, y scale 2
    np.testing.assert_allclose(out[0], [0, 20, 150, 400])  # clipped to w=300, h=400
    np.testing.assert_allclose(out[2], [300, 200, 300, 240])  # x clipped to 300 -> empty
    assert keep.tolist() == [True, False, False]


def torch_paste(masks, boxes, h, w):
    """detectron2's _do_paste_mask on the whole image (skip_empty=False), then >= 0.5."""
    import torch

    F = torch.nn.functional
    masks = torch.from_numpy(np.asarray(masks, np.float32))[:, None]
    boxes = torch.from_numpy(np.asarray(boxes, np.float32))
    x0, y0, x1, y1 = torch.split(boxes, 1, dim=1)
    img_y = torch.arange(0, h, dtype=torch.float32) + 0.5
    img_x = torch.arange(0, w, dtype=torch.float32) + 0.5
    img_y = (img_y - y0) / (y1 - y0) * 2 - 1
    img_x = (img_x - x0) / (x1 - x0) * 2 - 1
    n = masks.shape[0]
    gx = img_x[:, None, :].expand(n, h, w)
    gy = img_y[:, :, None].expand(n, h, w)
    grid = torch.stack([gx, gy], dim=3)
    out = F.grid_sample(masks, grid, align_corners=False)[:, 0]
    return (out >= 0.5).numpy()


@pytest.mark.parametrize("i", [0, 1, 2])
def test_mask_paste_matches_grid_sample_reference(i):
    g = golden(i)
    h, w = (int(v) for v in g["input_rgb_shape"])
    probs = g["baseline/mask_probs"][:60].astype(np.float32)
    boxes = g["baseline/boxes_orig"][:60]
    ours = paste_masks(probs, boxes, (h, w))
    ref = torch_paste(probs, boxes, h, w)
    assert ours.shape == ref.shape == (60, h, w)
    assert ref.any(axis=(1, 2)).sum() > 10  # the reference pastes real masks
    inter = (ours & ref).sum(axis=(1, 2))
    union = (ours | ref).sum(axis=(1, 2))
    iou = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
    assert iou.min() >= 0.99
    assert (ours != ref).sum() <= 0.0001 * ref.size  # float rounding at exactly 0.5 only


def test_mask_paste_hand_computed():
    # A constant mask fills exactly the box when the box is aligned to pixel edges.
    full = paste_masks(np.ones((1, 28, 28), np.float32), np.array([[2, 2, 6, 6]], np.float32), (10, 10))
    expect = np.zeros((10, 10), bool)
    expect[2:6, 2:6] = True
    np.testing.assert_array_equal(full[0], expect)
    # 2x2 mask [[1,0],[1,0]] on box (0,0,4,4): column c samples cell c/2 - 0.25, so columns
    # 0,1 get 0.75 (times 0.75 on rows 0 and 3: 0.5625 >= 0.5) and columns 2,3 get <= 0.25.
    half = paste_masks(np.array([[[1, 0], [1, 0]]], np.float32), np.array([[0, 0, 4, 4]], np.float32), (4, 4))
    expect = np.zeros((4, 4), bool)
    expect[:, :2] = True
    np.testing.assert_array_equal(half[0], expect)
    # A mask of 0.49 never reaches the threshold.
    assert not paste_masks(np.full((1, 28, 28), 0.49, np.float32), np.array([[1, 1, 8, 8]], np.float32), (10, 10)).any()


def test_split_outputs_slices_maps_and_filters():
    outputs = {
        "num_detections": np.array([2, 1], np.int64),
        "boxes": np.array([[[0, 0, 10, 10], [5, 5, 5, 9], [1, 1, 2, 2]],
                           [[2, 4, 6, 8], [0, 0, 0, 0], [0, 0, 0, 0]]], np.float32),
        "scores": np.array([[0.9, 0.8, 0.7], [0.6, 0, 0]], np.float32),
        "classes": np.array([[3, 4, 5], [7, 0, 0]], np.int64),
        "masks": np.ones((2, 3, 28, 28), np.float32),
    }
    dets = split_outputs(outputs, np.array([[20, 20], [16, 16]]), np.array([[40, 20], [16, 32]]))
    assert [len(d) for d in dets] == [1, 1]  # image 0: second box is empty, third is padding
    np.testing.assert_allclose(dets[0].boxes, [[0, 0, 10, 20]])
    np.testing.assert_allclose(dets[1].boxes, [[4, 4, 12, 8]])
    assert dets[1].classes.tolist() == [7] and dets[1].image_size == (16, 32)
    m = dets[1].masks()
    assert m.shape == (1, 16, 32) and m[0, 4:8, 4:12].all() and m[0].sum() == 32

