"""Reading detectron2 YAML configs (with _BASE_ chains) into ModelSpec, without detectron2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import SYNTH
from norcal.core.errors import NorcalError
from norcal.export.families.detectron2.yacs_config.spec import load_config
from norcal.export.families.detectron2.yacs_config.file import load_yaml_with_base

FIXTURES = Path(__file__).parents[4] / "fixtures"
FIXTURE_CONFIGS = [FIXTURES / "d2_lvis_tiny" / "config.yaml", SYNTH / "config.yaml",
                   FIXTURES / "d2_c4_tiny" / "config.yaml", FIXTURES / "d2_dc5_tiny" / "config.yaml"]

# detectron2 key -> ModelSpec field, for keys whose value is copied as is
KEY_TO_FIELD = {
    "MODEL.META_ARCHITECTURE": "meta_architecture",
    "MODEL.PIXEL_MEAN": "pixel_mean", "MODEL.PIXEL_STD": "pixel_std",
    "INPUT.FORMAT": "input_format", "INPUT.MIN_SIZE_TEST": "min_size_test", "INPUT.MAX_SIZE_TEST": "max_size_test",
    "MODEL.RESNETS.DEPTH": "depth", "MODEL.RESNETS.NORM": "norm",
    "MODEL.RESNETS.STEM_OUT_CHANNELS": "stem_out_channels", "MODEL.RESNETS.RES2_OUT_CHANNELS": "res2_out_channels",
    "MODEL.RESNETS.NUM_GROUPS": "num_groups", "MODEL.RESNETS.WIDTH_PER_GROUP": "width_per_group",
    "MODEL.RESNETS.STRIDE_IN_1X1": "stride_in_1x1", "MODEL.RESNETS.RES5_DILATION": "res5_dilation",
    "MODEL.FPN.OUT_CHANNELS": "fpn_out_channels", "MODEL.FPN.NORM": "fpn_norm", "MODEL.FPN.FUSE_TYPE": "fpn_fuse_type",
    "MODEL.ANCHOR_GENERATOR.SIZES": "anchor_sizes", "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS": "anchor_aspect_ratios",
    "MODEL.ANCHOR_GENERATOR.OFFSET": "anchor_offset", "MODEL.RPN.CONV_DIMS": "rpn_conv_dims",
    "MODEL.RPN.BBOX_REG_WEIGHTS": "rpn_bbox_reg_weights", "MODEL.RPN.PRE_NMS_TOPK_TEST": "rpn_pre_nms_topk_test",
    "MODEL.RPN.POST_NMS_TOPK_TEST": "rpn_post_nms_topk_test", "MODEL.RPN.NMS_THRESH": "rpn_nms_thresh",
    "MODEL.PROPOSAL_GENERATOR.MIN_SIZE": "rpn_min_size",
    "MODEL.ROI_HEADS.NUM_CLASSES": "num_classes", "MODEL.ROI_BOX_HEAD.POOLER_TYPE": "pooler_type",
    "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION": "pooler_resolution",
    "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO": "pooler_sampling_ratio",
    "MODEL.ROI_BOX_HEAD.NUM_CONV": "box_head_num_conv", "MODEL.ROI_BOX_HEAD.CONV_DIM": "box_head_conv_dim",
    "MODEL.ROI_BOX_HEAD.NUM_FC": "box_head_num_fc", "MODEL.ROI_BOX_HEAD.FC_DIM": "box_head_fc_dim",
    "MODEL.ROI_BOX_HEAD.NORM": "box_head_norm", "MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS": "bbox_reg_weights",
    "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG": "cls_agnostic_bbox_reg",
    "MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE": "use_sigmoid_ce",
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST": "score_thresh_test", "MODEL.ROI_HEADS.NMS_THRESH_TEST": "nms_thresh_test",
    "TEST.DETECTIONS_PER_IMAGE": "detections_per_image", "MODEL.MASK_ON": "mask_on",
    "MODEL.ROI_MASK_HEAD.NUM_CONV": "mask_head_num_conv", "MODEL.ROI_MASK_HEAD.CONV_DIM": "mask_head_conv_dim",
    "MODEL.ROI_MASK_HEAD.NORM": "mask_head_norm",
    "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION": "mask_pooler_resolution",
    "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO": "mask_pooler_sampling_ratio",
    "MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK": "cls_agnostic_mask",
}


def _lookup(cfg: dict, key: str):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def _plain(v):
    """Tuples to lists, recursively, to compare with YAML values."""
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


@pytest.mark.parametrize("path", FIXTURE_CONFIGS, ids=lambda p: p.parent.name)
def test_fixture_config_maps_every_key(path):
    raw = yaml.safe_load(path.read_text())  # complete cfg.dump(): every key is in the file
    spec = load_config(path)
    for key, field in KEY_TO_FIELD.items():
        assert _plain(getattr(spec, field)) == _lookup(raw, key), key


def test_fixture_values_from_readme():
    lvis = load_config(FIXTURE_CONFIGS[0])
    assert (lvis.min_size_test, lvis.max_size_test, lvis.num_classes) == (320, 512, 1203)
    assert (lvis.score_thresh_test, lvis.detections_per_image, lvis.input_format) == (1e-4, 300, "BGR")
    synth = load_config(FIXTURE_CONFIGS[1])
    assert (synth.min_size_test, synth.max_size_test, synth.num_classes) == (256, 400, 60)
    assert synth.anchor_sizes == ((16,), (32,), (64,), (128,), (256,))


BASE_RCNN_FPN = """\
    MODEL:
      META_ARCHITECTURE: "GeneralizedRCNN"
      BACKBONE:
        NAME: "build_resnet_fpn_backbone"
      RESNETS:
        OUT_FEATURES: ["res2", "res3", "res4", "res5"]
      FPN:
        IN_FEATURES: ["res2", "res3", "res4", "res5"]
      ANCHOR_GENERATOR:
        SIZES: [[32], [64], [128], [256], [512]]  # One size for each in feature map
        ASPECT_RATIOS: [[0.5, 1.0, 2.0]]  # Three aspect ratios (same for all in feature maps)
      RPN:
        IN_FEATURES: ["p2", "p3", "p4", "p5", "p6"]
        PRE_NMS_TOPK_TRAIN: 2000
        PRE_NMS_TOPK_TEST: 1000
        POST_NMS_TOPK_TRAIN: 1000
        POST_NMS_TOPK_TEST: 1000
      ROI_HEADS:
        NAME: "StandardROIHeads"
        IN_FEATURES: ["p2", "p3", "p4", "p5"]
      ROI_BOX_HEAD:
        NAME: "FastRCNNConvFCHead"
        NUM_FC: 2
        POOLER_RESOLUTION: 7
      ROI_MASK_HEAD:
        NAME: "MaskRCNNConvUpsampleHead"
        NUM_CONV: 4
        POOLER_RESOLUTION: 14
    DATASETS:
      TRAIN: ("coco_2017_train",)
      TEST: ("coco_2017_val",)
    SOLVER:
      IMS_PER_BATCH: 16
      BASE_LR: 0.02
      STEPS: (60000, 80000)
      MAX_ITER: 90000
    INPUT:
      MIN_SIZE_TRAIN: (640, 672, 704, 736, 768, 800)
    VERSION: 2
"""

LVIS_CHILD = """\
    _BASE_: "../Base-RCNN-FPN.yaml"
    MODEL:
      WEIGHTS: "detectron2://ImageNetPretrained/MSRA/R-50.pkl"
      MASK_ON: True
      RESNETS:
        DEPTH: 50
      ROI_HEADS:
        NUM_CLASSES: 1203
        SCORE_THRESH_TEST: 0.0001
      RPN:
        POST_NMS_TOPK_TEST: 500
    INPUT:
      MIN_SIZE_TRAIN: (640, 672, 704, 736, 768, 800)
    DATASETS:
      TRAIN: ("lvis_v1_train",)
      TEST: ("lvis_v1_val",)
    TEST:
      DETECTIONS_PER_IMAGE: 300  # LVIS allows up to 300
    DATALOADER:
      SAMPLER_TRAIN: "RepeatFactorTrainingSampler"
      REPEAT_THRESHOLD: 0.001
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def lvis_chain(tmp_path):
    _write(tmp_path / "Base-RCNN-FPN.yaml", BASE_RCNN_FPN)
    return _write(tmp_path / "LVISv1-InstanceSegmentation" / "mask_rcnn_R_50_FPN_1x.yaml", LVIS_CHILD)


def test_base_chain_child_overrides_and_defaults_fill(lvis_chain):
    spec = load_config(lvis_chain)
    # the child's values
    assert spec.num_classes == 1203 and spec.mask_on is True
    assert spec.score_thresh_test == 1e-4 and spec.detections_per_image == 300
    assert spec.rpn_post_nms_topk_test == 500
    # the base's values, in a mapping the child also sets (MODEL.RPN): nested dicts merge
    assert spec.rpn_pre_nms_topk_test == 1000
    assert spec.pooler_resolution == 7 and spec.box_head_num_fc == 2 and spec.mask_head_num_conv == 4
    assert spec.anchor_sizes == ((32,), (64,), (128,), (256,), (512,))
    # keys no file sets: detectron2/config/defaults.py
    assert spec.fpn_out_channels == 256 and spec.box_head_fc_dim == 1024 and spec.mask_head_conv_dim == 256
    assert (spec.min_size_test, spec.max_size_test) == (800, 1333)
    assert spec.nms_thresh_test == 0.5 and spec.rpn_nms_thresh == 0.7
    assert spec.norm == "FrozenBN" and spec.stride_in_1x1 is True and spec.width_per_group == 64
    assert spec.res2_out_channels == 256 and spec.stem_out_channels == 64
    assert spec.bbox_reg_weights == (10, 10, 5, 5) and spec.rpn_bbox_reg_weights == (1, 1, 1, 1)
    assert spec.pixel_mean == (103.53, 116.28, 123.675) and spec.pixel_std == (1, 1, 1)
    assert spec.cls_agnostic_bbox_reg is False and spec.use_sigmoid_ce is False


def test_detectron2_defaults_where_the_lvis_config_is_silent(tmp_path):
    _write(tmp_path / "Base-RCNN-FPN.yaml", BASE_RCNN_FPN)
    spec = load_config(_write(tmp_path / "c" / "x.yaml", '_BASE_: "../Base-RCNN-FPN.yaml"\n'))
    assert spec.score_thresh_test == 0.05 and spec.detections_per_image == 100
    assert spec.num_classes == 80 and spec.mask_on is False


def test_a_config_reads_as_detectron2s_convention_the_bare_specs_default(tmp_path):
    from norcal.export.families.detectron2.convention import DETECTRON2
    from norcal.export.rcnn.spec import ModelSpec

    _write(tmp_path / "Base-RCNN-FPN.yaml", BASE_RCNN_FPN)
    spec = load_config(_write(tmp_path / "c" / "x.yaml", '_BASE_: "../Base-RCNN-FPN.yaml"\n'))
    assert spec.convention is DETECTRON2 and ModelSpec().convention == DETECTRON2
    assert DETECTRON2.background == "last" and DETECTRON2.resize is None


def test_three_level_chain_and_list_of_bases(tmp_path, lvis_chain):
    _write(tmp_path / "extra" / "sigmoid.yaml", "MODEL:\n  ROI_BOX_HEAD:\n    USE_SIGMOID_CE: true\n")
    grandchild = _write(tmp_path / "LVISv1-InstanceSegmentation" / "deeper" / "x101.yaml", """\
        _BASE_: ["../mask_rcnn_R_50_FPN_1x.yaml", "../../extra/sigmoid.yaml"]
        MODEL:
          RESNETS:
            DEPTH: 101
            NUM_GROUPS: 32
            WIDTH_PER_GROUP: 8
            STRIDE_IN_1X1: False
          PIXEL_STD: [57.375, 57.120, 58.395]
    """)
    spec = load_config(grandchild)
    assert (spec.depth, spec.num_groups, spec.width_per_group, spec.stride_in_1x1) == (101, 32, 8, False)
    assert spec.use_sigmoid_ce is True
    assert spec.num_classes == 1203 and spec.pooler_resolution == 7
    assert spec.pixel_std == (57.375, 57.12, 58.395)


def test_merge_semantics_of_yaml_with_base(tmp_path):
    _write(tmp_path / "a.yaml", "A:\n  X: 1\n  Y: [1, 2]\n  N:\n    P: 1\n    Q: 2\nB: base\n")
    child = _write(tmp_path / "b.yaml", "_BASE_: a.yaml\nA:\n  Y: [3]\n  N:\n    Q: 5\nC: new\n")
    assert load_yaml_with_base(child) == {"A": {"X": 1, "Y": [3], "N": {"P": 1, "Q": 5}}, "B": "base", "C": "new"}


def test_string_numbers_are_decoded_like_yacs(tmp_path, lvis_chain):
    # YAML 1.1 reads 1e-4 (no dot) as a string; yacs literal-evals it to a float
    child = _write(tmp_path / "x.yaml",
                   '_BASE_: "Base-RCNN-FPN.yaml"\nMODEL:\n  ROI_HEADS:\n    SCORE_THRESH_TEST: 1e-4\n')
    _write(tmp_path / "Base-RCNN-FPN.yaml", BASE_RCNN_FPN)
    assert load_config(child).score_thresh_test == 1e-4


def test_training_only_keys_are_ignored(tmp_path):
    _write(tmp_path / "Base-RCNN-FPN.yaml", BASE_RCNN_FPN)
    child = _write(tmp_path / "x.yaml", """\
        _BASE_: "Base-RCNN-FPN.yaml"
        SOLVER:
          OPTIMIZER: "something-we-never-heard-of"
          AMP:
            ENABLED: true
        DATASETS:
          TRAIN: ("my_private_set",)
        MODEL:
          BACKBONE:
            FREEZE_AT: 0
          ROI_BOX_HEAD:
            USE_FED_LOSS: true
        INPUT:
          CROP:
            ENABLED: true
    """)
    assert load_config(child).num_classes == 80


UNSUPPORTED = [
    ("MODEL:\n  META_ARCHITECTURE: RetinaNet\n", "MODEL.BACKBONE.NAME", "build_resnet_fpn_backbone"),
    ("MODEL:\n  RESNETS:\n    DEFORM_ON_PER_STAGE: [false, true, true, true]\n",
     "MODEL.RESNETS.DEFORM_ON_PER_STAGE", "True"),
    ("MODEL:\n  ROI_HEADS:\n    NAME: CascadeROIHeads\n", "MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG", "False"),
    ("MODEL:\n  ROI_HEADS:\n    NAME: CascadeROIHeads\n  ROI_BOX_HEAD:\n    CLS_AGNOSTIC_BBOX_REG: true\n"
     "  ROI_BOX_CASCADE_HEAD:\n    IOUS: [0.5, 0.6]\n", "MODEL.ROI_BOX_CASCADE_HEAD.IOUS", "one IoU per stage"),
    ("MODEL:\n  KEYPOINT_ON: true\n", "MODEL.KEYPOINT_ON", "True"),
    ("TEST:\n  AUG:\n    ENABLED: true\n", "TEST.AUG.ENABLED", "True"),
    ("MODEL:\n  RPN:\n    HEAD_NAME: CustomRPNHead\n", "MODEL.RPN.HEAD_NAME", "CustomRPNHead"),
    ("MODEL:\n  ROI_BOX_HEAD:\n    POOLER_TYPE: ROIPool\n", "MODEL.ROI_BOX_HEAD.POOLER_TYPE", "ROIPool"),
    ("MODEL:\n  MASK_ON: true\n  ROI_MASK_HEAD:\n    POOLER_TYPE: ROIPool\n", "MODEL.ROI_MASK_HEAD.POOLER_TYPE",
     "ROIPool"),
    ("MODEL:\n  BACKBONE:\n    NAME: build_vit_backbone\n", "MODEL.BACKBONE.NAME", "build_vit_backbone"),
    ("MODEL:\n  FPN:\n    FUSE_TYPE: avg\n", "MODEL.FPN.FUSE_TYPE", "avg"),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    NAME: RotatedAnchorGenerator\n", "MODEL.ANCHOR_GENERATOR.NAME",
     "RotatedAnchorGenerator"),
    ("MODEL:\n  LOAD_PROPOSALS: true\n", "MODEL.LOAD_PROPOSALS", "True"),
    ("MODEL:\n  PROPOSAL_GENERATOR:\n    NAME: RRPN\n", "MODEL.PROPOSAL_GENERATOR.NAME", "RRPN"),
    ("MODEL:\n  RESNETS:\n    RES5_DILATION: 2\n", "MODEL.RESNETS.RES5_DILATION", "2"),
    ("MODEL:\n  RESNETS:\n    DEPTH: 42\n", "MODEL.RESNETS.DEPTH", "42"),
    ("MODEL:\n  RESNETS:\n    NORM: LN\n", "MODEL.RESNETS.NORM", "LN"),
    ("MODEL:\n  FPN:\n    IN_FEATURES: [res3, res4, res5]\n", "MODEL.FPN.IN_FEATURES", "res3"),
    ("MODEL:\n  ROI_BOX_HEAD:\n    NAME: FastRCNNFCHead\n", "MODEL.ROI_BOX_HEAD.NAME", "FastRCNNFCHead"),
    ("INPUT:\n  FORMAT: YUV-BT.601\n", "INPUT.FORMAT", "YUV-BT.601"),
    ("MODEL:\n  ANCHOR_GENERATOR:\n    SIZES: [[32], [64, 90], [128], [256], [512]]\n",
     "MODEL.ANCHOR_GENERATOR.SIZES", "same number of anchors"),
    ("MODEL:\n  ROI_HEADS:\n    NUM_CLASSES: many\n", "MODEL.ROI_HEADS.NUM_CLASSES", "many"),
    ("VERSION: 1\n", "VERSION", "1"),
]


@pytest.mark.parametrize("snippet,key,value", UNSUPPORTED, ids=[u[1] for u in UNSUPPORTED])
def test_unsupported_inference_keys(tmp_path, snippet, key, value):
    _write(tmp_path / "Base-RCNN-FPN.yaml", BASE_RCNN_FPN)
    child = _write(tmp_path / "child.yaml", '_BASE_: "Base-RCNN-FPN.yaml"\n' + snippet)
    with pytest.raises(NorcalError) as err:
        load_config(child)
    assert key in str(err.value) and value in str(err.value)


def test_detectron2_defaults_are_a_c4_model(tmp_path):
    # detectron2's defaults describe a C4 model: build_resnet_backbone + Res5ROIHeads on res4
    spec = load_config(_write(tmp_path / "c4.yaml", "MODEL:\n  MASK_ON: false\n"))
    assert (spec.backbone_name, spec.backbone_out_feature, spec.roi_heads_name) == \
        ("build_resnet_backbone", "res4", "Res5ROIHeads")
    assert (spec.rpn_pre_nms_topk_test, spec.pooler_resolution, spec.num_classes) == (6000, 14, 80)


# detectron2's configs/Base-RCNN-C4.yaml and Base-RCNN-DilatedC5.yaml, as the model zoo has them
BASE_RCNN_C4 = """\
    MODEL:
      META_ARCHITECTURE: "GeneralizedRCNN"
      RPN:
        PRE_NMS_TOPK_TEST: 6000
        POST_NMS_TOPK_TEST: 1000
        IGNORE_THRESHOLD: -1.0
      ROI_HEADS:
        NAME: "Res5ROIHeads"
        IGNORE_THRESHOLD: -1.0
    DATASETS:
      TRAIN: ("coco_2017_train",)
      TEST: ("coco_2017_val",)
    SOLVER:
      IMS_PER_BATCH: 16
      BASE_LR: 0.02
      STEPS: (60000, 80000)
      MAX_ITER: 90000
    INPUT:
      MIN_SIZE_TRAIN: (640, 672, 704, 736, 768, 800)
    VERSION: 2
"""

BASE_RCNN_DC5 = """\
    MODEL:
      META_ARCHITECTURE: "GeneralizedRCNN"
      RESNETS:
        OUT_FEATURES: ["res5"]
        RES5_DILATION: 2
      RPN:
        IN_FEATURES: ["res5"]
        PRE_NMS_TOPK_TEST: 6000
        POST_NMS_TOPK_TEST: 1000
      ROI_HEADS:
        NAME: "StandardROIHeads"
        IN_FEATURES: ["res5"]
      ROI_BOX_HEAD:
        NAME: "FastRCNNConvFCHead"
        NUM_FC: 2
        POOLER_RESOLUTION: 7
      ROI_MASK_HEAD:
        NAME: "MaskRCNNConvUpsampleHead"
        NUM_CONV: 4
        POOLER_RESOLUTION: 14
    DATASETS:
      TRAIN: ("coco_2017_train",)
      TEST: ("coco_2017_val",)
    INPUT:
      MIN_SIZE_TRAIN: (640, 672, 704, 736, 768, 800)
"""


def test_model_zoo_c4_and_dc5_chains(tmp_path):
    _write(tmp_path / "Base-RCNN-C4.yaml", BASE_RCNN_C4)
    _write(tmp_path / "Base-RCNN-DilatedC5.yaml", BASE_RCNN_DC5)
    c4 = load_config(_write(tmp_path / "COCO-InstanceSegmentation" / "mask_rcnn_R_50_C4_1x.yaml", """\
        _BASE_: "../Base-RCNN-C4.yaml"
        MODEL:
          WEIGHTS: "detectron2://ImageNetPretrained/MSRA/R-50.pkl"
          MASK_ON: True
          RESNETS:
            DEPTH: 50
    """))
    assert (c4.backbone_name, c4.backbone_out_feature, c4.roi_heads_name) == \
        ("build_resnet_backbone", "res4", "Res5ROIHeads")
    assert (c4.mask_on, c4.mask_head_num_conv, c4.pooler_resolution, c4.mask_pooler_resolution) == (True, 0, 14, 14)
    assert (c4.anchor_sizes, c4.anchor_aspect_ratios) == (((32, 64, 128, 256, 512),), ((0.5, 1.0, 2.0),))
    assert (c4.rpn_pre_nms_topk_test, c4.rpn_post_nms_topk_test, c4.res5_dilation) == (6000, 1000, 1)
    dc5 = load_config(_write(tmp_path / "COCO-Detection" / "faster_rcnn_R_101_DC5_3x.yaml", """\
        _BASE_: "../Base-RCNN-DilatedC5.yaml"
        MODEL:
          MASK_ON: False
          RESNETS:
            DEPTH: 101
    """))
    assert (dc5.backbone_name, dc5.backbone_out_feature, dc5.roi_heads_name) == \
        ("build_resnet_backbone", "res5", "StandardROIHeads")
    assert (dc5.depth, dc5.res5_dilation, dc5.pooler_resolution, dc5.box_head_num_fc) == (101, 2, 7, 2)
    assert dc5.calibration is None and c4.calibration is None


SINGLE_FEATURE_REFUSALS = [
    ("Base-RCNN-C4.yaml", "MODEL:\n  RESNETS:\n    OUT_FEATURES: [res5]\n", "MODEL.RESNETS.OUT_FEATURES",
     "Res5ROIHeads (C4) runs res5 on res4"),
    ("Base-RCNN-C4.yaml", "MODEL:\n  RESNETS:\n    OUT_FEATURES: [res3, res4]\n", "MODEL.RESNETS.OUT_FEATURES",
     "exactly one of res4 (C4), res5 (DC5)"),
    ("Base-RCNN-C4.yaml", "MODEL:\n  RPN:\n    IN_FEATURES: [res5]\n", "MODEL.RPN.IN_FEATURES",
     "the backbone's output"),
    ("Base-RCNN-DilatedC5.yaml", "MODEL:\n  ROI_HEADS:\n    IN_FEATURES: [res4]\n",
     "MODEL.ROI_HEADS.IN_FEATURES", "the backbone's output"),
    ("Base-RCNN-DilatedC5.yaml", "MODEL:\n  RESNETS:\n    RES5_DILATION: 3\n", "MODEL.RESNETS.RES5_DILATION",
     "1 or 2"),
    ("Base-RCNN-DilatedC5.yaml", "MODEL:\n  RESNETS:\n    OUT_FEATURES: [res4]\n  RPN:\n    IN_FEATURES: [res4]\n"
     "  ROI_HEADS:\n    IN_FEATURES: [res4]\n", "MODEL.RESNETS.OUT_FEATURES", "res4 goes with Res5ROIHeads"),
    ("Base-RCNN-FPN.yaml", "MODEL:\n  ROI_HEADS:\n    NAME: Res5ROIHeads\n", "MODEL.ROI_HEADS.NAME",
     "FPN models need StandardROIHeads"),
]


@pytest.mark.parametrize("base,snippet,key,why", SINGLE_FEATURE_REFUSALS)
def test_inconsistent_c4_dc5_configs_are_refused(tmp_path, base, snippet, key, why):
    text = {"Base-RCNN-C4.yaml": BASE_RCNN_C4, "Base-RCNN-DilatedC5.yaml": BASE_RCNN_DC5,
            "Base-RCNN-FPN.yaml": BASE_RCNN_FPN}[base]
    _write(tmp_path / base, text)
    with pytest.raises(NorcalError) as err:
        load_config(_write(tmp_path / "child.yaml", f'_BASE_: "{base}"\n' + snippet))
    assert key in str(err.value) and why in str(err.value)


# models we do not export: the one-line refusal names the key and says what is supported
STILL_REFUSED = [
    ("MODEL:\n  META_ARCHITECTURE: PanopticFPN\n", "MODEL.META_ARCHITECTURE"),
    ("MODEL:\n  META_ARCHITECTURE: ProposalNetwork\n", "MODEL.META_ARCHITECTURE"),
    ("MODEL:\n  META_ARCHITECTURE: RetinaNet\n  BACKBONE:\n    NAME: build_retinanet_resnet_fpn_backbone\n",
     "MODEL.RESNETS.OUT_FEATURES"),
    ("MODEL:\n  BACKBONE:\n    NAME: build_resnet_backbone\n  RESNETS:\n    OUT_FEATURES: [res5]\n"
     "  RPN:\n    IN_FEATURES: [res5]\n  ROI_HEADS:\n    NAME: CascadeROIHeads\n    IN_FEATURES: [res5]\n",
     "MODEL.ROI_HEADS.NAME"),
    ("MODEL:\n  KEYPOINT_ON: true\n", "MODEL.KEYPOINT_ON"),
    ("MODEL:\n  LOAD_PROPOSALS: true\n  PROPOSAL_GENERATOR:\n    NAME: PrecomputedProposals\n",
     "MODEL.LOAD_PROPOSALS"),
    ("MODEL:\n  PROPOSAL_GENERATOR:\n    NAME: PrecomputedProposals\n", "MODEL.PROPOSAL_GENERATOR.NAME"),
    ("MODEL:\n  RESNETS:\n    DEFORM_ON_PER_STAGE: [false, true, true, true]\n",
     "MODEL.RESNETS.DEFORM_ON_PER_STAGE"),
]


@pytest.mark.parametrize("snippet,key", STILL_REFUSED, ids=[s.split()[-1] for s, _ in STILL_REFUSED])
def test_refusals_say_what_is_supported(tmp_path, snippet, key):
    _write(tmp_path / "Base-RCNN-FPN.yaml", BASE_RCNN_FPN)
    with pytest.raises(NorcalError) as err:
        load_config(_write(tmp_path / "child.yaml", '_BASE_: "Base-RCNN-FPN.yaml"\n' + snippet))
    msg = str(err.value)
    assert key in msg and "\n" not in msg
    assert "supported" in msg and ("FPN, C4 or DC5" in msg or "only RPN proposals" in msg), msg


# the NorCal authors' configs (github.com/tydpan/NorCal, projects/NorCal/configs), as they write them
BASE_NORCAL = """\
    MODEL:
      WEIGHTS: ""
      MASK_ON: True
      META_ARCHITECTURE: "GeneralizedRCNN"
      BACKBONE:
        NAME: "build_resnet_fpn_backbone"
      RESNETS:
        DEPTH: 50
        OUT_FEATURES: ["res2", "res3", "res4", "res5"]
      FPN:
        IN_FEATURES: ["res2", "res3", "res4", "res5"]
      ANCHOR_GENERATOR:
        SIZES: [[32], [64], [128], [256], [512]] # One size for each in feature map
        ASPECT_RATIOS: [[0.5, 1.0, 2.0]] # Three aspect ratios (same for all in feature maps)
      RPN:
        IN_FEATURES: ["p2", "p3", "p4", "p5", "p6"]
        PRE_NMS_TOPK_TRAIN: 2000 # Per FPN level
        PRE_NMS_TOPK_TEST: 1000 # Per FPN level
        POST_NMS_TOPK_TRAIN: 1000
        POST_NMS_TOPK_TEST: 1000
      ROI_HEADS:
        NAME: "CalibrationROIHeads"
        IN_FEATURES: ["p2", "p3", "p4", "p5"]
        NUM_CLASSES: 1230
        SCORE_THRESH_TEST: 0.0001
      ROI_BOX_HEAD:
        NAME: "FastRCNNConvFCHead"
        NUM_FC: 2
        POOLER_RESOLUTION: 7
      ROI_MASK_HEAD:
        NAME: "MaskRCNNConvUpsampleHead"
        NUM_CONV: 4
        POOLER_RESOLUTION: 14
    DATASETS:
      TRAIN: ("lvis_v0.5_train",)
      TEST: ("lvis_v0.5_val",)
    TEST:
      DETECTIONS_PER_IMAGE: 300 # LVIS allows up to 300
    VERSION: 2
"""


def _norcal_child(calibration: str) -> str:
    return ('_BASE_: "Base-NorCal.yaml"\n\nMODEL:\n  WEIGHTS: "https://dl.fbaipublicfiles.com/detectron2/'
            'LVISv0.5-InstanceSegmentation/mask_rcnn_R_50_FPN_1x/144219072/model_final_571f7c.pkl"\n\n'
            "TEST:\n  CALIBRATION:\n" + textwrap.indent(textwrap.dedent(calibration), "    "))


def test_norcal_authors_config_is_standard_heads_with_calibration(tmp_path):
    _write(tmp_path / "Base-NorCal.yaml", BASE_NORCAL)
    path = _write(tmp_path / "lvis_v0.5_mask_rcnn_R_50_FPN.yaml", _norcal_child("""\
        METHOD: "gamma" # gamma or cb
        WITH: "exps" # logits, exps, probs
        GAMMA: 0.6 # Nc^gamma
        RENORM: True
    """))
    spec = load_config(path)
    assert spec.roi_heads_name == "StandardROIHeads" and spec.backbone_name == "build_resnet_fpn_backbone"
    assert (spec.num_classes, spec.mask_on, spec.detections_per_image) == (1230, True, 300)
    assert (spec.calibration.gamma, spec.calibration.factor, spec.calibration.mechanism, spec.calibration.renormalize) == (0.6, "cdt", "exp", True)
    assert spec.calibration.gamma == 0.6 and spec.calibration.factor == "cdt"
    assert "CalibrationROIHeads" in spec.provenance["calibration"]
    assert "gamma 0.6" in spec.provenance["calibration"]


@pytest.mark.parametrize("calibration,expected", [
    ('METHOD: "cb"\nWITH: "probs"\nGAMMA: 0.999\nRENORM: True\n', (0.999, "ens", "prob", True)),
    ('METHOD: "gamma"\nWITH: "logits"\nGAMMA: 1.0\nRENORM: False\n', (1.0, "cdt", "logit", True)),
    ('GAMMA: 0.5\n', (0.5, "cdt", "exp", True)),  # the rest: add_norcal_config's defaults
    ('METHOD: "gamma"\nWITH: "exps"\nGAMMA: 0.0\nRENORM: True\n', (0.0, "cdt", "exp", True)),
])
def test_norcal_calibration_keys(tmp_path, calibration, expected):
    _write(tmp_path / "Base-NorCal.yaml", BASE_NORCAL)
    spec = load_config(_write(tmp_path / "x.yaml", _norcal_child(calibration)))
    assert (spec.calibration.gamma, spec.calibration.factor, spec.calibration.mechanism, spec.calibration.renormalize) == expected


def test_norcal_heads_without_calibration_keys_get_the_authors_defaults(tmp_path):
    spec = load_config(_write(tmp_path / "Base-NorCal.yaml", BASE_NORCAL))
    assert (spec.calibration.gamma, spec.calibration.factor, spec.calibration.mechanism, spec.calibration.renormalize) == (0.0, "cdt", "exp", True)


@pytest.mark.parametrize("calibration,key", [
    ('METHOD: "beta"\n', "TEST.CALIBRATION.METHOD"),
    ('WITH: "scores"\n', "TEST.CALIBRATION.WITH"),
    ('GAMMA: "high"\n', "TEST.CALIBRATION.GAMMA"),
])
def test_bad_norcal_calibration_keys(tmp_path, calibration, key):
    _write(tmp_path / "Base-NorCal.yaml", BASE_NORCAL)
    with pytest.raises(NorcalError, match=key):
        load_config(_write(tmp_path / "x.yaml", _norcal_child(calibration)))


def test_calibration_keys_without_norcal_heads_are_ignored(tmp_path):
    _write(tmp_path / "Base-RCNN-FPN.yaml", BASE_RCNN_FPN)
    path = _write(tmp_path / "x.yaml", '_BASE_: "Base-RCNN-FPN.yaml"\nTEST:\n  CALIBRATION:\n    GAMMA: 0.7\n')
    assert load_config(path).calibration is None


def test_lazyconfig_python_file_gets_one_line(tmp_path):
    # detectron2's configs/new_baselines/*.py: a program, not data
    path = _write(tmp_path / "mask_rcnn_R_50_FPN_100ep_LSJ.py", """\
        from detectron2.model_zoo import get_config
        model = get_config("common/models/mask_rcnn_fpn.py").model
        model.backbone.bottom_up.stem.norm = "BN"
    """)
    with pytest.raises(NorcalError) as err:
        load_config(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg
    assert "Python (LazyConfig) configs are not read" in msg and "executed" in msg
    assert "YAML" in msg and "no config" in msg
    # the YAML that LazyConfig itself writes, which norcal reads (tests/fixtures/make_vitdet_tiny.py)
    assert "LazyConfig.save(LazyConfig.load(this file), 'config.yaml')" in msg


def test_broken_chains_and_files(tmp_path):
    with pytest.raises(NorcalError, match="Base-missing.yaml not found"):
        load_config(_write(tmp_path / "a.yaml", '_BASE_: "Base-missing.yaml"\n'))
    _write(tmp_path / "loop1.yaml", '_BASE_: "loop2.yaml"\n')
    with pytest.raises(NorcalError, match="loops"):
        load_config(_write(tmp_path / "loop2.yaml", '_BASE_: "loop1.yaml"\n'))
    with pytest.raises(NorcalError, match="not valid YAML"):
        load_config(_write(tmp_path / "bad.yaml", "MODEL: [unclosed\n"))
    with pytest.raises(NorcalError, match="mapping"):
        load_config(_write(tmp_path / "list.yaml", "- a\n- b\n"))
    with pytest.raises(NorcalError, match="no such file"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(NorcalError, match="MODEL.RPN must be a mapping"):
        load_config(_write(tmp_path / "flat.yaml", "MODEL:\n  RPN: 3\n"))
