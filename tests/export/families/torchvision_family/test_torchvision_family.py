"""The torchvision family: Faster / Mask R-CNN state dicts exported to our contract and proved
against torchvision's own model (NorCal applied by hand to its class logits, then torchvision's
own postprocess_detections), alone and batched."""

import pickle
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image
from torchvision.models.detection.transform import _resize_image_and_masks

from norcal.core.boxes import box_iou
from norcal.core.calibration.spec import Calibration
from norcal.core.errors import NorcalError
from norcal.export.families import family_of, load_detector
from norcal.export.rcnn.detector import GraphOptions
from norcal.export.families.torchvision.detector import detector_from_state
from norcal.export.graph.surgery import insert_norcal
from norcal.runtime.preprocess import prepare_batch, resize_bilinear_float, torchvision_size
from norcal.workflows.parity.matching import match_detections
from family_cases import torchvision_prior as _by_hand_prior, torchvision_reference as _reference
from tests.torchvision_models import r50, table_file, tiny_rcnn, tiny_retinanet

# small inputs keep the parity tests fast (the family's default is 800 / 1333); a 224 side pads to
# 7 stride-32 cells, so torchvision's P6 stride is 224 // 4 = 56, not 64: the anchors' quirk is in play
MIN, MAX = 224, 352
GAMMAS = (0.0, 0.5)


def _images(tiny_dir):
    return [np.asarray(Image.open(p).convert("RGB")).copy() for p in sorted((tiny_dir / "images").glob("*.png"))]


def _assert_matches(ref: dict, boxes, scores, classes, masks=None):
    ri, ci, ious = match_detections(ref["boxes"], ref["scores"], ref["labels"], boxes, scores, classes,
                                    iou_threshold=0.99, max_score_diff=1e-4)
    n = len(ref["scores"])
    assert n > 20 and len(scores) == n
    assert len(ri) >= 0.99 * n, f"{len(ri)} of {n} detections matched"
    if masks is not None:
        assert np.abs(masks[ci] - ref["masks"][ri, 0]).max() < 1e-3


def _assert_same(out: dict, i: int, alone: dict):
    """Image ``i`` of ``out`` has the detections ``alone`` (a one-image run) has: the same count,
    every one paired (class, IoU >= 0.999, score within 1e-5); equal scores may swap places."""
    n = int(alone["num_detections"][0])
    assert int(out["num_detections"][i]) == n
    ri, _, _ = match_detections(alone["boxes"][0, :n], alone["scores"][0, :n], alone["classes"][0, :n],
                                out["boxes"][i, :n], out["scores"][i, :n], out["classes"][i, :n],
                                iou_threshold=0.999, max_score_diff=1e-5)
    assert len(ri) == n


def _session(graph):
    return ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(sess, batch):
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, batch.feeds())))


def test_host_resize_is_torchvision_transform():
    rng = np.random.default_rng(0)
    for h, w in [(480, 640), (427, 640), (333, 500), (640, 480), (100, 2000), (37, 53)]:
        img = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
        ref, _ = _resize_image_and_masks(torch.from_numpy(img).permute(2, 0, 1).float(), 800, 1333)
        nh, nw = torchvision_size(h, w, 800, 1333)
        assert (nh, nw) == tuple(ref.shape[1:])
        ours = resize_bilinear_float(img, nh, nw).transpose(2, 0, 1)
        # the same taps and weights; torch's vectorised multiply-adds (two passes, each a few
        # roundings, their order set by the kernel's vector width) land up to ~4 ulp apart at 255:
        # a wrong tap or weight is off by > 1e-2
        assert np.abs(ours - ref.numpy()).max() <= 6 * np.spacing(np.float32(255))


def test_anchors_are_torchvision_anchors_per_image():
    """Our per-image anchors == torchvision's AnchorGenerator for each image of a batch alone
    (its strides are the padded size // the grid: P6 of 800 rows is 61, of 832 rows 64)."""
    from torchvision.models.detection.anchor_utils import AnchorGenerator as TvAnchors
    from torchvision.models.detection.image_list import ImageList

    from norcal.export.families.torchvision.convention import TORCHVISION
    from norcal.export.rcnn.modeling.anchors import AnchorGenerator

    sizes, ratios = ((32,), (64,), (128,), (256,), (512,)), ((0.5, 1.0, 2.0),) * 5
    tv = TvAnchors(sizes, ratios)
    ours = AnchorGenerator(sizes, ratios[:1], [4, 8, 16, 32, 64], rounded=TORCHVISION.rounded_anchors,
                           per_image_strides=TORCHVISION.per_image_anchor_strides)
    padded = torch.tensor([[800, 1088], [832, 1216]])  # the batch pads to 832 x 1216
    feats = [torch.zeros(2, 1, -(-832 // s), -(-1216 // s)) for s in (4, 8, 16, 32, 64)]
    mine = ours(feats, padded)
    for b, (h, w) in enumerate(padded.tolist()):
        own = [torch.zeros(1, 1, -(-h // s), -(-w // s)) for s in (4, 8, 16, 32, 64)]
        ref = tv(ImageList(torch.zeros(1, 3, h, w), [(h, w)]), own)[0]
        levels = []
        for f, m in zip(own, mine):  # our grid is the batch's: keep the image's own cells
            gh, gw = f.shape[-2:]
            levels.append(m[b].reshape(feats[len(levels)].shape[-2], feats[len(levels)].shape[-1], 3, 4)
                          [:gh, :gw].reshape(-1, 4))
        assert torch.equal(torch.cat(levels), ref)


def test_family_claims_and_reads_shapes(tmp_path, tiny_dir):
    for masks in (False, True):
        path = tmp_path / f"r50_{masks}.pth"
        torch.save(r50(masks, num_classes=7).state_dict(), path)
        assert family_of(path).name == "torchvision"
        det = load_detector(path)
        assert (det.spec.depth, det.num_classes, det.has_masks, det.topk) == (50, 6, masks, 100)
        assert det.classifier.background == "first" and det.classifier.activation == "softmax"
        with pytest.raises(NorcalError, match="takes no config"):
            load_detector(path, tmp_path / "config.yaml")
    # a training script's {"model": ...} of a DistributedDataParallel model
    wrapped = tmp_path / "ddp.pth"
    torch.save({"model": {f"module.{k}": v for k, v in r50(False, num_classes=3).state_dict().items()}}, wrapped)
    assert family_of(wrapped).name == "torchvision" and load_detector(wrapped).num_classes == 2
    assert family_of(tiny_dir / "model_final.pth").name == "detectron2"


def test_family_reads_retinanet_refuses_fcos_and_malicious_pickles(tmp_path):
    import torchvision

    retina = torchvision.models.detection.retinanet_resnet50_fpn(weights=None, weights_backbone=None,
                                                                 num_classes=3)
    path = tmp_path / "retina.pth"
    torch.save(retina.state_dict(), path)
    det = load_detector(path)
    assert family_of(path).name == "torchvision" and (det.spec.depth, det.num_classes, det.topk) == (50, 3, 300)
    assert det.spec.retinanet_p6_from_p5 and det.classifier.background == "none"
    assert det.classifier.activation == "sigmoid"
    fcos = torchvision.models.detection.fcos_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3)
    path = tmp_path / "fcos.pth"
    torch.save(fcos.state_dict(), path)
    assert family_of(path).name == "torchvision"
    with pytest.raises(NorcalError, match="FCOS"):
        load_detector(path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    sd = tiny_rcnn().state_dict()
    sd["backbone.body.evil"] = Evil()
    bad = tmp_path / "evil.pth"
    torch.save(sd, bad)
    assert zipfile.is_zipfile(bad)
    assert family_of(bad).name == "torchvision"
    with pytest.raises(NorcalError, match="weights_only"):
        load_detector(bad)
    legacy = tmp_path / "legacy.pth"  # a non-zip pickle is no torchvision state dict we can sniff
    legacy.write_bytes(pickle.dumps({"rpn.head.cls_logits.weight": Evil()}))
    assert family_of(legacy).name != "torchvision"


def _assert_alone_batched_tuned(det, graph, table, background, images, refs, priors, batch_starts):
    """At each of GAMMAS: our graph in ONNX Runtime matches torchvision's reference per image,
    norcal tune's cache re-scored at that prior equals it, and a batch of two images of different
    sizes (starting at each of ``batch_starts``) equals each image alone."""
    # norcal tune's pass: the network once, re-scored per prior
    cache = det.cache([([0, 1], prepare_batch(images[:2], det.preprocessing)),
                       ([2, 3], prepare_batch(images[2:], det.preprocessing))], priors, "exp")
    for g, gamma in enumerate(GAMMAS):
        cal = Calibration(gamma=gamma, table=table, background=background).resolve(3)
        sess = _session(insert_norcal(graph, cal))
        alone = []
        for img, ref in zip(images, refs):
            batch = prepare_batch([img], det.preprocessing)
            assert tuple(batch.image_sizes[0]) == ref[g]["size"]
            out = _run(sess, batch)
            n = int(out["num_detections"][0])
            _assert_matches(ref[g], out["boxes"][0, :n], out["scores"][0, :n], out["classes"][0, :n])
            alone.append(out)
        tuned = det.rescore(cache, g, priors[g], "exp", batch_size=4)
        for i, out in enumerate(alone):
            _assert_same(tuned, i, out)
        for i in batch_starts:
            out = _run(sess, prepare_batch(images[i:i + 2], det.preprocessing))
            for j in range(2):
                _assert_same(out, j, alone[i + j])


@pytest.mark.slow
def test_faster_rcnn_matches_torchvision_alone_batched_and_tuned(tiny_dir, tmp_path):
    ref_model = tiny_rcnn(min_size=MIN, max_size=MAX)
    det = detector_from_state(ref_model.state_dict(), Path("faster.pth"), min_size=MIN, max_size=MAX)
    graph = det.export(GraphOptions())
    table = table_file(tmp_path / "t.json")
    images = _images(tiny_dir)
    refs = [_reference(ref_model, img, GAMMAS) for img in images]
    priors = [None if g == 0 else _by_hand_prior(g).numpy() for g in GAMMAS]
    _assert_alone_batched_tuned(det, graph, table, "first", images, refs, priors, batch_starts=(0, 2))


@pytest.mark.slow
def test_mask_rcnn_matches_torchvision(tiny_dir, tmp_path):
    ref_model = tiny_rcnn(masks=True, min_size=MIN, max_size=MAX)
    det = detector_from_state(ref_model.state_dict(), Path("mask.pth"), min_size=MIN, max_size=MAX)
    cal = Calibration(gamma=0.5, table=table_file(tmp_path / "t.json"), background="first").resolve(3)
    sess = _session(insert_norcal(det.export(GraphOptions()), cal))
    for img in _images(tiny_dir)[1:2]:
        ref, = _reference(ref_model, img)
        out = _run(sess, prepare_batch([img], det.preprocessing))
        n = int(out["num_detections"][0])
        _assert_matches(ref, out["boxes"][0, :n], out["scores"][0, :n], out["classes"][0, :n],
                        out["masks"][0, :n])


@pytest.mark.slow
def test_cli_export_records_torchvision_rules(tiny_dir, tmp_path):
    """norcal-export on a state dict at the family's defaults (800 / 1333): the graph records
    the torchvision resize and the background first, its prior puts 0 (-log b) at index 0, and
    ONNX Runtime gives torchvision's detections."""
    import onnx
    from onnx import numpy_helper

    from norcal.cli import export_main
    from norcal.core.contract import input_spec

    ref_model = tiny_rcnn()
    path = tmp_path / "model.pth"
    torch.save(ref_model.state_dict(), path)
    out_path = tmp_path / "model.onnx"
    table = table_file(tmp_path / "t.json")
    assert export_main([str(path), "--gamma", "0.5", "--table", str(table), "-o", str(out_path)]) == 0
    graph = onnx.load(out_path)
    meta = {p.key: p.value for p in graph.metadata_props}
    assert meta["norcal.resize"] == "torchvision" and meta["norcal.classifier_background"] == "first"
    prior = next(numpy_helper.to_array(t) for t in graph.graph.initializer if t.name == "norcal.log_prior")
    np.testing.assert_allclose(prior, _by_hand_prior(0.5).numpy(), rtol=1e-6, atol=1e-7)
    spec = input_spec(meta)
    img = _images(tiny_dir)[3]  # 300 x 300 -> 800 x 800: P6 stride 800 // 13 = 61
    ref, = _reference(ref_model, img)
    out = _run(_session(graph), prepare_batch([img], spec))
    n = int(out["num_detections"][0])
    _assert_matches(ref, out["boxes"][0, :n], out["scores"][0, :n], out["classes"][0, :n])


def _retina_reference(model, img: np.ndarray, gammas) -> list[dict]:
    """torchvision's RetinaNet (forward's steps before the boxes go back to the original image),
    NorCal by hand on its class logits (sigmoid(logit - gamma log N_c), no background) before
    its own postprocess_detections."""
    with torch.no_grad():
        images, _ = model.transform([torch.from_numpy(img).permute(2, 0, 1).float() / 255])
        features = list(model.backbone(images.tensors).values())
        anchors = model.anchor_generator(images, features)
    per_level = [f.shape[-2] * f.shape[-1] for f in features]
    out = []
    for gamma in gammas:
        lp = _by_hand_prior(gamma)[1:]
        hook = model.head.classification_head.register_forward_hook(lambda m, a, o: o - lp)
        try:
            with torch.no_grad():
                head = model.head(features)
        finally:
            hook.remove()
        a = head["cls_logits"].shape[1] // sum(per_level)
        split = [n * a for n in per_level]
        dets = model.postprocess_detections({k: list(v.split(split, dim=1)) for k, v in head.items()},
                                            [list(anc.split(split)) for anc in anchors], images.image_sizes)
        d = {k: v.numpy() for k, v in dets[0].items()}
        d["size"] = tuple(images.image_sizes[0])
        out.append(d)
    return out


@pytest.mark.slow
def test_retinanet_matches_torchvision_alone_batched_and_tuned(tiny_dir, tmp_path):
    ref_model = tiny_retinanet(min_size=MIN, max_size=MAX)
    det = detector_from_state(ref_model.state_dict(), Path("retina.pth"), min_size=MIN, max_size=MAX)
    graph = det.export(GraphOptions())
    table = table_file(tmp_path / "t.json")
    images = _images(tiny_dir)
    refs = [_retina_reference(ref_model, img, GAMMAS) for img in images]
    priors = [None if g == 0 else _by_hand_prior(g).numpy()[1:] for g in GAMMAS]
    _assert_alone_batched_tuned(det, graph, table, "none", images, refs, priors, batch_starts=(1,))
