"""The precision presets reject broken quantized models, not only pass good ones.

The bundled trained Mask R-CNN (NorCal, gamma 0.8) is quantized as `norcal quantize` does (int8
Q/DQ from 16 training images; fp16); PyTorch's outputs on 8 validation images are the reference,
as in `norcal parity`. The int8 preset (80% paired at IoU 0.5, paired scores: median within 0.01, p99 within 0.06) passes
the int8 model and fails it with one conv's quantization scale doubled or two classifier classes
swapped; the fp16 model keeps paired scores within 0.003 of PyTorch (the README's number) and a
broken one does not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import SYNTH
from norcal.core.files.onnx_io import save_onnx
from norcal.workflows.parity import run_parity
from norcal.workflows.parity.compare import compare
from norcal.workflows.parity.tolerances import runner_precision

pytestmark = pytest.mark.slow  # exports, quantizes and runs the bundled detector (~2-3 min)

CALIBRATION = sorted((SYNTH / "train_subset").glob("*.png"))[:16]  # training images, as the quantize tests
VAL = sorted((SYNTH / "val").glob("*.png"))[:8]
GAMMA = 0.8
FP16_SCORES = 0.003  # README: fp16 detections all pair up with fp32's, "scores within 0.003"
KEYS = ("num_detections", "boxes", "scores", "classes")


@pytest.fixture(scope="module")
def fp32():
    from norcal.core.calibration.tables import build_table
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model

    spec, model = load_model(SYNTH / "model_final.pth", SYNTH / "config.yaml")
    return calibrate_graph(export_detector(model, spec), GAMMA, build_table(SYNTH / "train_annotations.json"))


@pytest.fixture(scope="module")
def int8(fp32):
    from norcal.export.graph.quantize import quantize_int8
    from norcal.runtime.images import read_rgb
    from norcal.core.contract import Preprocessing
    from norcal.runtime.preprocess import prepare_batch

    model, _ = quantize_int8(fp32, (prepare_batch([read_rgb(p)], Preprocessing(256, 400)).feeds() for p in CALIBRATION))
    return model


@pytest.fixture(scope="module")
def fp16(fp32):
    from norcal.export.graph.quantize import convert_fp16

    return convert_fp16(fp32)


@pytest.fixture(scope="module")
def images():
    from norcal.runtime.images import read_rgb

    return [read_rgb(p) for p in VAL]


@pytest.fixture(scope="module")
def reference(fp32, int8, images, tmp_path_factory):
    """PyTorch's outputs (with the ONNX model's prior) and the parity run of the good int8 model."""
    from norcal.export.families import checkpoint_runner
    from norcal.export.pytorch.runner import onnx_calibration
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner

    path = tmp_path_factory.mktemp("int8") / "int8.onnx"
    save_onnx(int8, path)
    torch = checkpoint_runner(SYNTH / "model_final.pth", SYNTH / "config.yaml",
                              calibration=onnx_calibration(fp32))
    run = run_parity([torch, OnnxRuntimeRunner(path)], images, min_size=256, max_size=400, batch_size=4)
    return run.outputs[torch.name], run.reports[0]


def _judge(model, reference, images, tmp_path):
    """``model`` run by ONNX Runtime on the parity batches and judged by the preset that
    `norcal parity` picks for it (from its norcal.precision) -> (preset, report)."""
    from norcal.core.contract import Preprocessing
    from norcal.runtime.inference import prepared_batches
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner

    save_onnx(model, tmp_path / "model.onnx")
    runner = OnnxRuntimeRunner(tmp_path / "model.onnx")
    chunks = []
    for batch in prepared_batches(images, Preprocessing(256, 400, "BGR", 32), 4):  # as run_parity feeds
        out = runner.infer(batch.feeds())
        chunks.append({k: np.asarray(out[k])[:len(batch)] for k in KEYS})
    cand = {k: np.concatenate([c[k] for c in chunks]) for k in KEYS}
    precision = runner_precision(runner)
    return precision, compare({k: reference[k] for k in KEYS}, cand, precision)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _set(model: onnx.ModelProto, name: str, fn) -> None:
    """Replace initializer ``name`` with ``fn(its array)``."""
    t = next(t for t in model.graph.initializer if t.name == name)
    t.CopyFrom(numpy_helper.from_array(fn(numpy_helper.to_array(t).copy()), name))


def _detections(out) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(out["num_detections"]).reshape(-1)
    return (np.concatenate([out["scores"][b, :n[b]] for b in range(n.size)]),
            np.concatenate([out["classes"][b, :n[b]] for b in range(n.size)]))


def test_int8_model_passes_the_int8_preset(reference):
    _, report = reference
    assert report.precision == "int8" and report.passed, report.failures
    assert report.detections.reference_count >= 50


def test_int8_with_a_conv_scale_off_by_two_fails(int8, reference, images, tmp_path):
    broken = _copy(int8)
    producer = {o: n for n in broken.graph.node for o in n.output}
    conv = next(n for n in broken.graph.node if n.op_type == "Conv" and n.name.endswith("res4.4/conv2/Conv"))
    dq = producer[conv.input[1]]  # the conv's weight, dequantized
    assert dq.op_type == "DequantizeLinear"
    _set(broken, dq.input[1], lambda scale: scale * 2)
    precision, report = _judge(broken, reference[0], images, tmp_path)
    assert precision == "int8" and not report.passed
    assert any(f.startswith("detections:") for f in report.failures), report.failures


def test_int8_with_two_classes_swapped_fails(int8, reference, images, tmp_path):
    scores, classes = _detections(reference[0])
    # the two classes the reference detects most often (scores >= 0.05), ties by class index
    found, counts = np.unique(classes[scores >= 0.05], return_counts=True)
    a, b = (int(c) for c in found[np.lexsort((found, -counts))][:2])
    broken = _copy(int8)
    cls = next(n for n in broken.graph.node if n.op_type == "Gemm" and "cls_score" in n.name)
    assert [x.i for x in cls.attribute if x.name == "transB"] == [1]  # weight rows are classes

    def swap(w):
        w[[a, b]] = w[[b, a]]
        return w

    for name in cls.input[1:]:  # weight [C+1, D] and bias [C+1]: the two logits trade places
        _set(broken, name, swap)
    precision, report = _judge(broken, reference[0], images, tmp_path)
    assert precision == "int8" and not report.passed
    assert any(f.startswith("detections:") for f in report.failures), report.failures


def test_fp16_scores_within_the_readme_bound(fp16, reference, images, tmp_path):
    precision, report = _judge(fp16, reference[0], images, tmp_path)
    assert precision == "fp16" and report.passed, report.failures
    assert report.detections.matched_fraction == 1.0
    assert report.detections.max_score_diff <= FP16_SCORES, report.detections.max_score_diff


@pytest.mark.parametrize("factor, preset_fails", [(1.05, False), (2.0, True)])
def test_broken_fp16_fails_the_bound(fp16, reference, images, tmp_path, factor, preset_fails):
    """One conv's fp16 weights off by 5%: scores move past 0.003, which this bound catches
    though the fp16 preset (meant for TensorRT fp16 engines too, 0.02) lets it through; off by
    2x, the preset fails it as well."""
    broken = _copy(fp16)
    conv = next(n for n in broken.graph.node if n.op_type == "Conv" and n.name.endswith("res4.4/conv2/Conv"))
    _set(broken, conv.input[1], lambda w: (w * factor).astype(w.dtype))
    precision, report = _judge(broken, reference[0], images, tmp_path)
    assert precision == "fp16"
    assert report.detections.max_score_diff > FP16_SCORES
    if preset_fails:
        assert not report.passed
