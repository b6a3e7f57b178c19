"""The decodings an Ultralytics export can take (norcal.core.decoding), against Ultralytics itself.

YOLO best-class: Ultralytics' predictor NMS, ``non_max_suppression(multi_label=False)`` (class-wise,
or ``agnostic``), on its own raw head output with NorCal by hand (sigmoid(logit - gamma log N_c),
tests/family_cases.yolo_reference); ours the exported graph in ONNX Runtime on our host's batches.
RT-DETR: its predictor's boxes are scaled to the image and never clipped (``RTDETRPredictor.postprocess``
itself is the reference), and its best-class decoding is each query's best class.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from yolo_models import BEST_CLASS_CONF as CONF, IMAGES, RTDETR_IMGSZ  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

import torch  # noqa: E402

from family_cases import yolo_reference  # noqa: E402
from norcal.core import contract  # noqa: E402
from norcal.core.decoding import Decoding, recorded_decoding  # noqa: E402
from norcal.core.errors import NorcalError  # noqa: E402
from norcal.export.families import load_detector  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from norcal.workflows.parity.matching import match_detections  # noqa: E402

def _session(plain, gamma, table):
    """ONNX Runtime over the plain export ``plain`` calibrated at ``gamma`` (surgery only), its metadata."""
    import onnxruntime as ort

    from norcal.workflows.export_job import NorCal, calibrate_onnx

    graph = calibrate_onnx(plain, NorCal(gamma=gamma, table=str(table)))
    meta = {p.key: p.value for p in graph.metadata_props}
    return ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]), meta


def _run(sess, feeds):
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _matched(refs, pads, out):
    """(matched, total, counts equal): Ultralytics' detections paired one to one with ours by the
    project's matcher (same class, IoU >= 0.99, score within 1e-4)."""
    matched = total = 0
    same_counts = True
    for b, ref in enumerate(refs):
        n = int(out["num_detections"][b])
        same_counts &= n == len(ref)
        ri, _, _ = match_detections(ref[:, :4], ref[:, 4], ref[:, 5].astype(int), out["boxes"][b, :n] + pads[b],
                                    out["scores"][b, :n], out["classes"][b, :n], 0.99, max_score_diff=1e-4)
        matched, total = matched + len(ri), total + len(ref)
    return matched, total, same_counts


@pytest.mark.slow
@pytest.mark.parametrize("agnostic", [False, True])
def test_yolo_best_class_matches_ultralytics_predictor_nms(yolo_work, agnostic):
    from norcal.runtime.inference import prepare

    det, plain = yolo_work.plain("det", Decoding("best-class", agnostic, CONF))  # shared with the tune tests
    images = [read_rgb(p) for p in IMAGES]
    for gamma in (0.0, 0.5):
        sess, meta = _session(plain, gamma, yolo_work.table)
        assert recorded_decoding(meta) == Decoding("best-class", agnostic, CONF)
        settings = json.loads(meta[contract.DETECTOR])
        assert settings["multi_label"] is False and settings["score_thresh_test"] == CONF
        spec = contract.input_spec(meta)
        out = _run(sess, prepare(images, spec).feeds())
        refs, pads, _, _ = yolo_reference(yolo_work.det, images, gamma, yolo_work.counts, multi_label=False,
                                          conf=CONF, agnostic=agnostic)
        matched, total, same_counts = _matched(refs, pads, out)
        assert same_counts and total > 0 and matched / total >= 0.99, (gamma, matched, total)
        for ref in refs:  # one label per box: no two detections share a box
            assert len(np.unique(ref[:, :4], axis=0)) == len(ref)
        if gamma == 0 or agnostic:
            continue
        # the validator's multi-label NMS is another decoding: ours does not pass for it
        multi, _, _, _ = yolo_reference(yolo_work.det, images, gamma, yolo_work.counts, conf=CONF)
        m, t, same = _matched(multi, pads, out)
        assert not (same and m / t >= 0.99), (gamma, m, t)
        # a batch of two equals each image alone
        both = _run(sess, prepare(images[:2], spec).feeds())
        for b in range(2):
            alone = _run(sess, prepare(images[b:b + 1], spec).feeds())
            for k in ("num_detections", "boxes", "scores", "classes"):
                np.testing.assert_allclose(alone[k][0], both[k][b], rtol=1e-5, atol=1e-4)


def test_decoding_options_refused_in_one_line(yolo_work):
    with pytest.raises(NorcalError, match="agnostic_nms needs the best-class decoding") as e:
        Decoding("multi-label", True)
    assert e.value.param == "agnostic_nms"
    with pytest.raises(NorcalError, match=r"conf must be a number in \[0, 1\), got 1.5"):
        Decoding("best-class", conf=1.5)
    with pytest.raises(NorcalError, match="decoding must be multi-label or best-class, got 'top1'"):
        Decoding("top1")
    with pytest.raises(NorcalError, match="end-to-end YOLO head .* best-class decoding does not apply"):
        load_detector(yolo_work.y26e2e, decoding=Decoding("best-class"))
    with pytest.raises(NorcalError, match="an RT-DETR has no NMS: agnostic_nms does not apply"):
        load_detector(yolo_work.rtdetr, decoding=Decoding("best-class", True))
    assert recorded_decoding({}) == Decoding()  # files that record none: the default
    with pytest.raises(NorcalError, match="norcal.detector: decoding must be"):
        recorded_decoding({contract.DETECTOR: json.dumps({"decoding": "top1"})})


def test_cli_flags_reach_the_metadata_and_other_families_refuse_them(yolo_work, tmp_path, capsys):
    from family_cases import D2_TINY
    from norcal.cli import export_main
    from norcal.core.files.onnx_io import load_onnx
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    out = tmp_path / "best.onnx"
    assert export_main([str(yolo_work.det), "--gamma", "0.5", "--table", str(yolo_work.table), "-o", str(out),
                        "--decoding", "best-class", "--agnostic-nms", "--conf", "0.25"]) == 0
    meta = {p.key: p.value for p in load_onnx(out).metadata_props}
    assert recorded_decoding(meta) == Decoding("best-class", True, 0.25)
    capsys.readouterr()
    bad = tmp_path / "bad.onnx"
    assert export_main([str(yolo_work.det), "--gamma", "0.5", "--table", str(yolo_work.table), "-o", str(bad),
                        "--agnostic-nms"]) == 2
    assert "--agnostic-nms" in capsys.readouterr().err and not bad.exists()
    with pytest.raises(NorcalError, match="detectron2 checkpoints decode as their own post-processing") as e:
        export_checkpoint(D2_TINY / "model_final.pth", bad, NorCal(gamma=0.0),
                          CheckpointExport(config=D2_TINY / "config.yaml", decoding=Decoding("best-class")))
    assert e.value.param == "decoding" and not bad.exists()


# --- RT-DETR --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rtdetr_forward(yolo_work):
    """The test images, and Ultralytics' RT-DETR on them: (model, its stretched inputs, its forward's
    (preds, decoder boxes, decoder logits)), computed once."""
    from ultralytics.data.augment import LetterBox

    from test_ultralytics_rtdetr import ultralytics_forward

    images = [read_rgb(p) for p in IMAGES]
    model = torch.load(yolo_work.rtdetr, weights_only=False)["model"].float().eval()  # our test file
    s = RTDETR_IMGSZ
    theirs = np.stack([LetterBox((s, s), auto=False, scale_fill=True)(image=im.copy()) for im in images])
    return images, model, theirs, ultralytics_forward(model, theirs.transpose(0, 3, 1, 2).astype(np.float32))


@pytest.mark.slow
def test_rtdetr_boxes_unclipped_as_ultralytics_predictor(yolo_work, rtdetr_forward):
    """norcal's host (prepare, ONNX Runtime, split_outputs) against ``RTDETRPredictor.postprocess``
    itself on the same decoder output, gamma 0: the same boxes in the original image, those past
    its border included (Ultralytics clips none)."""
    from ultralytics.models.rtdetr.predict import RTDETRPredictor

    from norcal.runtime.inference import detect, prepare

    images, model, theirs, (preds, _, _) = rtdetr_forward
    _, plain = yolo_work.plain("rtdetr", Decoding(conf=CONF))
    sess, meta = _session(plain, 0.0, yolo_work.table)
    assert meta[contract.CLIP_BOXES] == "false"
    predictor = RTDETRPredictor(overrides={"conf": CONF, "max_det": 300, "verbose": False})
    predictor.model = model
    predictor.batch = [[str(p) for p in IMAGES]]
    results = predictor.postprocess(preds, torch.from_numpy(theirs), [im[..., ::-1] for im in images])

    class Sess:  # the ONNX Runtime session as a Runner for detect()
        def infer(self, feeds):
            return _run(sess, feeds)

    ours = detect(Sess(), prepare(images, contract.input_spec(meta)))
    outside = 0
    for im, r, d in zip(images, results, ours):
        ref = r.boxes.data.numpy()
        ri, ci, _ = match_detections(ref[:, :4], ref[:, 4], ref[:, 5].astype(int), d.boxes, d.scores, d.classes,
                                     0.99, max_score_diff=1e-4)
        assert len(d.scores) == len(ref) and len(ri) >= 0.99 * len(ref)
        h, w = im.shape[:2]
        past = (d.boxes[:, 0] < 0) | (d.boxes[:, 1] < 0) | (d.boxes[:, 2] > w) | (d.boxes[:, 3] > h)
        outside += int(past.sum())
        np.testing.assert_allclose(d.boxes[ci], ref[ri, :4], rtol=0, atol=1e-2)
    assert outside > 0  # boxes past the border took part, unclipped as Ultralytics'


@pytest.mark.slow
def test_rtdetr_best_class_is_each_querys_best_class(yolo_work, rtdetr_forward):
    """Best-class RT-DETR against Ultralytics' decoder output by hand: per query its best class
    after NorCal (the last decoder layer's logits, sigmoid(logit - gamma log N_c)), above conf;
    the re-scoring from the tune cache gives the same at gamma 0.5."""
    from norcal.core.calibration.formula import log_prior
    from norcal.runtime.inference import prepare
    from ultralytics.utils.ops import xywh2xyxy

    images, _, _, (_, dec_boxes, dec_logits) = rtdetr_forward
    det, plain = yolo_work.plain("rtdetr", Decoding("best-class", conf=CONF))  # shared with the tune tests
    s = RTDETR_IMGSZ
    for gamma in (0.0, 0.5):
        sess, meta = _session(plain, gamma, yolo_work.table)
        spec = contract.input_spec(meta)
        batch = prepare(images, spec)
        out = _run(sess, batch.feeds())
        logits = dec_logits.numpy().astype(np.float64) - gamma * np.log(np.array(yolo_work.counts, np.float64))
        probs = 1.0 / (1.0 + np.exp(-logits))
        refs = []
        for b in range(len(images)):
            score, label = probs[b].max(-1), probs[b].argmax(-1)
            keep = score > CONF
            boxes = xywh2xyxy(dec_boxes[b].numpy()[keep]) * s
            refs.append(np.concatenate([boxes, score[keep, None], label[keep, None]], 1))
        pads = [np.zeros(4, np.float32)] * len(images)
        matched, total, same_counts = _matched(refs, pads, out)
        assert same_counts and total > 0 and matched / total >= 0.99, (gamma, matched, total)
        for b in range(len(images)):  # one label per query
            n = int(out["num_detections"][b])
            assert len(np.unique(out["boxes"][b, :n], axis=0)) == n
        if gamma:
            prior = log_prior(yolo_work.counts, gamma, background="none")
            cache = det.cache([([0, 1, 2, 3], batch)], [prior], "exp")
            got = det.rescore(cache, 0, prior, "exp", batch_size=3)
            matched, total, same_counts = _matched(refs, pads, got)
            assert same_counts and matched / total >= 0.99
