"""Properties, checked on generated inputs (hypothesis).

Loaders: any JSON value in place of any field of a table, training annotation, GT or results
file (or the field removed) gives a valid load or one NorcalError line, never another
exception; what loads also evaluates or fails with a NorcalError.

NorCal math: finite scores for any finite logits (fp32, fp16); the authors' formula
exp(phi_c)/a_c renormalised, written naively in float64, where it does not overflow; a class's
score does not rise when its training count does.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from norcal.core.calibration.formula import calibrate, log_prior
from norcal.core.errors import NorcalError
from norcal.evaluation import evaluate

sys.path.insert(0, str(Path(__file__).resolve().parent / "datasets"))
from test_schemas import FORMATS, gt_doc, results_doc  # noqa: E402

DELETE = object()

json_leaves = (st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70)
               | st.floats() | st.text(max_size=6))
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)


def paths(node, prefix=()) -> list[tuple]:
    """The path of every value inside a JSON document."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out += paths(v, prefix + (k,))
    return out


def replaced(doc, path, value):
    node = doc
    for p in path[:-1]:
        node = node[p]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def use(fmt: str, loaded) -> None:
    """What a user does next with a loaded input."""
    if fmt in ("table", "annotations"):
        loaded.counts()
        loaded.counts("instance")
    elif fmt == "gt":
        evaluate(loaded, results_doc(), "bbox")
    else:
        evaluate(gt_doc(), loaded, "bbox")


# no example database: nothing is written into the checkout
PROPERTY = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
MATH = settings(max_examples=100, deadline=None, database=None)


@pytest.mark.parametrize("fmt", FORMATS)
@PROPERTY
@given(data=st.data())
def test_any_json_in_any_field_loads_or_is_one_clean_error(tmp_path, fmt, data):
    make, load = FORMATS[fmt]
    doc = make()
    path = data.draw(st.sampled_from(paths(doc)), label="path")
    value = data.draw(json_values | st.just(DELETE), label="value")
    file = tmp_path / "input.json"
    file.write_text(json.dumps(replaced(doc, path, value)))
    try:
        use(fmt, load(file))
    except NorcalError as e:
        msg = str(e)
        assert "\n" not in msg and (msg.startswith(f"{file}: ") or msg.startswith(("class ", "table "))), msg


@pytest.mark.parametrize("fmt", ["gt", "results"])
@PROPERTY
@given(data=st.data())
def test_any_json_in_memory_loads_or_is_one_clean_error(fmt, data):
    make, load = FORMATS[fmt]
    doc = make()
    path = data.draw(st.sampled_from(paths(doc)), label="path")
    value = data.draw(json_values | st.just(DELETE), label="value")
    try:
        use(fmt, load(replaced(doc, path, value)))
    except NorcalError as e:
        assert "\n" not in str(e)


@PROPERTY
@given(value=json_values)
def test_any_json_document_is_one_clean_error_or_a_load(tmp_path, value):
    file = tmp_path / "input.json"
    file.write_text(json.dumps(value))
    for fmt, (_, load) in FORMATS.items():
        try:
            load(file)
        except NorcalError as e:
            assert "\n" not in str(e)


# ---------------------------------------------------------------------------- NorCal math
counts_st = hnp.arrays(np.float64, st.integers(1, 6), elements=st.floats(1, 1e6))
gammas = st.floats(0, 3)


def logits_st(dtype, classes: int, bound: float | None = None):
    width = {np.float16: 16, np.float32: 32, np.float64: 64}[dtype]
    lim = bound if bound is not None else float(np.finfo(dtype).max)
    return hnp.arrays(dtype, st.tuples(st.integers(1, 4), st.just(classes + 1)),
                      elements=st.floats(-lim, lim, width=width, allow_nan=False, allow_infinity=False))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@MATH
@given(data=st.data(), counts=counts_st, gamma=gammas)
def test_finite_logits_give_finite_scores(dtype, data, counts, gamma):
    logits = data.draw(logits_st(dtype, len(counts)), label="logits")
    p = calibrate(logits, log_prior(counts, gamma))
    assert p.dtype == dtype and p.shape == logits.shape
    assert np.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()


def authors_formula(logits: np.ndarray, counts: np.ndarray, gamma: float) -> np.ndarray:
    """Tang et al. 2021, eq. 5 with b = 1: exp(phi_c) / a_c, a_c = N_c ** gamma, renormalised
    with the background's exp(phi_bg); naive float64, as written in the paper."""
    a = counts.astype(np.float64) ** gamma
    e = np.exp(logits.astype(np.float64))
    fg = e[:, :-1] / a
    denom = fg.sum(axis=1, keepdims=True) + e[:, -1:]
    return np.concatenate([fg, e[:, -1:]], axis=1) / denom


@MATH
@given(data=st.data(), counts=counts_st, gamma=gammas)
def test_equals_the_authors_formula(data, counts, gamma):
    logits = data.draw(logits_st(np.float64, len(counts), bound=300.0), label="logits")
    with np.errstate(over="raise", under="ignore"):
        want = authors_formula(logits, counts, gamma)
    assume(np.isfinite(want).all())
    got = calibrate(logits, log_prior(counts, gamma))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-300)
    # fp32 logits: the same to float32 precision
    got32 = calibrate(logits.astype(np.float32), log_prior(counts, gamma))
    want32 = authors_formula(logits.astype(np.float32), counts, gamma)
    np.testing.assert_allclose(got32, want32, rtol=1e-4, atol=1e-6)


@MATH
@given(data=st.data(), counts=counts_st, gamma=gammas, factor=st.floats(1, 1e3))
def test_a_larger_count_never_raises_the_class_score(data, counts, gamma, factor):
    logits = data.draw(logits_st(np.float64, len(counts), bound=50.0), label="logits")
    c = data.draw(st.integers(0, len(counts) - 1), label="class")
    more = counts.copy()
    more[c] *= factor
    before = calibrate(logits, log_prior(counts, gamma))[:, c]
    after = calibrate(logits, log_prior(more, gamma))[:, c]
    assert (after <= before * (1 + 1e-12) + 1e-300).all(), (before, after)
    if gamma * math.log(factor) > 1e-3:
        # and strictly lower where the score is neither vanishing nor saturated
        mid = (before > 1e-6) & (before < 1 - 1e-6)
        assert (after[mid] < before[mid]).all()
