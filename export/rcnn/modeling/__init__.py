"""An export-friendly implementation of detectron2's GeneralizedRCNN family.

One concept per module, torchvision's cut: ``backbone`` (ResNet/ResNeXt), ``fpn``,
``anchors``, ``box_coder``, ``rpn``, ``poolers``, ``box_head``, ``box_predictor``,
``mask_head``, ``roi_heads``, composed in ``rcnn``; ``ops`` holds NMS and ROIAlign with their
ONNX forms, ``layers`` the shared blocks, ``build`` maps a ModelSpec + detectron2 state dict
onto the model. One batched, fixed-size forward serves eager PyTorch and the ONNX export.
"""

from .build import model_from_state, create_model, random_state_dict
from .rcnn import GeneralizedRCNN

__all__ = ["GeneralizedRCNN", "model_from_state", "create_model", "random_state_dict"]
