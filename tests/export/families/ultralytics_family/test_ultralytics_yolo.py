"""The Ultralytics family (YOLO11 / YOLOv8 detect and segment) against Ultralytics itself.

The reference is computed from the Ultralytics PyTorch model alone: its own LetterBox, its own
forward on that tensor, its raw class logits calibrated by hand (sigmoid(phi - gamma log N_c)),
its own ``non_max_suppression(multi_label=True)`` and ``process_mask``; for an end-to-end head
(YOLO26 with ``end2end`` True) its one-to-one branch's logits calibrated by hand, then its head's
own box decoding and ``postprocess`` (``get_topk_index``: NorCal changes which pairs the top-k
keeps, so it comes first) and ``non_max_suppression(end2end=True)`` (its predictor's conf filter).
Ours is the exported NorCal ONNX in ONNX Runtime, fed by our host preprocessing. (Loading and
options: test_ultralytics_yolo_checkpoints.py; the tune cache: test_ultralytics_yolo_tune.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from yolo_models import IMAGES, IMGSZ  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

from family_cases import yolo_reference as _reference  # noqa: E402
from yolo_mask_reference import mask_grids  # noqa: E402
from norcal.core import contract  # noqa: E402
from norcal.workflows.parity.matching import match_detections  # noqa: E402
from norcal.export.families import load_detector  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402

S = IMGSZ  # the test checkpoints' trained-at size: their exports' input


@pytest.fixture(scope="module")
def work(yolo_work):
    """The session's checkpoints, table and plain exports (tests/conftest.py YoloWork)."""
    return yolo_work


# --- the reference (Ultralytics with NorCal by hand: family_cases.yolo_reference) -------------

def _match(ref, ours_boxes, ours_scores, ours_classes):
    """For each reference detection, the index of its partner among ours (-1 when none), paired
    one to one by the project's matcher: same class, IoU >= 0.99, score within 1e-4."""
    ri, ci, _ = match_detections(ref[:, :4], ref[:, 4], ref[:, 5].astype(int), ours_boxes, ours_scores,
                                 ours_classes, 0.99, max_score_diff=1e-4)
    idx = np.full(len(ref), -1, np.int64)
    idx[ri] = ci
    return idx


def _graph(work, kind, gamma, decoding=None):
    """The session's one plain export of ``kind`` (with ``decoding``), calibrated at ``gamma``
    (surgery only)."""
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    det, plain = work.plain(kind, decoding)
    return det, calibrate_onnx(plain, NorCal(gamma=gamma, table=str(work.table)))


def _onnx(work, kind, gamma, decoding=None):
    import onnxruntime as ort

    det, graph = _graph(work, kind, gamma, decoding)
    meta = {p.key: p.value for p in graph.metadata_props}
    return det, ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]), meta


def _run(sess, feeds):
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


# Ultralytics' mask through our contract: the logit map's mean over each of the box's 28 x 28 bins.
# Measured on these models (both gammas): our graph's grids against those computed from
# Ultralytics' own prototypes and coefficients at our boxes differ by at most 8e-5 (seg) and
# 1.2e-3 (y26e2e_seg: ONNX Runtime's fp32 network against PyTorch's; their boxes differ by up to
# 0.015 px); pasted by our host, ours and Ultralytics' grids (at its boxes) disagree only on
# pixels within 1e-3 of the 0.5 threshold, IoU >= 0.9945 on every mask, and their IoUs with
# Ultralytics' full-resolution mask differ by at most 0.005. That full-resolution mask itself is
# out of the contract's reach on these random-init models' noise-like prototypes: Ultralytics'
# own grids pasted back match it at mean IoU 0.62 (seg; 2% at 0) and 0.82 (y26e2e_seg), exactly
# as ours do.
GRID_ATOL = 2e-3
PASTE_MARGIN = 2e-3


def _assert_masks(out_masks, boxes, idx, ref, ref_masks, protos):
    """Per matched detection: our M x M grid against Ultralytics' computed at our box; our pasted
    mask against Ultralytics' grid (at its box) pasted alike, pixel by pixel up to PASTE_MARGIN
    about the threshold and IoU >= 0.99; and against Ultralytics' final mask, IoU within 0.01 of
    its own grid's (the only gap to it is the M x M representation). Returns the IoUs."""
    from norcal.runtime.postprocess import paste_masks

    i = np.nonzero(idx >= 0)[0]
    mine = out_masks[idx[i]]
    theirs_at_ours = mask_grids(protos, ref[i, 6:], boxes[idx[i]], S)
    np.testing.assert_allclose(mine, theirs_at_ours, rtol=0, atol=GRID_ATOL)
    grids = mask_grids(protos, ref[i, 6:], ref[i, :4], S).astype(np.float32)
    pasted = paste_masks(mine, boxes[idx[i]], (S, S))
    theirs = paste_masks(grids, ref[i, :4], (S, S))
    surely_in = paste_masks(grids, ref[i, :4], (S, S), 0.5 + PASTE_MARGIN)
    maybe_in = paste_masks(grids, ref[i, :4], (S, S), 0.5 - PASTE_MARGIN)
    assert (surely_in <= pasted).all() and (pasted <= maybe_in).all()
    ious = []
    for k, (o, t, full) in enumerate(zip(pasted, theirs, ref_masks[i])):
        union = (o | t).sum()
        if union >= 20:
            iou = (o & t).sum() / union
            assert iou >= 0.99, (k, iou)
            gap = (o & full).sum() / max((o | full).sum(), 1) - (t & full).sum() / max((t | full).sum(), 1)
            assert abs(gap) <= 0.01, (k, gap)
            ious.append(iou)
    return ious


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["det", "seg", "v8", "y26", "y26e2e", "y26e2e_seg"])
def test_onnx_matches_ultralytics_with_norcal(work, kind):
    from norcal.runtime.inference import prepare

    seg = kind in ("seg", "y26e2e_seg")
    images = [read_rgb(p) for p in IMAGES]
    assert len(images) >= 4
    for gamma in (0.0, 0.5):
        det, sess, meta = _onnx(work, kind, gamma)
        assert meta[contract.RESIZE] == "letterbox" and meta[contract.INPUT_SIZE] == str(S)
        assert meta[contract.CLASSIFIER_LOGITS] == "cls_logits" and meta[contract.CLASSIFIER_BACKGROUND] == "none"
        assert meta[contract.ACTIVATION] == "sigmoid" and float(meta[contract.GAMMA]) == gamma
        out = _run(sess, prepare(images, contract.input_spec(meta)).feeds())
        refs, pads, ref_masks, protos = _reference(getattr(work, kind), images, gamma, work.counts, seg)
        total = matched = 0
        mask_ious = []
        for b, ref in enumerate(refs):
            n = int(out["num_detections"][b])
            boxes = out["boxes"][b, :n] + pads[b]  # ours are in resized coordinates
            idx = _match(ref, boxes, out["scores"][b, :n], out["classes"][b, :n])
            assert n == len(ref) > 0
            total += len(ref)
            matched += int((idx >= 0).sum())
            if seg:  # in the letterboxed input, where Ultralytics' process_mask works
                mask_ious += _assert_masks(out["masks"][b, :n], boxes, idx, ref, ref_masks[b], protos[b])
        assert total > 0 and matched / total >= 0.99, (gamma, matched, total)
        if seg:
            assert len(mask_ious) > 300


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seg", "y26e2e_seg"])
def test_batch_of_two_equals_each_alone_and_torch_runner(work, kind):
    from norcal.runtime.inference import prepare
    from norcal.export.pytorch.runner import onnx_calibration

    det, sess, meta = _onnx(work, kind, 0.5)
    images = [read_rgb(p) for p in IMAGES[:2]]
    spec = contract.input_spec(meta)
    both = _run(sess, prepare(images, spec).feeds())
    for b, im in enumerate(images):
        alone = _run(sess, prepare([im], spec).feeds())
        assert int(alone["num_detections"][0]) == int(both["num_detections"][b]) > 0
        for k in ("boxes", "scores", "classes", "masks"):
            np.testing.assert_allclose(alone[k][0], both[k][b], rtol=1e-5, atol=1e-4)
    # the PyTorch reference runner with the ONNX's own calibration gives the same detections
    import onnx

    _, graph = _graph(work, kind, 0.5)
    runner = det.torch_runner(onnx_calibration(graph))
    assert runner.output_names == list(contract.OUTPUT_NAMES)
    feeds = prepare(images, spec).feeds()
    theirs = runner.infer(feeds)
    assert isinstance(graph, onnx.ModelProto)
    np.testing.assert_array_equal(theirs["num_detections"], both["num_detections"])
    for b in range(len(images)):  # as sets: float32 kernels differ, near-ties may swap slots
        n = int(both["num_detections"][b])
        ref = np.concatenate([theirs["boxes"][b, :n], theirs["scores"][b, :n, None],
                              theirs["classes"][b, :n, None]], 1)
        idx = _match(ref, both["boxes"][b, :n], both["scores"][b, :n], both["classes"][b, :n])
        assert (idx >= 0).mean() >= 0.99


@pytest.mark.slow
def test_torch_runner_masks_equal_onnx_runtime_for_boxes_past_the_border(work):
    """The PyTorch runner (--verify, norcal parity --checkpoint) and ONNX Runtime give the same
    box-relative masks within the fp32 parity preset's 1e-3, boxes reaching past the input
    included (their boxes differ by up to ~2e-3 px between the two fp32 kernels)."""
    from norcal.export.pytorch.runner import onnx_calibration
    from norcal.runtime.inference import prepare
    from norcal.workflows.parity.tolerances import PRESETS

    det, sess, meta = _onnx(work, "seg", 0.5)
    _, graph = _graph(work, "seg", 0.5)
    runner = det.torch_runner(onnx_calibration(graph))
    images = [read_rgb(p) for p in IMAGES]
    feeds = prepare(images, contract.input_spec(meta)).feeds()
    ours, theirs = _run(sess, feeds), runner.infer(feeds)
    atol = PRESETS["fp32"].atol["masks"]
    past = 0
    for b in range(len(images)):
        n = int(ours["num_detections"][b])
        assert n == int(theirs["num_detections"][b]) > 0
        h, w = feeds["image_sizes"][b]
        box = theirs["boxes"][b, :n]
        same = (ours["classes"][b, :n] == theirs["classes"][b, :n]) \
            & (np.abs(ours["boxes"][b, :n] - box).max(1) < 1e-2)
        assert same.mean() >= 0.99
        outside = (box[:, 0] < 0) | (box[:, 1] < 0) | (box[:, 2] > w) | (box[:, 3] > h)
        past += int((same & outside).sum())
        np.testing.assert_allclose(ours["masks"][b, :n][same], theirs["masks"][b, :n][same], rtol=0, atol=atol)
    assert past >= 100  # the random-init model's boxes are large: most reach past the input


def _custom_onnx(work, kind, gamma, **options):
    """``kind``'s checkpoint loaded with ``options``, exported and calibrated at ``gamma``."""
    import onnxruntime as ort

    from norcal.workflows.export_job import NorCal, calibrate_onnx

    det = load_detector(getattr(work, kind), **options)
    graph = calibrate_onnx(det.export(None), NorCal(gamma=gamma, table=str(work.table)))
    meta = {p.key: p.value for p in graph.metadata_props}
    return det, ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]), meta


@pytest.mark.slow
def test_end_to_end_top_k_with_fewer_slots_than_anchors_matches_ultralytics(work):
    """K 50 of 189 anchors: Ultralytics' top-k first keeps 50 anchors by best class score, then
    50 of their (anchor, class) pairs, both on NorCal's scores; ours in ONNX Runtime the same,
    with no NMS in the graph."""
    from norcal.runtime.inference import prepare

    images = [read_rgb(p) for p in IMAGES]
    det, sess, meta = _custom_onnx(work, "y26e2e", 0.5, detections_per_image=50)
    assert det.topk == 50 < det._anchors()
    out = _run(sess, prepare(images, contract.input_spec(meta)).feeds())
    assert out["scores"].shape == (len(images), 50)
    refs, pads, _, _ = _reference(work.y26e2e, images, 0.5, work.counts, False, max_det=50)
    total = matched = 0
    for b, ref in enumerate(refs):
        n = int(out["num_detections"][b])
        assert n == len(ref) > 0
        idx = _match(ref, out["boxes"][b, :n] + pads[b], out["scores"][b, :n], out["classes"][b, :n])
        total, matched = total + len(ref), matched + int((idx >= 0).sum())
    assert matched / total >= 0.99, (matched, total)
