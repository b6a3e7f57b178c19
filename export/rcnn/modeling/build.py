"""One place that maps a ModelSpec + a detectron2 state dict onto our model."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch

from norcal.core.errors import NorcalError

from ..spec import (CASCADE_ROI_HEADS, FPN_BACKBONE, RES5_ROI_HEADS, RESNET_BACKBONE, RETINANET, STANDARD_ROI_HEADS,
                    VIT_BACKBONE, Convention, ModelSpec)
from .anchors import AnchorGenerator
from .backbone import ResNet, ResNetBackbone, res5_head
from .box_head import FastRCNNConvFCHead
from .box_predictor import FastRCNNOutputLayers
from .cascade import CascadeROIHeads
from .fpn import FPN
from .mask_head import MaskRCNNConvUpsampleHead
from .mvit import MViT
from .poolers import ROIPooler
from .regnet import RegNet
from .rcnn import GeneralizedRCNN
from .retinanet import RetinaFPN, RetinaNet, RetinaNetHead
from .roi_heads import Res5ROIHeads, StandardROIHeads
from .vit import SimpleFeaturePyramid
from .rpn import RPN, StandardRPNHead

# buffers detectron2 may or may not have saved; they do not change inference
_OPTIONAL_SUFFIXES = ("num_batches_tracked",)


def _check_spec(spec: ModelSpec) -> None:
    if spec.meta_architecture != "GeneralizedRCNN":
        raise NorcalError(f"meta architecture {spec.meta_architecture!r} is not supported "
                          "(only GeneralizedRCNN: Faster / Mask R-CNN with FPN, C4 or DC5)")
    if spec.backbone_name not in (FPN_BACKBONE, RESNET_BACKBONE, VIT_BACKBONE):
        raise NorcalError(f"backbone {spec.backbone_name!r} is not supported "
                          f"({FPN_BACKBONE}, {RESNET_BACKBONE} or {VIT_BACKBONE})")
    if (spec.backbone_name == VIT_BACKBONE) != (spec.vit is not None):
        raise NorcalError(f"backbone {spec.backbone_name!r} with{'out' if spec.vit is None else ''} a ViT spec: "
                          f"a ViT goes with {VIT_BACKBONE} (ViTDet) only")
    if spec.vit is not None and spec.roi_heads_name not in (STANDARD_ROI_HEADS, CASCADE_ROI_HEADS):
        raise NorcalError(f"a ViT backbone is supported with {STANDARD_ROI_HEADS} or {CASCADE_ROI_HEADS} only")
    if spec.roi_heads_name not in (STANDARD_ROI_HEADS, RES5_ROI_HEADS, CASCADE_ROI_HEADS):
        raise NorcalError(f"ROI heads {spec.roi_heads_name!r} are not supported "
                          f"({STANDARD_ROI_HEADS}, {RES5_ROI_HEADS} or {CASCADE_ROI_HEADS})")
    if spec.roi_heads_name == CASCADE_ROI_HEADS:
        _check_cascade(spec)
    if spec.regnet is not None and spec.backbone_name != FPN_BACKBONE:
        raise NorcalError("a RegNet is supported as the bottom-up of an FPN only")
    if spec.mvit is not None and (spec.backbone_name != FPN_BACKBONE or spec.regnet is not None):
        raise NorcalError("an MViT is supported as the bottom-up of an FPN only")
    if spec.mvit is not None and (spec.mvit.square_pad <= 0 or spec.mvit.square_pad % 32):
        raise NorcalError(f"an MViT FPN needs its images padded to a square, a multiple of 32 (square_pad, got "
                          f"{spec.mvit.square_pad}): its windowed attention would otherwise see the batch's padding")
    if spec.roi_heads_name == RES5_ROI_HEADS and (spec.backbone_name, spec.backbone_out_feature) != \
            (RESNET_BACKBONE, "res4"):
        raise NorcalError(f"{RES5_ROI_HEADS} (C4) needs a ResNet backbone that ends at res4")
    if spec.input_format not in ("BGR", "RGB"):
        raise NorcalError(f"input format {spec.input_format!r} must be BGR or RGB")
    if spec.fpn_fuse_type not in ("sum", "avg"):
        raise NorcalError(f"FPN fuse type {spec.fpn_fuse_type!r} must be 'sum' or 'avg'")
    _check_convention(spec)
    if spec.convention.fpn_only and (spec.backbone_name, spec.roi_heads_name) != (FPN_BACKBONE, STANDARD_ROI_HEADS):
        raise NorcalError(f"the {spec.convention.name} convention covers Faster / Mask R-CNN with FPN only")


def _check_convention(spec: ModelSpec) -> None:
    if not isinstance(spec.convention, Convention):
        raise NorcalError(f"convention {spec.convention!r} must be a {Convention.__qualname__} "
                          "(the family reading the weights sets it)")


def _check_cascade(spec: ModelSpec) -> None:
    if spec.backbone_name not in (FPN_BACKBONE, VIT_BACKBONE):  # P2-P5 from an FPN or ViTDet's pyramid
        raise NorcalError(f"{CASCADE_ROI_HEADS} are supported with an FPN backbone or ViTDet's pyramid only")
    if not spec.cascade_bbox_reg_weights:
        raise NorcalError(f"{CASCADE_ROI_HEADS} need the stages' box regression weights "
                          "(cascade_bbox_reg_weights)")
    if not spec.cls_agnostic_bbox_reg:
        raise NorcalError(f"{CASCADE_ROI_HEADS} regress class-agnostic boxes (cls_agnostic_bbox_reg)")


def _backbone(spec: ModelSpec):
    """(backbone, its feature channels, each image's own padding in detectron2)."""
    resnet = dict(depth=spec.depth, norm=spec.norm, stem_out_channels=spec.stem_out_channels,
                  res2_out_channels=spec.res2_out_channels, num_groups=spec.num_groups,
                  width_per_group=spec.width_per_group, stride_in_1x1=spec.stride_in_1x1,
                  res5_dilation=spec.res5_dilation)
    if spec.vit is not None:
        backbone = SimpleFeaturePyramid(spec.vit, spec.fpn_out_channels, spec.fpn_norm)
        # detectron2 pads every image to the square
        return backbone, spec.fpn_out_channels, backbone.size_divisibility
    if spec.backbone_name == FPN_BACKBONE:
        bottom_up = (RegNet(spec.regnet, spec.norm) if spec.regnet is not None
                     else MViT(spec.mvit) if spec.mvit is not None else ResNet(**resnet))
        backbone = FPN(bottom_up, spec.fpn_out_channels, spec.fpn_norm, spec.fpn_fuse_type)
        if spec.mvit is not None:  # detectron2 pads every image to the FPN's square: the graph's input size
            backbone.size_divisibility = backbone.square = spec.mvit.square_pad
            return backbone, spec.fpn_out_channels, backbone.square
        # detectron2 pads each image to FPN's largest input stride
        return backbone, spec.fpn_out_channels, backbone.in_strides[-1]
    backbone = ResNetBackbone(spec.backbone_out_feature, **resnet)
    return backbone, backbone.out_channels[spec.backbone_out_feature], backbone.size_divisibility


def _box_predictor(spec: ModelSpec, input_size: int, box_weights=None) -> FastRCNNOutputLayers:
    return FastRCNNOutputLayers(
        input_size, spec.num_classes, cls_agnostic_bbox_reg=spec.cls_agnostic_bbox_reg,
        box_weights=spec.bbox_reg_weights if box_weights is None else box_weights, use_sigmoid=spec.use_sigmoid_ce,
        score_thresh=spec.score_thresh_test, nms_thresh=spec.nms_thresh_test,
        topk=spec.detections_per_image, background=spec.convention.background,
        min_box_size=spec.convention.min_box_size)


def _mask_head(spec: ModelSpec, in_channels: int) -> MaskRCNNConvUpsampleHead:
    # a background mask channel too: class c is channel c + 1
    bg = spec.convention.mask_background_channel and not spec.cls_agnostic_mask
    return MaskRCNNConvUpsampleHead(in_channels, num_conv=spec.mask_head_num_conv,
                                    conv_dim=spec.mask_head_conv_dim, num_classes=spec.num_classes + bg,
                                    cls_agnostic=spec.cls_agnostic_mask, norm=spec.mask_head_norm,
                                    class_offset=int(bg))


def _roi_heads(spec: ModelSpec, ch: int, roi_strides):
    box_pooler = ROIPooler(spec.pooler_resolution, roi_strides, spec.pooler_sampling_ratio,
                           spec.pooler_type, level_eps_after_log=spec.convention.level_eps_after_log)
    if spec.roi_heads_name == RES5_ROI_HEADS:
        res5 = res5_head(ch, num_groups=spec.num_groups, width_per_group=spec.width_per_group,
                         norm=spec.norm, stride_in_1x1=spec.stride_in_1x1)
        out = res5[-1].conv3.out_channels
        # one pooler for both branches: ROI_MASK_HEAD's pooler settings play no part
        return Res5ROIHeads(box_pooler, res5, _box_predictor(spec, out),
                            _mask_head(spec, out) if spec.mask_on else None)
    mask_pooler = mask_head = None
    if spec.mask_on:
        mask_pooler = ROIPooler(spec.mask_pooler_resolution, roi_strides,
                                spec.mask_pooler_sampling_ratio, spec.mask_pooler_type,
                                level_eps_after_log=spec.convention.level_eps_after_log)
        mask_head = _mask_head(spec, ch)
    if spec.roi_heads_name == CASCADE_ROI_HEADS:
        heads = [_box_head(spec, ch) for _ in spec.cascade_bbox_reg_weights]
        predictors = [_box_predictor(spec, h.output_size, w)
                      for h, w in zip(heads, spec.cascade_bbox_reg_weights)]
        return CascadeROIHeads(box_pooler, heads, predictors, mask_pooler, mask_head)
    box_head = _box_head(spec, ch)
    return StandardROIHeads(box_pooler, box_head, _box_predictor(spec, box_head.output_size),
                            mask_pooler, mask_head)


def _box_head(spec: ModelSpec, ch: int) -> FastRCNNConvFCHead:
    box_head = FastRCNNConvFCHead(ch, spec.pooler_resolution, num_conv=spec.box_head_num_conv,
                                  conv_dim=spec.box_head_conv_dim, num_fc=spec.box_head_num_fc,
                                  fc_dim=spec.box_head_fc_dim, norm=spec.box_head_norm)
    if box_head.num_fc == 0:
        raise NorcalError("a box head without fully connected layers is not supported")
    return box_head


def _pixel_stats(spec: ModelSpec) -> tuple[list[float], list[float]]:
    mean, std = list(spec.pixel_mean), list(spec.pixel_std)
    if spec.input_format == "RGB":
        # the graph's contract is BGR input: flip the statistics, and the first conv (model_from_state)
        mean, std = mean[::-1], std[::-1]
    return mean, std


def _anchors(spec: ModelSpec, strides) -> AnchorGenerator:
    return AnchorGenerator(spec.anchor_sizes, spec.anchor_aspect_ratios, strides, spec.anchor_offset,
                           rounded=spec.convention.rounded_anchors,
                           per_image_strides=spec.convention.per_image_anchor_strides)


def create_retinanet(spec: ModelSpec) -> RetinaNet:
    """detectron2's RetinaNet for ``spec`` (FPN backbone, no norm in the head), in eval mode."""
    if spec.input_format not in ("BGR", "RGB"):
        raise NorcalError(f"input format {spec.input_format!r} must be BGR or RGB")
    resnet = ResNet(depth=spec.depth, norm=spec.norm, stem_out_channels=spec.stem_out_channels,
                    res2_out_channels=spec.res2_out_channels, num_groups=spec.num_groups,
                    width_per_group=spec.width_per_group, stride_in_1x1=spec.stride_in_1x1)
    _check_convention(spec)
    backbone = RetinaFPN(resnet, spec.fpn_out_channels, spec.fpn_norm, spec.retinanet_p6_from_p5)
    anchors = _anchors(spec, backbone.strides)
    head = RetinaNetHead(spec.fpn_out_channels, anchors.num_anchors, spec.num_classes,
                         spec.retinanet_num_convs)
    mean, std = _pixel_stats(spec)
    model = RetinaNet(backbone, head, anchors, num_classes=spec.num_classes, pixel_mean=mean,
                      pixel_std=std, box_weights=spec.bbox_reg_weights,
                      score_thresh=spec.score_thresh_test,
                      topk_candidates=spec.retinanet_topk_candidates,
                      nms_thresh=spec.nms_thresh_test,
                      detections_per_image=spec.detections_per_image,
                      # detectron2 pads each image to FPN's largest input stride (res5's)
                      size_divisibility=backbone.in_strides[-1], clip_boxes=spec.convention.clip_retinanet_boxes)
    return model.eval()


def create_model(spec: ModelSpec) -> GeneralizedRCNN | RetinaNet:
    """The model for ``spec`` with default-initialised weights, in eval mode."""
    if spec.meta_architecture == RETINANET:
        return create_retinanet(spec)
    _check_spec(spec)
    backbone, ch, per_image_divisibility = _backbone(spec)
    anchors = _anchors(spec, backbone.strides)
    rpn = RPN(StandardRPNHead(ch, anchors.num_anchors, spec.rpn_conv_dims), anchors,
              box_weights=spec.rpn_bbox_reg_weights, pre_nms_topk=spec.rpn_pre_nms_topk_test,
              post_nms_topk=spec.rpn_post_nms_topk_test, nms_thresh=spec.rpn_nms_thresh,
              min_size=spec.rpn_min_size, min_size_inclusive=spec.convention.rpn_min_size_inclusive)
    # FPN: the heads pool from P2-P5 (P6 is the RPN's only); C4/DC5: the one map
    roi_strides = backbone.in_strides if spec.backbone_name in (FPN_BACKBONE, VIT_BACKBONE) else backbone.strides
    roi_heads = _roi_heads(spec, ch, roi_strides)
    mean, std = _pixel_stats(spec)
    model = GeneralizedRCNN(backbone, rpn, roi_heads, pixel_mean=mean, pixel_std=std,
                            size_divisibility=per_image_divisibility)
    return model.eval()


def _to_tensor(name: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    raise NorcalError(f"checkpoint entry {name!r} is a {type(value).__name__}, not an array")


def _listing(keys, limit: int = 12) -> str:
    keys = sorted(keys)
    more = f" ... (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def model_from_state(spec: ModelSpec, state_dict: Mapping[str, object]) -> GeneralizedRCNN:
    """Our model for ``spec`` loaded from a detectron2 state dict (detectron2's key names).

    Strict: missing or unexpected keys, and shape mismatches, are a NorcalError listing them.
    Values may be torch tensors or numpy arrays (model-zoo ``.pkl``).
    """
    model = create_model(spec)
    expected = model.state_dict()
    given = {k: v for k, v in state_dict.items() if k not in ("pixel_mean", "pixel_std")}
    missing = [k for k in expected if k not in given and not k.endswith(_OPTIONAL_SUFFIXES)]
    unexpected = [k for k in given if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing: {_listing(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected: {_listing(unexpected)}")
        raise NorcalError("checkpoint does not match the model spec: " + "; ".join(parts))
    tensors = {}
    bad = []
    for k, v in given.items():
        t = _to_tensor(k, v)
        if tuple(t.shape) != tuple(expected[k].shape):
            bad.append(f"{k} {tuple(t.shape)} vs {tuple(expected[k].shape)}")
        tensors[k] = t.to(expected[k].dtype)
    if bad:
        raise NorcalError(f"checkpoint shapes do not match the model spec ({len(bad)}): "
                          + "; ".join(bad[:8]) + (" ..." if len(bad) > 8 else ""))
    if spec.input_format == "RGB":
        w = next(k for k in tensors if k.endswith(("stem.conv1.weight", "bottom_up.stem.conv.weight",
                                                   "net.patch_embed.proj.weight",
                                                   "bottom_up.patch_embed.proj.weight")))
        tensors[w] = tensors[w].flip(1)  # RGB-trained stem, BGR graph input
    model.load_state_dict(tensors, strict=False)
    return model


def random_state_dict(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """A randomly initialised, well-conditioned state dict for ``spec`` with detectron2's names.

    He-normal convs and fcs (the stem scaled for 0-255 input), identity norms, and detectron2's
    head init: RPN outputs std 0.01, classifier std 0.001, box regressor std 0.001, so features
    stay O(1) at any depth and every class scores about 1/(C+1) (the NMS worst case).
    """
    model = create_model(spec)
    gen = torch.Generator().manual_seed(int(seed))
    small = {"cls_score.weight": 0.001, "bbox_pred.weight": 0.001, "objectness_logits.weight": 0.01,
             "anchor_deltas.weight": 0.01, "mask_head.predictor.weight": 0.001}
    out = {}
    for name, t in model.state_dict().items():
        std = next((v for k, v in small.items() if name.endswith(k)), None)
        if name.endswith(("running_var", "norm.weight", "bn.weight")):
            v = torch.ones_like(t)
        elif name.endswith(("running_mean", "num_batches_tracked", ".bias")):
            v = torch.zeros_like(t)
        elif std is not None:
            v = torch.randn(t.shape, generator=gen) * std
        elif t.dim() >= 2:
            fan_in = math.prod(t.shape[1:]) if "deconv" not in name else t.shape[0] * 4
            v = torch.randn(t.shape, generator=gen) * math.sqrt(2.0 / fan_in)
            if name.endswith(("stem.conv1.weight", "stem.conv.weight")):
                v = v / 64.0  # pixels minus mean are O(100), not O(1)
            elif name.startswith(("backbone.", "roi_heads.res5.")) and ".res" in name \
                    and name.endswith(("conv3.weight", "conv2.weight")) and ".0." not in name:
                v = v * 0.3  # keep residual sums from growing block by block
        else:
            v = torch.zeros_like(t)
        out[name] = v.to(t.dtype)
    return out
