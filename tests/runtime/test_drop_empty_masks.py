"""Ultralytics' predictor drops a detection whose pasted mask is empty
(``SegmentationPredictor.construct_result``: ``masks.amax((-2, -1)) > 0``); under the predictor's
(best-class) decoding our host drops the same ones, checked against Ultralytics' own
``process_mask_native``; the validator's (multi-label) decoding keeps them all."""

import numpy as np
import pytest
import torch

from norcal.core import contract
from norcal.core.decoding import Decoding
from norcal.core.errors import NorcalError
from norcal.runtime.postprocess import split_outputs

S, NM = 64, 4  # the letterbox square, the prototypes


def _outputs(seed=0):
    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(1, NM, S // 4, S // 4)).astype(np.float32)
    boxes = np.array([[[4, 4, 40, 40], [10, 12, 30, 50], [20, 20, 24, 25], [0, 0, 0, 0]]], np.float32)
    coefs = rng.normal(size=(1, 4, NM)).astype(np.float32)
    coefs[0, 1] = -np.abs(coefs[0, 1]) * 50  # a mask every pixel of which is negative: empty...
    protos[0] = np.abs(protos[0])  # ... over all-positive prototypes
    return {"num_detections": np.array([3], np.int64), "boxes": boxes, "scores": np.array([[0.9, 0.8, 0.7, 0]], np.float32),
            "classes": np.array([[0, 1, 2, 0]], np.int64), "masks": coefs, contract.MASK_PROTOS: protos}


def _ultralytics_keep(out) -> list[bool]:
    from ultralytics.utils import ops

    n = int(out["num_detections"][0])
    masks = ops.process_mask_native(torch.from_numpy(out[contract.MASK_PROTOS][0]), torch.from_numpy(out["masks"][0, :n]),
                                    torch.from_numpy(out["boxes"][0, :n]), (S, S))
    return (masks.amax((-2, -1)) > 0).tolist()


def _split(out, drop):
    sizes = np.array([[S, S]], np.int64)
    (det,) = split_outputs(out, sizes, sizes, True, "ultralytics", True, drop)
    return det


def test_empty_masks_dropped_exactly_as_the_predictor_drops_them():
    out = _outputs()
    keep = _ultralytics_keep(out)
    assert keep == [True, False, True]  # the case is what it says: Ultralytics drops the second
    det = _split(out, drop=True)
    np.testing.assert_array_equal(det.scores, out["scores"][0, :3][keep])
    np.testing.assert_array_equal(det.boxes, out["boxes"][0, :3][keep])
    assert det.masks().reshape(len(det), -1).any(axis=1).all()
    assert len(_split(out, drop=False)) == 3  # the validator's decoding keeps every detection


@pytest.mark.parametrize("seed", range(5))
def test_random_heads_agree_with_the_predictor(seed):
    out = _outputs(seed)
    out["masks"][0] = np.random.default_rng(seed + 10).normal(size=(4, NM)).astype(np.float32) * 3
    out[contract.MASK_PROTOS][0] -= 1.0  # mixed signs: some masks empty, some not
    keep = _ultralytics_keep(out)
    assert len(_split(out, drop=True)) == sum(keep)


def test_the_key_is_written_for_the_predictors_decoding_only(tmp_path):
    from yolo_models import make_checkpoint

    from norcal.export.families import load_detector

    seg = make_checkpoint(tmp_path / "seg.pt", "yolov8n-seg.yaml", imgsz=64)
    det = make_checkpoint(tmp_path / "det.pt", "yolo11n.yaml", imgsz=64)
    meta = {name: load_detector(p, decoding=d).runtime_metadata()
            for name, p, d in (("seg-best", seg, Decoding("best-class")), ("seg-multi", seg, Decoding()),
                               ("det-best", det, Decoding("best-class")))}
    assert meta["seg-best"][contract.DROP_EMPTY_MASKS] == "true"
    assert contract.DROP_EMPTY_MASKS not in meta["seg-multi"] and contract.DROP_EMPTY_MASKS not in meta["det-best"]
    assert contract.drop_empty_masks(meta["seg-best"]) and not contract.drop_empty_masks(meta["seg-multi"])
    with pytest.raises(NorcalError, match="norcal.drop_empty_masks='yes' is not true or false"):
        contract.drop_empty_masks({contract.DROP_EMPTY_MASKS: "yes"})


def test_infer_reads_the_key_from_the_models_metadata():
    """norcal infer (runtime.inference.detect) applies the model's recorded key."""
    from norcal.runtime.inference import detect
    from norcal.runtime.preprocess import Batch

    out = _outputs()

    class Runner:
        name = "fake"
        input_names = list(contract.INPUT_NAMES)

        def __init__(self, meta):
            self.metadata = meta

        def infer(self, feeds):
            return out

    sizes = np.array([[S, S]], np.int64)
    batch = Batch(np.zeros((1, 3, S, S), np.float32), sizes, sizes, True, "ultralytics")
    meta = {contract.MASK_PASTE: "ultralytics"}
    assert len(detect(Runner(meta), batch)[0]) == 3
    assert len(detect(Runner({**meta, contract.DROP_EMPTY_MASKS: "true"}), batch)[0]) == 2


def test_tune_caches_the_masks_the_drop_needs(tmp_path):
    """Box AP of the predictor's decoding depends on the masks (an empty one drops its box): the
    tune cache of a segment model holds them and the flag, also for a box-only sweep."""
    from yolo_models import IMAGES, make_checkpoint

    from norcal.export.families import load_detector
    from norcal.runtime.images import read_rgb
    from norcal.runtime.preprocess import prepare_batch

    seg = make_checkpoint(tmp_path / "seg.pt", "yolov8n-seg.yaml", imgsz=64)
    for decoding, drops in ((Decoding("best-class"), True), (Decoding(), False)):
        det = load_detector(seg, decoding=decoding)
        batch = prepare_batch([read_rgb(IMAGES[0])], det.preprocessing)
        cache = det.cache([([1], batch)], [None], "exp", with_masks=False)
        assert cache.drop_empty_masks is drops and (cache.coefs[0] is not None) is drops
        assert type(cache).concat([cache, cache]).drop_empty_masks is drops
