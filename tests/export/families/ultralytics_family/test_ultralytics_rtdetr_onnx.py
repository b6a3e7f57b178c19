"""Ultralytics' own RT-DETR ONNX export (static and dynamic batch; the older [B, Q, 4 + C]
output too) ingested into our contract: the same detections as RtdetrDetector's export of the
same in-memory model (itself checked against Ultralytics' PyTorch pipeline in
test_ultralytics_rtdetr.py), in ONNX Runtime; anything else refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import assert_tensorrt_compatible
from yolo_models import IMAGES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR, keeps PIL's Image.open
from test_ultralytics_onnx import _meta, _run, _session  # noqa: E402

from norcal.core import contract  # noqa: E402
from norcal.core.boxes import box_iou  # noqa: E402
from norcal.core.errors import NorcalError  # noqa: E402
from norcal.core.calibration.tables import CalibrationTable  # noqa: E402
from norcal.export.families.ultralytics.onnx_common import is_ultralytics  # noqa: E402
from norcal.export.families.ultralytics.onnx_yolo import ingest_ultralytics  # noqa: E402
from norcal.export.families.ultralytics.onnx_rtdetr import find_rtdetr_head  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from norcal.workflows.export_job import NorCal, calibrate_onnx, export_onnx_file  # noqa: E402

S = 160
NAMES = ["cat", "dog", "bus", "kite", "fork"]
COUNTS = [40, 12, 4, 2, 1]
CONF = 0.5  # a score threshold that cuts the top 300


def tiny_yaml(path: Path) -> Path:
    """Ultralytics' rtdetr-l.yaml shrunk (backbone channels, 2 decoder layers of width 64; still
    300 queries) to 5 classes: an export in a second, a 3 MB graph."""
    import ultralytics
    import yaml

    cfg = yaml.safe_load((Path(ultralytics.__file__).parent / "cfg/models/rt-detr/rtdetr-l.yaml").read_text())
    cfg["nc"], cfg["scales"] = len(NAMES), {"t": [0.33, 0.25, 256]}
    bb = cfg["backbone"]
    bb[0][3], bb[1][3], bb[3][3] = [16, 16], [16, 32, 3], [16, 64, 3]
    bb[2][3][0], bb[4][3][0], bb[8][3][0] = 32, 64, 64
    for i in (5, 6, 7):
        bb[i][3][:2] = [32, 64]
    bb[9][3][:2] = [32, 128]
    cfg["head"][1][3] = [256, 8]  # AIFI's feed-forward width, heads
    cfg["head"][-1][3] = ["nc", 64, 300, 4, 8, 2]  # RTDETRDecoder: hidden 64, 300 queries, 4 points, 8 heads, 2 layers
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    """A tiny RT-DETR (rtdetr-l.yaml shrunk, 5 classes, weights redrawn so that scores and boxes
    spread) in memory and Ultralytics' ONNX exports of it: static, dynamic, and the older layout."""
    import torch
    from ultralytics import RTDETR
    from ultralytics.nn.modules.head import RTDETRDecoder

    d = tmp_path_factory.mktemp("rt_onnx")
    torch.manual_seed(0)
    wrapper = RTDETR(str(tiny_yaml(d / "rtdetr-t.yaml")))
    net = wrapper.model
    net.names = dict(enumerate(NAMES))
    head = net.model[-1]
    box_heads = {id(p) for m in (*head.dec_bbox_head, head.enc_bbox_head) for p in m.parameters()}
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # as test_ultralytics_rtdetr.py: Ultralytics' init scores every query alike
        for m in net.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                scale = 0.6 if id(m.weight) in box_heads else 1.5
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (scale / m.weight[0].numel() ** 0.5))
    wrapper.model = net.eval()
    files = {"model": net}
    for dynamic in (False, True):
        f = wrapper.export(format="onnx", imgsz=S, dynamic=dynamic, simplify=False, verbose=False)
        files[dynamic] = Path(f).rename(d / f"rtdetr_dyn{int(dynamic)}.onnx")
    # Ultralytics before its decoder's selection was exported: boxes and sigmoid scores concatenated
    post = RTDETRDecoder.postprocess
    RTDETRDecoder.postprocess = lambda self, boxes, scores: torch.cat([boxes, scores], -1)
    try:
        f = wrapper.export(format="onnx", imgsz=S, dynamic=True, simplify=False, verbose=False)
    finally:
        RTDETRDecoder.postprocess = post
    old = onnx.load(str(Path(f).rename(d / "rtdetr_concat_raw.onnx")))  # Ultralytics writes it in the cwd
    onnx.helper.set_model_props(old, {p.key: p.value for p in old.metadata_props if p.key != "head"})
    onnx.save(old, str(d / "rtdetr_concat.onnx"))
    files["concat"] = d / "rtdetr_concat.onnx"
    files["table"] = d / "table.json"
    CalibrationTable("t", "test", "image", [
        {"id": i + 1, "name": n, "image_count": c, "instance_count": c, "frequency": "f"}
        for i, (n, c) in enumerate(zip(NAMES, COUNTS))]).save(files["table"])
    return files


def _matched(ref, ours, b):
    """Reference detections of image b found in ours (class equal, IoU >= 0.99, score within 1e-4)."""
    n, m = int(ref["num_detections"][b]), int(ours["num_detections"][b])
    ok = (box_iou(ref["boxes"][b, :n], ours["boxes"][b, :m]) >= 0.99) \
        & (ref["classes"][b, :n, None] == ours["classes"][b, None, :m]) \
        & (np.abs(ref["scores"][b, :n, None] - ours["scores"][b, None, :m]) <= 1e-4)
    return int(ok.any(1).sum()), n


@pytest.mark.slow
def test_ingested_rtdetr_equals_our_export(rt, tmp_path):
    from norcal.export.families.ultralytics.rtdetr import RtdetrDetector
    from norcal.runtime.inference import prepare

    # the dynamic export at a score threshold that cuts the top 300 (the others at the default)
    refs = {kind: RtdetrDetector.from_model(rt["model"], imgsz=S, **({"score_thresh": CONF} if kind is True else {}))
            .export() for kind in (False, True)}
    images = [read_rgb(p) for p in IMAGES[:3]]
    for kind in (False, True, "concat"):
        source = onnx.load(str(rt[kind]))
        assert is_ultralytics(source)
        plain, head = ingest_ultralytics(source, str(rt[kind]), score_thresh=CONF if kind is True else None)
        ref_plain = refs[kind is True]
        assert head.layout == ("concat" if kind == "concat" else "topk") and head.queries == 300
        onnx.checker.check_model(plain, full_check=True)
        meta, ref_meta = _meta(plain), _meta(ref_plain)
        for key in (contract.RESIZE, contract.INPUT_SIZE, contract.INPUT_FORMAT, contract.NUM_CLASSES,
                    contract.CLASSIFIER_LOGITS, contract.CLASSIFIER_BACKGROUND):
            assert meta[key] == ref_meta[key], key
        assert meta[contract.RESIZE] == "stretch" and meta[contract.INPUT_FORMAT] == "RGB"
        settings = json.loads(meta[contract.DETECTOR])
        assert settings.pop("names") == NAMES and settings.pop("source") == "ultralytics-onnx"
        assert contract.metadata_class_names(meta) == contract.metadata_class_names(ref_meta) == NAMES
        ref_settings = json.loads(ref_meta[contract.DETECTOR])
        assert ref_settings.pop("names") == NAMES
        assert settings == ref_settings
        batch = prepare(images, contract.input_spec(meta))
        feeds = batch.feeds()
        for gamma in ((0.0, 0.5) if kind is not True else (0.5,)):
            cal = NorCal(gamma=gamma, table=str(rt["table"]))
            ours_graph = calibrate_onnx(plain, cal)
            assert _meta(ours_graph)[contract.LOGITS] == "cls_logits"
            sess = _session(ours_graph)
            if kind is False:  # a static export: batch 1, image by image
                ours = [_run(sess, {k: v[b:b + 1] for k, v in feeds.items()}) for b in range(len(images))]
                ours = {k: np.concatenate([o[k] for o in ours]) for k in ours[0]}
            else:
                ours = _run(sess, feeds)
            ref = _run(_session(calibrate_onnx(ref_plain, cal)), feeds)
            hits = total = 0
            for b in range(len(images)):
                h, n = _matched(ref, ours, b)
                assert n > 0 and abs(int(ours["num_detections"][b]) - n) <= max(1, 0.01 * n)
                hits, total = hits + h, total + n
            assert hits >= 0.99 * total, (kind, gamma, hits, total)
            if kind is True:
                assert 0 < ours["num_detections"].min() and ours["num_detections"].max() < 300
        if kind is True:  # the NorCal graph (gamma 0.5) parses in TensorRT; a batch of two equals each alone
            from norcal.export.trt_check import check_model

            assert not check_model(source).compatible  # Ultralytics' int64 Clips, rewritten by the ingest
            assert_tensorrt_compatible(ours_graph)
            pair = {k: v[:2] for k, v in feeds.items()}
            both = _run(sess, pair)
            for b in range(2):
                alone = _run(sess, {k: v[b:b + 1] for k, v in pair.items()})
                for k in both:
                    np.testing.assert_allclose(both[k][b], alone[k][0], rtol=0, atol=2e-4)
    # the CLI end to end: norcal-export converts it, norcal infer reads the result
    from norcal.cli import export_main, main

    out = tmp_path / "rt.norcal.onnx"
    assert export_main([str(rt[True]), "--gamma", "0.5", "--table", str(rt["table"]), "-o", str(out)]) == 0
    assert main(["infer", str(out), *map(str, IMAGES[:2]), "-o", str(tmp_path / "r.json")]) == 0
    assert (tmp_path / "r.json").read_text().startswith("[{")
    result = export_onnx_file(rt[False], tmp_path / "s.onnx", NorCal(gamma=0.5, table=str(rt["table"])))
    assert "RT-DETR" in result.ingest and result.placement == ["cls_logits"]


def _one_line(fn):
    with pytest.raises(NorcalError) as e:
        fn()
    assert "\n" not in str(e.value)
    return str(e.value)


def _copy(model, meta=None):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if meta is not None:
        onnx.helper.set_model_props(out, meta)
    return out


@pytest.mark.slow
def test_altered_rtdetr_graphs_are_refused(rt):
    source = onnx.load(str(rt[True]))
    meta = _meta(source)
    head = find_rtdetr_head(source)
    # the score Sigmoid removed: the top K reads the logits straight
    cut = _copy(source)
    node = next(n for n in cut.graph.node if n.name == head.sigmoid)
    for n in cut.graph.node:
        n.input[:] = [node.input[0] if x == node.output[0] else x for x in n.input]
    cut.graph.node.remove(node)
    assert "0 Sigmoids ending the graph" in _one_line(lambda: ingest_ultralytics(cut))
    # the boxes' Sigmoid replaced: they are no longer known to be normalised
    raw = _copy(source)
    producer = {o: n for n in raw.graph.node for o in n.output}
    n = producer[head.boxes]
    while n.op_type != "Sigmoid":
        n = producer[n.input[0]]
    n.op_type = "Relu"
    assert "come from Relu, not a Sigmoid" in _one_line(lambda: ingest_ultralytics(raw))
    # half-precision logits: our post-processing is float32
    half = _copy(source)
    sig = next(n for n in half.graph.node if n.name == head.sigmoid)
    half.graph.node.append(onnx.helper.make_node("Cast", [sig.input[0]], ["half_logits"], to=onnx.TensorProto.FLOAT16))
    sig.input[0] = "half_logits"
    assert "'half_logits' is FLOAT16, not FLOAT" in _one_line(lambda: ingest_ultralytics(half))
    # names that do not fit the head's class count
    wrong = _copy(source, {**meta, "names": "{0: 'a', 1: 'b'}"})
    assert "have 5 classes, expected 2" in _one_line(lambda: ingest_ultralytics(wrong))
    # metadata that disagrees with the structure
    yolo = _copy(source, {**meta, "head": "Detect"})
    assert "head 'Detect'" in _one_line(lambda: ingest_ultralytics(yolo))
    seg = _copy(source, {**meta, "task": "segment"})
    assert "task 'segment'" in _one_line(lambda: ingest_ultralytics(seg))


@pytest.mark.slow
def test_ingested_rtdetr_best_class_equals_our_export(rt):
    """Best-class (each query's best class, test_ultralytics_decodings.py checks it against
    Ultralytics' decoder output) taken by the ingest of Ultralytics' ONNX as by our export of the
    same model: the decoding recorded, the same detections at gamma 0.5; agnostic_nms refused."""
    from norcal.core.decoding import Decoding, recorded_decoding
    from norcal.export.families.ultralytics.rtdetr import RtdetrDetector
    from norcal.runtime.inference import prepare

    decoding = Decoding("best-class", conf=0.3)
    plain, _ = ingest_ultralytics(onnx.load(str(rt[True])), str(rt[True]), decoding=decoding)
    assert recorded_decoding(_meta(plain)) == decoding
    ref_plain = RtdetrDetector.from_model(rt["model"], imgsz=S, decoding=decoding).export()
    feeds = prepare([read_rgb(p) for p in IMAGES[:3]], contract.input_spec(_meta(plain))).feeds()
    cal = NorCal(gamma=0.5, table=str(rt["table"]))
    ours, ref = _run(_session(calibrate_onnx(plain, cal)), feeds), _run(_session(calibrate_onnx(ref_plain, cal)), feeds)
    hits = total = 0
    for b in range(3):
        h, n = _matched(ref, ours, b)
        assert n > 0 and int(ours["num_detections"][b]) == n
        assert len(np.unique(ours["boxes"][b, :n], axis=0)) == n  # one label per query
        hits, total = hits + h, total + n
    assert hits >= 0.99 * total, (hits, total)
    with pytest.raises(NorcalError, match="agnostic_nms does not apply"):
        ingest_ultralytics(onnx.load(str(rt[True])), decoding=Decoding("best-class", True))
