"""Mask evaluation on malformed or mismatched segmentations: polygons pycocotools trips on,
RLEs of another size than their image. Each is evaluated as lvis-api would evaluate the
well-formed equivalent, or refused in one line naming the file, the record and the field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pycocotools.mask as mask_utils
import pytest
from test_evaluation import assert_same, lvis_api, make_results, reference, synthetic_gt  # noqa: F401

from norcal.core.errors import NorcalError
from norcal.evaluation import evaluate

SQUARE = [10.0, 10.0, 60.0, 10.0, 60.0, 60.0, 10.0, 60.0]


def _gt_and_results(seed=5):
    gt = synthetic_gt(seed=seed)
    return gt, make_results(gt, seed=seed + 1, segm=True)


def test_a_two_point_polygon_first_is_evaluated_as_lvis_api_does_it_second(lvis_api, tmp_path):
    # pycocotools' frPyObjects takes a polygon list whose first entry has 4 numbers for boxes
    # and fails; lvis-api evaluates the same parts in another order (merge is a union)
    gt, res = _gt_and_results()
    line = [5.0, 5.0, 40.0, 7.0]
    ref_gt = copy.deepcopy(gt)
    ref_gt["annotations"][0]["segmentation"] = ref_gt["annotations"][0]["segmentation"] + [line]
    gt["annotations"][0]["segmentation"] = [line] + gt["annotations"][0]["segmentation"]
    assert_same(reference(lvis_api, ref_gt, res, "segm", tmp_path), evaluate(gt, res, "segm"))


@pytest.mark.parametrize("seg, problem", [
    ([], "segmentation: no polygons"),
    ([[1.0, 2.0, 3.0, 4.0, 5.0]], r"segmentation\[0\]: 5 numbers: a polygon is x, y pairs"),
    ([SQUARE, [1.0, 2.0]], r"segmentation\[1\]: 2 numbers: a polygon needs at least 2 points"),
    ({"size": [10, 10], "counts": [0, 100]}, r"segmentation: RLE size \[10, 10\] is not image 500.s "
                                              r"\[300, 400\]"),
    ({"size": [300, 400], "counts": [5, 3]}, r"segmentation: RLE counts sum to 8, not 300 x 400 = 120000"),
])
def test_malformed_gt_masks_are_one_line_errors(seg, problem):
    gt, res = _gt_and_results()
    gt["annotations"][0]["segmentation"] = seg
    with pytest.raises(NorcalError, match=r"^GT: annotations\[0\] \(id 1\): " + problem) as e:
        evaluate(gt, res, "segm")
    assert "\n" not in str(e.value)


def test_result_masks_of_another_size_are_refused(tmp_path):
    # lvis-api silently scores an IoU of -1 (never a match): AP 0 with no word why
    gt, res = _gt_and_results()
    assert res[3]["image_id"] == 500
    res[3]["segmentation"] = mask_utils.encode(np.asfortranarray(np.ones((30, 40), np.uint8)))
    res[3]["segmentation"]["counts"] = res[3]["segmentation"]["counts"].decode()
    path = tmp_path / "res.json"
    path.write_text(json.dumps(res))
    with pytest.raises(NorcalError, match=rf"^{path}: \[3\]: segmentation: RLE size \[30, 40\] is not "
                                          r"image 500's \[300, 400\]$"):
        evaluate(gt, str(path), "segm")
    evaluate(gt, str(path), "bbox")  # box AP does not read the masks
    many = [dict(res[0], score=0.001)] * 400 + res  # past the cap of 300 per image: still record 403
    with pytest.raises(NorcalError, match=r"^results: \[403\]: segmentation: RLE size \[30, 40\]"):
        evaluate(gt, many, "segm")


def test_cli_gt_polygon_errors_are_one_line(tmp_path):
    gt, res = _gt_and_results()
    gt["annotations"][2]["segmentation"] = []
    gpath, rpath = tmp_path / "gt.json", tmp_path / "res.json"
    gpath.write_text(json.dumps(gt))
    rpath.write_text(json.dumps(res))
    p = subprocess.run([sys.executable, "-m", "norcal", "eval", "--gt", str(gpath), "--results", str(rpath),
                        "--iou-type", "segm", "--no-fixed"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [f"error: {gpath}: annotations[2] (id 3): segmentation: no polygons"]


def _uncompressed(rle):
    """An RLE with its run lengths as a list (column-major, starting with a run of zeros)."""
    flat = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}).flatten(order="F")
    edges = np.r_[0, np.flatnonzero(np.diff(flat)) + 1, flat.size]
    runs = np.diff(edges).tolist()
    return {"size": rle["size"], "counts": ([0] if flat[0] else []) + runs}


@pytest.mark.parametrize("iou_type", ["segm", "boundary"])
def test_uncompressed_result_masks_are_evaluated_as_the_compressed_ones(lvis_api, tmp_path, iou_type):
    gt, res = _gt_and_results(seed=8)
    for d in res:
        del d["bbox"]  # mask-only: the areas come from the masks
    lists = copy.deepcopy(res)
    for d in lists[::2]:
        d["segmentation"] = _uncompressed(d["segmentation"])
    ours = evaluate(gt, lists, iou_type)
    if iou_type == "segm":
        assert_same(reference(lvis_api, gt, res, "segm", tmp_path), ours)
    else:
        assert ours.stats == evaluate(gt, res, iou_type).stats
    # box AP of mask-only results reads the masks too (boxes and areas from them)
    assert evaluate(gt, lists, "bbox").stats == evaluate(gt, res, "bbox").stats
    bad = copy.deepcopy(lists)
    bad[0]["segmentation"]["counts"][-1] += 1
    with pytest.raises(NorcalError, match=r"^results: \[0\]: segmentation: RLE counts sum to 120001, "
                                          r"not 300 x 400 = 120000$"):
        evaluate(gt, bad, iou_type)


def test_cli_notes_results_that_cover_only_some_gt_images(tmp_path, capsys):
    from norcal.cli import main

    gt, res = _gt_and_results()
    first = {im["id"] for im in gt["images"][:4]}
    gpath, rpath = tmp_path / "gt.json", tmp_path / "res.json"
    gpath.write_text(json.dumps(gt))
    rpath.write_text(json.dumps([d for d in res if d["image_id"] in first]))
    assert main(["eval", "--gt", str(gpath), "--results", str(rpath), "--no-fixed"]) == 0
    assert "the results cover 4 of the GT's 10 images" in " ".join(capsys.readouterr().out.split())
    rpath.write_text(json.dumps(res))
    assert main(["eval", "--gt", str(gpath), "--results", str(rpath), "--no-fixed"]) == 0
    assert "results cover" not in capsys.readouterr().out


def test_cli_names_the_fixed_cap_flag(tmp_path, capsys):
    from norcal.cli import main

    gt, res = _gt_and_results()
    gpath, rpath = tmp_path / "gt.json", tmp_path / "res.json"
    gpath.write_text(json.dumps(gt))
    rpath.write_text(json.dumps(res))
    assert main(["eval", "--gt", str(gpath), "--results", str(rpath), "--fixed-per-class", "0"]) == 2
    assert capsys.readouterr().err == "error: --fixed-per-class must be >= 1, got 0\n"


def test_plots_of_a_gt_without_frequency_groups_warn_of_nothing(tmp_path):
    import warnings

    from norcal.evaluation.report import write_plots

    gt, res = _gt_and_results()
    for c in gt["categories"]:
        del c["frequency"]
    result = evaluate(gt, res)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib: "No artists with labels found to put in legend"
        written = write_plots(tmp_path / "plots", result)
    assert [p.read_bytes()[:4] for p in written] == [b"\x89PNG"] * 2
