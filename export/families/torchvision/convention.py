"""How torchvision's Faster / Mask R-CNN and RetinaNet run the layers our R-CNN shares with
detectron2's, where the two differ (:class:`norcal.export.rcnn.spec.Convention`)."""

from norcal.core.contract import RESIZE_TORCHVISION
from norcal.export.rcnn.spec import Convention

TORCHVISION = Convention(
    name="torchvision",
    rounded_anchors=True,  # AnchorGenerator.generate_anchors
    per_image_anchor_strides=True,  # AnchorGenerator: the strides of each image's own padded size
    level_eps_after_log=True,  # poolers.LevelMapper
    background="first",  # FastRCNNPredictor: background logit and box first
    min_box_size=1e-2,  # RoIHeads.postprocess_detections: remove_small_boxes(boxes, 1e-2)
    mask_background_channel=True,  # MaskRCNNPredictor: a mask per class and background
    rpn_min_size_inclusive=True,  # RegionProposalNetwork: remove_small_boxes keeps sides >= min_size
    clip_retinanet_boxes=True,  # RetinaNet.postprocess_detections clips before NMS
    resize=RESIZE_TORCHVISION,  # GeneralizedRCNNTransform's resize
    mask_paste="torchvision",  # paste_masks_in_image
    fpn_only=True,  # the models it builds: ResNet-FPN with standard ROI heads
)
