"""A torchvision detection model's state dict read as our R-CNN / RetinaNet: which files are one
(by their key names), our key names for theirs, and the ModelSpec their shapes imply
(torchvision's test-time defaults; see :mod:`norcal.export.families.torchvision`)."""

from __future__ import annotations

import re
from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.export.families.checkpoints import TORCH_SUFFIXES
from norcal.export.families.torchvision.convention import TORCHVISION
from norcal.export.families.pickle_scan import scan_torch_zip
from norcal.export.rcnn.resnet_weights import resnet_fields, resnet_renames

# keys only a torchvision GeneralizedRCNN state dict has (detectron2 says bottom_up, rpn_head)
_MARKERS = ("backbone.body.", "rpn.head.", "roi_heads.box_predictor.cls_score.weight")
_FCOS = "head.regression_head.bbox_ctrness"  # FCOS's head is RetinaNet's plus centerness
_RETINANET = "head.classification_head.cls_logits.weight"
_SSD = "head.classification_head.module_list."  # SSD's and SSDlite's per-level heads
SUPPORTED = ("supported: fasterrcnn_resnet50_fpn, maskrcnn_resnet50_fpn and retinanet_resnet50_fpn "
             "(v1, a ResNet-18/50/101/152 FPN backbone)")
# torchvision builders we do not convert, told apart by a key only they have (first match wins)
_VARIANTS = (
    ("roi_heads.keypoint_", "Keypoint R-CNN (keypointrcnn_resnet50_fpn)"),
    (_FCOS, "FCOS (fcos_resnet50_fpn)"),
    ("backbone.scale_weight", "SSD (ssd300_vgg16)"),
    (_SSD, "SSDlite (ssdlite320_mobilenet_v3_large)"),
    ("backbone.body.0.", "Faster R-CNN with a MobileNet-v3 FPN backbone "
                         "(fasterrcnn_mobilenet_v3_large_fpn / _320_fpn)"),
    ("roi_heads.mask_head.0.1.", "Mask R-CNN v2 (maskrcnn_resnet50_fpn_v2: conv + norm box and mask heads)"),
    ("roi_heads.box_head.0.1.", "Faster R-CNN v2 (fasterrcnn_resnet50_fpn_v2: a conv + norm box head)"),
    ("head.classification_head.conv.0.1.", "RetinaNet v2 (retinanet_resnet50_fpn_v2: GroupNorm heads)"),
)
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # GeneralizedRCNNTransform's defaults, RGB 0-1
IMAGENET_STD = (0.229, 0.224, 0.225)
_BODY = "backbone.body."  # where the ResNet is (norcal.export.rcnn.resnet_weights' names)
_WHAT = "a torchvision Faster / Mask R-CNN or RetinaNet state dict"

# torchvision name -> ours, past the ResNet's (the patterns match the names of torchvision < 0.13 too)
_RENAMES = [
    # FPN levels from 2 (R-CNN: res2-res5) or 3 (RetinaNet: res3-res5): FIRST is set per file
    (r"backbone\.fpn\.inner_blocks\.(\d)\.(0\.)?", lambda m, first: f"backbone.fpn_lateral{int(m[1]) + first}."),
    (r"backbone\.fpn\.layer_blocks\.(\d)\.(0\.)?", lambda m, first: f"backbone.fpn_output{int(m[1]) + first}."),
    (r"backbone\.fpn\.extra_blocks\.(p6|p7)\.", r"backbone.top_block.\1."),
    (r"head\.classification_head\.conv\.(\d)\.0\.", lambda m, first: f"head.cls_subnet.{2 * int(m[1])}."),
    (r"head\.classification_head\.cls_logits\.", "head.cls_score."),
    (r"head\.regression_head\.conv\.(\d)\.0\.", lambda m, first: f"head.bbox_subnet.{2 * int(m[1])}."),
    (r"head\.regression_head\.bbox_reg\.", "head.bbox_pred."),
    (r"rpn\.head\.conv\.(0\.0\.)?", "proposal_generator.rpn_head.conv."),
    (r"rpn\.head\.cls_logits\.", "proposal_generator.rpn_head.objectness_logits."),
    (r"rpn\.head\.bbox_pred\.", "proposal_generator.rpn_head.anchor_deltas."),
    (r"roi_heads\.box_head\.fc6\.", "roi_heads.box_head.fc1."),
    (r"roi_heads\.box_head\.fc7\.", "roi_heads.box_head.fc2."),
    (r"roi_heads\.box_predictor\.(cls_score|bbox_pred)\.", r"roi_heads.box_predictor.\1."),
    (r"roi_heads\.mask_head\.(\d)\.0\.", lambda m, first: f"roi_heads.mask_head.mask_fcn{int(m[1]) + 1}."),
    (r"roi_heads\.mask_head\.mask_fcn(\d)\.", r"roi_heads.mask_head.mask_fcn\1."),
    (r"roi_heads\.mask_predictor\.conv5_mask\.", "roi_heads.mask_head.deconv."),
    (r"roi_heads\.mask_predictor\.mask_fcn_logits\.", "roi_heads.mask_head.predictor."),
]
_RENAMES = [(pattern, (lambda m, first, r=r: r(m)) if callable(r) else r) for pattern, r in resnet_renames(_BODY)] + \
    [(re.compile(p), r) for p, r in _RENAMES]


def saved_keys(path: Path) -> set[str]:
    """The strings a torch zip's pickle holds (its weight names among them, DDP's ``module.``
    prefix removed), read from its opcodes without unpickling; empty for another file."""
    scan = scan_torch_zip(path)
    if scan is None:
        return set()
    return {s[len("module."):] if s.startswith("module.") else s for s in scan.strings}


def is_torchvision_checkpoint(path: Path) -> bool:
    """A ``.pth``/``.pt`` torch zip whose keys are a torchvision detection model's."""
    if path.suffix.lower() not in TORCH_SUFFIXES or not path.is_file():
        return False
    keys = saved_keys(path)
    has = [any(k.startswith(m) for k in keys) for m in _MARKERS]
    dense = any(k.startswith((_FCOS, _RETINANET)) for k in keys)
    ssd = any(k.startswith("backbone.features.") for k in keys) and any(k.startswith(_SSD) for k in keys)
    return all(has) or (has[0] and dense) or ssd  # SSDs are claimed so that load names them


def check_variant(keys, path: Path) -> None:
    """Refuse, naming it, a torchvision detection model we do not convert (one line)."""
    for marker, variant in _VARIANTS:
        if any(k.startswith(marker) for k in keys):
            raise NorcalError(f"{path}: a torchvision {variant} state dict is not supported; {SUPPORTED}")


def rename_state_dict(state: dict, path: Path) -> dict:
    """torchvision's key names -> ours (BN counters dropped); refuses keys it does not know."""
    out, unknown = {}, []
    inner = {k.split(".")[3] for k in state if k.startswith("backbone.fpn.inner_blocks.")}
    first = 6 - len(inner)  # the FPN's inputs end at res5
    for k, v in state.items():
        if k.endswith("num_batches_tracked"):
            continue
        for pattern, repl in _RENAMES:
            m = pattern.match(k)
            if m:
                new = repl(m, first) if callable(repl) else m.expand(repl)
                out[new + k[m.end():]] = v
                break
        else:
            unknown.append(k)
    if unknown:
        more = f" (+{len(unknown) - 4} more)" if len(unknown) > 4 else ""
        raise NorcalError(f"{path}: weights a torchvision Faster / Mask R-CNN or RetinaNet with a ResNet-FPN "
                          f"backbone does not have: {', '.join(sorted(unknown)[:4])}{more}")
    return out


def _shape(state: dict, key: str, path: Path) -> tuple[int, ...]:
    if key not in state:
        raise NorcalError(f"{path}: no weight {key!r}: not {_WHAT}")
    return tuple(state[key].shape)


def _resnet(state: dict, path: Path) -> dict:
    """The ResNet-FPN's ModelSpec fields: the ResNet's from ``backbone.body`` shapes, the FPN's
    width, torchvision's test-time defaults."""
    fpn = "backbone.fpn.layer_blocks.0.0.weight"
    fpn = _shape(state, fpn if fpn in state else "backbone.fpn.layer_blocks.0.weight", path)[0]
    return dict(convention=TORCHVISION, input_format="RGB",
                pixel_mean=tuple(255.0 * m for m in IMAGENET_MEAN), pixel_std=tuple(255.0 * s for s in IMAGENET_STD),
                min_size_test=800, max_size_test=1333, size_divisibility=32, norm="FrozenBN",
                stride_in_1x1=False, fpn_out_channels=fpn, **resnet_fields(state, _BODY, path, _WHAT))


# retinanet_resnet50_fpn's anchors: three octave scales per level, ratios 0.5, 1, 2 (A = 9)
RETINANET_ANCHOR_SIZES = tuple((x, int(x * 2 ** (1.0 / 3)), int(x * 2 ** (2.0 / 3))) for x in (32, 64, 128, 256, 512))


def _retinanet_spec(state: dict, path: Path, detections_per_image: int | None):
    from norcal.export.rcnn.spec import RETINANET, ModelSpec

    cls = _shape(state, _RETINANET, path)[0]
    box = _shape(state, "head.regression_head.bbox_reg.weight", path)[0]
    anchors = box // 4
    if anchors != 9:
        raise NorcalError(f"{path}: the RetinaNet head predicts {box // 4} anchors per location; "
                          "torchvision's retinanet_resnet50_fpn anchors (3 scales x 3 ratios) are 9")
    if cls % anchors or cls < anchors:
        raise NorcalError(f"{path}: head.classification_head.cls_logits has {cls} outputs; a RetinaNet "
                          f"of C >= 1 classes has C x {anchors} (one per class and anchor)")
    base = _resnet(state, path)
    p6_in = _shape(state, "backbone.fpn.extra_blocks.p6.weight", path)[1]
    convs = len({m[1] for k in state if (m := re.match(r"head\.classification_head\.conv\.(\d+)\.", k))})
    return ModelSpec(
        meta_architecture=RETINANET, **base, anchor_sizes=RETINANET_ANCHOR_SIZES,
        anchor_aspect_ratios=((0.5, 1.0, 2.0),), num_classes=cls // anchors,
        bbox_reg_weights=(1.0, 1.0, 1.0, 1.0), score_thresh_test=0.05, nms_thresh_test=0.5,
        detections_per_image=300 if detections_per_image is None else int(detections_per_image),
        retinanet_num_convs=convs, retinanet_topk_candidates=1000,
        retinanet_p6_from_p5=p6_in == base["fpn_out_channels"], mask_on=False,
        provenance={"spec": "inferred from torchvision weights; test settings torchvision's defaults"})


def spec_from_state(state: dict, path: Path, detections_per_image: int | None = None):
    """The ModelSpec (torchvision convention, torchvision's test-time defaults) of a torchvision
    state dict (its own key names): class count, depth, widths and mask head from the shapes."""
    from norcal.export.rcnn.spec import ModelSpec

    check_variant(state, path)
    if _RETINANET in state:
        return _retinanet_spec(state, path, detections_per_image)
    cls = _shape(state, "roi_heads.box_predictor.cls_score.weight", path)
    box = _shape(state, "roi_heads.box_predictor.bbox_pred.weight", path)
    num_classes = cls[0] - 1
    if num_classes < 1 or box[0] != 4 * cls[0]:
        raise NorcalError(f"{path}: roi_heads.box_predictor has {cls[0]} class logits and {box[0]} box "
                          "outputs; torchvision's FastRCNNPredictor has C+1 (background first) and 4(C+1)")
    anchors = _shape(state, "rpn.head.cls_logits.weight", path)[0]
    if anchors != 3:
        raise NorcalError(f"{path}: the RPN predicts {anchors} anchors per location; torchvision's "
                          "default anchor generator (sizes 32-512, ratios 0.5, 1, 2) has 3")
    fc = _shape(state, "roi_heads.box_head.fc6.weight", path)[0]
    mask_on = any(k.startswith("roi_heads.mask_predictor.") for k in state)
    mask_convs = len({m[1] for k in state if (m := re.match(r"roi_heads\.mask_head\.(?:mask_fcn)?(\d+)\.", k))})
    return ModelSpec(
        **_resnet(state, path), rpn_min_size=1e-3,
        num_classes=num_classes, pooler_type="ROIAlign", pooler_sampling_ratio=2,
        box_head_num_fc=2, box_head_fc_dim=fc, score_thresh_test=0.05, nms_thresh_test=0.5,
        detections_per_image=100 if detections_per_image is None else int(detections_per_image),
        mask_on=mask_on, mask_head_num_conv=mask_convs, mask_pooler_type="ROIAlign",
        mask_pooler_sampling_ratio=2,
        provenance={"spec": "inferred from torchvision weights; test settings torchvision's defaults"},
    )
