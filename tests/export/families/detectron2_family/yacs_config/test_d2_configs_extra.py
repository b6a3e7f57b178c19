"""Two real detectron2 configs: federated loss (a training-only buffer in the checkpoint) and
Detectron1's unaligned ROIAlign pooler (MODEL.ROI_*_HEAD.POOLER_TYPE: ROIAlign)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torchvision

import golden as G
from norcal.core.errors import NorcalError
from norcal.export.rcnn.modeling.poolers import ROIPooler, assign_boxes_to_levels

CONFIG = G.FIXTURE / "config.yaml"
WEIGHTS = G.FIXTURE / "model_final.pth"
FED = "roi_heads.box_predictor.fed_loss_cls_weights"


def _unaligned_config(tmp_path):
    """The fixture's config with Detectron1's pooler for the box and mask heads."""
    text = CONFIG.read_text()
    assert text.count("POOLER_TYPE: ROIAlignV2") == 3  # box, mask, keypoint heads
    path = tmp_path / "config_roialign.yaml"
    path.write_text(text.replace("POOLER_TYPE: ROIAlignV2", "POOLER_TYPE: ROIAlign"))
    return path


# ----------------------------------------------------------------------------- federated loss

def _with_buffers(tmp_path, **extra) -> str:
    ckpt = torch.load(WEIGHTS, weights_only=True)
    ckpt["model"].update(extra)
    path = tmp_path / "fed.pth"
    torch.save(ckpt, path)
    return str(path)


def _fed_loss_config(tmp_path):
    """The fixture's config as trained with federated loss (LVISv1's USE_SIGMOID_CE + USE_FED_LOSS)."""
    text = CONFIG.read_text()
    assert "USE_FED_LOSS: false" in text and "USE_SIGMOID_CE: false" in text
    path = tmp_path / "config_fed.yaml"
    path.write_text(text.replace("USE_FED_LOSS: false", "USE_FED_LOSS: true")
                    .replace("USE_SIGMOID_CE: false", "USE_SIGMOID_CE: true"))
    return path


def test_federated_loss_buffer_is_ignored(tmp_path):
    """USE_FED_LOSS checkpoints carry the classes' sampling weights, which inference never reads:
    before, the export refused them ("1 unexpected")."""
    from norcal.export.families.detectron2.loader import load_model

    config = _fed_loss_config(tmp_path)
    path = _with_buffers(tmp_path, **{FED: torch.rand(1203)})
    spec, model = load_model(path, config)
    _, plain = load_model(WEIGHTS, config)
    assert spec.num_classes == 1203 and spec.use_sigmoid_ce
    ours, theirs = model.state_dict(), plain.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_federated_loss_buffer_means_a_sigmoid_classifier(tmp_path):
    """detectron2 registers fed_loss_cls_weights only with USE_FED_LOSS, which asserts
    USE_SIGMOID_CE: without a config the buffer settles the activation (a softmax head scored
    0 of detectron2's 1200 detections); a config saying softmax contradicts the weights."""
    from norcal.export.families.detectron2.loader import load_detector_spec

    path = _with_buffers(tmp_path, **{FED: torch.rand(1203)})
    spec, _ = load_detector_spec(path)
    assert spec.use_sigmoid_ce is True and FED in spec.provenance["use_sigmoid_ce"]
    with pytest.raises(NorcalError, match="do not tell a softmax box head from a sigmoid one"):
        load_detector_spec(WEIGHTS)  # no buffer, no config: the weights cannot tell
    with pytest.raises(NorcalError) as e:
        load_detector_spec(path, CONFIG)
    assert "USE_SIGMOID_CE False" in str(e.value) and FED in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name, shape, shown", [
    (FED, (1230,), "has shape (1230,), but federated-loss weights hold one value per class (1203,)"),
    ("roi_heads.box_predictor.0.fed_loss_cls_weights", (1203,), "does not belong to this model's box predictor"),
])
def test_federated_loss_buffer_must_fit_the_model(tmp_path, name, shape, shown):
    from norcal.export.families.detectron2.loader import load_model

    path = _with_buffers(tmp_path, **{name: torch.rand(*shape)})
    with pytest.raises(NorcalError) as e:
        load_model(path, CONFIG)
    assert shown in str(e.value) and name in str(e.value) and path in str(e.value)


def test_other_unknown_buffers_are_still_refused(tmp_path):
    from norcal.export.families.detectron2.loader import load_model

    path = _with_buffers(tmp_path, **{"roi_heads.box_predictor.something_else": torch.rand(1203)})
    with pytest.raises(NorcalError, match="1 unexpected: roi_heads.box_predictor.something_else"):
        load_model(path, CONFIG)


# ----------------------------------------------------------------------------- ROIAlign (unaligned)

@pytest.mark.parametrize("select_rois", [True, False], ids=["own-level-boxes", "every-box-every-level"])
def test_unaligned_pooler_equals_torchvision_per_box(select_rois):
    """Each box pooled as torchvision's roi_align(aligned=False) pools it on its level, in
    both pooling forms, small boxes (width under one feature pixel) included."""
    gen = torch.Generator().manual_seed(1)
    strides = [4, 8, 16, 32]
    feats = [torch.randn(2, 8, 512 // s, 640 // s, generator=gen) for s in strides]
    sizes = [2.5, 20, 40, 150, 300, 35, 170, 280, 3]
    boxes = torch.tensor([[5.0 + i, 7.0 + 2 * i, 5.0 + i + w, 7.0 + 2 * i + 0.8 * w]
                          for i, w in enumerate(sizes)])
    batch_idx = torch.tensor([0, 1, 0, 1, 1, 0, 0, 1, 0])
    pooler = ROIPooler(7, strides, sampling_ratio=0, pooler_type="ROIAlign")
    pooler.select_rois = select_rois
    levels = assign_boxes_to_levels(boxes, 2, 5)
    got = pooler.pool(feats, boxes, batch_idx)
    aligned = ROIPooler(7, strides, sampling_ratio=0, pooler_type="ROIAlignV2").pool(feats, boxes, batch_idx)
    assert not torch.allclose(got, aligned, atol=1e-3)  # the two poolers do differ here
    for j in range(len(boxes)):
        lv = int(levels[j])
        ref = torchvision.ops.roi_align(feats[lv], torch.cat([batch_idx[j:j + 1, None].float(), boxes[j:j + 1]], 1),
                                        7, 1.0 / strides[lv], 0, aligned=False)
        torch.testing.assert_close(got[j:j + 1], ref, rtol=1e-5, atol=1e-5)


def test_config_reader_takes_roialign_for_box_and_mask(tmp_path):
    from norcal.export.families.detectron2.yacs_config.spec import load_config
    from norcal.export.rcnn.modeling.build import create_model

    spec = load_config(_unaligned_config(tmp_path))
    assert (spec.pooler_type, spec.mask_pooler_type) == ("ROIAlign", "ROIAlign")
    poolers = [m for m in create_model(spec).modules() if isinstance(m, ROIPooler)]
    assert len(poolers) == 2 and not any(p.aligned for p in poolers)
    assert load_config(CONFIG).mask_pooler_type == "ROIAlignV2"


def test_config_reader_still_refuses_other_poolers(tmp_path):
    from norcal.export.families.detectron2.yacs_config.spec import load_config

    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.read_text().replace("POOLER_TYPE: ROIAlignV2", "POOLER_TYPE: ROIPool", 1))
    with pytest.raises(NorcalError, match="MODEL.ROI_BOX_HEAD.POOLER_TYPE"):
        load_config(path)


@pytest.mark.slow
def test_unaligned_export_runs_as_our_pytorch_model(tmp_path):
    """The fixture's checkpoint with Detectron1's pooler: ONNX Runtime (output_half_pixel
    RoiAlign) gives our PyTorch model's detections and masks on a padded batch of two, and the
    TensorRT parser check accepts the graph."""
    from norcal.core.calibration.formula import log_prior
    from norcal.export.families.detectron2.loader import load_model
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    config = _unaligned_config(tmp_path)
    result = export_checkpoint(WEIGHTS, tmp_path / "m.onnx", NorCal(gamma=0.5), CheckpointExport(config=config))
    assert result.tensorrt.compatible, [f.reason for f in result.tensorrt.errors]
    rois = [n for n in result.model.graph.node if n.op_type == "RoiAlign"]
    assert len(rois) == 8
    for n in rois:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["coordinate_transformation_mode"] == b"output_half_pixel"

    images, sizes = G.batch([0, 1])
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"images": images, "image_sizes": sizes})))
    _, model = load_model(WEIGHTS, config)
    model.roi_heads.box_predictor.set_log_prior(log_prior(G.lvis_counts(), 0.5, "cdt"))
    with torch.no_grad():
        want = {k: v.numpy() for k, v in model.inference(torch.from_numpy(images), torch.from_numpy(sizes)).items()}
    np.testing.assert_array_equal(got["num_detections"], want["num_detections"])
    for b in range(2):
        n = int(want["num_detections"][b])
        assert n > 0
        frac, pairs = G.match_detections(want["boxes"][b, :n], want["scores"][b, :n], want["classes"][b, :n],
                                         got["boxes"][b, :n], got["scores"][b, :n], got["classes"][b, :n],
                                         min_iou=0.999, max_score_diff=1e-4)
        assert frac >= 0.99, frac
        for i, o in pairs:
            np.testing.assert_allclose(got["masks"][b, o], want["masks"][b, i], atol=1e-3)
    # and the unaligned pooler changes the model's output: the config is not ignored
    aligned = dict(zip([o.name for o in sess.get_outputs()], ort.InferenceSession(
        export_checkpoint(WEIGHTS, tmp_path / "a.onnx", NorCal(gamma=0.5),
                          CheckpointExport(config=CONFIG)).model.SerializeToString(),
        providers=["CPUExecutionProvider"]).run(None, {"images": images, "image_sizes": sizes})))
    assert not np.allclose(aligned["scores"], got["scores"], atol=1e-4)


# ----------------------------------------------------------------------------- the config's NorCal note

def test_unnormalised_exp_calibration_note_says_what_is_computed(tmp_path):
    """The NorCal authors' WITH: exps, RENORM: False computes exp(logit)/a_c: the note said softmax/a_c."""
    from test_d2_config import BASE_NORCAL, _norcal_child, _write

    from norcal.export.families.detectron2.yacs_config.spec import load_config

    _write(tmp_path / "Base-NorCal.yaml", BASE_NORCAL)
    spec = load_config(_write(tmp_path / "x.yaml", _norcal_child('METHOD: "gamma"\nWITH: "exps"\nGAMMA: 0.6\n'
                                                                 'RENORM: False\n')))
    assert (spec.calibration.gamma, spec.calibration.factor, spec.calibration.mechanism, spec.calibration.renormalize) == (0.6, "cdt", "exp", False)
    note = spec.provenance["calibration"]
    assert "exp(logit)/a_c" in note and "softmax" not in note, note
