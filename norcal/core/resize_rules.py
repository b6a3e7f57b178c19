"""The host's resize rules (runtime key ``norcal.resize``) as data: each rule's name and what it
means outside its host resize (``norcal.runtime.preprocess`` keeps those), read once."""

from __future__ import annotations

from dataclasses import dataclass

from norcal.core.errors import NorcalError

# The host's resize rule (absent: "shortest_edge"). "shortest_edge": detectron2's
# ResizeShortestEdge(min_size_test, max_size_test), zero padding at the bottom/right to a multiple
# of size_divisibility. "letterbox": Ultralytics' LetterBox to an input_size square: scale
# r = min(S/h, S/w), resized (round(h*r), round(w*r)) (each side >= 1) with bilinear
# (half-pixel centres, no antialiasing, as cv2.INTER_LINEAR), centred with top = (S - h') // 2,
# left = (S - w') // 2, the rest filled with pad_value. image_sizes holds (h', w') either way, and
# a letterbox graph removes the centring offset itself, so its boxes are in resized coordinates.
RESIZE = "norcal.resize"
# "stretch": every image resized to the INPUT_SIZE square exactly, aspect not kept, no padding
# (Ultralytics' RT-DETR predictor: LetterBox(auto=False, scale_fill=True)).
RESIZE_STRETCH = "stretch"
# "torchvision": GeneralizedRCNNTransform's resize (min_size_test / max_size_test): scale
# r = min(float32(min) / float32(short), float32(max) / float32(long)) in float32, resized
# (floor(h*r), floor(w*r)) by bilinear interpolation (half-pixel centres, no antialiasing) of the
# float pixels (not rounded to uint8), zero padding at the bottom/right as shortest_edge.
RESIZE_TORCHVISION = "torchvision"


@dataclass(frozen=True)
class ResizeRule:
    """What one resize rule (:data:`RESIZE`) means outside its host resize (which
    ``norcal.runtime.preprocess`` keeps per rule): read once from the rule's name."""

    name: str
    square: bool = False  # every image becomes the one INPUT_SIZE square: no min/max size override
    pads: bool = False  # the square is padded around the resized image with PAD_VALUE (letterbox)
    keeps_empty_boxes: bool = False  # a box clipped to no area is kept (Ultralytics keeps it)
    mask_paste: str = "detectron2"  # how masks are pasted when MASK_PASTE is absent


RESIZE_RULE_TABLE = {rule.name: rule for rule in (  # the first is the default
    ResizeRule("shortest_edge"),
    ResizeRule("letterbox", square=True, pads=True, keeps_empty_boxes=True),
    ResizeRule(RESIZE_STRETCH, square=True, keeps_empty_boxes=True),
    ResizeRule(RESIZE_TORCHVISION, mask_paste="torchvision"),
)}
RESIZE_RULES = tuple(RESIZE_RULE_TABLE)


def resize_rule(name: str | None) -> ResizeRule:
    """The rule a model's ``norcal.resize`` names (absent: the default), or a one-line refusal."""
    rule = RESIZE_RULE_TABLE.get(name or RESIZE_RULES[0])
    if rule is None:
        raise NorcalError(f"model metadata {RESIZE}={name!r} is not one of {', '.join(RESIZE_RULES)}")
    return rule
