"""The ONNX Runtime runner, batched inference, results JSON and `norcal infer`, end to end.

Exported detectors come from another module; here a small graph built with onnx.helper honours
the ONNX contract so every expected value can be worked out by hand:
  box 0 = the middle half of the image (0.25w, 0.25h, 0.75w, 0.75h), class 0,
          score = max of input channel 0 / 255 (blue, when the host feeds BGR);
  box 1 = the whole image, class 2, score = max of channel 2 / 255 (red);
  masks: 28x28 with the left 14 columns 1.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.core.contract import input_spec
from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner
from norcal.runtime.results import detections_to_results
from norcal.runtime.runners import open_runner
from host_inference import run_arrays

META = {"norcal.min_size_test": "32", "norcal.max_size_test": "64", "norcal.input_format": "BGR",
        "norcal.num_classes": "3", "norcal.category_ids": "[5, 7, 9]"}


def build_contract_model(path: Path, meta=META) -> Path:
    c = lambda name, arr: numpy_helper.from_array(np.asarray(arr), name)  # noqa: E731
    mask = np.zeros((1, 2, 28, 28), np.float32)
    mask[..., :14] = 1
    inits = [c("idx_wh", np.array([1, 0], np.int64)), c("q", np.float32(0.25)), c("tq", np.float32(0.75)),
             c("zero", np.float32(0)), c("k255", np.float32(255)), c("two", np.array([2], np.int64)),
             c("cls", np.array([[0, 2]], np.int64)), c("mask1", mask),
             c("ch0", np.array([0], np.int64)), c("ch2", np.array([2], np.int64)),
             c("k2828", np.array([2, 28, 28], np.int64)), c("ax1", np.array([1], np.int64))]
    N = helper.make_node
    nodes = [
        N("Shape", ["image_sizes"], ["B"], start=0, end=1),
        N("ConstantOfShape", ["B"], ["num_detections"], value=helper.make_tensor("v", TensorProto.INT64, [1], [2])),
        N("Cast", ["image_sizes"], ["hw"], to=TensorProto.FLOAT),
        N("Gather", ["hw", "idx_wh"], ["wh"], axis=1),
        N("Mul", ["wh", "q"], ["wh_q"]), N("Mul", ["wh", "tq"], ["wh_tq"]), N("Mul", ["wh", "zero"], ["wh_0"]),
        N("Concat", ["wh_q", "wh_tq"], ["box0"], axis=1), N("Concat", ["wh_0", "wh"], ["box1"], axis=1),
        N("Unsqueeze", ["box0", "ax1"], ["box0u"]),
        N("Unsqueeze", ["box1", "ax1"], ["box1u"]),
        N("Concat", ["box0u", "box1u"], ["boxes"], axis=1),
        N("Gather", ["images", "ch0"], ["img_c0"], axis=1), N("Gather", ["images", "ch2"], ["img_c2"], axis=1),
        N("Flatten", ["img_c0"], ["f0"], axis=1),
        N("Flatten", ["img_c2"], ["f2"], axis=1),
        N("ReduceMax", ["f0", "ax1"], ["m0"], keepdims=1), N("ReduceMax", ["f2", "ax1"], ["m2"], keepdims=1),
        N("Concat", ["m0", "m2"], ["s255"], axis=1), N("Div", ["s255", "k255"], ["scores"]),
        N("Concat", ["B", "two"], ["B2"], axis=0), N("Expand", ["cls", "B2"], ["classes"]),
        N("Concat", ["B", "k2828"], ["B22828"], axis=0), N("Expand", ["mask1", "B22828"], ["masks"]),
    ]
    graph = helper.make_graph(
        nodes, "contract_toy",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["B", 3, "H", "W"]),
         helper.make_tensor_value_info("image_sizes", TensorProto.INT64, ["B", 2])],
        [helper.make_tensor_value_info("num_detections", TensorProto.INT64, ["B"]),
         helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["B", 2, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", 2]),
         helper.make_tensor_value_info("classes", TensorProto.INT64, ["B", 2]),
         helper.make_tensor_value_info("masks", TensorProto.FLOAT, ["B", 2, 28, 28])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    helper.set_model_props(model, meta)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return build_contract_model(tmp_path_factory.mktemp("model") / "toy.onnx")


def solid(h, w, rgb):
    return np.broadcast_to(np.array(rgb, np.uint8), (h, w, 3)).copy()


def test_runner_exposes_contract_and_metadata(toy):
    r = open_runner(toy)
    assert isinstance(r, OnnxRuntimeRunner) and r.name == "onnxruntime-cpu"
    assert r.input_names == ["images", "image_sizes"]
    assert r.output_names == ["num_detections", "boxes", "scores", "classes", "masks"]
    assert r.metadata == META
    spec = input_spec(r.metadata)
    assert (spec.min_size, spec.max_size, spec.input_format, spec.divisibility) == (32, 64, "BGR", 32)
    assert input_spec(r.metadata, min_size=40).min_size == 40


def test_unavailable_provider_names_available_ones(toy):
    import onnxruntime as ort

    missing = [p for p, ep in (("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider"))
               if ep not in ort.get_available_providers()]
    if not missing:
        pytest.skip("this onnxruntime build has every provider")
    with pytest.raises(NorcalError, match=r"not available.*available: .*cpu"):
        OnnxRuntimeRunner(toy, missing[0])
    with pytest.raises(NorcalError, match="unknown provider"):
        OnnxRuntimeRunner(toy, "tpu")


def test_open_runner_rejects_unknown_files(tmp_path):
    with pytest.raises(NorcalError, match="unknown model type"):
        open_runner(tmp_path / "model.pt")
    with pytest.raises(NorcalError, match="no such model file"):
        open_runner(tmp_path / "absent.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(NorcalError, match="cannot load"):
        open_runner(bad)


def test_run_arrays_batches_and_maps_back(toy):
    r = open_runner(toy)
    # 40x60 -> resized 32x48 (scale 0.8); 100x50 -> 64x32 (short edge 32 gives 64 long: not capped)
    images = [solid(40, 60, (255, 0, 0)), solid(100, 50, (0, 0, 200))]
    dets = run_arrays(r, images, batch_size=2)
    assert len(dets) == 2
    # box 0 in resized coords (12, 8, 36, 24), scaled back by 60/48 and 40/32
    np.testing.assert_allclose(dets[0].boxes, [[15, 10, 45, 30], [0, 0, 60, 40]], atol=1e-4)
    np.testing.assert_allclose(dets[1].boxes, [[12.5, 25, 37.5, 75], [0, 0, 50, 100]], atol=1e-4)
    # BGR: a red image has max blue 0 and max red 255; a blue one the reverse
    np.testing.assert_allclose(dets[0].scores, [0, 1])
    np.testing.assert_allclose(dets[1].scores, [200 / 255, 0], rtol=1e-6)
    assert dets[0].classes.tolist() == [0, 2]
    same = run_arrays(r, images, batch_size=1)  # padding to a different batch shape changes nothing
    for a, b in zip(dets, same):
        np.testing.assert_array_equal(a.boxes, b.boxes)


def test_results_rle_and_category_mapping(toy):
    from pycocotools import mask as mask_util

    det = run_arrays(open_runner(toy), [solid(40, 60, (255, 0, 0))])[0]
    res = detections_to_results(7, det, [5, 7, 9])
    assert [r["category_id"] for r in res] == [5, 9]
    assert res[0]["bbox"] == pytest.approx([15, 10, 30, 20]) and res[0]["image_id"] == 7
    rle = res[1]["segmentation"]
    assert isinstance(rle["counts"], str) and rle["size"] == [40, 60]
    m = mask_util.decode({"size": rle["size"], "counts": rle["counts"].encode()})
    expect = np.zeros((40, 60), np.uint8)
    expect[:, :30] = 1  # left 14 of 28 mask columns over the full-image box: columns 0..29
    np.testing.assert_array_equal(m, expect)
    assert [r["category_id"] for r in detections_to_results(7, det, None)] == [1, 3]
    with pytest.raises(NorcalError, match="out of range"):
        detections_to_results(7, det, [5])
    boxes_only = detections_to_results(7, det, [5, 7, 9], with_masks=False)
    assert "segmentation" not in boxes_only[0]


def encode_rle(mask: np.ndarray) -> dict:
    """The reference: pycocotools' compressed RLE of a bool [H, W] mask, counts as text."""
    from pycocotools import mask as mask_util

    rle = mask_util.encode(np.asfortranarray(mask, dtype=np.uint8))
    return {**rle, "counts": rle["counts"].decode("ascii")}


def write_images(folder: Path):
    folder.mkdir()
    Image.fromarray(solid(40, 60, (255, 0, 0))).save(folder / "000000000011.png")
    Image.fromarray(solid(100, 50, (0, 0, 200))).save(folder / "12.png")
    sub = folder / "more"
    sub.mkdir()
    Image.fromarray(solid(64, 64, (0, 0, 255))).save(sub / "13.jpg")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 truncated")


def lvis_gt(path: Path):
    """LVIS ground truth: one object (category 5) = the middle half of each image."""
    images = [(11, "000000000011.png", 40, 60), (12, "12.png", 100, 50), (13, "13.jpg", 64, 64)]
    anns = []
    for i, (iid, _, h, w) in enumerate(images):
        x, y, bw, bh = 0.25 * w, 0.25 * h, 0.5 * w, 0.5 * h
        anns.append({"id": i + 1, "image_id": iid, "category_id": 5, "bbox": [x, y, bw, bh], "area": bw * bh,
                     "segmentation": [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]})
    cats = [{"id": k, "name": f"c{k}", "frequency": "r", "image_count": 3, "instance_count": 3} for k in (5, 7, 9)]
    path.write_text(json.dumps({
        "images": [{"id": i, "file_name": f, "coco_url": f"http://x/{f}", "height": h, "width": w,
                    "neg_category_ids": [7], "not_exhaustive_category_ids": []} for i, f, h, w in images],
        "annotations": anns, "categories": cats}))
    return path


def test_cli_infer_end_to_end_loads_in_lvis_api(toy, tmp_path, capsys):
    write_images(tmp_path / "imgs")
    gt = lvis_gt(tmp_path / "gt.json")
    out = tmp_path / "res.json"
    rc = main(["infer", str(toy), str(tmp_path / "imgs"), "--batch", "2", "--image-ids", str(gt), "-o", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "broken.jpg" in err and "not in" in err  # skipped and listed, not fatal
    res = json.loads(out.read_text())
    assert len(res) == 6 and {r["image_id"] for r in res} == {11, 12, 13}
    assert {r["category_id"] for r in res} == {5, 9}

    np.float = float  # lvis 0.5.3 uses the alias numpy removed
    from lvis import LVIS, LVISEval, LVISResults

    lvis = LVIS(str(gt))
    dt = LVISResults(lvis, str(out))
    assert len(dt.get_ann_ids()) == 6
    ev = LVISEval(lvis, dt, "bbox")
    ev.run()
    assert ev.results["AP"] == pytest.approx(1.0)  # every box 0 is exactly the ground truth


def test_cli_infer_default_ids_and_overrides(toy, tmp_path, capsys):
    write_images(tmp_path / "imgs")
    out = tmp_path / "res.json"
    argv = ["infer", str(toy), str(tmp_path / "imgs" / "12.png"), str(tmp_path / "imgs" / "broken.jpg"),
            "--min-size", "50", "--max-size", "200", "--no-masks", "-o", str(out)]
    assert main(argv) == 2  # an unreadable image is an error by default, named
    assert "broken.jpg: cannot read the image" in capsys.readouterr().err
    assert not out.exists()
    rc = main([*argv, "--skip-unreadable"])
    assert rc == 0
    assert "1 file(s) skipped" in capsys.readouterr().err  # unreadable: listed, not fatal
    skipped = json.loads((tmp_path / "res.skipped.json").read_text())
    assert skipped["images_run"] == 1 and [s["file"] for s in skipped["skipped"]] == [
        str(tmp_path / "imgs" / "broken.jpg")]
    res = json.loads(out.read_text())
    assert [r["image_id"] for r in res] == [12, 12]
    assert [r["category_id"] for r in res] == [5, 9]  # from the model's norcal.category_ids
    assert all("segmentation" not in r for r in res)
    assert res[0]["bbox"] == pytest.approx([12.5, 25, 25, 50], abs=1e-4)


def test_zero_sizes_are_rejected_not_ignored(toy, tmp_path, capsys):
    with pytest.raises(NorcalError, match="must be positive"):
        input_spec({}, min_size=0)
    with pytest.raises(NorcalError, match="must be positive"):
        input_spec({}, max_size=0)
    write_images(tmp_path / "imgs")
    assert main(["infer", str(toy), str(tmp_path / "imgs"), "--min-size", "0", "-o", str(tmp_path / "r.json")]) == 2
    assert "must be positive" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


# worded by norcal.core.datasets.schemas.ANNOTATIONS: the file, the record, the field
@pytest.mark.parametrize("data, message", [
    ({"images": [{"file_name": "a.png"}], "categories": [{"id": 1}]}, r"images\[0\]: id: missing"),
    ({"images": [{"id": 1, "file_name": "a.png"}], "categories": [{"name": "x"}]}, r"categories\[0\]: id: missing"),
    ({"images": [{"id": "one", "file_name": "a.png"}], "categories": [{"id": 1}]},
     r"images\[0\]: id: expected an integer, got string 'one'"),
    ({"images": [{"id": 1, "file_name": "a.png"}], "categories": [{"id": "5"}]},
     r"categories\[0\]: id: expected an integer, got string '5'"),
    ({"images": [{"id": 5.7, "file_name": "a.png"}], "categories": [{"id": 1}]},
     r"images\[0\]: id: expected an integer"),
    ({"images": [{"id": 1, "file_name": "a.png"}, {"id": 1, "file_name": "b.png"}],
      "categories": [{"id": 1}]}, r"images\[1\].*duplicate id 1"),
    # files are matched by base name: a/x.png would get b/x.png's id, or the other way round
    ({"images": [{"id": 1, "file_name": "a/x.png"}, {"id": 2, "file_name": "b/x.png"}],
      "categories": [{"id": 1}]},
     r"^[^\n]*ann.json: images\[1\] \(id 2\): file_name: b/x.png has the base name of images\[0\] "
     r"\(id 1\)'s a/x.png \(files are matched by base name\)$"),
    ({"images": [{"id": 1, "coco_url": "http://h/train/x.png"}, {"id": 2, "coco_url": "http://h/val/x.png"}],
      "categories": [{"id": 1}]}, r"images\[1\] \(id 2\): coco_url: http://h/val/x.png has the base name"),
])
def test_annotation_entries_without_ids_are_clear_errors(tmp_path, data, message):
    from norcal.runtime.results import category_ids_from_annotations

    path = tmp_path / "ann.json"
    path.write_text(json.dumps(data))
    with pytest.raises(NorcalError, match=message):
        category_ids_from_annotations(path)


def test_cli_infer_errors_exit_2(toy, tmp_path, capsys):
    write_images(tmp_path / "imgs")
    assert main(["infer", str(tmp_path / "none.onnx"), str(tmp_path / "imgs"), "-o", str(tmp_path / "r.json")]) == 2
    assert main(["infer", str(toy), str(tmp_path / "missing"), "-o", str(tmp_path / "r.json")]) == 2
    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps({"images": [{"id": 1, "file_name": "other.png"}], "categories": [{"id": 1}]}))
    assert main(["infer", str(toy), str(tmp_path / "imgs"), "--image-ids", str(gt), "-o", str(tmp_path / "r.json")]) == 2
    assert main(["infer", str(toy), str(tmp_path / "imgs"), "--table", "lvis_v1", "-o", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "no such model file" in err and "no such file or folder" in err
    assert "none of the 4 image files" in err and "3 classes but table lvis_v1 lists 1203" in err
    assert not (tmp_path / "r.json").exists()


def test_region_rle_equals_full_mask_rle():
    """The region-only RLE path gives pycocotools' bytes for the full pasted masks."""
    from norcal.runtime.postprocess import ImageDetections, paste_masks

    g = np.load(Path(__file__).parents[1] / "fixtures" / "d2_lvis_tiny" / "golden" / "img1.npz")
    h, w = (int(v) for v in g["input_rgb_shape"])
    probs, boxes = g["cdt_g0.5/mask_probs"].astype(np.float32), g["cdt_g0.5/boxes_orig"]
    det = ImageDetections(boxes, g["cdt_g0.5/scores"], g["cdt_g0.5/classes"], probs, (h, w))
    res = detections_to_results(1, det, None)
    full = paste_masks(probs, boxes, (h, w))
    assert [r["segmentation"]["counts"] for r in res] == [encode_rle(m)["counts"] for m in full]
    # masks touching the image's right/bottom edges and the first pixel
    edge = ImageDetections(np.array([[0, 0, 50, 30], [10, 5, 60, 40]], np.float32), np.ones(2, np.float32),
                      np.zeros(2, np.int64), np.ones((2, 28, 28), np.float32), (40, 60))
    full = paste_masks(edge.mask_probs, edge.boxes, (40, 60))
    assert [r["segmentation"]["counts"] for r in detections_to_results(1, edge, None)] == \
        [encode_rle(m)["counts"] for m in full]


@pytest.fixture(scope="module")
def exported_tiny(tmp_path_factory):
    """The d2_lvis_tiny checkpoint exported by norcal.export (plain softmax, dynamic batch)."""
    from norcal.export.rcnn.export import export_detector
    from norcal.export.families.detectron2.loader import load_model

    tiny = Path(__file__).parents[1] / "fixtures" / "d2_lvis_tiny"
    spec, model = load_model(tiny / "model_final.pth", tiny / "config.yaml")
    path = tmp_path_factory.mktemp("exported") / "d2_lvis_tiny.onnx"
    onnx.save(export_detector(model, spec), path)
    return path


def test_cli_infer_exported_model_matches_detectron2(exported_tiny, tmp_path):
    """norcal infer on the exported fixture, batch 2 of different sizes, vs detectron2's own
    detections in original image coordinates (golden baseline), matched as sets."""
    from pycocotools import mask as mask_util

    from norcal.runtime.postprocess import paste_masks
    from norcal.core.calibration.tables import load_table

    tiny = Path(__file__).parents[1] / "fixtures" / "d2_lvis_tiny"
    out = tmp_path / "res.json"
    rc = main(["infer", str(exported_tiny), str(tiny / "images" / "img0.png"), str(tiny / "images" / "img1.png"),
               "--batch", "2", "--table", "lvis_v1", "-o", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    cat_ids = np.array(load_table("lvis_v1").category_ids)
    for name in ("img0", "img1"):
        g = np.load(tiny / "golden" / f"{name}.npz")
        h, w = (int(v) for v in g["input_rgb_shape"])
        mine = [r for r in res if r["image_id"] == name]
        assert len(mine) == 300
        xywh = np.array([r["bbox"] for r in mine])
        boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1)
        gb = g["baseline/boxes_orig"]
        lt, rb = np.maximum(boxes[:, None, :2], gb[None, :, :2]), np.minimum(boxes[:, None, 2:], gb[None, :, 2:])
        inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
        area = lambda b: (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])  # noqa: E731
        iou = inter / (area(boxes)[:, None] + area(gb)[None] - inter)
        iou *= np.array([r["category_id"] for r in mine])[:, None] == cat_ids[g["baseline/classes"]][None]
        best, j = iou.max(1), iou.argmax(1)
        assert (best > 0.99).mean() >= 0.98
        # masks: the RLE of each matched detection vs detectron2's mask probabilities pasted
        ok = np.flatnonzero(best > 0.99)[:50]
        ref = paste_masks(g["baseline/mask_probs"][j[ok]].astype(np.float32), gb[j[ok]], (h, w))
        ious = []
        for k, m_ref in zip(ok, ref):
            seg = mine[k]["segmentation"]
            m = mask_util.decode({"size": seg["size"], "counts": seg["counts"].encode()}).astype(bool)
            union = (m | m_ref).sum()
            ious.append((m & m_ref).sum() / union if union else 1.0)
        assert np.mean(ious) >= 0.95


def test_results_stream_writes_the_bytes_of_one_json_dump(toy, tmp_path):
    """`norcal infer` streams the results file image by image: the same bytes as dumping the
    whole list at once (images without detections included)."""
    from norcal.runtime.postprocess import ImageDetections
    from norcal.runtime.results import results_fragment, results_writer

    dets = run_arrays(open_runner(toy), [solid(40, 60, (255, 0, 0)), solid(64, 64, (0, 9, 200))])
    empty = ImageDetections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64),
                            None, (10, 10))
    images = [(1, empty), (2, dets[0]), (3, empty), (4, dets[1])]
    out = tmp_path / "r.json"
    with results_writer(out) as w:
        for i, d in images:
            w.add(*results_fragment(i, d, [5, 7, 9]))
    expected = [r for i, d in images for r in detections_to_results(i, d, [5, 7, 9])]
    assert out.read_text() == json.dumps(expected) + "\n" and w.count == len(expected) == 4
    with results_writer(tmp_path / "none.json") as w:
        w.add(*results_fragment(1, empty, None))
    assert (tmp_path / "none.json").read_text() == "[]\n"
