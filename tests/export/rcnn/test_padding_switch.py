"""The padding switch: the default export runs the backbone without padding masks exactly when
every image fills the input to its own multiple of 32, and gives what the always-masked graph
gives, for one image and for a padded batch."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import golden as G
from test_padding_heads import assert_same_detections, per_image, rcnn_spec, trained_like
from norcal.export.rcnn.modeling.build import model_from_state
from norcal.export.rcnn.onnx_export import export_onnx
from norcal.export.rcnn.padding_switch import IF_NODE, inline_masked

pytestmark = pytest.mark.slow  # exports the tiny detector twice


def session(proto: onnx.ModelProto, outputs: tuple[str, ...] = ()) -> ort.InferenceSession:
    if outputs:
        probe = onnx.ModelProto()
        probe.CopyFrom(proto)
        probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in outputs)
        proto = probe
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def graphs():
    # test_padding_heads' trained-like R-18-FPN: decisive scores, so float rounding of fused
    # against unfused convolutions cannot reorder near-ties at the K-th detection
    spec = rcnn_spec()
    model = model_from_state(spec, trained_like(spec))
    return export_onnx(model, spec, padding_switch=True), export_onnx(model, spec)


def feeds(sizes, hw):
    """Crops of fixture images (200 x 300), zero-padded into one [B, 3, *hw] input."""
    x = np.zeros((len(sizes), 3, *hw), np.float32)
    for b, (h, w) in enumerate(sizes):
        x[b, :, :h, :w] = G.load_bgr_resized(b, 200, 300)[:h, :w].transpose(2, 0, 1)
    return {"images": x, "image_sizes": np.array(sizes, np.int64)}


# (sizes, input h x w, does every image fill the input to its own multiple of 32?)
CASES = [
    ([[150, 200]], (160, 224), True),  # one image padded by the host to its own multiple
    ([[160, 224]], (160, 224), True),  # an exact multiple
    ([[150, 200]], (192, 224), False),  # padded beyond its multiple (a fixed-size host)
    ([[150, 200], [200, 300]], (224, 320), False),  # a batch: the smaller image padded more
    ([[150, 200], [140, 210]], (160, 224), True),  # a batch of images with the same multiple
]


@pytest.mark.parametrize("sizes,hw,fills", CASES)
def test_switch_picks_the_unmasked_backbone_only_when_no_image_has_extra_padding(
        graphs, sizes, hw, fills):
    switched, masked = graphs
    cond = session(switched, (IF_NODE + "/cond",)).run([IF_NODE + "/cond"], feeds(sizes, hw))[0]
    assert bool(cond) is fills


@pytest.mark.parametrize("sizes,hw,fills", CASES)
def test_switched_graph_gives_the_masked_graphs_detections(graphs, sizes, hw, fills):
    """One to one (test_padding_heads' matcher): class, boxes within 1e-3, scores 1e-4."""
    switched, masked = graphs
    f = feeds(sizes, hw)
    names = [o.name for o in switched.graph.output]
    got = dict(zip(names, session(switched).run(None, f)))
    want = dict(zip(names, session(masked).run(None, f)))
    assert want["num_detections"].min() > 0
    for b in range(len(sizes)):
        assert_same_detections(per_image(want, b), per_image(got, b), f"image {b}")


def test_inlined_masked_branch_is_the_always_masked_graph(graphs):
    switched, masked = graphs
    inlined = inline_masked(switched)
    assert not [n for n in inlined.graph.node if n.op_type == "If"]
    onnx.checker.check_model(inlined, full_check=True)
    f = feeds([[150, 200], [200, 300]], (224, 320))
    for a, b in zip(session(inlined).run(None, f), session(masked).run(None, f)):
        np.testing.assert_allclose(a, b, atol=1e-5)
