"""A torchvision Mask R-CNN's masks are pasted as torchvision pastes them
(``paste_masks_in_image``: the mask padded by one cell, its box widened to match and cut to
integers, ``F.interpolate`` bilinear onto the integer box, ``> 0.5`` as torchvision's COCO
evaluation thresholds), not with detectron2's ``grid_sample`` paste, which gave 28% of the
pixels of random masks differently."""

import numpy as np
import torch
from torchvision.models.detection.roi_heads import paste_masks_in_image

from norcal.core.contract import Preprocessing
from norcal.runtime.inference import detect
from norcal.runtime.postprocess import ImageDetections
from norcal.runtime.preprocess import prepare_batch
from norcal.runtime.results import detections_to_results


def _random(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    masks = torch.rand((n, 1, 28, 28), generator=g)
    xy = torch.rand((n, 2), generator=g) * 220 - 20  # some past the left / top border
    wh = torch.rand((n, 2), generator=g) * 90 + 0.3  # down to a fraction of a pixel
    # clipped to the 200 x 150 image, as torchvision's boxes always are
    boxes = torch.minimum(torch.cat([xy, xy + wh], 1).clamp(min=0), torch.tensor([200.0, 150, 200, 150]))
    return masks, boxes


def test_paste_equals_torchvision_paste_masks_in_image():
    masks, boxes = _random()
    want = paste_masks_in_image(masks, boxes, (150, 200))[:, 0].numpy() > 0.5
    det = ImageDetections(boxes=boxes.numpy(), scores=np.ones(len(boxes), np.float32),
                          classes=np.zeros(len(boxes), np.int64), mask_probs=masks[:, 0].numpy(),
                          image_size=(150, 200), mask_paste="torchvision")
    np.testing.assert_array_equal(det.masks(), want)
    from pycocotools import mask as mask_util

    got = np.stack([mask_util.decode(r["segmentation"]) for r in detections_to_results(1, det, None)])
    np.testing.assert_array_equal(got.astype(bool), want)


def test_a_torchvision_batch_pastes_as_torchvision():
    masks, boxes = _random(6, seed=1)
    image = np.zeros((150, 200, 3), np.uint8)  # torchvision's resize: 800 x 1066
    batch = prepare_batch([image], Preprocessing(min_size=800, max_size=1333, input_format="RGB",
                                                 divisibility=32, resize="torchvision"))

    class Fixed:
        def infer(self, feeds):
            scale = np.array(batch.image_sizes[0][::-1].tolist() * 2, np.float32) / np.array([200, 150] * 2)
            return {"num_detections": np.array([6]), "boxes": (boxes.numpy() * scale)[None],
                    "scores": np.ones((1, 6), np.float32), "classes": np.zeros((1, 6), np.int64),
                    "masks": masks[:, 0].numpy()[None]}

    det = detect(Fixed(), batch)[0]
    want = paste_masks_in_image(masks, torch.from_numpy(det.boxes), (150, 200))[:, 0].numpy() > 0.5
    np.testing.assert_array_equal(det.masks(), want)
