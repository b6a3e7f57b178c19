"""norcal.workflows.infer on its own (no CLI): typed options in, a result object out; the
toy contract model of test_infer gives hand-computable detections (2 per image)."""

import json

import pytest
from test_infer import build_contract_model, lvis_gt, write_images

from norcal.core.errors import NorcalError
from norcal.workflows.infer import InferOptions, prepare_infer, run_infer, skipped_path


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_contract_model(tmp_path_factory.mktemp("model") / "toy.onnx")


def test_prepare_then_run_with_image_ids(toy, tmp_path):
    write_images(tmp_path / "imgs")
    gt = lvis_gt(tmp_path / "gt.json")
    out = tmp_path / "res.json"
    job = prepare_infer(InferOptions(toy, [tmp_path / "imgs"], out, batch_size=2, image_ids=gt))
    assert [p.name for p in job.paths] == ["000000000011.png", "12.png", "13.jpg"]
    assert job.image_ids == [11, 12, 13]
    assert job.category_source == "image_ids" and job.category_ids == [5, 7, 9]
    assert job.runner_name.startswith("onnxruntime") and job.with_masks
    assert [(p.name, why) for p, why in job.skipped] == [("broken.jpg", f"not in {gt}")]
    assert not out.exists()  # nothing written before run_infer

    done = []
    result = run_infer(job, on_done=done.append)
    assert sum(done) == 3
    assert result.results_path == out and result.num_images == 3 and result.num_detections == 6
    assert [p.name for p, _ in result.skipped] == ["broken.jpg"] and result.skipped_path is None
    assert set(result.seconds) == {"prepare", "infer"} and result.pictures == []
    res = json.loads(out.read_text())
    assert sorted((r["image_id"], r["category_id"]) for r in res) == [
        (11, 5), (11, 9), (12, 5), (12, 9), (13, 5), (13, 9)]
    assert all("segmentation" in r for r in res)


def test_skip_unreadable_writes_the_skipped_list(toy, tmp_path):
    write_images(tmp_path / "imgs")
    out = tmp_path / "res.json"
    options = InferOptions(toy, [tmp_path / "imgs"], out, masks=False)
    with pytest.raises(NorcalError, match="broken.jpg: cannot read the image"):
        prepare_infer(options)
    job = prepare_infer(InferOptions(toy, [tmp_path / "imgs"], out, masks=False, skip_unreadable=True))
    assert [p.name for p, _ in job.unreadable] == ["broken.jpg"] and not job.not_listed
    assert job.category_source == "model metadata"  # norcal.category_ids
    result = run_infer(job)
    assert result.skipped_path == skipped_path(out) == tmp_path / "res.skipped.json"
    listed = json.loads(result.skipped_path.read_text())
    assert listed["images_run"] == 3 and [s["file"] for s in listed["skipped"]] == [str(tmp_path / "imgs" / "broken.jpg")]
    assert result.num_detections == 6
    assert all("segmentation" not in r for r in json.loads(out.read_text()))


@pytest.mark.parametrize("kwargs, params", [
    ({"batch_size": 0}, ("batch_size",)),
    ({"threads": 0}, ("threads",)),
    ({"draw_dir": "pics", "draw_count": 0}, ("draw_count",)),
    ({"draw_count": 3}, ("draw_count", "draw_dir")),  # nothing would be drawn: said, not ignored
    ({"draw_dir": "pics", "ray": object()}, ("draw_dir", "ray")),
])
def test_bad_options_name_the_parameter(toy, tmp_path, kwargs, params):
    with pytest.raises(NorcalError) as e:
        prepare_infer(InferOptions(toy, [tmp_path], tmp_path / "r.json", **kwargs))
    assert e.value.params == params and "--" not in str(e.value)


def test_outputs_are_checked_before_any_work(toy, tmp_path):
    write_images(tmp_path / "imgs")
    image = tmp_path / "imgs" / "12.png"
    before = image.read_bytes()
    with pytest.raises(NorcalError, match="output"):
        prepare_infer(InferOptions(toy, [tmp_path / "imgs"], image))
    seen = []
    prepare_infer(InferOptions(toy, [tmp_path / "imgs" / "12.png"], tmp_path / "r.json"),
                  check_outputs=seen.append)
    assert seen == [[image]] and image.read_bytes() == before


def _copy(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    return dst


def test_two_files_with_one_image_id_are_refused(toy, tmp_path):
    # 1.png and 001.jpg both have image id 1: their detections would merge into one image's
    write_images(tmp_path / "imgs")
    src = tmp_path / "imgs" / "12.png"
    a, b = _copy(src, tmp_path / "d" / "1.png"), _copy(src, tmp_path / "d" / "sub" / "001.png")
    out = tmp_path / "r.json"
    with pytest.raises(NorcalError) as e:
        prepare_infer(InferOptions(toy, [tmp_path / "d"], out))
    msg = str(e.value)
    assert "\n" not in msg and "image id 1" in msg and str(a) in msg and str(b) in msg
    # the same file given twice, and one base name in two folders matched by image_ids
    with pytest.raises(NorcalError, match="image id 12"):
        prepare_infer(InferOptions(toy, [src, src], out))
    gt = lvis_gt(tmp_path / "gt.json")
    c = _copy(src, tmp_path / "e" / "x" / "12.png")
    d = _copy(src, tmp_path / "e" / "y" / "12.png")
    with pytest.raises(NorcalError, match="image id 12") as e:
        prepare_infer(InferOptions(toy, [tmp_path / "e"], out, image_ids=gt))
    assert str(c) in str(e.value) and str(d) in str(e.value)
    assert not out.exists()


def test_cli_refuses_two_files_with_one_image_id(toy, tmp_path, capsys):
    from norcal.cli import main

    write_images(tmp_path / "imgs")
    _copy(tmp_path / "imgs" / "12.png", tmp_path / "imgs" / "sub" / "0012.png")
    out = tmp_path / "r.json"
    assert main(["infer", str(toy), str(tmp_path / "imgs"), "--skip-unreadable", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "image id 12" in err
    assert not out.exists()


def test_images_of_another_size_than_the_annotations_say_are_refused(toy, tmp_path):
    # boxes are written in the file's pixels: a resized copy of an annotated image would be
    # evaluated against the annotations' pixels without a word (detectron2's check_image_size
    # refuses it too, after EXIF orientation)
    from PIL import Image

    from test_infer import solid

    write_images(tmp_path / "imgs")
    gt = lvis_gt(tmp_path / "gt.json")  # 12.png: 100 x 50 (h x w)
    out = tmp_path / "r.json"
    Image.fromarray(solid(50, 25, (0, 0, 200))).save(tmp_path / "imgs" / "12.png")
    with pytest.raises(NorcalError) as e:
        prepare_infer(InferOptions(toy, [tmp_path / "imgs"], out, image_ids=gt))
    assert str(e.value) == (f"{tmp_path / 'imgs' / '12.png'}: the image is 25x50 pixels (w x h) but {gt} "
                            "gives image 12 as 50x100; its boxes would be in other pixels than the "
                            "annotations' (a resized or rotated copy?)")
    # stored 50 x 100 (h x w), EXIF orientation 6 (turned upright by read_rgb): 100 x 50, as annotated
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(solid(50, 100, (0, 0, 200))).save(tmp_path / "imgs" / "12.png", exif=exif)
    job = prepare_infer(InferOptions(toy, [tmp_path / "imgs"], out, image_ids=gt))
    assert job.image_ids == [11, 12, 13]
    # the same pixels without the tag are 100 wide: refused
    Image.fromarray(solid(50, 100, (0, 0, 200))).save(tmp_path / "imgs" / "12.png")
    with pytest.raises(NorcalError, match="the image is 100x50 pixels"):
        prepare_infer(InferOptions(toy, [tmp_path / "imgs"], out, image_ids=gt))
    assert not out.exists()


def test_ray_job_opens_here_on_the_cpu_and_names_the_workers_provider(toy, tmp_path):
    from norcal.runtime.ray_inference import RayOptions

    write_images(tmp_path / "imgs")
    job = prepare_infer(InferOptions(toy, [tmp_path / "imgs"], tmp_path / "res.json", provider="cuda",
                                     skip_unreadable=True, ray=RayOptions(num_workers=1)))
    assert job.runner is None and job.runner_name == "onnxruntime-cuda"
