"""The padding switch: the default export runs the backbone without padding masks exactly when
every image fills the input to its own multiple of 32, and gives what the always-masked graph
gives, for one image and for a padded batch."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import golden as G
from norcal.export.modeling.build import model_from_state
from norcal.export.onnx_export import export_onnx
from norcal.export.padding_switch import IF_NODE, inline_masked

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
    spec = G.tiny_spec()
    model = model_from_state(spec, G.tiny_state_dict())
    return export_onnx(model, spec), export_onnx(model, spec, padding_switch=False)


def feeds(sizes, hw):
    """Zero-padded random images of ``sizes`` in one [B, 3, *hw] input."""
    rng = np.random.default_rng(0)
    x = np.zeros((len(sizes), 3, *hw), np.float32)
    for b, (h, w) in enumerate(sizes):
        x[b, :, :h, :w] = rng.uniform(0, 255, (3, h, w))
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
    switched, masked = graphs
    f = feeds(sizes, hw)
    got, want = session(switched).run(None, f), session(masked).run(None, f)
    assert (got[0] == want[0]).all() and want[0].sum() > 0  # num_detections
    for b in range(len(sizes)):
        n = int(want[0][b])
        # near-equal scores may come out in another order: compare sorted by score
        order_g = np.argsort(-got[2][b][:n], kind="stable")
        order_w = np.argsort(-want[2][b][:n], kind="stable")
        np.testing.assert_allclose(got[2][b][order_g], want[2][b][order_w], atol=1e-5)  # scores
        np.testing.assert_allclose(got[1][b][order_g], want[1][b][order_w], atol=1e-3)  # boxes
        assert (got[3][b][order_g] == want[3][b][order_w]).all()  # classes


def test_inlined_masked_branch_is_the_always_masked_graph(graphs):
    switched, masked = graphs
    inlined = inline_masked(switched)
    assert not [n for n in inlined.graph.node if n.op_type == "If"]
    onnx.checker.check_model(inlined, full_check=True)
    f = feeds([[150, 200], [200, 300]], (224, 320))
    for a, b in zip(session(inlined).run(None, f), session(masked).run(None, f)):
        np.testing.assert_allclose(a, b, atol=1e-5)
