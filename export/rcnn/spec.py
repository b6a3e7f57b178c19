"""ModelSpec: everything about an R-CNN or RetinaNet (detectron2's, or torchvision's in its
convention) that changes inference, in one place.

Bottom-ups: a ResNet (``depth``), a RegNet (:class:`RegNetSpec`), ViTDet's plain ViT with a
simple feature pyramid (:class:`ViTSpec`) or an MViTv2 (:class:`MViTSpec`). Layouts
(``arch_name``): FPN (``build_resnet_fpn_backbone`` + StandardROIHeads
over P2-P5), C4 (``build_resnet_backbone`` up to res4 + ``Res5ROIHeads``, which runs res5 on
each pooled box), DC5 (``build_resnet_backbone`` with a dilated, stride-16 res5 +
StandardROIHeads on it), Cascade (FPN + ``CascadeROIHeads``: a box head and predictor per
stage, ``cascade_bbox_reg_weights``) and RetinaNet (``meta_architecture`` RETINANET: FPN P3-P7,
a sigmoid head, no ROI heads). Built from a detectron2 config (``norcal.export.families.detectron2.yacs_config.spec``) or
inferred from a checkpoint's weights (``norcal.export.families.detectron2.weights.architecture``), or from a
torchvision state dict (``norcal.export.families.torchvision.state_dict``); consumed by
``norcal.export.rcnn.modeling``.
Field defaults are detectron2's (``detectron2/config/defaults.py``) except the test-time
settings, which follow detectron2's LVIS configs (score 1e-4, 300 detections).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from norcal.core.calibration.spec import Calibration
from norcal.core.contract import CLS_LOGITS_TENSOR, Classifier, cls_logits_tensors

FPN_BACKBONE = "build_resnet_fpn_backbone"
RESNET_BACKBONE = "build_resnet_backbone"  # one ResNet stage as the only feature (C4, DC5)
STANDARD_ROI_HEADS = "StandardROIHeads"
RES5_ROI_HEADS = "Res5ROIHeads"
CASCADE_ROI_HEADS = "CascadeROIHeads"  # FPN only; one box head and predictor per stage
RETINANET_BACKBONE = "build_retinanet_resnet_fpn_backbone"  # FPN over res3-res5 + P6/P7 from res5
VIT_BACKBONE = "SimpleFeaturePyramid"  # ViTDet: P2-P6 from a plain ViT's last map
RETINANET = "RetinaNet"  # meta architecture: dense sigmoid head on FPN P3-P7, no ROI heads
SUPPORTED_ARCHITECTURES = ("supported: GeneralizedRCNN (Faster / Mask R-CNN) with a ResNet/ResNeXt or RegNet FPN, "
                           "C4 or DC5 backbone, ViTDet (ViT + SimpleFeaturePyramid), an MViTv2 FPN, Cascade (Mask) R-CNN with FPN, and RetinaNet with a "
                           "ResNet/ResNeXt FPN")


@dataclass(frozen=True)
class Convention:
    """How the trainer of the weights runs the same layers, where trainers differ; set by the
    family that loads them. The defaults are detectron2's."""

    name: str = "detectron2"  # for messages
    # cell anchors with ratios outer and sizes inner, in float32, corners rounded to integers
    # (else sizes outer, ratios inner, exact)
    rounded_anchors: bool = False
    # each level's anchor stride taken per image: its padded size // its grid size (P6 of an
    # 800-pixel side: 61, not 64); anchors then come per image
    per_image_anchor_strides: bool = False
    # FPN level of a box: floor(k0 + log2(sqrt(area) / 224) + 1e-6) (else eps inside the log)
    level_eps_after_log: bool = False
    # the box classifier's background slot: "last", or "first" with a box regressed for it too
    background: str = "last"
    # detections with a side under this are dropped before the final NMS (0: none)
    min_box_size: float = 0.0
    # a class-specific mask predictor has a background channel: class c is channel c + 1
    mask_background_channel: bool = False
    # the RPN keeps proposals whose sides are >= its min size (else > it)
    rpn_min_size_inclusive: bool = False
    # RetinaNet clips each candidate box to its image before NMS (else only the detections, after)
    clip_retinanet_boxes: bool = False
    # the host's resize rule the graph records (norcal.core.contract.RESIZE; None: the default)
    resize: str | None = None
    # how the host pastes the re-scored masks (a rule of norcal.runtime's paste_masks)
    mask_paste: str = "detectron2"
    # its R-CNN is covered with an FPN backbone and standard ROI heads only
    fpn_only: bool = False


@dataclass(frozen=True)
class RegNetSpec:
    """detectron2's RegNet bottom-up as its weights give it (SimpleStem, ResBottleneckBlock stages,
    each halving the map): per stage its block count, output width, bottleneck width, group
    width and each block's SE width (0: no SE, RegNetX)."""

    stem_width: int
    depths: tuple[int, ...]
    widths: tuple[int, ...]
    bottleneck_widths: tuple[int, ...]
    group_widths: tuple[int, ...]
    se_widths: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ViTSpec:
    """detectron2's ViTDet backbone (``SimpleFeaturePyramid`` over a plain ``ViT``, vit.py): the
    ViT's sizes, which blocks attend within windows (the others attend globally), which carry a
    residual conv block, and the square every image is padded to (``square_pad``; the ViT's
    ``img_size``, which sizes the global blocks' relative positions). The pyramid's scale
    factors are detectron2's 4, 2, 1, 0.5 (P2-P5) with P6 by max pooling."""

    embed_dim: int
    depth: int
    num_heads: int
    patch_size: int = 16
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    window_size: int = 0
    window_block_indexes: tuple[int, ...] = ()
    residual_block_indexes: tuple[int, ...] = ()
    use_abs_pos: bool = True
    use_rel_pos: bool = True
    pretrain_img_size: int = 224
    pretrain_use_cls_token: bool = True
    ln_eps: float = 1e-6  # the blocks' nn.LayerNorm eps (ViTDet: partial(nn.LayerNorm, eps=1e-6))
    square_pad: int = 1024


@dataclass(frozen=True)
class MViTSpec:
    """detectron2's MViT (MViTv2) bottom-up as its weights give it, with the arguments they cannot
    show (``norm_eps``, pooling strides, window size, ``residual_pooling``) as detectron2's configs
    set them. Stage k+2 (scale2..scale5) ends at block ``last_block_indexes[k]``. ``square_pad``:
    the FPN's square every image is padded to (detectron2's FPN ``square_pad``; 0: none, which a
    model refuses, as windowed attention would see a batch's padding)."""

    embed_dim: int
    depth: int
    num_heads: int  # of the first stage; doubled at each stage end
    last_block_indexes: tuple[int, int, int, int]
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qkv_pool_kernel: tuple[int, int] = (3, 3)
    patch_kernel: tuple[int, int] = (7, 7)
    patch_stride: tuple[int, int] = (4, 4)
    patch_padding: tuple[int, int] = (3, 3)
    adaptive_kv_stride: int = 4
    adaptive_window_size: int = 56
    residual_pooling: bool = True
    use_rel_pos: bool = True
    img_size: int = 224  # the size the rel-pos tables were made for (pretraining)
    norm_eps: float = 1e-6
    square_pad: int = 0


@dataclass
class ModelSpec:
    meta_architecture: str = "GeneralizedRCNN"
    # where the weights' trainer runs the same layers differently (anchors, level mapping,
    # background slot, ...); set by the family that reads the weights
    convention: Convention = Convention()
    # input
    pixel_mean: tuple[float, float, float] = (103.53, 116.28, 123.675)
    pixel_std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    input_format: str = "BGR"
    min_size_test: int = 800
    max_size_test: int = 1333
    size_divisibility: int = 32  # the host pads a batch to a multiple of this
    backbone_name: str = FPN_BACKBONE
    backbone_out_feature: str = "res5"  # RESNET_BACKBONE only: the stage the heads read
    roi_heads_name: str = STANDARD_ROI_HEADS
    # FPN bottom-up: a RegNet (then the ResNet fields below play no part), else the ResNet / ResNeXt
    regnet: RegNetSpec | None = None
    # ViTDet: a SimpleFeaturePyramid over a ViT replaces the FPN (backbone_name VIT_BACKBONE; its
    # outputs are fpn_out_channels wide with fpn_norm), every image padded to vit.square_pad
    vit: ViTSpec | None = None
    mvit: MViTSpec | None = None  # likewise an MViT (MViTv2) bottom-up, padded to mvit.square_pad
    # backbone: ResNet / ResNeXt
    depth: int = 50
    norm: str = "FrozenBN"  # FrozenBN | BN | SyncBN | GN | ""
    stem_out_channels: int = 64
    res2_out_channels: int = 256
    num_groups: int = 1
    width_per_group: int = 64
    stride_in_1x1: bool = True
    res5_dilation: int = 1
    # FPN
    fpn_out_channels: int = 256
    fpn_norm: str = ""
    fpn_fuse_type: str = "sum"
    # anchors and RPN
    anchor_sizes: tuple[tuple[float, ...], ...] = ((32,), (64,), (128,), (256,), (512,))
    anchor_aspect_ratios: tuple[tuple[float, ...], ...] = ((0.5, 1.0, 2.0),)
    anchor_offset: float = 0.0
    rpn_conv_dims: tuple[int, ...] = (-1,)
    rpn_bbox_reg_weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    rpn_pre_nms_topk_test: int = 1000
    rpn_post_nms_topk_test: int = 1000
    rpn_nms_thresh: float = 0.7
    rpn_min_size: float = 0.0
    # ROI heads
    num_classes: int = 1203
    pooler_type: str = "ROIAlignV2"  # or ROIAlign (aligned=False)
    pooler_resolution: int = 7
    pooler_sampling_ratio: int = 0
    box_head_num_conv: int = 0
    box_head_conv_dim: int = 256
    box_head_num_fc: int = 2
    box_head_fc_dim: int = 1024
    box_head_norm: str = ""
    bbox_reg_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
    cls_agnostic_bbox_reg: bool = False
    # CascadeROIHeads: each stage's BBOX_REG_WEIGHTS (ROI_BOX_CASCADE_HEAD), one entry per stage
    cascade_bbox_reg_weights: tuple[tuple[float, float, float, float], ...] = ()
    use_sigmoid_ce: bool = False
    score_thresh_test: float = 1e-4
    nms_thresh_test: float = 0.5
    detections_per_image: int = 300
    # mask head
    mask_on: bool = True
    mask_head_num_conv: int = 4
    mask_head_conv_dim: int = 256
    mask_head_norm: str = ""
    mask_pooler_resolution: int = 14
    mask_pooler_sampling_ratio: int = 0
    mask_pooler_type: str = "ROIAlignV2"  # Res5ROIHeads pools masks with the box pooler instead
    cls_agnostic_mask: bool = False
    # RetinaNet (meta_architecture RETINANET): MODEL.RETINANET.*; its score/NMS thresholds,
    # box weights and class count use the fields above
    retinanet_num_convs: int = 4
    retinanet_topk_candidates: int = 1000  # per level, before NMS
    retinanet_p6_from_p5: bool = False  # torchvision's LastLevelP6P7(256, 256); detectron2 reads res5
    # NorCal settings from the config (the NorCal authors' TEST.CALIBRATION keys: gamma, factor,
    # mechanism, renormalize), used when the user gives none; None: the config has none
    calibration: Calibration | None = None
    # free-form notes on where values came from (config file, inferred from weights)
    provenance: dict[str, str] = field(default_factory=dict)


def box_classifier(spec: ModelSpec) -> Classifier:
    """The spec's box classifier as its export names and lays it out: RetinaNet's one sigmoid
    with no background slot; an R-CNN's cls_logits (one per cascade stage), background last
    (or first, as the spec's convention says), softmax or sigmoid as trained."""
    if spec.meta_architecture == RETINANET:
        return Classifier(logits=(CLS_LOGITS_TENSOR,), class_axis=-1, background="none", activation="sigmoid")
    return Classifier(logits=tuple(cls_logits_tensors(len(spec.cascade_bbox_reg_weights))), class_axis=-1,
                      background=spec.convention.background,
                      activation="sigmoid" if spec.use_sigmoid_ce else "softmax")


def arch_name(spec: ModelSpec) -> str:
    """"FPN", "C4", "DC5" (or "C5": an undilated res5 as the only feature), "Cascade" (FPN with
    CascadeROIHeads), "RetinaNet", for messages."""
    if spec.meta_architecture == RETINANET:
        return RETINANET
    if spec.roi_heads_name == CASCADE_ROI_HEADS:
        return "Cascade"
    if spec.backbone_name in (FPN_BACKBONE, VIT_BACKBONE):
        return "FPN"
    if spec.roi_heads_name == RES5_ROI_HEADS:
        return "C4"
    return "DC5" if spec.res5_dilation == 2 else "C5"


def architecture_label(spec: ModelSpec) -> str:
    """The backbone and architecture for summaries: "R50-FPN", "RegNetY-FPN", "MViTv2-Cascade",
    "ViT (embed 768, depth 12, 12 heads) + SimpleFeaturePyramid"."""
    name = arch_name(spec)
    if spec.vit is not None:
        v = spec.vit
        return (f"ViT (embed {v.embed_dim}, depth {v.depth}, {v.num_heads} heads) + SimpleFeaturePyramid"
                + ("" if name == "FPN" else f", {name}"))
    if spec.mvit is not None:
        bottom_up = "MViTv2"
    elif spec.regnet is not None:
        bottom_up = "RegNetY" if any(any(w) for w in spec.regnet.se_widths) else "RegNetX"
    else:
        bottom_up = f"R{spec.depth}"
    return f"{bottom_up}-{name}"
