"""norcal tune: the cached re-scoring against full ONNX Runtime runs and detectron2's outputs."""

import json

import numpy as np
import pytest

from conftest import SYNTH
from golden import match_detections

pytestmark = pytest.mark.slow  # caches head outputs and sweeps gamma on real images


GOLDEN_IDS = list(range(100001, 100009))
GOLDEN_SETTINGS = {"baseline": 0.0, "cdt_g0.25": 0.25, "cdt_g0.5": 0.5, "cdt_g0.75": 0.75,
                   "cdt_g1.0": 1.0}


# --------------------------------------------------------------------------- the cache

@pytest.fixture(scope="module")
def detector():
    from norcal.export.families.detectron2.loader import load_model

    return load_model(SYNTH / "model_final.pth", SYNTH / "config.yaml")


@pytest.fixture(scope="module")
def table():
    from norcal.core.calibration.tables import build_table

    return build_table(SYNTH / "train_annotations.json")


@pytest.fixture(scope="module")
def family_detector(detector):
    """The same model as the detector family's :class:`Detector`."""
    from norcal.export.families.detectron2.family import detector_of

    return detector_of(*detector)


@pytest.fixture(scope="module")
def cache(family_detector):
    from norcal.workflows.tune_cache import cache_images

    pairs = [(i, SYNTH / "val" / f"{i}.png") for i in GOLDEN_IDS]
    # batch 3: the last batch is partial, so batching must not change anything
    return cache_images(family_detector, pairs, [None], batch_size=3)


def rescored(detector, cache, table, gamma, mechanism="exp", factor="cdt"):
    from norcal.core.calibration.formula import log_prior
    from norcal.export.families.detectron2.family import detector_of
    from norcal.workflows.tune_cache import rescore_images

    prior = None if gamma == 0 else log_prior(table.counts(), gamma, factor)
    return rescore_images(detector_of(*detector), cache, 0, prior, mechanism, batch_size=5)


def test_cache_shapes(cache, detector):
    spec = detector[0]
    n = len(GOLDEN_IDS)
    p = cache.proposals.shape[1]
    assert cache.cls_logits.shape == (n, p, spec.num_classes + 1)
    assert cache.box_deltas.shape == (n, p, 4 * spec.num_classes)
    assert cache.valid.shape == (n, p) and cache.valid.any(dim=1).all()
    assert cache.image_sizes.tolist() == [[256, 256]] * n
    assert cache.image_ids == GOLDEN_IDS


@pytest.mark.parametrize("setting", list(GOLDEN_SETTINGS))
def test_rescoring_matches_detectron2(setting, detector, cache, table):
    # detectron2's own detections at each gamma (the authors' NorCal, N_c = training images)
    dets = rescored(detector, cache, table, GOLDEN_SETTINGS[setting])
    for image_id, det in zip(GOLDEN_IDS, dets):
        with np.load(SYNTH / "golden" / f"{image_id}.npz") as z:
            g = z[f"{setting}/boxes_orig"], z[f"{setting}/scores"], z[f"{setting}/classes"]
        frac, _ = match_detections(*g, det.boxes, det.scores, det.classes)
        assert frac >= 0.99, f"{setting} image {image_id}: {frac:.3f} matched"


# --------------------------------------------------------------------------- vs full ONNX runs

@pytest.fixture(scope="module")
def plain_onnx(detector):
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model

    spec, model = detector
    return export_detector(model, spec)


def onnx_detections(model, tmp_path, ids, batch_size=4):
    from norcal.core.files.onnx_io import save_onnx
    from norcal.runtime.inference import run_images
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner

    path = tmp_path / "model.onnx"
    save_onnx(model, path)
    runner = OnnxRuntimeRunner(path)
    return [d for _, d in run_images(runner, [SYNTH / "val" / f"{i}.png" for i in ids], batch_size)]


@pytest.mark.parametrize("gamma, mechanism, factor", [
    (0.5, "exp", "cdt"), (1.0, "exp", "cdt"), (1.0, "logit", "cdt"), (0.9, "exp", "ens"),
])
def test_rescoring_equals_exported_model(gamma, mechanism, factor, detector, cache, table,
                                         plain_onnx, tmp_path):
    # norcal-export's graph with this gamma, run whole by ONNX Runtime, on 4 images
    from norcal.export.graph.calibrate import calibrate_graph

    ids = GOLDEN_IDS[:4]
    model = calibrate_graph(plain_onnx, gamma, table, factor=factor, mechanism=mechanism)
    full = onnx_detections(model, tmp_path, ids)
    ours = rescored(detector, cache, table, gamma, mechanism, factor)[:4]
    for image_id, a, b in zip(ids, full, ours):
        assert len(a) > 50
        frac, _ = match_detections(a.boxes, a.scores, a.classes, b.boxes, b.scores, b.classes)
        assert frac >= 0.99, f"gamma {gamma} {mechanism} {factor} image {image_id}: {frac:.3f}"
        assert abs(len(a) - len(b)) <= max(1, len(a) // 100)


def test_rescoring_differs_between_gammas(detector, cache, table):
    # the equality tests above would be empty if gamma did not change the detections
    a = rescored(detector, cache, table, 0.0)[0]
    b = rescored(detector, cache, table, 1.0)[0]
    frac, _ = match_detections(a.boxes, a.scores, a.classes, b.boxes, b.scores, b.classes)
    assert frac < 0.5


# --------------------------------------------------------------------------- the command

@pytest.fixture(scope="module")
def subset_gt(tmp_path_factory):
    """val.json restricted to the 8 golden images (LVIS fields kept)."""
    data = json.loads((SYNTH / "val.json").read_text())
    keep = set(GOLDEN_IDS)
    data["images"] = [im for im in data["images"] if im["id"] in keep]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in keep]
    path = tmp_path_factory.mktemp("gt") / "val8.json"
    path.write_text(json.dumps(data))
    return path


def test_tune_cli_baseline_equals_norcal_eval(subset_gt, plain_onnx, tmp_path, capsys):
    from norcal.cli import main
    from norcal.core.files.onnx_io import save_onnx

    sweep_json, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    rc = main(["tune", str(SYNTH / "model_final.pth"), "--config", str(SYNTH / "config.yaml"),
               "--gt", str(subset_gt), "--images", str(SYNTH / "val"), "--gammas", "0:1:0.5",
               "--table", str(SYNTH / "train_annotations.json"), "--batch", "4",
               "--json", str(sweep_json), "--plot", str(plot)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "recommended gamma" in out and "APr" in out
    # val.json's images carry the federated lists: LVIS rules, said first and recorded
    assert out.splitlines()[0] == f"rules: LVIS federated ({subset_gt}'s images carry neg_category_ids / not_exhaustive_category_ids)"
    doc = json.loads(sweep_json.read_text())
    assert doc["rules"] == "lvis"
    assert [p["gamma"] for p in doc["sweep"]] == [0.0, 0.5, 1.0]
    assert doc["num_images"] == 8
    aps = [p["stats"]["AP"] for p in doc["sweep"]]
    assert doc["best"]["gamma"] == doc["sweep"][int(np.argmax(aps))]["gamma"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the baseline ONNX model run by `norcal infer`, scored by `norcal eval`
    onnx_path, results, metrics = tmp_path / "plain.onnx", tmp_path / "res.json", tmp_path / "m.json"
    save_onnx(plain_onnx, onnx_path)
    assert main(["infer", str(onnx_path), str(SYNTH / "val"), "--image-ids", str(subset_gt),
                 "--batch", "4", "--no-masks", "-o", str(results)]) == 0
    assert main(["eval", "--gt", str(subset_gt), "--results", str(results), "--no-fixed",
                 "--table", str(SYNTH / "train_annotations.json"), "--json", str(metrics)]) == 0
    stats = json.loads(metrics.read_text())["stats"]
    base = doc["sweep"][0]["stats"]
    for k in ("AP", "AP50", "APr", "APc", "APf"):
        assert base[k] == pytest.approx(stats[k], abs=1e-4), k


def test_rescore_restores_the_whole_predictor_state(detector, cache, table):
    from norcal.core.calibration.formula import log_prior

    pred = detector[1].roi_heads.box_predictor
    prior = log_prior(table.counts(), 0.5, "cdt")
    pred.set_log_prior(prior, "logit", False)
    saved = pred.log_prior
    try:
        rescored(detector, cache, table, 1.0)
        assert pred.log_prior is saved and pred.mechanism == "logit" and pred.renormalize is False
    finally:
        pred.set_log_prior(None)


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_tune_rejects_bad_cache_budget(value, capsys):
    from norcal.cli import main

    rc = main(["tune", str(SYNTH / "model_final.pth"), "--gt", str(SYNTH / "val.json"),
               "--images", str(SYNTH / "val"), f"--max-cache-gb={value}"])
    err = capsys.readouterr().err
    assert rc == 2 and "--max-cache-gb must be a finite number > 0" in err and err.count("\n") == 1


def test_tune_rejects_onnx(tmp_path, capsys):
    from norcal.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    rc = main(["tune", str(model), "--gt", str(SYNTH / "val.json"), "--images", str(SYNTH / "val")])
    assert rc == 2
    assert "checkpoint" in capsys.readouterr().err


def test_tune_rejects_images_not_in_gt(tmp_path):
    from norcal.core.errors import NorcalError
    from norcal.workflows.tune import images_from_gt

    with pytest.raises(NorcalError, match="none of the 48 images"):
        images_from_gt(SYNTH / "val.json", tmp_path)


def test_cache_estimate_bounds_the_real_cache(detector, cache):
    from norcal.export.families.detectron2.family import estimate_cache_bytes

    spec = detector[0]
    # by hand: 500 proposals x (61 logits + 240 deltas + 4 box coords) x 4 bytes + 1 flag
    assert estimate_cache_bytes(spec, 8) == 8 * 500 * (4 * (61 + 240 + 4) + 1)
    assert cache.nbytes <= estimate_cache_bytes(spec, 8)


def test_tune_in_chunks_equals_one_cache(detector, family_detector, cache, table, subset_gt):
    # a memory budget of 4 images' cache: the 8 images go through as 2 chunks
    from norcal.core.errors import NorcalError
    from norcal.export.families.detectron2.family import estimate_cache_bytes
    from norcal.workflows.tune import tune
    from norcal.workflows.tune_sweep import sweep

    budget = 4 * estimate_cache_bytes(detector[0], 1)
    chunked = tune(SYNTH / "model_final.pth", subset_gt, SYNTH / "val", [0.0, 1.0], table,
                   config=SYNTH / "config.yaml", batch_size=2, max_cache_bytes=budget)
    assert chunked.cache_bytes <= budget and chunked.num_images == 8
    whole = sweep(family_detector, cache, subset_gt, table, [0.0, 1.0])
    for a, b in zip(chunked.points, whole):
        assert a.gamma == b.gamma and a.num_detections == b.num_detections
        for k in ("AP", "APr", "APc", "APf", "AR"):
            assert a.stats[k] == pytest.approx(b.stats[k], abs=1e-6), (a.gamma, k)
    with pytest.raises(NorcalError, match="lower batch_size or raise max_cache_bytes") as e:
        tune(SYNTH / "model_final.pth", subset_gt, SYNTH / "val", [0.5], table,
             config=SYNTH / "config.yaml", batch_size=8, max_cache_bytes=budget)
    assert e.value.params == ("batch_size", "max_cache_bytes")


def test_tune_cli_names_the_flags_of_the_cache_budget(capsys):
    from norcal.cli import main

    rc = main(["tune", str(SYNTH / "model_final.pth"), "--config", str(SYNTH / "config.yaml"),
               "--gt", str(SYNTH / "val.json"), "--images", str(SYNTH / "val"), "--batch", "8",
               "--table", str(SYNTH / "train_annotations.json"),
               "--max-cache-gb", "0.001"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "MiB limit: lower --batch or raise --max-cache-gb" in err, err


def test_gt_images_missing_from_the_folder_are_left_out_of_the_evaluation(tmp_path, subset_gt):
    # --gt the whole val.json (48 images), --images a folder holding 3 of them: the sweep is
    # that of the GT of those 3 (as lvis-api with params.img_ids), not one where the other 45
    # images' objects count as missed
    from norcal.workflows.tune import tune

    folder = tmp_path / "three"
    folder.mkdir()
    ids = GOLDEN_IDS[:3]
    for i in ids:
        (folder / f"{i}.png").write_bytes((SYNTH / "val" / f"{i}.png").read_bytes())
    data = json.loads((SYNTH / "val.json").read_text())
    data["images"] = [im for im in data["images"] if im["id"] in ids]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in ids]
    only = tmp_path / "val3.json"
    only.write_text(json.dumps(data))
    kw = dict(config=SYNTH / "config.yaml", batch_size=3)
    table = SYNTH / "train_annotations.json"
    full = tune(SYNTH / "model_final.pth", SYNTH / "val.json", folder, [0.0, 0.5], table, **kw)
    want = tune(SYNTH / "model_final.pth", only, folder, [0.0, 0.5], table, **kw)
    assert full.num_images == 3 and full.gt_images == 48 and want.gt_images == 3
    assert [p.stats for p in full.points] == [p.stats for p in want.points]
    assert full.points[0].stats["AP"] > 0.1


def test_tune_refuses_images_of_another_size_than_the_gt_gives(tmp_path):
    from PIL import Image

    from norcal.core.errors import NorcalError
    from norcal.workflows.tune import images_from_gt

    src = Image.open(SYNTH / "val" / "100002.png")
    assert src.size == (256, 256)  # val.json: 256 x 256
    src.resize((128, 96)).save(tmp_path / "100002.png")
    with pytest.raises(NorcalError, match=r"100002.png: the image is 128x96 pixels \(w x h\) but "
                                          r".*val.json gives image 100002 as 256x256"):
        images_from_gt(SYNTH / "val.json", tmp_path)
