"""How detectron2 runs the layers our R-CNN shares with torchvision's: the defaults of
:class:`norcal.export.rcnn.spec.Convention`, spelled out."""

from norcal.export.rcnn.spec import Convention

DETECTRON2 = Convention(
    name="detectron2",
    rounded_anchors=False,  # DefaultAnchorGenerator: exact cell anchors, sizes outer
    per_image_anchor_strides=False,  # the levels' nominal strides
    level_eps_after_log=False,  # assign_boxes_to_levels: eps inside the log
    background="last",  # FastRCNNOutputLayers: background logit last, no box for it
    min_box_size=0.0,  # fast_rcnn_inference drops only empty boxes
    mask_background_channel=False,  # MaskRCNNConvUpsampleHead: a mask per class
    rpn_min_size_inclusive=False,  # find_top_rpn_proposals: Boxes.nonempty(threshold=min_size)
    clip_retinanet_boxes=False,  # RetinaNet clips the detections only, in the original image
    resize=None,  # ResizeShortestEdge: the contract's default rule
    mask_paste="detectron2",  # paste_masks_in_image
    fpn_only=False,  # FPN, C4, DC5 and Cascade
)
