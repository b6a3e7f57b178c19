"""Tune's network pass for Ultralytics models costs what norcal infer's does: an RT-DETR loads
fused as Ultralytics' predictor and exporter run it (BatchNorm folded into the convolutions,
RepConv merged), and the RT-DETR and YOLO tune passes run the head's trace in ONNX Runtime, as
norcal infer runs the export."""

from __future__ import annotations

from yolo_models import IMAGES  # noqa: F401 - sets YOLO_OFFLINE / YOLO_CONFIG_DIR


def _ultralytics_fused(path):
    """The checkpoint as Ultralytics' predictor runs it: its loader, then its own ``fuse()``."""
    from ultralytics import RTDETR

    return RTDETR(str(path)).model.float().eval().fuse(verbose=False)


def _export_logits(plain, x):
    """The plain export's ``cls_logits`` on images ``x`` in ONNX Runtime (as norcal infer runs it)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from norcal.core import contract

    proto = onnx.ModelProto()
    proto.CopyFrom(plain)
    proto.graph.output.append(onnx.helper.make_tensor_value_info(contract.CLS_LOGITS_TENSOR,
                                                                 onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    sizes = np.array([list(x.shape[2:])] * len(x), np.int64)
    return session.run([contract.CLS_LOGITS_TENSOR], {"images": x, "image_sizes": sizes})[0]


def test_loaded_rtdetr_is_ultralytics_fused_model(yolo_work):
    """The detector's network has Ultralytics' fused model's parameters and buffers, name for
    name and bit for bit (unfused, BatchNorm and RepConv's branches would still be there)."""
    from norcal.export.families import load_detector

    ours = load_detector(yolo_work.rtdetr).model
    ref = _ultralytics_fused(yolo_work.rtdetr)
    assert ours.is_fused()  # Ultralytics' own test for "fuse() has nothing left to do"
    mine, theirs = ours.state_dict(), ref.state_dict()
    assert list(mine) == list(theirs)
    assert all(mine[k].equal(theirs[k]) for k in theirs)


def test_rtdetr_in_memory_model_is_fused_as_ultralytics_predicts(yolo_work):
    """from_model fuses the caller's model in place, as Ultralytics' predictor does."""
    import torch
    from ultralytics import RTDETR

    from norcal.export.families.ultralytics.rtdetr import RtdetrDetector

    model = RTDETR(str(yolo_work.rtdetr)).model.float().eval()
    det = RtdetrDetector.from_model(model, imgsz=yolo_work.size)
    assert det.model is model and model.is_fused()
    x = torch.rand(1, 3, yolo_work.size, yolo_work.size) * 255
    with torch.no_grad():
        want = _ultralytics_fused(yolo_work.rtdetr).predict(x / 255.0)[1][:2]
        boxes, logits = det.graph_module().head(x)  # what the export traces
    assert boxes.equal(want[0][-1]) and logits.equal(want[1][-1])


def test_rtdetr_tune_pass_is_the_exports_network_in_onnx_runtime(yolo_work):
    """tune's pass (``head_outputs``) runs what ``norcal infer`` runs: its class logits are the
    exported graph's ``cls_logits`` in ONNX Runtime to 5e-6 (measured 1.9e-6: ONNX Runtime's
    fusions around the cut; PyTorch's eager head is 1e-5 away)."""
    import numpy as np

    det, plain = yolo_work.plain("rtdetr")
    x = (np.random.default_rng(0).random((2, 3, det.height, det.width)) * 255).astype(np.float32)
    want = _export_logits(plain, x)
    _, logits = det.head_outputs(x)
    np.testing.assert_allclose(logits, want, rtol=0, atol=5e-6)


def test_yolo_tune_pass_is_the_exports_network_in_onnx_runtime(yolo_work):
    """A YOLO's tune pass gives the exported graph's ``cls_logits`` in ONNX Runtime bit for bit
    (PyTorch's eager head, BatchNorm unfused, was 1.5e-4 away)."""
    import numpy as np

    det, plain = yolo_work.plain("det")
    x = (np.random.default_rng(0).random((2, 3, det.imgsz, det.imgsz)) * 255).astype(np.float32)
    want = _export_logits(plain, x)
    np.testing.assert_array_equal(det._head_outputs(x)["cls_logits"].numpy(), want)
