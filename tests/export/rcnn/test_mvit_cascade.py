"""The MViTv2 Cascade Mask R-CNN (detectron2's ``projects/ViTDet/configs/LVIS/
cascade_mask_rcnn_mvitv2_b_in21k_100ep.py``: MViT under an LN FPN padded to its square, three
cascade stages of LN box heads with sigmoid classifiers and federated loss, LN mask head) against
the real detectron2's goldens (tests/fixtures/d2_mvit_cascade_tiny): the exported graph in ONNX
Runtime, all three fixture images in one batch, at gamma 0 and 0.5 (NorCal on every stage's
classifier), read from the fixture's config.yaml; one export shared by the tests.
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import FIXTURES, assert_tensorrt_compatible
from norcal.core.errors import NorcalError
from norcal.export.families.checkpoints import read_checkpoint
from norcal.export.families.detectron2.weights.architecture import spec_from_weights
from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.rcnn.modeling.build import create_model
from norcal.export.rcnn.spec import CASCADE_ROI_HEADS, MViTSpec
from test_c4_dc5 import check_detections
from test_vitdet import Case, _config_with, check_alone_equals_batched

FIXTURE = FIXTURES / "d2_mvit_cascade_tiny"
SQUARE = 256  # the FPN's square_pad and ResizeShortestEdge(256, 256)
# make_mvit_cascade_tiny.MVIT with the config's LayerNorm eps and residual pooling
MVIT = MViTSpec(embed_dim=4, depth=8, num_heads=1, last_block_indexes=(1, 4, 6, 7), mlp_ratio=2.0, norm_eps=1e-6,
                residual_pooling=True, square_pad=SQUARE)
@pytest.fixture(scope="module")
def case() -> Case:
    return Case(FIXTURE, SQUARE)


def test_config_gives_detectron2s_mvit_cascade(case):
    s = case.spec
    assert s.mvit == MVIT and (s.size_divisibility, s.min_size_test, s.max_size_test) == (SQUARE, SQUARE, SQUARE)
    assert (s.roi_heads_name, s.cascade_bbox_reg_weights) == (
        CASCADE_ROI_HEADS, ((10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15)))
    assert (s.fpn_norm, s.box_head_norm, s.mask_head_norm, s.use_sigmoid_ce, s.input_format) == (
        "LN", "LN", "LN", True, "RGB")
    assert (case.model.size_divisibility, case.model.backbone.square) == (SQUARE, SQUARE)


def test_weights_give_the_configs_mvit(case):
    """Read from the weights, given only what they cannot show (LN eps, residual pooling, the
    square), the MViT is the config's: the model that matches the goldens below."""
    raw = {k: v for k, v in read_checkpoint(FIXTURE / "model_final.pth").items() if "fed_loss" not in k}
    given = MViTSpec(embed_dim=0, depth=0, num_heads=0, last_block_indexes=(0, 0, 0, 0), norm_eps=1e-6,
                     residual_pooling=True, square_pad=SQUARE)
    assert spec_from_weights(raw, cascade_weights=case.spec.cascade_bbox_reg_weights, mvit=given,
                             config_norms=True).mvit == MVIT


@pytest.mark.parametrize("setting", ("baseline", "cdt_g0.5"))
def test_onnxruntime_batch_matches_golden(case, setting):
    check_detections(case.ort_outputs(setting), setting, FIXTURE)


def test_image_alone_equals_image_in_a_batch(case):
    """Every image is padded to the square alone or batched, so each image's detections are the same."""
    check_alone_equals_batched(case, FIXTURE, SQUARE)


def test_tensorrt_parser_check(case):
    assert_tensorrt_compatible(case.onnx)
    dims = [d.dim_value for d in case.onnx.graph.input[0].type.tensor_type.shape.dim[2:]]
    assert dims == [SQUARE, SQUARE]


def test_mvit_without_square_padding_is_refused(tmp_path, case):
    cfg = _config_with(tmp_path, f"    square_pad: {SQUARE}\n", "    square_pad: 0\n", FIXTURE)
    with pytest.raises(NorcalError, match=r"config\.yaml: model\.backbone\.square_pad: 0: an MViT needs its images "
                                          r"padded to a square"):
        load_detector_spec(FIXTURE / "model_final.pth", cfg)
    with pytest.raises(NorcalError, match=r"^an MViT FPN needs its images padded to a square, a multiple of 32 "
                                          r"\(square_pad, got 0\)"):
        create_model(dataclasses.replace(case.spec, mvit=dataclasses.replace(MVIT, square_pad=0)))


def test_resize_past_the_square_is_refused(tmp_path):
    cfg = _config_with(tmp_path, f"max_size: {SQUARE}, short_edge_length: {SQUARE}",
                       f"max_size: {SQUARE + 32}, short_edge_length: {SQUARE}", FIXTURE)
    with pytest.raises(NorcalError, match=r"resizes to 288: a resized image must fit the 256 square"):
        load_detector_spec(FIXTURE / "model_final.pth", cfg)


def test_the_square_is_the_configs(tmp_path):
    """No weight shows the square: another square in the config is the model's."""
    cfg = _config_with(tmp_path, f"    square_pad: {SQUARE}\n", "    square_pad: 288\n", FIXTURE)
    spec, _ = load_detector_spec(FIXTURE / "model_final.pth", cfg)
    assert (spec.mvit.square_pad, spec.size_divisibility) == (288, 288)


def test_weights_alone_refuse_what_they_cannot_show():
    with pytest.raises(NorcalError, match=r"^backbone\.bottom_up: the MViT's LayerNorm eps, residual pooling and its "
                                          r"FPN's square_pad are not in its weights .*; pass the model's config\.yaml$"):
        load_detector_spec(FIXTURE / "model_final.pth")


def test_out_features_not_a_list_is_named_in_one_line(tmp_path):
    cfg = _config_with(tmp_path, "out_features: [scale2, scale3, scale4, scale5]", "out_features: 7", FIXTURE)
    with pytest.raises(NorcalError, match=r"model\.backbone\.bottom_up\.out_features 7: an FPN over scale2\.\.scale5"):
        load_detector_spec(FIXTURE / "model_final.pth", cfg)  # was a traceback (iterating an int)
