"""RT-DETR (Ultralytics) through our export: ONNX Runtime vs Ultralytics' own PyTorch model.

The reference is computed from Ultralytics alone: its model's forward on the same tensor, its
decoder's own ``postprocess`` (top K over queries x classes) and its predictor's confidence
filter, with NorCal applied by hand in numpy to the class logits its forward returns. The
model is Ultralytics' rtdetr-l.yaml built offline (no weights downloaded) at imgsz 160; its
linear and conv weights are redrawn with a larger scale so that scores spread (at Ultralytics'
initialisation every query scores almost the same and ties would decide the order) and boxes
vary (its box heads start at zero: every box would be its query's anchor).
"""

import os

import numpy as np
import pytest
from PIL import Image

from conftest import FIXTURES, assert_tensorrt_compatible
from norcal.core import contract
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import CalibrationTable
from norcal.runtime.preprocess import prepare_stretch_batch, resize_linear_uint8

IMGSZ = 160
CONF = 0.2  # Ultralytics' conf: cuts the top 300 at both gammas
COUNTS = [40, 12, 4, 2, 1] + [2] * 75  # 80 classes (rtdetr-l.yaml's nc)


@pytest.fixture(scope="module")
def ultralytics_env(tmp_path_factory):
    """Ultralytics offline, its settings in a temporary folder, and PIL as it was: importing
    ultralytics replaces PIL.Image.open process-wide (an unreadable image then tries to install
    pi-heif and raises ModuleNotFoundError instead of PIL's error), which later tests would see."""
    from PIL import Image

    old = {k: os.environ.get(k) for k in ("YOLO_OFFLINE", "YOLO_CONFIG_DIR")}
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_CONFIG_DIR"] = str(tmp_path_factory.mktemp("yolo_cfg"))
    pil_open = Image.open
    import ultralytics.utils.patches as patches

    Image.open = getattr(patches, "_image_open", pil_open)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def rtdetr(ultralytics_env):
    """Ultralytics' in-memory RT-DETR (rtdetr-l.yaml), weights redrawn (seeded)."""
    import torch
    from ultralytics import RTDETR

    from yolo_models import redraw_rtdetr

    torch.manual_seed(0)
    model = RTDETR("rtdetr-l.yaml").model.eval()
    redraw_rtdetr(model)
    return model


def images_rgb():
    return [np.asarray(Image.open(FIXTURES / "images" / f"img{i}.png").convert("RGB")) for i in range(4)]


def table():
    return CalibrationTable("t", "test", "image", [
        {"id": i + 1, "name": f"c{i}", "image_count": n, "instance_count": n, "frequency": "f"}
        for i, n in enumerate(COUNTS)])


def ultralytics_forward(model, images: np.ndarray):
    """Ultralytics' own forward on the images (RGB 0-255 -> /255): its decoder's selection
    [B,300,6], the last decoder layer's boxes [B,300,4] and class logits [B,300,C]."""
    import torch

    with torch.no_grad():
        preds, (dec_boxes, dec_logits, *_) = model(torch.from_numpy(images / 255.0).float())
    return preds, dec_boxes[-1], dec_logits[-1]


def reference(model, forward, gamma: float, counts=COUNTS, imgsz: int = IMGSZ, conf: float = CONF) -> list[np.ndarray]:
    """Ultralytics' detections per image, [N, 6] x0,y0,x1,y1 (pixels of the imgsz input), score,
    class: NorCal by hand on its logits (``counts``: N_c), its decoder's top K and its
    predictor's conf filter."""
    import torch
    from ultralytics.utils.ops import xywh2xyxy

    preds, dec_boxes, dec_logits = forward
    if gamma:
        logits = dec_logits.numpy().astype(np.float64)
        calibrated = 1.0 / (1.0 + np.exp(-(logits - gamma * np.log(np.array(counts, np.float64)))))
        with torch.no_grad():
            preds = model.model[-1].postprocess(dec_boxes, torch.from_numpy(calibrated).float())
    out = []
    for p in preds.numpy():
        p = p[p[:, 4] > conf]  # RTDETRPredictor.postprocess
        boxes = xywh2xyxy(p[:, :4]) * np.array([imgsz] * 4, np.float32)
        out.append(np.concatenate([boxes, p[:, 4:6]], axis=1))
    return out


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=-1)
    area = lambda x: np.prod(x[:, 2:] - x[:, :2], axis=-1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def matched(ref: np.ndarray, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> int:
    """How many reference detections find their own one (same class, IoU >= 0.99, score within 1e-4)."""
    free = np.ones(len(boxes), bool)
    ious = iou(ref[:, :4], boxes) if len(ref) and len(boxes) else np.zeros((len(ref), len(boxes)))
    n = 0
    for i, r in enumerate(ref):
        ok = free & (classes == int(r[5])) & (ious[i] >= 0.99) & (np.abs(scores - r[4]) <= 1e-4)
        if ok.any():
            free[np.flatnonzero(ok)[0]] = False
            n += 1
    return n


# ---------------------------------------------------------------- host pre-processing (fast)
def test_stretch_resize_is_opencvs_linear():
    import cv2

    rng = np.random.default_rng(0)
    for h, w, nh, nw in [(480, 640, 160, 160), (333, 500, 256, 256), (320, 320, 160, 160),  # shrinking
                         (100, 37, 160, 160), (7, 9, 23, 5)]:  # enlarging, stretching
        im = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        np.testing.assert_array_equal(resize_linear_uint8(im, nh, nw),
                                      cv2.resize(im, (nw, nh), interpolation=cv2.INTER_LINEAR))


def test_stretch_batch_fills_the_input():
    ims = [np.full((30, 90, 3), (10, 20, 30), np.uint8), np.full((70, 20, 3), 200, np.uint8)]
    b = prepare_stretch_batch(ims, 64, 96)
    assert b.images.shape == (2, 3, 64, 96) and b.images.dtype == np.float32
    assert b.image_sizes.tolist() == [[64, 96], [64, 96]]
    assert b.original_sizes.tolist() == [[30, 90], [70, 20]]
    assert b.images[0, :, 5, 7].tolist() == [10, 20, 30]  # RGB, 0-255, no padding anywhere
    assert prepare_stretch_batch(ims, 64, 96, "BGR").images[0, :, 0, 0].tolist() == [30, 20, 10]


def test_stretch_metadata_is_read_back():
    meta = {contract.RESIZE: contract.RESIZE_STRETCH, contract.INPUT_SIZE: "224"}
    spec = contract.input_spec(meta)
    assert (spec.resize, spec.input_size, spec.input_format) == ("stretch", 224, "BGR")
    assert contract.input_spec({**meta, contract.INPUT_FORMAT: "RGB"}) == contract.stretch_preprocessing(224)
    unclipped = contract.stretch_preprocessing(224, clip_boxes=False)
    assert unclipped.metadata()[contract.CLIP_BOXES] == "false"
    assert contract.input_spec(unclipped.metadata()) == unclipped
    with pytest.raises(NorcalError, match="norcal.clip_boxes='no' is not true or false"):
        contract.input_spec({**meta, contract.CLIP_BOXES: "no"})
    assert contract.input_spec({}).resize == "shortest_edge"
    for bad in ({contract.RESIZE: "letterbox?"}, {**meta, contract.INPUT_SIZE: "160,160"},
                {**meta, contract.INPUT_SIZE: "0"}, {contract.RESIZE: contract.RESIZE_STRETCH}):
        with pytest.raises(NorcalError):
            contract.input_spec(bad)
    with pytest.raises(NorcalError, match="cannot change a stretch model"):
        contract.input_spec(meta, min_size=800)


def test_detector_refuses_what_does_not_fit(rtdetr):
    from norcal.export.families.ultralytics.rtdetr import RtdetrDetector

    d = RtdetrDetector.from_model(rtdetr, imgsz=IMGSZ)
    assert d.num_classes == 80 and d.num_queries == 300 and len(d.names) == 80
    assert d.classifier.background == "none" and d.classifier.activation == "sigmoid"
    with pytest.raises(NorcalError, match="names lists 3 classes but the RT-DETR head has 80"):
        RtdetrDetector.from_model(rtdetr, ["a", "b", "c"], imgsz=IMGSZ)
    for bad in (150, (160, 160), 0):
        with pytest.raises(NorcalError, match="must be a positive multiple of 32"):
            RtdetrDetector.from_model(rtdetr, imgsz=bad)
    with pytest.raises(NorcalError, match="score_thresh"):
        RtdetrDetector.from_model(rtdetr, imgsz=IMGSZ, score_thresh=float("nan"))
    head = rtdetr.model[-1]
    head.export = True  # Ultralytics' export mode hides the decoder's raw outputs
    try:
        with pytest.raises(NorcalError, match="no raw decoder outputs"):
            d.head_outputs(np.zeros((1, 3, IMGSZ, IMGSZ), np.float32))
    finally:
        head.export = False


# ---------------------------------------------------------------- the exported graph
@pytest.mark.slow
def test_onnx_matches_ultralytics_with_norcal(rtdetr, tmp_path):
    import onnxruntime as ort

    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.families.ultralytics.rtdetr import RtdetrDetector
    from norcal.export.pytorch.runner import onnx_calibration
    from norcal.runtime.postprocess import split_outputs

    det = RtdetrDetector.from_model(rtdetr, imgsz=IMGSZ, score_thresh=CONF)
    plain = det.export()
    meta = {p.key: p.value for p in plain.metadata_props}
    assert meta[contract.RESIZE] == "stretch" and meta[contract.INPUT_SIZE] == "160"
    assert meta[contract.INPUT_FORMAT] == "RGB" and meta[contract.CLASSIFIER_BACKGROUND] == "none"
    raw = images_rgb()
    batch = prepare_stretch_batch(raw, IMGSZ, IMGSZ)
    forward = ultralytics_forward(rtdetr, batch.images)
    parts = [([0, 1, 2], prepare_stretch_batch(raw[:3], IMGSZ, IMGSZ)), ([3], prepare_stretch_batch(raw[3:], IMGSZ, IMGSZ))]
    cache = det.cache(parts, [], "exp")
    assert cache.logits.shape == (4, 300, 80) and cache.boxes.shape == (4, 300, 4)
    for gamma in (0.0, 0.5):
        model = calibrate_graph(plain, gamma, table())
        m = {p.key: p.value for p in model.metadata_props}
        assert m[contract.ACTIVATION] == "sigmoid" and m[contract.LOGITS] == "cls_logits"
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, batch.feeds())))
        ref = reference(rtdetr, forward, gamma)
        total = hits = 0
        for b in range(len(raw)):
            n = int(out["num_detections"][b])
            assert n == len(ref[b]) and 0 < n < 300, (gamma, b, n, len(ref[b]))
            hits += matched(ref[b], out["boxes"][b, :n], out["scores"][b, :n], out["classes"][b, :n])
            total += len(ref[b])
            assert not out["scores"][b, n:].any() and not out["boxes"][b, n:].any()
        assert hits >= 0.99 * total, (gamma, hits, total)
        # a batch of two equals each image alone
        pair = {k: v[:2] for k, v in batch.feeds().items()}
        both = sess.run(None, pair)
        for b in range(2):
            alone = sess.run(None, {k: v[b:b + 1] for k, v in pair.items()})
            for x, y in zip(both, alone):
                np.testing.assert_allclose(x[b], y[0], rtol=0, atol=2e-4)
        # the tuning path (cached logits re-scored) gives what norcal infer would write
        prior = gamma * np.log(np.array(COUNTS, np.float64))
        tuned = split_outputs(det.rescore(cache, 0, prior, "exp", 3), cache.image_sizes, cache.original_sizes)
        for t, i in zip(tuned, split_outputs(out, batch.image_sizes, batch.original_sizes)):
            assert len(t.boxes) == len(i.boxes)
            np.testing.assert_allclose(t.boxes, i.boxes, atol=0.1)  # original pixels
            np.testing.assert_allclose(t.scores, i.scores, atol=1e-4)
    assert_tensorrt_compatible(model)  # the NorCal graph, gamma 0.5
    # our PyTorch reference (the parity runner) with the NorCal the graph carries
    pair = {k: v[:2] for k, v in batch.feeds().items()}
    torch_out = det.torch_runner(onnx_calibration(model)).infer(pair)
    np.testing.assert_array_equal(torch_out["num_detections"], out["num_detections"][:2])
    np.testing.assert_allclose(torch_out["scores"], out["scores"][:2], atol=1e-4)
