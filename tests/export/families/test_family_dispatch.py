"""The registry's dispatch of ONNX graphs (Ultralytics' own exports to the Ultralytics family, any
other graph to the foreign family, last) and the classifier keys each family's export records:
exactly what its Detector's classifier declares, on the tensors its activation reads."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from conftest import FIXTURES
from norcal.core import contract
from norcal.core.calibration.spec import Calibration
from norcal.core.errors import NorcalError
from norcal.export.families import FAMILIES, family_of, graph_family


def _plain_graph(meta: dict[str, str] | None = None) -> onnx.ModelProto:
    """A one-layer classifier (Gemm then Softmax), with ``meta`` as its metadata."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], [0.1] * 12)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["logits"]),
                           helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)], "plain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 3])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, meta or {})
    return model


def test_any_other_graph_goes_to_the_foreign_family_unchanged():
    model = _plain_graph({"author": "someone else"})
    family = graph_family(model)
    assert family.name == "foreign" and FAMILIES[-1] is family
    out, line = family.ingest_graph(model, Path("plain.onnx"), Calibration(gamma=0.5))
    assert out is model and line == ""


def test_the_foreign_family_claims_no_checkpoint(tmp_path):
    path = tmp_path / "notes.pth"
    path.write_text("not a checkpoint")
    foreign = next(f for f in FAMILIES if f.name == "foreign")
    assert not foreign.claims(path, None)
    with pytest.raises(NorcalError) as e:  # the refusal names the checkpoint families only
        family_of(tmp_path / "notes.onnx")
    assert str(e.value).endswith("(ultralytics, torchvision, detectron2)")


def test_an_ultralytics_graph_goes_to_the_ultralytics_family():
    model = _plain_graph({"author": "Ultralytics", "task": "detect"})
    family = graph_family(model)
    assert family.name == "ultralytics"
    out, line = family.ingest_graph(model, Path("best.onnx"), Calibration(gamma=0.5, logits="logits"))
    assert out is model  # the named logits: kept as it is
    assert line.startswith("Ultralytics ONNX kept as it is (logits 'logits' given)")
    with pytest.raises(NorcalError) as e:  # not Ultralytics' structure: refused in one line naming the file
        family.ingest_graph(model, Path("best.onnx"), Calibration(gamma=0.5))
    assert "\n" not in str(e.value) and "best.onnx" in str(e.value)


def _recorded(graph: onnx.ModelProto) -> tuple[list[str], str | None]:
    meta = {p.key: p.value for p in graph.metadata_props}
    return contract.recorded_logits(meta), contract.recorded_background(meta)


def _check_classifier(det, graph: onnx.ModelProto) -> None:
    """The graph records the detector's classifier, and each recorded logits tensor is read by
    the activation the classifier names (where NorCal goes)."""
    cls = det.classifier
    assert _recorded(graph) == (list(cls.logits), cls.background)
    op = {"softmax": "Softmax", "sigmoid": "Sigmoid"}[cls.activation]
    for name in cls.logits:
        assert op in [n.op_type for n in graph.graph.node if name in n.input], name


@pytest.mark.parametrize("name", ["d2_lvis_tiny", "d2_cascade_tiny", "d2_retinanet_tiny"])
def test_detectron2_exports_record_their_classifier(name):
    from norcal.export.families import load_detector

    det = load_detector(FIXTURES / name / "model_final.pth", FIXTURES / name / "config.yaml")
    assert det.family == "detectron2" and det.calibration_source == "TEST.CALIBRATION"
    _check_classifier(det, det.export())


@pytest.mark.parametrize("kind", ["rcnn", "retinanet"])
def test_torchvision_exports_record_their_classifier(kind):
    from norcal.export.families.torchvision.detector import detector_from_state
    from norcal.export.rcnn.detector import GraphOptions
    from torchvision_models import tiny_rcnn, tiny_retinanet

    model = tiny_rcnn() if kind == "rcnn" else tiny_retinanet()
    det = detector_from_state(model.state_dict(), Path(f"{kind}.pth"), min_size=224, max_size=352)
    assert det.classifier.background == ("first" if kind == "rcnn" else "none")
    # the shared R-CNN's detectors carry the name of the family that read the weights
    assert det.family == "torchvision" and det.calibration_source is None and det.recorded_calibration() is None
    _check_classifier(det, det.export(GraphOptions()))


def test_a_yolo_export_records_its_classifier(tmp_path):
    from yolo_models import make_checkpoint

    from norcal.export.families import load_detector

    det = load_detector(make_checkpoint(tmp_path / "best.pt", imgsz=64))
    _check_classifier(det, det.export(None))


@pytest.mark.slow
def test_an_rtdetr_export_records_its_classifier(tmp_path):
    from yolo_models import make_rtdetr_checkpoint

    from norcal.export.families import load_detector

    det = load_detector(make_rtdetr_checkpoint(tmp_path / "rtdetr.pt"))
    _check_classifier(det, det.export(None))


@pytest.mark.parametrize("name", ["detectron2", "torchvision", "ultralytics"])
def test_an_export_scans_its_checkpoint_once_and_loads_it_once(name, tmp_path, monkeypatch):
    """The pickle scan (the claims' and the load's refusals) reads the file once; the weights'
    full torch.load once more."""
    import torch
    from family_cases import CASES

    from norcal.export.families import pickle_scan
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    ckpt = CASES[name].make(tmp_path)
    scans, loads = [], []
    scan, load = pickle_scan._scan, torch.load
    monkeypatch.setattr(pickle_scan, "_scan", lambda p: scans.append(Path(p).resolve()) or scan(p))
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loads.append(Path(f).resolve()) or load(f, *a, **k))
    export_checkpoint(ckpt.path, tmp_path / "m.onnx", NorCal(gamma=0.5, table=str(ckpt.table)),
                      CheckpointExport(config=ckpt.config))
    me = Path(ckpt.path).resolve()
    assert scans.count(me) == 1 and loads.count(me) == 1
