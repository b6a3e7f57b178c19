"""Boundary IoU evaluation: the band of single masks against hand-made cases, the whole
evaluation against faster-coco-eval's boundary mode (an independent implementation) and a
case computed by hand, and `norcal eval --iou-type boundary`.

faster-coco-eval's band (its C++ ``toBoundary``) departs from the definition only on images
thinner than about 2d pixels, where it misses the far edge; those sizes are left out of the
comparison and checked by hand instead."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest

import faster_coco_eval.mask_api_new_cpp as fce_mask
import pycocotools.mask as mask_utils

from conftest import SYNTH
from norcal.core.errors import NorcalError
from norcal.evaluation import evaluate, evaluate_fixed, prepare_gt
from norcal.evaluation.boundary import band_width, boundary_band, boundary_rles
from test_evaluation import FIXTURE, make_results
from test_vs_faster_coco_eval import TOL, _federated_gt, assert_same_stats, faster_coco_eval

STATS = {"AP": "AP_all", "AP50": "AP_50", "AP75": "AP_75", "APr": "APr", "APc": "APc", "APf": "APf"}


def _rle(mask: np.ndarray) -> dict:
    return mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))


def _decode(rle: dict) -> np.ndarray:
    return mask_utils.decode(rle).astype(bool)


# ---------------------------------------------------------------- the band of one mask
def test_band_width_is_two_percent_of_the_diagonal():
    assert band_width(256, 256) == 7  # 0.02 * 362.04 = 7.24
    assert band_width(480, 640) == 16  # 0.02 * 800
    assert band_width(10, 10) == 1  # 0.28 rounds to 0: at least one pixel
    assert band_width(480, 640, ratio=0.05) == 40


def test_band_of_a_square():
    m = np.zeros((40, 40), bool)
    m[10:30, 5:25] = True
    want = m.copy()
    want[13:27, 8:22] = False  # the square's pixels 3 or more away from its edge
    band = boundary_band(m, 3)
    assert np.array_equal(band, want)
    assert band.sum() == 20 * 20 - 14 * 14


def test_band_of_a_mask_touching_the_image_border():
    m = np.zeros((40, 40), bool)
    m[0:10, 0:20] = True  # cut by the top and left edges: those are contour too
    want = m.copy()
    want[3:7, 3:17] = False
    assert np.array_equal(boundary_band(m, 3), want)
    full = np.ones((3, 50), bool)  # an image thinner than 2d: every pixel lies near an edge
    assert np.array_equal(boundary_band(full, 5), full)
    assert np.array_equal(_decode(boundary_rles([_rle(full)], 0.1)[0]), full)


def test_band_of_one_pixel_and_of_an_empty_mask():
    m = np.zeros((30, 30), bool)
    m[12, 17] = True
    assert np.array_equal(boundary_band(m, 4), m)
    assert np.array_equal(_decode(boundary_rles([_rle(m)])[0]), m)
    empty = np.zeros((30, 30), bool)
    assert not boundary_band(empty, 4).any()
    band = boundary_rles([_rle(empty)])[0]
    assert band["size"] == [30, 30] and mask_utils.area(band) == 0


def test_band_from_rles_uses_the_image_diagonal():
    m = np.zeros((256, 256), bool)
    m[100:200, 50:250] = True
    want = m.copy()
    want[107:193, 57:243] = False  # d = 7 at 256 x 256
    assert np.array_equal(_decode(boundary_rles([_rle(m)])[0]), want)


def test_bands_match_faster_coco_eval():
    rng = np.random.default_rng(0)
    rles, ratios = [], []
    for _ in range(200):
        h, w = (int(v) for v in rng.integers(24, 160, size=2))
        m = np.zeros((h, w), bool)
        for _ in range(rng.integers(1, 4)):  # overlapping boxes, some cut by the border
            y, x = rng.integers(-10, h), rng.integers(-10, w)
            m[max(y, 0):y + rng.integers(1, h), max(x, 0):x + rng.integers(1, w)] = True
        if rng.random() < 0.4:  # ragged, with holes
            m &= rng.random((h, w)) < 0.85
        rles.append(_rle(m))
        ratios.append(float(rng.choice([0.02, 0.05])))
    for ratio in (0.02, 0.05):
        idx = [i for i, r in enumerate(ratios) if r == ratio]
        ours = boundary_rles([rles[i] for i in idx], ratio)
        theirs = fce_mask.toBoundary([rles[i] for i in idx], ratio)
        for o, t in zip(ours, theirs):
            assert np.array_equal(_decode(o), _decode(t))
    assert sum(mask_utils.area(rles)) > 0


def test_band_refuses_what_is_not_a_mask():
    with pytest.raises(ValueError, match="2-D mask"):
        boundary_band(np.ones((2, 2, 2)), 1)


# ---------------------------------------------------------------- AP
def _square_gt(det_shift: int) -> tuple[dict, list[dict]]:
    """One 200 x 200 image (d = 6), a GT square 100 x 100 and a detection shifted by
    ``det_shift`` pixels to the right."""
    gt_mask = np.zeros((200, 200), bool)
    gt_mask[50:150, 50:150] = True
    det_mask = np.roll(gt_mask, det_shift, axis=1)
    seg = mask_utils.encode(np.asfortranarray(gt_mask.astype(np.uint8)))
    seg["counts"] = seg["counts"].decode()
    gt = {"images": [{"id": 1, "height": 200, "width": 200, "neg_category_ids": [],
                      "not_exhaustive_category_ids": []}],
          "categories": [{"id": 1, "name": "a", "frequency": "f"}],
          "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [50, 50, 100, 100],
                           "area": 10000, "segmentation": seg}]}
    det = mask_utils.encode(np.asfortranarray(det_mask.astype(np.uint8)))
    det["counts"] = det["counts"].decode()
    return gt, [{"image_id": 1, "category_id": 1, "score": 0.9, "segmentation": det}]


def test_boundary_ap_by_hand():
    # shifted by 4: mask IoU 9600 / 10400 = 0.923; each band is a ring of width 6 (2256 px),
    # the two rings share 9600 - 7744 - 7744 + 7392 = 1504 px: band IoU 1504 / 3008 = 0.5.
    # min(0.923, 0.5) = 0.5 passes IoU threshold 0.50 only: AP = 1/10; mask AP passes 0.50..0.90
    gt, res = _square_gt(4)
    assert band_width(200, 200) == 6
    assert evaluate(gt, res, "boundary").stats["AP"] == pytest.approx(0.1, abs=1e-12)
    assert evaluate(gt, res, "segm").stats["AP"] == pytest.approx(0.9, abs=1e-12)
    assert evaluate_fixed(gt, res, "boundary").stats["AP"] == pytest.approx(0.1, abs=1e-12)
    gt, res = _square_gt(0)  # the same mask: IoU 1 everywhere
    assert evaluate(gt, res, "boundary").stats["AP"] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("case", ["example", "federated"])
def test_ap_matches_faster_coco_eval(case):
    if case == "example":  # the bundled example's validation GT, detections near it
        gt, seed = json.loads(FIXTURE.read_text()), 1
    else:
        gt, seed = _federated_gt(), 4
    results = make_results(gt, seed=seed, segm=True)
    ours = evaluate(copy.deepcopy(gt), copy.deepcopy(results), "boundary").stats
    theirs = faster_coco_eval(gt, results, "boundary")
    segm = evaluate(copy.deepcopy(gt), copy.deepcopy(results), "segm").stats
    assert ours["AP"] > 0.02 and ours["APr"] > 0  # jittered polygons: low, not zero
    assert ours["AP"] < segm["AP"] - 0.01  # boundaries are stricter: not mask AP again
    assert_same_stats(ours, theirs, STATS)


def test_prepared_gt_gives_the_same_numbers_again():
    gt = json.loads(FIXTURE.read_text())
    results = make_results(gt, seed=2, segm=True)
    prepared = prepare_gt(copy.deepcopy(gt))
    first = evaluate(prepared, copy.deepcopy(results), "boundary").stats
    assert evaluate(prepared, copy.deepcopy(results), "boundary").stats == first
    assert evaluate(copy.deepcopy(gt), copy.deepcopy(results), "boundary").stats == first


def test_boundary_needs_masks_and_a_known_iou_type():
    gt, res = _square_gt(0)
    boxes_only = [{"image_id": 1, "category_id": 1, "score": 0.9, "bbox": [50, 50, 100, 100]}]
    with pytest.raises(NorcalError, match="boundary evaluation needs 'segmentation'"):
        evaluate(gt, boxes_only, "boundary")
    with pytest.raises(NorcalError, match="iou_type must be bbox, segm or boundary") as e:
        evaluate_fixed(gt, res, "edges")
    assert e.value.param == "iou_type"


# ---------------------------------------------------------------- the bundled trained model
def run_exported(gammas, num_images: int | None = None) -> dict[float, list[dict]]:
    """The bundled trained Mask R-CNN exported (with NorCal at each gamma; 0: plain softmax)
    and run by ONNX Runtime on its validation images (the first ``num_images`` by id), as
    LVIS results with RLE masks."""
    import tempfile
    from pathlib import Path

    from norcal.core.files.onnx_io import save_onnx
    from norcal.core.calibration.tables import build_table
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model
    from norcal.runtime.inference import run_images
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
    from norcal.runtime.results import detections_to_results
    from norcal.workflows.tune import images_from_gt

    table = build_table(SYNTH / "train_annotations.json")
    spec, model = load_model(SYNTH / "model_final.pth", SYNTH / "config.yaml")
    plain = export_detector(model, spec)
    pairs = images_from_gt(FIXTURE, SYNTH / "val")[:num_images]
    ids = {str(p): i for i, p in pairs}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for g in gammas:
            path = Path(tmp) / f"model_{g}.onnx"
            save_onnx(calibrate_graph(plain, g, table) if g else plain, path)
            out[g] = []
            for p, det in run_images(OnnxRuntimeRunner(path), [p for _, p in pairs], 8):
                out[g] += detections_to_results(ids[str(p)], det, table.category_ids)
    return out


@pytest.fixture(scope="module")
def trained_results():
    """The plain model's results on the 48 validation images."""
    return run_exported([0.0])[0.0]


@pytest.mark.slow  # exports the trained model and runs it on 48 images
def test_trained_model_matches_faster_coco_eval(trained_results):
    gt = json.loads(FIXTURE.read_text())
    assert len({r["image_id"] for r in trained_results}) == 48
    ours = evaluate(copy.deepcopy(gt), copy.deepcopy(trained_results), "boundary").stats
    theirs = faster_coco_eval(gt, trained_results, "boundary")
    assert ours["AP"] > 0.1 and ours["APr"] > 0
    assert_same_stats(ours, theirs, STATS)


# ---------------------------------------------------------------- tune
TUNE_IMAGES = 8
# the sweep re-scores in PyTorch, the exported model runs in ONNX Runtime: measured 1.1e-16
# largest difference (both gammas, AP/APr/APc/APf); bound 1e-6: float32 kernels differ, and
# a near-tie ordered differently on another CPU must not fail it, one detection lost must
TUNE_TOL = 1e-6


@pytest.mark.slow  # one network pass and a mask-head pass per gamma, plus two exported models run
def test_tune_sweep_on_boundary_ap_is_the_exported_models_boundary_ap(tmp_path):
    # gamma chosen on Boundary AP: at each gamma the sweep's cached re-scoring (PyTorch, masks
    # from the mask head on that gamma's boxes) must score what the model exported with NorCal
    # at that gamma scores when ONNX Runtime runs it and faster-coco-eval evaluates it
    from norcal.workflows.tune import tune

    gammas = (0.0, 0.8)
    gt = json.loads(FIXTURE.read_text())
    ids = sorted(im["id"] for im in gt["images"])[:TUNE_IMAGES]
    sub = {**gt, "images": [im for im in gt["images"] if im["id"] in ids],
           "annotations": [a for a in gt["annotations"] if a["image_id"] in ids]}
    (tmp_path / "gt.json").write_text(json.dumps(sub))
    result = tune(SYNTH / "model_final.pth", tmp_path / "gt.json", SYNTH / "val", gammas,
                  SYNTH / "train_annotations.json", config=SYNTH / "config.yaml", iou_type="boundary")
    assert result.iou_type == "boundary" and result.to_json()["iou_type"] == "boundary"
    assert result.num_images == TUNE_IMAGES
    exported = run_exported(gammas, TUNE_IMAGES)
    for point in result.points:
        res = exported[point.gamma]
        assert {r["image_id"] for r in res} <= set(ids) and point.num_detections == len(res)
        theirs = faster_coco_eval(sub, res, "boundary")
        for k in ("AP", "APr", "APc", "APf"):
            assert point.stats[k] == pytest.approx(theirs[STATS[k]], abs=TUNE_TOL), (point.gamma, k)
    assert result.points[1].stats["APr"] > result.points[0].stats["APr"]  # NorCal's rare-class gain
    assert result.best.gamma == max(result.points, key=lambda p: p.stats["AP"]).gamma


@pytest.mark.parametrize("ray_installed", [True, False])
def test_tune_on_masks_needs_a_mask_model_and_no_ray(tmp_path, capsys, monkeypatch, ray_installed):
    from conftest import FIXTURES
    from norcal.cli import main
    import norcal.runtime.ray_inference as ray_inference

    if not ray_installed:  # the flag conflict is the user's: said before the missing extra
        def missing():
            raise NorcalError("running on Ray needs the optional package ray[data], which is not installed")

        monkeypatch.setattr(ray_inference, "require_ray", missing)

    retina = FIXTURES / "d2_retinanet_tiny"
    args = ["tune", str(retina / "model_final.pth"), "--config", str(retina / "config.yaml"),
            "--gt", str(FIXTURE), "--images", str(SYNTH / "val"), "--iou-type", "boundary"]
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: --iou-type boundary needs a model with a mask head")
    assert main(args[:2] + ["--gt", str(FIXTURE), "--images", str(SYNTH / "val"),
                            "--iou-type", "segm", "--ray"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: --iou-type segm runs without --ray (the Ray sweep evaluates bbox)"]


# ---------------------------------------------------------------- CLI
def test_cli_boundary_writes_the_same_keys_as_segm(tmp_path):
    gt = json.loads(FIXTURE.read_text())
    res = make_results(gt, seed=5, segm=True)
    gpath, rpath = tmp_path / "gt.json", tmp_path / "res.json"
    gpath.write_text(json.dumps(gt))
    rpath.write_text(json.dumps(res))
    docs = {}
    for kind in ("segm", "boundary"):
        out = tmp_path / f"{kind}.json"
        p = subprocess.run([sys.executable, "-m", "norcal", "eval", "--gt", str(gpath), "--results",
                            str(rpath), "--iou-type", kind, "--json", str(out)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert f"{kind} evaluation of" in p.stdout
        docs[kind] = json.loads(out.read_text())
    seg, bnd = docs["segm"], docs["boundary"]
    assert bnd["iou_type"] == "boundary"
    assert set(bnd) == set(seg) and set(bnd["stats"]) == set(seg["stats"])
    assert set(bnd["fixed"]) == set(seg["fixed"]) and set(bnd["fixed"]["stats"]) == set(seg["fixed"]["stats"])
    assert bnd["stats"]["AP"] == pytest.approx(evaluate(gt, res, "boundary").stats["AP"], abs=1e-12)
    assert bnd["fixed"]["stats"]["APr"] == pytest.approx(
        evaluate_fixed(gt, res, "boundary").stats["APr"], abs=1e-12)
    assert bnd["stats"]["AP"] < seg["stats"]["AP"]

    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps([{k: v for k, v in r.items() if k != "segmentation"} for r in res]))
    p = subprocess.run([sys.executable, "-m", "norcal", "eval", "--gt", str(gpath), "--results",
                        str(boxes), "--iou-type", "boundary"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.splitlines() == ["error: boundary evaluation needs 'segmentation' (RLE) in the results"]
