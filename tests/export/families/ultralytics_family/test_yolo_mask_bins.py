"""The YOLO graph's box-relative masks: the exact mean of Ultralytics' upsampled logit map over
each bin of the box, continuous in the box (also past the input's border)."""

from __future__ import annotations

import types

import numpy as np
import torch
import torch.nn.functional as F

from norcal.export.families.ultralytics.yolo_graph import YoloGraph, bin_weights

S, P = 96, 24  # the letterboxed input and the prototypes (stride 4)


def _dense_bin_means(logit_map: torch.Tensor, box, m: int, per_bin: int = 120) -> torch.Tensor:
    """[m, m] means over each bin of ``box`` (input pixels) of the map as grid_sample reads it
    (bilinear, half-pixel, border values beyond the edge), by the midpoint rule."""
    x0, y0, x1, y1 = box
    t = (torch.arange(m * per_bin, dtype=torch.float64) + 0.5) / (m * per_bin)
    xs, ys = x0 + (x1 - x0) * t, y0 + (y1 - y0) * t
    grid = torch.stack([(2 * xs / S - 1)[None, :].expand(len(ys), -1),
                        (2 * ys / S - 1)[:, None].expand(-1, len(xs))], -1)[None]
    dense = F.grid_sample(logit_map[None, None], grid, mode="bilinear", padding_mode="border",
                          align_corners=False)[0, 0]
    return dense.reshape(m, per_bin, m, per_bin).mean(dim=(1, 3))


def test_grid_sample_border_reads_the_map_as_ultralytics_upsampling_does():
    """The reference's map at the input's pixel centres is Ultralytics' process_mask upsampling."""
    g = torch.Generator().manual_seed(0)
    logit_map = torch.randn((P, P), generator=g, dtype=torch.float64)
    up = F.interpolate(logit_map[None, None], (S, S), mode="bilinear", align_corners=False)[0, 0]
    c = (torch.arange(S, dtype=torch.float64) + 0.5) * 2 / S - 1
    grid = torch.stack([c[None, :].expand(S, -1), c[:, None].expand(-1, S)], -1)[None]
    read = F.grid_sample(logit_map[None, None], grid, mode="bilinear", padding_mode="border", align_corners=False)
    torch.testing.assert_close(read[0, 0], up, rtol=0, atol=1e-12)


def test_bin_weights_are_the_exact_bin_means_inside_and_past_the_border():
    g = torch.Generator().manual_seed(1)
    logit_map = torch.randn((P, P), generator=g, dtype=torch.float64)
    boxes = [(10.0, 12.0, 50.0, 60.0), (-30.5, -7.25, 40.0, 33.0), (60.0, 70.0, 140.0, 101.0),
             (-48.6, 1.75, 80.5, 108.9), (20.0, 30.0, 20.7, 31.1)]
    m = 7
    for box in boxes:
        x0, y0, x1, y1 = (torch.tensor(box, dtype=torch.float64) * P / S - 0.5)
        wy, wx = bin_weights(y0, y1, P, m), bin_weights(x0, x1, P, m)
        ours = wy @ logit_map @ wx.T
        np.testing.assert_allclose(ours.numpy(), _dense_bin_means(logit_map, box, m).numpy(), rtol=0, atol=2e-4)


def _masks(box, protos, coefs):
    graph = types.SimpleNamespace(mask_size=28)  # masks() reads only the mask size
    det = torch.tensor([[box]], dtype=torch.float32)
    return YoloGraph.masks(graph, det, torch.zeros((1, 1), dtype=torch.int64), coefs, protos, S)[0, 0]


def test_masks_of_a_box_past_the_border_move_continuously():
    """A box past the top edge whose first row of RoIAlign samples (one per bin for a box under
    28 prototype pixels) lay right at -1 prototype pixel: 1e-3 px either way moved that row
    from the edge value to 0 (a jump in the mask), where two fp32 kernels' boxes differ by that
    much. Now the mask moves by about the box's shift times the map's slope."""
    g = torch.Generator().manual_seed(2)
    protos = torch.randn((1, 4, P, P), generator=g) + 2.0
    coefs = torch.randn((1, 1, 4), generator=g)
    bin_h = 80.0 * P / S / 28
    y0 = (-0.5 - 0.5 * bin_h) * S / P  # row 0's bin centre at -1 prototype pixel
    a = _masks((10.0, y0 - 1e-3, 60.0, y0 - 1e-3 + 80.0), protos, coefs)
    b = _masks((10.0, y0 + 1e-3, 60.0, y0 + 1e-3 + 80.0), protos, coefs)
    assert float((a - b).abs().max()) < 1e-3
