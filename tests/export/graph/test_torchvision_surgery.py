"""Surgery on a real third-party graph: torchvision's Faster R-CNN (background FIRST)."""

import contextlib
import types
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torchvision

from norcal.core.calibration.formula import calibrate, log_prior
from norcal.cli import export_main
from classifier_lookup import find_classifiers
from norcal.export.graph.surgery import norcal_metadata

pytestmark = pytest.mark.slow  # runs torchvision's Faster R-CNN

COUNTS = [1.0, 2.0, 5.0, 9.0, 30.0, 60.0, 150.0, 400.0, 900.0, 2500.0]


@pytest.fixture(scope="module")
def torchvision_detector(tmp_path_factory):
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=len(COUNTS) + 1,
        min_size=128, max_size=160, box_score_thresh=0.0, box_detections_per_img=50)
    model.eval()
    path = tmp_path_factory.mktemp("tv") / "frcnn.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, ([torch.rand(3, 120, 150)],), str(path), opset_version=17, dynamo=False,
                          input_names=["image"], output_names=["boxes", "labels", "scores"],
                          dynamic_axes={"image": [1, 2]})
    return model, path


@contextlib.contextmanager
def norcal_softmax(lp):
    """torchvision's RoIHeads scores with F.softmax(class_logits, -1): swap in NorCal."""
    import torchvision.models.detection.roi_heads as roi_heads

    real = roi_heads.F
    patched = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    patched.softmax = lambda x, dim=-1: calibrate(x, lp)
    roi_heads.F = patched
    try:
        yield
    finally:
        roi_heads.F = real


def table_file(tmp_path):
    import json

    cats = [{"id": i + 1, "name": f"class{i}", "image_count": c, "instance_count": c} for i, c in enumerate(COUNTS)]
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({"name": "toy", "categories": cats}))
    return path


def test_finds_torchvision_classifier(torchvision_detector):
    _, path = torchvision_detector
    found = find_classifiers(onnx.load(str(path)))
    assert len(found) == 1 and found[0].width == len(COUNTS) + 1 and found[0].producer == "Gemm"


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_torchvision_parity(torchvision_detector, tmp_path, gamma):
    model, path = torchvision_detector
    out = tmp_path / "frcnn.norcal.onnx"
    rc = export_main([str(path), "--gamma", str(gamma), "--table", str(table_file(tmp_path)),
                      "--background", "first", "-o", str(out)])
    assert rc == 0
    calibrated = onnx.load(str(out))
    assert norcal_metadata(calibrated)["norcal.background_index"] == "0"
    x = torch.rand(3, 120, 150, generator=torch.Generator().manual_seed(int(gamma * 10)))
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    boxes, labels, scores = sess.run(None, {"image": x.numpy()})
    lp = log_prior(COUNTS, gamma, background="first")
    with torch.no_grad(), norcal_softmax(lp):
        ref = model([x])[0]
    assert len(scores) == len(ref["scores"]) > 0
    np.testing.assert_allclose(scores, ref["scores"].numpy(), atol=1e-5)
    np.testing.assert_array_equal(labels, ref["labels"].numpy())
    # boxes pass through torchvision's resize and random box regression: float noise only
    np.testing.assert_allclose(boxes, ref["boxes"].numpy(), rtol=1e-4, atol=1e-2)
    if gamma > 0:  # NorCal really changed the scores
        with torch.no_grad():
            plain = model([x])[0]
        assert not np.allclose(plain["scores"].numpy()[:10], scores[:10], atol=1e-4)


@pytest.mark.parametrize("given", [[], ["--background", "last"]])
def test_torchvision_graph_with_background_last_is_refused(torchvision_detector, tmp_path, capsys, given):
    """torchvision's graph drops class column 0 after its softmax: NorCal at the default last slot
    would scale the no-object logit as class 9 and leave class 0 alone. Refused, nothing written."""
    _, path = torchvision_detector
    out = tmp_path / "frcnn.norcal.onnx"
    rc = export_main([str(path), "--gamma", "0.5", "--table", str(table_file(tmp_path)), *given, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert "puts its no-object logit first" in err and "give --background 'first'" in err
