"""Values detectron2 would accept in a config but that make no usable model: refused at load.

The bounds are detectron2's own semantics: FastRCNNOutputLayers keeps ``scores > SCORE_THRESH_TEST``
(softmax / sigmoid scores lie in [0, 1], so a threshold >= 1 keeps nothing and a NaN one keeps
nothing either); NMS thresholds are IoUs in [0, 1]; ``Box2BoxTransform`` divides deltas by
BBOX_REG_WEIGHTS; the input is divided by PIXEL_STD; ``DefaultAnchorGenerator`` asserts
0 <= OFFSET < 1 and takes sizes and aspect ratios as lengths and ratios (> 0).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import SYNTH
from norcal.core.errors import NorcalError
from norcal.export.families.detectron2.yacs_config.spec import load_config

BAD = [
    ("MODEL:\n  ROI_HEADS:\n    SCORE_THRESH_TEST: .nan\n", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "nan"),
    ("MODEL:\n  ROI_HEADS:\n    SCORE_THRESH_TEST: 1.0\n", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "1.0"),
    ("MODEL:\n  ROI_HEADS:\n    SCORE_THRESH_TEST: -0.5\n", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "-0.5"),
    ("MODEL:\n  ROI_HEADS:\n    NMS_THRESH_TEST: -1\n", "MODEL.ROI_HEADS.NMS_THRESH_TEST", "-1"),
    ("MODEL:\n  ROI_HEADS:\n    NMS_THRESH_TEST: .inf\n", "MODEL.ROI_HEADS.NMS_THRESH_TEST", "inf"),
    ("MODEL:\n  RPN:\n    NMS_THRESH: 2\n", "MODEL.RPN.NMS_THRESH", "2"),
    ("MODEL:\n  PIXEL_STD: [0, 1, 1]\n", "MODEL.PIXEL_STD", "[0, 1, 1]"),
    ("MODEL:\n  PIXEL_STD: [-57.4, 57.1, 58.4]\n", "MODEL.PIXEL_STD", "-57.4"),
    ("MODEL:\n  PIXEL_MEAN: [.nan, 116.28, 123.675]\n", "MODEL.PIXEL_MEAN", "nan"),
    ("MODEL:\n  ROI_BOX_HEAD:\n    BBOX_REG_WEIGHTS: [0, 10, 5, 5]\n", "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS", "[0, 10"),
    ("MODEL:\n  RPN:\n    BBOX_REG_WEIGHTS: [1, 1, -1, 1]\n", "MODEL.RPN.BBOX_REG_WEIGHTS", "-1"),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    SIZES: [[0], [32], [64], [128], [256]]\n", "MODEL.ANCHOR_GENERATOR.SIZES", "[[0]"),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    ASPECT_RATIOS: [[-0.5, 1.0, 2.0]]\n", "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", "-0.5"),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    OFFSET: 1.0\n", "MODEL.ANCHOR_GENERATOR.OFFSET", "1.0"),
    ("MODEL:\n  ROI_HEADS:\n    SCORE_THRESH_TEST: '1e400'\n", "MODEL.ROI_HEADS.SCORE_THRESH_TEST", "inf"),
]


def _child(tmp_path, text: str):
    path = tmp_path / "child.yaml"
    path.write_text(f'_BASE_: "{SYNTH / "config.yaml"}"\n{text}')
    return path


def _refusal(path) -> str:
    """The message load_config refuses ``path`` with."""
    with pytest.raises(NorcalError) as err:
        load_config(path)
    return str(err.value)


@pytest.mark.parametrize("snippet,key,value", BAD, ids=[f"{k}={v}" for _, k, v in BAD])
def test_unusable_values_are_refused_in_one_line(tmp_path, snippet, key, value):
    path = _child(tmp_path, snippet)
    msg = _refusal(path)
    assert "\n" not in msg and str(path) in msg and key in msg and value in msg


@pytest.mark.parametrize("snippet,field,want", [
    ("MODEL:\n  ROI_HEADS:\n    SCORE_THRESH_TEST: 0.0\n", "score_thresh_test", 0.0),  # keep every score
    ("MODEL:\n  ROI_HEADS:\n    NMS_THRESH_TEST: 0.0\n", "nms_thresh_test", 0.0),  # any overlap suppresses
    ("MODEL:\n  ROI_HEADS:\n    NMS_THRESH_TEST: 1.0\n", "nms_thresh_test", 1.0),  # nothing suppressed
    ("MODEL:\n  ANCHOR_GENERATOR:\n    OFFSET: 0.5\n", "anchor_offset", 0.5),
])
def test_edge_values_detectron2_defines_are_kept(tmp_path, snippet, field, want):
    assert getattr(load_config(_child(tmp_path, snippet)), field) == want


@pytest.mark.parametrize("snippet,key,hint", [
    # a misspelt test key would silently leave detectron2's default (0.05), not the 0.5 meant
    ("MODEL:\n  ROI_HEADS:\n    SCORE_THRESH: 0.5\n", "MODEL.ROI_HEADS.SCORE_THRESH", "SCORE_THRESH_TEST"),
    ("TEST:\n  DETECTION_PER_IMAGE: 10\n", "TEST.DETECTION_PER_IMAGE", "DETECTIONS_PER_IMAGE"),
    ("INPUT:\n  MIN_SIZE: 600\n", "INPUT.MIN_SIZE", ""),
    ("MODEL:\n  RPN:\n    POST_NMS_TOP_N_TEST: 300\n", "MODEL.RPN.POST_NMS_TOP_N_TEST", "POST_NMS_TOPK_TEST"),
])
def test_keys_detectron2_does_not_have_are_refused(tmp_path, snippet, key, hint):
    path = _child(tmp_path, snippet)
    msg = _refusal(path)
    assert "\n" not in msg and str(path) in msg and key in msg and "not a detectron2 config key" in msg
    assert hint in msg


def test_keys_in_sections_we_do_not_read_and_training_keys_pass(tmp_path):
    # detectron2's configs/Base-RCNN-C4.yaml sets IGNORE_THRESHOLD, which detectron2 accepts
    spec = load_config(_child(tmp_path, "MODEL:\n  RPN:\n    IGNORE_THRESHOLD: -1.0\n  ROI_HEADS:\n"
                                         "    IGNORE_THRESHOLD: -1.0\nSOLVER:\n  ANYTHING: 1\n"
                                         "TEST:\n  EVAL_PERIOD: 5000\n"))
    assert spec.num_classes == 60


@pytest.mark.parametrize("snippet,key", [("MODEL: 5\n", "MODEL"), ("MODEL:\n  ROI_HEADS: [1]\n", "MODEL.ROI_HEADS")])
def test_a_section_that_is_not_a_mapping_names_the_file(tmp_path, snippet, key):
    path = _child(tmp_path, snippet)
    with pytest.raises(NorcalError, match=f"^{re.escape(str(path))}: config key {key} must be a mapping"):
        load_config(path)


@pytest.mark.parametrize("snippet,value,why", [
    # the --detections-per-image bound, which the config key skipped: TensorRT's TopK takes K < 3840
    ("TEST:\n  DETECTIONS_PER_IMAGE: 100000000\n", "100000000", "3839"),
    # detectron2 keeps at most POST_NMS_TOPK_TEST proposals x NUM_CLASSES (box, class) pairs: 50 x 60
    ("MODEL:\n  RPN:\n    POST_NMS_TOPK_TEST: 50\nTEST:\n  DETECTIONS_PER_IMAGE: 3001\n", "3001", "= 3000"),
])
def test_detections_per_image_beyond_what_the_graph_can_return(tmp_path, snippet, value, why):
    path = _child(tmp_path, snippet)
    msg = _refusal(path)
    assert "TEST.DETECTIONS_PER_IMAGE" in msg and value in msg and why in msg and str(path) in msg


def test_detections_per_image_parameter_beyond_the_proposals(tmp_path):
    from norcal.export.families.detectron2.loader import load_model

    path = _child(tmp_path, "MODEL:\n  RPN:\n    POST_NMS_TOPK_TEST: 50\nTEST:\n  DETECTIONS_PER_IMAGE: 100\n")
    with pytest.raises(NorcalError) as err:  # was torch's 'selected index k out of range' at export
        load_model(SYNTH / "model_final.pth", path, detections_per_image=3001)
    assert err.value.param == "detections_per_image" and "3001" in str(err.value) and "3000" in str(err.value)


@pytest.mark.slow
def test_rgb_config_means_the_image_reaches_the_model_as_rgb(tmp_path):
    """detectron2 with INPUT.FORMAT RGB feeds the network the image in RGB order; our graph takes
    BGR, so the RGB model on a BGR image must equal the same weights as a BGR model fed the
    channel-swapped (RGB) image."""
    import torch

    from norcal.export.families.detectron2.loader import load_model

    weights = SYNTH / "model_final.pth"
    _, rgb = load_model(weights, _child(tmp_path, "INPUT:\n  FORMAT: RGB\n"))
    _, bgr = load_model(weights, SYNTH / "config.yaml")
    g = torch.Generator().manual_seed(0)
    image = torch.rand((1, 3, 160, 192), generator=g) * 255
    image[:, 0] *= 0.3  # channels unlike each other, so a swap shows
    sizes = torch.tensor([[160, 192]])
    with torch.no_grad():
        got = rgb.inference(image, sizes)
        want = bgr.inference(image.flip(1), sizes)
        plain = bgr.inference(image, sizes)
    n = int(want["num_detections"][0])
    assert n > 0 and int(got["num_detections"][0]) == n
    torch.testing.assert_close(got["scores"][0, :n], want["scores"][0, :n], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got["boxes"][0, :n], want["boxes"][0, :n], atol=1e-2, rtol=1e-4)
    assert not torch.allclose(plain["scores"][0, :n], want["scores"][0, :n], atol=1e-3)


CASCADE = Path(__file__).parents[4] / "fixtures" / "d2_cascade_tiny"
TWO_STAGES = "MODEL:\n  ROI_BOX_CASCADE_HEAD:\n    BBOX_REG_WEIGHTS: [[10, 10, 5, 5], [20, 20, 10, 10]]\n    IOUS: [0.5, 0.6]\n"


def _cascade_child(tmp_path, text):
    path = tmp_path / "cascade.yaml"
    path.write_text(f'_BASE_: "{CASCADE / "config.yaml"}"\n{text}')
    return path


def test_cascade_config_with_fewer_stages_than_the_weights(tmp_path):
    from norcal.export.families.detectron2.loader import load_detector_spec

    path = _cascade_child(tmp_path, TWO_STAGES)
    # was accepted: the third stage's weights were dropped without a word
    with pytest.raises(NorcalError, match="gives 2 cascade stages .* holds 3"):
        load_detector_spec(CASCADE / "model_final.pth", path)


def test_two_stage_cascade_with_its_config_loads(tmp_path):
    import torch

    from norcal.export.families.detectron2.loader import load_detector_spec

    sd = torch.load(CASCADE / "model_final.pth", weights_only=True)["model"]
    two = {k: v for k, v in sd.items() if not k.startswith(("roi_heads.box_head.2.", "roi_heads.box_predictor.2."))}
    assert len(two) < len(sd)
    torch.save({"model": two}, tmp_path / "two.pth")
    # was refused: 'only detectron2's default 3 stages can be inferred from weights: pass the config'
    spec, _ = load_detector_spec(tmp_path / "two.pth", _cascade_child(tmp_path, TWO_STAGES))
    assert spec.cascade_bbox_reg_weights == ((10, 10, 5, 5), (20, 20, 10, 10))


def test_retinanet_class_count_mismatch_names_the_retinanet_key(tmp_path):
    from norcal.export.families.detectron2.loader import load_detector_spec

    fixture = Path(__file__).parents[4] / "fixtures" / "d2_retinanet_tiny"
    path = tmp_path / "retina.yaml"
    path.write_text(f'_BASE_: "{fixture / "config.yaml"}"\nMODEL:\n  RETINANET:\n    NUM_CLASSES: 10\n')
    with pytest.raises(NorcalError) as err:  # named MODEL.ROI_HEADS.NUM_CLASSES, which RetinaNet does not read
        load_detector_spec(fixture / "model_final.pth", path)
    msg = str(err.value)
    assert "MODEL.RETINANET.NUM_CLASSES = 10" in msg and "1203 classes" in msg and "ROI_HEADS" not in msg


def test_a_python_base_is_refused_by_name(tmp_path):
    (tmp_path / "base.py").write_text("x = 1\n")
    path = tmp_path / "child.yaml"
    path.write_text("_BASE_: base.py\n")
    with pytest.raises(NorcalError, match=r"_BASE_ base\.py is a Python config"):  # was 'must be a YAML mapping, found str'
        load_config(path)


def test_min_size_test_zero_says_what_detectron2_means_by_it(tmp_path):
    with pytest.raises(NorcalError, match=r"INPUT\.MIN_SIZE_TEST: 0: 0 \(no resizing at test time\) is not supported"):
        load_config(_child(tmp_path, "INPUT:\n  MIN_SIZE_TEST: 0\n"))
    with pytest.raises(NorcalError, match=r"INPUT\.MIN_SIZE_TEST: -5: must be >= 1"):
        load_config(_child(tmp_path, "INPUT:\n  MIN_SIZE_TEST: -5\n"))


# Values that size the graph's memory or time: detectron2 takes any number, and each of these
# loaded without a word before (an input side of 10^7, 10^9 proposals, a 10^6 sampling ratio)
RETINANET_CONFIG = Path(__file__).parents[4] / "fixtures" / "d2_retinanet_tiny" / "config.yaml"
SIZING = [
    ("INPUT:\n  MIN_SIZE_TEST: 10000000\n", "INPUT.MIN_SIZE_TEST", "10000000", "<= 8192"),
    ("INPUT:\n  MAX_SIZE_TEST: 10000000\n", "INPUT.MAX_SIZE_TEST", "10000000", "<= 8192"),
    ("MODEL:\n  RPN:\n    PRE_NMS_TOPK_TEST: 1000000000\n", "MODEL.RPN.PRE_NMS_TOPK_TEST", "1000000000", "<= 61424"),
    ("MODEL:\n  RPN:\n    POST_NMS_TOPK_TEST: 1000000000\n", "MODEL.RPN.POST_NMS_TOPK_TEST", "1000000000",
     "<= 3839 (TensorRT's TopK limit)"),
    ("MODEL:\n  RPN:\n    POST_NMS_TOPK_TEST: 3840\n", "MODEL.RPN.POST_NMS_TOPK_TEST", "3840", "<= 3839"),
    ("MODEL:\n  ROI_BOX_HEAD:\n    POOLER_SAMPLING_RATIO: 1000000\n", "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO",
     "1000000", "<= 64"),
    ("MODEL:\n  ROI_MASK_HEAD:\n    POOLER_SAMPLING_RATIO: 1000000\n", "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO",
     "1000000", "<= 64"),
    ("MODEL:\n  ROI_MASK_HEAD:\n    POOLER_RESOLUTION: 100000\n", "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION",
     "100000", "<= 256"),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    SIZES: [[1000000000]]\n", "MODEL.ANCHOR_GENERATOR.SIZES", "1000000000",
     "<= 8192"),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    ASPECT_RATIOS: [[0.5, 1.0, 1.0e+9]]\n", "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS",
     "1000000000.0", "ratio <= 1024"),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    ASPECT_RATIOS: [[1.0e-9, 1.0, 2.0]]\n", "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS",
     "1e-09", "1/1024 <="),
]


@pytest.mark.parametrize("snippet,key,value,bound", SIZING, ids=[f"{k}={v}" for _, k, v, _ in SIZING])
def test_values_that_size_memory_are_bounded_by_key(tmp_path, snippet, key, value, bound):
    path = _child(tmp_path, snippet)
    msg = _refusal(path)
    assert "\n" not in msg and str(path) in msg and f"{key}: " in msg and value in msg and bound in msg


def test_retinanet_candidates_are_bounded_by_key(tmp_path):
    path = tmp_path / "child.yaml"
    path.write_text(f'_BASE_: "{RETINANET_CONFIG}"\nMODEL:\n  RETINANET:\n    TOPK_CANDIDATES_TEST: 1000000000\n')
    msg = _refusal(path)
    assert "\n" not in msg and str(path) in msg and "MODEL.RETINANET.TOPK_CANDIDATES_TEST: 1000000000" in msg
    assert "<= 61424" in msg


@pytest.mark.parametrize("snippet,field,want", [
    ("INPUT:\n  MIN_SIZE_TEST: 8192\n  MAX_SIZE_TEST: 8192\n", "max_size_test", 8192),
    ("MODEL:\n  RPN:\n    POST_NMS_TOPK_TEST: 3839\n", "rpn_post_nms_topk_test", 3839),
    ("MODEL:\n  RPN:\n    PRE_NMS_TOPK_TEST: 61424\n", "rpn_pre_nms_topk_test", 61424),  # 16 TopKs of 3839
    ("MODEL:\n  ROI_BOX_HEAD:\n    POOLER_SAMPLING_RATIO: 64\n", "pooler_sampling_ratio", 64),
    ("MODEL:\n  ROI_MASK_HEAD:\n    POOLER_RESOLUTION: 256\n", "mask_pooler_resolution", 256),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    ASPECT_RATIOS: [[0.0009765625, 1.0, 1024]]\n", "anchor_aspect_ratios",
     ((1 / 1024, 1.0, 1024.0),)),
])
def test_values_at_their_bound_are_kept(tmp_path, snippet, field, want):
    assert getattr(load_config(_child(tmp_path, snippet)), field) == want
