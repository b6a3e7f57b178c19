"""Cascade Mask R-CNN (detectron2's CascadeROIHeads, 3 stages) against the real detectron2's
goldens (tests/fixtures/d2_cascade_tiny): eager PyTorch and ONNX Runtime, all three fixture
images in one zero-padded batch, at every NorCal setting of the fixture. NorCal is applied in
every stage's classifier, then the stages' probabilities are averaged (the NorCal authors'
patch of ``predict_probs``), so the exported graph holds one NorCal node per stage.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import golden as G
from conftest import FIXTURES, assert_tensorrt_compatible
from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.export.families.detectron2.weights.architecture import architecture
from norcal.export.graph.calibrate import calibrate_graph
from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.rcnn.modeling.build import model_from_state
from norcal.export.rcnn.onnx_export import export_onnx
from norcal.export.rcnn.spec import CASCADE_ROI_HEADS, FPN_BACKBONE, arch_name
from norcal.export.graph.surgery import has_norcal, norcal_metadata, strip_norcal
from test_c4_dc5 import Arch, check_detections, manifest_table
from test_onnx_export import run, session

pytestmark = pytest.mark.slow  # Cascade exports and golden parity at every setting

torch.set_num_threads(2)

FIXTURE = FIXTURES / "d2_cascade_tiny"
WEIGHTS, CONFIG = FIXTURE / "model_final.pth", FIXTURE / "config.yaml"
IMAGES = range(3)
STAGES = 3
STAGE_LOGITS = [f"cls_logits_stage{k}" for k in (1, 2, 3)]


@pytest.fixture(scope="module")
def cascade() -> Arch:
    """The fixture's model, exported graph and cached outputs (test_c4_dc5's Arch)."""
    arch = Arch(FIXTURE)
    arch.table = manifest_table(FIXTURE)
    return arch


# ---------------------------------------------------------------- specs

def test_config_gives_the_cascade_spec():
    spec, _ = load_detector_spec(WEIGHTS, CONFIG)
    assert (arch_name(spec), spec.backbone_name, spec.roi_heads_name) == ("Cascade", FPN_BACKBONE, CASCADE_ROI_HEADS)
    assert spec.cascade_bbox_reg_weights == ((10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15))
    assert spec.cls_agnostic_bbox_reg and spec.mask_on and spec.num_classes == 1203


def test_weights_alone_give_the_config_model():
    """Stages, their heads and class-agnostic regression are read from the weight names; the
    stages' regression weights are detectron2's defaults, recorded as an assumption."""
    inferred, state = load_detector_spec(WEIGHTS, classifier="softmax")  # the weights cannot tell
    configured, _ = load_detector_spec(WEIGHTS, CONFIG)
    assert architecture(inferred) == architecture(configured)
    for field in configured.__dataclass_fields__:
        if field not in {"min_size_test", "max_size_test", "provenance"}:
            assert getattr(inferred, field) == getattr(configured, field), field
    assert inferred.provenance["architecture"].startswith("Cascade")
    assert "assumed" in inferred.provenance["cascade_bbox_reg_weights"]
    model_from_state(inferred, state)


def test_class_specific_cascade_is_refused(tmp_path):
    import yaml
    from norcal.export.families.detectron2.yacs_config.spec import load_config

    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["MODEL"]["ROI_BOX_HEAD"]["CLS_AGNOSTIC_BBOX_REG"] = False
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(NorcalError, match="CLS_AGNOSTIC_BBOX_REG.*class-agnostic"):
        load_config(tmp_path / "c.yaml")


# ---------------------------------------------------------------- eager PyTorch

def test_every_stage_matches_golden_img0(cascade):
    """Each stage pools the boxes detectron2 pooled and gives its logits and deltas."""
    out = cascade.eager_outputs("baseline")
    g = G.golden(0, FIXTURE)
    j = G.box_iou(g["proposal_boxes"], out["proposals"][0]).argmax(1)
    for k in range(STAGES):
        assert np.abs(out["stage_proposals"][k][0][j] - g[f"stage{k}/proposal_boxes"]).max() <= 1e-2, k
        assert np.abs(out["stage_cls_logits"][k][0][j] - g[f"stage{k}/cls_logits"]).max() <= 1e-3, k
        assert np.abs(out["stage_box_deltas"][k][0][j] - g[f"stage{k}/box_deltas"]).max() <= 1e-3, k


@pytest.mark.parametrize("setting", G.SETTINGS)
def test_eager_detections_match_golden(cascade, setting):
    check_detections(cascade.eager_outputs(setting), setting, FIXTURE)


# ---------------------------------------------------------------- ONNX

def test_graph_contract_names_each_stage_and_passes_tensorrt_check(cascade):
    g = cascade.onnx.graph
    assert [i.name for i in g.input] == ["images", "image_sizes"]
    assert [o.name for o in g.output] == ["num_detections", "boxes", "scores", "classes", "masks"]
    meta = norcal_metadata(cascade.onnx)
    assert contract.split_names(meta[contract.CLASSIFIER_LOGITS]) == STAGE_LOGITS
    softmax = [n for n in g.node if n.op_type == "Softmax"]
    assert sorted(n.input[0] for n in softmax) == STAGE_LOGITS
    assert_tensorrt_compatible(cascade.onnx)


@pytest.mark.parametrize("setting", ["cdt_g0.5", "ens_g0.999"])
def test_one_norcal_node_per_stage(cascade, setting):
    cal = cascade.calibrated(setting)
    nodes = [n for n in cal.graph.node if n.domain == contract.NODE_DOMAIN]
    assert len(nodes) == STAGES and len({n.name for n in nodes}) == STAGES
    assert sorted(n.input[0] for n in nodes) == STAGE_LOGITS
    assert all(n.input[1] == contract.PRIOR_NAME for n in nodes)
    assert not [n for n in cal.graph.node if n.op_type == "Softmax"]
    assert contract.split_names(norcal_metadata(cal)[contract.LOGITS]) == STAGE_LOGITS
    assert_tensorrt_compatible(cal)


def test_recalibration_replaces_and_strip_removes_every_stage_node(cascade):
    once = cascade.calibrated("cdt_g0.5")
    twice = calibrate_graph(once, 1.0, cascade.table)
    nodes = [n for n in twice.graph.node if n.domain == contract.NODE_DOMAIN]
    assert len(nodes) == STAGES and norcal_metadata(twice)[contract.GAMMA] == "1.0"
    assert len([i for i in twice.graph.initializer if i.name == contract.PRIOR_NAME]) == 1
    out = run(session(twice), cascade.images, cascade.sizes)
    check_detections(out, "cdt_g1.0", FIXTURE)
    plain = strip_norcal(twice)
    assert not has_norcal(plain)
    softmax = [n for n in plain.graph.node if n.op_type == "Softmax"]
    assert sorted(n.input[0] for n in softmax) == STAGE_LOGITS
    meta = norcal_metadata(plain)
    assert contract.LOGITS not in meta and meta[contract.CLASSIFIER_LOGITS] == ",".join(STAGE_LOGITS)
    check_detections(run(session(plain), cascade.images, cascade.sizes), "baseline", FIXTURE)


def test_inlined_nodes_per_stage(cascade):
    cal = calibrate_graph(cascade.onnx, 0.5, cascade.table, inline=True)
    onnx.checker.check_model(cal, full_check=True)
    check_detections(run(session(cal), cascade.images, cascade.sizes), "cdt_g0.5", FIXTURE)
    assert not has_norcal(strip_norcal(cal))


@pytest.mark.parametrize("setting", G.SETTINGS)
def test_onnxruntime_batch_matches_golden(cascade, setting):
    check_detections(cascade.ort_outputs(setting), setting, FIXTURE)


def test_image_alone_equals_image_in_a_larger_batch(cascade):
    batched = cascade.ort_outputs("baseline")
    images, sizes = G.batch([0], fixture=FIXTURE)
    assert images.shape[-2:] != cascade.images.shape[-2:]
    G.assert_same_first_image(run(session(cascade.onnx), images, sizes), batched, masks=True)


def test_weights_only_export_matches_golden_img0():
    """The config-less path, exported, calibrated and run: img0."""
    spec, state = load_detector_spec(WEIGHTS, classifier="softmax")
    proto = export_onnx(model_from_state(spec, state), spec, batch=1, height=320, width=448)
    assert_tensorrt_compatible(proto)
    images, sizes = G.batch([0], fixture=FIXTURE)
    check_detections(run(session(proto), images, sizes), "baseline", FIXTURE, images=[0])
    cal = calibrate_graph(proto, 0.999, manifest_table(FIXTURE), factor="ens")
    check_detections(run(session(cal), images, sizes), "ens_g0.999", FIXTURE, images=[0])

