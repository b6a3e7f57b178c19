"""torchvision's Faster / Mask R-CNN and RetinaNet as our R-CNN / RetinaNet detectors (the torchvision
convention: an R-CNN classifier's background FIRST), built from a state dict."""

from __future__ import annotations

from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.export.families.torchvision.state_dict import rename_state_dict, spec_from_state
from norcal.export.rcnn.rcnn_detector import RCNNDetector
from norcal.export.rcnn.retinanet_detector import RetinaNetDetector

FAMILY = "torchvision"


class TorchvisionDetector(RCNNDetector):
    """A torchvision Faster / Mask R-CNN as our R-CNN in the torchvision convention: the box
    classifier's background logit FIRST (``FastRCNNPredictor``), softmax (the spec's convention says so:
    :func:`norcal.export.rcnn.spec.box_classifier`)."""

    family = FAMILY
    calibration_source = None

    def recorded_calibration(self):
        return None  # a bare state dict records no NorCal settings


class TorchvisionRetinaNet(RetinaNetDetector):
    """A torchvision RetinaNet as our RetinaNet in the torchvision convention: one sigmoid over
    the levels' class logits, no background (``RetinaNetClassificationHead``)."""

    family = FAMILY
    calibration_source = None

    def recorded_calibration(self):
        return None  # a bare state dict records no NorCal settings


def detector_from_state(state: dict, path: Path, detections_per_image: int | None = None,
                        min_size: int | None = None, max_size: int | None = None):
    """A torchvision state dict (its own names) as a detector; ``min_size`` / ``max_size``
    replace torchvision's default resize (800 / 1333), as a model built with other sizes needs."""
    from norcal.export.rcnn.modeling.build import model_from_state

    spec = spec_from_state(state, path, detections_per_image)
    if min_size is not None:
        spec.min_size_test = int(min_size)
    if max_size is not None:
        spec.max_size_test = int(max_size)
    renamed = rename_state_dict(state, path)  # its errors name the file already
    try:
        model = model_from_state(spec, renamed)
    except NorcalError as e:
        raise NorcalError(f"{path}: {e}") from None
    from norcal.export.rcnn.spec import RETINANET

    return (TorchvisionRetinaNet if spec.meta_architecture == RETINANET else TorchvisionDetector)(spec, model)
