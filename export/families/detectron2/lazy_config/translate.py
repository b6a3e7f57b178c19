"""A LazyConfig's ``config.yaml`` (what detectron2's ``LazyConfig.save`` writes next to a
LazyConfig run's ``model_final.pth``) as the equivalent yaml-era config keys, without detectron2.

The file is data: each ``_target_`` names a class or function that detectron2 would import and
call; here it is only matched against the targets we know, and any other is refused by name.
``${..key}`` interpolations (OmegaConf's, relative or absolute) are resolved within the file.
Values whose callables ``LazyConfig.save`` could not write (a norm given as a lambda) are taken
from the weights, which say which norm layers exist; the loader checks them against the weights.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from norcal.core.errors import NorcalError, shown
from norcal.core.ranges import MAX_EXPORT_SIDE
from norcal.core.files.yaml_io import PYTHON_APPLY, PYTHON_NAME

from norcal.export.families.detectron2.lazy_config.cascade import CASCADE, STAGE_LISTS, cascade_heads
from norcal.export.families.detectron2.lazy_config.regnet import FPN_IN_FEATURES as REGNET_AS_RES, STAGES as REGNET_STAGES, regnet_bottom_up
from norcal.export.families.detectron2.yacs_config.values import KEY_PATHS
from norcal.export.families.detectron2.weights.mvit import mvit_from_lazy

from norcal.export.families.detectron2.lazy_config.vit import is_whole, vit_backbone

TARGET = "_target_"
# detectron2's defaults of the arguments a LazyConfig may leave out (their signatures)
FAST_RCNN_DEFAULTS = {"test_score_thresh": 0.0, "test_nms_thresh": 0.5, "test_topk_per_image": 100,
                      "cls_agnostic_bbox_reg": False, "use_sigmoid_ce": False, "use_fed_loss": False}
# arguments that only training reads: accepted whatever they say
TRAINING_ONLY = {"batch_size_per_image", "positive_fraction", "proposal_matcher", "anchor_matcher",
                 "loss_weight", "smooth_l1_beta", "box_reg_loss_type", "fed_loss_num_classes",
                 "get_fed_loss_cls_weights", "train_on_pred_boxes", "proposal_append_gt", "vis_period",
                 "freeze_at", "loss_weight", "input_shape", "box_reg_loss_weight"}
# a top-level key of the mapped config: ModelSpec fields no yaml-era key holds (a RegNet's stages)
SPEC_FIELDS = "SPEC_FIELDS"
MVIT_STAGES = ["scale2", "scale3", "scale4", "scale5"]
UNNAMED_NORM = "BN"  # a lambda norm: provisional, the weights' norm layers must agree (BN family)
_INTERPOLATION = re.compile(r"^\$\{(\.*)([A-Za-z0-9_.]+)\}$")


# top-level keys of what LazyConfig.save writes; yaml-era configs have none of them (theirs are upper case)
LAZY_KEYS = ("model", "dataloader", "train", "optimizer", "lr_multiplier")


def is_lazy_config(data: dict) -> bool:
    """A LazyConfig dump: any of its top-level keys (a ``model`` that is null or missing is then
    refused by :func:`lazy_to_cfg`, not read as a yaml-era config of detectron2's defaults)."""
    return any(k in data for k in LAZY_KEYS)


class _Lazy:
    """The file's tree with interpolations resolved on read; errors name the file and key path."""

    def __init__(self, data: dict, source: str):
        self.root, self.source = data, source

    def bad(self, path: str, why: str) -> NorcalError:
        return NorcalError(f"{self.source}: {path}: {why}")

    def get(self, path: str, default: Any = ..., _seen: tuple = ()) -> Any:
        node: Any = self.root
        for part in path.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            elif default is not ...:
                return default
            else:
                raise self.bad(path, "missing")
        return self._resolve(path, node, _seen)

    def _resolve(self, path: str, value: Any, seen: tuple) -> Any:
        if not isinstance(value, str) or not value.startswith("${"):
            return value
        m = _INTERPOLATION.match(value)
        if m is None:
            raise self.bad(path, f"interpolation {value} is not a plain key reference")
        dots, key = len(m.group(1)), m.group(2)
        # OmegaConf: one dot is the node holding the key, each further dot one level up
        parent = path.split(".")[:-1]
        if dots > len(parent) + 1:
            raise self.bad(path, f"interpolation {value} goes above the file's root")
        target = ".".join((parent[:len(parent) - dots + 1] if dots else []) + [key])
        if target in seen:
            raise self.bad(path, f"interpolation {value} refers to itself")
        return self.get(target, _seen=(*seen, target))

    def target(self, path: str) -> str:
        """The short name (last dotted part) of the ``_target_`` at ``path``."""
        t = self.get(f"{path}.{TARGET}")
        if not isinstance(t, str):
            raise self.bad(f"{path}.{TARGET}", f"expected a class name, got {shown(t)}")
        return t.rsplit(".", 1)[-1]

    def expect(self, path: str, known: tuple[str, ...], what: str) -> str:
        name = self.target(path)
        if name not in known:
            raise self.bad(f"{path}.{TARGET}", f"{self.get(f'{path}.{TARGET}')} is not supported "
                                               f"({what}: {', '.join(known)})")
        return name

    def only(self, path: str, read: set[str]) -> None:
        """Refuse arguments at ``path`` that change inference and that we do not read."""
        node = self.get(path)
        for key in node:
            if key != TARGET and key not in read and key not in TRAINING_ONLY:
                raise self.bad(f"{path}.{key}", f"{shown(node[key])}: not read by the export")

    def norm(self, path: str, provenance: dict, field: str, default: str = "") -> str:
        value = self.get(path, default)
        if isinstance(value, dict) and PYTHON_NAME in value:
            provenance[field] = (f"{path} is a callable the file cannot name ({value[PYTHON_NAME]}): "
                                 "a BatchNorm flavour, as the weights' norm layers show")
            return UNNAMED_NORM
        if isinstance(value, dict) and PYTHON_APPLY in value:
            raise self.bad(path, f"a call of {value[PYTHON_APPLY]}, which the file cannot name as a norm "
                                 "(nothing in it is called)")
        if not isinstance(value, str):
            raise self.bad(path, f"expected a norm name, got {shown(value)}")
        return value


def _came_from(cfg: dict, **paths: str) -> None:
    """Note the file's key path of each yaml-era key (``MODEL__RPN__X``: ``MODEL.RPN.X``) set from it."""
    cfg.setdefault(KEY_PATHS, {}).update({k.replace("__", "."): v for k, v in paths.items()})


def _same(lz: _Lazy, path: str, values: Any, what: str) -> int:
    if not isinstance(values, list) or not all(is_whole(v) and v > 0 for v in values):
        raise lz.bad(path, f"{shown(values)}: expected a list of the {what}' widths (whole numbers > 0)")
    if len(set(values)) > 1:
        raise lz.bad(path, f"{what} of different widths {values} are not supported")
    return values[0] if values else 0


def _resnet(lz: _Lazy, prov: dict) -> dict:
    """``MODEL.RESNETS`` of a ResNet bottom-up (``ResNet.make_default_stages``)."""
    lz.expect("model.backbone.bottom_up.stem", ("BasicStem",), "ResNet's stem")
    lz.expect("model.backbone.bottom_up.stages", ("make_default_stages",), "ResNet.make_default_stages")
    lz.only("model.backbone.bottom_up", {"stem", "stages", "out_features"})
    lz.only("model.backbone.bottom_up.stem", {"in_channels", "out_channels", "norm"})
    lz.only("model.backbone.bottom_up.stages", {"depth", "norm", "stride_in_1x1", "num_groups"})
    depth = lz.get("model.backbone.bottom_up.stages.depth")
    groups = lz.get("model.backbone.bottom_up.stages.num_groups", 1)
    stem_norm = lz.norm("model.backbone.bottom_up.stem.norm", prov, "norm")
    if lz.norm("model.backbone.bottom_up.stages.norm", prov, "norm") != stem_norm:
        raise lz.bad("model.backbone.bottom_up.stages.norm", "differs from the stem's norm")
    if lz.get("model.backbone.bottom_up.stem.in_channels", 3) != 3:
        raise lz.bad("model.backbone.bottom_up.stem.in_channels", "images have 3 channels")
    return {"DEPTH": depth, "NORM": stem_norm,
            "STEM_OUT_CHANNELS": lz.get("model.backbone.bottom_up.stem.out_channels"),
            "STRIDE_IN_1X1": lz.get("model.backbone.bottom_up.stages.stride_in_1x1", True),
            "NUM_GROUPS": groups, "OUT_FEATURES": lz.get("model.backbone.bottom_up.out_features"),
            # make_default_stages fixes the widths: res2 256 (64 for ResNet-18/34), bottleneck 64
            "RES2_OUT_CHANNELS": 256 if isinstance(depth, int) and depth >= 50 else 64,
            "WIDTH_PER_GROUP": 64 // groups if isinstance(groups, int) and groups > 0 else groups}


def _backbone(lz: _Lazy, cfg: dict, prov: dict) -> None:
    if lz.target("model.backbone") == "SimpleFeaturePyramid":  # ViTDet, square_pad included
        return vit_backbone(lz, cfg)
    lz.expect("model.backbone", ("FPN",), "an FPN backbone")
    lz.only("model.backbone", {"bottom_up", "in_features", "out_channels", "norm", "top_block", "fuse_type",
                               "square_pad"})
    bottom_up = lz.expect("model.backbone.bottom_up", ("ResNet", "RegNet", "MViT"), "the FPN's bottom-up")
    lz.expect("model.backbone.top_block", ("LastLevelMaxPool",), "FPN's P6 by max pooling (Mask R-CNN)")
    if lz.get("model.backbone.square_pad", 0) and bottom_up != "MViT":
        raise lz.bad("model.backbone.square_pad", "padding to a square is not supported")
    in_features = lz.get("model.backbone.in_features")
    if bottom_up == "MViT":
        resnets, in_features = {}, _mvit(lz, cfg, in_features)
    elif bottom_up == "RegNet":
        resnets, cfg[SPEC_FIELDS]["regnet"] = regnet_bottom_up(lz, "model.backbone.bottom_up", prov)
        if in_features != REGNET_STAGES:
            raise lz.bad("model.backbone.in_features", f"expected the RegNet's {REGNET_STAGES}")
        in_features = REGNET_AS_RES  # the same four maps, as the yaml-era FPN keys name them
    else:
        resnets = _resnet(lz, prov)
    cfg["MODEL"].update(BACKBONE={"NAME": "build_resnet_fpn_backbone"}, RESNETS=resnets, FPN={
        "IN_FEATURES": in_features, "OUT_CHANNELS": lz.get("model.backbone.out_channels"),
        "NORM": lz.norm("model.backbone.norm", prov, "fpn_norm"), "FUSE_TYPE": lz.get("model.backbone.fuse_type", "sum")})


def _mvit(lz: _Lazy, cfg: dict, in_features) -> list[str]:
    """The MViT bottom-up and the FPN's square (the spec's ``mvit``, ``size_divisibility``); its
    scale2-5 maps as the yaml-era FPN keys name the same four (res2-5)."""
    path, square = "model.backbone.bottom_up", lz.get("model.backbone.square_pad", 0)
    if isinstance(square, bool) or not isinstance(square, int) or square <= 0 or square % 32:
        raise lz.bad("model.backbone.square_pad", f"{shown(square)}: an MViT needs its images padded to a square, a "
                                                  "multiple of 32 (its windowed attention would see a batch's padding)")
    try:
        spec = mvit_from_lazy(lz.get(path), path)
    except NorcalError as e:
        raise NorcalError(f"{lz.source}: {e}") from None  # its messages start with the key path
    if in_features != MVIT_STAGES:
        raise lz.bad("model.backbone.in_features", f"expected the MViT's {MVIT_STAGES}")
    cfg[SPEC_FIELDS].update(mvit=dataclasses.replace(spec, square_pad=square), size_divisibility=square)
    return REGNET_AS_RES


def _rpn(lz: _Lazy, cfg: dict) -> None:
    p = "model.proposal_generator"
    lz.expect(p, ("RPN",), "RPN proposals")
    lz.expect(f"{p}.head", ("StandardRPNHead",), "the RPN head")
    lz.expect(f"{p}.anchor_generator", ("DefaultAnchorGenerator",), "anchors")
    lz.only(p, {"head", "anchor_generator", "in_features", "nms_thresh", "pre_nms_topk", "post_nms_topk",
                "box2box_transform", "min_box_size", "anchor_boundary_thresh"})
    lz.only(f"{p}.head", {"in_channels", "num_anchors", "conv_dims", "box_dim"})
    lz.only(f"{p}.anchor_generator", {"sizes", "aspect_ratios", "strides", "offset"})
    pre, post = lz.get(f"{p}.pre_nms_topk"), lz.get(f"{p}.post_nms_topk")
    for key, v in (("pre_nms_topk", pre), ("post_nms_topk", post)):
        if not isinstance(v, list) or len(v) != 2:
            raise lz.bad(f"{p}.{key}", f"expected [train, test], got {shown(v)}")
    if lz.get(f"{p}.anchor_generator.strides") != [4, 8, 16, 32, 64]:
        raise lz.bad(f"{p}.anchor_generator.strides", "expected FPN's [4, 8, 16, 32, 64]")
    ratios = lz.get(f"{p}.anchor_generator.aspect_ratios")
    _came_from(cfg, MODEL__RPN__PRE_NMS_TOPK_TEST=f"{p}.pre_nms_topk.1",
               MODEL__RPN__POST_NMS_TOPK_TEST=f"{p}.post_nms_topk.1",
               MODEL__ANCHOR_GENERATOR__SIZES=f"{p}.anchor_generator.sizes",
               MODEL__ANCHOR_GENERATOR__ASPECT_RATIOS=f"{p}.anchor_generator.aspect_ratios")
    cfg["MODEL"].update(
        PROPOSAL_GENERATOR={"NAME": "RPN", "MIN_SIZE": lz.get(f"{p}.min_box_size", 0.0)},
        ANCHOR_GENERATOR={"SIZES": lz.get(f"{p}.anchor_generator.sizes"),
                          "ASPECT_RATIOS": ratios if isinstance(ratios, list) and ratios and isinstance(ratios[0], list)
                          else [ratios],
                          "OFFSET": lz.get(f"{p}.anchor_generator.offset", 0.0)},
        RPN={"IN_FEATURES": lz.get(f"{p}.in_features"), "NMS_THRESH": lz.get(f"{p}.nms_thresh"),
             "PRE_NMS_TOPK_TEST": pre[1], "POST_NMS_TOPK_TEST": post[1],
             "CONV_DIMS": lz.get(f"{p}.head.conv_dims", [-1]),
             "BBOX_REG_WEIGHTS": lz.get(f"{p}.box2box_transform.weights")})


def _pooler(lz: _Lazy, path: str) -> dict:
    lz.expect(path, ("ROIPooler",), "ROIPooler")
    lz.only(path, {"output_size", "scales", "sampling_ratio", "pooler_type", "canonical_box_size",
                   "canonical_level"})
    if lz.get(f"{path}.scales") != [0.25, 0.125, 0.0625, 0.03125]:
        raise lz.bad(f"{path}.scales", "expected P2-P5's [0.25, 0.125, 0.0625, 0.03125]")
    if (lz.get(f"{path}.canonical_box_size", 224), lz.get(f"{path}.canonical_level", 4)) != (224, 4):
        raise lz.bad(path, "only detectron2's canonical box size 224 at level 4 is supported")
    return {"POOLER_RESOLUTION": lz.get(f"{path}.output_size"), "POOLER_TYPE": lz.get(f"{path}.pooler_type"),
            "POOLER_SAMPLING_RATIO": lz.get(f"{path}.sampling_ratio")}


def _box_predictor(lz: _Lazy, path: str) -> dict:
    lz.expect(path, ("FastRCNNOutputLayers",), "the box predictor")
    lz.only(path, {"box2box_transform", "num_classes", *FAST_RCNN_DEFAULTS})
    v = {k: lz.get(f"{path}.{k}", d) for k, d in FAST_RCNN_DEFAULTS.items()}
    v["num_classes"] = lz.get(f"{path}.num_classes")
    if v["use_fed_loss"] and not v["use_sigmoid_ce"]:  # detectron2 asserts this too
        raise lz.bad(f"{path}.use_fed_loss", "federated loss needs use_sigmoid_ce: true")
    return v


def _box_head(lz: _Lazy, path: str, prov: dict) -> dict:
    lz.expect(path, ("FastRCNNConvFCHead",), "the box head")
    lz.only(path, {"conv_dims", "fc_dims", "conv_norm"})
    convs, fcs = lz.get(f"{path}.conv_dims", []), lz.get(f"{path}.fc_dims", [])
    conv_dim = _same(lz, f"{path}.conv_dims", convs, "box-head convs") or 256
    fc_dim = _same(lz, f"{path}.fc_dims", fcs, "box-head fcs") or 1024
    return {"NUM_CONV": len(convs), "CONV_DIM": conv_dim, "NUM_FC": len(fcs), "FC_DIM": fc_dim,
            "NORM": lz.norm(f"{path}.conv_norm", prov, "box_head_norm")}


def _roi_heads(lz: _Lazy, cfg: dict, prov: dict) -> None:
    p = "model.roi_heads"
    name = lz.expect(p, ("StandardROIHeads", CASCADE), "ROI heads")
    if name == CASCADE:
        pred_path = f"{p}.box_predictors.0"  # the stages agree: stage 0 speaks for them
        head, pred, cfg["MODEL"]["ROI_BOX_CASCADE_HEAD"] = cascade_heads(
            lz, p, lambda path: _box_head(lz, path, prov), lambda path: _box_predictor(lz, path))
    else:
        pred_path = f"{p}.box_predictor"
        head, pred = _box_head(lz, f"{p}.box_head", prov), _box_predictor(lz, pred_path)
    lz.only(p, {"num_classes", "box_in_features", "box_pooler", "mask_in_features", "mask_pooler", "mask_head",
                "keypoint_in_features", *(STAGE_LISTS if name == CASCADE else ("box_head", "box_predictor"))})
    box = {"NAME": "FastRCNNConvFCHead", **_pooler(lz, f"{p}.box_pooler"), **head,
           "BBOX_REG_WEIGHTS": lz.get(f"{pred_path}.box2box_transform.weights"),
           "CLS_AGNOSTIC_BBOX_REG": pred["cls_agnostic_bbox_reg"], "USE_SIGMOID_CE": pred["use_sigmoid_ce"]}
    num_classes = lz.get(f"{p}.num_classes")
    _came_from(cfg, MODEL__ROI_HEADS__NUM_CLASSES=f"{p}.num_classes",
               MODEL__ROI_BOX_HEAD__POOLER_RESOLUTION=f"{p}.box_pooler.output_size",
               MODEL__ROI_BOX_HEAD__POOLER_SAMPLING_RATIO=f"{p}.box_pooler.sampling_ratio",
               TEST__DETECTIONS_PER_IMAGE=f"{pred_path}.test_topk_per_image")
    if pred["num_classes"] != num_classes:
        raise lz.bad(f"{pred_path}.num_classes", f"differs from {p}.num_classes ({num_classes})")
    cfg["MODEL"].update(ROI_HEADS={"NAME": name, "NUM_CLASSES": num_classes,
                                   "IN_FEATURES": lz.get(f"{p}.box_in_features"),
                                   "SCORE_THRESH_TEST": pred["test_score_thresh"],
                                   "NMS_THRESH_TEST": pred["test_nms_thresh"]}, ROI_BOX_HEAD=box)
    cfg["TEST"] = {"DETECTIONS_PER_IMAGE": pred["test_topk_per_image"]}
    if lz.get(f"{p}.mask_head", None) is None:
        cfg["MODEL"]["MASK_ON"] = False
        return
    m = f"{p}.mask_head"
    lz.expect(m, ("MaskRCNNConvUpsampleHead",), "the mask head")
    lz.only(m, {"num_classes", "conv_dims", "conv_norm"})
    if lz.get(f"{p}.mask_in_features") != lz.get(f"{p}.box_in_features"):
        raise lz.bad(f"{p}.mask_in_features", "must be the box head's features")
    dims, classes = lz.get(f"{m}.conv_dims"), lz.get(f"{m}.num_classes")
    if classes not in (1, num_classes):
        raise lz.bad(f"{m}.num_classes", f"expected {num_classes} or 1 (class-agnostic)")
    conv_dim = _same(lz, f"{m}.conv_dims", dims, "mask-head convs")
    if not dims:  # its last entry is the deconvolution's width
        raise lz.bad(f"{m}.conv_dims", "expected the convs' and the deconvolution's widths, got []")
    _came_from(cfg, MODEL__ROI_MASK_HEAD__POOLER_RESOLUTION=f"{p}.mask_pooler.output_size",
               MODEL__ROI_MASK_HEAD__POOLER_SAMPLING_RATIO=f"{p}.mask_pooler.sampling_ratio")
    cfg["MODEL"].update(MASK_ON=True, ROI_MASK_HEAD={
        "NAME": "MaskRCNNConvUpsampleHead", **_pooler(lz, f"{p}.mask_pooler"), "NUM_CONV": len(dims) - 1,
        "CONV_DIM": conv_dim, "CLS_AGNOSTIC_MASK": classes == 1,
        "NORM": lz.norm(f"{m}.conv_norm", prov, "mask_head_norm")})


def _test_input(lz: _Lazy, cfg: dict) -> None:
    """The test loader's resize: detectron2's new_baselines / LVIS LazyConfigs use one
    ResizeShortestEdge (LSJ's ResizeScale + FixedSizeCrop are training augmentations)."""
    path = "dataloader.test.mapper.augmentations"
    augs = lz.get(path)
    if not isinstance(augs, list) or len(augs) != 1:
        raise lz.bad(path, "expected one ResizeShortestEdge at test time")
    lz.expect(f"{path}.0", ("ResizeShortestEdge",), "the test-time resize")
    lz.only(f"{path}.0", {"short_edge_length", "max_size", "sample_style", "interp"})
    short = lz.get(f"{path}.0.short_edge_length")
    if isinstance(short, list):
        if not short or any(s != short[0] for s in short):
            raise lz.bad(f"{path}.0.short_edge_length", f"{short}: a random size at test time is not supported")
        short = short[0]
    fmt = lz.get("dataloader.test.mapper.image_format", lz.get("model.input_format", "BGR"))
    if fmt != lz.get("model.input_format", "BGR"):
        raise lz.bad("dataloader.test.mapper.image_format", f"{fmt} differs from model.input_format")
    # without max_size ResizeShortestEdge caps nothing; no image resized past the export's largest
    # side can enter the graph, so that side is the cap
    longest = lz.get(f"{path}.0.max_size", MAX_EXPORT_SIDE)
    for key, v in (("short_edge_length", short), ("max_size", longest)):
        if not is_whole(v) or not 1 <= v <= MAX_EXPORT_SIDE:
            raise lz.bad(f"{path}.0.{key}", f"{shown(v)}: expected a whole number in 1 .. {MAX_EXPORT_SIDE} "
                                            "(the export's largest input side)")
    cfg["INPUT"] = {"MIN_SIZE_TEST": short, "MAX_SIZE_TEST": longest, "FORMAT": fmt}


def lazy_to_cfg(data: dict, source: str) -> tuple[dict, dict]:
    """(the yaml-era config keys ``data`` sets, provenance notes) for a LazyConfig dump.
    Raises :class:`NorcalError` naming the key path for a target or argument not read."""
    lz, prov = _Lazy(data, source), {}
    if data.get("model") is None:
        raise lz.bad("model", "missing (a LazyConfig's model: holds the detector)")
    if not isinstance(data["model"], dict):
        raise lz.bad("model", f"{shown(data['model'])}: expected a mapping with a {TARGET}")
    lz.expect("model", ("GeneralizedRCNN",), "meta architecture")
    lz.only("model", {"backbone", "proposal_generator", "roi_heads", "pixel_mean", "pixel_std", "input_format"})
    cfg: dict = {SPEC_FIELDS: {}, "MODEL": {"META_ARCHITECTURE": "GeneralizedRCNN", "PIXEL_MEAN": lz.get("model.pixel_mean"),
                           "PIXEL_STD": lz.get("model.pixel_std")}}
    _backbone(lz, cfg, prov)
    _rpn(lz, cfg)
    _roi_heads(lz, cfg, prov)
    _test_input(lz, cfg)
    mvit, sizes = cfg[SPEC_FIELDS].get("mvit"), (cfg["INPUT"]["MIN_SIZE_TEST"], cfg["INPUT"]["MAX_SIZE_TEST"])
    if mvit is not None and all(isinstance(s, int) for s in sizes) and max(sizes) > mvit.square_pad:
        raise lz.bad("dataloader.test.mapper.augmentations.0", f"resizes to {max(sizes)}: a resized image must fit "
                                                               f"the {mvit.square_pad} square (model.backbone.square_pad)")
    return cfg, prov
