"""The YOLO tune cache (norcal tune's sweep) against the exported graph: re-scored at the graph's
gamma it gives the graph's detections, for the multi-label NMS, an end-to-end head's top-k and the
best-class decoding."""

from __future__ import annotations

import numpy as np
import pytest

from yolo_models import BEST_CLASS_CONF, IMAGES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

from norcal.core import contract  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from test_ultralytics_yolo import _custom_onnx, _match, _onnx, _run  # noqa: E402


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
    from norcal.core.calibration import log_prior
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
