"""ViTDet (tests/fixtures/d2_vitdet_tiny: LazyConfig config.yaml, sigmoid classifier with federated
loss, every image padded to the 320 square) through the commands a user runs: tune on a GT, export
at the chosen gamma, infer a batch of images larger and smaller than the square, eval.

The sweep's AP at the chosen gamma must be the AP of the exported model's own results; the results
must be detectron2's own NorCal detections (the fixture's goldens); the NorCal node must sit on the
sigmoid box classifier.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import golden as G
from conftest import FIXTURES
from norcal.cli import export_main, main

pytestmark = pytest.mark.slow  # a tune network pass and an export (about 10 s of CPU)

FIXTURE = FIXTURES / "d2_vitdet_tiny"
SETTING, GAMMA = "cdt_g0.5", 0.5  # the GT is detectron2's detections at this NorCal setting


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    d = tmp_path_factory.mktemp("vitdet_flow")
    table = G.manifest_table(FIXTURE)
    (d / "counts.json").write_text(json.dumps({"categories": table.categories}))
    gt = G.gt_from_golden(FIXTURE, d / "gt.json", setting=SETTING)
    ckpt, cfg = str(FIXTURE / "model_final.pth"), str(FIXTURE / "config.yaml")
    images = str(FIXTURE / "images")
    assert main(["tune", ckpt, "--config", cfg, "--gt", str(gt), "--images", images, "--table",
                 str(d / "counts.json"), "--gammas", "0:1:0.5", "--batch", "2", "--json", str(d / "sweep.json")]) == 0
    sweep = json.loads((d / "sweep.json").read_text())
    gamma = sweep["best"]["gamma"]
    assert export_main([ckpt, "--config", cfg, "--gamma", str(gamma), "--table", str(d / "counts.json"),
                        "-o", str(d / "model.onnx")]) == 0
    evals = {}
    for point in sweep["sweep"]:  # the other gammas: the exported graph re-calibrated (no network rebuilt)
        g, model = point["gamma"], d / "model.onnx"
        if g != gamma:
            model = d / f"model_{g:g}.onnx"
            assert export_main([str(d / "model.onnx"), "--gamma", str(g), "--table", str(d / "counts.json"),
                                "-o", str(model)]) == 0
        results = d / ("results.json" if g == gamma else f"results_{g:g}.json")
        assert main(["infer", str(model), images, "--image-ids", str(gt), "--batch", "3", "-o", str(results)]) == 0
        assert main(["eval", "--gt", str(gt), "--results", str(results), "--json", str(d / "eval.json")]) == 0
        evals[g] = json.loads((d / "eval.json").read_text())["stats"]
    return d, sweep, gamma, evals


def test_tunes_ap_at_each_gamma_is_the_exported_models_ap(flow):
    """The cached re-scoring gives at every gamma of the sweep (the chosen one exported from the
    checkpoint, the others that graph re-calibrated) what infer + eval of that model give."""
    _, sweep, gamma, evals = flow
    assert gamma == GAMMA  # the GT is detectron2's detections at gamma 0.5: the sweep finds it
    assert [p["gamma"] for p in sweep["sweep"]] == [0.0, 0.5, 1.0]
    for point in sweep["sweep"]:
        for key in ("AP", "AP50", "APc", "APf"):  # the GT has no rare class (APr -1 in both)
            assert point["stats"][key] == pytest.approx(evals[point["gamma"]][key], abs=1e-9), (point["gamma"], key)
    assert len({round(p["stats"]["AP"], 6) for p in sweep["sweep"]}) == 3  # gamma moves the AP


def test_results_are_detectron2s_norcal_detections(flow):
    """Each image resized by the rule (img1, img2 are larger than the square) and padded to the
    square, in one batch of three: detectron2's own detections at this gamma, in image pixels."""
    d = flow[0]
    results = json.loads((d / "results.json").read_text())
    for k in range(3):
        g = G.golden(k, FIXTURE)
        ours = [r for r in results if r["image_id"] == k + 1]
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (r["bbox"] for r in ours)])
        frac, _ = G.match_detections(g[f"{SETTING}/boxes_orig"], g[f"{SETTING}/scores"], g[f"{SETTING}/classes"],
                                     boxes, np.array([r["score"] for r in ours]),
                                     np.array([r["category_id"] - 1 for r in ours]), min_iou=0.99, max_score_diff=1e-4)
        assert frac >= 0.99, f"img{k}: {frac:.3f}"


def test_norcal_node_replaces_the_sigmoid_on_the_box_classifier(flow):
    d = flow[0]
    model = onnx.load(str(d / "model.onnx"))
    meta = {p.key: p.value for p in model.metadata_props}
    assert (meta["norcal.activation"], meta["norcal.gamma"], meta["norcal.input_size"]) == ("sigmoid", "0.5", "320")
    nodes = [n for n in model.graph.node if n.domain == "ai.norcal"]
    assert len(nodes) == 1
    node = nodes[0]
    producer = {o: n for n in model.graph.node for o in n.output}
    readers = [n for n in model.graph.node if node.input[0] in n.input]
    assert readers == [node]  # nothing else (no plain Sigmoid) reads the class logits
    src = producer[node.input[0]]
    while src.op_type == "Reshape":
        src = producer[src.input[0]]
    assert (src.op_type, src.name) == ("Gemm", "/roi_heads/box_predictor/cls_score/Gemm")
    body = next(f for f in model.functions if f.name == node.op_type and f.domain == node.domain)
    assert [n.op_type for n in body.node] == ["Sub", "Sigmoid"]
    # the background logit (last) gets no prior; the classes get gamma * log N_c
    prior = next(onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name == node.input[1])
    counts = G.manifest_table(FIXTURE).counts()
    np.testing.assert_allclose(prior.ravel(), np.append(GAMMA * np.log(counts), 0.0), rtol=1e-6)
    # after it, the background column is dropped, as detectron2's sigmoid head does
    assert [n.op_type for n in model.graph.node if node.output[0] in n.input] == ["Slice"]


def test_a_resize_beyond_the_square_is_refused(flow, capsys):
    d = flow[0]
    rc = main(["infer", str(d / "model.onnx"), str(FIXTURE / "images" / "img1.png"), "--max-size", "400",
               "-o", str(d / "big.json")])
    err = capsys.readouterr().err
    assert rc != 0 and not (d / "big.json").exists()
    assert "--max-size 400 exceeds the model's fixed 320x320 input (norcal.input_size=320)" in err
    assert "Traceback" not in err
