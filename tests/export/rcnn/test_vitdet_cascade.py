"""ViTDet's Cascade Mask R-CNN (detectron2's ``projects/ViTDet/configs/LVIS/
cascade_mask_rcnn_vitdet_b_100ep.py``: ViT + SimpleFeaturePyramid padded to its square, three
cascade stages of LN box heads with class-agnostic boxes and sigmoid classifiers (federated loss),
LN mask head) against the real detectron2's goldens (tests/fixtures/d2_vitdet_cascade_tiny):
the exported graph in ONNX Runtime, all three fixture images in one batch, at gamma 0 and 0.5
(NorCal on every stage's classifier), read from the fixture's config.yaml; one export shared.
"""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from test_c4_dc5 import check_detections
from test_vitdet import Case, check_alone_equals_batched
from norcal.core import contract
from norcal.export.rcnn.spec import CASCADE_ROI_HEADS

FIXTURE = FIXTURES / "d2_vitdet_cascade_tiny"
SQUARE = 320  # make_vitdet_tiny.SQUARE: the ViT's square_pad and ResizeShortestEdge(320, 320)
@pytest.fixture(scope="module")
def case() -> Case:
    return Case(FIXTURE, SQUARE)


def test_config_gives_detectron2s_vitdet_cascade(case):
    s = case.spec
    assert (s.vit.embed_dim, s.vit.depth, s.vit.window_block_indexes, s.vit.square_pad) == (24, 4, (0, 2), SQUARE)
    assert (s.roi_heads_name, s.cascade_bbox_reg_weights) == (
        CASCADE_ROI_HEADS, ((10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15)))
    assert (s.fpn_norm, s.box_head_norm, s.mask_head_norm, s.use_sigmoid_ce, s.cls_agnostic_bbox_reg) == (
        "LN", "LN", "LN", True, True)
    # every stage's classifier carries a NorCal node once calibrated
    nodes = [n for n in case.calibrated("cdt_g0.5").graph.node if n.domain == contract.NODE_DOMAIN]
    assert len(nodes) == 3


@pytest.mark.parametrize("setting", ("baseline", "cdt_g0.5"))
def test_onnxruntime_batch_matches_golden(case, setting):
    check_detections(case.ort_outputs(setting), setting, FIXTURE)


def test_image_alone_equals_image_in_a_batch(case):
    """Every image is padded to the square alone or batched, so each image's detections are the same."""
    check_alone_equals_batched(case, FIXTURE, SQUARE)
