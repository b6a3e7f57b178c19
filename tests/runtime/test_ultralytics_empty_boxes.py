"""Ultralytics keeps a detection whose box, clipped to the image, has no area (a box predicted in
the letterbox padding): its validator's ``scale_boxes`` clips and keeps every row. The host
must keep it too for Ultralytics models (detectron2 drops such boxes; its models keep doing so)."""

import os
import tempfile

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="yolo_cfg_"))

import torch  # noqa: E402

from norcal.core.contract import Preprocessing  # noqa: E402
from norcal.runtime.inference import detect  # noqa: E402
from norcal.runtime.preprocess import prepare_batch  # noqa: E402


class _Fixed:
    """A runner returning fixed outputs, whatever the feeds."""

    def __init__(self, outputs):
        self.outputs = outputs

    def infer(self, feeds):
        return self.outputs


def _outputs(boxes):
    k = len(boxes)
    return {"num_detections": np.array([k], np.int64), "boxes": np.array([boxes], np.float32),
            "scores": np.linspace(0.9, 0.5, k, dtype=np.float32)[None],
            "classes": np.zeros((1, k), np.int64)}


def test_letterbox_keeps_boxes_in_the_padding_as_ultralytics_scale_boxes():
    from ultralytics.utils.ops import scale_boxes

    image = np.zeros((150, 320, 3), np.uint8)  # letterboxed to 96: resized 45 x 96, 25 rows above
    batch = prepare_batch([image], Preprocessing(min_size=96, max_size=96, input_format="RGB",
                                                 divisibility=96, resize="letterbox", input_size=96))
    assert batch.image_sizes.tolist() == [[45, 96]]
    # resized coordinates (the graph removes the centring offset): in the image, wholly above it
    # (in the top padding), wholly left of it
    boxes = [[10.0, 5.0, 50.0, 30.0], [10.0, -20.0, 50.0, -5.0], [-9.0, 3.0, -1.0, 9.0]]
    dets = detect(_Fixed(_outputs(boxes)), batch)[0]
    # Ultralytics: boxes in the letterboxed square (offset back), mapped by its own scale_boxes
    square = torch.tensor(boxes) + torch.tensor([0.0, 25.0, 0.0, 25.0])
    want = scale_boxes((96, 96), square, (150, 320)).numpy()
    assert len(dets) == 3
    np.testing.assert_allclose(dets.boxes, want, rtol=0, atol=1e-3)
    np.testing.assert_array_equal(dets.scores, _outputs(boxes)["scores"][0])


def test_stretch_keeps_boxes_outside_the_image_hand_computed():
    image = np.zeros((60, 80, 3), np.uint8)  # stretched to 128 x 128
    batch = prepare_batch([image], Preprocessing(min_size=128, max_size=128, input_format="RGB",
                                                 divisibility=128, resize="stretch", input_size=128))
    boxes = [[-30.0, 10.0, -5.0, 50.0], [64.0, 64.0, 96.0, 192.0]]
    dets = detect(_Fixed(_outputs(boxes)), batch)[0]
    # x * 80 / 128, y * 60 / 128, clipped to 80 x 60
    np.testing.assert_allclose(dets.boxes, [[0, 4.6875, 0, 23.4375], [40, 30, 60, 60]], rtol=0, atol=1e-4)


def test_shortest_edge_still_drops_empty_boxes_as_detectron2():
    image = np.zeros((40, 40, 3), np.uint8)
    batch = prepare_batch([image], Preprocessing(40, 40, "BGR", 32))
    dets = detect(_Fixed(_outputs([[-9.0, 3.0, -1.0, 9.0], [1.0, 1.0, 5.0, 5.0]])), batch)[0]
    np.testing.assert_allclose(dets.boxes, [[1, 1, 5, 5]])


def test_a_kept_empty_box_has_an_empty_mask_without_warnings():
    import warnings

    from norcal.runtime.postprocess import ImageDetections
    from norcal.runtime.results import detections_to_results

    # Ultralytics crops a mask to its box: a box with no area has no mask pixels
    dets = ImageDetections(boxes=np.array([[10, 0, 50, 0], [0, 5, 0, 9], [5, 5, 20, 20]], np.float32),
                           scores=np.array([0.9, 0.8, 0.7], np.float32), classes=np.array([0, 1, 0]),
                           mask_probs=np.ones((3, 28, 28), np.float32), image_size=(30, 60))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        masks = dets.masks()
        results = detections_to_results(1, dets, None, with_masks=True)
    assert masks.sum(axis=(1, 2)).tolist() == [0, 0, 15 * 15]
    assert [r["bbox"] for r in results[:2]] == [[10.0, 0.0, 40.0, 0.0], [0.0, 5.0, 0.0, 4.0]]


def test_ray_workers_keep_them_too(tmp_path):
    """The Ray pipeline's two steps, called in this process: a letterbox model's batch keeps the
    box in the padding as the single-process host does."""
    import json

    from PIL import Image

    from norcal.runtime.ray_inference import ResultsFormat, _read_and_prepare, _RunnerActor

    Image.fromarray(np.zeros((150, 320, 3), np.uint8)).save(tmp_path / "a.png")
    spec = Preprocessing(min_size=96, max_size=96, input_format="RGB", divisibility=96,
                         resize="letterbox", input_size=96)
    row = _read_and_prepare({"batch": 0, "paths": [str(tmp_path / "a.png")], "ids": json.dumps([1])}, spec)
    boxes = [[10.0, 5.0, 50.0, 30.0], [10.0, -20.0, 50.0, -5.0]]
    actor = _RunnerActor(lambda: _Fixed(_outputs(boxes)), ResultsFormat(None, with_masks=False))
    out = actor({k: [v] for k, v in row.items()})
    assert json.loads(out["counts"][0]) == [2]
