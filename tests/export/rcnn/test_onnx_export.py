"""ONNX export of our Mask R-CNN: the graph contract, TensorRT-parser-friendly ops, and parity
of ONNX Runtime (all four fixture images in one padded batch) with detectron2's goldens."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import golden as G
from norcal.core.calibration.formula import log_prior
from norcal.core.errors import NorcalError
from norcal.export.rcnn.modeling.build import model_from_state, random_state_dict
from norcal.export.rcnn.onnx_export import export_onnx
from norcal.export.rcnn.spec import ModelSpec
from conftest import assert_tensorrt_compatible
from test_modeling_parity import check_detections

pytestmark = pytest.mark.slow  # exports the detector, incl. a full-size LVIS model
# eager vs ONNX Runtime masks of one model: measured 3.2e-6 largest difference; bound 3e-5:
# 10x for other CPUs' and thread counts' float32 kernels
MASK_TOL = 3e-5

torch.set_num_threads(2)

def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, images: np.ndarray, sizes: np.ndarray) -> dict:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"images": images, "image_sizes": sizes})))


@pytest.fixture(scope="module")
def tiny_model():
    return model_from_state(G.tiny_spec(), G.tiny_state_dict())


@pytest.fixture(scope="module")
def tiny_onnx(tiny_model):
    return export_onnx(tiny_model, G.tiny_spec())


@pytest.fixture(scope="module")
def fixture_batch():
    return G.batch(range(4))


def constant_value(proto: onnx.ModelProto, name: str):
    for init in proto.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t)
    return None


def test_graph_contract(tiny_onnx):
    g = tiny_onnx.graph
    assert [i.name for i in g.input] == ["images", "image_sizes"]
    assert [o.name for o in g.output] == ["num_detections", "boxes", "scores", "classes", "masks"]
    elem = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.output)}
    F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    assert elem == {"images": F, "image_sizes": I64, "num_detections": I64, "boxes": F,
                    "scores": F, "classes": I64, "masks": F}
    dims = [d.dim_param or d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", "width"]
    out_dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
                for o in g.output}
    assert out_dims["masks"] == ["batch", 300, 28, 28] and out_dims["boxes"] == ["batch", 300, 4]
    assert out_dims["scores"] == out_dims["classes"] == ["batch", 300]
    assert max(o.version for o in tiny_onnx.opset_import if o.domain in ("", "ai.onnx")) >= 17
    onnx.checker.check_model(tiny_onnx, full_check=True)


def test_graph_uses_only_tensorrt_friendly_ops(tiny_onnx):
    nodes = list(tiny_onnx.graph.node)
    assert_tensorrt_compatible(tiny_onnx)
    assert not {n.op_type for n in nodes} & {"Loop", "If", "Scan"}  # a detector needs no control flow (the padding switch is opt-in)
    rois = [n for n in nodes if n.op_type == "RoiAlign"]
    assert len(rois) == 8  # 4 FPN levels for the box head, 4 for the mask head
    for n in rois:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["coordinate_transformation_mode"] == b"half_pixel"
        assert attrs["sampling_ratio"] == 0  # written: TensorRT's importer would default to 1
        assert attrs["mode"] == b"avg"
    nms = [n for n in nodes if n.op_type == "NonMaxSuppression"]
    assert len(nms) == 2  # RPN (levels as classes) and the class-wise box NMS
    for n in nms:
        # a constant max_output_boxes_per_class bounds TensorRT's output allocation
        assert constant_value(tiny_onnx, n.input[2]) is not None
    for n in nodes:
        if n.op_type == "TopK":
            k = constant_value(tiny_onnx, n.input[1])
            assert k is not None and int(np.max(k)) < 3840
    softmax = [n for n in nodes if n.op_type == "Softmax"]
    assert len(softmax) == 1 and softmax[0].attribute[0].i in (-1, 2)


def test_onnxruntime_batch_matches_golden_baseline(tiny_onnx, fixture_batch):
    check_detections(run(session(tiny_onnx), *fixture_batch), "baseline")


@pytest.mark.parametrize("setting", G.SETTINGS[1:])
def test_onnxruntime_norcal_matches_golden(tiny_onnx, fixture_batch, setting):
    factor, gamma = G.GAMMAS[setting]
    lp = log_prior(G.lvis_counts(), gamma, factor)
    from norcal.export.graph import surgery
    from norcal.core.calibration.spec import Calibration
    calibrated = surgery.insert_norcal(
        tiny_onnx, Calibration(gamma=gamma, factor=factor, table="lvis_v1", background="last").resolve(1203))
    np.testing.assert_allclose(
        numpy_helper.to_array(next(i for i in calibrated.graph.initializer if i.name == "norcal.log_prior")),
        lp.astype(np.float32))
    onnx.checker.check_model(calibrated, full_check=True)
    assert_tensorrt_compatible(calibrated)
    check_detections(run(session(calibrated), *fixture_batch), setting)


def test_eager_log_prior_does_not_export(tiny_model):
    """NorCal enters the graph only through the surgery's node, never as a second copy."""
    tiny_model.roi_heads.box_predictor.set_log_prior(log_prior(G.lvis_counts(), 0.5, "cdt"))
    try:
        with pytest.raises(NorcalError, match="export the plain model"):
            export_onnx(tiny_model, G.tiny_spec())
    finally:
        tiny_model.roi_heads.box_predictor.set_log_prior(None)


def test_fixed_shape_export_runs_one_image(tiny_model):
    proto = export_onnx(tiny_model, G.tiny_spec(), batch=1, height=320, width=448)
    dims = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 320, 448]
    assert_tensorrt_compatible(proto)
    images, sizes = G.batch([0])
    out = run(session(proto), images, sizes)
    g = G.golden(0)
    frac, _ = G.match_detections(g["baseline/boxes"], g["baseline/scores"],
                                 g["baseline/classes"], out["boxes"][0], out["scores"][0],
                                 out["classes"][0])
    assert frac >= 0.99


def test_export_rejects_bad_arguments(tiny_model):
    with pytest.raises(NorcalError, match="opset 13"):
        export_onnx(tiny_model, G.tiny_spec(), opset=13)
    with pytest.raises(NorcalError, match="multiple of 32"):
        export_onnx(tiny_model, G.tiny_spec(), height=300)


def test_full_size_lvis_model_exports_and_runs():
    """detectron2's LVIS v1 R-50-FPN Mask R-CNN defaults (256 FPN channels, 1024 fc, 1203
    classes), random weights: export, full check, and one 800x1333 image in ONNX Runtime."""
    spec = ModelSpec()
    model = model_from_state(spec, random_state_dict(spec, seed=0))
    proto = export_onnx(model, spec)
    assert proto.ByteSize() > 150e6  # ~44M parameters in fp32
    assert_tensorrt_compatible(proto)
    gen = np.random.default_rng(0)
    images = np.zeros((1, 3, 800, 1344), np.float32)
    images[:, :, :, :1333] = gen.uniform(0, 255, (1, 3, 800, 1333))
    sizes = np.array([[800, 1333]], np.int64)
    out = run(session(proto), images, sizes)
    n = int(out["num_detections"][0])
    assert out["boxes"].shape == (1, 300, 4) and out["masks"].shape == (1, 300, 28, 28)
    assert 0 < n <= 300
    b = out["boxes"][0, :n]
    assert (b[:, 0] >= 0).all() and (b[:, 2] <= 1333).all() and (b[:, 3] <= 800).all()
    s = out["scores"][0, :n]
    assert (np.diff(s) <= 0).all() and (s > 1e-4).all()
    assert ((out["masks"][0, :n] >= 0) & (out["masks"][0, :n] <= 1)).all()


def test_class_agnostic_heads_export_and_match_eager():
    """Class-agnostic box regression and masks take other graph paths (shared NMS boxes,
    mask channel 0); ONNX Runtime must give what the eager model (checked against
    detectron2's algorithm in test_modeling_parity) gives."""
    from test_modeling_parity import agnostic_model

    spec, model = agnostic_model()
    proto = export_onnx(model, spec)
    assert_tensorrt_compatible(proto)
    images, sizes = G.batch([0, 3])
    got = run(session(proto), images, sizes)
    with torch.no_grad():
        want = model.inference(torch.from_numpy(images), torch.from_numpy(sizes))
    for b in range(2):
        n = int(want["num_detections"][b])
        assert int(got["num_detections"][b]) == n
        frac, pairs = G.match_detections(
            want["boxes"][b, :n].numpy(), want["scores"][b, :n].numpy(),
            want["classes"][b, :n].numpy(), got["boxes"][b, :n], got["scores"][b, :n],
            got["classes"][b, :n], min_iou=0.99, max_score_diff=1e-4)
        assert frac >= 0.99
        wi, gi = zip(*pairs)
        diff = np.abs(want["masks"][b].numpy()[list(wi)] - got["masks"][b][list(gi)]).max()
        assert diff <= MASK_TOL, diff


def test_classifier_is_named_at_export(tiny_onnx, monkeypatch):
    """A checkpoint export records its classifier's logits tensor; surgery takes it by name and
    never runs the heuristic search meant for foreign ONNX."""
    from norcal.core import contract
    from norcal.export.graph import classifier_search, surgery
    from norcal.core.calibration.spec import Calibration

    meta = {p.key: p.value for p in tiny_onnx.metadata_props}
    assert meta[contract.CLASSIFIER_LOGITS] == contract.CLS_LOGITS_TENSOR
    softmax = [n for n in tiny_onnx.graph.node if n.op_type == "Softmax"]
    assert [list(n.input) for n in softmax] == [[contract.CLS_LOGITS_TENSOR]]
    assert contract.CLS_LOGITS_TENSOR not in [o.name for o in tiny_onnx.graph.output]

    def no_search(self, want=None):
        raise AssertionError("the heuristic classifier search ran on a checkpoint export")

    monkeypatch.setattr(classifier_search.ClassifierView, "search", no_search)
    lp = log_prior(G.lvis_counts(), 0.5, "cdt")
    cal = surgery.insert_norcal(tiny_onnx, Calibration(gamma=0.5, table="lvis_v1", background="last").resolve(1203))
    np.testing.assert_allclose(
        numpy_helper.to_array(next(i for i in cal.graph.initializer if i.name == contract.PRIOR_NAME)),
        lp.astype(np.float32))
    node = [n for n in cal.graph.node if n.op_type == contract.NODE_OP_TYPE]
    assert len(node) == 1 and list(node[0].input) == [contract.CLS_LOGITS_TENSOR, contract.PRIOR_NAME]
    assert surgery.norcal_metadata(cal)[contract.LOGITS] == contract.CLS_LOGITS_TENSOR


def test_strip_keeps_every_runtime_key(tiny_model):
    """Export with runtime metadata, calibrate, strip: every runtime key keeps its value, every
    key the NorCal node owns is gone (norcal.table and norcal.num_classes are runtime keys)."""
    from norcal.core import contract
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector, runtime_metadata
    from norcal.export.graph.surgery import norcal_metadata, strip_norcal

    exported = export_detector(tiny_model, G.tiny_spec())
    before = norcal_metadata(exported)
    assert runtime_metadata(G.tiny_spec()).items() <= before.items()
    assert before[contract.NUM_CLASSES] == "1203"
    assert contract.CLASS_NAMES not in before  # a detectron2 checkpoint names no class
    calibrated = calibrate_graph(exported, 0.5, "lvis_v1")
    cal_meta = norcal_metadata(calibrated)
    assert contract.NODE_KEYS - contract.OPTIONAL_NODE_KEYS <= set(cal_meta)
    assert contract.RUNTIME_KEYS - contract.OPTIONAL_RUNTIME_KEYS <= set(cal_meta)
    runtime = {k: v for k, v in cal_meta.items() if k in contract.RUNTIME_KEYS}
    assert runtime[contract.TABLE] == "lvis_v1" and len(json.loads(runtime[contract.CATEGORY_IDS])) == 1203
    # the table's names in class order: LVIS v1's categories 1, 2 are aerosol_can, air_conditioner
    assert json.loads(runtime[contract.CLASS_NAMES])[:2] == ["aerosol_can", "air_conditioner"]
    plain = strip_norcal(calibrated)
    after = norcal_metadata(plain)
    assert {k: after.get(k) for k in runtime} == runtime
    assert not set(after) & contract.NODE_KEYS
    assert after[contract.CLASSIFIER_LOGITS] == contract.CLS_LOGITS_TENSOR
    assert not [n for n in plain.graph.node if n.domain == contract.NODE_DOMAIN] and not plain.functions


def test_mask_head_on_detections_only_handles_images_without_any(tiny_model):
    """The mask head runs on the detections only (NonZero): a batch where one image has no
    detection, and one where none has, are valid graphs, and their masks are those of the
    graph that runs the head on all K slots (static), zero in every empty slot."""
    pred = tiny_model.roi_heads.box_predictor
    top = sorted(float(G.golden(k)["baseline/scores"].max()) for k in (0, 1))
    assert top[1] - top[0] > 1e-3  # a threshold between the two images' best scores
    images, sizes = G.batch([0, 1])
    saved = pred.score_thresh
    try:
        for thresh, expect_empty in (((top[0] + top[1]) / 2, 1), (1.0, 2)):
            pred.score_thresh = thresh
            graphs = {rois: export_onnx(tiny_model, G.tiny_spec(), mask_head_rois=rois)
                      for rois in ("valid", "static")}
            out = {rois: run(session(g), images, sizes) for rois, g in graphs.items()}
            num = out["valid"]["num_detections"]
            assert int((num == 0).sum()) == expect_empty
            np.testing.assert_array_equal(num, out["static"]["num_detections"])
            np.testing.assert_allclose(out["valid"]["masks"], out["static"]["masks"], atol=1e-5)
            for b, n in enumerate(num):
                assert not out["valid"]["masks"][b, n:].any()
    finally:
        pred.score_thresh = saved
