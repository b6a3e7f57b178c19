"""The Ultralytics family (YOLO11 / YOLOv8 detect and segment) against Ultralytics itself.

The reference is computed from the Ultralytics PyTorch model alone: its own LetterBox, its own
forward on that tensor, its raw class logits calibrated by hand (sigmoid(phi - gamma log N_c)),
its own ``non_max_suppression(multi_label=True)`` and ``process_mask``; for an end-to-end head
(YOLO26 with ``end2end`` True) its one-to-one branch's logits calibrated by hand, then its head's
own box decoding and ``postprocess`` (``get_topk_index``: NorCal changes which pairs the top-k
keeps, so it comes first) and ``non_max_suppression(end2end=True)`` (its predictor's conf filter).
Ours is the exported NorCal ONNX in ONNX Runtime, fed by our host preprocessing.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from yolo_models import IMAGES, IMGSZ, NUM_CLASSES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

import torch  # noqa: E402

from family_cases import yolo_reference as _reference  # noqa: E402
from yolo_mask_reference import mask_ious, ultralytics_masks  # noqa: E402
from norcal.core import contract  # noqa: E402
from norcal.workflows.parity.matching import match_detections  # noqa: E402
from norcal.core.errors import NorcalError  # noqa: E402
from norcal.export.families import FAMILIES, family_of, load_detector  # noqa: E402
from norcal.export.families.ultralytics.family import UltralyticsFamily  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from norcal.runtime.postprocess import split_outputs  # noqa: E402

S = IMGSZ  # the test checkpoints' trained-at size: their exports' input


@pytest.fixture(scope="module")
def work(yolo_work):
    """The session's checkpoints, table and plain exports (tests/conftest.py YoloWork)."""
    return yolo_work


# --- loading -------------------------------------------------------------------------------

def test_model_save_checkpoints_load_and_are_claimed(work, tmp_path):
    from ultralytics import YOLO

    v8 = tmp_path / "yolov8n.pt"
    YOLO("yolov8n.yaml").save(str(v8))  # 80 classes, as Ultralytics writes it
    assert any(isinstance(f, UltralyticsFamily) for f in FAMILIES)
    for path, task, nc, size in ((work.det, "detect", NUM_CLASSES, S), (v8, "detect", 80, 640)):
        assert isinstance(family_of(path), UltralyticsFamily)
        det = load_detector(path)
        assert (det.task, det.num_classes, det.has_masks) == (task, nc, task == "segment")
        assert det.classifier == load_detector(path).classifier
        assert det.classifier.background == "none" and det.classifier.activation == "sigmoid"
        # the size the model records (its args' imgsz), else the yaml default 640
        assert det.preprocessing.letterbox and det.preprocessing.input_size == size
    # not ours: a plain state dict, a detectron2 pickle, a non-zip file
    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "d2.pth")
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    fam = UltralyticsFamily()
    assert not fam.claims(tmp_path / "d2.pth", None) and not fam.claims(tmp_path / "junk.pt", None)
    assert not fam.claims(work.det, tmp_path / "config.yaml")


def test_loading_leaves_pil_image_open_alone(work):
    from PIL import Image

    load_detector(work.det)
    assert Image.open.__module__ == "PIL.Image"  # Ultralytics' import-time patches undone
    assert np.get_printoptions()["formatter"] is None and np.get_printoptions()["linewidth"] == 75


def test_trainer_checkpoint_loads(work, tmp_path):
    """last.pt / best.pt as the trainer writes them: model None, the EMA, train_args, numpy
    metrics, the optimizer state, the model's args as IterableSimpleNamespace."""
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG_DICT, IterableSimpleNamespace

    model = DetectionModel("yolo11n.yaml", nc=3, verbose=False)
    model.names = {0: "a", 1: "b", 2: "c"}
    model.args = IterableSimpleNamespace(**{**DEFAULT_CFG_DICT, "imgsz": 320})
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    path = tmp_path / "last.pt"
    torch.save({"epoch": 3, "best_fitness": np.float64(0.25), "model": None, "ema": model.half(), "updates": 7,
                "optimizer": opt.state_dict(), "train_args": {**DEFAULT_CFG_DICT, "imgsz": 320},
                "train_metrics": {"metrics/mAP50(B)": np.float64(0.1), "fitness": np.float32(0.2)},
                "train_results": {"epoch": [1.0, 2.0]}, "date": "2026-01-01", "version": "8.4.190",
                "git": {"root": None}, "license": "AGPL-3.0", "docs": "x"}, path)
    det = load_detector(path)
    assert det.num_classes == 3 and det.imgsz == 320 and det.names == ["a", "b", "c"]
    # the export records the model's names: runners check annotation categories against them
    assert json.loads(det.runtime_metadata()[contract.CLASS_NAMES]) == ["a", "b", "c"]


def test_yaml_placeholder_names_are_not_recorded(work):
    from ultralytics.nn.tasks import DetectionModel

    from norcal.export.families.ultralytics.yolo import YoloDetector

    model = DetectionModel("yolo11n.yaml", nc=2, verbose=False)
    assert model.names == {0: "0", 1: "1"}  # Ultralytics' placeholders: they name no category
    assert contract.CLASS_NAMES not in YoloDetector(model.eval(), "yolo11n.yaml").runtime_metadata()
    # yolo_models names the test checkpoints' classes class0, class1, ...
    assert json.loads(load_detector(work.det).runtime_metadata()[contract.CLASS_NAMES]) == [
        f"class{i}" for i in range(NUM_CLASSES)]


class _System:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["det", "rtdetr"])
@pytest.mark.parametrize("payload,global_name", [
    ("system", "posix.system"), ("eval", "builtins.eval"), ("optimizer", "torch.optim.sgd.SGD")])
def test_malicious_checkpoint_is_refused_naming_the_global(work, tmp_path, payload, global_name, kind):
    marker = tmp_path / "pwned"
    path = tmp_path / "best.pt"
    ckpt = torch.load(getattr(work, kind), weights_only=False)  # our own file: a real YOLO / RT-DETR checkpoint
    # the payload rides along the real model, so the file still looks like an Ultralytics one
    ckpt["train_args"] = {"system": _System(marker), "eval": eval, "optimizer": torch.optim.SGD}[payload]
    torch.save(ckpt, path)
    assert isinstance(family_of(path), UltralyticsFamily)  # it looks like one of Ultralytics' files
    with pytest.raises(NorcalError) as e:
        load_detector(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and f"'{global_name}'" in msg and "refused" in msg
    assert not marker.exists()


def test_plain_pickle_with_pt_suffix_is_not_loaded(tmp_path):
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps(_System(tmp_path / "pwned")))
    assert not UltralyticsFamily().claims(path, None)  # no Ultralytics classes named: not its file
    with pytest.raises(NorcalError, match="evil.pt: refused to load"):
        load_detector(path)  # detectron2's safe loader takes what no other family claims; nothing unpickled
    assert not (tmp_path / "pwned").exists()


# --- the reference (Ultralytics with NorCal by hand: family_cases.yolo_reference) -------------

def _match(ref, ours_boxes, ours_scores, ours_classes):
    """For each reference detection, the index of its partner among ours (-1 when none), paired
    one to one by the project's matcher: same class, IoU >= 0.99, score within 1e-4."""
    ri, ci, _ = match_detections(ref[:, :4], ref[:, 4], ref[:, 5].astype(int), ours_boxes, ours_scores,
                                 ours_classes, 0.99, max_score_diff=1e-4)
    idx = np.full(len(ref), -1, np.int64)
    idx[ri] = ci
    return idx


def _graph(work, kind, gamma):
    """The session's one plain export of ``kind``, calibrated at ``gamma`` (surgery only)."""
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    det, plain = work.plain(kind)
    return det, calibrate_onnx(plain, NorCal(gamma=gamma, table=str(work.table)))


def _onnx(work, kind, gamma):
    import onnxruntime as ort

    det, graph = _graph(work, kind, gamma)
    meta = {p.key: p.value for p in graph.metadata_props}
    return det, ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]), meta


def _run(sess, feeds):
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


# Ultralytics' masks through our contract: the graph's mask coefficients and prototypes, each
# image mask made by our host. The reference is Ultralytics' predictor with retina_masks
# (process_mask_native) on its own prototypes and coefficients at our boxes (original image).
# Measured on these models, both gammas: min IoU 0.9996 (seg) and 0.9934 (y26e2e_seg: ONNX
# Runtime's fp32 network against PyTorch's); 2e-5 (seg) to 1.6e-4 (y26e2e_seg) of the pixels in
# either mask differ, all at logits where the two networks' float32 rounding (prototypes and
# coefficients differ by up to 9e-5 on these large random-init prototypes) changes the sign. Our
# host on Ultralytics' own prototypes and coefficients differs on 3 pixels of 35 million (numpy's
# and torch's float32 matrix products round differently); tests/runtime/test_proto_masks.py
# shows it pixel-exact where both multiply the same maps.
MIN_MASK_IOU = 0.99
MAX_DIFFERING = 5e-4  # of the pixels in either mask, over all masks


def _assert_masks(dets, idx, ref, protos):
    """Per matched detection: our image mask against Ultralytics' at our box, IoU >= 0.99.
    Returns (IoUs, [pixels that differ, pixels in either mask])."""
    i = np.nonzero(idx >= 0)[0]
    ours = dets.masks()[idx[i]]
    theirs = ultralytics_masks(protos.astype(np.float32), ref[i, 6:], dets.boxes[idx[i]], dets.image_size)
    ious = mask_ious(ours, theirs)
    assert ious.min() >= MIN_MASK_IOU, ious.min()
    return list(ious), np.array([(ours != theirs).sum(), (ours | theirs).sum()])


def _rle(mask: np.ndarray) -> dict:
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": rle["size"], "counts": rle["counts"].decode()}


def _assert_same_segm_ap(dets, refs, matches, protos, images):
    """Segm AP through our evaluation of our detections with our masks (as norcal infer writes
    them) equals that of the same detections with Ultralytics' masks (process_mask_native at
    our boxes, RLE by pycocotools), at 1e-12. The ground truth: Ultralytics' predictor's masks
    (retina_masks, its own boxes scaled by its scale_boxes) of its 8 best detections per image."""
    import dataclasses

    import torch
    from ultralytics.utils import ops

    from norcal.evaluation import evaluate
    from norcal.workflows.tune_cache import to_eval_detections

    cats = list(range(1, NUM_CLASSES + 1))
    gt = {"images": [], "annotations": [], "categories": [{"id": c, "name": f"c{c}", "frequency": "f"} for c in cats]}
    theirs, same = [], []
    for b, (ref, d, idx, im) in enumerate(zip(refs, dets, matches, images)):
        h, w = im.shape[:2]
        gt["images"].append({"id": b + 1, "height": h, "width": w, "neg_category_ids": [],
                             "not_exhaustive_category_ids": []})
        top = ref[np.argsort(-ref[:, 4], kind="stable")[:8]]
        boxes = ops.scale_boxes((S, S), torch.from_numpy(top[:, :4].copy()), (h, w)).numpy()
        for k, (box, m) in enumerate(zip(boxes, ultralytics_masks(protos[b], top[:, 6:], boxes, (h, w)))):
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": b + 1, "category_id":
                                      int(top[k, 5]) + 1, "bbox": [float(box[0]), float(box[1]),
                                      float(box[2] - box[0]), float(box[3] - box[1])],
                                      "area": int(m.sum()), "segmentation": _rle(m)})
        i = np.nonzero(idx >= 0)[0]  # the detections both have, in ours
        same.append(dataclasses.replace(d, boxes=d.boxes[idx[i]], scores=d.scores[idx[i]],
                                         classes=d.classes[idx[i]], mask_probs=d.mask_probs[idx[i]]))
        theirs += [_rle(m) for m in ultralytics_masks(protos[b], ref[i, 6:], same[-1].boxes, (h, w))]
    ours = to_eval_detections(list(range(1, len(dets) + 1)), same, cats, masks=True)
    assert len(ours.rles) == len(theirs) > 100
    ap_ours = evaluate(gt, ours, "segm").stats["AP"]
    ours.rles = theirs  # the same detections, Ultralytics' masks
    ap_theirs = evaluate(gt, ours, "segm").stats["AP"]
    assert ap_ours > 0.05 and abs(ap_ours - ap_theirs) <= 1e-12, (ap_ours, ap_theirs)


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
        batch = prepare(images, contract.input_spec(meta))
        out = _run(sess, batch.feeds())
        dets = split_outputs(out, batch.image_sizes, batch.original_sizes, True, contract.mask_paste(meta))
        refs, pads, ref_masks, protos = _reference(getattr(work, kind), images, gamma, work.counts, seg)
        total = matched = 0
        differ = np.zeros(2, np.int64)
        mask_ious, matches = [], []
        for b, ref in enumerate(refs):
            n = int(out["num_detections"][b])
            boxes = out["boxes"][b, :n] + pads[b]  # ours are in resized coordinates
            idx = _match(ref, boxes, out["scores"][b, :n], out["classes"][b, :n])
            assert n == len(ref) > 0
            matches.append(idx)
            total += len(ref)
            matched += int((idx >= 0).sum())
            if seg:  # in the original image, as Ultralytics' predictor with retina_masks
                ious, d = _assert_masks(dets[b], idx, ref, protos[b])
                mask_ious += ious
                differ += d
        assert total > 0 and matched / total >= 0.99, (gamma, matched, total)
        if seg:
            assert len(mask_ious) > 300
            assert differ[0] <= MAX_DIFFERING * differ[1], differ
            if gamma == 0.5:
                _assert_same_segm_ap(dets, refs, matches, protos, images)


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
        for k in ("boxes", "scores", "classes", "masks", contract.MASK_PROTOS):
            np.testing.assert_allclose(alone[k][0], both[k][b], rtol=1e-5, atol=1e-4)
    # the PyTorch reference runner with the ONNX's own calibration gives the same detections
    import onnx

    _, graph = _graph(work, kind, 0.5)
    runner = det.torch_runner(onnx_calibration(graph))
    assert runner.output_names == [*contract.OUTPUT_NAMES, contract.MASK_PROTOS]
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
    mask coefficients and prototypes within the fp32 parity preset, and image masks at IoU >=
    0.99, boxes reaching past the input included (their boxes differ by ~2e-3 px between the
    two fp32 kernels)."""
    from norcal.export.pytorch.runner import onnx_calibration
    from norcal.runtime.inference import prepare
    from norcal.workflows.parity.tolerances import PRESETS

    det, sess, meta = _onnx(work, "seg", 0.5)
    _, graph = _graph(work, "seg", 0.5)
    runner = det.torch_runner(onnx_calibration(graph))
    assert contract.mask_paste(runner.metadata) == contract.mask_paste(meta) == "ultralytics"
    images = [read_rgb(p) for p in IMAGES]
    batch = prepare(images, contract.input_spec(meta))
    ours, theirs = _run(sess, batch.feeds()), runner.infer(batch.feeds())
    np.testing.assert_allclose(ours[contract.MASK_PROTOS], theirs[contract.MASK_PROTOS], rtol=1e-4, atol=1e-4)
    atol = PRESETS["fp32"].atol["masks"]
    split = [split_outputs(o, batch.image_sizes, batch.original_sizes, True, "ultralytics") for o in (ours, theirs)]
    past = 0
    for b in range(len(images)):
        n = int(ours["num_detections"][b])
        assert n == int(theirs["num_detections"][b]) > 0
        h, w = batch.image_sizes[b]
        box = theirs["boxes"][b, :n]
        same = (ours["classes"][b, :n] == theirs["classes"][b, :n]) \
            & (np.abs(ours["boxes"][b, :n] - box).max(1) < 1e-2)
        assert same.mean() >= 0.99
        outside = (box[:, 0] < 0) | (box[:, 1] < 0) | (box[:, 2] > w) | (box[:, 3] > h)
        past += int((same & outside).sum())
        np.testing.assert_allclose(ours["masks"][b, :n][same], theirs["masks"][b, :n][same], rtol=1e-4, atol=atol)
        a, t = (s[b].masks()[same] for s in split)
        assert mask_ious(a, t).min() >= MIN_MASK_IOU
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
@pytest.mark.parametrize("kind", ["det", "y26e2e", "det_best_class"])
def test_tune_rescore_equals_the_onnx(work, kind):
    """The family's tune cache from the host's prepared batches, re-scored at gamma 0.5, gives
    the graph's outputs (resized coordinates; the host maps both back alike). An end-to-end
    head: fewer slots than anchors (K 50 of 189), a sweep of gammas 0.5 and 1 and a threshold
    that leave most anchors out of the cache, so the top-k re-run at gamma 0.5 works on a subset
    of each image's anchors, padded up to K rows where fewer are cached. The best-class decoding
    (Ultralytics' predictor NMS, agnostic): each gamma's argmax, conf and NMS re-run from the cache."""
    from norcal.core.calibration import log_prior
    from norcal.runtime.inference import prepare
    from norcal.runtime.postprocess import split_outputs

    if kind == "det":
        det, sess, meta = _onnx(work, "det", 0.5)
    elif kind == "det_best_class":
        from norcal.core.decoding import Decoding

        det, sess, meta = _custom_onnx(work, "det", 0.5, decoding=Decoding("best-class", True, 0.05))
        assert det.model.selection.name == "best-class nms"
    else:
        det, sess, meta = _custom_onnx(work, kind, 0.5, detections_per_image=50, score_thresh=0.12)
        assert det.model.end2end and det.topk == 50 < det._anchors()
    gammas = (0.5, 1.0) if kind == "y26e2e" else (0.0, 0.5)
    spec = contract.input_spec(meta)
    assert det.preprocessing == spec
    priors = [log_prior(work.counts, g, background="none") for g in gammas]
    arrays = [read_rgb(p) for p in IMAGES]
    batches = [([0, 1], prepare(arrays[:2], spec)), ([2, 3], prepare(arrays[2:4], spec))]
    parts = [det.cache([b], priors, "exp") for b in batches]
    cache = type(parts[0]).concat(parts)
    assert len(cache) == 4 and cache.image_ids == [0, 1, 2, 3] and cache.nbytes > 0
    if kind == "y26e2e":  # a subset cached: the top-k re-run per prior sees fewer anchors than the graph
        lens = [len(b) for b in cache.boxes]
        assert all(0 < n < det._anchors() for n in lens) and min(lens) < det.topk, lens
    assert det.cache_bytes(4, 2) >= cache.nbytes
    at = gammas.index(0.5)  # the graph's gamma
    got = det.rescore(cache, at, priors[at], "exp", batch_size=3)
    assert got["boxes"].shape == (4, det.topk, 4)
    batch = prepare(arrays[:4], spec)
    np.testing.assert_array_equal(cache.image_sizes, batch.image_sizes)
    mine = split_outputs(got, cache.image_sizes, cache.original_sizes)
    want = split_outputs(_run(sess, batch.feeds()), batch.image_sizes, batch.original_sizes)
    total = matched = 0
    for g, w in zip(mine, want):  # original coordinates; as sets (torch vs ONNX Runtime kernels)
        assert len(g.scores) == len(w.scores) > 0
        ref = np.concatenate([g.boxes, g.scores[:, None], g.classes[:, None]], 1)
        total, matched = total + len(ref), matched + int((_match(ref, w.boxes, w.scores, w.classes) >= 0).sum())
    assert matched / total >= 0.99, (matched, total)


@pytest.mark.slow
def test_tune_segm_rescoring_gives_ultralytics_masks(work):
    """Tune's segm re-scoring (cache with masks, re-scored at gamma 0.5, masks pasted and
    RLE-encoded as norcal infer writes them) gives each detection Ultralytics' predictor mask
    (process_mask_native on its own prototypes and coefficients at our box)."""
    from pycocotools import mask as mask_utils

    from norcal.core.calibration import log_prior
    from norcal.workflows.tune_cache import cache_images, to_eval_detections

    det = load_detector(work.seg)
    images = [(1, IMAGES[1])]
    prior = log_prior(work.counts, 0.5, background="none")
    cache = cache_images(det, images, [prior], batch_size=1, with_masks=True)
    out = det.rescore(cache, 0, prior, "exp", 1)  # what rescore_images splits
    dets = split_outputs(out, cache.image_sizes, cache.original_sizes, cache.keep_empty_boxes, cache.mask_paste)
    rles = to_eval_detections([1], dets, list(range(1, NUM_CLASSES + 1)), masks=True).rles
    arrays = [read_rgb(p) for _, p in images]
    refs, pads, _, protos = _reference(work.seg, arrays, 0.5, work.counts, True)
    start = 0
    for b, (d, ref, pr) in enumerate(zip(dets, refs, protos)):
        assert d.mask_paste == "ultralytics" and len(d) == len(ref) > 0
        ours = mask_utils.decode(rles[start:start + len(d)]).transpose(2, 0, 1).astype(bool)
        start += len(d)
        n = len(d)
        idx = _match(ref, out["boxes"][b, :n] + pads[b], out["scores"][b, :n], out["classes"][b, :n])
        i = np.nonzero(idx >= 0)[0]
        assert len(i) >= 0.99 * len(ref)
        theirs = ultralytics_masks(pr, ref[i, 6:], d.boxes[idx[i]], d.image_size)
        assert mask_ious(ours[idx[i]], theirs).min() >= MIN_MASK_IOU


@pytest.mark.parametrize("yaml, task", [("yolo11n-pose.yaml", "PoseModel"), ("yolo11n-obb.yaml", "OBBModel"),
                                        ("yolo11n-cls.yaml", "ClassificationModel"), ("yolov8s-worldv2.yaml", "WorldModel")])
def test_other_ultralytics_tasks_are_refused_by_name(tmp_path, yaml, task):
    from ultralytics import YOLO

    f = tmp_path / "other.pt"
    YOLO(yaml).save(str(f))
    with pytest.raises(NorcalError) as e:
        load_detector(f)
    assert str(e.value) == (f"{f}: an Ultralytics {task}; only DetectionModel, SegmentationModel, "
                            "RTDETRDetectionModel checkpoints are exported")


def test_end_to_end_head_loads_as_its_one_to_one_branch(work):
    """A YOLO26 saved with its one-to-one head selected (Ultralytics then predicts without NMS)
    loads as that branch with a top-k, recorded in its settings; an NMS threshold is refused in
    one line naming the file; the same file with end2end False is the one-to-many NMS graph."""
    from ultralytics import YOLO

    e2e = work.y26e2e  # work.y26 with head.end2end = True
    assert YOLO(str(e2e)).model.model[-1].end2end  # as Ultralytics reads the file back
    det = load_detector(e2e)
    assert det.model.end2end and det.model.branch == "one2one"
    settings = det.settings()
    assert settings["selection"] == "one-to-one top-k" and "nms_thresh_test" not in settings
    assert not load_detector(work.y26).model.end2end and load_detector(work.y26).settings()["multi_label"]
    with pytest.raises(NorcalError) as e:
        load_detector(e2e, nms_thresh=0.5)
    assert str(e.value).startswith(f"{e2e}: an end-to-end YOLO head") and "\n" not in str(e.value)


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


@pytest.mark.slow
def test_cli_export_verify_infer_check(work, tmp_path):
    from norcal.cli import export_main, main

    out = tmp_path / "best.norcal.onnx"
    best = tmp_path / "best.pt"
    best.write_bytes(work.det.read_bytes())
    # verify: the family's PyTorch runner against ONNX Runtime on the letterboxed images, fp32 tolerances
    assert export_main([str(best), "--gamma", "0.5", "--table", str(work.table), "--height", str(S),
                        "--width", str(S), "-o", str(out), "--verify", *map(str, IMAGES)]) == 0
    results = tmp_path / "results.json"
    assert main(["infer", str(out), *map(str, IMAGES), "-o", str(results)]) == 0
    rows = json.loads(results.read_text())
    assert rows and {r["category_id"] for r in rows} <= set(range(1, NUM_CLASSES + 1))
    assert main(["check", str(out)]) == 0
    # the C++ host's sidecar reader and a size override refuse a letterbox model in one line
    assert main(["infer", str(out), str(IMAGES[0]), "--min-size", "100", "-o", str(tmp_path / "r2.json")]) == 2


@pytest.mark.slow
def test_export_options_a_yolo_checkpoint_cannot_take(work, tmp_path):
    """Refused by the family in one line naming the parameter, before anything is written."""
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    out = tmp_path / "m.onnx"
    cases = [(CheckpointExport(mask_head_rois="static"), NorCal(gamma=0.5), "mask_head_rois does not apply to ultralytics"),
             (CheckpointExport(config=tmp_path / "c.yaml"), NorCal(gamma=0.5), "takes no config"),
             (CheckpointExport(), NorCal(gamma=None), "gamma is required (0 gives the plain sigmoid)"),
             (CheckpointExport(height=S, width=2 * S), NorCal(gamma=0.5), "square letterbox input")]
    (tmp_path / "c.yaml").write_text("MODEL: {}\n")
    for options, norcal, message in cases:
        with pytest.raises(NorcalError) as e:
            export_checkpoint(work.det, out, norcal, options)
        assert message in str(e.value) and "\n" not in str(e.value)
        assert not out.exists()
