"""The simulated LVIS-scale benchmark: its GT, its detector, and its evaluation."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest

from norcal.core.errors import NorcalError
from norcal.evaluation import evaluate
from norcal.core.calibration.formula import calibrate, log_prior
from norcal.evaluation.simulate import (SimConfig, detect, make_split, proposal_logits, run_benchmark,
                                       simulate_gt)
from norcal.core.calibration.tables import load_table


@pytest.fixture(scope="module")
def table():
    return load_table("lvis_v1")


@pytest.fixture(scope="module")
def split(table):
    return make_split(table, 40, seed=3, config=SimConfig())


def test_gt_is_lvis_v1_shaped_and_federated(table):
    gt = simulate_gt(table, 300, seed=1)
    assert len(gt["categories"]) == 1203
    assert [c["image_count"] for c in gt["categories"]] == [c["image_count"] for c in table.categories]
    pos = {}
    for a in gt["annotations"]:
        pos.setdefault(a["image_id"], set()).add(a["category_id"])
    assert sum(bool(im["not_exhaustive_category_ids"]) for im in gt["images"]) > 0
    for im in gt["images"]:
        p = pos.get(im["id"], set())
        assert p and im["neg_category_ids"]
        assert not p & set(im["neg_category_ids"])  # negatives are absent classes
        assert set(im["not_exhaustive_category_ids"]) <= p
    # frequent classes are annotated in more images than rare ones
    freq = {c["id"]: c["frequency"] for c in gt["categories"]}
    per_group = {g: 0 for g in "rcf"}
    for p in pos.values():
        for c in p:
            per_group[freq[c]] += 1
    groups = table.group_counts()
    assert per_group["f"] / groups["f"] > per_group["c"] / groups["c"] > per_group["r"] / groups["r"]
    assert simulate_gt(table, 300, seed=1) == gt  # deterministic
    assert simulate_gt(table, 300, seed=2) != gt


def test_baseline_underscores_rare_classes(table, split):
    counts = table.counts()
    base, = detect(split, [log_prior(counts, 0.0)], SimConfig(), np.log(counts))
    assert len(base) == 300 * 40  # top-300 per image
    assert (base.scores > 1e-4).all()
    # the plain softmax gives an object's own class a far lower probability when it is rare
    phi = proposal_logits(split, 0, 40, np.log(counts), SimConfig().bias, SimConfig().signal)
    prob = calibrate(phi, log_prior(counts, 0.0))
    i, r = np.nonzero(split.labels >= 0)
    y = split.labels[i, r]
    own = prob[i, r, y]
    group = np.array(table.frequencies)[y]
    assert (group == "r").sum() >= 5
    assert np.median(own[group == "r"]) < 0.2 * np.median(own[group == "f"])
    # NorCal at gamma 1 removes the bias: the rare/frequent ratio comes close to 1
    fair = calibrate(phi, log_prior(counts, 1.0))[i, r, y]
    ratio = np.median(fair[group == "r"]) / np.median(fair[group == "f"])
    assert 0.3 < ratio < 3


def test_simulated_results_match_lvis_api(table, split, tmp_path):
    if not hasattr(np, "float"):
        np.float = float
    from lvis import LVIS, LVISEval, LVISResults

    counts = table.counts()
    dets, = detect(split, [log_prior(counts, 0.5)], SimConfig(), np.log(counts))
    res = [{"image_id": int(i), "category_id": int(c), "bbox": [float(v) for v in b], "score": float(s)}
           for i, c, b, s in zip(dets.image_ids, dets.category_ids, dets.boxes, dets.scores)]
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(split.gt))
    g = LVIS(str(path))
    e = LVISEval(g, LVISResults(g, copy.deepcopy(res)), "bbox")
    e.run()
    ours = evaluate(split.prepared, dets)
    assert ours.stats["AP"] > 0.05
    for key, value in e.results.items():
        assert ours.stats[key.split("@")[0]] == pytest.approx(value, abs=1e-4), key


def test_norcal_lifts_rare_ap_and_gamma_is_picked_on_train(table):
    config = SimConfig(images=150, train_images=100, seed=5)
    report = run_benchmark(table, [0.0, 0.75, 3.0], config)
    base, mid, extreme = report.val
    assert mid["APr"] > base["APr"] + 0.05
    assert mid["AP"] > base["AP"]
    assert extreme["APf"] < mid["APf"]  # over-calibration hurts the frequent classes
    assert report.gamma_train == 0.75
    doc = report.to_json()
    assert doc["gamma_picked_on_train"] == 0.75 and len(doc["val"]) == 3


def test_bad_arguments(table):
    with pytest.raises(NorcalError, match="images"):
        simulate_gt(table, 0, seed=0)
    with pytest.raises(NorcalError, match="gamma"):
        run_benchmark(table, [], SimConfig(images=2, train_images=2))


def test_tiny_table_with_few_classes():
    # fewer classes than the 12 negatives (and the up to 8 positives) drawn per image
    from norcal.core.calibration.tables import CalibrationTable

    tiny = CalibrationTable("tiny", "test", "image", [
        {"id": i + 1, "name": f"c{i}", "image_count": n, "instance_count": n, "frequency": f}
        for i, (n, f) in enumerate([(500, "f"), (40, "c"), (3, "r")])])
    gt = simulate_gt(tiny, 20, seed=0)
    assert len(gt["images"]) == 20 and gt["annotations"]
    report = run_benchmark(tiny, [0.0, 1.0], SimConfig(images=10, train_images=5, proposals=16))
    assert len(report.val) == 2


def test_cli(tmp_path):
    out = tmp_path / "sim.json"
    png = tmp_path / "sim.png"
    cmd = [sys.executable, "-m", "norcal", "simulate", "--images", "30", "--train-images", "20",
           "--gammas", "0,1", "--json", str(out), "--plot", str(png)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["gammas"] == [0.0, 1.0]
    assert set(doc["val"][0]) >= {"AP", "APr", "APc", "APf", "AR"}
    assert doc["gamma_picked_on_train"] in (0.0, 1.0)
    assert png.read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run([sys.executable, "-m", "norcal", "simulate", "--gammas", "0,x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "gammas" in bad.stderr
