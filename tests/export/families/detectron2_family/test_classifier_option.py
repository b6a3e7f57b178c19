"""A detectron2 R-CNN checkpoint without its config: detectron2's softmax and sigmoid
(USE_SIGMOID_CE) FastRCNNOutputLayers both hold a num_classes + 1 cls_score, so the weights cannot
tell the activation. It is refused in one line saying how to go on (the config, or the classifier
option); the federated-loss buffer, the config or the option settle it, and the option is refused
where it contradicts them or where the family fixes the activation itself. Loads only (no export)."""

from __future__ import annotations

import pytest
import torch

from conftest import FIXTURES, TINY
from norcal.core.errors import NorcalError
from norcal.export.families import load_detector
from norcal.export.families.detectron2.loader import load_detector_spec

WEIGHTS, CONFIG = TINY / "model_final.pth", TINY / "config.yaml"
FED = FIXTURES / "d2_fedloss_tiny"
RETINANET = FIXTURES / "d2_retinanet_tiny"
REFUSAL = "do not tell a softmax box head from a sigmoid one"


def _one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_configless_rcnn_is_refused_naming_the_ways_on():
    with pytest.raises(NorcalError) as e:
        load_detector_spec(WEIGHTS)
    text = _one_line(e)
    assert text.startswith(f"{WEIGHTS}: ") and REFUSAL in text and "USE_SIGMOID_CE" in text
    assert text.endswith("give its config, or classifier softmax or sigmoid")
    assert e.value.params == ("config", "classifier")
    with pytest.raises(NorcalError, match=REFUSAL):  # the family's load, as export / tune / parity call it
        load_detector(WEIGHTS)


@pytest.mark.parametrize("classifier", ["softmax", "sigmoid"])
def test_the_option_names_the_activation(classifier):
    spec, _ = load_detector_spec(WEIGHTS, classifier=classifier)
    assert spec.use_sigmoid_ce is (classifier == "sigmoid")
    assert spec.provenance["use_sigmoid_ce"].startswith(f"{classifier} classifier: given by the user")
    detector = load_detector(WEIGHTS, classifier=classifier)
    assert detector.classifier.activation == classifier and detector.classifier.background == "last"


def test_the_config_and_the_fed_loss_buffer_settle_it_and_say_so():
    spec, _ = load_detector_spec(WEIGHTS, CONFIG)  # the fixture's config: USE_SIGMOID_CE false
    assert spec.use_sigmoid_ce is False
    assert spec.provenance["use_sigmoid_ce"] == (f"softmax classifier: {CONFIG} sets "
                                                 "MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE False")
    agreed, _ = load_detector_spec(WEIGHTS, CONFIG, classifier="softmax")
    assert agreed.use_sigmoid_ce is False and agreed.provenance["use_sigmoid_ce"].endswith("classifier softmax agrees")
    fed, _ = load_detector_spec(FED / "model_final.pth")  # detectron2 trained it with USE_SIGMOID_CE
    assert fed.use_sigmoid_ce is True and "fed_loss_cls_weights" in fed.provenance["use_sigmoid_ce"]
    assert load_detector_spec(FED / "model_final.pth", classifier="sigmoid")[0].use_sigmoid_ce is True


def test_a_config_saying_otherwise_is_refused_naming_both():
    with pytest.raises(NorcalError) as e:
        load_detector_spec(WEIGHTS, CONFIG, classifier="sigmoid")
    assert _one_line(e) == (f"{CONFIG} sets MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE False (a softmax box head) "
                            "but classifier sigmoid was given")
    assert e.value.param == "classifier"
    with pytest.raises(NorcalError, match="describes a RetinaNet, whose head is sigmoid"):
        load_detector_spec(RETINANET / "model_final.pth", RETINANET / "config.yaml", classifier="softmax")


@pytest.mark.parametrize("path, what", [
    (FED / "model_final.pth", "holds roi_heads.box_predictor.fed_loss_cls_weights"),
    (RETINANET / "model_final.pth", "holds a RetinaNet (head.cls_score), whose head is sigmoid"),
])
def test_weights_saying_sigmoid_refuse_softmax(path, what):
    with pytest.raises(NorcalError) as e:
        load_detector_spec(path, classifier="softmax")
    text = _one_line(e)
    assert text.startswith(f"classifier softmax given, but {path} ") and what in text
    assert e.value.param == "classifier"
    assert load_detector_spec(path, classifier="sigmoid")[0].use_sigmoid_ce is True


def test_other_families_and_other_values_refuse_the_option(tmp_path):
    from torchvision_models import tiny_rcnn
    from yolo_models import make_checkpoint

    tv = tmp_path / "frcnn.pth"
    torch.save(tiny_rcnn(box_width=64).state_dict(), tv)
    for path, family in ((tv, "torchvision"), (make_checkpoint(tmp_path / "best.pt", imgsz=64), "ultralytics")):
        with pytest.raises(NorcalError) as e:
            load_detector(path, classifier="softmax")
        assert _one_line(e) == f"{family} checkpoints fix their own activation: they take no classifier option"
        assert e.value.param == "classifier"
    with pytest.raises(NorcalError, match="^classifier must be softmax or sigmoid, got 'relu'$"):
        load_detector_spec(WEIGHTS, classifier="relu")


def test_export_job_refuses_before_writing(tmp_path):
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    out = tmp_path / "o.onnx"
    with pytest.raises(NorcalError, match=REFUSAL):
        export_checkpoint(WEIGHTS, out, NorCal(gamma=0.5))
    with pytest.raises(NorcalError, match="but classifier sigmoid was given"):
        export_checkpoint(WEIGHTS, out, NorCal(gamma=0.5), CheckpointExport(config=CONFIG, classifier="sigmoid"))
    assert not out.exists()


def test_cli_refusals_are_one_line_naming_the_flag(tmp_path, capsys):
    from norcal.cli import export_main, main

    out = tmp_path / "o.onnx"
    assert export_main([str(WEIGHTS), "--gamma", "0.5", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and REFUSAL in err
    assert err.rstrip().endswith("give its config, or --classifier softmax or sigmoid")
    assert export_main([str(FED / "model_final.pth"), "--classifier", "softmax", "--gamma", "0.5", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --classifier softmax given, but ")
    assert not out.exists()
    (tmp_path / "m.onnx").write_bytes(b"")  # refused before it is read
    rc = main(["parity", str(tmp_path / "m.onnx"), "--classifier", "sigmoid"])
    err = capsys.readouterr().err
    assert rc == 2 and err == "error: --classifier goes with --checkpoint\n"
