"""Every NorCal variant (factor x mechanism x normalisation x activation) against the paper's
expression written out naively in float64, on detectron2's real logits (d2_lvis_tiny img0)
with the built-in lvis_v1 counts; the ONNX node and the PyTorch box predictor against numpy."""

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from norcal.core.calibration.formula import calibrate, calibrated_logits, check_variant, log_prior
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import load_table
from norcal.export.rcnn.modeling.box_predictor import FastRCNNOutputLayers
from norcal.core.calibration.spec import Calibration
from norcal.core.calibration.tables import CalibrationTable
from norcal.export.graph.surgery import insert_norcal, norcal_metadata

from conftest import TINY
from onnx_graphs import classifier_graph

GAMMAS = {"cdt": 0.5, "ens": 0.999}


def resolved(counts, **kw):
    """A calibration over a table holding ``counts``, resolved (what the surgery takes)."""
    cats = [{"id": i + 1, "name": f"c{i}", "image_count": float(c), "instance_count": float(c),
             "frequency": "r"} for i, c in enumerate(counts)]
    return Calibration(table=CalibrationTable("t", "test", "image", cats), **kw).resolve(None)
B = 1.7  # background scale: multiplies exp(phi_bg) in every mechanism
SOFTMAX = [(m, r) for m in ("exp", "prob", "logit") for r in (True, False)]
SIGMOID = [("exp", False), ("prob", False), ("logit", False)]
VARIANTS = [(f, m, r, "softmax") for f in GAMMAS for m, r in SOFTMAX] + \
           [(f, m, r, "sigmoid") for f in GAMMAS for m, r in SIGMOID]


def ident(v):
    return "-".join(str(x) if not isinstance(x, bool) else ("renorm" if x else "raw") for x in v)


@pytest.fixture(scope="module")
def phi():
    return np.load(TINY / "golden" / "img0.npz")["cls_logits"]  # [1000, 1204], background last


@pytest.fixture(scope="module")
def counts():
    return load_table("lvis_v1").counts()


def factors(counts, factor):
    n, g = np.asarray(counts, np.float64), GAMMAS[factor]
    return n ** g if factor == "cdt" else (1 - g ** n) / (1 - g)


def paper(phi, counts, factor, mechanism, renormalize, activation, b=B):
    """The row's expression as written in the paper, float64, background last."""
    phi = np.asarray(phi, np.float64)
    a = factors(counts, factor)
    fg, bg = phi[:, :-1], phi[:, -1:]
    if activation == "sigmoid":  # Sec. 3.4 and the supplement's sigmoid ablation (BALMS)
        s = 1 / (1 + np.exp(-phi))
        if mechanism == "exp":  # (exp(phi_c)/a_c) / (exp(phi_c)/a_c + 1)
            e = np.concatenate([np.exp(fg) / a, np.exp(bg) * b], -1)
            return e / (e + 1)
        if mechanism == "prob":  # s_c / a_c
            return np.concatenate([s[:, :-1] / a, s[:, -1:] * b], -1)
        # exp(-phi_c * a_c) in the denominator: 1 / (1 + exp(-phi_c * a_c)); inf there is exact
        with np.errstate(over="ignore"):
            return np.concatenate([1 / (1 + np.exp(-fg * a)), 1 / (1 + np.exp(-bg) / b)], -1)
    if mechanism == "exp":  # exp(phi_c) / a_c
        num = np.concatenate([np.exp(fg) / a, np.exp(bg) * b], -1)
    elif mechanism == "prob":  # p(c|x) / a_c
        p = np.exp(phi) / np.exp(phi).sum(-1, keepdims=True)
        num = np.concatenate([p[:, :-1] / a, p[:, -1:] * b], -1)
    else:  # exp(phi_c / a_c)
        num = np.concatenate([np.exp(fg / a), np.exp(bg) * b], -1)
    return num / num.sum(-1, keepdims=True) if renormalize else num


def ours(x, counts, factor, mechanism, renormalize, activation, background="last", b=B):
    lp = log_prior(counts, GAMMAS[factor], factor, background, b)
    return calibrate(x, lp, mechanism, renormalize, activation, background)


@pytest.mark.parametrize("variant", VARIANTS, ids=ident)
def test_variant_is_the_papers_expression(phi, counts, variant):
    expected = paper(phi, counts, *variant)
    got = ours(phi, counts, *variant)
    assert got.dtype == np.float32 and got.shape == phi.shape
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-7)
    got_t = ours(torch.from_numpy(phi), counts, *variant)
    assert got_t.dtype == torch.float32
    np.testing.assert_allclose(got_t.numpy(), expected, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("factor", sorted(GAMMAS))
def test_renormalised_exp_and_prob_are_the_same_row(phi, counts, factor):
    """The paper's footnote: with normalisation, scaling exp(phi) and p(c|x) is the same."""
    np.testing.assert_allclose(paper(phi, counts, factor, "exp", True, "softmax"),
                               paper(phi, counts, factor, "prob", True, "softmax"), rtol=1e-12)
    np.testing.assert_allclose(ours(phi, counts, factor, "exp", True, "softmax"),
                               ours(phi, counts, factor, "prob", True, "softmax"), rtol=1e-5, atol=1e-8)


def test_every_other_pair_of_variants_differs(phi, counts):
    out = {v: ours(phi, counts, *v).astype(np.float64) for v in VARIANTS}
    same = {frozenset({(f, "exp", True, "softmax"), (f, "prob", True, "softmax")}) for f in GAMMAS}
    for u, v in itertools.combinations(VARIANTS, 2):
        if frozenset({u, v}) in same:
            continue
        assert not np.allclose(out[u], out[v], rtol=1e-3, atol=1e-6), (u, v)


def test_the_three_unnormalised_rows_are_not_probabilities(phi, counts):
    """exp(phi_c)/a_c has no denominator: unlike p(c|x)/a_c its rows do not sum to <= 1."""
    raw_exp = ours(phi, counts, "cdt", "exp", False, "softmax")
    raw_prob = ours(phi, counts, "cdt", "prob", False, "softmax")
    np.testing.assert_allclose(raw_exp / raw_exp.sum(-1, keepdims=True),
                               raw_prob / raw_prob.sum(-1, keepdims=True), rtol=1e-4, atol=1e-9)
    assert raw_exp.sum(-1).max() > 1.5 and raw_prob.sum(-1).max() <= B


def test_background_scale_multiplies_the_background_exponential_by_hand():
    phi = np.array([[2.0, -1.0, 0.5]])  # two classes, background last
    lp = log_prior([4.0, 1.0], 1.0, background_scale=3.0)  # a = [4, 1], b = 3
    num = np.array([np.exp(2.0 / 4), np.exp(-1.0), 3 * np.exp(0.5)])
    np.testing.assert_allclose(calibrate(phi, lp, "logit")[0], num / num.sum(), rtol=1e-12)
    np.testing.assert_allclose(calibrate(phi, lp, "logit", renormalize=False)[0], num, rtol=1e-12)
    np.testing.assert_allclose(calibrate(phi, lp, "exp", renormalize=False)[0],
                               [np.exp(2.0) / 4, np.exp(-1.0), 3 * np.exp(0.5)], rtol=1e-12)
    lp = log_prior([4.0, 1.0], 1.0, background="first", background_scale=3.0)
    phi_first = phi[:, [2, 0, 1]]
    np.testing.assert_allclose(calibrate(phi_first, lp, "logit", background="first")[0],
                               (num / num.sum())[[2, 0, 1]], rtol=1e-12)


def test_sigmoid_heads_never_renormalise():
    assert check_variant("exp", None, "softmax") is True
    assert check_variant("exp", None, "sigmoid") is False
    assert check_variant("logit", False, "softmax") is False
    for mech in ("exp", "prob", "logit"):
        with pytest.raises(NorcalError, match=f"mechanism={mech}, renormalize=true, activation=sigmoid"):
            check_variant(mech, True, "sigmoid")
    with pytest.raises(NorcalError, match="mechanism"):
        check_variant("temperature", None, "softmax")


def test_calibrated_logits_give_the_score_through_the_plain_activation(phi, counts):
    t = torch.from_numpy(phi)
    for factor, mech in itertools.product(GAMMAS, ("exp", "prob", "logit")):
        lp = log_prior(counts, GAMMAS[factor], factor, "last", B)
        z = calibrated_logits(t, lp, mech)
        np.testing.assert_allclose(z.softmax(-1).numpy(), ours(phi, counts, factor, mech, True, "softmax"),
                                   rtol=2e-5, atol=1e-8)
        if mech != "prob":
            np.testing.assert_allclose(calibrated_logits(t, lp, mech, "sigmoid").sigmoid().numpy(),
                                       ours(phi, counts, factor, mech, False, "sigmoid"), rtol=2e-5, atol=1e-8)
    with pytest.raises(NorcalError, match="prob.*sigmoid"):
        calibrated_logits(t, lp, "prob", "sigmoid")


# ----------------------------------------------------------------------------- the ONNX node

def identity_classifier(k: int, activation: str) -> onnx.ModelProto:
    """logits [N, k] -> MatMul(identity) -> Softmax/Sigmoid: the surgery's pattern, exact in fp32."""
    w = numpy_helper.from_array(np.eye(k, dtype=np.float32), "W")
    attrs = {"axis": -1} if activation == "Softmax" else {}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["logits"], name="cls"),
         helper.make_node(activation, ["logits"], ["scores"], name="act", **attrs)],
        "identity_classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", k])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("inline", [False, True], ids=["function", "inline"])
@pytest.mark.parametrize("variant", VARIANTS, ids=ident)
def test_onnx_node_computes_the_numpy_function(phi, counts, variant, inline):
    factor, mech, renorm, act = variant
    x = phi[:200]
    lp = log_prior(counts, GAMMAS[factor], factor, "last", B)
    settings = resolved(counts, gamma=GAMMAS[factor], factor=factor, mechanism=mech, renormalize=renorm,
                        background_scale=B, inline=inline)
    out = insert_norcal(identity_classifier(x.shape[1], act.capitalize()), settings)
    onnx.checker.check_model(out, full_check=True)
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    # ONNX Runtime's CPU Sigmoid is a rational approximation, within ~2e-7 absolute
    np.testing.assert_allclose(got, ours(x, counts, *variant), rtol=1e-5,
                               atol=1e-6 if act == "sigmoid" else 1e-7)
    meta = norcal_metadata(out)
    assert (meta["norcal.mechanism"], meta["norcal.renormalize"], meta["norcal.activation"]) == \
           (mech, str(renorm).lower(), act)


@pytest.mark.parametrize("background", ["first", "none"])
@pytest.mark.parametrize("act", ["Softmax", "Sigmoid"])
@pytest.mark.parametrize("renorm", [None, False])
def test_onnx_logit_node_finds_the_background_slot(background, act, renorm):
    """The logit mechanism treats the background apart: wherever it is, or when there is none."""
    counts = np.array([1.0, 3.0, 10.0, 250.0, 4000.0] + ([7.0] if background == "none" else []))
    model = classifier_graph(activation=act)  # 6 outputs: 5 classes + background, or 6 classes
    lp = log_prior(counts, 0.6, background=background, background_scale=0.4)
    s = resolved(counts, gamma=0.6, mechanism="logit", renormalize=renorm, background=background,
                 background_scale=0.4)
    out = insert_norcal(model, s)
    x = np.random.default_rng(5).normal(size=(9, 8)).astype(np.float32) * 3
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    logits = x @ inits["W0"].T + inits["B0"]
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = calibrate(logits, lp, "logit", renorm, act.lower(), background)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_onnx_refuses_renormalised_sigmoid_and_records_the_resolved_form():
    lp = log_prior([1.0, 3.0, 10.0, 250.0, 4000.0], 0.6)
    with pytest.raises(NorcalError, match="renormalize=true, activation=sigmoid"):
        insert_norcal(classifier_graph(activation="Sigmoid"),
                      resolved([1.0, 3.0, 10.0, 250.0, 4000.0], gamma=0.6, renormalize=True))
    unset = resolved([1.0, 3.0, 10.0, 250.0, 4000.0], gamma=0.6)
    np.testing.assert_allclose(unset.log_prior(), lp)
    assert norcal_metadata(insert_norcal(classifier_graph(activation="Sigmoid"), unset))[
        "norcal.renormalize"] == "false"
    assert norcal_metadata(insert_norcal(classifier_graph(), unset))["norcal.renormalize"] == "true"
    assert unset.renormalize is None  # the caller's settings are left alone


# ----------------------------------------------------------------------------- the box predictor

@pytest.mark.parametrize("variant", VARIANTS, ids=ident)
def test_box_predictor_computes_the_numpy_function(phi, counts, variant):
    factor, mech, renorm, act = variant
    pred = FastRCNNOutputLayers(8, len(counts), use_sigmoid=act == "sigmoid")
    pred.set_log_prior(log_prior(counts, GAMMAS[factor], factor, "last", B), mech, renorm)
    with torch.no_grad():
        got = pred.probs(torch.from_numpy(phi)).numpy()
    np.testing.assert_allclose(got, ours(phi, counts, *variant), rtol=1e-5, atol=1e-7)


def test_box_predictor_resolves_and_refuses_like_the_node(counts):
    lp = log_prior(counts, 0.5)
    soft, sig = FastRCNNOutputLayers(8, len(counts)), FastRCNNOutputLayers(8, len(counts), use_sigmoid=True)
    soft.set_log_prior(lp, "prob")
    sig.set_log_prior(lp, "prob")
    assert soft.renormalize is True and sig.renormalize is False
    with pytest.raises(NorcalError, match="activation=sigmoid"):
        sig.set_log_prior(lp, "exp", True)


# ----------------------------------------------------------------------------- large logits

@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_every_variant_stays_finite_at_extreme_logits(dtype):
    counts = np.array([1.0, 50.0, 2e4])
    fmax = float(np.finfo(dtype).max)
    phi = np.array([[fmax, -fmax, fmax, -fmax], [-fmax] * 4, [fmax] * 4, [0, 11.5, 12, 65000],
                    [1e4, -1e4, 0, 5e3]], np.float64).clip(-fmax, fmax).astype(dtype)
    for factor, (mech, renorm), act, bg in itertools.product(
            ("cdt", "ens"), SOFTMAX, ("softmax", "sigmoid"), ("last", "first")):
        if act == "sigmoid" and renorm:
            continue
        gamma = 2.0 if factor == "cdt" else 0.9
        lp = log_prior(counts, gamma, factor, bg, background_scale=0.5)
        for x in (phi, torch.from_numpy(phi)):
            p = calibrate(x, lp, mech, renorm, act, bg)
            p = p.numpy() if isinstance(p, torch.Tensor) else p
            assert p.dtype == dtype
            assert np.all(np.isfinite(p)), (factor, mech, renorm, act, bg, type(x).__name__, p)
            if renorm:
                np.testing.assert_allclose(p.astype(np.float64).sum(-1), 1, atol=2e-3)
