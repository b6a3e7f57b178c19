"""Category ids taken from an annotation file (or a table) for a model's classes: refused
unless the file's category names, in id order, are the class names the model records
(norcal.class_names); a model without recorded names runs as before. The toy contract model
of test_infer detects classes 0 and 2 in every image; the annotation files are written here by
hand (categories 5, 7, 9)."""

import json

import pytest
from test_infer import META, build_contract_model, lvis_gt, write_images

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.workflows.infer import InferOptions, prepare_infer, run_infer

NAMES = '["c5", "c7", "c9"]'  # lvis_gt names category k "c{k}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {"plain": build_contract_model(d / "plain.onnx"),
            "named": build_contract_model(d / "named.onnx", {**META, "norcal.class_names": NAMES}),
            "bad": build_contract_model(d / "bad.onnx", {**META, "norcal.class_names": '["c5", "c7"]'})}


def _annotations(path, names):
    """lvis_gt's file with its categories 5, 7, 9 renamed to ``names`` (in that order)."""
    lvis_gt(path)
    data = json.loads(path.read_text())
    for c, name in zip(data["categories"], names):
        c["name"] = name
    data["categories"].reverse()  # listed out of id order: the check goes by id
    path.write_text(json.dumps(data))
    return path


def _run(model, tmp_path, out_name, **kw):
    out = tmp_path / out_name
    job = prepare_infer(InferOptions(model, [tmp_path / "imgs"], out, **kw))
    run_infer(job)
    return job, out.read_text()


def test_the_model_s_names_in_its_order_are_taken_and_results_unchanged(models, tmp_path):
    write_images(tmp_path / "imgs")
    gt = _annotations(tmp_path / "gt.json", ["c5", "C7", "c9"])  # names compared as the table check does
    job, named = _run(models["named"], tmp_path, "named.json", image_ids=gt)
    assert job.category_source == "image_ids" and job.category_ids == [5, 7, 9]
    _, plain = _run(models["plain"], tmp_path, "plain.json", image_ids=gt)
    assert named == plain  # the same bytes as a model that records no names
    res = json.loads(named)
    assert sorted((r["image_id"], r["category_id"]) for r in res) == [
        (11, 5), (11, 9), (12, 5), (12, 9), (13, 5), (13, 9)]


def test_another_order_is_refused_naming_the_file_and_the_class(models, tmp_path):
    write_images(tmp_path / "imgs")
    gt = _annotations(tmp_path / "gt.json", ["c7", "c5", "c9"])
    with pytest.raises(NorcalError) as e:
        prepare_infer(InferOptions(models["named"], [tmp_path / "imgs"], tmp_path / "r.json", image_ids=gt))
    assert str(e.value) == (f"{gt}: its categories are the model's classes in another order: class 0 of the "
                            "model is 'c5' but category 5 (the 1st by id) has 'c7'; its detections would be "
                            "written under another category")
    assert e.value.params == ("image_ids",)
    assert not (tmp_path / "r.json").exists()


def test_other_names_are_refused(models, tmp_path):
    write_images(tmp_path / "imgs")
    gt = _annotations(tmp_path / "gt.json", ["c5", "c7", "zebra"])
    with pytest.raises(NorcalError, match=r"its categories are not the model's classes: class 2 of the model "
                                          r"is 'c9' but category 9 \(the 3rd by id\) has 'zebra'"):
        prepare_infer(InferOptions(models["named"], [tmp_path / "imgs"], tmp_path / "r.json", image_ids=gt))


def test_a_model_without_names_keeps_today_s_mapping(models, tmp_path):
    write_images(tmp_path / "imgs")
    gt = _annotations(tmp_path / "gt.json", ["c7", "c5", "c9"])  # not checkable: taken in id order
    job, text = _run(models["plain"], tmp_path, "r.json", image_ids=gt)
    assert job.category_ids == [5, 7, 9]
    assert {r["category_id"] for r in json.loads(text)} == {5, 9}


def test_a_table_in_another_order_is_refused(models, tmp_path):
    write_images(tmp_path / "imgs")
    table = _annotations(tmp_path / "train.json", ["c9", "c7", "c5"])  # a training annotation file as table
    with pytest.raises(NorcalError, match=f"^table {table}: its categories are the model's classes in another "
                                          "order: class 0 of the model is 'c5' but category 5"):
        prepare_infer(InferOptions(models["named"], [tmp_path / "imgs"], tmp_path / "r.json", table=table))
    job = prepare_infer(InferOptions(models["plain"], [tmp_path / "imgs"], tmp_path / "r.json", table=table,
                                     skip_unreadable=True))
    assert job.category_ids == [5, 7, 9]


def test_malformed_names_in_the_model_are_one_line(models, tmp_path):
    write_images(tmp_path / "imgs")
    gt = lvis_gt(tmp_path / "gt.json")
    for kw in ({"image_ids": gt}, {"skip_unreadable": True}):  # refused whatever gives the ids
        with pytest.raises(NorcalError) as e:
            prepare_infer(InferOptions(models["bad"], [tmp_path / "imgs"], tmp_path / "r.json", **kw))
        assert str(e.value) == "model metadata norcal.class_names lists 2 names but norcal.num_classes is 3"


def test_cli_refuses_in_one_line_and_writes_nothing(models, tmp_path, capsys):
    write_images(tmp_path / "imgs")
    gt = _annotations(tmp_path / "gt.json", ["c7", "c5", "c9"])
    out = tmp_path / "r.json"
    assert main(["infer", str(models["named"]), str(tmp_path / "imgs"), "--image-ids", str(gt),
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in another order: class 0 of the model is 'c5'" in err
    assert not out.exists()
