"""The C++ host library writes the category ids the engine's sidecar records
(norcal.category_ids, as the Python runner does), not class index + 1, and refuses a sidecar
whose id list does not have one id per class."""

import json
import subprocess

import numpy as np
import pytest

from norcal.core.contract import CATEGORY_IDS, NUM_CLASSES, metadata_category_ids
from norcal.runtime.postprocess import ImageDetections, rescale_boxes
from norcal.runtime.results import detections_to_results
from test_cpp import TINY, build, python_sidecar  # noqa: F401  (build: this module's CMake build)

pytestmark = pytest.mark.cpp

C = 1203  # the fixture detector's classes
# non-contiguous dataset ids, as LVIS subsets or COCO (1..90 for 80 classes) have
IDS = sorted(np.random.default_rng(0).choice(np.arange(1, 20 * C), C, replace=False).tolist())


def _host(build, *args):  # noqa: F811 - the build directory
    return subprocess.run([str(build / "norcal-host"), *map(str, args)], capture_output=True, text=True)


def _results(build, tmp_path, ids_arg):  # noqa: F811 - the build directory
    """The C++ results of the fixture's golden detections, with the ids `ids_arg` gives."""
    g = np.load(TINY / "golden" / "img1.npz")
    (rh, rw), (oh, ow) = g["resized_chw"][1:], g["input_rgb_shape"]
    n, S = 200, "ens_g0.999"
    arrays = {"b": g[f"{S}/boxes"][:n], "s": g[f"{S}/scores"][:n], "c": g[f"{S}/classes"][:n]}
    for name, arr in arrays.items():
        np.save(tmp_path / f"{name}.npy", arr)
    r = _host(build, "results", tmp_path / "r.json", "139", rh, rw, oh, ow, n, tmp_path / "b.npy",
              tmp_path / "s.npy", tmp_path / "c.npy", "-", *([ids_arg] if ids_arg else []))
    assert r.returncode == 0, r.stderr
    mapped, keep = rescale_boxes(arrays["b"], (rh, rw), (oh, ow))
    det = ImageDetections(mapped[keep], arrays["s"][keep], arrays["c"][keep], None, (int(oh), int(ow)))
    return json.loads((tmp_path / "r.json").read_text()), det


def test_results_use_the_sidecars_category_ids(build, tmp_path):  # noqa: F811
    meta = {NUM_CLASSES: str(C), CATEGORY_IDS: json.dumps(IDS)}
    engine = python_sidecar(tmp_path, meta)
    assert _host(build, "categories", engine).stdout.split() == [str(i) for i in IDS]
    ours, det = _results(build, tmp_path, engine)
    # the Python runner's results with the ids it reads from the same metadata
    ref = detections_to_results(139, det, metadata_category_ids(meta), with_masks=False)
    assert len(ours) == len(ref) > 100
    assert [r["category_id"] for r in ours] == [r["category_id"] for r in ref]
    # and by hand: class index k -> IDS[k], which is not k + 1 for any class seen here
    assert [r["category_id"] for r in ours] == [IDS[int(c)] for c in det.classes]
    assert all(IDS[int(c)] != int(c) + 1 for c in det.classes)


def test_without_ids_the_category_is_class_plus_one(build, tmp_path):  # noqa: F811
    engine = python_sidecar(tmp_path, {NUM_CLASSES: str(C)})
    assert _host(build, "categories", engine).stdout.split() == []
    ours, det = _results(build, tmp_path, engine)
    assert [r["category_id"] for r in ours] == [int(c) + 1 for c in det.classes]


@pytest.mark.parametrize("ids, message", [
    (json.dumps(IDS[:-1]), f"metadata norcal.category_ids lists {C - 1} categories but norcal.num_classes is {C}"),
    (json.dumps(IDS + [10**6]), f"metadata norcal.category_ids lists {C + 1} categories but norcal.num_classes is {C}"),
    (json.dumps(IDS[:-1] + [2.5]), "metadata norcal.category_ids is not a JSON list of integers"),
    (json.dumps({"1": 1}), "metadata norcal.category_ids is not a JSON list of integers"),
    ("[1, 2", "metadata norcal.category_ids is not a JSON list of integers"),
], ids=["short", "long", "fraction", "object", "truncated"])
def test_sidecar_with_wrong_ids_is_refused(build, tmp_path, ids, message):  # noqa: F811
    engine = python_sidecar(tmp_path, {NUM_CLASSES: str(C), CATEGORY_IDS: ids})
    side = f"{engine}.json"
    for args in (("categories", engine), ("sidecar", engine)):
        r = _host(build, *args)
        assert r.returncode == 2 and r.stderr == f"error: {side}: {message}\n", r.stderr


def test_given_ids_override_the_sidecars_and_must_fit_the_class_count(build, tmp_path):  # noqa: F811
    # what norcal-trt-infer's --category-ids does: another list of C ids wins, a shorter one is refused
    engine = python_sidecar(tmp_path, {NUM_CLASSES: str(C), CATEGORY_IDS: json.dumps(IDS)})
    other = np.arange(C, dtype=np.int64) * 7 + 5
    np.save(tmp_path / "other.npy", other)
    assert _host(build, "categories", engine, tmp_path / "other.npy").stdout.split() == [str(i) for i in other]
    np.save(tmp_path / "short.npy", other[:10])
    r = _host(build, "categories", engine, tmp_path / "short.npy")
    assert r.returncode == 2 and r.stderr == (f"error: {tmp_path / 'short.npy'}: lists 10 categories but "
                                              f"{engine}.json says the model has {C} classes\n"), r.stderr
