"""The detector-family registry and the detectron2 family: which files it claims, and what it
says about each fixture's classifier (checked against detectron2's own goldens and configs)."""

import pickle
import sys
import types

import numpy as np
import pytest

from conftest import FIXTURES

D2_FIXTURES = sorted(p.name for p in FIXTURES.glob("d2_*_tiny"))


def test_the_fixtures_are_there():
    assert {"d2_lvis_tiny", "d2_cascade_tiny", "d2_c4_tiny", "d2_dc5_tiny", "d2_retinanet_tiny"} <= set(D2_FIXTURES)


@pytest.mark.parametrize("name", D2_FIXTURES)
def test_detectron2_claims_each_fixture_checkpoint(name):
    from norcal.export.families import family_of

    assert family_of(FIXTURES / name / "model_final.pth").name == "detectron2"


def test_a_file_no_family_claims_is_refused_in_one_line(tmp_path):
    from norcal.core.errors import NorcalError
    from norcal.export.families import load_detector

    path = tmp_path / "notes.onnx"
    path.write_text("not a checkpoint")
    with pytest.raises(NorcalError) as e:
        load_detector(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "detectron2" in msg


def test_a_model_zoo_pickle_is_claimed(tmp_path):
    from norcal.export.families.detectron2.family import is_detectron2_checkpoint

    path = tmp_path / "model_final_f10217.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"backbone.bottom_up.stem.conv1.weight": np.zeros((4, 3, 7, 7), np.float32)},
                     "__author__": "Detectron2 Model Zoo"}, f)
    assert is_detectron2_checkpoint(path)


def test_a_pickled_model_of_another_package_is_not_claimed(tmp_path, monkeypatch):
    """A .pt that pickles a model object of a third-party package (as Ultralytics does: the
    classes of ``ultralytics.nn.tasks``) is not a detectron2 checkpoint."""
    import torch

    from norcal.export.families.detectron2.family import is_detectron2_checkpoint, pickle_packages

    module = types.ModuleType("otherdetector.nn")
    parent = types.ModuleType("otherdetector")

    class DetectionModel(torch.nn.Module):
        pass

    DetectionModel.__module__, DetectionModel.__qualname__ = module.__name__, "DetectionModel"
    module.DetectionModel = DetectionModel
    monkeypatch.setitem(sys.modules, "otherdetector", parent)
    monkeypatch.setitem(sys.modules, "otherdetector.nn", module)
    path = tmp_path / "best.pt"
    torch.save({"model": DetectionModel(), "train_args": {}, "version": "1"}, path)
    assert "otherdetector" in pickle_packages(path)
    assert not is_detectron2_checkpoint(path)


@pytest.mark.slow  # builds a YOLO11n once per session (~6 s)
def test_an_ultralytics_checkpoint_is_not_detectron2s(yolo_work):
    """The real thing: a YOLO11n built from its yaml (no download) and saved by Ultralytics'
    ``YOLO.save``: detectron2 does not claim it, the Ultralytics family does."""
    from norcal.export.families import family_of
    from norcal.export.families.detectron2.family import is_detectron2_checkpoint
    from norcal.export.families.ultralytics.family import UltralyticsFamily

    path = yolo_work.det
    assert not is_detectron2_checkpoint(path)
    assert isinstance(family_of(path), UltralyticsFamily)


def test_a_pickle_naming_unsafe_globals_is_claimed_then_refused(tmp_path):
    """The safe loader, not the sniffing, says why such a file is refused (and nothing runs)."""
    import torch

    from norcal.core.errors import NorcalError
    from norcal.export.families import load_detector

    path = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "x": types.SimpleNamespace(a=1)}, path)
    with pytest.raises(NorcalError, match="refused to load"):
        load_detector(path)


# --------------------------------------------------------------------------- classifiers

@pytest.fixture(scope="module")
def detectors():
    from norcal.export.families import load_detector

    names = ("d2_lvis_tiny", "d2_cascade_tiny", "d2_retinanet_tiny")
    return {n: load_detector(FIXTURES / n / "model_final.pth", FIXTURES / n / "config.yaml") for n in names}


def _golden(name):
    return np.load(FIXTURES / name / "golden" / "img0.npz")


def test_rcnn_classifier_is_softmax_with_the_background_last(detectors):
    """detectron2's FastRCNNOutputLayers: C+1 logits per proposal (the golden's width), softmax
    (MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE false in the config), background the last column."""
    import yaml

    det = detectors["d2_lvis_tiny"]
    cfg = yaml.safe_load((FIXTURES / "d2_lvis_tiny" / "config.yaml").read_text())["MODEL"]
    assert det.num_classes == cfg["ROI_HEADS"]["NUM_CLASSES"]
    assert _golden("d2_lvis_tiny")["cls_logits"].shape[1] == det.num_classes + 1
    assert not cfg["ROI_BOX_HEAD"].get("USE_SIGMOID_CE", False)
    c = det.classifier
    assert (c.logits, c.class_axis, c.background, c.activation) == (("cls_logits",), -1, "last", "softmax")
    test = yaml.safe_load((FIXTURES / "d2_lvis_tiny" / "config.yaml").read_text())["TEST"]
    assert det.topk == test["DETECTIONS_PER_IMAGE"]
    assert det.family == "detectron2" and det.has_masks == cfg["MASK_ON"]


def test_cascade_classifier_has_one_logits_tensor_per_stage(detectors):
    det = detectors["d2_cascade_tiny"]
    g = _golden("d2_cascade_tiny")
    stages = sorted(k for k in g.files if k.endswith("/cls_logits"))
    assert len(stages) == 3 and all(g[k].shape[1] == det.num_classes + 1 for k in stages)
    c = det.classifier
    assert c.logits == ("cls_logits_stage1", "cls_logits_stage2", "cls_logits_stage3")
    assert (c.class_axis, c.background, c.activation) == (-1, "last", "softmax")


def test_retinanet_classifier_is_sigmoid_without_background(detectors):
    """detectron2's RetinaNet scores A*C sigmoid channels per location, no background: the
    golden's candidate indices run over (H, W, A, C) with C = NUM_CLASSES."""
    import yaml

    det = detectors["d2_retinanet_tiny"]
    cfg = yaml.safe_load((FIXTURES / "d2_retinanet_tiny" / "config.yaml").read_text())["MODEL"]
    assert det.num_classes == cfg["RETINANET"]["NUM_CLASSES"]
    anchors = len(cfg["ANCHOR_GENERATOR"]["SIZES"][0]) * len(cfg["ANCHOR_GENERATOR"]["ASPECT_RATIOS"][0])
    # the class conv's channels at one level, as detectron2 computed them: A x C, no background slot
    assert _golden("d2_retinanet_tiny")["head/p6/cls_logits"].shape[0] == anchors * det.num_classes
    c = det.classifier
    assert (c.logits, c.class_axis, c.background, c.activation) == (("cls_logits",), -1, "none", "sigmoid")


def test_preprocessing_is_the_configs_resize(detectors):
    import yaml

    for name, det in detectors.items():
        cfg = yaml.safe_load((FIXTURES / name / "config.yaml").read_text())["INPUT"]
        p = det.preprocessing
        assert (p.min_size, p.max_size, p.input_format) == (cfg["MIN_SIZE_TEST"], cfg["MAX_SIZE_TEST"], "BGR")


@pytest.mark.slow
def test_the_classifier_names_the_exported_logits(detectors):
    """The logits the Classifier names are the graph's, as the export records them."""
    from norcal.core import contract

    for det in detectors.values():
        graph = det.export()
        names = {o for n in graph.graph.node for o in n.output}
        assert set(det.classifier.logits) <= names
        meta = {p.key: p.value for p in graph.metadata_props}
        assert contract.split_names(meta[contract.CLASSIFIER_LOGITS]) == list(det.classifier.logits)
