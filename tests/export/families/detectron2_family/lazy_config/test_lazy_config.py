"""A LazyConfig run's config.yaml (LazyConfig.save of detectron2's own
configs/new_baselines/mask_rcnn_R_50_FPN_100ep_LSJ.py: tests/fixtures/lazy_lsj, made by
make_lazy_config_fixture.py) read as data: the spec it gives agrees with the architecture the
real detectron2 built from it (its state dict's names and shapes), and what is not read is
refused in one line naming the key path. Nothing the file names is imported."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
import torch

from norcal.core.errors import NorcalError
from norcal.export.families.detectron2.weights.architecture import spec_from_weights
from norcal.export.families.detectron2.yacs_config.spec import load_config
from norcal.export.families.detectron2.loader import _check_consistent

LSJ = Path(__file__).parents[4] / "fixtures" / "lazy_lsj"
CONFIG = LSJ / "config.yaml"


def _saved(tmp_path, name: str) -> Path:
    """One of the other LazyConfig.save outputs make_lazy_config_fixture.py keeps gzipped."""
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(gzip.decompress((LSJ / f"{name}.yaml.gz").read_bytes()))
    return path


def _weights_spec(name: str, spec):
    """The spec detectron2's built model's state-dict names and shapes give (``name``: its shapes file)."""
    shapes = json.loads(gzip.decompress((LSJ / name).read_bytes()))
    return spec_from_weights({k: torch.empty(v, device="meta") for k, v in shapes.items()},
                             (spec.anchor_sizes, spec.anchor_aspect_ratios))


def _variant(tmp_path, old: str, new: str) -> Path:
    text = CONFIG.read_text()
    assert old in text, old
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_lsj_config_gives_detectron2s_model():
    before = set(sys.modules)
    spec = load_config(CONFIG)
    assert not any(m.startswith(("detectron2", "fvcore", "omegaconf")) for m in set(sys.modules) - before)
    # the test loader's ResizeShortestEdge, not LSJ's training ResizeScale + FixedSizeCrop at 1024
    assert (spec.min_size_test, spec.max_size_test, spec.input_format) == (800, 1333, "BGR")
    # FastRCNNOutputLayers: test_score_thresh from the file, NMS and top-k at their defaults
    assert (spec.score_thresh_test, spec.nms_thresh_test, spec.detections_per_image) == (0.05, 0.5, 100)
    assert (spec.num_classes, spec.use_sigmoid_ce, spec.mask_on, spec.depth) == (80, False, True, 50)
    assert (spec.norm, spec.fpn_norm, spec.box_head_num_conv, spec.box_head_num_fc) == ("SyncBN", "SyncBN", 4, 1)
    assert (spec.rpn_pre_nms_topk_test, spec.rpn_post_nms_topk_test, spec.rpn_conv_dims) == (1000, 1000, (-1, -1))
    assert "cannot name" in spec.provenance["box_head_norm"]  # a lambda: NaiveSyncBatchNorm
    _check_consistent(spec, _weights_spec("shapes.json.gz", spec), CONFIG, "detectron2's model")  # all agree


def test_regnet_lsj_config_gives_detectron2s_model(tmp_path):
    """configs/new_baselines/mask_rcnn_regnetx_4gf_dds_FPN_100ep_LSJ.py: the stages computed from
    depth 23, w_a 38.65, w_0 96, w_m 2.43, group width 40 are those of the RegNet detectron2 built."""
    path = _saved(tmp_path, "regnetx_4gf_lsj")
    spec = load_config(path)
    weights = _weights_spec("regnetx_4gf_lsj.shapes.json.gz", spec)
    assert spec.regnet == weights.regnet and spec.regnet.depths == (2, 5, 14, 2)
    assert (spec.norm, spec.fpn_norm, spec.pixel_std) == ("SyncBN", "SyncBN", (57.375, 57.12, 58.395))
    _check_consistent(spec, weights, path, "detectron2's model")
    # w_m 2.2 regroups the blocks: detectron2's generate_regnet_parameters(38.65, 96, 2.2, 23)
    # gives depths [2, 4, 10, 7]; the weights refuse them, naming both
    broken = tmp_path / "broken.yaml"
    broken.write_text(path.read_text().replace("w_m: 2.43", "w_m: 2.2", 1))
    with pytest.raises(NorcalError, match=r"disagree on regnet\.depths .*config \(2, 4, 10, 7\), weights \(2, 5, 14, 2\)"):
        _check_consistent(load_config(broken), weights, broken, "detectron2's model")


@pytest.mark.parametrize("old, new, shown", [
    ("_target_: detectron2.modeling.StandardROIHeads", "_target_: detectron2.modeling.Res5ROIHeads",
     "model.roi_heads._target_: detectron2.modeling.Res5ROIHeads is not supported"),
    # CascadeROIHeads take a list per stage (test_lazy_cascade.py), not StandardROIHeads' box_head
    ("_target_: detectron2.modeling.StandardROIHeads", "_target_: detectron2.modeling.CascadeROIHeads",
     "model.roi_heads.box_head: CascadeROIHeads take one per stage, in box_heads"),
    ("_target_: detectron2.modeling.GeneralizedRCNN", "_target_: detectron2.modeling.RetinaNet",
     "model._target_: detectron2.modeling.RetinaNet is not supported"),
    ("top_block: {_target_: detectron2.modeling.backbone.fpn.LastLevelMaxPool}",
     "top_block: {_target_: os.system}", "model.backbone.top_block._target_: os.system is not supported"),
    ("test_score_thresh: 0.05", "test_score_thresh: 0.05\n      use_fed_loss: true",
     "model.roi_heads.box_predictor.use_fed_loss: federated loss needs use_sigmoid_ce: true"),
    ("test_score_thresh: 0.05", "test_score_thresh: 0.05\n      mystery: 3",
     "model.roi_heads.box_predictor.mystery: 3: not read by the export"),
    ("short_edge_length: 800", "short_edge_length: [640, 800]", "a random size at test time is not supported"),
    ("num_classes: ${..num_classes}", "num_classes: ${..nothing}", "model.roi_heads.nothing: missing"),
    ("num_classes: 80", "num_classes: ${.num_classes}", "refers to itself"),
    ("conv_norm: &id001 !!python/name:None.%3Clambda%3E ''",
     "conv_norm: !!python/object/apply:os.system ['true']", "not valid YAML"),
])
def test_what_is_not_read_is_refused_by_name(tmp_path, old, new, shown):
    path = _variant(tmp_path, old, new)
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert shown in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_sigmoid_lazy_config(tmp_path):
    path = _variant(tmp_path, "test_score_thresh: 0.05",
                    "test_score_thresh: 0.05\n      use_sigmoid_ce: true\n      use_fed_loss: true\n"
                    "      test_topk_per_image: 300")
    spec = load_config(path)
    assert spec.use_sigmoid_ce and spec.detections_per_image == 300


REGNET_Y = LSJ.parent / "d2_regnety_tiny" / "config.yaml"  # make_regnet_tiny.py's LazyConfig.save


@pytest.mark.parametrize("old, new, shown", [
    ("regnet.SimpleStem ''", "regnet.ResStem ''",
     "model.backbone.bottom_up.stem_class: detectron2.modeling.backbone.regnet.ResStem: "
     "only RegNet's SimpleStem is supported"),
    ("regnet.ResBottleneckBlock ''", "regnet.VanillaBlock ''", "only RegNet's ResBottleneckBlock is supported"),
    ("w_0: 8", "w_0: 12", "model.backbone.bottom_up.w_0: 12: outside RegNet's design space"),
    ("w_m: 2.0", "w_m: 1.0", "model.backbone.bottom_up.w_m: 1.0: outside RegNet's design space"),
    ("depth: 5", "depth: 4", "model.backbone.bottom_up: gives 3 stages (widths [8, 16, 32]); the FPN reads exactly 4"),
    ("se_ratio: 0.25", "se_ratio: 0.25\n      activation_class: !!python/name:torch.nn.SiLU ''",
     "model.backbone.bottom_up.activation_class: {'_python_name_': 'torch.nn.SiLU'}: not read by the export"),
    ("in_features: ${.bottom_up.out_features}", "in_features: [s2, s3, s4]",
     "model.backbone.in_features: expected the RegNet's ['s1', 's2', 's3', 's4']"),
])
def test_regnet_not_read_is_refused_by_name(tmp_path, old, new, shown):
    text = REGNET_Y.read_text()
    assert old in text, old
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert shown in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_python_calls_are_read_as_data_never_made(tmp_path):
    """A !!python/object/apply of functools.partial (how LazyConfig.save writes a partial) is kept
    as data: in a norm's place it is refused by key path; any other call is refused at load, and
    nothing either names is called."""
    marker = tmp_path / "called"
    path = _variant(tmp_path, "conv_norm: &id001 !!python/name:None.%3Clambda%3E ''",
                    f"conv_norm: &id001 !!python/object/apply:os.system ['touch {marker}']")
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert str(e.value) == (f"{path}: not valid YAML: could not determine a constructor for the tag "
                            "'tag:yaml.org,2002:python/object/apply:os.system'")
    path = _variant(tmp_path, "conv_norm: &id001 !!python/name:None.%3Clambda%3E ''",
                    "conv_norm: &id001 !!python/object/apply:functools.partial [!!python/name:os.system '']")
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert "model.roi_heads.box_head.conv_norm: a call of functools.partial" in str(e.value)
    assert not marker.exists()


RESIZE = "{_target_: detectron2.data.transforms.ResizeShortestEdge, max_size: 1333, short_edge_length: 800}"
AUGMENTATION = "dataloader.test.mapper.augmentations.0"


@pytest.mark.parametrize("resize, key, value", [
    ("max_size: 1333, short_edge_length: 10000000", "short_edge_length", "10000000"),
    ("max_size: 10000000, short_edge_length: 800", "max_size", "10000000"),
    ("max_size: 1333, short_edge_length: [10000000]", "short_edge_length", "10000000"),
    ("max_size: 1333.5, short_edge_length: 800", "max_size", "1333.5"),
])
def test_test_resize_is_bounded_by_the_export_side(tmp_path, resize, key, value):
    """A short edge of 10^7 was refused only by the optimization profile, naming neither file nor key."""
    path = _variant(tmp_path, RESIZE, "{_target_: detectron2.data.transforms.ResizeShortestEdge, " + resize + "}")
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert str(e.value) == (f"{path}: {AUGMENTATION}.{key}: {value}: expected a whole number in 1 .. 8192 "
                            "(the export's largest input side)")


def test_test_resize_without_max_size_is_capped_at_the_export_side(tmp_path):
    path = _variant(tmp_path, RESIZE, "{_target_: detectron2.data.transforms.ResizeShortestEdge, "
                                      "short_edge_length: 8192}")
    spec = load_config(path)
    assert (spec.min_size_test, spec.max_size_test) == (8192, 8192)


@pytest.mark.parametrize("model", ["model:", "model: null", "model: 3", None])
def test_a_null_or_missing_model_is_named(tmp_path, model):
    """Read before as a yaml-era config of detectron2's defaults (a C4 model)."""
    text = CONFIG.read_text()
    head, tail = text.split("\nmodel:\n", 1)
    rest = tail[tail.index("\noptimizer:"):]
    path = tmp_path / "config.yaml"
    path.write_text(head + ("\n" + model if model else "") + rest)
    with pytest.raises(NorcalError) as e:
        load_config(path)
    want = "3: expected a mapping with a _target_" if model == "model: 3" else \
        "missing (a LazyConfig's model: holds the detector)"
    assert str(e.value) == f"{path}: model: {want}"


@pytest.mark.parametrize("depth, shown", [
    ("1000000000", "1000000000: must be <= 256 (blocks in the four stages; published RegNets have at most 28)"),
    ("257", "257: must be <= 256"),
])
def test_regnet_depth_is_bounded_before_its_stages_are_planned(tmp_path, depth, shown):
    """A depth of 10^9 grew the export to 12.9 GB until the kernel killed it."""
    text = REGNET_Y.read_text()
    path = tmp_path / "config.yaml"
    path.write_text(text.replace("depth: 5", f"depth: {depth}", 1))
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert f"{path}: model.backbone.bottom_up.depth: {shown}" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("old, new, shown", [
    ("post_nms_topk: [1000, 1000]", "post_nms_topk: [1000, 1000000000]",
     "model.proposal_generator.post_nms_topk.1: 1000000000: must be <= 3839 (TensorRT's TopK limit)"),
    ("pre_nms_topk: [2000, 1000]", "pre_nms_topk: [2000, 1000000000]",
     "model.proposal_generator.pre_nms_topk.1: 1000000000: must be <= 61424"),
    ("      output_size: 14", "      output_size: 100000",
     "model.roi_heads.mask_pooler.output_size: 100000: must be <= 256"),
    ("      sampling_ratio: 0\n", "      sampling_ratio: 1000000\n",
     "model.roi_heads.box_pooler.sampling_ratio: 1000000: must be <= 64"),
])
def test_values_that_size_memory_are_named_by_the_files_key_path(tmp_path, old, new, shown):
    """Refused by the bounds of the yaml-era keys they map to, named as the LazyConfig spells them."""
    path = _variant(tmp_path, old, new)
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert str(e.value).startswith(f"LazyConfig {path}: {shown}") and "\n" not in str(e.value)


@pytest.mark.parametrize("count", ["0", "-3"])
def test_num_classes_out_of_range_is_named_by_the_files_key_path(tmp_path, count):
    """model.roi_heads.num_classes, not the yaml-era MODEL.ROI_HEADS.NUM_CLASSES it maps to."""
    path = _variant(tmp_path, "    num_classes: 80", f"    num_classes: {count}")
    with pytest.raises(NorcalError) as e:
        load_config(path)
    assert str(e.value) == f"LazyConfig {path}: model.roi_heads.num_classes: {count}: must be >= 1"
