"""norcal-export's options checked against the model, and its summary saying what the node computes.

Every exported variant runs through ONNX Runtime; a flag that would give a wrong model is
refused (one line, exit 2, nothing written) and a flag that does nothing in that mode is refused
or warned about in one line.
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import golden as G
from conftest import FIXTURES
from norcal.cli import export_main, main
from norcal.core.errors import NorcalError

from onnx_graphs import classifier_graph, gemm_weights

COUNTS = [1, 5, 50, 500]
GAMMA = 0.7
B = 2.0  # background scale, where the variant has a background


def write_table(tmp_path, counts=COUNTS):
    cats = [{"id": i + 1, "name": f"class{i}", "image_count": c, "instance_count": c}
            for i, c in enumerate(counts)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"name": "toy", "categories": cats}))
    return p


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


# the summary's formula -> an independent numpy statement of it (docs/variants.md);
# phi [N, C+1] background last, a [C] the factors, b the background scale
REFERENCE = {
    "softmax(phi - log_prior)":
        lambda phi, a, b: _softmax(phi - np.r_[np.log(a), -np.log(b)]),
    "softmax([phi_c/a_c, phi_bg + log b])":
        lambda phi, a, b: _softmax(np.c_[phi[:, :-1] / a, phi[:, -1:] + np.log(b)]),
    "exp(phi - log_prior), not normalised":
        lambda phi, a, b: np.c_[np.exp(phi[:, :-1]) / a, b * np.exp(phi[:, -1:])],
    "exp(log_softmax(phi) - log_prior), not normalised":
        lambda phi, a, b: _softmax(phi) * np.r_[1 / a, b],
    "exp([phi_c/a_c, phi_bg + log b]), not normalised":
        lambda phi, a, b: np.c_[np.exp(phi[:, :-1] / a), b * np.exp(phi[:, -1:])],
    "sigmoid(phi - log_prior)":
        lambda phi, a, b: _sigmoid(phi - np.r_[np.log(a), 0.0]),
    "sigmoid(phi) * exp(-log_prior)":
        lambda phi, a, b: _sigmoid(phi) * np.r_[1 / a, 1.0],
    "sigmoid(phi_c * a_c)":
        lambda phi, a, b: np.c_[_sigmoid(phi[:, :-1] * a), _sigmoid(phi[:, -1:])],
}

VARIANTS = [  # (activation, flags): every row of docs/variants.md, CDT factor
    ("Softmax", []), ("Softmax", ["--mechanism", "prob"]), ("Softmax", ["--mechanism", "logit"]),
    ("Softmax", ["--no-renormalize"]), ("Softmax", ["--mechanism", "prob", "--no-renormalize"]),
    ("Softmax", ["--mechanism", "logit", "--no-renormalize"]),
    ("Sigmoid", []), ("Sigmoid", ["--mechanism", "prob"]), ("Sigmoid", ["--mechanism", "logit"]),
]


def summary_row(out: str, label: str) -> str:
    rows = [line for line in out.splitlines() if re.match(rf"\W*{label}\s", line)]
    assert len(rows) == 1, out
    return re.sub(r"\s*[│|]\s*$", "", re.split(rf"{label}\s+[│|]\s*", rows[0], maxsplit=1)[1])


@pytest.mark.parametrize("activation, flags", VARIANTS, ids=lambda v: "-".join(v) if isinstance(v, list) else v)
def test_summary_says_what_the_node_computes(tmp_path, capsys, monkeypatch, activation, flags):
    """The summary's formula, evaluated independently, is what ONNX Runtime computes."""
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    src = tmp_path / "det.onnx"
    model = classifier_graph(num_classes=len(COUNTS), activation=activation, seed=3)
    onnx.save(model, src)
    out = tmp_path / "det.norcal.onnx"
    scale = ["--background-scale", str(B)] if activation == "Softmax" else []
    argv = [str(src), "--gamma", str(GAMMA), "--table", str(write_table(tmp_path)), "-o", str(out)]
    assert export_main(argv + flags + scale) == 0
    formula = summary_row(capsys.readouterr().out, "computes")
    assert formula in REFERENCE, formula

    x = np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32) * 3
    w, bias = gemm_weights(model)
    phi = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    a = np.asarray(COUNTS, np.float64) ** GAMMA
    want = REFERENCE[formula](phi, a, B if scale else 1.0)
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- checked against the model

RETINANET = FIXTURES / "d2_retinanet_tiny"
DC5 = FIXTURES / "d2_dc5_tiny"


def fails_in_one_line(capsys, argv, *shown, cli=export_main):
    rc = cli([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    for text in shown:
        assert text in err, err
    return err


def _checkpoint(fixture):
    return [fixture / "model_final.pth", "--config", fixture / "config.yaml"]


@pytest.mark.parametrize("flags, shown", [
    (["--background", "first"], ["--background 'first'", "one logit per class"]),
    (["--background", "last"], ["--background 'last'", "one logit per class"]),
    (["--background-scale", "2"], ["--background-scale 2", "sigmoid"]),
    (["--mask-head-rois", "static"], ["--mask-head-rois 'static'", "RetinaNet"]),
])
def test_retinanet_refuses_what_its_head_does_not_have(tmp_path, capsys, flags, shown):
    """Before: --background first/last wrote a 1204-entry prior for 1203 logits (exit 0) that
    ONNX Runtime then failed on; the others were accepted and did nothing."""
    out = tmp_path / "r.onnx"
    fails_in_one_line(capsys, [*_checkpoint(RETINANET), "--gamma", "0.5", *flags, "-o", out], *shown)
    assert not out.exists()


def test_box_only_single_level_model_refuses_mask_head_rois(tmp_path, capsys):
    out = tmp_path / "d.onnx"
    fails_in_one_line(capsys, [*_checkpoint(DC5), "--gamma", "0.5", "--mask-head-rois", "valid", "-o", out],
                      "--mask-head-rois 'valid'", "DC5")
    assert not out.exists()


@pytest.mark.parametrize("flag", [["--gamma", "0.5"], ["--table", "lvis_v1"], ["--factor", "cdt"],
                                  ["--mechanism", "prob"], ["--min-count", "2"], ["--no-renormalize"],
                                  ["--background-scale", "1"], ["--count", "image"],
                                  ["--background", "first"], ["--logits", "x"], ["--inline"]])
def test_strip_refuses_every_calibration_flag(tmp_path, capsys, flag):
    src = tmp_path / "det.onnx"
    onnx.save(classifier_graph(num_classes=len(COUNTS)), src)
    out = tmp_path / "plain.onnx"
    fails_in_one_line(capsys, [src, "--strip", *flag, "-o", out], f"--strip removes NorCal; it takes no {flag[0]}")
    assert not out.exists()


def test_background_scale_refused_on_a_sigmoid_onnx_head(tmp_path, capsys):
    src = tmp_path / "det.onnx"
    onnx.save(classifier_graph(num_classes=len(COUNTS), activation="Sigmoid"), src)
    out = tmp_path / "o.onnx"
    fails_in_one_line(capsys, [src, "--gamma", "0.5", "--table", write_table(tmp_path), "--background-scale", "3",
                               "-o", out], "--background-scale 3 has no effect on a sigmoid classifier")
    assert not out.exists()


def test_parity_engine_precision_needs_an_engine(tmp_path, capsys):
    src = tmp_path / "det.onnx"
    onnx.save(classifier_graph(), src)
    fails_in_one_line(capsys, ["parity", src, "--checkpoint", G.FIXTURE / "model_final.pth",
                               "--engine-precision", "fp16"], "--engine-precision", "no --engine given", cli=main)


def _qdq_detector(metadata: dict[str, str]) -> onnx.ModelProto:
    """The detector contract's inputs, images through one int8 Q/DQ pair (a quantized model's shape)."""
    from onnx import TensorProto as T
    from onnx import helper as h

    nodes = [h.make_node("QuantizeLinear", ["images", "s", "zp"], ["q"], name="q"),
             h.make_node("DequantizeLinear", ["q", "s", "zp"], ["dq"], name="dq"),
             h.make_node("ReduceMean", ["dq", "axes"], ["scores"], name="mean", keepdims=0),
             h.make_node("Identity", ["image_sizes"], ["sizes"], name="sizes")]
    g = h.make_graph(nodes, "qdq", [h.make_tensor_value_info("images", T.FLOAT, ["B", 3, "H", "W"]),
                                    h.make_tensor_value_info("image_sizes", T.INT64, ["B", 2])],
                     [h.make_tensor_value_info("scores", T.FLOAT, ["B", 3]),
                      h.make_tensor_value_info("sizes", T.INT64, ["B", 2])],
                     [h.make_tensor("s", T.FLOAT, [], [1.0]), h.make_tensor("zp", T.INT8, [], [0]),
                      h.make_tensor("axes", T.INT64, [2], [2, 3])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)])
    m.ir_version = 10
    h.set_model_props(m, metadata)
    onnx.checker.check_model(m)
    return m


def test_build_refuses_a_quantized_model_without_int8(tmp_path, capsys):
    """Before: an fp32 sidecar and a trtexec line without --int8 for an int8 model."""
    from norcal.runtime.tensorrt_build import sidecar_path

    src = tmp_path / "m.int8.onnx"
    onnx.save(_qdq_detector({"norcal.precision": "int8"}), src)
    engine = tmp_path / "m.engine"
    fails_in_one_line(capsys, ["build", src, "--trtexec-only", "-o", engine],
                      "is a quantized (Q/DQ) model", "norcal.precision", "build it with --int8", cli=main)
    assert not sidecar_path(engine).exists()
    assert main(["build", str(src), "--trtexec-only", "--int8", "-o", str(engine)]) == 0
    assert " --int8" in capsys.readouterr().out
    assert json.loads(sidecar_path(engine).read_text())["precision"] == "int8"


# ----------------------------------------------------------------------------- every variant runs


@pytest.fixture(scope="module")
def plain_graphs():
    """Each fixture's plain graph (no NorCal), exported once: RetinaNet (sigmoid, no background
    slot) and the LVIS Mask R-CNN (softmax, background last)."""
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model

    graphs = {}
    for fixture in (RETINANET, G.FIXTURE):
        spec, model = load_model(fixture / "model_final.pth", fixture / "config.yaml")
        graphs[fixture.name] = (export_detector(model, spec, check=False), spec)
    return graphs


def _runs(model: onnx.ModelProto, fixture, num_classes: int) -> None:
    """ONNX Runtime runs the model on a fixture image; its outputs are the contract's."""
    images, sizes = G.batch([0], fixture=fixture)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"images": images, "image_sizes": sizes})))
    n, scores, classes = out["num_detections"], out["scores"], out["classes"]
    k = scores.shape[1]
    assert n.shape == (1,) and np.all((n >= 1) & (n <= k)), n
    for i in range(1):
        valid = scores[i, : n[i]]
        assert np.all(np.isfinite(valid)) and np.all(valid > 0), valid
        assert np.all((classes[i, : n[i]] >= 0) & (classes[i, : n[i]] < num_classes))
        assert np.all(scores[i, n[i]:] == 0)


MECHANISMS = [("exp", None), ("prob", None), ("logit", None), ("exp", False), ("prob", False), ("logit", False)]
SLOTS = {"d2_retinanet_tiny": "none", "d2_lvis_tiny": "last"}


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOTS)
@pytest.mark.parametrize("mechanism, renormalize", MECHANISMS)
def test_every_variant_we_write_runs(plain_graphs, name, mechanism, renormalize):
    """Each variant the library accepts runs in ONNX Runtime and records the head's own slot."""
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    graph, spec = plain_graphs[name]
    model = calibrate_onnx(graph, NorCal(gamma=0.5, mechanism=mechanism, renormalize=renormalize))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["norcal.background"] == SLOTS[name]
    assert meta["norcal.activation"] == ("sigmoid" if SLOTS[name] == "none" else "softmax")
    _runs(model, FIXTURES / name, spec.num_classes)


@pytest.mark.slow
def test_inlined_and_background_scaled_variant_runs(plain_graphs):
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    graph, spec = plain_graphs["d2_lvis_tiny"]
    model = calibrate_onnx(graph, NorCal(gamma=0.5, mechanism="logit", background="last",
                                         background_scale=0.5, inline=True))
    assert not any(n.op_type == "NorCal" for n in model.graph.node)
    _runs(model, G.FIXTURE, spec.num_classes)


@pytest.mark.parametrize("name", SLOTS)
def test_every_variant_we_refuse_names_its_parameter(plain_graphs, name):
    """A background slot the head does not have, or a scale a sigmoid head ignores: refused."""
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    graph, _ = plain_graphs[name]
    slot = SLOTS[name]
    cases = [(dict(background=b), "background") for b in ("last", "first", "none") if b != slot]
    if slot == "none":
        cases.append((dict(background_scale=0.5), "background_scale"))
    for options, param in cases:
        with pytest.raises(NorcalError) as e:
            calibrate_onnx(graph, NorCal(gamma=0.5, **options))
        assert e.value.param == param and "--" not in str(e.value), str(e.value)


def test_a_recalibrated_retinanet_keeps_its_prior_fitting(plain_graphs, tmp_path):
    """ONNX input: the class axis of RetinaNet's logits is dynamic, so the recorded class count
    is what a table must fit."""
    from norcal.workflows.export_job import NorCal, calibrate_onnx

    graph, _ = plain_graphs["d2_retinanet_tiny"]
    model = calibrate_onnx(graph, NorCal(gamma=0.5))
    with pytest.raises(NorcalError) as e:
        calibrate_onnx(model, NorCal(gamma=0.5, table="lvis_v0_5", background="none"))
    assert "1203 logits per box" in str(e.value) and "1230" in str(e.value)
    with pytest.raises(NorcalError, match="'first' does not fit the model"):
        calibrate_onnx(model, NorCal(gamma=0.5, background="first"))
