"""torchvision Faster / Mask R-CNN and RetinaNet state dicts."""

from norcal.export.families.torchvision.family import TorchvisionFamily

__all__ = ["TorchvisionFamily"]
