"""The C++ host library (runtime/cpp) built with CMake, checked by ctest and against the Python
runtime on the fixture images: resize (PIL's filter), batching, box mapping, mask pasting, JSON,
the engine sidecar as the Python builder writes it, and the host NMS (bit for bit: a YOLO's and a
RetinaNet's candidates)."""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import PIL
import pytest

from norcal.core.contract import Preprocessing
from norcal.core.contract import (DETECTOR, INPUT_FORMAT, MAX_SIZE_TEST, MIN_SIZE_TEST, SIZE_DIVISIBILITY,
                                  input_spec)
from norcal.runtime.images import read_rgb
from norcal.runtime.postprocess import ImageDetections, paste_masks, rescale_boxes
from norcal.runtime.preprocess import prepare_batch, resize_uint8, resized_size
from norcal.runtime.results import detections_to_results

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "d2_lvis_tiny"
# Pillow 13 orders its two passes as the C++ code does (vertical first when the height shrinks
# more than twice as much as the width); older Pillow always went horizontal first, which
# moves some pixels by one level.
PIL_EXACT = int(PIL.__version__.split(".")[0]) >= 13
pytestmark = pytest.mark.cpp


def missing_toolchain() -> list[str]:
    """What building runtime/cpp needs and this machine lacks (a C++17 compiler: c++, g++ or clang++)."""
    missing = [] if shutil.which("cmake") and shutil.which("ctest") else ["cmake"]
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        missing.append("C++17 compiler (g++ or clang++)")
    return missing


def require_toolchain() -> None:
    """Fail, naming what to install, where runtime/cpp cannot be built: the C++ library is part of
    what the project ships, so a machine without its toolchain fails rather than skips."""
    if missing := missing_toolchain():
        pytest.fail(f"runtime/cpp cannot be built: no {' and no '.join(missing)} on PATH "
                    "(Debian/Ubuntu: apt-get install cmake g++)", pytrace=False)


# what `norcal build` records for a model exported with these settings (RGB, a 64 divisor, and a
# detector JSON whose quotes the C++ reader must unescape)
SIDECAR_META = {MIN_SIZE_TEST: "640", MAX_SIZE_TEST: "1024", INPUT_FORMAT: "RGB", SIZE_DIVISIBILITY: "64",
                DETECTOR: json.dumps({"depth": 50, "name": "caf\u00e9"}), "norcal.gamma": "0.5"}


def contract_onnx(path: Path, metadata: dict[str, str]) -> Path:
    """A model with the detector contract's inputs (what the builder's profiles need) and metadata."""
    import onnx
    from onnx import TensorProto as T, helper as h

    vi = h.make_tensor_value_info
    graph = h.make_graph([h.make_node("Identity", ["image_sizes"], ["num_detections"])], "contract",
                         [vi("images", T.FLOAT, ["B", 3, "H", "W"]), vi("image_sizes", T.INT64, ["B", 2])],
                         [vi("num_detections", T.INT64, ["B", 2])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    h.set_model_props(model, metadata)
    onnx.save(model, path)
    return path


def python_sidecar(folder: Path, metadata: dict[str, str]) -> Path:
    """An engine path whose sidecar the Python builder wrote (as for a trtexec build); returns the engine."""
    from norcal.runtime.tensorrt_build import BuildOptions, prepare, write_trtexec_sidecar

    opts = BuildOptions(contract_onnx(folder / "model.onnx", metadata), folder / "model.engine")
    write_trtexec_sidecar(opts, *prepare(opts))
    return opts.engine_path


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    require_toolchain()
    out = tmp_path_factory.mktemp("cmake_build")
    engine = python_sidecar(tmp_path_factory.mktemp("sidecar"), SIDECAR_META)
    spec = input_spec(SIDECAR_META)
    expect = f"{spec.min_size};{spec.max_size};{spec.input_format};{spec.divisibility}"
    cfg = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release",
                          f"-DNORCAL_TEST_SIDECAR={engine}", f"-DNORCAL_TEST_SIDECAR_EXPECT={expect}"],
                         check=True, capture_output=True, text=True)
    (out / "configure.log").write_text(cfg.stdout)
    subprocess.run(["cmake", "--build", str(out), "-j", "2"], check=True, capture_output=True, text=True)
    return out


def host(build, *args):
    r = subprocess.run([str(build / "norcal-host"), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_missing_toolchain_fails_naming_what_to_install(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match=r"^runtime/cpp cannot be built: no cmake and no C\+\+17 compiler "
                       r"\(g\+\+ or clang\+\+\) on PATH \(Debian/Ubuntu: apt-get install cmake g\+\+\)$"):
        require_toolchain()
    monkeypatch.setattr(shutil, "which", lambda name: None if name in ("c++", "g++") else f"/usr/bin/{name}")
    assert missing_toolchain() == []  # clang++ will do


def test_ctest_passes(build):
    r = subprocess.run(["ctest", "--test-dir", str(build), "--output-on-failure"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "100% tests passed" in r.stdout
    assert "engine_sidecar_from_python" in r.stdout  # the C++ read of the Python-written sidecar ran


@pytest.mark.parametrize("metadata", [SIDECAR_META, {"norcal.gamma": "0.5"}, {INPUT_FORMAT: "bgr"}],
                         ids=["written", "defaults", "lower-case"])
def test_sidecar_reads_as_python_does(build, tmp_path, metadata):
    engine = python_sidecar(tmp_path, metadata)
    spec = input_spec(metadata)
    assert host(build, "sidecar", engine).split() == [str(spec.min_size), str(spec.max_size),
                                                      spec.input_format, str(spec.divisibility)]


def test_malformed_sidecar_is_a_clear_error(build, tmp_path):
    from norcal.runtime.tensorrt_build import sidecar_path

    engine = python_sidecar(tmp_path, SIDECAR_META)
    side = sidecar_path(engine)
    good = json.loads(side.read_text())
    cases = [(side.read_text()[:-20], "not valid JSON"),
             (json.dumps({**good, "format": "something-else/1"}), "not a norcal engine sidecar"),
             (json.dumps({**good, "metadata": {**good["metadata"], MIN_SIZE_TEST: "wide"}}),
              f"metadata {MIN_SIZE_TEST}='wide' is not an integer")]
    for text, message in cases:
        side.write_text(text)
        r = subprocess.run([str(build / "norcal-host"), "sidecar", str(engine)], capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.startswith(f"error: {side}: ") and message in r.stderr, r.stderr
    side.unlink()
    r = subprocess.run([str(build / "norcal-host"), "sidecar", str(engine)], capture_output=True, text=True)
    assert r.returncode == 2 and "no such file" in r.stderr


def test_tensorrt_executable_only_where_tensorrt_is_found(build):
    log = (build / "configure.log").read_text()
    if "TensorRT found" in log:
        assert (build / "norcal-trt-infer").exists()
    else:
        assert "SKIPPING norcal-trt-infer" in log and not (build / "norcal-trt-infer").exists()


def test_resized_size_matches_python(build):
    rng = np.random.default_rng(0)
    cases = [(240, 320, 320, 512), (333, 500, 320, 512), (480, 640, 800, 1333), (1000, 3000, 800, 1333)]
    cases += [tuple(int(v) for v in rng.integers(20, 2000, 2)) + (800, 1333) for _ in range(12)]
    for h, w, mn, mx in cases:
        assert tuple(map(int, host(build, "size", h, w, mn, mx).split())) == resized_size(h, w, mn, mx)


def _resize_pair(build, tmp_path, img, h, w):
    np.save(tmp_path / "in.npy", np.ascontiguousarray(img))
    host(build, "resize", tmp_path / "in.npy", tmp_path / "out.npy", h, w)
    return np.load(tmp_path / "out.npy"), resize_uint8(img, h, w)


@pytest.mark.parametrize("i", range(4))
def test_resize_matches_pil_on_fixture_images(build, tmp_path, i):
    img = read_rgb(TINY / "images" / f"img{i}.png")
    h, w = resized_size(*img.shape[:2], 320, 512)
    ours, ref = _resize_pair(build, tmp_path, img, h, w)
    assert ours.shape == ref.shape
    diff = np.abs(ours.astype(int) - ref.astype(int))
    assert diff.max() <= (0 if PIL_EXACT else 1)


def test_resize_matches_pil_random_sizes(build, tmp_path):
    rng = np.random.default_rng(1)
    # fixed cases: both passes each way round, one-axis only, 1-pixel outputs
    cases = [(71, 82, 55, 136), (100, 50, 60, 40), (50, 100, 40, 60), (40, 40, 40, 13), (40, 40, 9, 40),
             (5, 7, 1, 1), (3, 3, 17, 29)]
    cases += [tuple(int(v) for v in rng.integers(3, 90, 2)) + tuple(int(v) for v in rng.integers(1, 140, 2))
              for _ in range(12)]
    for ih, iw, oh, ow in cases:
        img = rng.integers(0, 256, (ih, iw, 3), dtype=np.uint8)
        ours, ref = _resize_pair(build, tmp_path, img, oh, ow)
        diff = np.abs(ours.astype(int) - ref.astype(int))
        assert diff.max() <= (0 if PIL_EXACT else 1), (ih, iw, oh, ow)


def test_batch_matches_python(build, tmp_path):
    imgs = [read_rgb(TINY / "images" / f"img{i}.png") for i in range(4)]
    paths = []
    for i, im in enumerate(imgs):
        paths.append(tmp_path / f"im{i}.npy")
        np.save(paths[-1], im)
    host(build, "batch", tmp_path / "b", 320, 512, "BGR", 32, *paths)
    ref = prepare_batch(imgs, Preprocessing(320, 512, "BGR", 32))
    ours = np.load(tmp_path / "b_images.npy")
    assert ours.shape == ref.images.shape == (4, 3, 448, 480)
    np.testing.assert_array_equal(np.load(tmp_path / "b_sizes.npy"), ref.image_sizes)
    assert np.abs(ours - ref.images).max() <= 1


@pytest.mark.parametrize("i", range(4))
def test_box_mapping_matches_detectron2(build, tmp_path, i):
    g = np.load(TINY / "golden" / f"img{i}.npz")
    np.save(tmp_path / "boxes.npy", g["cdt_g1.0/boxes"])
    (rh, rw), (oh, ow) = g["resized_chw"][1:], g["input_rgb_shape"]
    host(build, "rescale", tmp_path / "boxes.npy", rh, rw, oh, ow, tmp_path / "o.npy", tmp_path / "k.npy")
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), g["cdt_g1.0/boxes_orig"], rtol=0, atol=1e-4)
    assert np.load(tmp_path / "k.npy").all()


@pytest.mark.parametrize("i", range(4))
def test_mask_paste_matches_python(build, tmp_path, i):
    g = np.load(TINY / "golden" / f"img{i}.npz")
    h, w = (int(v) for v in g["input_rgb_shape"])
    probs, boxes = g["baseline/mask_probs"][:80], g["baseline/boxes_orig"][:80]
    np.save(tmp_path / "m.npy", probs)  # fp16, read and widened by the C++ side
    np.save(tmp_path / "b.npy", boxes)
    host(build, "paste", tmp_path / "m.npy", tmp_path / "b.npy", h, w, tmp_path / "out.npy")
    ours = np.load(tmp_path / "out.npy").astype(bool)
    ref = paste_masks(probs.astype(np.float32), boxes, (h, w))
    inter, union = (ours & ref).sum((1, 2)), (ours | ref).sum((1, 2))
    assert ref.any(axis=(1, 2)).sum() > 10
    assert np.all(np.where(union > 0, inter / np.maximum(union, 1), 1.0) >= 0.99)


def test_results_json_matches_python(build, tmp_path):
    from pycocotools import mask as mask_util

    g = np.load(TINY / "golden" / "img1.npz")
    (rh, rw), (oh, ow) = g["resized_chw"][1:], g["input_rgb_shape"]
    S = "ens_g0.999"
    n = 120
    boxes, scores, classes = g[f"{S}/boxes"][:n], g[f"{S}/scores"][:n], g[f"{S}/classes"][:n]
    masks = g[f"{S}/mask_probs"][:n].astype(np.float32)
    cat_ids = np.arange(1, 1204, dtype=np.int64) * 3  # any mapping: index i -> 3(i+1)
    for name, arr in (("b", boxes), ("s", scores), ("c", classes), ("m", masks), ("ids", cat_ids)):
        np.save(tmp_path / f"{name}.npy", arr)
    host(build, "results", tmp_path / "r.json", "000000000139", rh, rw, oh, ow, n, tmp_path / "b.npy",
         tmp_path / "s.npy", tmp_path / "c.npy", tmp_path / "m.npy", tmp_path / "ids.npy")
    ours = json.loads((tmp_path / "r.json").read_text())
    mapped, keep = rescale_boxes(boxes, (rh, rw), (oh, ow))
    det = ImageDetections(mapped[keep], scores[keep], classes[keep], masks[keep], (int(oh), int(ow)))
    ref = detections_to_results(139, det, cat_ids.tolist())
    assert len(ours) == len(ref) == n
    ious = []
    for a, b in zip(ours, ref):
        assert a["image_id"] == b["image_id"] == 139 and a["category_id"] == b["category_id"]
        np.testing.assert_allclose(a["bbox"], b["bbox"], atol=1e-3)
        assert a["score"] == pytest.approx(b["score"], rel=1e-6)
        assert a["segmentation"]["size"] == b["segmentation"]["size"] == [int(oh), int(ow)]
        ma = mask_util.decode({**a["segmentation"], "counts": a["segmentation"]["counts"].encode()})
        mb = mask_util.decode({**b["segmentation"], "counts": b["segmentation"]["counts"].encode()})
        union = (ma | mb).sum()
        ious.append((ma & mb).sum() / union if union else 1.0)
    assert min(ious) >= 0.99
    same_rle = np.mean([a["segmentation"]["counts"] == b["segmentation"]["counts"] for a, b in zip(ours, ref)])
    assert same_rle >= 0.95  # identical bytes except where a pixel sits at exactly 0.5


NMS_OUTPUTS = ("num_detections", "boxes", "scores", "classes")


def _nms_pair(build, tmp_path, boxes, scores, sizes, size, rule, coefs=None):
    """(C++ `norcal-host nms`, Python host_nms.select) on the same candidates: dicts of outputs."""
    from norcal.core import contract
    from norcal.runtime.host_nms import select

    arrays = {"cb": boxes, "cs": scores, "sz": sizes} | ({} if coefs is None else {"cc": coefs})
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr)
    how = "agnostic" if rule.agnostic else "best" if rule.best_class else "multi"
    host(build, "nms", *(tmp_path / f"{n}.npy" for n in ("cb", "cs", "sz")), size, how, repr(rule.score_thresh),
         repr(rule.iou), rule.topk, tmp_path / "o", *([tmp_path / "cc.npy"] if coefs is not None else []))
    names = NMS_OUTPUTS + (() if coefs is None else ("masks",))
    ours = {n: np.load(tmp_path / f"o_{n}.npy") for n in names}
    outputs = {contract.CANDIDATE_BOXES: boxes, contract.CANDIDATE_SCORES: scores}
    if coefs is not None:  # select passes the prototypes through; any array will do
        outputs |= {contract.CANDIDATE_COEFS: coefs, contract.MASK_PROTOS: np.zeros((len(boxes), 1, 2, 2), np.float32)}
    ref = select(outputs, sizes, (size, size), rule)
    return ours, {n: ref[n] for n in names}


def _rule(best_class, agnostic, score_thresh, iou, topk, num_classes):
    """A letterboxed YOLO's HostSelection; the class count and letterbox flag only where it has them."""
    from dataclasses import fields

    from norcal.runtime.host_nms import HostSelection

    extra = {"num_classes": num_classes, "letterbox": True}
    return HostSelection(best_class, agnostic, score_thresh, iou, topk,
                         **{f.name: extra[f.name] for f in fields(HostSelection) if f.name in extra})


def _assert_same(ours, ref):
    for name in ref:
        assert ours[name].dtype == ref[name].dtype and np.array_equal(ours[name], ref[name]), name


@pytest.mark.parametrize("topk", [7, 100])
@pytest.mark.parametrize("best_class,agnostic", [(False, False), (True, False), (True, True)],
                         ids=["multi-label", "best-class", "agnostic"])
def test_host_nms_matches_python_bit_for_bit(build, tmp_path, best_class, agnostic, topk):
    rng = np.random.default_rng(7)
    b, a, c, s = 3, 60, 4, 64
    # scores in eighths: ties within and across rows, and some exactly at the 0.25 threshold
    scores = (rng.integers(0, 9, (b, a, c)) / 8).astype(np.float32)
    # integer corners in a small field, so boxes overlap often and IoUs land exactly on 0.5;
    # widths from 0, so some boxes have no area
    x0, y0 = rng.integers(0, 4, (2, b, a))
    w, h = rng.integers(0, 8, (2, b, a))
    boxes = np.stack([x0, y0, x0 + w, y0 + h], axis=-1).astype(np.float32)
    assert (w == 0).sum() > 10
    sizes = np.array([[64, 48], [37, 64], [64, 64]], dtype=np.int64)
    coefs = rng.standard_normal((b, a, 3)).astype(np.float32)
    rule = _rule(best_class, agnostic, 0.25, 0.5, topk, c)
    ours, ref = _nms_pair(build, tmp_path, boxes, scores, sizes, s, rule, coefs)
    _assert_same(ours, ref)
    assert (ref["num_detections"] > 0).all()


def test_host_nms_keeps_an_iou_exactly_at_the_threshold(build, tmp_path):
    # IoU 1/3 (intersection 1, union 3) against the threshold float32(1/3): equal, so kept (> not >=)
    third = np.float32(1 / 3)
    assert np.float32(1) / np.float32(3) == third
    boxes = np.array([[[0, 0, 2, 1], [1, 0, 3, 1]]], dtype=np.float32)
    scores = np.array([[[0.9], [0.8]]], dtype=np.float32)
    ours, ref = _nms_pair(build, tmp_path, boxes, scores, np.array([[64, 64]]), 64,
                          _rule(False, False, 0.05, 1 / 3, 5, 1))
    _assert_same(ours, ref)
    assert ref["num_detections"].tolist() == [2]


def test_host_nms_refuses_a_shape_mismatch_in_one_line(build, tmp_path):
    np.save(tmp_path / "cb.npy", np.zeros((3, 60, 4), np.float32))
    np.save(tmp_path / "cs.npy", np.zeros((3, 61, 4), np.float32))
    np.save(tmp_path / "sz.npy", np.full((3, 2), 64))
    r = subprocess.run([str(build / "norcal-host"), "nms", *(tmp_path / f"{n}.npy" for n in ("cb", "cs", "sz")),
                        "64", "best", "0.25", "0.5", "10", tmp_path / "o"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr == (f"error: {tmp_path / 'cs.npy'}: candidate scores must be float32 "
                                              "[3,60,*], got <f4 [3,61,4]\n"), r.stderr
    assert not (tmp_path / "o_boxes.npy").exists()


def _retinanet_nms(build, tmp_path, boxes, scores, classes, rule, name="r"):
    """`norcal-host nms --classes` on a RetinaNet's candidates: a dict of its outputs."""
    for part, arr in (("cb", boxes), ("cs", scores), ("cl", classes)):
        np.save(tmp_path / f"{name}_{part}.npy", arr)
    host(build, "nms", "--classes", tmp_path / f"{name}_cl.npy", rule.num_classes, tmp_path / f"{name}_cb.npy",
         tmp_path / f"{name}_cs.npy", repr(rule.score_thresh), repr(rule.iou), rule.topk, tmp_path / f"{name}_o")
    return {n: np.load(tmp_path / f"{name}_o_{n}.npy") for n in NMS_OUTPUTS}


def _retinanet_select(boxes, scores, classes, rule, sizes):
    """runtime/host_nms.py's select on the same candidates (the sizes unread: not letterboxed)."""
    from norcal.core import contract
    from norcal.runtime.host_nms import select

    outputs = {contract.CANDIDATE_BOXES: boxes, contract.CANDIDATE_SCORES: scores, contract.CANDIDATE_CLASSES: classes}
    ref = select(outputs, sizes, (64, 64), rule)
    return {n: ref[n] for n in NMS_OUTPUTS}


def _tie_heavy_retinanet(rng, b, r, c):
    """(boxes [b, r, 4], scores [b, r], classes [b, r]) with equal scores within and across classes,
    scores at the 0.25 threshold, the same box in several classes, IoUs exactly at 0.5 and no-area boxes."""
    scores = (rng.integers(0, 9, (b, r)) / 8).astype(np.float32)
    classes = rng.integers(0, c, (b, r)).astype(np.int64)
    x0, y0 = rng.integers(0, 4, (2, b, r))
    w, h = rng.integers(0, 8, (2, b, r))
    boxes = np.stack([x0, y0, x0 + w, y0 + h], axis=-1).astype(np.float32)
    boxes[:, 1:20:2] = boxes[:, 0:20:2]  # candidates 1, 3, ..., 19 repeat the box before them
    assert (w == 0).sum() > 10 and (scores == 0.25).sum() > 10
    return boxes, scores, classes


@pytest.mark.parametrize("topk", [7, 100, 450])  # 450 > classes x candidates: padded slots
def test_retinanet_host_nms_matches_python_bit_for_bit_alone_and_batched(build, tmp_path, topk):
    from norcal.runtime.host_nms import HostSelection

    rng = np.random.default_rng(11)
    b, r, c = 3, 80, 5
    boxes, scores, classes = _tie_heavy_retinanet(rng, b, r, c)
    # letterbox False as a RetinaNet's metadata gives; sizes whose offset would be nonzero if subtracted
    rule = HostSelection(False, False, 0.25, 0.5, topk, c, False)
    sizes = np.array([[40, 64], [64, 37], [21, 30]], dtype=np.int64)
    ours = _retinanet_nms(build, tmp_path, boxes, scores, classes, rule)
    ref = _retinanet_select(boxes, scores, classes, rule, sizes)
    _assert_same(ours, ref)
    assert (ref["num_detections"] > 0).all() and (ref["boxes"] != 0).any()
    for i in range(b):  # each image alone: its row of the batch
        alone = _retinanet_nms(build, tmp_path, boxes[i:i + 1], scores[i:i + 1], classes[i:i + 1], rule, f"a{i}")
        _assert_same(alone, _retinanet_select(boxes[i:i + 1], scores[i:i + 1], classes[i:i + 1], rule, sizes[i:i + 1]))
        _assert_same(alone, {n: v[i:i + 1] for n, v in ref.items()})


def test_retinanet_host_nms_is_class_wise_and_keeps_an_iou_at_the_threshold(build, tmp_path):
    from norcal.runtime.host_nms import HostSelection

    # one box in classes 1 and 0 (both kept: class-wise); a box at IoU 1/2 with it in class 1 (kept:
    # > not >=); one at IoU 0.81 in class 1 (suppressed)
    boxes = np.array([[[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 5], [1, 1, 10, 10]]], dtype=np.float32)
    scores = np.array([[0.9, 0.85, 0.8, 0.7]], dtype=np.float32)
    classes = np.array([[1, 0, 1, 1]], dtype=np.int64)
    rule = HostSelection(False, False, 0.05, 0.5, 5, 2, False)
    ours = _retinanet_nms(build, tmp_path, boxes, scores, classes, rule)
    _assert_same(ours, _retinanet_select(boxes, scores, classes, rule, np.array([[10, 10]])))
    assert ours["num_detections"].tolist() == [3] and ours["classes"][0, :3].tolist() == [1, 0, 1]


@pytest.fixture(scope="module")
def d2_retinanet(tmp_path_factory):
    """(in-graph NMS, host NMS) exports of detectron2's tiny RetinaNet at gamma 0.5, made as
    tests/runtime/test_host_nms.py makes them."""
    from golden import manifest_table

    from conftest import FIXTURES
    from norcal.core.decoding import Decoding
    from norcal.workflows.export_job import CheckpointExport, NorCal, export_checkpoint

    src, out = FIXTURES / "d2_retinanet_tiny", tmp_path_factory.mktemp("d2_retinanet")
    paths = []
    for decoding in (None, Decoding(nms="host")):
        paths.append(out / f"{'host' if decoding else 'graph'}.onnx")
        export_checkpoint(src / "model_final.pth", paths[-1], NorCal(gamma=0.5, table=manifest_table(src)),
                          CheckpointExport(config=src / "config.yaml", decoding=decoding))
    return paths


def test_retinanet_host_nms_on_a_detectron2_export_equals_python_and_the_in_graph_nms(build, tmp_path, d2_retinanet):
    """The real candidates of detectron2's RetinaNet (--nms host) through the C++: equal bit for bit
    to runtime/host_nms.py and to the in-graph NMS export run in ONNX Runtime, alone and batched."""
    import onnxruntime as ort

    from norcal.core import contract
    from norcal.runtime.host_nms import HostSelection
    from norcal.runtime.inference import prepare

    def run(sess, feeds):
        names = [i.name for i in sess.get_inputs()]
        return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {n: feeds[n] for n in names})))

    in_graph, host_graph = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in d2_retinanet)
    meta = host_graph.get_modelmeta().custom_metadata_map
    rule = HostSelection.from_metadata(meta)
    assert not rule.letterbox and rule.num_classes == 1203
    spec = contract.input_spec(meta)
    images = [read_rgb(p) for p in sorted((TINY / "images").glob("*.png"))]
    for n, part in enumerate([images] + [[im] for im in images]):  # one batch of all, then each alone
        feeds = prepare(part, spec).feeds()
        cand = run(host_graph, feeds)
        boxes, scores, classes = (cand[k] for k in (contract.CANDIDATE_BOXES, contract.CANDIDATE_SCORES,
                                                    contract.CANDIDATE_CLASSES))
        ours = _retinanet_nms(build, tmp_path, boxes, scores, classes, rule, f"img{n}")
        _assert_same(ours, _retinanet_select(boxes, scores, classes, rule, feeds["image_sizes"]))
        ref = run(in_graph, feeds)
        assert ref["num_detections"].sum() > 0
        _assert_same(ours, {k: ref[k] for k in NMS_OUTPUTS})


def test_retinanet_host_nms_refuses_wrong_inputs_in_one_line(build, tmp_path):
    r, cl, cb, cs = 6, tmp_path / "cl.npy", tmp_path / "cb.npy", tmp_path / "cs.npy"
    np.save(cb, np.zeros((2, r, 4), np.float32))
    np.save(cs, np.zeros((2, r), np.float32))
    np.save(tmp_path / "cs3.npy", np.zeros((2, r, 3), np.float32))
    np.save(tmp_path / "cs64.npy", np.zeros((2, r), np.float64))
    np.save(cl, np.zeros((2, r + 1), np.int64))
    np.save(tmp_path / "cl_ok.npy", np.full((2, r), 4, np.int64))
    o, args = tmp_path / "o", ("0.05", "0.5", "10")
    cases = [
        (["--classes", cl, 4, cb, cs, *args, o], f"{cl}: candidate classes must be int [2,6], got <i8 [2,7]"),
        (["--classes", tmp_path / "cl_ok.npy", 4, cb, cs, *args, o],
         "candidate class 4 of candidate 0 is outside the model's 4 classes"),
        (["--classes", cl, 4, cb, tmp_path / "cs3.npy", *args, o], "are a YOLO's, which has no candidate classes"),
        (["--classes", cl, 4, cb, tmp_path / "cs64.npy", *args, o], "candidate scores must be float32 [2,6], got <f8"),
        (["--classes", tmp_path / "cl_ok.npy", "many", cb, cs, *args, o],
         "nms: NUM_CLASSES must be an integer, got 'many'"),
        (["--classes", cl, 4, cb, cs, *args], "nms: expected norcal-host nms --classes CLASSES.npy NUM_CLASSES"),
        ([cb, cs, tmp_path / "sz.npy", 64, "best", *args, o], f"{cs}: candidate scores [B,R] are a RetinaNet's"),
    ]
    for argv, message in cases:
        res = subprocess.run([str(build / "norcal-host"), "nms", *map(str, argv)], capture_output=True, text=True)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and message in res.stderr, (argv, res.stderr)
        assert not (tmp_path / "o_boxes.npy").exists()
    help_text = host(build, "nms", "--help")
    assert "--classes CLASSES.npy NUM_CLASSES" in help_text and "not letterboxed" in help_text
