"""Calibration tables: the built-ins, building from annotations, and bad tables."""

import json

import pytest

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import build_table, builtin_names, load_table


def test_builtins():
    assert builtin_names() == ["lvis_v0_5", "lvis_v1"]
    v1 = load_table("lvis_v1")
    assert v1.num_classes == 1203 and v1.group_counts() == {"r": 337, "c": 461, "f": 405}
    # facts from the LVIS v1 train annotations' category list
    first = v1.categories[0]
    assert (first["id"], first["name"], first["image_count"], first["instance_count"]) == (1, "aerosol_can", 64, 109)
    assert v1.category_ids == sorted(v1.category_ids)
    v05 = load_table("lvis_v0_5")
    assert v05.num_classes == 1230 and v05.group_counts() == {"r": 454, "c": 461, "f": 315}
    assert len(v1.sha256) == 64 and v1.sha256 != v05.sha256


def coco(tmp_path, anns, cats=(3, 1, 2)):
    data = {"images": [{"id": i, "file_name": f"{i}.jpg"} for i in range(1, 6)],
            "categories": [{"id": c, "name": f"cat{c}"} for c in cats],
            "annotations": [{"id": k, "image_id": img, "category_id": cat} for k, (img, cat) in enumerate(anns)]}
    p = tmp_path / "train.json"
    p.write_text(json.dumps(data))
    return p


def test_build_counts_images_and_instances(tmp_path, capsys):
    # cat1: images {1,2} (3 instances); cat2: image {3}; cat3: images {1,4,5}
    p = coco(tmp_path, [(1, 1), (1, 1), (2, 1), (3, 2), (1, 3), (4, 3), (5, 3)])
    out = tmp_path / "t.json"
    assert main(["table", "build", str(p), "-o", str(out)]) == 0
    t = load_table(out)
    assert t.category_ids == [1, 2, 3]  # category id order
    assert t.counts().tolist() == [2, 1, 3]
    assert t.counts("instance").tolist() == [3, 1, 3]
    assert t.frequencies == ["r", "r", "r"]
    assert build_table(p, "instance").count_type == "instance"
    assert "3 classes" in capsys.readouterr().out
    # --table accepts the annotation file itself everywhere
    assert load_table(p).counts().tolist() == [2, 1, 3]


def test_build_writes_a_class_without_training_data_with_a_note(tmp_path, capsys):
    """The build does not stop: the count is written as 0 and one line says how to use the
    table (--min-count); using it without a floor is still refused, naming the class."""
    p = coco(tmp_path, [(1, 1), (3, 2)])  # cat3 never annotated
    out = tmp_path / "t.json"
    assert main(["table", "build", str(p), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: 1 class(es) have no training labels (first: class 2 'cat3')" in printed
    assert "give --min-count K (e.g. 1) to norcal export / tune" in printed
    t = load_table(out)
    with pytest.raises(NorcalError, match="'cat3'.*count 0.0"):
        t.counts()
    assert t.counts(min_count=1).tolist()[2] == 1


@pytest.mark.parametrize("data,message", [
    ({"categories": [{"name": "x"}], "annotations": []}, r"a\.json: categories\[0\]: id: missing"),
    ({"categories": [{"id": 1}], "annotations": [{"id": 5, "image_id": 1}]},
     r"a\.json: annotations\[0\] \(id 5\): category_id: missing"),
    ({"categories": [{"id": 1}], "annotations": [{"image_id": 1, "category_id": 7}]},
     r"a\.json: annotations\[0\]: category_id: 7 is not the id of any entry in categories"),
])
def test_malformed_annotations(tmp_path, data, message):
    p = tmp_path / "a.json"
    p.write_text(json.dumps(data))
    with pytest.raises(NorcalError, match=message):
        build_table(p)


def test_unknown_table_and_bad_json(tmp_path):
    with pytest.raises(NorcalError, match="not a built-in"):
        load_table("lvis_v9")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(NorcalError, match="not valid JSON"):
        load_table(bad)
