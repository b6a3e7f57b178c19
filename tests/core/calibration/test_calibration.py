"""NorCal math against the paper's direct formula and detectron2's own NorCal scores."""

import math

import numpy as np
import pytest
import torch

from norcal.core.calibration.formula import calibrate, log_factors, log_prior, softmax
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import load_table

from conftest import TINY

SETTINGS = {"cdt_g0.5": ("cdt", 0.5), "cdt_g1.0": ("cdt", 1.0), "ens_g0.999": ("ens", 0.999)}


def direct_formula(phi, counts, gamma, factor, bg_scale=1.0):
    """The authors' rule in float64: exp(phi_c)/a_c for foreground, background kept, renormalised."""
    phi = np.asarray(phi, np.float64)
    n = np.asarray(counts, np.float64)
    a = n ** gamma if factor == "cdt" else (1 - gamma ** n) / (1 - gamma)
    e = np.exp(phi)
    e[..., :-1] /= a
    e[..., -1] *= bg_scale
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def img0():
    return np.load(TINY / "golden" / "img0.npz")


@pytest.fixture(scope="module")
def lvis_counts():
    return load_table("lvis_v1").counts()


def test_gamma_zero_is_plain_softmax(img0, lvis_counts):
    phi = img0["cls_logits"]
    for factor in ("cdt", "ens"):
        p = calibrate(phi, log_prior(lvis_counts, 0.0, factor))
        e = np.exp(phi.astype(np.float64))
        np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True), atol=1e-6)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_log_space_equals_direct_formula(img0, lvis_counts, setting):
    factor, gamma = SETTINGS[setting]
    phi = img0["cls_logits"]
    expected = direct_formula(phi, lvis_counts, gamma, factor)
    got = calibrate(phi, log_prior(lvis_counts, gamma, factor))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=1e-4)
    got_t = calibrate(torch.from_numpy(phi), log_prior(lvis_counts, gamma, factor))
    np.testing.assert_allclose(got_t.numpy(), expected, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("setting", ["baseline", *sorted(SETTINGS)])
def test_matches_detectron2_norcal_scores(img0, lvis_counts, setting):
    """detectron2's final scores are the calibrated probabilities of (proposal, class)."""
    factor, gamma = SETTINGS.get(setting, ("cdt", 0.0))
    p = calibrate(img0["cls_logits"], log_prior(lvis_counts, gamma, factor))
    idx, cls = img0[f"{setting}/proposal_index"], img0[f"{setting}/classes"]
    np.testing.assert_allclose(p[idx, cls], img0[f"{setting}/scores"], atol=1e-6)


def test_exp_and_prob_mechanisms_agree_when_renormalised(img0, lvis_counts):
    lp = log_prior(lvis_counts, 0.7)
    phi = img0["cls_logits"][:50]
    np.testing.assert_allclose(calibrate(phi, lp, "exp"), calibrate(phi, lp, "prob"), atol=1e-7)
    # without renormalisation they are softmax(phi)/a_c: the direct formula on probabilities
    q = softmax(phi.astype(np.float64))
    q[:, :-1] /= lvis_counts ** 0.7
    np.testing.assert_allclose(calibrate(phi, lp, "prob", renormalize=False), q, atol=1e-7, rtol=1e-5)


def test_logit_mechanism_and_sigmoid_by_hand():
    phi = np.array([[2.0, -1.0, 0.5]])
    counts = [4.0, 1.0]
    lp = log_prior(counts, 1.0)  # a = [4, 1], background last
    z = np.array([2.0 / 4, -1.0, 0.5])
    np.testing.assert_allclose(calibrate(phi, lp, "logit")[0], np.exp(z) / np.exp(z).sum(), atol=1e-12)
    e = math.exp(2.0) / 4
    np.testing.assert_allclose(calibrate(phi, lp, activation="sigmoid")[0, 0], e / (e + 1), atol=1e-12)


def test_background_first_and_background_scale():
    phi = np.array([[0.3, 1.0, -2.0]])  # background FIRST
    counts = [9.0, 2.0]
    got = calibrate(phi, log_prior(counts, 0.5, background="first", background_scale=2.0))
    e = np.exp(phi[0])
    e[1:] /= np.array(counts) ** 0.5
    e[0] *= 2.0
    np.testing.assert_allclose(got[0], e / e.sum(), atol=1e-12)


def test_ens_factor_by_hand():
    g = 0.9
    np.testing.assert_allclose(log_factors([1, 3], g, "ens"), np.log([1.0, 1 + g + g * g]), atol=1e-12)


def test_no_overflow_at_extreme_logits():
    counts = np.array([1.0, 10.0, 1e5])
    lp = log_prior(counts, 1.5)
    for mag in (1e4, -1e4):
        phi = np.array([[mag, -mag, mag, 0.0], [mag, mag, mag, mag]], np.float32)
        for mech in ("exp", "prob", "logit"):
            p = calibrate(phi, lp, mech)
            assert np.all(np.isfinite(p)) and np.allclose(p.sum(-1), 1, atol=1e-5)
        p = calibrate(phi, lp, activation="sigmoid")
        assert np.all(np.isfinite(p))
    # at phi = 1e4 the direct formula overflows; log space gives the exact limit
    p = calibrate(np.array([[1e4, 1e4 - 1, 0.0, 0.0]], np.float32), log_prior([1.0, 1.0, 1.0], 1.0))
    np.testing.assert_allclose(p[0, :2], [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))], atol=1e-6)


def test_fp16_any_logits_stay_finite():
    counts = np.array([1.0, 50.0, 2e4])
    lp = log_prior(counts, 2.0, background_scale=0.5)
    fmax = float(np.finfo(np.float16).max)
    phi = np.array([[fmax, -fmax, fmax, -fmax], [-fmax] * 4, [fmax] * 4, [0, 11.5, 12, 65000]], np.float16)
    for x in (phi, torch.from_numpy(phi)):
        for mech, renorm in (("exp", True), ("prob", False), ("logit", True)):
            p = calibrate(x, lp, mech, renormalize=renorm)
            p = p.numpy() if isinstance(p, torch.Tensor) else p
            assert p.dtype == np.float16
            assert np.all(np.isfinite(p)), (mech, p)
        s = calibrate(x, lp, activation="sigmoid")
        s = s.numpy() if isinstance(s, torch.Tensor) else s
        assert np.all(np.isfinite(s))


@pytest.mark.parametrize("gamma,factor,msg", [(-0.1, "cdt", ">= 0"), (1.0, "ens", "[0, 1)"),
                                              (float("nan"), "cdt", "finite"), (0.5, "xyz", "factor")])
def test_bad_gamma(gamma, factor, msg):
    with pytest.raises(NorcalError, match=msg if msg != "[0, 1)" else r"\[0, 1\)"):
        log_prior([1.0, 2.0], gamma, factor)


@pytest.mark.parametrize("bad", [0.0, -3.0, float("inf"), float("nan")])
def test_bad_count_names_the_class(bad):
    with pytest.raises(NorcalError, match="'zebra'"):
        log_prior([5.0, bad], 0.5, names=["cat", "zebra"])


def test_torch_prior_stays_on_its_device():
    """A prior held as a tensor on the logits' device (a CUDA model's buffer) is used there, not
    read through numpy (which cannot read GPU memory); "meta" tensors stand in for CUDA here."""
    import torch

    from norcal.core.calibration.formula import calibrate

    logits = torch.randn(6, 5, dtype=torch.float32)
    prior = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.0], dtype=torch.float64)
    assert torch.equal(calibrate(logits, prior), calibrate(logits, prior.numpy()))
    out = calibrate(logits.to("meta"), prior.to("meta"))
    assert out.device.type == "meta" and out.shape == (6, 5)


def test_prior_beyond_float32_is_refused_naming_gamma():
    """The node stores log a_c = gamma * log N_c as float32 (largest 3.4028235e38): with N = 10
    (log 10 = 2.302585) gamma 1e38 gives 2.30e38 and fits, gamma 2e38 gives 4.61e38 and would be
    stored as inf; it is refused naming gamma and the class."""
    lp = log_prior([1.0, 10.0], 1e38, names=["cat", "zebra"])
    assert np.isfinite(lp.astype(np.float32)).all()
    assert lp[1] == pytest.approx(2.302585e38, rel=1e-6)
    with pytest.raises(NorcalError, match=r"gamma 2e\+38 makes the prior log a_c of class 1 \('zebra'\)") as e:
        log_prior([1.0, 10.0], 2e38, names=["cat", "zebra"])
    assert e.value.param == "gamma"


def test_calibration_resolve_refuses_a_prior_beyond_float32():
    """Refused when the calibration is resolved (before a checkpoint's slow export), not later."""
    from norcal.core.calibration.spec import Calibration
    from norcal.core.calibration.tables import CalibrationTable

    table = CalibrationTable(name="t", source="test", count_type="image", categories=[
        {"id": 1, "name": "a", "image_count": 1, "instance_count": 1, "frequency": "r"},
        {"id": 2, "name": "b", "image_count": 10, "instance_count": 10, "frequency": "r"}])
    assert Calibration(gamma=1e38, table=table).resolve(2).gamma == 1e38
    with pytest.raises(NorcalError, match="float32"):
        Calibration(gamma=1e300, table=table).resolve(2)
