"""detectron2's R-CNN and RetinaNet as the shared R-CNN's detectors, named as this family's; its
config may record the NorCal authors' settings (TEST.CALIBRATION)."""

from __future__ import annotations

from norcal.export.rcnn.rcnn_detector import RCNNDetector
from norcal.export.rcnn.retinanet_detector import RetinaNetDetector

FAMILY = "detectron2"


class Detectron2RCNN(RCNNDetector):
    """A detectron2 (Mask / Cascade) R-CNN: background LAST, softmax."""

    family = FAMILY
    calibration_source = "TEST.CALIBRATION"


class Detectron2RetinaNet(RetinaNetDetector):
    """A detectron2 RetinaNet: one sigmoid, no background."""

    family = FAMILY
    calibration_source = "TEST.CALIBRATION"
