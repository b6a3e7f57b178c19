"""detectron2 backbones whose weights we do not read, named from their parameter names, so that
a GeneralizedRCNN (or RetinaNet) built on one is refused for its backbone, not as foreign weights.

The names are those of detectron2's ``modeling/backbone/regnet.py`` (``AnyNet``: ``stem`` then
stages ``s1``..``s4`` of blocks ``b1``..) and ``swin.py`` (``layers`` of ``blocks``), as the
model zoo's and the ViTDet project's configs build them.
"""

from __future__ import annotations

from typing import Any, Mapping

_UP = "backbone.bottom_up."


def _has(keys, prefix: str, part: str = "") -> bool:
    return any(k.startswith(prefix) and part in k for k in keys)


def unread_backbone(sd: Mapping[str, Any]) -> str | None:
    """"RegNet (...)", "Swin (...)": the backbone the names show, with the names that show
    it; None when they show none of these."""
    keys = list(sd)
    if f"{_UP}stem.conv.weight" in sd and _has(keys, f"{_UP}s1.b1."):
        return f"RegNet ({_UP}stem.conv, {_UP}s1.b1.*: detectron2's regnet.py)"
    if _has(keys, f"{_UP}layers.", ".blocks."):
        return f"Swin ({_UP}layers.*.blocks.*: detectron2's swin.py)"
    return None


def meta_architecture(sd: Mapping[str, Any]) -> str:
    """What the non-backbone names show: RetinaNet's dense head or GeneralizedRCNN's RPN / ROI heads."""
    if _has(list(sd), "head.cls_subnet."):
        return "RetinaNet"
    return "GeneralizedRCNN" if _has(list(sd), "proposal_generator.") or _has(list(sd), "roi_heads.") \
        else "detectron2 model"


def unread_backbone_message(sd: Mapping[str, Any], supported: str) -> str | None:
    """One line refusing a model for its backbone; None when the backbone is not one we can name."""
    name = unread_backbone(sd)
    if name is None:
        return None
    return (f"a detectron2 {meta_architecture(sd)} with a {name} backbone, whose weights are not read; "
            f"{supported}")
