"""Ultralytics' own ONNX export (nms False and True, detect and segment; YOLO26's end-to-end
head exported with nms False) ingested into our contract: the same detections as the family's
.pt export of the same model (itself checked against Ultralytics' PyTorch pipeline in
test_ultralytics_yolo.py), in ONNX Runtime."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from yolo_models import BEST_CLASS_CONF, IMAGES, make_checkpoint, write_table  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

from norcal.core import contract  # noqa: E402
from norcal.core.errors import NorcalError  # noqa: E402
from norcal.export.families import load_detector  # noqa: E402
from norcal.export.families.ultralytics.onnx_common import is_ultralytics  # noqa: E402
from norcal.export.families.ultralytics.onnx_yolo import find_head, ingest_ultralytics, summary  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from norcal.workflows.export_job import NorCal, calibrate_onnx, export_onnx_file  # noqa: E402

S = 128
KINDS = {"det": "yolo11n.yaml", "seg": "yolo11n-seg.yaml"}


@pytest.fixture(scope="session")
def ul(tmp_path_factory):
    """Per kind: our checkpoint and Ultralytics' ONNX exports of it (nms False, True)."""
    from ultralytics import YOLO

    d = tmp_path_factory.mktemp("ul_onnx")
    table, _ = write_table(d / "table.json")
    files = {"table": table}
    for kind, yaml in KINDS.items():
        pt = make_checkpoint(d / f"{kind}.pt", yaml)
        files[kind] = pt
        for nms in (False, True):
            model = YOLO(str(pt))
            model.model.task = model.task = "segment" if kind == "seg" else "detect"  # model.save drops it
            f = model.export(format="onnx", dynamic=True, simplify=False, imgsz=S, nms=nms, verbose=False)
            files[kind, nms] = Path(f).rename(d / f"{kind}_nms{int(nms)}.onnx")
    return files


def _session(graph):
    import onnxruntime as ort

    return ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(sess, feeds):
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _meta(graph):
    return {p.key: p.value for p in graph.metadata_props}


def _iou(a, b):
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area = lambda z: np.prod(z[:, 2:] - z[:, :2], -1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None] - inter)


def _matched(ref, ours, b):
    """For image b, the index in ours of each reference detection (class equal, IoU >= 0.99,
    score within 1e-4; -1 when none): as sets, near-ties may swap slots between graphs."""
    n, m = int(ref["num_detections"][b]), int(ours["num_detections"][b])
    ok = (_iou(ref["boxes"][b, :n], ours["boxes"][b, :m]) >= 0.99) \
        & (ref["classes"][b, :n, None] == ours["classes"][b, None, :m]) \
        & (np.abs(ref["scores"][b, :n, None] - ours["scores"][b, None, :m]) <= 1e-4)
    return np.where(ok.any(1), ok.argmax(1), -1)


@pytest.mark.slow
@pytest.mark.parametrize("nms", [False, True], ids=["plain", "nms"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_ingested_equals_the_pt_export(ul, kind, nms):
    from norcal.runtime.inference import prepare

    source = onnx.load(str(ul[kind, nms]))
    assert is_ultralytics(source)
    plain, head = ingest_ultralytics(source)
    assert head.nms == nms and head.xyxy == nms and (head.coefs is not None) == (kind == "seg")
    # Ultralytics' NMS is gone: the one NonMaxSuppression left is ours
    assert [n.name.startswith("norcal_post/") for n in plain.graph.node if n.op_type == "NonMaxSuppression"] == [True]
    onnx.checker.check_model(plain, full_check=True)
    pt = load_detector(ul[kind]).export(SimpleNamespace(height=S, width=S))
    pt_meta = _meta(pt)
    for key in (contract.RESIZE, contract.INPUT_SIZE, contract.PAD_VALUE, contract.INPUT_FORMAT, contract.NUM_CLASSES,
                contract.CLASSIFIER_LOGITS, contract.CLASSIFIER_BACKGROUND, contract.MASK_HEAD_ROIS,
                contract.CLASS_NAMES):
        assert _meta(plain).get(key) == pt_meta.get(key), key
    # the names Ultralytics' exporter wrote (yolo_models names the classes class0, class1, ...)
    assert contract.metadata_class_names(_meta(plain)) == [f"class{i}" for i in range(len(head.names))]
    images = [read_rgb(p) for p in IMAGES]
    assert len(images) >= 4
    feeds = prepare(images, contract.input_spec(_meta(plain))).feeds()
    for gamma in (0.0, 0.5):
        cal = NorCal(gamma=gamma, table=str(ul["table"]))
        ours_graph = calibrate_onnx(plain, cal)
        meta = _meta(ours_graph)
        assert meta[contract.LOGITS] == "cls_logits" and meta[contract.ACTIVATION] == "sigmoid"
        assert contract.CLASS_AXIS not in meta and float(meta[contract.GAMMA]) == gamma
        ours = _run(_session(ours_graph), feeds)
        ref = _run(_session(calibrate_onnx(pt, cal)), feeds)
        _assert_same_detections(ref, ours, len(images), kind == "seg", gamma)


def _assert_same_detections(ref, ours, images: int, seg: bool, gamma: float) -> None:
    """>= 99% of ``ref``'s detections in ``ours`` (as sets), counts within 1%, masks alike."""
    assert sorted(ours) == sorted(ref)
    total = matched = 0
    for b in range(images):
        idx = _matched(ref, ours, b)
        n = int(ours["num_detections"][b])  # a candidate at the threshold or an IoU tie may flip
        assert len(idx) > 0 and abs(n - len(idx)) <= max(1, 0.01 * len(idx))
        total += len(idx)
        matched += int((idx >= 0).sum())
        if seg:  # Ultralytics' export folds BatchNorm into the convs: float32 sums in
            # another order; the random-init prototypes are large (~500), so compare the logit
            # maps (coefficients . prototypes) as the host uses them (their sign) and on average
            hit = np.nonzero(idx >= 0)[0]
            a, o = (out["masks"][b, rows] @ out["mask_protos"][b].reshape(len(out["mask_protos"][b]), -1)
                    for out, rows in ((ref, hit), (ours, idx[hit])))
            assert np.abs(a - o).mean() < 1e-3 and ((a > 0) == (o > 0)).mean() > 0.999
    assert matched / total >= 0.99, (gamma, matched, total)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["y26e2e", "y26e2e_seg"])
def test_end_to_end_export_ingested_equals_the_pt_export(yolo_work, tmp_path, kind):
    """YOLO26 with its end-to-end head selected, exported by Ultralytics with nms=False (how it
    exports that head: metadata end2end True, its own top-k in the graph) at S (336 anchors, more
    than the 300 slots): Ultralytics' top-k is dropped, ours appended after the one-to-one
    branch's logits, the same detections as the .pt export at gamma 0.5."""
    from ultralytics import YOLO

    from norcal.runtime.inference import prepare

    seg = kind == "y26e2e_seg"
    model = YOLO(str(getattr(yolo_work, kind)))
    model.model.task = model.task = "segment" if seg else "detect"  # model.save drops it
    f = Path(model.export(format="onnx", dynamic=True, simplify=False, imgsz=S, nms=False, verbose=False))
    source = onnx.load(str(f.rename(tmp_path / "e2e.onnx")))
    assert _meta(source)["end2end"] == "True" and any(n.op_type == "TopK" for n in source.graph.node)
    plain, head = ingest_ultralytics(source)
    assert head.end2end and head.xyxy and not head.nms and (head.coefs is not None) == seg
    assert not [n for n in plain.graph.node if n.op_type == "NonMaxSuppression"]
    assert all(n.name.startswith("norcal_post/") for n in plain.graph.node if n.op_type == "TopK")
    assert json.loads(_meta(plain)[contract.DETECTOR])["selection"] == "one-to-one top-k"
    assert "end-to-end" in summary(head)
    onnx.checker.check_model(plain, full_check=True)
    pt = load_detector(getattr(yolo_work, kind)).export(SimpleNamespace(height=S, width=S))
    images = [read_rgb(p) for p in IMAGES]
    feeds = prepare(images, contract.input_spec(_meta(plain))).feeds()
    cal = NorCal(gamma=0.5, table=str(yolo_work.table))
    ours = _run(_session(calibrate_onnx(plain, cal)), feeds)
    ref = _run(_session(calibrate_onnx(pt, cal)), feeds)
    assert ours["scores"].shape == (len(images), 300)
    _assert_same_detections(ref, ours, len(images), seg, 0.5)
    with pytest.raises(NorcalError, match="nms_thresh does not apply"):
        ingest_ultralytics(source, nms_thresh=0.5)
    from norcal.core.decoding import Decoding

    with pytest.raises(NorcalError, match="end-to-end Ultralytics head .* best-class decoding does not apply") as e:
        ingest_ultralytics(source, decoding=Decoding("best-class"))
    assert e.value.param == "decoding"
    with pytest.raises(NorcalError, match="NMS of Ultralytics' own ONNX export stays in the graph") as e:
        ingest_ultralytics(source, decoding=Decoding(nms="host"))  # its NMS is Ultralytics', not ours
    assert e.value.param == "nms"


@pytest.mark.slow
def test_fixed_batch_export_ingested_equals_the_pt_export(yolo_work, tmp_path):
    """Ultralytics' export with a fixed batch (batch=2): its reshapes hold that batch, so shape
    inference at batch 1 found nothing and the head's tensors were refused as of unknown shape."""
    from ultralytics import YOLO

    from norcal.runtime.inference import prepare

    model = YOLO(str(yolo_work.det))
    f = Path(model.export(format="onnx", batch=2, simplify=False, imgsz=S, nms=False, verbose=False))
    source = onnx.load(str(f.rename(tmp_path / "b2.onnx")))
    assert [d.dim_value for d in source.graph.input[0].type.tensor_type.shape.dim] == [2, 3, S, S]
    plain, _ = ingest_ultralytics(source)
    assert [d.dim_value for d in plain.graph.input[0].type.tensor_type.shape.dim][0] == 2
    pt = load_detector(yolo_work.det).export(SimpleNamespace(height=S, width=S))
    images = [read_rgb(p) for p in IMAGES[:2]]
    feeds = prepare(images, contract.input_spec(_meta(plain))).feeds()
    cal = NorCal(gamma=0.5, table=str(yolo_work.table))
    _assert_same_detections(_run(_session(calibrate_onnx(pt, cal)), feeds),
                            _run(_session(calibrate_onnx(plain, cal)), feeds), len(images), False, 0.5)


@pytest.mark.slow
@pytest.mark.parametrize("agnostic", [False, True], ids=["class-wise", "agnostic"])
def test_best_class_ingest_matches_ultralytics_predictor_nms(ul, agnostic):
    """Ultralytics' ONNX (nms False) ingested with the best-class decoding, against its predictor's
    ``non_max_suppression(multi_label=False)`` (class-wise or agnostic) on the same graph's raw head
    outputs for the same letterboxed input: its boxes (x, y, w, h) and its class logits with NorCal
    by hand (sigmoid(logit - gamma log N_c)), gamma 0 and 0.5; the decoding recorded."""
    import torch
    from ultralytics.utils.nms import non_max_suppression

    from norcal.core.decoding import Decoding, recorded_decoding
    from norcal.runtime.inference import prepare
    from norcal.workflows.parity.matching import match_detections

    decoding = Decoding("best-class", agnostic, BEST_CLASS_CONF)
    source = onnx.load(str(ul["det", False]))
    head = find_head(source)
    plain, _ = ingest_ultralytics(source, decoding=decoding)
    assert recorded_decoding(_meta(plain)) == decoding
    assert json.loads(_meta(plain)[contract.DETECTOR])["multi_label"] is False
    raw = onnx.ModelProto()
    raw.CopyFrom(source)  # Ultralytics' graph, its head's boxes and class logits as outputs too
    raw.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                            for t in (head.boxes, head.logits))
    images = [read_rgb(p) for p in IMAGES]
    batch = prepare(images, contract.input_spec(_meta(plain)))
    feeds = batch.feeds()
    boxes, logits = _session(raw).run([head.boxes, head.logits], {source.graph.input[0].name: feeds["images"] / 255.0})
    h, w = batch.image_sizes[:, 0], batch.image_sizes[:, 1]
    pads = np.stack([(S - w) // 2, (S - h) // 2] * 2, 1).astype(np.float32)  # the letterbox's offsets
    counts = np.array([c["image_count"] for c in json.loads(Path(ul["table"]).read_text())["categories"]], np.float64)
    for gamma in (0.0, 0.5):
        ours = _run(_session(calibrate_onnx(plain, NorCal(gamma=gamma, table=str(ul["table"])))), feeds)
        probs = 1.0 / (1.0 + np.exp(-(logits.astype(np.float64) - gamma * np.log(counts)[None, :, None])))
        pred = torch.from_numpy(np.concatenate([boxes, probs.astype(np.float32)], 1))
        refs = non_max_suppression(pred, conf_thres=BEST_CLASS_CONF, iou_thres=0.7, multi_label=False,
                                   agnostic=agnostic, max_det=300, nc=len(counts))
        total = matched = 0
        for b, ref in enumerate(d.numpy() for d in refs):
            n = int(ours["num_detections"][b])
            assert n == len(ref) > 0
            ri, _, _ = match_detections(ref[:, :4], ref[:, 4], ref[:, 5].astype(int), ours["boxes"][b, :n] + pads[b],
                                        ours["scores"][b, :n], ours["classes"][b, :n], 0.99, max_score_diff=1e-4)
            total, matched = total + len(ref), matched + len(ri)
        assert matched / total >= 0.99, (gamma, matched, total)


@pytest.mark.slow
def test_export_onnx_file_ingests_unless_logits_given(ul, tmp_path):
    from norcal.cli import export_main, main

    out = tmp_path / "seg.norcal.onnx"
    result = export_onnx_file(ul["seg", True], out, NorCal(gamma=0.5, table=str(ul["table"])))
    assert "converted to our outputs" in result.ingest and "NMS dropped" in result.ingest
    assert [o.name for o in result.model.graph.output] == [*contract.OUTPUT_NAMES, contract.MASK_PROTOS]
    assert result.placement == ["cls_logits"]
    # named logits: the node goes there in place, on the class axis 1; Ultralytics' outputs stay
    logits = find_head(onnx.load(str(ul["det", False]))).logits
    kept = export_onnx_file(ul["det", False], tmp_path / "kept.onnx",
                            NorCal(gamma=0.5, table=str(ul["table"]), logits=logits, background="none"))
    assert "kept as it is" in kept.ingest and [o.name for o in kept.model.graph.output] == ["output0"]
    assert _meta(kept.model)[contract.CLASS_AXIS] == "1"
    from norcal.core.decoding import Decoding, recorded_decoding

    with pytest.raises(NorcalError, match="kept as it is, with its own post-processing") as e:  # nothing converted
        export_onnx_file(ul["det", False], tmp_path / "no.onnx", NorCal(gamma=0.5, table=str(ul["table"]),
                                                                      logits=logits, background="none"),
                         decoding=Decoding("best-class"))
    assert e.value.param == "decoding" and not (tmp_path / "no.onnx").exists()
    # the CLI end to end: export (its decoding flags reach the converted graph), then infer reads it
    cli_out = tmp_path / "det.norcal.onnx"
    assert export_main([str(ul["det", True]), "--gamma", "0.5", "--table", str(ul["table"]), "-o", str(cli_out),
                        "--decoding", "best-class", "--agnostic-nms", "--conf", "0.25"]) == 0
    assert recorded_decoding(_meta(onnx.load(str(cli_out)))) == Decoding("best-class", True, 0.25)
    assert main(["infer", str(cli_out), *map(str, IMAGES), "-o", str(tmp_path / "r.json")]) == 0
    assert (tmp_path / "r.json").read_text().startswith("[{")


@pytest.mark.slow
def test_other_graphs_are_not_ingested(ul, tmp_path):
    plain = load_detector(ul["det"]).export(SimpleNamespace(height=S, width=S))  # ours: not Ultralytics'
    assert not is_ultralytics(plain)
    src = tmp_path / "ours.onnx"
    onnx.save(plain, str(src))
    cal = NorCal(gamma=0.5, table=str(ul["table"]))
    result = export_onnx_file(src, tmp_path / "out.onnx", cal)
    assert result.ingest == ""
    assert result.model.graph == calibrate_onnx(plain, cal).graph
    from norcal.core.decoding import Decoding

    with pytest.raises(NorcalError, match="ours.onnx: a decoding applies to graphs converted to our outputs") as e:
        export_onnx_file(src, tmp_path / "no.onnx", cal, decoding=Decoding("best-class"))
    assert e.value.param == "decoding" and not (tmp_path / "no.onnx").exists()
    with pytest.raises(NorcalError, match="strip=True removes NorCal; it takes no decoding"):
        export_onnx_file(ul["det", False], tmp_path / "no.onnx", strip=True, decoding=Decoding("best-class"))
    assert not (tmp_path / "no.onnx").exists()


def _one_line(fn):
    with pytest.raises(NorcalError) as e:
        fn()
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.slow
def test_altered_ultralytics_graphs_are_refused(ul, tmp_path):
    source = onnx.load(str(ul["seg", False]))
    # the head's Sigmoid removed: its Concat reads the logits straight
    cut = onnx.ModelProto()
    cut.CopyFrom(source)
    sig = find_head(source).sigmoid
    node = next(n for n in cut.graph.node if n.name == sig)
    for n in cut.graph.node:
        n.input[:] = [node.input[0] if x == node.output[0] else x for x in n.input]
    cut.graph.node.remove(node)
    src = tmp_path / "no_sigmoid.onnx"
    onnx.save(cut, str(src))
    msg = _one_line(lambda: export_onnx_file(src, tmp_path / "o.onnx", NorCal(gamma=0.5, table=str(ul["table"]))))
    assert "0 Sigmoid outputs" in msg and str(src) in msg
    # names that do not fit the head's class count
    wrong = onnx.ModelProto()
    wrong.CopyFrom(source)
    onnx.helper.set_model_props(wrong, {**_meta(source), "names": "{0: 'a', 1: 'b'}"})
    assert "have 6 channels, expected 2" in _one_line(lambda: ingest_ultralytics(wrong))
    # a segment graph whose prototypes output is gone
    noproto = onnx.ModelProto()
    noproto.CopyFrom(source)
    del noproto.graph.output[1:]
    assert "0 prototype outputs" in _one_line(lambda: ingest_ultralytics(noproto))
    # a task we do not convert
    pose = onnx.ModelProto()
    pose.CopyFrom(source)
    onnx.helper.set_model_props(pose, {**_meta(source), "task": "pose"})
    assert "pose" in _one_line(lambda: ingest_ultralytics(pose))
    # RT-DETR's head in the metadata of a YOLO graph: the structure is not RT-DETR's
    det = onnx.load(str(ul["det", False]))
    onnx.helper.set_model_props(det, {**_meta(det), "head": "RTDETRDecoder"})
    assert "0 Sigmoids ending the graph as RT-DETR's" in _one_line(lambda: ingest_ultralytics(det))
    assert os.environ.get("YOLO_OFFLINE") == "1"
