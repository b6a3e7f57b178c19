"""Every JSON input is validated at load: a bad value is one NorcalError line naming the file,
the record and the field; a valid file loads as before."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import SYNTH
from norcal.core.errors import NorcalError
from norcal.core.files.fileio import read_json
from norcal.core.datasets.schemas import ANNOTATIONS, GROUND_TRUTH, RESULTS, TABLE
from norcal.core.calibration.tables import build_table, load_table
from norcal.evaluation import from_results, prepare_gt

NAN, INF = float("nan"), float("inf")


def table_doc() -> dict:
    return {"name": "t", "source": "test", "count_type": "image", "categories": [
        {"id": 1, "name": "a", "image_count": 50, "instance_count": 70, "frequency": "c"},
        {"id": 2, "name": "b", "image_count": 3, "instance_count": 4, "frequency": "r"}]}


def annotations_doc() -> dict:
    """COCO-style training annotations (no height/width/area needed to count)."""
    return {"images": [{"id": 1, "file_name": "1.jpg"}, {"id": 2, "file_name": "2.jpg"}],
            "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
            "annotations": [{"id": 10, "image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5]},
                            {"id": 11, "image_id": 2, "category_id": 2, "bbox": [1, 1, 4, 4]},
                            {"id": 12, "image_id": 2, "category_id": 1, "bbox": [2, 2, 3, 3]}]}


def gt_doc() -> dict:
    return {"images": [{"id": 1, "height": 100, "width": 100, "neg_category_ids": [2],
                        "not_exhaustive_category_ids": []},
                       {"id": 2, "height": 100, "width": 100, "neg_category_ids": [],
                        "not_exhaustive_category_ids": []}],
            "categories": [{"id": 1, "name": "a", "frequency": "f"}, {"id": 2, "name": "b", "frequency": "r"}],
            "annotations": [{"id": 10, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "area": 100.0,
                             "segmentation": [[0, 0, 10, 0, 10, 10, 0, 10]]},
                            {"id": 11, "image_id": 2, "category_id": 2, "bbox": [5, 5, 20, 20], "area": 400.0,
                             "segmentation": [[5, 5, 25, 5, 25, 25, 5, 25]]},
                            {"id": 12, "image_id": 2, "category_id": 1, "bbox": [50, 50, 8, 8], "area": 64.0,
                             "segmentation": [[50, 50, 58, 50, 58, 58, 50, 58]]}]}


def results_doc() -> list:
    return [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.9},
            {"image_id": 2, "category_id": 2, "bbox": [5, 5, 20, 20], "score": 0.8},
            {"image_id": 2, "category_id": 1, "bbox": [50, 50, 8, 8], "score": 0.7}]


FORMATS = {  # format: (valid document, loader of a path)
    "table": (table_doc, load_table),
    "annotations": (annotations_doc, build_table),
    "gt": (gt_doc, prepare_gt),
    "results": (results_doc, from_results),
}


def setter(*path, value=None, delete=False):
    def mutate(doc):
        node = doc
        for p in path[:-1]:
            node = node[p]
        if delete:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return mutate


# (format, mutation, record, field, problem): the message is "{file}: {record}: {field}: {problem}"
CASES = [
    # a string where a number belongs
    ("table", setter("categories", 1, "image_count", value="3"), r"categories\[1\] \(id 2\)", "image_count",
     "expected a count .*, got string '3'"),
    ("annotations", setter("annotations", 1, "bbox", 2, value="4"), r"annotations\[1\] \(id 11\)", r"bbox\[2\]",
     "expected a number, got string '4'"),
    ("gt", setter("annotations", 0, "area", value="100"), r"annotations\[0\] \(id 10\)", "area",
     "expected a number, got string '100'"),
    ("gt", setter("images", 1, "height", value="100"), r"images\[1\] \(id 2\)", "height",
     "expected an integer, got string '100'"),
    ("results", setter(2, "score", value="0.7"), r"\[2\]", "score", "expected a number, got string '0.7'"),
    # a list where an object belongs
    ("table", setter("categories", 0, value=[1, "a"]), r"categories\[0\]", None, "expected an object, got a list of 2"),
    ("annotations", setter("annotations", 2, value=[12, 2, 1]), r"annotations\[2\]", None,
     "expected an object, got a list of 3"),
    ("gt", setter("images", 0, value=[1, 100, 100]), r"images\[0\]", None, "expected an object, got a list of 3"),
    ("results", setter(1, value=[2, 2, 0.8]), r"\[1\]", None, "expected an object, got a list of 3"),
    # a category id "x7"
    ("table", setter("categories", 1, "id", value="x7"), r"categories\[1\]", "id",
     "expected an integer, got string 'x7'"),
    ("annotations", setter("annotations", 0, "category_id", value="x7"), r"annotations\[0\] \(id 10\)",
     "category_id", "expected an integer, got string 'x7'"),
    ("gt", setter("categories", 0, "id", value="x7"), r"categories\[0\]", "id", "expected an integer, got string 'x7'"),
    ("results", setter(0, "category_id", value="x7"), r"\[0\]", "category_id", "expected an integer, got string 'x7'"),
    # a string image id
    ("annotations", setter("images", 1, "id", value="2"), r"images\[1\]", "id", "expected an integer, got string '2'"),
    ("gt", setter("annotations", 2, "image_id", value="2"), r"annotations\[2\] \(id 12\)", "image_id",
     "expected an integer, got string '2'"),
    ("results", setter(1, "image_id", value="2"), r"\[1\]", "image_id", "expected an integer, got string '2'"),
    # a 3-number bbox
    ("annotations", setter("annotations", 1, "bbox", value=[1, 1, 4]), r"annotations\[1\] \(id 11\)", "bbox",
     "expected 4 numbers, got 3"),
    ("gt", setter("annotations", 1, "bbox", value=[5, 5, 20]), r"annotations\[1\] \(id 11\)", "bbox",
     "expected 4 numbers, got 3"),
    ("results", setter(2, "bbox", value=[50, 50, 8]), r"\[2\]", "bbox", "expected 4 numbers, got 3"),
    # NaN, infinite and negative boxes
    ("annotations", setter("annotations", 0, "bbox", 0, value=NAN), r"annotations\[0\] \(id 10\)", r"bbox\[0\]",
     "expected a finite number, got nan"),
    ("gt", setter("annotations", 2, "bbox", 3, value=INF), r"annotations\[2\] \(id 12\)", r"bbox\[3\]",
     "expected a finite number, got inf"),
    ("results", setter(0, "bbox", 1, value=NAN), r"\[0\]", r"bbox\[1\]", "expected a finite number, got nan"),
    ("results", setter(1, "bbox", 2, value=-INF), r"\[1\]", r"bbox\[2\]", "expected a finite number, got -inf"),
    ("annotations", setter("annotations", 2, "bbox", 2, value=-3), r"annotations\[2\] \(id 12\)", "bbox",
     r"negative width or height \(-3 x 3\)"),
    ("gt", setter("annotations", 1, "bbox", 3, value=-1.5), r"annotations\[1\] \(id 11\)", "bbox",
     r"negative width or height \(20 x -1.5\)"),
    ("results", setter(2, "bbox", 2, value=-8), r"\[2\]", "bbox", r"negative width or height \(-8 x 8\)"),
    # a non-finite score or count
    ("results", setter(0, "score", value=NAN), r"\[0\]", "score", "expected a finite number, got nan"),
    ("table", setter("categories", 0, "instance_count", value=INF), r"categories\[0\] \(id 1\)", "instance_count",
     "expected a finite number, got inf"),
    ("table", setter("categories", 1, "image_count", value=-3), r"categories\[1\] \(id 2\)", "image_count",
     "must be >= 0, got -3"),
    # GT without area or bbox, images without height or width
    ("gt", setter("annotations", 1, "area", delete=True), r"annotations\[1\] \(id 11\)", "area", "missing"),
    ("gt", setter("annotations", 0, "bbox", delete=True), r"annotations\[0\] \(id 10\)", "bbox", "missing"),
    ("gt", setter("images", 0, "height", delete=True), r"images\[0\] \(id 1\)", "height", "missing"),
    ("gt", setter("images", 1, "width", delete=True), r"images\[1\] \(id 2\)", "width", "missing"),
    ("gt", setter("images", 1, "width", value=0), r"images\[1\] \(id 2\)", "width", "must be > 0, got 0"),
    # duplicate ids
    ("table", setter("categories", 1, "id", value=1), r"categories\[1\] \(id 1\)", "id",
     r"duplicate id 1 \(also categories\[0\]\)"),
    ("annotations", setter("annotations", 2, "id", value=10), r"annotations\[2\] \(id 10\)", "id",
     r"duplicate id 10 \(also annotations\[0\]\)"),
    ("gt", setter("images", 1, "id", value=1), r"images\[1\] \(id 1\)", "id", r"duplicate id 1 \(also images\[0\]\)"),
    ("gt", setter("categories", 0, "id", value=2), r"categories\[1\] \(id 2\)", "id",
     r"duplicate id 2 \(also categories\[0\]\)"),
    ("gt", setter("annotations", 1, "id", value=12), r"annotations\[2\] \(id 12\)", "id",
     r"duplicate id 12 \(also annotations\[1\]\)"),
    # ids that point nowhere
    ("annotations", setter("annotations", 1, "category_id", value=9), r"annotations\[1\] \(id 11\)", "category_id",
     "9 is not the id of any entry in categories"),
    ("annotations", setter("annotations", 2, "image_id", value=7), r"annotations\[2\] \(id 12\)", "image_id",
     "7 is not the id of any entry in images"),
    ("gt", setter("annotations", 0, "category_id", value=3), r"annotations\[0\] \(id 10\)", "category_id",
     "3 is not the id of any entry in categories"),
    ("gt", setter("annotations", 2, "image_id", value=5), r"annotations\[2\] \(id 12\)", "image_id",
     "5 is not the id of any entry in images"),
    # other bad values
    ("table", setter("categories", 0, "frequency", value="x"), r"categories\[0\] \(id 1\)", "frequency",
     "expected 'r', 'c' or 'f', got string 'x'"),
    ("gt", setter("annotations", 1, "segmentation", value=5), r"annotations\[1\] \(id 11\)", "segmentation",
     "expected polygons .* or an RLE object, got 5"),
    ("gt", setter("annotations", 1, "segmentation", 0, 3, value=None), r"annotations\[1\] \(id 11\)",
     r"segmentation\[0\]\[3\]", "expected a number, got null"),
    ("gt", setter("annotations", 0, "segmentation", value={"size": [100], "counts": "abc"}),
     r"annotations\[0\] \(id 10\)", r"segmentation\.size", "expected 2 numbers, got 1"),
    ("results", setter(1, "segmentation", value=[[5, 5, 25, 5, 25, 25]]), r"\[1\]", "segmentation",
     r"results must be RLE .*, got a list of 1"),
    ("results", setter(0, "image_id", value=True), r"\[0\]", "image_id", "expected an integer, got true"),
    ("results", setter(1, "bbox", delete=True), r"\[1\]", "bbox",
     r"missing \(the first detection has one: all need the same keys\)"),
    ("annotations", setter("annotations", 0, "id", value=2 ** 64), r"annotations\[0\]", "id",
     "must be < 9223372036854775808, got 18446744073709551616"),
]


def write(tmp_path: Path, doc) -> Path:
    p = tmp_path / "input.json"
    p.write_text(json.dumps(doc))  # NaN and Infinity as Python writes them
    return p


def load(fmt: str, path: Path):
    return FORMATS[fmt][1](path)


def one_line_error(fn) -> str:
    with pytest.raises(NorcalError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


@pytest.mark.parametrize("fmt, mutate, record, field, problem", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_value_names_file_record_and_field(tmp_path, fmt, mutate, record, field, problem):
    doc = FORMATS[fmt][0]()
    mutate(doc)
    p = write(tmp_path, doc)
    msg = one_line_error(lambda: load(fmt, p))
    where = re.escape(str(p))
    want = f"^{where}: {record}: {field}: {problem}$" if field else f"^{where}: {record}: {problem}$"
    assert re.match(want, msg), msg
    # the same document given in memory (GT, results) is refused the same way
    if fmt in ("gt", "results"):
        mem = one_line_error(lambda: FORMATS[fmt][1](json.loads(p.read_text())))
        assert mem == msg.replace(str(p), "GT" if fmt == "gt" else "results")


@pytest.mark.parametrize("fmt", FORMATS)
def test_valid_documents_load(tmp_path, fmt):
    load(fmt, write(tmp_path, FORMATS[fmt][0]()))


@pytest.mark.parametrize("fmt, doc, message", [
    ("table", [1, 2], "not a calibration table: expected an object, got a list of 2"),
    ("table", {"name": "t"}, "not a calibration table: categories: missing"),
    ("annotations", {"annotations": []}, "not a COCO/LVIS annotation file: categories: missing"),
    ("annotations", {"categories": {"id": 1}}, "not a COCO/LVIS annotation file: categories: expected a list, got an object"),
    ("gt", {"images": []}, "not an LVIS annotation file: annotations: missing"),
    ("gt", dict(gt_doc(), images=[]), "images: must not be empty"),
    ("gt", dict(gt_doc(), categories=[]), "categories: must not be empty"),
    ("results", {"image_id": 1}, "not a result list: expected a list, got an object"),
    ("results", [], "no detections"),
])
def test_bad_top_level(tmp_path, fmt, doc, message):
    p = write(tmp_path, doc)
    msg = one_line_error(lambda: load(fmt, p))
    assert msg == f"{p}: {message}" or (message == "no detections" and msg.startswith(f"{p}: no detections"))


def test_annotation_file_without_annotations_needs_counts(tmp_path):
    doc = annotations_doc()
    del doc["annotations"]
    p = write(tmp_path, doc)
    msg = one_line_error(lambda: build_table(p))
    assert msg == f"{p}: categories[0] (id 1): image_count: missing (the file has no annotations to count)"
    for c, n in zip(doc["categories"], (5, 7)):
        c.update(image_count=n, instance_count=n + 1)
    assert build_table(write(tmp_path, doc)).counts().tolist() == [5, 7]


def test_not_json_and_deep_json(tmp_path):
    for schema in (TABLE, ANNOTATIONS, GROUND_TRUTH, RESULTS):
        bad = tmp_path / "bad.json"
        bad.write_text('{"categories": [1,')
        assert "not valid JSON" in one_line_error(lambda: read_json(bad, schema=schema))
        bad.write_bytes(b'["\xff"]')
        assert "not valid JSON" in one_line_error(lambda: read_json(bad, schema=schema))
        bad.write_text("[" * 100_000 + "]" * 100_000)
        one_line_error(lambda: read_json(bad, schema=schema))


def test_valid_files_load_as_before(tmp_path):
    """Parsing and validating in one pass gives the values json.load gives (ints stay ints in
    tables, so a table's digest does not change)."""
    from importlib import resources

    for name in ("lvis_v1", "lvis_v0_5"):
        raw = json.loads(resources.files("norcal.calibration_tables").joinpath(f"{name}.json").read_text())
        t = load_table(name)
        assert t.to_json() == raw
        assert json.dumps(t.to_json(), sort_keys=True) == json.dumps(raw, sort_keys=True)
    fixture = SYNTH
    for path, schema in ((fixture / "val.json", GROUND_TRUTH), (fixture / "train_annotations.json", ANNOTATIONS)):
        assert read_json(path, schema=schema) == json.loads(path.read_text())
    table = table_doc()
    assert read_json(write(tmp_path, table), schema=TABLE) == table
    p = write(tmp_path, table)
    assert json.dumps(load_table(p).to_json()) == json.dumps(table)


def test_prepared_gt_is_the_same_from_file_and_from_dict(tmp_path):
    doc = gt_doc()
    a, b = prepare_gt(write(tmp_path, doc)), prepare_gt(copy.deepcopy(doc))
    for k in ("img_ids", "cat_ids", "img_hw", "ann_img", "ann_cat", "ann_area", "ann_ignore", "ann_bbox",
              "ann_id", "pos_keys", "neg_keys", "nel_keys"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    assert a.ann_bbox.tolist() == [a["bbox"] for a in doc["annotations"]]
    assert a.dataset == doc and a.cat_names == ["a", "b"] and a.frequency == ["f", "r"]
    assert math.isnan(a.image_count[0])


def test_a_utf8_byte_order_mark_is_read_past(tmp_path):
    # editors on Windows save JSON with a BOM; Python's utf-8-sig codec (and lvis-api's
    # json.load of such a file opened as utf-8-sig) reads past it
    doc = table_doc()
    p = tmp_path / "bom.json"
    p.write_bytes(json.dumps(doc).encode("utf-8-sig"))
    assert read_json(p, schema=TABLE) == doc
    assert read_json(p) == doc
