"""Parity: the comparator on hand-made outputs, then PyTorch vs ONNX Runtime on d2_lvis_tiny.

Hand-made outputs follow the ONNX contract (num_detections [B], boxes [B,K,4], scores [B,K],
classes [B,K], masks [B,K,M,M]) so every expected verdict can be worked out by hand.
The end-to-end part checks the comparator against an independent reference too: detectron2's
own detections (tests/fixtures/d2_lvis_tiny/golden) for the same image and NorCal gamma.
"""

import copy
import io
import json
import types

import numpy as np
import pytest
import torch

from norcal.core.contract import Preprocessing
from norcal.core.calibration.formula import log_prior
from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.cli.parity_tables import render_tables, verify_text
from norcal.workflows.parity import (PRESETS, ParityRun, box_iou, compare, match_detections, report_json,
                                     run_parity, runner_precision, synthetic_images, tolerances_for,
                                     verdict_lines)
from norcal.core.calibration.spec import Calibration
from norcal.export.pytorch.runner import TorchRunner, calibrated, onnx_calibration

from conftest import TINY


def contract(dets_per_image, k=4, masks=True):
    """Outputs from per-image lists of (box, score, class), zero-padded to K like EfficientNMS;
    each mask is filled with its detection's score so masks follow their detections."""
    b = len(dets_per_image)
    out = {"num_detections": np.zeros(b, np.int64), "boxes": np.zeros((b, k, 4), np.float32),
           "scores": np.zeros((b, k), np.float32), "classes": np.zeros((b, k), np.int64)}
    if masks:
        out["masks"] = np.zeros((b, k, 28, 28), np.float32)
    for i, dets in enumerate(dets_per_image):
        out["num_detections"][i] = len(dets)
        for j, (box, score, cls) in enumerate(dets):
            out["boxes"][i, j] = box
            out["scores"][i, j] = score
            out["classes"][i, j] = cls
            if masks:
                out["masks"][i, j] = score
    return out


A = ((10, 10, 110, 60), 0.5, 3)
B = ((200, 40, 260, 140), 0.5, 7)  # ties with A
C = ((30, 150, 90, 200), 0.25, 3)
D = ((120, 120, 180, 190), 0.125, 1)


# --------------------------------------------------------------------------- comparator


def test_box_iou_by_hand():
    a = np.array([[0, 0, 10, 10]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 5, 10]], np.float32)
    # overlaps: identical; half (50 / 150); none; a half-box inside (50 / 100)
    np.testing.assert_allclose(box_iou(a, b)[0], [1.0, 1 / 3, 0.0, 0.5])


def test_tied_detections_reordered_pass_at_detection_level():
    ref = contract([[A, B, C], [D]])
    cand = contract([[B, A, C], [D]])  # a backend that breaks the score tie the other way
    rep = compare(ref, cand, "fp32")
    assert rep.passed, rep.failures
    assert rep.detections.matched == 4 and rep.detections.reordered == 2
    rows = {d.name: d for d in rep.tensors}
    assert rows["boxes"].max_abs == 0 and rows["masks"].max_abs == 0
    # the naive element-wise view in output order would have flagged it
    assert rows["boxes"].raw_max_abs == pytest.approx(190.0)
    assert rows["classes"].raw_max_abs == 4


def test_shifted_box_fails():
    shifted = ((13, 10, 113, 60), 0.5, 3)  # A moved 3 px right: IoU 97/103 = 0.94
    rep = compare(contract([[A, B, C]]), contract([[shifted, B, C]]), "fp32")
    assert not rep.passed
    assert rep.detections.matched == 2 and rep.detections.unmatched_reference == 1
    assert any("matched" in f for f in rep.failures)
    # half a pixel keeps it paired at IoU >= 0.99, but the box row is over its 1e-2 px tolerance
    nudged = ((10.5, 10, 110.5, 60), 0.5, 3)
    rep = compare(contract([[A, B, C]]), contract([[nudged, B, C]]), "fp32")
    assert rep.detections.matched == 3 and not rep.passed
    assert any(f.startswith("boxes") and "0.5" in f for f in rep.failures)
    # fp16 tolerates the nudge (detection level only) but not a box moved by half its width
    assert compare(contract([[A, B, C]]), contract([[nudged, B, C]]), "fp16").passed
    far = ((60, 10, 160, 60), 0.5, 3)
    assert not compare(contract([[A, B, C]]), contract([[far, B, C]]), "fp16").passed


def test_masks_of_another_resolution_fail_in_a_line_not_a_traceback():
    """A model compared with another architecture's checkpoint (C4's 14x14 masks against FPN's
    28x28; same class count): numpy's broadcast error escaped. It is a failure naming both sizes,
    and the detections are still compared (here they agree)."""
    ref = contract([[A, B, C]])
    cand = contract([[A, B, C]])
    cand["masks"] = cand["masks"][:, :, :14, :14].copy()
    rep = compare(ref, cand, "fp32")
    assert not rep.passed
    assert [f for f in rep.failures if "masks" in f] == ["masks: 28x28 per detection in reference, 14x14 in "
                                                         "candidate: not the same model's mask head"]
    assert rep.detections.matched == 3
    assert "masks" not in {d.name for d in rep.tensors}


def test_same_box_other_class_is_not_a_match():
    other = (A[0], A[1], 4)
    pairs = match_detections(*[np.array(v) for v in zip(A, B)], *[np.array(v) for v in zip(other, B)], 0.5)
    assert pairs[0].tolist() == [1] and pairs[1].tolist() == [1]
    assert not compare(contract([[A, B]]), contract([[other, B]]), "fp16").passed


def test_score_limit_is_part_of_pairing():
    """With max_score_diff (how the tests match detectron2's goldens) a same-class box at IoU 1
    whose score is off is no partner, and the next-best candidate within the limit is taken."""
    boxes = np.array([A[0], A[0], (11, 10, 111, 60)], np.float64)
    ri, ci, iou = match_detections(boxes[:1], np.array([0.5]), np.array([3]), boxes[1:],
                                   np.array([0.6, 0.50005]), np.array([3, 3]), 0.9, max_score_diff=1e-4)
    assert ri.tolist() == [0] and ci.tolist() == [1] and iou[0] == pytest.approx(99 / 101)  # shifted 1 px: 99x50 shared of 101x50
    ri, ci, _ = match_detections(boxes[:1], np.array([0.5]), np.array([3]), boxes[1:],
                                 np.array([0.6, 0.50005]), np.array([3, 3]), 0.9)
    assert ci.tolist() == [0]  # without the limit the identical box wins


def test_model_score_thresh_from_metadata():
    from norcal.core.contract import DETECTOR
    from norcal.workflows.parity import model_score_thresh

    assert model_score_thresh({DETECTOR: json.dumps({"score_thresh_test": 0.05})}) == 0.05
    assert model_score_thresh({}) == 0.0 and model_score_thresh({DETECTOR: "not json"}) == 0.0


def test_fp16_noise_passes_fp16_but_not_fp32():
    rng = np.random.default_rng(0)
    ref = contract([[A, B, C, D]])
    cand = {k: v.copy() for k, v in ref.items()}
    cand["boxes"][0, :4] += rng.uniform(-0.3, 0.3, (4, 4)).astype(np.float32)
    cand["scores"][0, :4] += np.float32(3e-3)
    assert compare(ref, cand, "fp16").passed
    rep = compare(ref, cand, "fp32")
    assert not rep.passed
    failed = {f.split(" ")[0] for f in rep.failures}
    assert {"boxes", "scores"} <= failed


def test_boundary_swap_is_excused_but_a_missing_top_detection_is_not():
    e1 = ((300, 300, 340, 340), 0.125, 9)
    e2 = ((400, 10, 440, 50), 0.125 + 1e-6, 2)  # the K-th slot's tie, broken the other way
    ref = contract([[A, B, C, e1]])
    rep = compare(ref, contract([[A, B, C, e2]]), "fp32")
    assert rep.passed, rep.failures
    assert rep.detections.excused == 1 and rep.detections.matched == 3
    # the same swap with a free slot left: nothing forced e1 out, so it is a real difference
    rep = compare(contract([[A, B, C, e1]], k=5), contract([[A, B, C, e2]], k=5), "fp32")
    assert not rep.passed
    # losing the best detection is never a boundary effect
    rep = compare(ref, contract([[B, C, e1, e2]]), "fp32")
    assert not rep.passed and rep.detections.unmatched_reference == 1


def test_fp32_allows_one_percent_unpaired_from_upstream_ties():
    """A near-tie inside the graph (RPN top-k) swaps one proposal, so one detection of many."""
    grid = [((10 * i, 10 * j, 10 * i + 8, 10 * j + 8), 0.9 - 0.001 * (10 * i + j), 0) for i in range(10)
            for j in range(10)]
    swapped = list(grid)
    swapped[40] = ((500, 500, 508, 508), grid[40][1], 0)
    rep = compare(contract([grid], k=150), contract([swapped], k=150), "fp32")
    assert rep.passed and rep.detections.matched == 99
    swapped[41] = ((600, 600, 608, 608), grid[41][1], 0)
    assert not compare(contract([grid], k=150), contract([swapped], k=150), "fp32").passed


def test_detection_on_the_score_threshold_may_be_missing():
    faint = ((5, 5, 25, 25), 1.2e-4, 5)
    ref = contract([[A, B, faint]], k=5)
    assert compare(ref, contract([[A, B]], k=5), "fp32", score_thresh=1e-4).passed
    assert not compare(ref, contract([[A, B]], k=5), "fp32", score_thresh=0.0).passed


def test_non_finite_candidate_fails_even_at_fp16():
    cand = contract([[A, B, C]])
    cand["scores"][0, 1] = np.nan  # an fp16 overflow turned into NaN
    rep = compare(contract([[A, B, C]]), cand, "fp16")
    assert not rep.passed and any("non-finite" in f for f in rep.failures)


def test_other_outputs_are_compared_element_wise():
    ref = {"logits": np.array([[1.0, 2.0, 3.0]], np.float32)}
    assert compare(ref, {"logits": ref["logits"] + 5e-5}, "fp32").passed
    rep = compare(ref, {"logits": ref["logits"] + 1e-2}, "fp32")
    assert not rep.passed and rep.tensors[0].max_abs == pytest.approx(1e-2, rel=1e-3)
    assert not compare(ref, {"logits": ref["logits"], "extra": ref["logits"]}, "fp32").passed


def test_presets_and_runner_precision():
    assert PRESETS["fp32"].elementwise and not PRESETS["fp16"].elementwise
    assert PRESETS["fp32"].atol["scores"] < PRESETS["fp16"].atol["scores"]
    assert tolerances_for("fp16", match_iou=0.7).match_iou == 0.7
    with pytest.raises(NorcalError, match="unknown precision"):
        tolerances_for("int4")
    named = lambda n: types.SimpleNamespace(name=n)  # noqa: E731
    assert runner_precision(named("onnxruntime-cpu")) == "fp32"
    assert runner_precision(named("tensorrt-fp16")) == "fp16"
    assert runner_precision(named("tensorrt-fp32")) == "tf32"  # TensorRT enables TF32 by default
    assert runner_precision(named("tensorrt-int8+fp16")) == "int8"
    quantized = types.SimpleNamespace(name="onnxruntime-cpu", metadata={"norcal.precision": "int8"})
    assert runner_precision(quantized) == "int8"  # what norcal quantize recorded
    assert PRESETS["int8"].match_iou < PRESETS["fp16"].match_iou


class EchoRunner:
    """Outputs computed from the feeds (score = image mean / 255), recording every feed."""

    def __init__(self, name, offset=0.0):
        self.name, self.offset, self.seen = name, offset, []
        self.input_names = ["images", "image_sizes"]
        self.output_names = ["num_detections", "boxes", "scores", "classes"]

    def infer(self, feeds):
        self.seen.append({k: v.copy() for k, v in feeds.items()})
        b = len(feeds["images"])
        h, w = feeds["image_sizes"][:, 0].astype(np.float32), feeds["image_sizes"][:, 1].astype(np.float32)
        boxes = np.stack([np.zeros(b), np.zeros(b), w, h], -1).astype(np.float32)[:, None]
        score = feeds["images"].reshape(b, -1).mean(1) / 255 + self.offset
        return {"num_detections": np.ones(b, np.int64), "boxes": boxes, "scores": score[:, None].astype(np.float32),
                "classes": np.zeros((b, 1), np.int64)}


def test_run_parity_feeds_every_runner_the_same_batches():
    imgs = synthetic_images(3)
    assert all(np.array_equal(a, b) for a, b in zip(imgs, synthetic_images(3)))  # deterministic
    r1, r2, r3 = EchoRunner("one"), EchoRunner("two"), EchoRunner("three", offset=0.1)
    run = run_parity([r1, r2, r3], imgs, min_size=64, max_size=96, batch_size=2)
    assert len(r1.seen) == 2 and [len(f["images"]) for f in r1.seen] == [2, 1]
    for f1, f2 in zip(r1.seen, r2.seen):
        assert all(np.array_equal(f1[k], f2[k]) for k in f1)
    assert run.outputs["one"]["scores"].shape == (3, 1)
    assert run.reports[0].passed and not run.reports[1].passed  # 'three' is off by 0.1
    assert "scores" in run.reports[1].failures[0]
    tables = render_tables(run)
    assert len(tables) == 4  # per comparison: outputs and detections
    # a model with a fixed batch of 2 and a fixed 128x128 input: the short batch is filled, then cut
    r4, r5 = EchoRunner("four"), EchoRunner("five")
    run = run_parity([r4, r5], imgs, min_size=64, max_size=96, fixed_shape=(2, 128, 128))
    assert [f["images"].shape for f in r4.seen] == [(2, 3, 128, 128)] * 2
    assert run.outputs["four"]["scores"].shape == (3, 1)
    with pytest.raises(NorcalError, match="does not fit"):
        run_parity([r4, r5], imgs, min_size=64, max_size=96, fixed_shape=(None, 64, 64))
    with pytest.raises(NorcalError, match="names must differ"):
        run_parity([r4, EchoRunner("four")], imgs, min_size=64, max_size=96)



def test_noise_floor_is_measured_only_where_the_fp32_preset_alone_fails():
    """A candidate within the fp32 preset is judged without the noise runner (never made, never
    run); past the preset, the noise runner is made and run over the same batches, and the
    candidates are judged against 6 x the floor it measures (scores: the precise reference sits
    5e-4 from the float32 one, so 1e-3 off passes and 1e-2 off still fails)."""
    from norcal.workflows.parity.tolerances import FLOOR_FACTOR

    imgs = synthetic_images(3)
    made = []

    def noise():
        made.append(EchoRunner("ref-fp64", offset=5e-4))
        return made[-1]

    run = run_parity([EchoRunner("ref"), EchoRunner("same")], imgs, min_size=64, max_size=96, batch_size=2,
                     noise_runner=noise)
    (rep,) = run.reports
    assert rep.passed and not made and run.floor is None and set(run.seconds) == {"ref", "same"}
    assert rep.preset == PRESETS["fp32"] and rep.floor is None and rep.tolerances == PRESETS["fp32"]
    assert verdict_lines(run) == ["PASS  same vs ref (fp32); within the preset (floor not measured)"]
    assert report_json(run)["comparisons"][0]["noise_floor"] is None
    # past the preset: measured on the same batches, then both candidates judged against it
    ref, off, far = EchoRunner("ref"), EchoRunner("off", offset=1e-3), EchoRunner("far", offset=1e-2)
    run = run_parity([ref, off, far], imgs, min_size=64, max_size=96, batch_size=2, noise_runner=noise)
    (precise,) = made
    assert [len(f["images"]) for f in precise.seen] == [2, 1]
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(ref.seen, precise.seen) for k in a)
    assert run.floor.runner == "ref-fp64" and run.floor.pairs == 3
    assert run.floor.scores == pytest.approx(5e-4, rel=1e-3) and "ref-fp64" in run.seconds
    assert not compare(run.outputs["ref"], run.outputs["off"], "fp32").passed  # the bare preset fails it
    assert run.reports[0].passed and not run.reports[1].passed
    for rep in run.reports:
        assert rep.floor == run.floor and rep.preset == PRESETS["fp32"]
        assert rep.tolerances.atol["scores"] == pytest.approx(FLOOR_FACTOR * run.floor.scores)
    passed, failed = verdict_lines(run)
    assert passed.startswith("PASS  off vs ref (fp32); tolerances scores 0.003") and "preset's 0.0001" in passed
    assert failed.startswith("FAIL  far vs ref (fp32): ") and "noise floor 0.0005" in failed


class BoxRunner:
    """One fixed detection per image (box in input pixels, class 0, score 0.9)."""

    def __init__(self, name, box):
        self.name, self.box = name, np.asarray(box, np.float32)
        self.input_names = ["images", "image_sizes"]
        self.output_names = ["num_detections", "boxes", "scores", "classes"]

    def infer(self, feeds):
        b = len(feeds["images"])
        return {"num_detections": np.ones(b, np.int64), "boxes": np.tile(self.box, (b, 1, 1)),
                "scores": np.full((b, 1), 0.9, np.float32), "classes": np.zeros((b, 1), np.int64)}


def test_run_parity_ap_on_given_annotations():
    """Box AP per runner on hand-made LVIS annotations, over the images that were run only."""
    images = [{"id": i, "height": 64, "width": 64, "file_name": f"{i}.png", "neg_category_ids": [],
               "not_exhaustive_category_ids": []} for i in (1, 2)]
    gt = {"images": images, "categories": [{"id": 5, "name": "thing", "frequency": "r", "image_count": 3}],
          "annotations": [{"id": i, "image_id": i, "category_id": 5, "bbox": [8, 8, 32, 32], "area": 1024,
                           "iscrowd": 0} for i in (1, 2)]}
    img = [np.zeros((64, 64, 3), np.uint8)]  # only image 1 is run: image 2's box must not count
    right, wrong = BoxRunner("right", [8, 8, 40, 40]), BoxRunner("wrong", [40, 40, 60, 60])
    run = run_parity([right, BoxRunner("also", [8, 8, 40, 40]), wrong], img, min_size=64, max_size=64,
                     gt=gt, image_ids=[1], category_ids=[5])
    assert run.ap["right"]["AP"] == pytest.approx(1.0) and run.ap["wrong"]["AP"] == 0.0
    assert run.reports[0].passed and run.reports[0].ap["APr"] == (pytest.approx(1.0), pytest.approx(1.0))
    assert not run.reports[1].passed
    assert any(f.startswith("AP:") for f in run.reports[1].failures)


# --------------------------------------------------------------------------- calibration transfer


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _read_back(lp, mechanism, activation):
    """A calibration as read back from a graph: its prior as stored, renormalised."""
    return Calibration(gamma=0.5, mechanism=mechanism, renormalize=True, activation=activation, stored_prior=lp)


def test_calibrated_gives_the_box_predictor_the_onnx_prior_and_restores_it():
    from norcal.export.rcnn.modeling.box_predictor import FastRCNNOutputLayers

    pred = FastRCNNOutputLayers(8, 3)
    model = types.SimpleNamespace(roi_heads=types.SimpleNamespace(box_predictor=pred))
    logits = torch.tensor([[2.0, 1.0, 0.5, 3.0], [-1.0, 4.0, 0.0, 1.0]])
    lp = np.array([0.7, 0.1, 2.0, 0.0], np.float32)
    x = logits.numpy().astype(np.float64)
    for mech, expected in (("exp", _softmax(x - lp)), ("logit", _softmax(x * np.exp(-lp.astype(np.float64))))):
        cal = _read_back(lp, mech, "softmax")
        with calibrated(model, cal):
            np.testing.assert_allclose(pred.probs(logits).numpy(), expected, rtol=1e-5)
        np.testing.assert_allclose(pred.probs(logits).numpy(), _softmax(x), rtol=1e-5)
    with pytest.raises(NorcalError, match="sigmoid"):
        with calibrated(model, _read_back(lp, "exp", "sigmoid")):
            pass
    with pytest.raises(NorcalError, match="shape"):
        with calibrated(model, _read_back(lp[:3], "exp", "softmax")):
            pass


def test_onnx_calibration_reads_the_baked_prior():
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.core.calibration.tables import load_table

    from onnx_graphs import classifier_graph

    plain = classifier_graph(num_classes=1203)
    assert onnx_calibration(plain) is None
    cal = onnx_calibration(calibrate_graph(plain, 0.5, mechanism="logit"))
    expected = log_prior(load_table("lvis_v1").counts("image"), 0.5).astype(np.float32)
    np.testing.assert_array_equal(cal.stored_prior, expected)
    assert cal.stored_prior.dtype == np.float32  # as the graph holds it
    assert (cal.mechanism, cal.renormalize, cal.activation) == ("logit", True, "softmax")
    assert cal.gamma == 0.5 and cal.table == "lvis_v1" and cal.num_classes == 1203


# --------------------------------------------------------------------------- end to end (d2_lvis_tiny)

CKPT, CFG = TINY / "model_final.pth", TINY / "config.yaml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny detector exported once: plain and NorCal gamma 0.5 (ONNX files) + the model."""
    from norcal.export.graph.calibrate import calibrate_graph
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model
    from norcal.core.files.onnx_io import save_onnx

    d = tmp_path_factory.mktemp("parity")
    spec, model = load_model(CKPT, CFG)
    graph = export_detector(model, spec)
    save_onnx(graph, d / "plain.onnx")
    save_onnx(calibrate_graph(graph, 0.5), d / "g05.onnx")
    return types.SimpleNamespace(dir=d, spec=spec, model=model)


@pytest.mark.parametrize("which", ["plain", "g05"])
def test_cli_pytorch_vs_onnxruntime(tiny, which, capsys):
    out = tiny.dir / f"{which}.json"
    rc = main(["parity", str(tiny.dir / f"{which}.onnx"), str(TINY / "images" / "img0.png"),
               "--checkpoint", str(CKPT), "--config", str(CFG), "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "PASS  onnxruntime-cpu vs pytorch (fp32)" in printed
    if which == "g05":
        assert "NorCal gamma 0.5" in printed
    rep = json.loads(out.read_text())["comparisons"][0]
    assert rep["passed"] and rep["detections"]["matched"] == rep["detections"]["reference_count"] == 300
    rows = {r["name"]: r for r in rep["outputs"]}
    assert rows["scores"]["max_abs"] <= 1e-4 and rows["boxes"]["max_abs"] <= 1e-2


def test_pytorch_side_equals_detectron2_with_the_onnx_prior(tiny):
    """The prior read back from the ONNX reproduces detectron2's own NorCal detections; without
    it the same comparison fails (so the CLI test above depends on the transfer)."""
    from norcal.runtime.images import read_rgb
    from norcal.runtime.preprocess import prepare_batch

    golden = np.load(TINY / "golden" / "img3.npz")
    n = len(golden["cdt_g0.5/scores"])
    ref = contract([list(zip(golden["cdt_g0.5/boxes"], golden["cdt_g0.5/scores"], golden["cdt_g0.5/classes"]))],
                   k=300, masks=False)
    assert ref["num_detections"][0] == n
    batch = prepare_batch([read_rgb(TINY / "images" / "img3.png")], Preprocessing(320, 512))
    keys = ("num_detections", "boxes", "scores", "classes")
    with_prior = TorchRunner(tiny.model, calibration=onnx_calibration(tiny.dir / "g05.onnx")).infer(batch.feeds())
    rep = compare(ref, {k: with_prior[k] for k in keys}, "fp32", score_thresh=1e-4)
    assert rep.passed, rep.failures
    plain = TorchRunner(tiny.model).infer(batch.feeds())
    assert not compare(ref, {k: plain[k] for k in keys}, "fp16", score_thresh=1e-4).passed


def test_verify_detector(tiny):
    from norcal.export.families.detectron2.detector import Detectron2RCNN
    from norcal.workflows.verify import verify_detector

    def verify_images(model, onnx_path, images, spec):
        return verify_detector(Detectron2RCNN(spec, model), onnx_path, images)

    # img3 holds a real near-tie: RPN p2's 1000th/1001st logits differ by 1.2e-7, so ONNX Runtime
    # keeps the other anchor and 1 of 300 detections differs; fp32 parity allows that (99%)
    img = [TINY / "images" / "img3.png"]
    text = verify_text(verify_images(tiny.model, tiny.dir / "g05.onnx", img, tiny.spec))
    assert "PASS" in text and "NorCal gamma 0.5" in text and "boxes" in text
    broken = copy.deepcopy(tiny.model)
    with torch.no_grad():  # another classifier: scores and classes change everywhere
        noise = torch.randn(1204, generator=torch.Generator().manual_seed(0))
        broken.roi_heads.box_predictor.cls_score.bias.add_(noise * 3)
    with pytest.raises(NorcalError, match="disagree"):
        verify_images(broken, tiny.dir / "g05.onnx", img, tiny.spec)


def test_cli_refuses_gt_categories_in_another_order_than_the_model_s(tiny, tmp_path, capsys):
    """g05.onnx is calibrated with the built-in LVIS v1 table, so it records LVIS v1's names
    (category 1 aerosol_can, 2 air_conditioner); a GT naming them the other way round would
    compute AP with every class's detections under another category."""
    from PIL import Image

    from norcal.core.calibration.tables import load_table

    w, h = Image.open(TINY / "images" / "img0.png").size
    cats = [{"id": c["id"], "name": c["name"]} for c in load_table("lvis_v1").categories]
    cats[0]["name"], cats[1]["name"] = "air_conditioner", "aerosol_can"
    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps({"images": [{"id": 1, "file_name": "img0.png", "height": h, "width": w}],
                              "annotations": [], "categories": cats}))
    rc = main(["parity", str(tiny.dir / "g05.onnx"), str(TINY / "images" / "img0.png"),
               "--checkpoint", str(CKPT), "--config", str(CFG), "--gt", str(gt)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert (f"{gt}: its categories are the model's classes in another order: class 0 of the model is "
            "'aerosol_can' but category 1 (the 1st by id) has 'air_conditioner'") in err


def test_cli_errors(tiny, capsys):
    onnx_path = str(tiny.dir / "plain.onnx")
    assert main(["parity", onnx_path]) == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert main(["parity", onnx_path, "--engine", str(tiny.dir / "missing.engine")]) == 2
    assert "no such engine" in capsys.readouterr().err


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_cli_rejects_limit_below_one(tiny, limit, capsys):
    onnx_path = str(tiny.dir / "plain.onnx")
    assert main(["parity", onnx_path, str(tiny.dir), "--engine", "x.engine", f"--limit={limit}"]) == 2
    err = capsys.readouterr().err
    # 0 is refused by the command, a negative count already by the parser; both in one line
    assert (f"--limit must be >= 1, got {limit}" in err
            or f"argument --limit: must not be negative, got {limit}" in err), err
    assert len(err.strip().splitlines()) == 1


def test_render_tables_text():
    from rich.console import Console

    rep = compare(contract([[A, B]]), contract([[B, A]]), "fp32")
    run = ParityRun(["reference", "candidate"], {}, {"reference": 1.0, "candidate": 0.5}, [rep], 1)
    console = Console(width=100, record=True, color_system=None, file=io.StringIO())
    for t in render_tables(run):
        console.print(t)
    text = console.export_text()
    assert "candidate vs reference: fp32" in text and "1.9e+02" in text and "2 (100.0%)" in text
