"""`norcal eval`'s inputs refused in one line, consistently: a score threshold outside [0, 1)
(as --conf), --split with a JSON GT, a data.yaml split without labels, federated lists naming
unknown categories; and a data.yaml GT grouped by its own training split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.evaluation import prepare_gt
from test_coco_rules import _two_boxes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core" / "datasets"))
from test_yolo_ground_truth import _dataset, _image  # noqa: E402


def _files(tmp_path, federated=False):
    gt, res = _two_boxes(federated)
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "res.json").write_text(json.dumps(res))
    return str(tmp_path / "gt.json"), str(tmp_path / "res.json")


@pytest.mark.parametrize("value", ["-1", "1.5", "1"])  # nan, inf: refused by the flag's type
def test_score_thresh_outside_0_1_is_refused_as_conf_is(tmp_path, capsys, value):
    gt, res = _files(tmp_path)
    assert main(["eval", "--gt", gt, "--results", res, "--score-thresh", value]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --score-thresh must be a number in [0, 1), got {float(value)!r}\n"


def test_score_thresh_zero_is_taken(tmp_path, capsys):
    gt, res = _files(tmp_path)
    assert main(["eval", "--gt", gt, "--results", res, "--score-thresh", "0", "--no-fixed"]) == 0


def test_split_with_a_json_gt_is_refused(tmp_path, capsys):
    gt, res = _files(tmp_path)
    out = tmp_path / "m.json"
    assert main(["eval", "--gt", gt, "--results", res, "--split", "val", "--json", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --split val applies to an Ultralytics data.yaml; {gt} is an "
                                       "annotation file with no splits (leave --split out)\n")
    assert not out.exists()


def test_a_data_yaml_split_without_labels_is_refused(tmp_path, capsys):
    d = tmp_path / "ds"
    _image(d / "images/val/1.png")
    _image(d / "images/train/2.png")
    (d / "labels/train").mkdir(parents=True)
    (d / "labels/train/2.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (d / "data.yaml").write_text(f"path: {d}\ntrain: images/train\nval: images/val\nnames: [cat]\n")
    (tmp_path / "res.json").write_text(json.dumps([{"image_id": 2, "category_id": 1, "bbox": [1, 1, 5, 5],
                                                    "score": 0.5}]))
    argv = ["eval", "--gt", str(d / "data.yaml"), "--results", str(tmp_path / "res.json")]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"error: {d / 'data.yaml'}: split 'val' has no labels folder: "
                                       f"{d / 'labels/val'} (where Ultralytics reads the labels of 1.png) "
                                       "does not exist\n")
    assert main(argv + ["--split", "train"]) == 0  # the split with labels is scored


@pytest.mark.parametrize("field", ["neg_category_ids", "not_exhaustive_category_ids"])
def test_federated_lists_naming_an_unknown_category_are_refused(field):
    gt, _ = _two_boxes(federated=True)
    gt["images"][1][field] = [1, 7]
    with pytest.raises(NorcalError) as e:
        prepare_gt(gt)
    # worded as an annotation's unknown category_id is
    assert str(e.value) == f"GT: images[1] (id 2): {field}: 7 is not the id of any entry in categories"
    gt["annotations"][0]["category_id"] = 7
    gt["images"][1][field] = [1]
    with pytest.raises(NorcalError, match=r"^GT: annotations\[0\] \(id 1\): category_id: 7 is not the id of "
                                          r"any entry in categories$"):
        prepare_gt(gt)


def test_a_data_yaml_gt_is_grouped_by_its_training_split(tmp_path, capsys):
    # ds: train = val = the four images; labelled classes by hand: how many images hold each
    yaml = _dataset(tmp_path / "ds", polygons=False)
    holding = {}
    for label in sorted((yaml.parent / "labels/val").glob("*.txt")):
        for c in {int(line.split()[0]) for line in label.read_text().splitlines()}:
            holding[c + 1] = holding.get(c + 1, 0) + 1
    assert holding and max(holding.values()) <= 10  # all rare by LVIS's edges
    (tmp_path / "r.json").write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5],
                                                  "score": 0.5}]))
    out = tmp_path / "m.json"
    assert main(["eval", "--gt", str(yaml), "--split", "val", "--results", str(tmp_path / "r.json"),
                 "--no-fixed", "--json", str(out), "--per-class-csv", str(tmp_path / "ap.csv")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"frequency groups (APr/APc/APf) and N_c from {yaml}'s train split"
    doc = json.loads(out.read_text())
    assert "APr" in doc["stats"] and doc["stats"]["APc"] == -1 and doc["stats"]["APf"] == -1
    counts = {row["category_id"]: row["image_count"] for row in doc["per_class"]}
    assert {c: n for c, n in counts.items() if n} == holding
