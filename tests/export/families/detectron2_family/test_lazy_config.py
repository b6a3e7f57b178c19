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
from norcal.export.families.detectron2.arch_from_weights import spec_from_weights
from norcal.export.families.detectron2.config import load_config
from norcal.export.families.detectron2.loader import _check_consistent

LSJ = Path(__file__).parents[3] / "fixtures" / "lazy_lsj"
CONFIG = LSJ / "config.yaml"


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
    shapes = json.loads(gzip.decompress((LSJ / "shapes.json.gz").read_bytes()))
    weights = spec_from_weights({k: torch.empty(v, device="meta") for k, v in shapes.items()},
                                (spec.anchor_sizes, spec.anchor_aspect_ratios))
    _check_consistent(spec, weights, CONFIG, "detectron2's model")  # every architecture field agrees


@pytest.mark.parametrize("old, new, shown", [
    ("_target_: detectron2.modeling.StandardROIHeads", "_target_: detectron2.modeling.CascadeROIHeads",
     "model.roi_heads._target_: detectron2.modeling.CascadeROIHeads is not supported"),
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
