"""A federated-loss checkpoint (LVIS v1's USE_SIGMOID_CE + USE_FED_LOSS) exported WITHOUT its
config against the real detectron2's goldens (tests/fixtures/d2_fedloss_tiny): the weights'
fed_loss_cls_weights buffer makes the head sigmoid. Before, a softmax head was assumed and none
of detectron2's detections were matched, with no error. Eager PyTorch and ONNX Runtime, the
fixture's image in a zero-padded batch with a larger one and alone, at gamma 0 and 0.5 (one
image: with a sigmoid head 1.2M class scores pass the 1e-4 threshold, so NMS is slow).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import golden as G
from conftest import FIXTURES
from golden import manifest_table
from norcal.core.calibration.formula import log_prior
from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.graph.calibrate import calibrate_graph
from norcal.export.rcnn.modeling.build import model_from_state
from norcal.export.rcnn.onnx_export import export_onnx
from test_c4_dc5 import check_detections
from test_onnx_export import run, session

pytestmark = pytest.mark.slow  # one more Mask R-CNN exported and run against goldens

FIXTURE = FIXTURES / "d2_fedloss_tiny"
IMAGES = range(1)
SETTINGS = ("baseline", "cdt_g0.5")


@pytest.fixture(scope="module")
def fed():
    spec, state = load_detector_spec(FIXTURE / "model_final.pth")  # no config
    images, sizes = G.batch(IMAGES, fixture=FIXTURE)
    return spec, state, images, sizes


def _with_a_larger_image(images, sizes):
    """img0 first in a zero-padded batch with d2_lvis_tiny's larger img1 (333x500 before resizing)."""
    other = G.load_bgr_resized(1).transpose(2, 0, 1)
    h, w = (-(-max(a, b) // 32) * 32 for a, b in zip(images.shape[2:], other.shape[1:]))
    batch = np.zeros((2, 3, h, w), np.float32)
    batch[0, :, :images.shape[2], :images.shape[3]] = images[0]
    batch[1, :, :other.shape[1], :other.shape[2]] = other
    return batch, np.concatenate([sizes, np.array([other.shape[1:]], np.int64)])


def _eager(spec, state, images, sizes, setting: str) -> dict:
    model = model_from_state(spec, state).eval()
    factor, gamma = G.GAMMAS[setting]
    if gamma:
        model.roi_heads.box_predictor.set_log_prior(log_prior(manifest_table(FIXTURE).counts(), gamma, factor))
    with torch.no_grad():
        out = model.inference(torch.from_numpy(images), torch.from_numpy(sizes))
    return {k: v.numpy() for k, v in out.items()}


def test_weights_alone_say_sigmoid(fed):
    spec = fed[0]
    assert spec.use_sigmoid_ce and "fed_loss_cls_weights" in spec.provenance["use_sigmoid_ce"]


def test_eager_matches_detectron2(fed):
    """The PyTorch model (what ``norcal tune`` runs); the ONNX test below covers gamma 0.5 too."""
    check_detections(_eager(*fed, "baseline"), "baseline", FIXTURE, IMAGES)


def test_a_softmax_reading_matches_almost_nothing(fed):
    """The test above fails on the old assumption: the same weights read as softmax."""
    spec, state, images, sizes = fed
    out = _eager(dataclasses.replace(spec, use_sigmoid_ce=False), state, images, sizes, "baseline")
    g = G.golden(0, FIXTURE)
    n = int(out["num_detections"][0])
    frac, _ = G.match_detections(g["baseline/boxes"], g["baseline/scores"], g["baseline/classes"],
                                 out["boxes"][0, :n], out["scores"][0, :n], out["classes"][0, :n])
    assert frac < 0.05


def test_onnx_matches_detectron2_batched_and_alone(fed):
    spec, state, images, sizes = fed
    plain = export_onnx(model_from_state(spec, state).eval(), spec)
    for setting in SETTINGS:
        factor, gamma = G.GAMMAS[setting]
        proto = plain if gamma == 0 else calibrate_graph(plain, gamma, manifest_table(FIXTURE), factor=factor)
        sess = session(proto)
        alone = run(sess, images, sizes)
        check_detections(alone, setting, FIXTURE, IMAGES)
        batched = run(sess, *_with_a_larger_image(images, sizes))
        n = int(alone["num_detections"][0])
        assert n == int(batched["num_detections"][0]), setting
        frac, _ = G.match_detections(alone["boxes"][0, :n], alone["scores"][0, :n], alone["classes"][0, :n],
                                     batched["boxes"][0, :n], batched["scores"][0, :n], batched["classes"][0, :n])
        assert frac >= 0.99, (setting, frac)  # batched == alone, as detections are matched
