"""A detectron2 config as a :class:`ModelSpec`, without detectron2 (the file and its ``_BASE_``
chain are read by :mod:`.file`).

Keys that change inference in a way we do not implement raise :class:`NorcalError`;
training-only keys (SOLVER, DATASETS, ...) are ignored.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from norcal.core.calibration.spec import Calibration
from norcal.core.errors import NorcalError
from norcal.core.ranges import MAX_EXPORT_SIDE, MAX_TOPK

from norcal.export.families.detectron2.yacs_config.file import load_cfg_dict, load_lazy_cfg_dict
from norcal.export.families.detectron2.yacs_config.values import ConfigValues
from norcal.export.families.detectron2.lazy_config.translate import SPEC_FIELDS
from norcal.export.families.detectron2.lazy_config.vit import vit_spec
from norcal.export.families.detectron2.convention import DETECTRON2
from norcal.export.rcnn.spec import (CASCADE_ROI_HEADS, FPN_BACKBONE, RES5_ROI_HEADS, RESNET_BACKBONE, RETINANET,
                   RETINANET_BACKBONE, STANDARD_ROI_HEADS, VIT_BACKBONE, ModelSpec)
from norcal.export.rcnn.spec import SUPPORTED_ARCHITECTURES as SUPPORTED

# Box2BoxTransform divides the predicted deltas by these weights
_DIVIDES = "Box2BoxTransform divides the box deltas by them"
FPN_IN_FEATURES = ["res2", "res3", "res4", "res5"]
RPN_IN_FEATURES = ["p2", "p3", "p4", "p5", "p6"]
ROI_IN_FEATURES = ["p2", "p3", "p4", "p5"]
RESNET_DEPTHS = (18, 34, 50, 101, 152)
SINGLE_FEATURES = ("res4", "res5")  # build_resnet_backbone's one output: C4 (res4), DC5 (res5)
# the NorCal authors' heads (github.com/tydpan/NorCal): StandardROIHeads whose box predictor
# calibrates its scores with TEST.CALIBRATION.*; nothing else differs at inference
NORCAL_ROI_HEADS = "CalibrationROIHeads"
NORCAL_CALIBRATION = {"METHOD": "gamma", "WITH": "exps", "GAMMA": 0.0, "RENORM": True}  # add_norcal_config


# bounds of the values that size the graph's memory or time (detectron2 takes any number)
_SIDE = (MAX_EXPORT_SIDE, "the export's largest input side")
_POST_TOPK = (MAX_TOPK, "TensorRT's TopK limit")
# pre-NMS / RetinaNet candidates per level are taken in TopKs of at most MAX_TOPK each, one after
# the other; past 16 of them the graph grows for anchors no detector config keeps (C4's 6000 is 2)
_CANDIDATES = (16 * MAX_TOPK, f"taken in at most 16 TopKs of {MAX_TOPK}, TensorRT's TopK limit")
_POOLER_RESOLUTION = (256, "pooled bins per side; the heads' tensors grow with its square")
_SAMPLING_RATIO = (64, "ROIAlign's sampling points per bin side; its cost grows with the square")
_ANCHOR_SIZE = MAX_EXPORT_SIDE  # an anchor wider than any input side matches nothing
_ANCHOR_RATIO = 1024.0  # past 1:1024 a 32-pixel anchor is less than a pixel wide


def _check_supported(c: ConfigValues) -> None:
    """Refuse what changes inference and is not implemented, naming the key and value."""
    c.require("VERSION", 2, "only version-2 detectron2 configs are supported")
    c.require("MODEL.META_ARCHITECTURE", "GeneralizedRCNN", f"not supported; {SUPPORTED}")
    c.require("MODEL.BACKBONE.NAME", (FPN_BACKBONE, RESNET_BACKBONE, VIT_BACKBONE),
              "only ResNet/ResNeXt backbones, with FPN or alone (C4, DC5), and ViTDet's are supported")
    c.require("MODEL.RESNETS.DEPTH", RESNET_DEPTHS)
    c.require("MODEL.LOAD_PROPOSALS", False,
              f"Fast R-CNN on proposal files is not supported; {SUPPORTED}")
    c.require("MODEL.PROPOSAL_GENERATOR.NAME", "RPN",
              "only RPN proposals are supported (not precomputed or rotated ones)")
    c.require("MODEL.RPN.HEAD_NAME", "StandardRPNHead")
    c.require("MODEL.ANCHOR_GENERATOR.NAME", "DefaultAnchorGenerator")
    c.require("MODEL.ROI_HEADS.NAME", (STANDARD_ROI_HEADS, RES5_ROI_HEADS, NORCAL_ROI_HEADS, CASCADE_ROI_HEADS),
              f"not supported; {SUPPORTED}")
    c.require("MODEL.ROI_BOX_HEAD.POOLER_TYPE", POOLER_TYPES)
    c.require("MODEL.KEYPOINT_ON", False, f"keypoint heads are not supported; {SUPPORTED}")
    c.require("TEST.AUG.ENABLED", False, "test-time augmentation is not supported")
    c.require("INPUT.FORMAT", ("BGR", "RGB"))
    if any(bool(x) for x in c.seq("MODEL.RESNETS.DEFORM_ON_PER_STAGE")):
        raise c.bad("MODEL.RESNETS.DEFORM_ON_PER_STAGE", f"deformable convolutions are not supported; {SUPPORTED}")
    if c.int("MODEL.RESNETS.DEPTH") in (18, 34):
        c.require("MODEL.RESNETS.RES2_OUT_CHANNELS", 64, "ResNet-18/34 need RES2_OUT_CHANNELS 64")
        c.require("MODEL.RESNETS.NUM_GROUPS", 1, "ResNet-18/34 have no grouped convolutions")
    if c.str("MODEL.BACKBONE.NAME") == FPN_BACKBONE:
        _check_fpn(c)
    elif c.str("MODEL.BACKBONE.NAME") != VIT_BACKBONE:  # ViTDet's: vit_spec checks it
        _check_single_feature(c)
    if c.str("MODEL.ROI_HEADS.NAME") != RES5_ROI_HEADS:
        c.require("MODEL.ROI_BOX_HEAD.NAME", "FastRCNNConvFCHead")
    if c.bool("MODEL.MASK_ON"):
        c.require("MODEL.ROI_MASK_HEAD.NAME", "MaskRCNNConvUpsampleHead")
        if c.str("MODEL.ROI_HEADS.NAME") != RES5_ROI_HEADS:  # Res5ROIHeads reuses the box pooler
            c.require("MODEL.ROI_MASK_HEAD.POOLER_TYPE", POOLER_TYPES)


def _check_fpn(c: ConfigValues) -> None:
    c.require("MODEL.FPN.FUSE_TYPE", "sum")
    c.require("MODEL.FPN.IN_FEATURES", (FPN_IN_FEATURES,))
    c.require("MODEL.RPN.IN_FEATURES", (RPN_IN_FEATURES,))
    c.require("MODEL.ROI_HEADS.IN_FEATURES", (ROI_IN_FEATURES,))
    c.require("MODEL.ROI_HEADS.NAME", (STANDARD_ROI_HEADS, NORCAL_ROI_HEADS, CASCADE_ROI_HEADS),
              "FPN models need StandardROIHeads or CascadeROIHeads")
    if c.str("MODEL.ROI_HEADS.NAME") == CASCADE_ROI_HEADS:
        _check_cascade(c)
    # FPN needs contiguous power-of-2 strides, which a dilated res5 breaks (detectron2 refuses it too)
    c.require("MODEL.RESNETS.RES5_DILATION", 1, "a dilated res5 is not supported with FPN")


def _check_cascade(c: ConfigValues) -> None:
    """CascadeROIHeads: detectron2 asserts class-agnostic regression and one IoU per stage."""
    c.require("MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG", True,
              "CascadeROIHeads regress class-agnostic boxes, as detectron2 requires")
    weights = c.float_lists("MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS")
    if any(len(w) != 4 for w in weights):
        raise c.bad("MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS", "expected 4 weights per stage")
    if len(c.seq("MODEL.ROI_BOX_CASCADE_HEAD.IOUS")) != len(weights):
        raise c.bad("MODEL.ROI_BOX_CASCADE_HEAD.IOUS", "needs one IoU per stage of BBOX_REG_WEIGHTS")


def _cascade_weights(c: ConfigValues) -> tuple[tuple[float, ...], ...]:
    """Each cascade stage's box regression weights; () for other ROI heads."""
    if c.str("MODEL.ROI_HEADS.NAME") != CASCADE_ROI_HEADS:
        return ()
    return c.float_lists("MODEL.ROI_BOX_CASCADE_HEAD.BBOX_REG_WEIGHTS")


def _check_single_feature(c: ConfigValues) -> None:
    """build_resnet_backbone: one stage feeds the RPN and the ROI heads (C4: res4, DC5: res5)."""
    if c.str("MODEL.ROI_HEADS.NAME") == CASCADE_ROI_HEADS:
        raise c.bad("MODEL.ROI_HEADS.NAME", f"supported with FPN only; {SUPPORTED}")
    c.require("MODEL.RESNETS.OUT_FEATURES", tuple([f] for f in SINGLE_FEATURES),
              "a ResNet backbone without FPN must output exactly one of res4 (C4), res5 (DC5)")
    if c.str("MODEL.ROI_HEADS.NAME") == RES5_ROI_HEADS:
        c.require("MODEL.RESNETS.OUT_FEATURES", (["res4"],), "Res5ROIHeads (C4) runs res5 on res4's boxes")
    else:
        c.require("MODEL.RESNETS.OUT_FEATURES", (["res5"],),
                  "StandardROIHeads without FPN need res5 (DC5); res4 goes with Res5ROIHeads (C4)")
    out = c.seq("MODEL.RESNETS.OUT_FEATURES")
    c.require("MODEL.RPN.IN_FEATURES", (out,), "the RPN must read the backbone's output")
    c.require("MODEL.ROI_HEADS.IN_FEATURES", (out,), "the ROI heads must read the backbone's output")
    c.require("MODEL.RESNETS.RES5_DILATION", (1, 2), "detectron2 allows only 1 or 2")


def _calibration(c: ConfigValues, provenance: dict) -> Calibration | None:
    """The NorCal authors' TEST.CALIBRATION keys (with their defaults) in our terms."""
    if c.str("MODEL.ROI_HEADS.NAME") != NORCAL_ROI_HEADS:
        return None
    given = c.get("TEST").get("CALIBRATION") or {}
    if not isinstance(given, dict):
        raise c.bad("TEST.CALIBRATION", "expected a mapping")
    cal = ConfigValues({"TEST": {"CALIBRATION": {**NORCAL_CALIBRATION, **given}}}, c.source)
    method = cal.str("TEST.CALIBRATION.METHOD")
    factors = {"gamma": "cdt", "cb": "ens"}  # a_c = N_c^gamma | (1 - gamma^N_c) / (1 - gamma)
    if method not in factors:
        raise cal.bad("TEST.CALIBRATION.METHOD", "expected 'gamma' or 'cb'")
    mechanisms = {"exps": "exp", "probs": "prob", "logits": "logit"}
    on = cal.str("TEST.CALIBRATION.WITH")
    if on not in mechanisms:
        raise cal.bad("TEST.CALIBRATION.WITH", "expected 'exps', 'probs' or 'logits'")
    renorm = cal.bool("TEST.CALIBRATION.RENORM")
    result = Calibration(gamma=cal.float("TEST.CALIBRATION.GAMMA"), factor=factors[method],
                         mechanism=mechanisms[on], renormalize=renorm or on == "logits")
    note = (f"{NORCAL_ROI_HEADS}: StandardROIHeads with NorCal; TEST.CALIBRATION gives gamma "
            f"{result.gamma:g}, factor {result.factor}, mechanism {result.mechanism}"
            f"{'' if result.renormalize else ', not renormalised'} (the default when no gamma is given)")
    if on == "exps" and not renorm:
        note += "; exported as they compute it, exp(logit)/a_c with no denominator (not bounded by 1)"
    provenance["calibration"] = note
    return result


def _anchor_lists(c: ConfigValues) -> tuple[tuple, tuple]:
    """(sizes, aspect ratios) of DefaultAnchorGenerator, each within what an input can hold."""
    sizes = c.float_lists("MODEL.ANCHOR_GENERATOR.SIZES")
    ratios = c.float_lists("MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS")
    if max(x for r in sizes for x in r) > _ANCHOR_SIZE:
        raise c.bad("MODEL.ANCHOR_GENERATOR.SIZES", f"must be <= {_ANCHOR_SIZE} (the export's largest input side)")
    if not all(1 / _ANCHOR_RATIO <= x <= _ANCHOR_RATIO for r in ratios for x in r):
        raise c.bad("MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS",
                    f"expected 1/{_ANCHOR_RATIO:g} <= ratio <= {_ANCHOR_RATIO:g} (beyond, an anchor is under a pixel wide)")
    return sizes, ratios


def _anchors(c: ConfigValues) -> tuple[tuple, tuple]:
    sizes, ratios = _anchor_lists(c)
    levels = len(c.seq("MODEL.RPN.IN_FEATURES"))
    for key, v in (("MODEL.ANCHOR_GENERATOR.SIZES", sizes), ("MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", ratios)):
        if len(v) not in (1, levels):
            raise c.bad(key, f"needs 1 entry or one per RPN level ({levels})")
    # the RPN head shares one conv across levels, so every level needs the same anchor count
    counts = {len(sizes[i % len(sizes)]) * len(ratios[i % len(ratios)]) for i in range(levels)}
    if len(counts) != 1:
        raise c.bad("MODEL.ANCHOR_GENERATOR.SIZES", "every RPN level needs the same number of anchors")
    return sizes, ratios


def _detections_per_image(c: ConfigValues, candidates: int, made_of: str) -> int:
    """TEST.DETECTIONS_PER_IMAGE: the graph's fixed output rows, a TopK over ``candidates``."""
    key = "TEST.DETECTIONS_PER_IMAGE"
    k = c.int(key, 1)
    if k > MAX_TOPK:
        raise c.bad(key, f"must be <= {MAX_TOPK} (TensorRT's TopK limit)")
    if k > candidates:
        raise c.bad(key, f"more than this model can return ({made_of} = {candidates})")
    return k


def _min_size_test(c: ConfigValues) -> int:
    v = c.int("INPUT.MIN_SIZE_TEST")
    if v == 0:  # detectron2's ResizeShortestEdge: no resizing at test time
        raise c.bad("INPUT.MIN_SIZE_TEST", "0 (no resizing at test time) is not supported; give the shorter side")
    return c.int("INPUT.MIN_SIZE_TEST", 1, *_SIDE)


def _max_size_test(c: ConfigValues) -> int:
    return c.int("INPUT.MAX_SIZE_TEST", 1, *_SIDE)


# ROIAlignV2: aligned (detectron2's default); ROIAlign: unaligned, as Detectron1 pooled (its
# comparison configs); ONNX RoiAlign-16 with half_pixel / output_half_pixel
POOLER_TYPES = ("ROIAlignV2", "ROIAlign")


def spec_from_cfg(cfg: dict, source: str = "config") -> ModelSpec:
    """Map a merged detectron2 config (nested dict, defaults filled) to a :class:`ModelSpec`."""
    c = ConfigValues(cfg, source)
    if c.get("MODEL.META_ARCHITECTURE") == RETINANET:
        return retinanet_spec_from_cfg(c)
    _check_supported(c)
    sizes, ratios = _anchors(c)
    conv_dims = c.seq("MODEL.RPN.CONV_DIMS")
    if not conv_dims or any(isinstance(d, bool) or not isinstance(d, int) or (d < 1 and d != -1)
                            for d in conv_dims):
        raise c.bad("MODEL.RPN.CONV_DIMS", "expected a list of positive integers or -1")
    mask_on = c.bool("MODEL.MASK_ON")
    fpn = c.str("MODEL.BACKBONE.NAME") == FPN_BACKBONE
    c4 = c.str("MODEL.ROI_HEADS.NAME") == RES5_ROI_HEADS
    provenance = {"source": source}
    vit = vit_spec(c)
    calibration = _calibration(c, provenance)
    # keyword arguments are evaluated in order, so the keys are read (and refused) as before
    return ModelSpec(
        convention=DETECTRON2, calibration=calibration,
        **_backbone_fields(c, fpn, c4, vit),
        **_rpn_fields(c, sizes, ratios, conv_dims),
        **_box_fields(c),
        **_mask_fields(c, mask_on, c4),
        provenance=provenance,
    )


def _backbone_fields(c: ConfigValues, fpn: bool, c4: bool, vit) -> dict:
    """The R-CNN's layout, input and backbone (ResNet, FPN; ``vit``: ViTDet's) fields."""
    return dict(
        meta_architecture=c.str("MODEL.META_ARCHITECTURE"),
        backbone_name=c.str("MODEL.BACKBONE.NAME"),
        backbone_out_feature="res5" if fpn else c.seq("MODEL.RESNETS.OUT_FEATURES")[0],
        roi_heads_name=RES5_ROI_HEADS if c4 else (
            CASCADE_ROI_HEADS if c.str("MODEL.ROI_HEADS.NAME") == CASCADE_ROI_HEADS else STANDARD_ROI_HEADS),
        cascade_bbox_reg_weights=_cascade_weights(c),
        pixel_mean=c.floats("MODEL.PIXEL_MEAN", 3),
        pixel_std=c.floats("MODEL.PIXEL_STD", 3, positive=True, why_positive="the input is divided by them"),
        input_format=c.str("INPUT.FORMAT"),
        min_size_test=_min_size_test(c),
        max_size_test=_max_size_test(c),
        # the host's batch padding (detectron2's own: FPN 32, C4/DC5 none, ViTDet its square)
        size_divisibility=vit.square_pad if vit else 32, vit=vit,
        depth=c.int("MODEL.RESNETS.DEPTH"),
        norm=c.norm("MODEL.RESNETS.NORM"),
        stem_out_channels=c.int("MODEL.RESNETS.STEM_OUT_CHANNELS", 1),
        res2_out_channels=c.int("MODEL.RESNETS.RES2_OUT_CHANNELS", 1),
        num_groups=c.int("MODEL.RESNETS.NUM_GROUPS", 1),
        width_per_group=c.int("MODEL.RESNETS.WIDTH_PER_GROUP", 1),
        stride_in_1x1=c.bool("MODEL.RESNETS.STRIDE_IN_1X1"),
        res5_dilation=c.int("MODEL.RESNETS.RES5_DILATION", 1),
        fpn_out_channels=c.int("MODEL.FPN.OUT_CHANNELS", 1),
        fpn_norm=c.norm("MODEL.FPN.NORM", layer_norm=True),
        fpn_fuse_type=c.str("MODEL.FPN.FUSE_TYPE"),
    )


def _rpn_fields(c: ConfigValues, sizes: tuple, ratios: tuple, conv_dims) -> dict:
    """The anchor generator's and the RPN's fields (sizes, ratios, conv dims: already checked)."""
    return dict(
        anchor_sizes=sizes,
        anchor_aspect_ratios=ratios,
        anchor_offset=c.float("MODEL.ANCHOR_GENERATOR.OFFSET", 0.0, 1.0, hi_open=True),
        rpn_conv_dims=tuple(conv_dims),
        rpn_bbox_reg_weights=c.floats("MODEL.RPN.BBOX_REG_WEIGHTS", 4, positive=True, why_positive=_DIVIDES),
        rpn_pre_nms_topk_test=c.int("MODEL.RPN.PRE_NMS_TOPK_TEST", 1, *_CANDIDATES),
        rpn_post_nms_topk_test=c.int("MODEL.RPN.POST_NMS_TOPK_TEST", 1, *_POST_TOPK),
        rpn_nms_thresh=c.float("MODEL.RPN.NMS_THRESH", 0.0, 1.0),
        rpn_min_size=c.float("MODEL.PROPOSAL_GENERATOR.MIN_SIZE"),
    )


def _box_fields(c: ConfigValues) -> dict:
    """The box pooler's, box head's and box predictor's fields, with the test-time thresholds."""
    return dict(
        num_classes=c.int("MODEL.ROI_HEADS.NUM_CLASSES", 1),
        pooler_type=c.str("MODEL.ROI_BOX_HEAD.POOLER_TYPE"),
        pooler_resolution=c.int("MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION", 1, *_POOLER_RESOLUTION),
        pooler_sampling_ratio=c.int("MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO", 0, *_SAMPLING_RATIO),
        box_head_num_conv=c.int("MODEL.ROI_BOX_HEAD.NUM_CONV", 0),
        box_head_conv_dim=c.int("MODEL.ROI_BOX_HEAD.CONV_DIM", 1),
        box_head_num_fc=c.int("MODEL.ROI_BOX_HEAD.NUM_FC", 0),
        box_head_fc_dim=c.int("MODEL.ROI_BOX_HEAD.FC_DIM", 1),
        box_head_norm=c.norm("MODEL.ROI_BOX_HEAD.NORM", layer_norm=True),
        bbox_reg_weights=c.floats("MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS", 4, positive=True, why_positive=_DIVIDES),
        cls_agnostic_bbox_reg=c.bool("MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG"),
        use_sigmoid_ce=c.bool("MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE"),
        score_thresh_test=c.float("MODEL.ROI_HEADS.SCORE_THRESH_TEST", 0.0, 1.0, hi_open=True),
        nms_thresh_test=c.float("MODEL.ROI_HEADS.NMS_THRESH_TEST", 0.0, 1.0),
        detections_per_image=_detections_per_image(
            c, c.int("MODEL.RPN.POST_NMS_TOPK_TEST", 1, *_POST_TOPK) * c.int("MODEL.ROI_HEADS.NUM_CLASSES", 1),
            "MODEL.RPN.POST_NMS_TOPK_TEST x MODEL.ROI_HEADS.NUM_CLASSES"),
    )


def _mask_fields(c: ConfigValues, mask_on: bool, c4: bool) -> dict:
    """The mask head's and its pooler's fields (C4's pooler keys: the box pooler's)."""
    # Res5ROIHeads pools masks with the box pooler (its res5 halves it; the deconv doubles it back)
    mask_pooler = ("MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION", "MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO") \
        if c4 else ("MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION", "MODEL.ROI_MASK_HEAD.POOLER_SAMPLING_RATIO")
    mask_pooler_type = "MODEL.ROI_BOX_HEAD.POOLER_TYPE" if c4 else "MODEL.ROI_MASK_HEAD.POOLER_TYPE"
    return dict(
        mask_on=mask_on,
        mask_head_num_conv=c.int("MODEL.ROI_MASK_HEAD.NUM_CONV", 0),
        mask_head_conv_dim=c.int("MODEL.ROI_MASK_HEAD.CONV_DIM", 1),
        mask_head_norm=c.norm("MODEL.ROI_MASK_HEAD.NORM", layer_norm=True),
        mask_pooler_resolution=c.int(mask_pooler[0], 1, *_POOLER_RESOLUTION),
        mask_pooler_sampling_ratio=c.int(mask_pooler[1], 0, *_SAMPLING_RATIO),
        mask_pooler_type=c.str(mask_pooler_type),
        cls_agnostic_mask=c.bool("MODEL.ROI_MASK_HEAD.CLS_AGNOSTIC_MASK"),
    )


def retinanet_spec_from_cfg(c: ConfigValues) -> ModelSpec:
    """A RetinaNet config (``meta_arch/retinanet.py`` on ``build_retinanet_resnet_fpn_backbone``)."""
    c.require("VERSION", 2, "only version-2 detectron2 configs are supported")
    c.require("MODEL.BACKBONE.NAME", RETINANET_BACKBONE, f"not supported for RetinaNet; {SUPPORTED}")
    c.require("MODEL.RESNETS.DEPTH", RESNET_DEPTHS)
    c.require("MODEL.RESNETS.OUT_FEATURES", (["res3", "res4", "res5"],), f"RetinaNet reads res3-res5; {SUPPORTED}")
    c.require("MODEL.RESNETS.RES5_DILATION", 1, "a dilated res5 is not supported with FPN")
    c.require("MODEL.FPN.IN_FEATURES", (["res3", "res4", "res5"],), f"RetinaNet reads res3-res5; {SUPPORTED}")
    c.require("MODEL.FPN.FUSE_TYPE", "sum")
    c.require("MODEL.RETINANET.IN_FEATURES", (["p3", "p4", "p5", "p6", "p7"],), f"not supported; {SUPPORTED}")
    c.require("MODEL.RETINANET.NORM", "", f"normalisation in the RetinaNet head is not supported; {SUPPORTED}")
    c.require("MODEL.ANCHOR_GENERATOR.NAME", "DefaultAnchorGenerator")
    c.require("MODEL.KEYPOINT_ON", False, f"keypoint heads are not supported; {SUPPORTED}")
    c.require("MODEL.MASK_ON", False, f"RetinaNet has no mask head; {SUPPORTED}")
    c.require("TEST.AUG.ENABLED", False, "test-time augmentation is not supported")
    c.require("INPUT.FORMAT", ("BGR", "RGB"))
    if any(bool(x) for x in c.seq("MODEL.RESNETS.DEFORM_ON_PER_STAGE")):
        raise c.bad("MODEL.RESNETS.DEFORM_ON_PER_STAGE", f"deformable convolutions are not supported; {SUPPORTED}")
    sizes, ratios = _anchor_lists(c)
    for key, v in (("MODEL.ANCHOR_GENERATOR.SIZES", sizes), ("MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", ratios)):
        if len(v) not in (1, 5):
            raise c.bad(key, "needs 1 entry or one per level (p3-p7)")
    if len({len(sizes[i % len(sizes)]) * len(ratios[i % len(ratios)]) for i in range(5)}) != 1:
        raise c.bad("MODEL.ANCHOR_GENERATOR.SIZES", "every level needs the same number of anchors")
    return ModelSpec(
        meta_architecture=RETINANET, backbone_name=RETINANET_BACKBONE, mask_on=False, convention=DETECTRON2,
        pixel_mean=c.floats("MODEL.PIXEL_MEAN", 3),
        pixel_std=c.floats("MODEL.PIXEL_STD", 3, positive=True, why_positive="the input is divided by them"),
        input_format=c.str("INPUT.FORMAT"), min_size_test=_min_size_test(c),
        max_size_test=_max_size_test(c),
        depth=c.int("MODEL.RESNETS.DEPTH"), norm=c.norm("MODEL.RESNETS.NORM"),
        stem_out_channels=c.int("MODEL.RESNETS.STEM_OUT_CHANNELS", 1),
        res2_out_channels=c.int("MODEL.RESNETS.RES2_OUT_CHANNELS", 1),
        num_groups=c.int("MODEL.RESNETS.NUM_GROUPS", 1),
        width_per_group=c.int("MODEL.RESNETS.WIDTH_PER_GROUP", 1),
        stride_in_1x1=c.bool("MODEL.RESNETS.STRIDE_IN_1X1"),
        fpn_out_channels=c.int("MODEL.FPN.OUT_CHANNELS", 1), fpn_norm=c.norm("MODEL.FPN.NORM"),
        anchor_sizes=sizes, anchor_aspect_ratios=ratios,
        anchor_offset=c.float("MODEL.ANCHOR_GENERATOR.OFFSET", 0.0, 1.0, hi_open=True),
        num_classes=c.int("MODEL.RETINANET.NUM_CLASSES", 1),
        bbox_reg_weights=c.floats("MODEL.RETINANET.BBOX_REG_WEIGHTS", 4, positive=True, why_positive=_DIVIDES),
        use_sigmoid_ce=True,
        score_thresh_test=c.float("MODEL.RETINANET.SCORE_THRESH_TEST", 0.0, 1.0, hi_open=True),
        nms_thresh_test=c.float("MODEL.RETINANET.NMS_THRESH_TEST", 0.0, 1.0),
        detections_per_image=_detections_per_image(
            c, 5 * c.int("MODEL.RETINANET.TOPK_CANDIDATES_TEST", 1, *_CANDIDATES) * c.int("MODEL.RETINANET.NUM_CLASSES", 1),
            "5 levels x MODEL.RETINANET.TOPK_CANDIDATES_TEST x MODEL.RETINANET.NUM_CLASSES"),
        retinanet_num_convs=c.int("MODEL.RETINANET.NUM_CONVS", 0),
        retinanet_topk_candidates=c.int("MODEL.RETINANET.TOPK_CANDIDATES_TEST", 1, *_CANDIDATES),
        provenance={"source": c.source},
    )


def load_config(path) -> ModelSpec:
    """Read a detectron2 config file (following ``_BASE_``) into a :class:`ModelSpec`."""
    if Path(str(path)).suffix == ".py":
        # a LazyConfig is a program: reading it means running it (and importing detectron2)
        raise NorcalError(f"{path}: Python (LazyConfig) configs are not read, as they would have to be "
                          "executed; pass its YAML: the config.yaml that tools/lazyconfig_train_net.py "
                          "saved beside the trained model, or LazyConfig.save(LazyConfig.load(this file), "
                          "'config.yaml'); or no config to infer the architecture from the weights "
                          "(not enough for a ViT or MViT, whose LayerNorm eps only the config holds)")
    lazy = load_lazy_cfg_dict(path)
    if lazy is not None:
        spec = spec_from_cfg(lazy[0], source=f"LazyConfig {path}")
        spec = dataclasses.replace(spec, **lazy[0].get(SPEC_FIELDS, {}))
        spec.provenance.update(lazy[1])
        return spec
    return spec_from_cfg(load_cfg_dict(path), source=f"config {path}")
