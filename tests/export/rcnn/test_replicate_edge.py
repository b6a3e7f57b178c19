"""``replicate_edge``: each image's last valid column, then row, copied one step into the batch
padding, and nothing else changed; in PyTorch and in the exported graph at sizes other than
the traced one (no map size may be baked in). Reference: a plain loop over images."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import torch

from norcal.export.rcnn.modeling.poolers import replicate_edge
from norcal.core.profiles import make_profile
from norcal.export.trt_check import check_model


def by_hand(f: np.ndarray, extent: np.ndarray) -> np.ndarray:
    out = f.copy()
    h, w = f.shape[-2:]
    for b, (rows, cols) in enumerate(extent):
        if cols < w:
            out[b, :, :, cols] = out[b, :, :, cols - 1]
        if rows < h:
            out[b, :, rows, :] = out[b, :, rows - 1, :]
    return out


# extents: filling the map, short in width, short in height, short both ways, one pixel
CASES = [((3, 2, 6, 7), [[6, 7], [6, 4], [3, 7], [1, 1]][:3]),
         ((4, 3, 5, 9), [[5, 9], [2, 5], [5, 8], [1, 1]]),
         ((1, 1, 4, 4), [[4, 4]])]


def test_matches_a_loop_over_images():
    rng = np.random.default_rng(0)
    for shape, extent in CASES:
        f = rng.normal(size=shape).astype(np.float32)
        e = np.array(extent, np.int64)
        got = replicate_edge(torch.from_numpy(f), torch.from_numpy(e)).numpy()
        np.testing.assert_array_equal(got, by_hand(f, e))


def test_exported_graph_takes_any_size_and_parses_for_tensorrt(tmp_path):
    buf = io.BytesIO()
    torch.onnx.export(lambda_module(), (torch.zeros(2, 3, 6, 7), torch.tensor([[6, 7], [3, 4]])),
                      buf, input_names=["f", "extent"], output_names=["out"], opset_version=17,
                      dynamo=False, dynamic_axes={"f": [0, 1, 2, 3], "extent": [0]})
    model = onnx.load_from_string(buf.getvalue())
    report = check_model(model, [make_profile("f", (1, 1, 4, 4), (2, 3, 6, 7), (4, 3, 8, 9)),
                                 make_profile("extent", (1, 2), (2, 2), (4, 2))])
    assert report.compatible, [f"{f.node} ({f.op_type}): {f.reason}" for f in report.errors]
    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for shape, extent in CASES:
        f = rng.normal(size=shape).astype(np.float32)
        e = np.array(extent, np.int64)
        np.testing.assert_array_equal(sess.run(None, {"f": f, "extent": e})[0], by_hand(f, e))


def lambda_module() -> torch.nn.Module:
    class Edge(torch.nn.Module):
        def forward(self, f, extent):
            return replicate_edge(f, extent)
    return Edge()
