"""One resolve per export: the table read once, the prior computed once, and the node's constant
the paper's log a_c = gamma * log N_c on the foreground logits, the background slot untouched."""

import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import norcal
from norcal.core.calibration import spec as calibration_spec
from norcal.core.calibration import tables
from norcal.core.calibration.spec import DEFAULT_BACKGROUND, Calibration, ResolvedCalibration

from conftest import TINY
from onnx_graphs import classifier_graph, gemm_weights

COUNTS = [1, 5, 50, 500]


def _table_file(path):
    cats = [{"id": i + 1, "name": f"c{i}", "image_count": n, "instance_count": n} for i, n in enumerate(COUNTS)]
    path.write_text(json.dumps({"name": "toy", "categories": cats}))
    return path


@pytest.fixture
def calls(monkeypatch):
    """Counts of Calibration.resolve calls and of table loads (by what was loaded)."""
    seen = {"resolve": 0, "load": []}
    resolve, load = Calibration.resolve, tables.load_table

    def counting_resolve(self, num_classes):
        seen["resolve"] += 1
        return resolve(self, num_classes)

    def counting_load(name_or_path):
        seen["load"].append(str(name_or_path))
        return load(name_or_path)

    monkeypatch.setattr(Calibration, "resolve", counting_resolve)
    monkeypatch.setattr(tables, "load_table", counting_load)
    monkeypatch.setattr(calibration_spec, "load_table", counting_load)
    return seen


def test_calibrate_onnx_resolves_an_unresolved_calibration_once(tmp_path, calls):
    table = _table_file(tmp_path / "t.json")
    norcal.calibrate_onnx(classifier_graph(num_classes=4), norcal.NorCal(gamma=0.5, table=table))
    assert calls["resolve"] == 1 and calls["load"] == [str(table)]


def test_calibrate_onnx_uses_a_resolved_calibration_as_it_is(tmp_path, calls):
    cal = Calibration(gamma=0.5, table=_table_file(tmp_path / "t.json")).resolve(4)
    assert isinstance(cal, ResolvedCalibration) and cal.resolve(4) is cal
    norcal.calibrate_onnx(classifier_graph(num_classes=4), cal)
    assert calls["resolve"] == 1 and len(calls["load"]) == 1  # the resolve above only
    with pytest.raises(norcal.NorcalError, match="has 4 classes but the model has 3"):
        cal.resolve(3)


def test_node_constant_is_gamma_log_counts_with_the_background_untouched(tmp_path):
    gamma = 0.7
    model = norcal.calibrate_onnx(classifier_graph(num_classes=4),
                                  norcal.NorCal(gamma=gamma, table=_table_file(tmp_path / "t.json")))
    expected = np.array([gamma * np.log(n) for n in COUNTS] + [0.0])  # background last, log b = 0
    prior = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}["norcal.log_prior"]
    np.testing.assert_allclose(prior, expected, rtol=1e-6)
    assert DEFAULT_BACKGROUND == "last"  # detectron2's slot, the one a graph that records none gets
    # and what the node computes: softmax over the logits with gamma*log(N_c) taken off the classes
    x = np.random.default_rng(1).normal(size=(6, 8)).astype(np.float32)
    w, b = gemm_weights(classifier_graph(num_classes=4))
    z = x @ w.T + b - expected
    want = np.exp(z - z.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_export_checkpoint_resolves_once_and_reads_the_table_once(tmp_path, calls):
    norcal.export_checkpoint(TINY / "model_final.pth", tmp_path / "tiny.onnx", norcal.NorCal(gamma=0.5, table="lvis_v1"),
                             norcal.CheckpointExport(config=TINY / "config.yaml", batch=1))
    assert calls["resolve"] == 1 and calls["load"] == ["lvis_v1"]
