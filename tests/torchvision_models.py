"""Tiny torchvision Faster / Mask R-CNNs for the torchvision family's tests (no downloads).

Random weights give an RPN whose objectness is nearly flat (ties decide the proposals) and a
classifier close to uniform; :func:`condition` spreads the objectness and the class logits so
that proposals and detections are decided by clear margins, as tests/yolo_models.py does for
YOLO heads."""

from __future__ import annotations

import json

import torch
import torchvision
from torchvision.models.detection import FasterRCNN, MaskRCNN
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

COUNTS = [3.0, 40.0, 900.0]  # three classes, long-tailed


def condition(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Objectness and class logits spread over a few units, boxes moved off their proposals (the
    predictor's weights scaled by sqrt(1024 / box head width): the same spread at any width)."""
    gen = torch.Generator().manual_seed(seed)
    sd = model.state_dict()
    k = (1024 / sd["roi_heads.box_predictor.cls_score.weight"].shape[1]) ** 0.5
    with torch.no_grad():
        for name, std in (("rpn.head.cls_logits.weight", 0.2), ("roi_heads.box_predictor.cls_score.weight", 0.05 * k),
                          ("roi_heads.box_predictor.bbox_pred.weight", 0.01 * k)):
            sd[name].copy_(torch.randn(sd[name].shape, generator=gen) * std)
        bias = sd["roi_heads.box_predictor.cls_score.bias"]
        bias.copy_(torch.linspace(-1.0, 0.5, bias.numel()))  # background (first) least likely
        if "roi_heads.mask_predictor.mask_fcn_logits.weight" in sd:
            w = sd["roi_heads.mask_predictor.mask_fcn_logits.weight"]
            w.copy_(torch.randn(w.shape, generator=gen) * 0.05)
    return model.eval()


def tiny_rcnn(masks: bool = False, seed: int = 0, box_width: int | None = None, **kwargs) -> torch.nn.Module:
    """A ResNet-18-FPN Faster (or Mask) R-CNN with len(COUNTS) classes, torchvision's defaults
    otherwise (resize 800 / 1333), conditioned. box_width: its box head's two FC layers' width
    (torchvision's TwoMLPHead; default its 1024, whose first layer is most of the model's weights
    and of an image's work over 1000 proposals)."""
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead

    torch.manual_seed(seed)
    backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    cls = MaskRCNN if masks else FasterRCNN
    classes = len(COUNTS) + 1
    if box_width:  # torchvision's own head and predictor at that width (then num_classes must be None)
        kwargs.update(box_head=TwoMLPHead(backbone.out_channels * 7 * 7, box_width),
                      box_predictor=FastRCNNPredictor(box_width, classes))
        classes = None
    return condition(cls(backbone, num_classes=classes, **kwargs), seed)


def r50(masks: bool = False, num_classes: int = 5) -> torch.nn.Module:
    """torchvision's own R50-FPN builder (v1), no weights downloaded."""
    build = torchvision.models.detection.maskrcnn_resnet50_fpn if masks else \
        torchvision.models.detection.fasterrcnn_resnet50_fpn
    return build(weights=None, weights_backbone=None, num_classes=num_classes).eval()


def table_file(path):
    """A calibration table with COUNTS (category ids 1..C)."""
    cats = [{"id": i + 1, "name": f"class{i}", "image_count": int(c), "instance_count": int(c)}
            for i, c in enumerate(COUNTS)]
    path.write_text(json.dumps({"name": "toy", "categories": cats}))
    return path


def tiny_retinanet(seed: int = 0, **kwargs) -> torch.nn.Module:
    """A ResNet-18-FPN RetinaNet as retinanet_resnet50_fpn builds it (P6 from P5, 9 anchors),
    len(COUNTS) classes; the class prior bias (-4.6: no score passes 0.05) moved up and the
    logits spread so that detections pass the threshold by clear margins."""
    from torchvision.models import resnet18
    from torchvision.models.detection import RetinaNet
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    torch.manual_seed(seed)
    backbone = _resnet_fpn_extractor(resnet18(), 5, returned_layers=[2, 3, 4],
                                     extra_blocks=LastLevelP6P7(256, 256))
    model = RetinaNet(backbone, num_classes=len(COUNTS), **kwargs)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = model.head.classification_head.cls_logits
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.1)
        head.bias.fill_(-2.0)
        reg = model.head.regression_head.bbox_reg
        reg.weight.copy_(torch.randn(reg.weight.shape, generator=gen) * 0.01)
    return model.eval()
