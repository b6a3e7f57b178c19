"""norcal demo: the bundled example end to end (a 3-gamma tuning grid, to keep it quick)."""

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # runs the whole demo: tune, export, ONNX Runtime on the validation images


from conftest import SYNTH  # noqa: E402
GRID = (0.0, 0.4, 0.8)
GAMMA = 0.8  # what tuning on the 120 training images picks from GRID (asserted below)
VAL_GAMMA = 0.4  # what the same sweep on the validation images would pick
PICTURES = 2


@pytest.fixture(scope="module")
def demo_cli(tmp_path_factory):
    """One `norcal demo` run as users run it (the CLI: progress bars, printing, the staged output
    folder), shared by the tests: (exit code, run_demo's result, the output folder, what it printed)."""
    import contextlib
    import io

    import norcal.workflows.demo as workflow
    from norcal.cli import main

    out, printed, results, run_demo = tmp_path_factory.mktemp("demo") / "out", io.StringIO(), [], workflow.run_demo

    def kept(*args, **kwargs):
        results.append(run_demo(*args, **kwargs))
        return results[-1]

    workflow.run_demo = kept
    try:
        with contextlib.redirect_stdout(printed):
            code = main(["demo", "--output", str(out), "--gammas", ",".join(map(str, GRID)), "--batch", "8",
                         "--pictures", str(PICTURES)])
    finally:
        workflow.run_demo = run_demo
    return code, results[0] if results else None, out, printed.getvalue()


@pytest.fixture(scope="module")
def demo(demo_cli):
    return demo_cli[1]


def test_default_data_is_the_fixture():
    from norcal.workflows.demo import default_data_dir

    assert default_data_dir() == SYNTH.resolve()
    assert (default_data_dir() / "model_final.pth").is_file()


def test_missing_data_is_a_clear_error(tmp_path, capsys):
    from norcal.cli import main

    data = tmp_path / "data"
    (data / "val").mkdir(parents=True)
    assert main(["demo", "--data", str(data), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "missing model_final.pth, config.yaml, train_annotations.json, val.json" in err
    assert "train_subset.json, train_subset" in err


def test_missing_bundled_data_says_where_to_get_it(tmp_path, monkeypatch):
    from norcal.core.errors import NorcalError
    from norcal.workflows import demo

    monkeypatch.setattr(demo, "default_data_dir", lambda progress=None: tmp_path / "gone")
    with pytest.raises(NorcalError) as e:
        demo.check_data_dir(None)
    msg = str(e.value)
    assert "\n" not in msg and "norcal/examples/d2_synth_trained/" in msg and e.value.param == "data"
    from norcal.cli.commands.demo import FLAGS
    from norcal.cli.options import error_line

    assert error_line(e.value, FLAGS).endswith("pass its folder as --data")


def test_outputs_written(demo):
    out = demo.output_dir
    names = {p.name for p in out.iterdir()}
    assert {"model_baseline.onnx", "model_norcal_g0.8.onnx", "model_norcal_g0.4.onnx",
            "results_baseline.json", "results_norcal_g0.8.json", "results_norcal_g0.4.json",
            "table.json", "ap_vs_gamma.png", "summary.json", "pictures"} <= names
    assert (out / "ap_vs_gamma.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert [s["gamma"] for s in summary["settings"]] == [None, GAMMA, VAL_GAMMA]
    assert summary["tuned_gamma"] == GAMMA and summary["best_val_gamma"] == VAL_GAMMA
    assert summary["num_images"] == 48 and summary["tuning"]["num_images"] == 120
    assert [p["gamma"] for p in summary["tuning"]["sweep"]] == list(GRID)
    res = json.loads((out / "results_norcal_g0.8.json").read_text())
    assert len(res) == demo.settings[1].num_detections
    assert {"image_id", "category_id", "bbox", "score", "segmentation"} <= set(res[0])
    # at most 300 per image, all 48 images present
    per_image = np.bincount([r["image_id"] - 100001 for r in res])
    assert len(per_image) == 48 and per_image.max() <= 300


def test_models_carry_what_was_baked_in(demo):
    import onnx

    base = {p.key: p.value for p in onnx.load(str(demo.settings[0].model_path)).metadata_props}
    cal = {p.key: p.value for p in onnx.load(str(demo.tuned.model_path)).metadata_props}
    assert "norcal.gamma" not in base
    assert float(cal["norcal.gamma"]) == GAMMA and cal["norcal.factor"] == "cdt"


def test_table_structure(demo):
    from norcal.cli.commands.demo import comparison_table

    t = comparison_table(demo)
    headers = [str(c.header) for c in t.columns]
    assert headers == ["metric", "baseline", f"tuned γ={GAMMA:g}", "Δ tuned", f"best val γ={VAL_GAMMA:g}"]
    metrics = list(t.columns[0]._cells)
    assert metrics == [f"{k} {m}" for k in ("bbox", "segm", "boundary AP^Fixed")
                       for m in ("AP", "APr", "APc", "APf")] + ["detections"]
    # the cells are the measured numbers, in %
    b, n, ref = demo.baseline, demo.tuned, demo.best_val
    assert t.columns[1]._cells[1] == f"{100 * b.bbox['APr']:.2f}"
    assert t.columns[2]._cells[4] == f"{100 * n.segm['AP']:.2f}"
    assert t.columns[3]._cells[1] == f"{100 * (n.bbox['APr'] - b.bbox['APr']):+.2f}"
    assert t.columns[4]._cells[0] == f"{100 * ref.bbox['AP']:.2f}"
    assert t.columns[2]._cells[9] == f"{100 * n.boundary_fixed['APr']:.2f}"
    assert t.columns[4]._cells[12] == str(ref.num_detections)


def test_boundary_fixed_matches_faster_coco_eval(demo):
    # with <= 300 detections per image and < 10,000 per class, AP^Fixed is LVIS AP at 300 per
    # image: faster-coco-eval's boundary mode is an independent reference for the summary's row
    from faster_coco_eval import COCO, COCOeval_faster

    summary = json.loads((demo.output_dir / "summary.json").read_text())
    for s in summary["settings"]:
        gt = COCO(str(SYNTH / "val.json"))
        e = COCOeval_faster(gt, gt.loadRes(json.loads(Path(s["results"]).read_text())), "boundary",
                            lvis_style=True, print_function=lambda *_: None)
        e.params.maxDets = [300]
        e.run()
        theirs = e.stats_as_dict
        for k, name in (("AP", "AP_all"), ("APr", "APr"), ("APc", "APc"), ("APf", "APf")):
            assert s["boundary_fixed"][k] == pytest.approx(theirs[name], abs=1e-3), (s["label"], k)


def test_norcal_raises_rare_ap(demo):
    # NorCal at the gamma tuned on training images, measured on the validation images
    b, n = demo.baseline, demo.tuned
    assert n.gamma == GAMMA
    assert n.bbox["APr"] > b.bbox["APr"] + 0.02
    assert n.segm["APr"] > b.segm["APr"]
    assert n.bbox["AP"] > b.bbox["AP"]


def test_tuned_gamma_is_what_norcal_tune_picks(demo, tmp_path):
    from norcal.cli import main

    sweep = tmp_path / "sweep.json"
    assert main(["tune", str(SYNTH / "model_final.pth"), "--config", str(SYNTH / "config.yaml"),
                 "--gt", str(SYNTH / "train_subset.json"), "--images", str(SYNTH / "train_subset"),
                 "--table", str(SYNTH / "train_annotations.json"),
                 "--gammas", ",".join(f"{g:g}" for g in GRID), "--json", str(sweep)]) == 0
    doc = json.loads(sweep.read_text())
    assert doc["num_images"] == 120
    assert doc["best"]["gamma"] == demo.tuned.gamma == demo.tuning.best.gamma
    for cli_point, point in zip(doc["sweep"], demo.tuning.points):
        assert cli_point["gamma"] == point.gamma
        assert cli_point["stats"]["AP"] == pytest.approx(point.stats["AP"], abs=1e-9)


def test_best_validation_gamma_and_sweep_match_the_deployed_models(demo):
    # the reference column is the validation sweep's best gamma, and the sweep's cached
    # re-scoring gives what the exported ONNX models measure
    val = demo.validation
    assert [p.gamma for p in val.points] == list(GRID)
    aps = [p.stats["AP"] for p in val.points]
    assert demo.best_val.gamma == val.points[int(np.argmax(aps))].gamma == VAL_GAMMA
    by_gamma = {p.gamma: p.stats for p in val.points}
    for s in demo.settings:
        for k in ("AP", "APr", "APc", "APf"):
            assert s.bbox[k] == pytest.approx(by_gamma[s.gamma or 0.0][k], abs=1e-4), (s.label, k)


def test_pictures(demo):
    from PIL import Image

    from norcal.runtime.draw import picture_size

    assert len(demo.pictures) == PICTURES
    for path in demo.pictures:
        assert path.parent == demo.output_dir / "pictures" and path.suffix == ".png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            assert im.size == picture_size((256, 256), 2)  # baseline | NorCal, 256 px images


def test_infer_draw(demo, tmp_path):
    """`norcal infer --draw` pictures the NorCal model beside its stripped baseline, and the
    results it writes are those of a run without --draw."""
    from PIL import Image

    from norcal.cli import main
    from norcal.runtime.draw import picture_size

    images = [str(SYNTH / "val" / f"{i}.png") for i in (100007, 100017)]
    common = ["infer", str(demo.tuned.model_path), *images, "--table", str(SYNTH / "train_annotations.json")]
    assert main([*common, "-o", str(tmp_path / "plain.json")]) == 0
    assert main([*common, "-o", str(tmp_path / "drawn.json"), "--draw", str(tmp_path / "pics"),
                 "--draw-count", "1"]) == 0
    assert json.loads((tmp_path / "drawn.json").read_text()) == \
        json.loads((tmp_path / "plain.json").read_text())
    assert sorted(p.name for p in (tmp_path / "pics").iterdir()) == ["100007.png"]
    with Image.open(tmp_path / "pics" / "100007.png") as im:
        assert im.size == picture_size((256, 256), 2)


def test_infer_draw_decodes_each_image_once(demo, tmp_path, monkeypatch):
    """A drawn image's pixels, decoded for the run, are the ones pictured and the ones the
    stripped baseline runs on: each file decoded once (PIL's load counted by file)."""
    from collections import Counter

    from PIL import ImageFile

    from norcal.cli import main

    decoded = Counter()
    load = ImageFile.ImageFile.load

    def counting_load(self):
        if getattr(self, "_im", None) is None:  # pixels not decoded yet
            decoded[Path(self.filename).name] += 1
        return load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counting_load)
    images = [str(SYNTH / "val" / f"{i}.png") for i in (100007, 100017, 100027)]
    assert main(["infer", str(demo.tuned.model_path), *images, "--table", str(SYNTH / "train_annotations.json"),
                 "-o", str(tmp_path / "drawn.json"), "--draw", str(tmp_path / "pics"), "--draw-count", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "pics").iterdir()) == ["100007.png", "100017.png"]
    assert decoded == {"100007.png": 1, "100017.png": 1, "100027.png": 1}


def test_infer_draw_needs_a_table(demo, tmp_path, capsys):
    from norcal.cli import main

    rc = main(["infer", str(demo.tuned.model_path), str(SYNTH / "val" / "100007.png"),
               "-o", str(tmp_path / "r.json"), "--draw", str(tmp_path / "pics")])
    assert rc == 2 and "--draw needs class names" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_numbers_equal_lvis_api(demo):
    # the demo's baseline bbox numbers from its own results file, by the official lvis-api
    import logging

    import lvis

    if not hasattr(np, "float"):
        np.float = float  # lvis 0.5.3 uses the alias removed in numpy 1.24
    logging.getLogger("lvis").setLevel(logging.ERROR)
    gt = lvis.LVIS(str(SYNTH / "val.json"))
    setting = demo.baseline
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
    with pytest.raises(NorcalError, match="pictures"):
        run_demo(None, tmp_path, gammas=GRID, pictures=-1)


def test_failed_demo_leaves_an_earlier_output_folder_as_it_was(tmp_path, monkeypatch):
    """The demo's folder is replaced whole or not at all (here the work fails half-way)."""
    import norcal.workflows.demo as demo_module
    from norcal.core.errors import NorcalError

    out = tmp_path / "demo"
    out.mkdir()
    (out / "summary.json").write_text("from an earlier demo")

    def fails_half_way(data, built, *args):
        (built / "model_baseline.onnx").write_bytes(b"half written")
        raise NorcalError("the evaluation failed")

    monkeypatch.setattr(demo_module, "_run_demo", fails_half_way)
    with pytest.raises(NorcalError, match="evaluation failed"):
        demo_module.run_demo(output_dir=out)
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    assert (out / "summary.json").read_text() == "from an earlier demo"
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]  # no staging folder left


def test_cli_demo_output_that_is_a_file_is_refused_first(tmp_path, capsys):
    from norcal.cli import main

    target = tmp_path / "taken"
    target.write_text("keep")
    assert main(["demo", "--output", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err
    assert target.read_text() == "keep"


def test_cli_demo_runs_end_to_end(demo_cli):
    """`norcal demo` itself (progress bars, printing, the staged output folder): the run every
    other test here reads."""
    code, result, out, text = demo_cli
    assert code == 0 and result.output_dir == out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tuned_gamma"] == GAMMA and Path(summary["plot"]).parent == out
    assert all(Path(s["model"]).is_file() for s in summary["settings"])
    assert "baseline" in text and "tuned" in text
