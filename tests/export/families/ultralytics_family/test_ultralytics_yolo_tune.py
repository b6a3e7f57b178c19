"""The YOLO tune cache (norcal tune's sweep) against the exported graph: re-scored at the graph's
gamma it gives the graph's detections, for the multi-label NMS, an end-to-end head's top-k and the
best-class decoding."""

from __future__ import annotations

import numpy as np
import pytest

from yolo_models import BEST_CLASS_CONF, IMAGES, NUM_CLASSES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

from family_cases import yolo_reference as _reference  # noqa: E402
from yolo_mask_reference import mask_ious, ultralytics_masks  # noqa: E402

from norcal.core import contract  # noqa: E402
from norcal.export.families import load_detector  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from norcal.runtime.postprocess import split_outputs  # noqa: E402
from test_ultralytics_yolo import MIN_MASK_IOU, _custom_onnx, _match, _onnx, _run  # noqa: E402


@pytest.fixture(scope="module")
def work(yolo_work):
    """The session's checkpoints, table and plain exports (tests/conftest.py YoloWork)."""
    return yolo_work


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["det", "y26e2e", "det_best_class"])
def test_tune_rescore_equals_the_onnx(work, kind):
    """The family's tune cache from the host's prepared batches, re-scored at gamma 0.5, gives
    the graph's outputs (resized coordinates; the host maps both back alike). An end-to-end
    head: fewer slots than anchors (K 50 of 189), a sweep of gammas 0.5 and 1 and a threshold
    that leave most anchors out of the cache, so the top-k re-run at gamma 0.5 works on a subset
    of each image's anchors, padded up to K rows where fewer are cached. The best-class decoding
    (Ultralytics' predictor NMS, agnostic): each gamma's argmax, conf and NMS re-run from the cache."""
    from norcal.core.calibration.formula import log_prior
    from norcal.runtime.inference import prepare
    from norcal.runtime.postprocess import split_outputs

    if kind == "det":
        det, sess, meta = _onnx(work, "det", 0.5)
    elif kind == "det_best_class":
        from norcal.core.decoding import Decoding

        # the session's best-class export (test_ultralytics_decodings.py makes the same)
        det, sess, meta = _onnx(work, "det", 0.5, Decoding("best-class", True, BEST_CLASS_CONF))
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
    (process_mask_native on its own prototypes and coefficients at our box). The sweep's memo
    (masks pasted once per cache, shared by its gammas: here gamma 0 first) changes no RLE."""
    from pycocotools import mask as mask_utils

    from norcal.core.calibration.formula import log_prior
    from norcal.workflows.tune_cache import cache_images, rescore_gamma, to_eval_detections

    det = load_detector(work.seg)
    images = [(1, IMAGES[1])]
    cats = list(range(1, NUM_CLASSES + 1))
    prior = log_prior(work.counts, 0.5, background="none")
    cache = cache_images(det, images, [None, prior], batch_size=1, with_masks=True)
    out = det.rescore(cache, 1, prior, "exp", 1)  # what rescore_images splits
    dets = split_outputs(out, cache.image_sizes, cache.original_sizes, cache.keep_empty_boxes, cache.mask_paste)
    rles = to_eval_detections([1], dets, cats, masks=True).rles
    memo: dict = {}
    first = rescore_gamma(det, cache, 0, None, "exp", 1, cats, masks=True, mask_memo=memo)
    assert rescore_gamma(det, cache, 1, prior, "exp", 1, cats, masks=True, mask_memo=memo).rles == rles
    assert len(memo[1]) < len(first) + len(rles)  # gamma 0.5 found masks gamma 0 pasted
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

