"""Infer a detectron2 RetinaNet's ModelSpec from its state dict alone (no config file).

The weights fix the ResNet, FPN width, head depth, classes and anchors per location (9 in
detectron2's Base-RetinaNet); the anchor sizes, input sizes and test thresholds are
detectron2's RetinaNet values, noted in ``spec.provenance``.
"""

from __future__ import annotations

from typing import Any, Mapping

from norcal.core.errors import NorcalError

from norcal.export.families.detectron2.weights.resnet import STEM, backbone_fields, norm_family, norm_of, pixel_stats, shape
from norcal.export.families.detectron2.convention import DETECTRON2
from norcal.export.families.detectron2.weights.unread_backbones import unread_backbone_message
from norcal.export.rcnn.spec import (FPN_BACKBONE, RETINANET, RETINANET_BACKBONE, STANDARD_ROI_HEADS, SUPPORTED_ARCHITECTURES,
                   ModelSpec)

HEAD = "head"
CLS_SUBNET = f"{HEAD}.cls_subnet"
# Base-RetinaNet.yaml: three sizes per level (x 2^0, 2^1/3, 2^2/3), three aspect ratios
RETINANET_ANCHOR_SIZES = tuple(tuple(x * 2 ** (i / 3) for i in range(3)) for x in (32, 64, 128, 256, 512))
RETINANET_ASPECT_RATIOS = ((0.5, 1.0, 2.0),)
RETINANET_TOPK_CANDIDATES = 1000


def is_retinanet(sd: Mapping[str, Any]) -> bool:
    return f"{CLS_SUBNET}.0.weight" in sd


def retinanet_spec_from_weights(sd: Mapping[str, Any], anchor_layout=None, config_norms: bool = False) -> ModelSpec:
    """The RetinaNet that ``sd`` (detectron2 names) holds; ``anchor_layout`` and ``config_norms`` as in
    :func:`norcal.export.families.detectron2.weights.architecture.spec_from_weights`."""
    need = [k for k in (f"{STEM}.weight", "backbone.fpn_lateral3.weight", "backbone.top_block.p6.weight",
                        f"{HEAD}.cls_score.weight", f"{HEAD}.bbox_pred.weight") if k not in sd]
    if need and unread_backbone_message(sd, SUPPORTED_ARCHITECTURES):
        raise NorcalError(unread_backbone_message(sd, SUPPORTED_ARCHITECTURES))
    if need:
        raise NorcalError(f"a RetinaNet checkpoint needs weights {', '.join(need)}")
    if "backbone.fpn_lateral2.weight" in sd:
        raise NorcalError("RetinaNet weights with an FPN level from res2 are not supported (detectron2 "
                          "builds it from res3-res5)")
    fields = backbone_fields(sd, {"backbone_name": FPN_BACKBONE, "roi_heads_name": STANDARD_ROI_HEADS},
                             config_norms)
    num_convs = 0
    while f"{CLS_SUBNET}.{2 * num_convs}.weight" in sd:  # Sequential of (conv, ReLU) pairs
        num_convs += 1
    if any(k.startswith(f"{CLS_SUBNET}.1.") for k in sd):
        raise NorcalError("normalisation in the RetinaNet head (MODEL.RETINANET.NORM) is not supported; "
                          f"{SUPPORTED_ARCHITECTURES}")
    deltas = shape(sd, f"{HEAD}.bbox_pred.weight")[0]
    anchors = deltas // 4
    cls_rows = shape(sd, f"{HEAD}.cls_score.weight")[0]
    if deltas % 4 or cls_rows % anchors:
        raise NorcalError(f"{HEAD}.cls_score has {cls_rows} rows for {anchors} anchors; expected a multiple")
    sizes, ratios = anchor_layout or (RETINANET_ANCHOR_SIZES, RETINANET_ASPECT_RATIOS)
    if len(sizes[0]) * len(ratios[0]) != anchors:
        raise NorcalError(f"the RetinaNet head predicts {anchors} anchors per location; only "
                          f"{len(sizes[0]) * len(ratios[0])} ({'the config' if anchor_layout else 'Base-RetinaNet'}) "
                          "fit: pass the model's config.yaml")
    stats = pixel_stats(sd)
    assumed = "assumed, not readable from weights"
    provenance = {
        "source": "inferred from weights",
        "architecture": "RetinaNet: read from the weight names (head.cls_subnet)",
        "stride_in_1x1": f"{assumed}: True (detectron2 model zoo, MSRA ResNets)",
        "anchor_sizes": f"{assumed}: 32-512 x 2^(0, 1/3, 2/3) per level (detectron2 Base-RetinaNet)",
        "anchor_aspect_ratios": "(0.5, 1, 2): the head predicts 9 anchors per location",
        "input": f"{assumed}: BGR, shortest edge 800, max 1333 (detectron2 LVIS configs)",
        "test_thresholds": (f"{assumed}: score 1e-4, NMS 0.5, 300 detections (detectron2 LVIS configs), "
                            f"top {RETINANET_TOPK_CANDIDATES} candidates per level (detectron2 default)"),
        "pixel_mean/std": ("read from the checkpoint's pixel_mean/pixel_std" if stats
                           else f"{assumed}: detectron2 defaults (ImageNet BGR mean, std 1)"),
    }
    return ModelSpec(
        meta_architecture=RETINANET, backbone_name=RETINANET_BACKBONE, mask_on=False, use_sigmoid_ce=True,
        convention=DETECTRON2,
        stride_in_1x1=True, input_format="BGR", min_size_test=800, max_size_test=1333,
        fpn_out_channels=shape(sd, "backbone.fpn_lateral3.weight")[0],
        fpn_norm=norm_of(sd, "backbone.fpn_lateral3.norm", config_norms),
        anchor_sizes=sizes, anchor_aspect_ratios=ratios, num_classes=cls_rows // anchors,
        bbox_reg_weights=(1.0, 1.0, 1.0, 1.0), score_thresh_test=1e-4, nms_thresh_test=0.5,
        detections_per_image=300, retinanet_num_convs=num_convs,
        retinanet_topk_candidates=RETINANET_TOPK_CANDIDATES, provenance=provenance, **stats, **fields)


def retinanet_architecture(spec: ModelSpec) -> dict:
    """What the weights of a RetinaNet fix (see ``arch_from_weights.architecture``)."""
    arch = {"meta_architecture": spec.meta_architecture, "depth": spec.depth,
            "norm": norm_family(spec.norm), "stem_out_channels": spec.stem_out_channels,
            "res2_out_channels": spec.res2_out_channels, "num_classes": spec.num_classes,
            "fpn_out_channels": spec.fpn_out_channels, "fpn_norm": norm_family(spec.fpn_norm),
            "retinanet_num_convs": spec.retinanet_num_convs,
            "anchors_per_location": len(spec.anchor_sizes[0]) * len(spec.anchor_aspect_ratios[0])}
    if spec.depth >= 50:
        arch.update(num_groups=spec.num_groups, width_per_group=spec.width_per_group)
    return arch
