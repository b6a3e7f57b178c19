"""Infer a detectron2 R-CNN's architecture from its state dict alone (no config file).

What the weights fix (layout FPN / C4 / DC5, depth, widths, groups, norms, FPN channels,
heads, classes, anchors per location) is read from parameter names and shapes. What they
cannot tell is set to detectron2's model-zoo values and noted in ``spec.provenance``:
stride_in_1x1, anchor sizes, softmax vs sigmoid classifier (sigmoid when the checkpoint holds a
federated-loss buffer), input format and size, test thresholds, and for C4 its pooler
resolution, for DC5 its res5 dilation.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from norcal.core.errors import NorcalError

from norcal.export.families.detectron2.weights.mvit import is_mvit, mvit_fields
from norcal.export.families.detectron2.weights.regnet import REGNET_PIXEL_STD, is_regnet, regnet_fields
from norcal.export.families.detectron2.weights.vit import is_vit, vit_fields
from norcal.export.families.detectron2.weights.resnet import PLAIN_STEM, STEM, backbone_fields, count, norm_family, norm_of, pixel_stats, shape
from norcal.export.families.detectron2.weights.unread_backbones import unread_backbone_message
from norcal.export.families.detectron2.weights.retinanet import is_retinanet, retinanet_architecture, retinanet_spec_from_weights
from norcal.export.families.detectron2.convention import DETECTRON2
from norcal.export.rcnn.spec import (CASCADE_ROI_HEADS, FPN_BACKBONE, RES5_ROI_HEADS, RESNET_BACKBONE, RETINANET,
                   STANDARD_ROI_HEADS, SUPPORTED_ARCHITECTURES, VIT_BACKBONE, ModelSpec, MViTSpec, ViTSpec,
                   arch_name)

C4_RES5 = "roi_heads.res5"  # Res5ROIHeads' own res5
RPN_HEAD = "proposal_generator.rpn_head"
BOX_HEAD = "roi_heads.box_head"
BOX_PREDICTOR = "roi_heads.box_predictor"
MASK_HEAD = "roi_heads.mask_head"

# detectron2's ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS default, one per stage
CASCADE_BBOX_REG_WEIGHTS = ((10.0, 10.0, 5.0, 5.0), (20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0))

# test-time settings of detectron2's LVIS configs (configs/LVISv1-InstanceSegmentation/*)
LVIS_TEST_SETTINGS = dict(
    min_size_test=800, max_size_test=1333, score_thresh_test=1e-4, nms_thresh_test=0.5,
    detections_per_image=300, rpn_pre_nms_topk_test=1000, rpn_post_nms_topk_test=1000,
)
# Base-RCNN-FPN.yaml: one size per level, three aspect ratios everywhere
FPN_ANCHOR_SIZES = ((32.0,), (64.0,), (128.0,), (256.0,), (512.0,))
FPN_ASPECT_RATIOS = ((0.5, 1.0, 2.0),)
# detectron2's defaults, which Base-RCNN-C4 and Base-RCNN-DilatedC5 keep: 15 anchors on one map
SINGLE_ANCHOR_SIZES = ((32.0, 64.0, 128.0, 256.0, 512.0),)
SINGLE_RPN_PRE_NMS_TOPK_TEST = 6000
C4_POOLER_RESOLUTION = 14  # Base-RCNN-C4

# detectron2's FastRCNNOutputLayers registers fed_loss_cls_weights only with use_fed_loss, and
# asserts use_sigmoid_ce with it ("Please use sigmoid cross entropy loss with federated loss")
FED_LOSS_IMPLIES_SIGMOID = ("which detectron2 registers only with MODEL.ROI_BOX_HEAD.USE_FED_LOSS, "
                            "and federated loss requires USE_SIGMOID_CE")

# why a config-less R-CNN needs the user's word: FastRCNNOutputLayers' cls_score has num_classes + 1
# outputs with USE_SIGMOID_CE as without it (the sigmoid loss drops the background column)
ACTIVATION_UNREADABLE = ("detectron2's softmax and sigmoid box predictors (MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE) "
                         "have the same weights")

EXPECTED_KEYS = (f"{STEM}.weight", f"{RPN_HEAD}.objectness_logits.weight", f"{BOX_PREDICTOR}.cls_score.weight")


def _explain_foreign(sd: Mapping[str, Any]) -> NorcalError:
    keys = list(sd)
    sample = ", ".join(keys[:3])
    expected = ", ".join(EXPECTED_KEYS)
    unread = unread_backbone_message(sd, SUPPORTED_ARCHITECTURES)
    if unread:
        return NorcalError(unread)
    if any(k.startswith("backbone.body.") for k in keys):
        what = "this looks like a torchvision detection model (backbone.body.*)"
    elif any(k.endswith(("_w", "_b")) and "." not in k for k in keys):
        what = "this looks like a Caffe2/Detectron1 checkpoint (names like conv1_w)"
    else:
        what = f"not a detectron2 GeneralizedRCNN ({SUPPORTED_ARCHITECTURES})"
    return NorcalError(f"unexpected weight names: {what}; expected detectron2 names such as {expected} "
                       f"(or {PLAIN_STEM}.weight for C4/DC5; found e.g. {sample})")


def _check_supported(sd: Mapping[str, Any]) -> None:
    """Name the detectron2 models we do not export before asking for the names we read."""
    for k in sd:
        if "conv2_offset" in k:
            raise NorcalError(f"weight {k}: deformable convolutions (MODEL.RESNETS.DEFORM_ON_PER_STAGE) "
                              f"are not supported; {SUPPORTED_ARCHITECTURES}")
        if k.startswith((f"{BOX_HEAD}.0.", f"{BOX_PREDICTOR}.0.")) and f"{BOX_PREDICTOR}.cls_score.weight" in sd:
            raise NorcalError(f"weight {k}: Cascade R-CNN (CascadeROIHeads) stage weights next to a single "
                              f"box predictor's; {SUPPORTED_ARCHITECTURES}")
        if k.startswith("roi_heads.keypoint_head."):
            raise NorcalError(f"weight {k}: keypoint heads (MODEL.KEYPOINT_ON) are not supported; "
                              f"{SUPPORTED_ARCHITECTURES}")
        if k.startswith("sem_seg_head."):
            raise NorcalError(f"weight {k}: PanopticFPN is not supported; {SUPPORTED_ARCHITECTURES}")
    has_backbone = f"{STEM}.weight" in sd or f"{PLAIN_STEM}.weight" in sd or is_regnet(sd) or is_vit(sd) or is_mvit(sd)
    has_rpn = f"{RPN_HEAD}.objectness_logits.weight" in sd
    has_heads = f"{BOX_PREDICTOR}.cls_score.weight" in sd or _is_cascade(sd)
    if has_backbone and has_rpn and not has_heads and not any(k.startswith("roi_heads.") for k in sd):
        raise NorcalError(f"no roi_heads weights: this is an RPN-only model (ProposalNetwork), which gives "
                          f"proposals, not detections; {SUPPORTED_ARCHITECTURES}")
    if has_backbone and has_heads and not any(k.startswith("proposal_generator.") for k in sd):
        raise NorcalError(f"no proposal_generator weights: this is a Fast R-CNN on precomputed proposals "
                          f"(MODEL.LOAD_PROPOSALS); {SUPPORTED_ARCHITECTURES}")
    if not (has_backbone and has_rpn and has_heads):
        raise _explain_foreign(sd)


def _is_cascade(sd: Mapping[str, Any]) -> bool:
    """CascadeROIHeads: one box head and predictor per stage, numbered from 0."""
    return f"{BOX_PREDICTOR}.0.cls_score.weight" in sd


def cascade_stages(sd: Mapping[str, Any]) -> int:
    """How many CascadeROIHeads stages the weights hold (0: not a cascade)."""
    return count(sd, f"{BOX_PREDICTOR}.{{}}.cls_score.weight", 0)


def _cascade_heads(sd: Mapping[str, Any], channels: int, given=None, config_norms: bool = False) -> dict:
    """The stages' box heads (all alike, as detectron2 builds them) and their count; ``given``:
    the config's per-stage regression weights, which the weights cannot tell."""
    stages = cascade_stages(sd)
    heads = [_box_head(sd, channels, head=f"{BOX_HEAD}.{k}", predictor=f"{BOX_PREDICTOR}.{k}",
                       config_norms=config_norms)
             for k in range(stages)]
    if any(h != heads[0] for h in heads):
        raise NorcalError(f"the {stages} cascade stages' box heads differ in shape; detectron2 builds them alike")
    if not heads[0]["cls_agnostic_bbox_reg"]:
        raise NorcalError(f"{BOX_PREDICTOR}.0.bbox_pred regresses per class; CascadeROIHeads regress "
                          "class-agnostic boxes")
    if given is not None and len(given) == stages:
        return dict(heads[0], cascade_bbox_reg_weights=tuple(given))
    if stages != len(CASCADE_BBOX_REG_WEIGHTS):
        raise NorcalError(f"the checkpoint has {stages} cascade stages; only detectron2's default "
                          f"{len(CASCADE_BBOX_REG_WEIGHTS)} stages can be inferred from weights: pass the "
                          "model's config.yaml")
    return dict(heads[0], cascade_bbox_reg_weights=CASCADE_BBOX_REG_WEIGHTS)


def weights_layout(sd: Mapping[str, Any]) -> str:
    """The :func:`layout_label` a supported detectron2 state dict's names show."""
    if is_retinanet(sd):
        return RETINANET
    _check_supported(sd)
    return layout_label(ModelSpec(**_layout(sd)))


def layout_label(spec: ModelSpec) -> str:
    """"FPN", "C4", "DC5", "Cascade", "RetinaNet", "ViTDet" or "ViTDet Cascade": what a config
    and a checkpoint's names must agree on (a ViT's SimpleFeaturePyramid is no ResNet FPN)."""
    name = arch_name(spec)
    if spec.backbone_name != VIT_BACKBONE:
        return name
    return "ViTDet" if name == "FPN" else f"ViTDet {name}"


def _layout(sd: Mapping[str, Any]) -> dict:
    """Which detectron2 layout the names show: FPN, C4 (res5 in the ROI heads), DC5 or ViTDet's."""
    if is_vit(sd):
        return {"backbone_name": VIT_BACKBONE,
                "roi_heads_name": CASCADE_ROI_HEADS if _is_cascade(sd) else STANDARD_ROI_HEADS}
    if f"{STEM}.weight" in sd or is_regnet(sd) or is_mvit(sd):
        return {"backbone_name": FPN_BACKBONE,
                "roi_heads_name": CASCADE_ROI_HEADS if _is_cascade(sd) else STANDARD_ROI_HEADS}
    if f"{C4_RES5}.0.conv1.weight" in sd:
        return {"backbone_name": RESNET_BACKBONE, "backbone_out_feature": "res4", "roi_heads_name": RES5_ROI_HEADS}
    if "backbone.res5.0.conv1.weight" not in sd:
        raise NorcalError(f"{PLAIN_STEM} without FPN, but neither backbone.res5 (DC5) nor {C4_RES5} (C4) "
                          f"weights; {SUPPORTED_ARCHITECTURES}")
    # a dilated and an undilated res5 have the same weights; detectron2's zoo only has DC5
    return {"backbone_name": RESNET_BACKBONE, "backbone_out_feature": "res5", "roi_heads_name": STANDARD_ROI_HEADS,
            "res5_dilation": 2}


def _fpn(sd: Mapping[str, Any], config_norms: bool) -> dict:
    missing = [f"backbone.fpn_{kind}{i}.weight" for kind in ("lateral", "output") for i in (2, 3, 4, 5)
               if f"backbone.fpn_{kind}{i}.weight" not in sd]
    if missing:
        raise NorcalError(f"expected an FPN over res2..res5; missing weights {', '.join(missing)}")
    return {"fpn_out_channels": shape(sd, "backbone.fpn_lateral2.weight")[0],
            "fpn_norm": norm_of(sd, "backbone.fpn_lateral2.norm", config_norms)}


def _rpn(sd: Mapping[str, Any], in_channels: int, anchor_layout=None, fpn: bool = True) -> dict:
    anchors = shape(sd, f"{RPN_HEAD}.objectness_logits.weight")[0]
    deltas = shape(sd, f"{RPN_HEAD}.anchor_deltas.weight")[0]
    if deltas != 4 * anchors:
        raise NorcalError(f"{RPN_HEAD}.anchor_deltas has {deltas} rows for {anchors} anchors; expected "
                          f"{4 * anchors} (rotated anchors are not supported)")
    default = (FPN_ANCHOR_SIZES, FPN_ASPECT_RATIOS) if fpn else (SINGLE_ANCHOR_SIZES, FPN_ASPECT_RATIOS)
    sizes, ratios = anchor_layout or default
    if anchor_layout is not None and len(sizes[0]) * len(ratios[0]) != anchors:
        raise NorcalError(f"the config's anchors ({len(sizes[0])} sizes x {len(ratios[0])} aspect ratios per "
                          f"location) do not fit the RPN's weights, which predict {anchors} anchors per location")
    if anchor_layout is None and anchors != len(sizes[0]) * len(ratios[0]):
        can = ("3 (aspect ratios 0.5, 1, 2, one size per FPN level)" if fpn else
               "15 (sizes 32-512 x aspect ratios 0.5, 1, 2, detectron2's default)")
        raise NorcalError(f"the RPN predicts {anchors} anchors per location; only {can} can be inferred "
                          "from weights: pass the model's config.yaml")
    if f"{RPN_HEAD}.conv.weight" in sd:
        convs = [f"{RPN_HEAD}.conv.weight"]
    else:
        convs = [f"{RPN_HEAD}.conv.conv{k}.weight" for k in range(count(sd, f"{RPN_HEAD}.conv.conv{{}}.weight", 0))]
    dims, channels = [], in_channels
    for key in convs:
        out = shape(sd, key)[0]
        dims.append(-1 if out == channels else out)  # -1: "as many as the input", detectron2's default
        channels = out
    return {"rpn_conv_dims": tuple(dims) or (-1,), "anchor_sizes": sizes, "anchor_aspect_ratios": ratios}


def _resolution(features: int, channels: int, what: str) -> int:
    r = math.isqrt(features // channels) if features % channels == 0 else 0
    if r * r * channels != features:
        raise NorcalError(f"{what} takes {features} inputs, not {channels} channels x R x R for any pooler "
                          "resolution R")
    return r


def _box_head(sd: Mapping[str, Any], fpn_channels: int, c4: bool = False, head: str = BOX_HEAD,
              predictor: str = BOX_PREDICTOR, config_norms: bool = False) -> dict:
    """``head``/``predictor``: the weights' prefixes (one stage's for a cascade)."""
    cls_rows, cls_in = shape(sd, f"{predictor}.cls_score.weight")
    num_classes = cls_rows - 1  # background is the last row
    reg_rows = shape(sd, f"{predictor}.bbox_pred.weight")[0]
    if reg_rows == 4 * num_classes:
        agnostic = False
    elif reg_rows == 4:
        agnostic = True
    else:
        raise NorcalError(f"{predictor}.bbox_pred has {reg_rows} rows; expected 4 x {num_classes} classes "
                          f"= {4 * num_classes} (class-specific) or 4 (class-agnostic)")
    if c4:  # the predictor reads res5's output averaged over the pooled grid: no box head
        return {"num_classes": num_classes, "cls_agnostic_bbox_reg": agnostic, "box_head_num_conv": 0,
                "box_head_num_fc": 0, "pooler_resolution": C4_POOLER_RESOLUTION}
    n_conv = count(sd, f"{head}.conv{{}}.weight", 1)
    n_fc = count(sd, f"{head}.fc{{}}.weight", 1)
    out = {"num_classes": num_classes, "cls_agnostic_bbox_reg": agnostic,
           "box_head_num_conv": n_conv, "box_head_num_fc": n_fc}
    channels = fpn_channels
    if n_conv:
        channels = shape(sd, f"{head}.conv1.weight")[0]
        out.update(box_head_conv_dim=channels, box_head_norm=norm_of(sd, f"{head}.conv1.norm", config_norms))
    if n_fc:
        fc_dim, flat = shape(sd, f"{head}.fc1.weight")
        out.update(box_head_fc_dim=fc_dim)
        out["pooler_resolution"] = _resolution(flat, channels, f"{head}.fc1")
    else:
        out["pooler_resolution"] = _resolution(cls_in, channels, f"{predictor}.cls_score")
    return out


def _mask_head(sd: Mapping[str, Any], num_classes: int, config_norms: bool) -> dict:
    if f"{MASK_HEAD}.predictor.weight" not in sd:
        return {"mask_on": False}
    if f"{MASK_HEAD}.deconv.weight" not in sd:
        raise NorcalError(f"{MASK_HEAD}: expected MaskRCNNConvUpsampleHead weights ({MASK_HEAD}.deconv.weight)")
    rows = shape(sd, f"{MASK_HEAD}.predictor.weight")[0]
    if rows not in (1, num_classes):
        raise NorcalError(f"{MASK_HEAD}.predictor has {rows} rows; expected {num_classes} (one per class, as "
                          "cls_score says) or 1 (class-agnostic)")
    return {"mask_on": True, "cls_agnostic_mask": rows == 1 and num_classes != 1,
            "mask_head_num_conv": count(sd, f"{MASK_HEAD}.mask_fcn{{}}.weight", 1),
            # ConvTranspose2d weights are [in, out, kH, kW]; every mask conv has the deconv's width
            "mask_head_conv_dim": shape(sd, f"{MASK_HEAD}.deconv.weight")[1],
            "mask_head_norm": norm_of(sd, f"{MASK_HEAD}.mask_fcn1.norm", config_norms)}


def spec_from_weights(state_dict: Mapping[str, Any], anchor_layout=None, cascade_weights=None,
                      fed_loss_buffer: str | None = None, vit: ViTSpec | None = None,
                      mvit: MViTSpec | None = None, classifier: str | None = None,
                      config_norms: bool = False) -> ModelSpec:
    """Infer a :class:`ModelSpec` from a detectron2 GeneralizedRCNN (FPN, C4 or DC5) state dict.

    ``state_dict``: ``{name: tensor or array}`` with detectron2 names. ``anchor_layout``:
    (sizes, aspect ratios) when a config gives them (weights only tell the anchor count);
    ``cascade_weights``: the config's per-stage box regression weights, likewise;
    ``fed_loss_buffer``: the name of a federated-loss buffer the checkpoint held (taken out of
    ``state_dict``), which makes the classifier sigmoid; else ``classifier`` ("softmax" or
    "sigmoid", the user's word) sets it, and without either it is left softmax, unconfirmed:
    :func:`~norcal.export.families.detectron2.loader.load_detector_spec` refuses that case;
    ``vit`` / ``mvit``: the config's ViT (ViTDet) / MViT, for what their weights cannot show
    (:func:`.vit_weights.vit_fields`, :func:`.mvit_weights.mvit_fields`); ``config_norms``: a config
    says whether each affine-only norm is GN or LN, which the weights cannot (without it such a
    norm is refused: :func:`.resnet_weights.norm_of`).
    Raises :class:`NorcalError` for other names (torchvision, Caffe2) or unsupported parts.
    """
    sd = state_dict
    if is_retinanet(sd):
        return retinanet_spec_from_weights(sd, anchor_layout, config_norms)
    _check_supported(sd)
    fields = _read_fields(sd, anchor_layout, cascade_weights, vit, mvit, config_norms)
    stats = pixel_stats(sd)
    fields.update(stats)
    regnet_std = fields.get("regnet") is not None and "pixel_std" not in stats
    if regnet_std:
        fields["pixel_std"] = REGNET_PIXEL_STD
    _set_test_settings(fields)
    provenance = _provenance(fields, anchor_layout, fed_loss_buffer, classifier, bool(stats), regnet_std)
    sigmoid = fed_loss_buffer is not None or classifier == "sigmoid"
    return ModelSpec(stride_in_1x1=True, use_sigmoid_ce=sigmoid, input_format="BGR", convention=DETECTRON2,
                     provenance=provenance, **fields)


def _read_fields(sd: Mapping[str, Any], anchor_layout, cascade_weights, vit: ViTSpec | None,
                 mvit: MViTSpec | None, config_norms: bool) -> dict:
    """The spec fields the names and shapes fix: layout, backbone, FPN, RPN, box and mask heads."""
    fields: dict = _layout(sd)
    fpn = fields["backbone_name"] == FPN_BACKBONE
    c4 = fields["roi_heads_name"] == RES5_ROI_HEADS
    vit_backbone = fields["backbone_name"] == VIT_BACKBONE
    fields.update(vit_fields(sd, vit) if vit_backbone else regnet_fields(sd, config_norms) if is_regnet(sd)
                  else mvit_fields(sd, mvit) if is_mvit(sd)
                  else backbone_fields(sd, fields, config_norms))
    if fpn:
        fields.update(_fpn(sd, config_norms))
    channels = fields["fpn_out_channels"] if fpn or vit_backbone else fields.pop("feature_channels")
    fields.update(_rpn(sd, channels, anchor_layout, fpn or vit_backbone))
    cascade = fields["roi_heads_name"] == CASCADE_ROI_HEADS
    fields.update(_cascade_heads(sd, channels, cascade_weights, config_norms) if cascade
                  else _box_head(sd, channels, c4, config_norms=config_norms))
    fields.update(_mask_head(sd, fields["num_classes"], config_norms))
    return fields


def _set_test_settings(fields: dict) -> None:
    """Test-time settings the weights cannot show: the LVIS configs', adjusted per layout."""
    fpn = fields["backbone_name"] == FPN_BACKBONE
    c4 = fields["roi_heads_name"] == RES5_ROI_HEADS
    vit_backbone = fields["backbone_name"] == VIT_BACKBONE
    fields.update(LVIS_TEST_SETTINGS)
    if vit_backbone or fields.get("mvit") is not None:  # the square ResizeShortestEdge(S, S) of the LSJ test loader
        fields.update(min_size_test=fields["size_divisibility"], max_size_test=fields["size_divisibility"])
    if not fpn and not vit_backbone:  # detectron2's default for one map; the 1000 above is FPN's per level
        fields["rpn_pre_nms_topk_test"] = SINGLE_RPN_PRE_NMS_TOPK_TEST
    if c4:  # Res5ROIHeads pools masks with the box pooler
        fields["mask_pooler_resolution"] = fields["pooler_resolution"]


def _provenance(fields: dict, anchor_layout, fed_loss_buffer: str | None, classifier: str | None,
                pixel_stats_read: bool, regnet_std: bool) -> dict:
    """Where each field of a weights-only spec comes from: read, given, or assumed (and whose)."""
    fpn = fields["backbone_name"] == FPN_BACKBONE
    c4 = fields["roi_heads_name"] == RES5_ROI_HEADS
    cascade = fields["roi_heads_name"] == CASCADE_ROI_HEADS
    assumed = "assumed, not readable from weights"
    anchor_sizes = fields["anchor_sizes"] if anchor_layout is None else None
    provenance = {
        "source": "inferred from weights",
        "architecture": f"{arch_name(ModelSpec(**fields))}: read from the weight names",
        "stride_in_1x1": f"{assumed}: True (detectron2 model zoo, MSRA ResNets)",
        "anchor_sizes": (f"{assumed}: {anchor_sizes} (detectron2 "
                         f"{'Base-RCNN-FPN' if fpn else 'defaults, kept by Base-RCNN-C4/DilatedC5'})"),
        "anchor_aspect_ratios": (f"(0.5, 1, 2): the RPN predicts {3 if fpn else 15} anchors per location"),
        "use_sigmoid_ce": (f"sigmoid classifier: the checkpoint holds {fed_loss_buffer}, {FED_LOSS_IMPLIES_SIGMOID}"
                           if fed_loss_buffer else f"{classifier} classifier: given by the user (classifier "
                           f"{classifier}); {ACTIVATION_UNREADABLE}" if classifier
                           else f"{assumed}: softmax classifier"),
        "input": f"{assumed}: BGR, shortest edge 800, max 1333 (detectron2 LVIS configs)",
        "test_thresholds": (f"{assumed}: score 1e-4, NMS 0.5, 300 detections (detectron2 LVIS configs), "
                            f"RPN top {fields['rpn_pre_nms_topk_test']} before NMS "
                            f"{'per level' if fpn else '(detectron2 default)'}"),
        "pixel_mean/std": ("read from the checkpoint's pixel_mean/pixel_std" if pixel_stats_read
                           else f"{assumed}: ImageNet BGR mean, std {REGNET_PIXEL_STD} (every detectron2 "
                           "RegNet config)" if regnet_std
                           else f"{assumed}: detectron2 defaults (ImageNet BGR mean, std 1)"),
        "mask_pooler_resolution": (("the box pooler's (Res5ROIHeads)" if c4 else f"{assumed}: 14")
                                   if fields.get("mask_on") else "no mask head"),
    }
    if cascade:
        provenance["cascade_bbox_reg_weights"] = (f"{assumed}: {CASCADE_BBOX_REG_WEIGHTS} (detectron2's "
                                                  "ROI_BOX_CASCADE_HEAD defaults, one per stage)")
    if c4:
        provenance["pooler_resolution"] = f"{assumed}: {C4_POOLER_RESOLUTION} (detectron2 Base-RCNN-C4)"
    if not fpn and not c4:
        provenance["res5_dilation"] = (f"{assumed}: 2, stride 16 (DC5: detectron2's zoo has no model with an "
                                       "undilated res5 as its only feature)")
    return provenance


def architecture(spec: ModelSpec) -> dict:
    """The fields of ``spec`` that the weights determine, in a form comparable across sources.

    Norms are compared by family (:func:`.resnet_weights.norm_family`); widths of layers
    that do not exist are left out; the RPN's -1 conv widths are resolved to channels.
    """
    if spec.meta_architecture == RETINANET:
        return retinanet_architecture(spec)

    fpn = spec.backbone_name in (FPN_BACKBONE, VIT_BACKBONE)  # ViTDet: its pyramid's widths and norm
    c4 = spec.roi_heads_name == RES5_ROI_HEADS
    arch = {"backbone_name": spec.backbone_name, "roi_heads_name": spec.roi_heads_name, "regnet": spec.regnet,
            "depth": spec.depth, "norm": norm_family(spec.norm), "stem_out_channels": spec.stem_out_channels,
            "res2_out_channels": spec.res2_out_channels, "num_classes": spec.num_classes,
            "cls_agnostic_bbox_reg": spec.cls_agnostic_bbox_reg and spec.num_classes != 1,
            "mask_on": spec.mask_on}
    if fpn:
        arch.update(fpn_out_channels=spec.fpn_out_channels, fpn_norm=norm_family(spec.fpn_norm))
    else:
        arch["backbone_out_feature"] = spec.backbone_out_feature
    if not c4:  # C4 has no box head; its predictor reads res5 averaged over any pooler size
        arch.update(box_head_num_conv=spec.box_head_num_conv, box_head_num_fc=spec.box_head_num_fc,
                    pooler_resolution=spec.pooler_resolution)
    if spec.depth >= 50:
        arch.update(num_groups=spec.num_groups, width_per_group=spec.width_per_group)
    for name, sub in (("vit", spec.vit), ("mvit", spec.mvit)):  # per field, so a difference names it (square_pad, ...)
        arch.update({f"{name}.{k}": v for k, v in vars(sub).items()} if sub is not None else {})
    if spec.regnet is not None or spec.vit is not None or spec.mvit is not None:  # the ResNet's fields play no part
        for key in ("depth", "stem_out_channels", "res2_out_channels", "num_groups", "width_per_group"):
            arch.pop(key, None)
    if spec.box_head_num_conv and not c4:
        arch.update(box_head_conv_dim=spec.box_head_conv_dim, box_head_norm=norm_family(spec.box_head_norm))
    if spec.box_head_num_fc and not c4:
        arch["box_head_fc_dim"] = spec.box_head_fc_dim
    if spec.mask_on:
        arch.update(mask_head_num_conv=spec.mask_head_num_conv, mask_head_conv_dim=spec.mask_head_conv_dim,
                    cls_agnostic_mask=spec.cls_agnostic_mask and spec.num_classes != 1)
        if spec.mask_head_num_conv:
            arch["mask_head_norm"] = norm_family(spec.mask_head_norm)
    sizes, ratios = spec.anchor_sizes, spec.anchor_aspect_ratios
    arch["anchors_per_location"] = len(sizes[0]) * len(ratios[0])
    dims = []
    channels = spec.fpn_out_channels if fpn else spec.res2_out_channels * (4 if c4 else 8)
    for d in spec.rpn_conv_dims:
        channels = channels if d == -1 else d
        dims.append(channels)
    arch["rpn_conv_widths"] = tuple(dims)
    return arch
