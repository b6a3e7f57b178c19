"""detectron2's RegNet bottom-up as its weights show it (``backbone.bottom_up.stem.conv``, ``s1.b1.f.a``...).

Read from parameter names and shapes only: each stage's block count, width, bottleneck and group
widths, each block's SE width, the norm. What the weights cannot show is fixed by detectron2's
RegNet: SimpleStem (3x3/2), ResBottleneckBlock, every stage with stride 2.
"""

from __future__ import annotations

from typing import Any, Mapping

from norcal.core.errors import NorcalError

from norcal.export.families.detectron2.weights.resnet import BOTTOM_UP, count, norm_of
from norcal.export.families.detectron2.weights.resnet import shape as _any_shape
from norcal.export.rcnn.spec import RegNetSpec

REGNET_STEM = f"{BOTTOM_UP}.stem.conv"
FPN_STAGES = 4  # the FPN reads s1..s4 (P2-P5)
# the pixel std of every detectron2 RegNet config (pycls' ImageNet normalisation, BGR); detectron2
# does not save pixel_mean/std in a checkpoint
REGNET_PIXEL_STD = (57.375, 57.120, 58.395)


def is_regnet(sd: Mapping[str, Any]) -> bool:
    """A RegNet bottom-up: AnyNet's stem (``stem.conv``, not ResNet's ``stem.conv1``)."""
    return f"{REGNET_STEM}.weight" in sd


def shape(sd: Mapping[str, Any], key: str) -> tuple[int, ...]:
    """A conv weight's shape [out, in/groups, kh, kw]: every RegNet weight read here is one."""
    dims = _any_shape(sd, key)
    if len(dims) != 4:
        raise NorcalError(f"weight {key} has shape {list(dims)}: a RegNet conv weight is 4-d [out, in, kh, kw]")
    return dims


def _stage(sd: Mapping[str, Any], k: int) -> tuple[int, int, int, int, tuple[int, ...]]:
    """(blocks, width, bottleneck width, group width, SE width per block) of stage s{k}."""
    p = f"{BOTTOM_UP}.s{k}"
    blocks = count(sd, f"{p}.b{{}}.f.a.weight", 1)
    if f"{p}.b1.f.c.weight" not in sd:
        raise NorcalError(f"weight {p}.b1.f.a.weight without {p}.b1.f.c.weight: only RegNet's "
                          "ResBottleneckBlock is supported (not ResBasicBlock / VanillaBlock)")
    if f"{p}.b1.proj.weight" not in sd:
        raise NorcalError(f"{p}.b1 has no projection ({p}.b1.proj.weight): every RegNet stage starts with a "
                          "strided block")
    width = shape(sd, f"{p}.b1.f.c.weight")[0]
    w_b, group_w = shape(sd, f"{p}.b1.f.b.weight")[:2]
    se = []
    for i in range(1, blocks + 1):
        b = f"{p}.b{i}.f"
        if (shape(sd, f"{b}.c.weight")[0], *shape(sd, f"{b}.b.weight")[:2]) != (width, w_b, group_w):
            raise NorcalError(f"{b} differs in width from {p}.b1; detectron2's RegNet builds a stage's blocks alike")
        se.append(shape(sd, f"{b}.se.f_ex.0.weight")[0] if f"{b}.se.f_ex.0.weight" in sd else 0)
    return blocks, width, w_b, group_w, tuple(se)


def regnet_fields(sd: Mapping[str, Any], config_norms: bool = False) -> dict:
    """The RegNet's fields of a ModelSpec: ``regnet`` (a :class:`RegNetSpec`) and ``norm``
    (``config_norms`` as in :func:`.resnet_weights.norm_of`)."""
    kernel = shape(sd, f"{REGNET_STEM}.weight")[2:]
    if kernel != (3, 3):
        raise NorcalError(f"weight {REGNET_STEM}.weight has a {kernel[0]}x{kernel[1]} kernel: only RegNet's "
                          "SimpleStem (3x3, stride 2) is supported, not ResStem")
    stages = count(sd, f"{BOTTOM_UP}.s{{}}.b1.f.a.weight", 1)
    if stages != FPN_STAGES:
        raise NorcalError(f"the RegNet has {stages} stages (s1..s{stages}); the FPN reads exactly "
                          f"{FPN_STAGES} (s1..s4)")
    rows = [_stage(sd, k) for k in range(1, stages + 1)]
    norm = norm_of(sd, f"{BOTTOM_UP}.stem.bn", config_norms)
    spec = RegNetSpec(stem_width=shape(sd, f"{REGNET_STEM}.weight")[0], depths=tuple(r[0] for r in rows),
                      widths=tuple(r[1] for r in rows), bottleneck_widths=tuple(r[2] for r in rows),
                      group_widths=tuple(r[3] for r in rows), se_widths=tuple(r[4] for r in rows))
    return {"regnet": spec, "norm": norm}
