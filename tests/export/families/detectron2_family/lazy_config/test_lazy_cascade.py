"""CascadeROIHeads in a LazyConfig's config.yaml: the LazyConfig.save output of detectron2's own
projects/ViTDet/configs/LVIS/cascade_mask_rcnn_{vitdet_b,mvitv2_b_in21k}_100ep.py and
mask_rcnn_vitdet_b_100ep.py (tests/fixtures/lazy_lsj, made by make_lazy_config_fixture.py)
mapped to the keys detectron2's yaml configs give a Cascade R-CNN; stages that disagree on what
the export runs once for all of them are refused by key path."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import yaml

from norcal.core.errors import NorcalError
from norcal.core.files.yaml_io import read_yaml_mapping
from norcal.export.families.detectron2.yacs_config.spec import load_config
from norcal.export.families.detectron2.yacs_config.file import load_cfg_dict
from norcal.export.families.detectron2.lazy_config.translate import _Lazy, _roi_heads
from norcal.export.rcnn.spec import CASCADE_ROI_HEADS


def roi_heads_to_cfg(data: dict, source: str) -> tuple[dict, dict]:
    """(the yaml-era keys, provenance notes) the LazyConfig reader makes of ``model.roi_heads``
    alone, whatever the backbone."""
    lz, prov = _Lazy(data, source), {}
    cfg: dict = {"MODEL": {}}
    _roi_heads(lz, cfg, prov)
    return cfg, prov


FIXTURES = Path(__file__).parents[4] / "fixtures"
LSJ = FIXTURES / "lazy_lsj"
CASCADES = ("vitdet_b_cascade_lvis", "mvitv2_b_cascade_lvis")
# what the ViTDet / MViTv2 LVIS cascade configs set for each stage k: Box2BoxTransform weights
# (w1, w1, w2, w2) for (w1, w2) in (10, 5), (20, 10), (30, 15); Matcher IoUs 0.5 / 0.6 / 0.7
STAGE_WEIGHTS = [[10, 10, 5, 5], [20, 20, 10, 10], [30, 30, 15, 15]]


def _saved(name: str, tmp_path) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(gzip.decompress((LSJ / f"{name}.yaml.gz").read_bytes()))
    return path


def _data(name: str, tmp_path) -> dict:
    """The file as the reader reads it: through the inert loader, nothing it names called."""
    return read_yaml_mapping(_saved(name, tmp_path), "detectron2 config", inert_python=True)


def _lsj_with_heads_of(name: str, tmp_path, change=None) -> Path:
    """detectron2's ResNet LSJ config.yaml with the ROI heads of ``name`` (``change`` edits them)."""
    data = read_yaml_mapping(LSJ / "config.yaml", "detectron2 config", inert_python=True)
    data["model"]["roi_heads"] = _data(name, tmp_path)["model"]["roi_heads"]
    if change:
        change(data["model"]["roi_heads"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("name", CASCADES)
def test_cascade_heads_map_to_detectron2s_cascade_keys(tmp_path, name):
    cfg, _ = roi_heads_to_cfg(_data(name, tmp_path), name)
    model = cfg["MODEL"]
    assert model["ROI_HEADS"] == {"NAME": "CascadeROIHeads", "NUM_CLASSES": 1203, "IN_FEATURES": ["p2", "p3", "p4", "p5"],
                                  "SCORE_THRESH_TEST": 0.02, "NMS_THRESH_TEST": 0.5}
    assert model["ROI_BOX_CASCADE_HEAD"] == {"BBOX_REG_WEIGHTS": STAGE_WEIGHTS, "IOUS": [0.5, 0.6, 0.7]}
    # the same keys, and here the same values, as detectron2's yaml Cascade R-CNN (its defaults)
    yacs = load_cfg_dict(FIXTURES / "d2_cascade_tiny" / "config.yaml")["MODEL"]["ROI_BOX_CASCADE_HEAD"]
    assert model["ROI_BOX_CASCADE_HEAD"] == yacs
    box = model["ROI_BOX_HEAD"]
    assert (box["NUM_CONV"], box["CONV_DIM"], box["NUM_FC"], box["FC_DIM"], box["NORM"]) == (4, 256, 1, 1024, "LN")
    assert (box["CLS_AGNOSTIC_BBOX_REG"], box["USE_SIGMOID_CE"]) == (True, True)
    assert (model["ROI_MASK_HEAD"]["NORM"], cfg["TEST"]["DETECTIONS_PER_IMAGE"]) == ("LN", 300)


def test_mvitv2_b_lvis_cascade_read_whole(tmp_path):
    """detectron2's own MViTv2-B LVIS cascade config, as LazyConfig.save wrote it: MViT-B (96 wide,
    24 blocks, stages ending at 1, 4, 20, 23, eps 1e-6, residual pooling) under an LN FPN padded to
    the 1024 square, resized to fit it."""
    spec = load_config(_saved("mvitv2_b_cascade_lvis", tmp_path))
    m = spec.mvit
    assert (m.embed_dim, m.depth, m.num_heads, m.last_block_indexes) == (96, 24, 1, (1, 4, 20, 23))
    assert (m.norm_eps, m.residual_pooling, m.square_pad, spec.size_divisibility) == (1e-6, True, 1024, 1024)
    assert (spec.min_size_test, spec.max_size_test, spec.fpn_norm, spec.input_format) == (1024, 1024, "LN", "RGB")
    assert (spec.roi_heads_name, [list(w) for w in spec.cascade_bbox_reg_weights]) == (CASCADE_ROI_HEADS, STAGE_WEIGHTS)


@pytest.mark.parametrize("name, stages", [("vitdet_b_cascade_lvis", 3), ("vitdet_b_lvis", 0)])
def test_vitdet_b_lvis_configs_read_whole(tmp_path, name, stages):
    """detectron2's own ViTDet-B LVIS configs, as LazyConfig.save wrote them: ViT-B (768 wide, 12
    blocks, 12 heads, windows of 14 except blocks 2, 5, 8, 11) on the 1024 square, LN heads,
    sigmoid CE at score 0.02 and 300 detections (the configs' values), Cascade's stage weights."""
    spec = load_config(_saved(name, tmp_path))
    vit = spec.vit
    assert (vit.embed_dim, vit.depth, vit.num_heads, vit.window_size, vit.square_pad, vit.ln_eps) == \
        (768, 12, 12, 14, 1024, 1e-6)
    assert vit.window_block_indexes == (0, 1, 3, 4, 6, 7, 9, 10) and vit.use_rel_pos
    assert (spec.box_head_norm, spec.mask_head_norm, spec.fpn_norm) == ("LN", "LN", "LN")
    assert (spec.use_sigmoid_ce, spec.score_thresh_test, spec.detections_per_image) == (True, 0.02, 300)
    assert (spec.num_classes, spec.input_format, spec.size_divisibility) == (1203, "RGB", 1024)
    assert [list(w) for w in spec.cascade_bbox_reg_weights] == (STAGE_WEIGHTS if stages else [])


def test_vitdet_mask_rcnn_heads_keep_layer_norm(tmp_path):
    """The ViTDet Mask R-CNN's StandardROIHeads: conv_norm LN in both heads passes through as LN."""
    cfg, _ = roi_heads_to_cfg(_data("vitdet_b_lvis", tmp_path), "vitdet_b_lvis")
    assert cfg["MODEL"]["ROI_HEADS"]["NAME"] == "StandardROIHeads"
    assert (cfg["MODEL"]["ROI_BOX_HEAD"]["NORM"], cfg["MODEL"]["ROI_MASK_HEAD"]["NORM"]) == ("LN", "LN")


def test_cascade_config_gives_a_cascade_spec(tmp_path):
    """A ResNet FPN under the ViTDet cascade heads, read whole: the spec the export builds from."""
    path = _lsj_with_heads_of("vitdet_b_cascade_lvis", tmp_path)
    path.write_text(path.read_text().replace("    norm: SyncBN\n    out_channels: 256", "    norm: LN\n"
                                             "    out_channels: 256", 1))
    spec = load_config(path)
    assert spec.roi_heads_name == CASCADE_ROI_HEADS
    assert spec.cascade_bbox_reg_weights == tuple(tuple(float(x) for x in w) for w in STAGE_WEIGHTS)
    assert (spec.cls_agnostic_bbox_reg, spec.use_sigmoid_ce, spec.num_classes) == (True, True, 1203)
    assert (spec.score_thresh_test, spec.detections_per_image) == (0.02, 300)
    assert (spec.fpn_norm, spec.box_head_norm, spec.mask_head_norm) == ("LN", "LN", "LN")


def _set(key: str, value, stage: int, lists: str = "box_predictors"):
    def change(heads):
        heads[lists][stage][key] = value
    return change


@pytest.mark.parametrize("change, shown", [
    (lambda heads: heads["box_predictors"][2].update(use_sigmoid_ce=False, use_fed_loss=False),  # a softmax stage
     "model.roi_heads.box_predictors.2: use_sigmoid_ce False differs from stage 0's True"),
    (_set("use_fed_loss", False, 1), "model.roi_heads.box_predictors.1: use_fed_loss False differs from stage 0's True"),
    (_set("test_score_thresh", 0.05, 1), "model.roi_heads.box_predictors.1: test_score_thresh 0.05 differs"),
    (_set("_target_", "my.project.SparseHead", 1, "box_heads"),
     "model.roi_heads.box_heads.1._target_: my.project.SparseHead is not supported"),
    (_set("_target_", "my.project.Matcher2", 2, "proposal_matchers"),
     "model.roi_heads.proposal_matchers.2._target_: my.project.Matcher2 is not supported"),
    (_set("conv_dims", [256, 256], 1, "box_heads"), "model.roi_heads.box_heads.1: NUM_CONV 2 differs from stage 0's 4"),
    (lambda heads: heads["box_predictors"][0]["box2box_transform"].update(scale_clamp=4.0),
     "model.roi_heads.box_predictors.0.box2box_transform.scale_clamp: 4.0: not read by the export"),
    (lambda heads: heads["proposal_matchers"].pop(), "box_heads, box_predictors, proposal_matchers must have one "
                                                     "entry per stage, got [3, 3, 2]"),
    (lambda heads: [p.update(cls_agnostic_bbox_reg=False) for p in heads["box_predictors"]],
     "model.roi_heads.box_predictors.0.cls_agnostic_bbox_reg: CascadeROIHeads regress class-agnostic boxes"),
])
def test_disagreeing_or_unknown_stages_are_refused(tmp_path, change, shown):
    path = _lsj_with_heads_of("vitdet_b_cascade_lvis", tmp_path, change)
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert shown in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_layer_norm_only_in_the_fpn_and_heads(tmp_path):
    """LN is read where ViTDet's configs put it (FPN, box and mask heads), not in a ResNet's stages."""
    path = tmp_path / "config.yaml"
    path.write_text((LSJ / "config.yaml").read_text().replace("norm: SyncBN, stride_in_1x1", "norm: LN, stride_in_1x1", 1)
                    .replace("in_channels: 3, norm: SyncBN", "in_channels: 3, norm: LN", 1))
    with pytest.raises(NorcalError, match="MODEL.RESNETS.NORM.*unsupported norm"):
        load_config(path)
