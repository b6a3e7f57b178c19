"""ViTDet's Mask R-CNN (detectron2's ``projects/ViTDet/configs/LVIS/mask_rcnn_vitdet_b_100ep.py``:
ViT + SimpleFeaturePyramid, LN heads, sigmoid classifier with federated loss, every image padded
to one square) against the real detectron2's goldens (tests/fixtures/d2_vitdet_tiny): the exported
graph in ONNX Runtime, all three fixture images in one batch, at gamma 0 and 0.5, from the
fixture's config.yaml and with the ViT read from the weights alone.
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

import golden as G
from conftest import FIXTURES, assert_tensorrt_compatible
from norcal.core.errors import NorcalError
from norcal.export.families.checkpoints import read_checkpoint
from norcal.export.families.detectron2.weights.architecture import spec_from_weights
from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.rcnn.modeling.build import model_from_state
from norcal.export.rcnn.spec import architecture_label
from test_c4_dc5 import Arch, check_detections
from test_onnx_export import run, session

FIXTURE = FIXTURES / "d2_vitdet_tiny"
SQUARE = 320  # the fixture's square_pad and ResizeShortestEdge(320, 320)


def square_batch(indices, fixture=FIXTURE, square: int = SQUARE) -> tuple[np.ndarray, np.ndarray]:
    """The images as detectron2 feeds them (BGR, resized), each zero-padded to the square."""
    imgs = [G.load_bgr_resized(k, square, square, fixture=fixture) for k in indices]
    out = np.zeros((len(imgs), 3, square, square), np.float32)
    for n, im in enumerate(imgs):
        out[n, :, :im.shape[0], :im.shape[1]] = im.transpose(2, 0, 1)
    return out, np.array([i.shape[:2] for i in imgs], np.int64)


class Case(Arch):
    """A square-padded fixture's model, its three images in one batch, each padded to the square."""

    def __init__(self, fixture=FIXTURE, square: int = SQUARE):
        self.fixture = fixture
        self.spec, state = load_detector_spec(fixture / "model_final.pth", fixture / "config.yaml")
        self.model = model_from_state(self.spec, state)
        self.images, self.sizes = square_batch(range(3), fixture, square)
        self.eager, self.ort, self._onnx = {}, {}, None


@pytest.fixture(scope="module")
def case() -> Case:
    return Case()


def test_config_gives_detectron2s_vitdet(case):
    vit = case.spec.vit
    assert (vit.embed_dim, vit.depth, vit.num_heads, vit.window_size, vit.window_block_indexes) == (24, 4, 2, 6, (0, 2))
    assert (vit.square_pad, vit.pretrain_img_size, vit.ln_eps, vit.residual_block_indexes) == (320, 160, 1e-6, ())
    s = case.spec
    assert (s.size_divisibility, s.min_size_test, s.max_size_test, s.input_format) == (320, 320, 320, "RGB")
    assert (s.fpn_norm, s.box_head_norm, s.mask_head_norm, s.use_sigmoid_ce) == ("LN", "LN", "LN", True)
    # the export summary names it (it said "R50-FPN": the ResNet depth field's default)
    assert architecture_label(s) == "ViT (embed 24, depth 4, 2 heads) + SimpleFeaturePyramid"


def test_weights_give_the_configs_vit(case):
    """Read from the weights alone, given only what they cannot show (the LN eps; the heads' norms,
    GN or LN), the ViT is the config's: the model that matches the goldens below."""
    raw = {k: v for k, v in read_checkpoint(FIXTURE / "model_final.pth").items() if "fed_loss" not in k}
    given = dataclasses.replace(case.spec.vit, embed_dim=0, depth=0, num_heads=0, window_size=0,
                                pretrain_img_size=0, square_pad=0)
    assert spec_from_weights(raw, vit=given, config_norms=True).vit == case.spec.vit


@pytest.mark.parametrize("setting", ("baseline", "cdt_g0.5"))
def test_onnxruntime_batch_matches_golden(case, setting):
    check_detections(case.ort_outputs(setting), setting, FIXTURE)


def test_image_alone_equals_image_in_a_batch(case):
    """Every image is padded to the square alone or batched, so each image's detections are the same."""
    check_alone_equals_batched(case, FIXTURE, SQUARE)


def check_alone_equals_batched(case: Case, fixture, square: int) -> None:
    ort = session(case.onnx)
    together = case.ort_outputs("baseline")
    for k in range(3):
        images, sizes = square_batch([k], fixture, square)
        alone = run(ort, images, sizes)
        for name in ("num_detections", "boxes", "scores", "classes", "masks"):
            np.testing.assert_allclose(alone[name][0], together[name][k], rtol=0, atol=1e-4)


def test_tensorrt_parser_check(case):
    assert_tensorrt_compatible(case.onnx)
    dims = [d.dim_value for d in case.onnx.graph.input[0].type.tensor_type.shape.dim[2:]]
    assert dims == [SQUARE, SQUARE]


def _config_with(tmp_path, old: str, new: str, fixture=FIXTURE):
    text = (fixture / "config.yaml").read_text()
    assert old in text
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(old, new))
    return path


def test_square_pad_disagreeing_with_weights_is_refused(tmp_path):
    cfg = _config_with(tmp_path, "    square_pad: 320\n", "    square_pad: 384\n")
    cfg.write_text(cfg.read_text().replace("img_size: 320", "img_size: 384").replace(
        "max_size: 320, short_edge_length: 320", "max_size: 384, short_edge_length: 384"))
    with pytest.raises(NorcalError, match=r"disagree on vit\.square_pad \(model\.backbone\.square_pad\): "
                                          r"config 384, weights 320"):
        load_detector_spec(FIXTURE / "model_final.pth", cfg)


@pytest.mark.parametrize("old, new, key", [
    ("      depth: 4\n", "      depth: 3\n", r"vit\.depth \(model\.backbone\.net\.depth\): config 3, weights 4"),
    ("    out_channels: 16\n", "    out_channels: 15\n",
     r"fpn_out_channels \(model\.backbone\.out_channels\): config 15, weights 16"),
])
def test_a_disagreement_names_the_lazyconfig_key(tmp_path, old, new, key):
    # the user's LazyConfig keys, not the yacs ones (MODEL.FPN.OUT_CHANNELS) it was mapped to
    with pytest.raises(NorcalError, match="disagree on " + key):
        load_detector_spec(FIXTURE / "model_final.pth", _config_with(tmp_path, old, new))


@pytest.mark.parametrize("old, new, message", [
    ("      depth: 4\n", "      depth: 4.5\n", r"model\.backbone\.net\.depth: 4\.5: not a whole number >= 1"),
    ("window_block_indexes: [0, 2]", "window_block_indexes: [0, 4]",
     r"model\.backbone\.net\.window_block_indexes: \[0, 4\]: not a list of block indexes \(0 \.\. depth - 1 = 3\)"),
    ("      use_rel_pos: true\n", "      use_rel_pos: 1\n", r"model\.backbone\.net\.use_rel_pos: 1: not true or false"),
    ("scale_factors: [4.0, 2.0, 1.0, 0.5]", "scale_factors: [a, 2.0, 1.0, 0.5]",
     r"model\.backbone\.scale_factors: \['a', 2\.0, 1\.0, 0\.5\]: only ViTDet's"),
    ("      fc_dims: [16]\n", "      fc_dims: -1\n",
     r"model\.roi_heads\.box_head\.fc_dims: -1: expected a list of the box-head fcs' widths"),
    ("      conv_dims: [16, 16, 16, 16, 16]\n", "      conv_dims: []\n",
     r"model\.roi_heads\.mask_head\.conv_dims: expected the convs' and the deconvolution's widths"),
])
def test_a_value_of_the_wrong_kind_is_named_in_one_line(tmp_path, old, new, message):
    # before: answered only as a disagreement with the weights, or a traceback (float() of a
    # string, len() of a number)
    with pytest.raises(NorcalError, match=message) as e:
        load_detector_spec(FIXTURE / "model_final.pth", _config_with(tmp_path, old, new))
    assert "\n" not in str(e.value)


def test_unknown_target_is_refused_by_name(tmp_path):
    cfg = _config_with(tmp_path, "_target_: detectron2.modeling.ViT\n", "_target_: detectron2.modeling.MViT\n")
    with pytest.raises(NorcalError, match=r"model\.backbone\.net\._target_: detectron2\.modeling\.MViT is not "
                                          r"supported \(a ViT under the SimpleFeaturePyramid: ViT\)"):
        load_detector_spec(FIXTURE / "model_final.pth", cfg)


def test_weights_alone_refuse_the_layernorm_eps():
    with pytest.raises(NorcalError, match=r"^backbone\.net: the ViT's LayerNorm eps is not in its weights"):
        load_detector_spec(FIXTURE / "model_final.pth")
