"""The torchvision family: Faster / Mask R-CNN and RetinaNet with a ResNet-FPN backbone saved as a
bare state dict (``torch.save(model.state_dict())`` of ``fasterrcnn_resnet50_fpn``,
``maskrcnn_resnet50_fpn``, ``retinanet_resnet50_fpn``, or their classes around a torchvision
ResNet FPN).

The file holds no config, so the architecture comes from the key set and shapes (class count
from the predictor, ResNet depth from the blocks) and the test-time settings are torchvision's
defaults: resize 800 / 1333, ImageNet mean and std on RGB 0-1; R-CNN: RPN 1000 / 1000 at NMS 0.7,
``MultiScaleRoIAlign`` (sampling 2, aligned False), box weights (10, 10, 5, 5), score 0.05,
NMS 0.5, 100 detections; RetinaNet: 9 anchors, score 0.05, top 1000 per level, NMS 0.5, 300
detections. The model is our export-friendly R-CNN / RetinaNet (``norcal.export.rcnn.modeling``) in
the torchvision convention (:data:`norcal.export.families.torchvision.convention.TORCHVISION`): an R-CNN's
classifier has the background FIRST. FCOS and other heads or backbones are refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.export.families.base import Family
from norcal.export.families.checkpoints import TORCH_SUFFIXES
from norcal.export.families.torchvision.detector import (FAMILY, TorchvisionDetector, TorchvisionRetinaNet,
                                                         detector_from_state)
from norcal.export.families.torchvision.state_dict import (check_variant, is_torchvision_checkpoint,
                                                           rename_state_dict, saved_keys, spec_from_state)
from norcal.export.rcnn.detector import check_graph_options


class TorchvisionFamily(Family):
    """torchvision Faster / Mask R-CNN and RetinaNet state dicts, read with
    ``torch.load(weights_only=True)``."""

    name = FAMILY
    suffixes = TORCH_SUFFIXES
    takes_host_nms = True
    reads = "Faster / Mask R-CNN and RetinaNet state dicts (.pth); RGB input, resized as GeneralizedRCNNTransform"

    def claims(self, path: Path, config: Path | None) -> bool:
        return is_torchvision_checkpoint(path)  # a config given with it: load refuses it

    def check_export_options(self, options) -> None:
        check_graph_options(options)  # our R-CNN's graph options, as detectron2's

    def load(self, path: Path, config: Path | None = None, *,
             detections_per_image: int | None = None, decoding=None) -> TorchvisionDetector:
        """options: ``detections_per_image`` replaces torchvision's 100; ``decoding``: only
        Decoding(nms="host") (:meth:`SpecDetector.with_nms`)."""
        from norcal.export.families.checkpoints import read_checkpoint

        if config is not None:
            raise NorcalError(f"{config}: a torchvision state dict takes no config file")
        check_variant(saved_keys(path), path)  # by name, before reading (and checking) every weight
        return detector_from_state(read_checkpoint(path), path, detections_per_image).with_nms(decoding)


__all__ = ["TorchvisionFamily", "TorchvisionDetector", "TorchvisionRetinaNet", "detector_from_state", "is_torchvision_checkpoint",
           "rename_state_dict", "spec_from_state"]
