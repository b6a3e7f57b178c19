"""torchvision detection builders the family does not convert are refused by name in one line
that says what is supported; class and anchor counts read from a state dict are range-checked."""

from pathlib import Path

import pytest
import torch
import torchvision.models.detection as tvd

from norcal.core.errors import NorcalError
from norcal.export.families import family_of, load_detector
from norcal.export.families.torchvision.state_dict import SUPPORTED
from norcal.export.families.torchvision.detector import detector_from_state
from tests.torchvision_models import tiny_rcnn, tiny_retinanet

PATH = Path("best.pth")


def _save_keys_and_shapes(model_on_meta, path):
    """torchvision's own key names and shapes, each weight a zero broadcast to its shape (a
    one-element storage: the refusal reads names and shapes, and the file stays a few kB)."""
    torch.save({k: torch.zeros((), dtype=v.dtype).expand(v.shape) for k, v in model_on_meta.state_dict().items()},
               path)


@pytest.mark.parametrize("builder, variant", [
    ("fasterrcnn_mobilenet_v3_large_fpn", "Faster R-CNN with a MobileNet-v3 FPN backbone"),
    ("fasterrcnn_mobilenet_v3_large_320_fpn", "Faster R-CNN with a MobileNet-v3 FPN backbone"),
    ("fasterrcnn_resnet50_fpn_v2", "Faster R-CNN v2 (fasterrcnn_resnet50_fpn_v2"),
    ("maskrcnn_resnet50_fpn_v2", "Mask R-CNN v2 (maskrcnn_resnet50_fpn_v2"),
    ("retinanet_resnet50_fpn_v2", "RetinaNet v2 (retinanet_resnet50_fpn_v2"),
    ("ssd300_vgg16", "SSD (ssd300_vgg16)"),
    ("ssdlite320_mobilenet_v3_large", "SSDlite (ssdlite320_mobilenet_v3_large)"),
    ("fcos_resnet50_fpn", "FCOS (fcos_resnet50_fpn)"),
    ("keypointrcnn_resnet50_fpn", "Keypoint R-CNN (keypointrcnn_resnet50_fpn)"),
])
def test_unsupported_torchvision_builders_are_refused_by_name(tmp_path, builder, variant):
    kwargs = dict(weights=None, weights_backbone=None)
    if not builder.startswith("keypoint"):
        kwargs["num_classes"] = 3
    with torch.device("meta"):  # the builder's modules without allocating or initialising weights
        model = getattr(tvd, builder)(**kwargs)
    path = tmp_path / f"{builder}.pth"
    _save_keys_and_shapes(model, path)
    assert family_of(path).name == "torchvision"
    with pytest.raises(NorcalError) as e:
        load_detector(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: a torchvision {variant}") and msg.endswith(SUPPORTED) and "\n" not in msg


def _refusal(state, **edits) -> str:
    """What the family's loader says of ``state`` with ``edits`` (``__`` for ``.`` in names)."""
    state = dict(state)
    state.update({k.replace("__", "."): v for k, v in edits.items()})
    with pytest.raises(NorcalError) as e:
        detector_from_state(state, PATH)  # what load_detector runs on the weights it read
    msg = str(e.value)
    assert msg.startswith(f"{PATH}: ") and msg.count(str(PATH)) == 1 and "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def states():
    return tiny_rcnn().state_dict(), tiny_retinanet().state_dict()


@pytest.mark.parametrize("edit, field", [
    # R-CNN: no class at all (background only, or no logits), RPN anchors the generator does not make
    (dict(roi_heads__box_predictor__cls_score__weight=torch.zeros(1, 1024)), "roi_heads.box_predictor"),
    (dict(roi_heads__box_predictor__cls_score__weight=torch.zeros(0, 1024)), "roi_heads.box_predictor"),
    (dict(rpn__head__cls_logits__weight=torch.zeros(0, 256, 1, 1)), "the RPN predicts 0 anchors"),
    (dict(rpn__head__cls_logits__weight=torch.zeros(5, 256, 1, 1)), "the RPN predicts 5 anchors"),
    (dict(rpn__head__bbox_pred__weight=torch.zeros(8, 256, 1, 1)), "proposal_generator.rpn_head.anchor_deltas"),
])
def test_rcnn_counts_out_of_range_are_refused(states, edit, field):
    assert field in _refusal(states[0], **edit)


@pytest.mark.parametrize("edit, field", [
    (dict(head__classification_head__cls_logits__weight=torch.zeros(0, 256, 3, 3),
          head__classification_head__cls_logits__bias=torch.zeros(0)), "head.classification_head.cls_logits has 0"),
    (dict(head__classification_head__cls_logits__weight=torch.zeros(10, 256, 3, 3),
          head__classification_head__cls_logits__bias=torch.zeros(10)), "head.classification_head.cls_logits has 10"),
    (dict(head__regression_head__bbox_reg__weight=torch.zeros(24, 256, 3, 3)), "predicts 6 anchors"),
])
def test_retinanet_counts_out_of_range_are_refused(states, edit, field):
    assert field in _refusal(states[1], **edit)
