"""nms="host": the YOLO graph ends at the calibrated candidates and norcal.runtime.host_nms selects
them on the host. The reference is the same model's in-graph NMS run by ONNX Runtime (its
NonMaxSuppression and TopK), and ONNX Runtime's NonMaxSuppression on crafted rows: kept boxes,
order, scores, classes and masks must be equal, bit for bit, alone and batched."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from yolo_models import BEST_CLASS_CONF as CONF, IMAGES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

from norcal.cli import main  # noqa: E402
from norcal.core import contract  # noqa: E402
from norcal.core.decoding import Decoding, recorded_decoding  # noqa: E402
from norcal.core.errors import NorcalError  # noqa: E402
from norcal.export.families import load_detector  # noqa: E402
from norcal.runtime.host_nms import HostNmsRunner, HostSelection, nms_row, select  # noqa: E402
from norcal.runtime.images import read_rgb  # noqa: E402
from norcal.runtime.inference import prepare  # noqa: E402

DECODINGS = {"multi-label": Decoding(), "best-class": Decoding("best-class", False, CONF),
             "best-class agnostic": Decoding("best-class", True, CONF)}


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(sess, feeds):
    names = [i.name for i in sess.get_inputs()]
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {n: feeds[n] for n in names})))


def _calibrated(yolo_work, kind, decoding):
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    _, plain = yolo_work.plain(kind, decoding)
    return calibrate_onnx(plain, NorCal(gamma=0.5, table=str(yolo_work.table)))


@pytest.mark.parametrize("kind", ["det", "seg"])
@pytest.mark.parametrize("rule", list(DECODINGS))
def test_host_nms_equals_the_in_graph_nms_alone_and_batched(yolo_work, kind, rule):
    graph_nms = DECODINGS[rule]
    host_nms = Decoding(graph_nms.labels, graph_nms.agnostic_nms, graph_nms.conf, "host")
    in_graph, host = (_session(_calibrated(yolo_work, kind, d)) for d in (graph_nms, host_nms))
    meta = host.get_modelmeta().custom_metadata_map
    recorded = recorded_decoding(meta)
    assert (recorded.labels, recorded.agnostic_nms, recorded.nms) == (host_nms.labels, host_nms.agnostic_nms, "host")
    assert [o.name for o in host.get_outputs()][:2] == [contract.CANDIDATE_BOXES, contract.CANDIDATE_SCORES]
    assert not {n.op_type for n in _calibrated(yolo_work, kind, host_nms).graph.node} & {"NonMaxSuppression", "TopK"}
    selection = HostSelection.from_metadata(meta)
    spec = contract.input_spec(meta)
    images = [read_rgb(p) for p in IMAGES]
    keys = ["num_detections", "boxes", "scores", "classes"] + (["masks", contract.MASK_PROTOS] if kind == "seg" else [])
    for batch in ([images], [[im] for im in images]):  # one batch of all, then each image alone
        for part in batch:
            feeds = prepare(part, spec).feeds()
            ref = _run(in_graph, feeds)
            ours = select(_run(host, feeds), feeds["image_sizes"], feeds["images"].shape[2:], selection)
            assert ref["num_detections"].sum() > 0
            for k in keys:
                assert ours[k].dtype == ref[k].dtype and np.array_equal(ours[k], ref[k]), (rule, k)


def _ort_nms(boxes, scores, limit, iou, thresh):
    """ONNX Runtime's NonMaxSuppression of one row: the selected box indices, in its order."""
    g = h.make_graph(
        [h.make_node("NonMaxSuppression", ["b", "s", "k", "i", "t"], ["sel"])], "nms",
        [h.make_tensor_value_info("b", T.FLOAT, [1, None, 4]), h.make_tensor_value_info("s", T.FLOAT, [1, 1, None])],
        [h.make_tensor_value_info("sel", T.INT64, [None, 3])],
        [h.make_tensor("k", T.INT64, [1], [limit]), h.make_tensor("i", T.FLOAT, [1], [iou]),
         h.make_tensor("t", T.FLOAT, [1], [thresh])])
    sess = _session(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    return sess.run(None, {"b": boxes[None].astype(np.float32), "s": scores[None, None].astype(np.float32)})[0][:, 2]


def test_nms_row_is_onnx_runtimes_on_ties_edges_and_limits():
    """Equal scores (the lower index first), an IoU exactly at the threshold (kept: suppression
    is IoU > threshold), a score exactly at the threshold (not a candidate), boxes of no area
    (they suppress nothing), corners given in either order, and the per-row limit."""
    boxes = np.array([[0, 0, 2, 1], [1, 0, 3, 1],  # IoU 1/3 with each other
                      [10, 10, 12, 12], [10, 10, 12, 12], [12, 12, 10, 10],  # one box three times
                      [5, 5, 5, 9], [5, 5, 5, 9],  # no area
                      [20, 20, 21, 21]], dtype=np.float32)
    scores = np.array([0.5, 0.5, 0.7, 0.7, 0.7, 0.9, 0.9, 0.2], dtype=np.float32)
    third = float(np.float32(1) / np.float32(3))
    for limit, iou, thresh in ((10, third, 0.1), (10, 0.3, 0.1), (2, third, 0.1), (10, third, 0.2), (10, 0.0, 0.0)):
        ref = _ort_nms(boxes, scores, limit, iou, thresh)
        assert nms_row(boxes, scores, thresh, iou, limit).tolist() == ref.tolist(), (limit, iou, thresh)
    # what those rows pin: at IoU == threshold both are kept; just above it the later one goes
    assert nms_row(boxes, scores, 0.1, third, 10).tolist() == [5, 6, 2, 0, 1, 7]
    assert nms_row(boxes, scores, 0.1, 0.3, 10).tolist() == [5, 6, 2, 0, 7]


def test_nms_row_is_onnx_runtimes_on_random_rows_with_many_ties():
    rng = np.random.default_rng(0)
    for trial in range(40):
        n = int(rng.integers(1, 120))
        xy = rng.integers(0, 30, size=(n, 2)).astype(np.float32)
        wh = rng.integers(0, 12, size=(n, 2)).astype(np.float32)  # some of no width or height
        boxes = np.concatenate([xy, xy + wh], axis=1)
        scores = (rng.integers(0, 8, size=n) / 8).astype(np.float32)  # many equal scores
        iou = float(rng.choice([0.0, 0.25, 0.5, 0.7, 1.0]))
        limit = int(rng.integers(1, 40))
        assert nms_row(boxes, scores, 0.125, iou, limit).tolist() == _ort_nms(boxes, scores, limit, iou, 0.125).tolist()


def test_cli_host_nms_export_runs_to_the_same_results_file_and_builds_for_rtx(yolo_work, tmp_path, capsys):
    """norcal export --nms host: norcal infer writes the very results file of the in-graph NMS
    export (the runner chosen by the metadata), and norcal build --target rtx writes an engine
    with NVIDIA's TensorRT for RTX builder (det and seg), which refuses the in-graph NMS export."""
    out = {}
    for nms in ("graph", "host"):
        model = tmp_path / f"{nms}.onnx"
        assert main(["export", str(yolo_work.det), "--gamma", "0.5", "--table", str(yolo_work.table),
                     "--nms", nms, "-o", str(model)]) == 0
        assert main(["infer", str(model), *map(str, IMAGES), "--batch", "3", "-o", str(tmp_path / f"{nms}.json")]) == 0
        out[nms] = json.loads((tmp_path / f"{nms}.json").read_text())
    assert out["host"] == out["graph"] and len(out["host"]) > 0
    capsys.readouterr()
    engine = tmp_path / "host.engine"
    assert main(["build", str(tmp_path / "host.onnx"), "--target", "rtx", "-o", str(engine)]) == 0
    assert engine.stat().st_size > 0 and json.loads((tmp_path / "host.engine.json").read_text())["library"] == \
        "TensorRT for RTX"
    capsys.readouterr()
    assert main(["build", str(tmp_path / "graph.onnx"), "--target", "rtx", "-o", str(tmp_path / "g.engine")]) == 2
    assert "NonMaxSuppression" in capsys.readouterr().err and not (tmp_path / "g.engine").exists()
    seg = tmp_path / "seg.onnx"  # a segment model's candidates (coefficients and prototypes too) build as well
    assert main(["export", str(yolo_work.seg), "--gamma", "0.5", "--table", str(yolo_work.table),
                 "--nms", "host", "-o", str(seg)]) == 0
    assert main(["build", str(seg), "--target", "rtx", "-o", str(tmp_path / "seg.engine")]) == 0
    assert (tmp_path / "seg.engine").stat().st_size > 0


def _retinanet_exports(name, folder):
    """(in-graph NMS, host NMS) exports of a RetinaNet checkpoint: detectron2's tiny fixture or
    torchvision's tiny model, calibrated at gamma 0.5."""
    import torch

    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    if name == "detectron2":
        from golden import manifest_table

        from conftest import FIXTURES

        src = FIXTURES / "d2_retinanet_tiny"
        ckpt, config, table = src / "model_final.pth", src / "config.yaml", manifest_table(src)
    else:
        from torchvision_models import table_file, tiny_retinanet

        ckpt, config, table = folder / "tv.pth", None, str(table_file(folder / "tv_table.json"))
        torch.save(tiny_retinanet().state_dict(), ckpt)
    out = []
    for decoding in (None, Decoding(nms="host")):
        path = folder / f"{name}_{'host' if decoding else 'graph'}.onnx"
        export_checkpoint(ckpt, path, NorCal(gamma=0.5, table=table),
                          CheckpointExport(config=config if config and config.is_file() else None, decoding=decoding))
        out.append(path)
    return out


@pytest.fixture(scope="module")
def retinanets(tmp_path_factory):
    """{family: (in-graph NMS export, host NMS export)}, each exported once for the module."""
    made = {}

    def exports(family):
        if family not in made:
            made[family] = _retinanet_exports(family, tmp_path_factory.mktemp(family))
        return made[family]
    return exports


@pytest.mark.parametrize("family", ["detectron2", "torchvision"])
def test_retinanet_host_nms_equals_the_in_graph_nms_alone_and_batched(family, retinanets):
    from norcal.core.files.onnx_io import load_onnx

    graph_path, host_path = retinanets(family)
    in_graph, host = _session(load_onnx(graph_path)), _session(load_onnx(host_path))
    meta = host.get_modelmeta().custom_metadata_map
    assert recorded_decoding(meta).host_nms and "NonMaxSuppression" not in {
        n.op_type for n in load_onnx(host_path).graph.node}
    selection = HostSelection.from_metadata(meta)
    assert not selection.letterbox
    spec = contract.input_spec(meta)
    images = [read_rgb(p) for p in IMAGES]
    for batch in ([images], [[im] for im in images]):
        for part in batch:
            feeds = prepare(part, spec).feeds()
            ref = _run(in_graph, feeds)
            ours = select(_run(host, feeds), feeds["image_sizes"], feeds["images"].shape[2:], selection)
            assert ref["num_detections"].sum() > 0
            for k in ("num_detections", "boxes", "scores", "classes"):
                assert ours[k].dtype == ref[k].dtype and np.array_equal(ours[k], ref[k]), (family, k)


def test_retinanet_host_nms_builds_for_rtx(retinanets, tmp_path, capsys):
    """NVIDIA's TensorRT for RTX builder takes the detectron2 RetinaNet's candidates graph (the
    in-graph NMS export it refuses, naming NonMaxSuppression)."""
    graph_path, host_path = retinanets("detectron2")
    assert main(["build", str(host_path), "--target", "rtx", "-o", str(tmp_path / "r.engine")]) == 0
    assert (tmp_path / "r.engine").stat().st_size > 0
    capsys.readouterr()
    assert main(["build", str(graph_path), "--target", "rtx", "-o", str(tmp_path / "g.engine")]) == 2
    assert "NonMaxSuppression" in capsys.readouterr().err


def test_host_nms_is_refused_where_no_nms_of_ours_is_in_the_graph(yolo_work):
    with pytest.raises(NorcalError, match="end-to-end YOLO head .* has no NMS to leave to the host") as e:
        load_detector(yolo_work.y26e2e, decoding=Decoding(nms="host"))
    assert e.value.param == "nms"
    with pytest.raises(NorcalError, match="an RT-DETR has no NMS to leave to the host") as e:
        load_detector(yolo_work.rtdetr, decoding=Decoding(nms="host"))
    with pytest.raises(NorcalError, match="nms must be graph or host, got 'gpu'"):
        Decoding(nms="gpu")


def test_an_rcnn_refuses_nms_host_in_one_line(tmp_path, capsys):
    """An R-CNN's NMS (the RPN's, before RoiAlign) stays in the graph: refused before the export
    writes anything; another decoding still refused for the families that take none."""
    from family_cases import D2_TINY

    out = tmp_path / "m.onnx"
    assert main(["export", str(D2_TINY / "model_final.pth"), "--config", str(D2_TINY / "config.yaml"),
                 "--gamma", "0", "--nms", "host", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "an R-CNN's NMS (the RPN's, before RoiAlign and the box head) stays in the graph" in err
    assert not out.exists()
    assert main(["export", str(D2_TINY / "model_final.pth"), "--config", str(D2_TINY / "config.yaml"),
                 "--gamma", "0", "--nms", "host", "--decoding", "best-class", "-o", str(out)]) == 2
    assert "decode as their own post-processing" in capsys.readouterr().err and not out.exists()


def test_a_host_nms_model_without_its_thresholds_is_refused_in_one_line():
    class Inner:
        metadata = {contract.DETECTOR: json.dumps({"nms": "host", "score_thresh_test": 0.1})}
        output_names = [contract.CANDIDATE_BOXES, contract.CANDIDATE_SCORES]

    with pytest.raises(NorcalError, match="must record score_thresh_test, nms_thresh_test and detections_per_image"):
        HostNmsRunner(Inner())
