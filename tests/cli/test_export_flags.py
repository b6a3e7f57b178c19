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

from norcal.cli import export_main

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
