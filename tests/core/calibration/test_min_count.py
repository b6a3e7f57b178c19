"""--min-count K: counts below K are raised to K, counted, recorded; without it a zero count is an error."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from norcal.cli import export_main
from norcal.core.calibration.formula import calibrate, clamp_counts, log_prior
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import load_table
from norcal.export.graph.calibrate import calibrate_graph
from norcal.export.graph.surgery import norcal_metadata

from onnx_graphs import classifier_graph, gemm_weights

COUNTS = [0, 1, 3, 10]  # a class never seen in training, two rare ones, a common one


def write_table(tmp_path, counts):
    cats = [{"id": i + 1, "name": f"class{i}", "image_count": c, "instance_count": c}
            for i, c in enumerate(counts)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"name": "toy", "categories": cats}))
    return p


def test_clamp_by_hand():
    clamped, n = clamp_counts(COUNTS, 3)
    np.testing.assert_array_equal(clamped, [3.0, 3.0, 3.0, 10.0])
    assert n == 2  # 0 and 1; 3 is not below 3
    np.testing.assert_allclose(log_prior(clamped, 0.5), [0.5 * np.log(3)] * 3 + [0.5 * np.log(10), 0.0])
    assert clamp_counts(COUNTS, 0.5)[1] == 1


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_broken_count_is_still_an_error(bad):
    with pytest.raises(NorcalError, match="'b'"):
        clamp_counts([0.0, bad], 2, names=["a", "b"])


@pytest.mark.parametrize("k", [0.0, -2.0, float("nan")])
def test_bad_min_count(k):
    with pytest.raises(NorcalError, match="min_count must be a finite number > 0"):
        clamp_counts([1.0], k)


def test_table_default_refuses_zero_and_min_count_clamps(tmp_path):
    t = load_table(write_table(tmp_path, COUNTS))
    with pytest.raises(NorcalError, match="class 0 \\('class0'\\) has training count 0.0"):
        t.counts()
    counts, n = t.clamped_counts("image", 2)
    np.testing.assert_array_equal(counts, [2.0, 2.0, 3.0, 10.0])
    assert n == 2
    np.testing.assert_array_equal(t.counts("instance", 2), counts)


def test_lvis_v1_clamp_count_matches_the_category_list():
    t = load_table("lvis_v1")
    raw = np.array([c["image_count"] for c in t.categories])
    counts, n = t.clamped_counts("image", 10)
    assert n == int((raw < 10).sum()) and 0 < n < 337  # some, not all, rare classes (<= 10 images)
    np.testing.assert_array_equal(counts, np.maximum(raw, 10))


def test_metadata_records_min_count_and_scores_use_the_clamped_counts(tmp_path):
    table = write_table(tmp_path, COUNTS)
    model = classifier_graph(num_classes=4)
    with pytest.raises(NorcalError, match="class0"):
        calibrate_graph(model, 0.5, str(table))
    out = calibrate_graph(model, 0.5, str(table), min_count=2)
    meta = norcal_metadata(out)
    assert meta["norcal.min_count"] == "2" and meta["norcal.min_count_clamped"] == "2"
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    w, b = gemm_weights(model)
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = calibrate(x @ w.T + b, log_prior([2.0, 2.0, 3.0, 10.0], 0.5))
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, atol=1e-6)
    # a later calibration without --min-count leaves no stale record
    again = calibrate_graph(out, 0.5, load_table(write_table(tmp_path, [4, 1, 3, 10])))
    assert "norcal.min_count" not in norcal_metadata(again)
    assert "norcal.min_count_clamped" not in norcal_metadata(again)


def test_cli_prints_how_many_classes_were_clamped(tmp_path, capsys):
    table = write_table(tmp_path, COUNTS)
    src = tmp_path / "det.onnx"
    onnx.save(classifier_graph(num_classes=4), str(src))
    out = tmp_path / "out.onnx"
    assert export_main([str(src), "--gamma", "0.5", "--table", str(table), "--min-count", "2",
                        "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "--min-count 2: 2 of 4 classes had a training count below 2 and were counted as 2" in printed
    assert norcal_metadata(onnx.load(str(out)))["norcal.min_count"] == "2"
    # the default stays: a zero count is a one-line error naming the class
    assert export_main([str(src), "--gamma", "0.5", "--table", str(table), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'class0'" in err
    assert export_main([str(out), "--strip", "--min-count", "2", "-o", str(tmp_path / "p.onnx")]) == 2
    assert "--min-count" in capsys.readouterr().err


def test_tune_sweeps_with_the_clamped_counts(tmp_path):
    from norcal.workflows.tune_sweep import _priors

    t = load_table(write_table(tmp_path, COUNTS))
    priors, n = _priors(t, [0.0, 0.5], "cdt", 2)
    assert priors[0] is None and n == 2
    np.testing.assert_allclose(priors[1], log_prior([2.0, 2.0, 3.0, 10.0], 0.5))
    with pytest.raises(NorcalError, match="'class0'"):
        _priors(t, [0.5], "cdt")
