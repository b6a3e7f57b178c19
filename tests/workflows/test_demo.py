"""norcal demo: the bundled example end to end (one NorCal gamma, to keep it quick)."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

SYNTH = Path(__file__).parents[2] / "norcal" / "examples" / "d2_synth_trained"
GAMMA = 1.0


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from norcal.workflows.demo import run_demo

    out = tmp_path_factory.mktemp("demo")
    return run_demo(None, out, gammas=[GAMMA], batch_size=8)


def test_default_data_is_the_fixture():
    from norcal.workflows.demo import default_data_dir

    assert default_data_dir() == SYNTH.resolve()
    assert (default_data_dir() / "model_final.pth").is_file()


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    from norcal.cli import main

    (tmp_path / "val").mkdir()
    assert main(["demo", "--data", str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "missing model_final.pth, config.yaml, train_annotations.json, val.json" in err


def test_outputs_written(demo):
    out = demo.output_dir
    names = {p.name for p in out.iterdir()}
    assert {"model_baseline.onnx", "model_norcal_g1.onnx", "results_baseline.json",
            "results_norcal_g1.json", "table.json", "ap_vs_gamma.png", "summary.json"} <= names
    assert (out / "ap_vs_gamma.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert [s["gamma"] for s in summary["settings"]] == [None, GAMMA]
    assert summary["num_images"] == 48
    res = json.loads((out / "results_norcal_g1.json").read_text())
    assert len(res) == demo.settings[1].num_detections
    assert {"image_id", "category_id", "bbox", "score", "segmentation"} <= set(res[0])
    # at most 300 per image, all 48 images present
    per_image = np.bincount([r["image_id"] - 100001 for r in res])
    assert len(per_image) == 48 and per_image.max() <= 300


def test_models_carry_what_was_baked_in(demo):
    import onnx

    base = {p.key: p.value for p in onnx.load(str(demo.settings[0].model_path)).metadata_props}
    cal = {p.key: p.value for p in onnx.load(str(demo.settings[1].model_path)).metadata_props}
    assert "norcal.gamma" not in base
    assert float(cal["norcal.gamma"]) == GAMMA and cal["norcal.factor"] == "cdt"


def test_table_structure(demo):
    from norcal.workflows.demo import comparison_table

    t = comparison_table(demo)
    headers = [str(c.header) for c in t.columns]
    assert headers == ["metric", "baseline", f"γ={GAMMA:g} *", f"Δ γ={GAMMA:g}"]
    metrics = list(t.columns[0]._cells)
    assert metrics == [f"{k} {m}" for k in ("bbox", "segm") for m in ("AP", "APr", "APc", "APf")] \
        + ["detections"]
    # the cells are the measured numbers, in %
    b, n = demo.settings
    assert t.columns[1]._cells[1] == f"{100 * b.bbox['APr']:.2f}"
    assert t.columns[2]._cells[4] == f"{100 * n.segm['AP']:.2f}"
    assert t.columns[3]._cells[1] == f"{100 * (n.bbox['APr'] - b.bbox['APr']):+.2f}"


def test_norcal_raises_rare_ap(demo):
    b, n = demo.settings
    assert n.bbox["APr"] > b.bbox["APr"] + 0.02
    assert n.segm["APr"] > b.segm["APr"]
    assert n.bbox["AP"] > b.bbox["AP"]


def test_numbers_equal_lvis_api(demo):
    # the demo's baseline bbox numbers from its own results file, by the official lvis-api
    lvis = pytest.importorskip("lvis")
    import logging

    if not hasattr(np, "float"):
        np.float = float  # lvis 0.5.3 uses the alias removed in numpy 1.24
    logging.getLogger("lvis").setLevel(logging.ERROR)
    gt = lvis.LVIS(str(SYNTH / "val.json"))
    setting = demo.settings[0]
    ev = lvis.LVISEval(gt, lvis.LVISResults(gt, str(setting.results_path), max_dets=300), "bbox")
    ev.run()
    res = ev.get_results()
    for ours, theirs in (("AP", "AP"), ("APr", "APr"), ("APc", "APc"), ("APf", "APf")):
        assert setting.bbox[ours] == pytest.approx(res[theirs], abs=1e-4), ours


def test_needs_a_norcal_gamma(tmp_path):
    from norcal.workflows.demo import run_demo
    from norcal.core.errors import NorcalError

    with pytest.raises(NorcalError, match="at least one NorCal gamma"):
        run_demo(None, tmp_path, gammas=[0.0])
