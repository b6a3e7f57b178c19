"""Our export of the d2_lvis_tiny fixture at 800x1216 against detectron2's own ONNX export of
the same weights (``detectron2_export_800x1216.onnx``, made by detectron2's TracingAdapter):
ONNX Runtime runs both on one image and the detections (boxes, scores, classes, masks) must
match as sets. detectron2's graph is an independent reference for the whole pipeline,
including the mask head running on the detections only.

Both graphs use score threshold 0.02 instead of the config's 1e-4: with random weights every
class scores ~1e-3, and detectron2's one NonMaxSuppression over all 1.2M candidates (class
offsets) would run for many minutes; 0.02 still leaves 300 detections."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from PIL import Image

import golden as G
from conftest import assert_tensorrt_compatible
from norcal.core import contract
from norcal.export.rcnn.export import export_detector
from norcal.export.rcnn.modeling.build import model_from_state

D2_ONNX = G.FIXTURE / "detectron2_export_800x1216.onnx"
THRESH = 0.02
H, W = 800, 1216


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    rgb = Image.open(G.FIXTURE / "images" / "img0.png").convert("RGB").resize((W, H), Image.BILINEAR)
    return np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1].transpose(2, 0, 1), dtype=np.float32)


@pytest.fixture(scope="module")
def d2_out(image) -> dict[str, np.ndarray]:
    model = onnx.load(D2_ONNX)
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    # the ROI heads' score threshold: the one Greater there against a constant (1e-4)
    hits = [consts[n.input[1]] for n in model.graph.node
            if n.op_type == "Greater" and n.name.startswith("/roi_heads/") and n.input[1] in consts]
    assert len(hits) == 1
    assert np.isclose(numpy_helper.to_array(hits[0].attribute[0].t), 1e-4)
    hits[0].attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(THRESH, np.float32)))
    boxes, classes, masks, scores, size = session(model).run(None, {"x.1": image})
    assert list(size) == [H, W] and len(scores) == 300
    return {"boxes": boxes, "classes": classes, "masks": masks[:, 0], "scores": scores}


@pytest.mark.parametrize("fixed_size, rois", [(True, "valid"), (False, "valid"), (True, "static")],
                         ids=["800x1216", "dynamic-size", "800x1216-static-mask-head"])
def test_our_graph_matches_detectron2s_export(image, d2_out, fixed_size, rois):
    """Fixed 800x1216: the graph masks padding (a smaller image could be padded up to it);
    dynamic size, batch 1: no padding masks at all; the mask head on the detections only or
    on all K slots. Each must give detectron2's detections and masks."""
    spec = dataclasses.replace(G.tiny_spec(), score_thresh_test=THRESH)
    model = model_from_state(spec, G.tiny_state_dict()).eval()
    size = {"height": H, "width": W} if fixed_size else {}
    proto = export_detector(model, spec, batch=1, mask_head_rois=rois, **size)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta[contract.PADDING_MASKS] == ("true" if fixed_size else "false")
    assert meta[contract.MASK_HEAD_ROIS] == rois
    mask_ops = {n.op_type for n in proto.graph.node if n.name.startswith("/roi_heads/")}
    assert ("ScatterND" in mask_ops) == (rois == "valid")
    assert_tensorrt_compatible(proto)
    num, boxes, scores, classes, masks = session(proto).run(
        None, {"images": image[None], "image_sizes": np.array([[H, W]], np.int64)})
    n = int(num[0])
    assert n == 300
    assert np.all(scores[0, n:] == 0) and np.all(masks[0, n:] == 0)
    d = d2_out
    frac, pairs = G.match_detections(d["boxes"], d["scores"], d["classes"], boxes[0, :n],
                                     scores[0, :n], classes[0, :n], min_iou=0.999,
                                     max_score_diff=1e-4)
    # the 300th place is a near tie: only detections clearly above it must be in both
    cut = np.sort(d["scores"])[::-1][-1] + 1e-4
    clear = {i for i, s in enumerate(d["scores"]) if s > cut}
    # and one more may go: on an AVX2-only CPU the stride-4 level's 1000th RPN place was a near
    # tie (objectness logits 9.8e-7 apart; ONNX Runtime's and PyTorch's conv kernels differ there
    # by up to 8.9e-6), and the swapped proposal carried detectron2's detection #1 (score 0.48)
    missing = clear - {gi for gi, _ in pairs}
    assert len(missing) <= 1, f"matched {frac:.3f} of detectron2's detections; missing {sorted(missing)}"
    assert frac >= 0.99
    gi, oi = np.array(pairs).T
    np.testing.assert_allclose(masks[0, oi], d["masks"][gi], atol=2e-3)
