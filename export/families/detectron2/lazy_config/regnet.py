"""A LazyConfig's RegNet FPN bottom-up (``detectron2.modeling.backbone.regnet.RegNet``, as
configs/new_baselines/mask_rcnn_regnet{x,y}_4gf_dds_FPN_100ep_LSJ.py set it) as a
:class:`RegNetSpec`, computed from its design-space parameters (depth, w_a, w_0, w_m, group
width, bottleneck ratio, SE ratio) the way detectron2's RegNet builds its stages: per-block widths
quantized, stages made of equal widths, then widths and groups made compatible. The loader checks
the result against the checkpoint's layers.
"""

from __future__ import annotations

import math

import numpy as np

from norcal.core.errors import shown
from norcal.export.rcnn.spec import RegNetSpec

STAGES = ["s1", "s2", "s3", "s4"]  # what the FPN reads (P2-P5), as the weights reader requires
# the yaml-era names of the same four maps (stride 4 to 32) that the FPN keys check
FPN_IN_FEATURES = ["res2", "res3", "res4", "res5"]
_QUANTUM = 8  # RegNet's width quantum (generate_regnet_parameters' q)
# blocks in all four stages: the published RegNets have at most 28; the stage plan and the spec
# grow with it, so it is bounded before either is built (the loader then matches the weights)
MAX_DEPTH = 256


def _number(lz, path: str, default=..., integer: bool = False) -> float:
    v = lz.get(path, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
            (integer and not isinstance(v, int)):
        raise lz.bad(path, f"expected {'an integer' if integer else 'a number'}, got {shown(v)}")
    return v


def stage_plan(w_a: float, w_0: int, w_m: float, depth: int) -> tuple[list[int], list[int]]:
    """(stage widths, stage depths) of RegNet's design space: block k's width w_0 + k w_a
    snapped to w_0 times a power of w_m, rounded to a multiple of 8; equal widths form a stage."""
    cont = np.arange(depth) * w_a + w_0
    steps = np.round(np.log(cont / w_0) / np.log(w_m))
    widths = np.round(np.divide(w_0 * np.power(w_m, steps), _QUANTUM)).astype(int) * _QUANTUM
    ws, ds = np.unique(widths, return_counts=True)
    return [int(w) for w in ws], [int(d) for d in ds]


def compatible(widths: list[int], ratio: float, group_width: int) -> tuple[list[int], list[int]]:
    """(stage widths, group widths) adjusted so each bottleneck holds whole groups."""
    bottlenecks = [int(max(1, w * ratio)) for w in widths]
    groups = [int(min(group_width, v)) for v in bottlenecks]
    multiples = [math.lcm(g, int(ratio)) if ratio > 1 else g for g in groups]
    bottlenecks = [max(m, int(round(v / m) * m)) for v, m in zip(bottlenecks, multiples)]
    return [int(v / ratio) for v in bottlenecks], groups


def regnet_spec(lz, path: str) -> RegNetSpec:
    """The RegNet at ``path`` (a ``_Lazy`` tree's key path) as the weights would show it."""
    lz.only(path, {"stem_class", "stem_width", "block_class", "depth", "w_a", "w_0", "w_m", "group_width",
                   "stride", "bottleneck_ratio", "se_ratio", "norm", "out_features"})
    for key, want in (("stem_class", "SimpleStem"), ("block_class", "ResBottleneckBlock")):
        given = lz.get(f"{path}.{key}")
        name = given.get("_python_name_", "") if isinstance(given, dict) else ""
        if name.rsplit(".", 1)[-1] != want:
            raise lz.bad(f"{path}.{key}", f"{name or shown(given)}: only RegNet's {want} is supported")
    if lz.get(f"{path}.stride", 2) != 2:
        raise lz.bad(f"{path}.stride", "only stride 2 per stage (what the FPN's strides need) is supported")
    depth, w_0 = _number(lz, f"{path}.depth", integer=True), _number(lz, f"{path}.w_0", integer=True)
    w_a, w_m = _number(lz, f"{path}.w_a"), _number(lz, f"{path}.w_m")
    group_width = _number(lz, f"{path}.group_width", integer=True)
    ratio, se_ratio = _number(lz, f"{path}.bottleneck_ratio", 1.0), _number(lz, f"{path}.se_ratio", 0.0)
    stem = _number(lz, f"{path}.stem_width", integer=True)
    # detectron2 asserts these before it computes the widths
    if depth > MAX_DEPTH:
        raise lz.bad(f"{path}.depth", f"{shown(depth)}: must be <= {MAX_DEPTH} (blocks in the four stages; "
                                      "published RegNets have at most 28)")
    for key, ok in (("depth", depth >= 1), ("w_a", w_a >= 0), ("w_0", w_0 > 0 and w_0 % _QUANTUM == 0),
                    ("w_m", w_m > 1), ("group_width", group_width > 0), ("stem_width", stem > 0),
                    ("bottleneck_ratio", ratio > 0 and (ratio <= 1 or ratio == int(ratio))),
                    ("se_ratio", se_ratio >= 0)):
        if not ok:
            raise lz.bad(f"{path}.{key}", f"{shown(lz.get(f'{path}.{key}', None))}: outside RegNet's design space")
    widths, depths = stage_plan(w_a, w_0, w_m, depth)
    if len(widths) != len(STAGES):
        raise lz.bad(path, f"gives {len(widths)} stages (widths {widths}); the FPN reads exactly {len(STAGES)}")
    if lz.get(f"{path}.out_features", None) != STAGES:
        raise lz.bad(f"{path}.out_features", f"expected {STAGES}, the four stages the FPN reads")
    widths, group_widths = compatible(widths, ratio, group_width)
    bottlenecks = [int(round(w * ratio)) for w in widths]
    se, w_in = [], stem
    for w, d in zip(widths, depths):  # a stage's first block takes the previous width, the rest its own
        se.append(tuple(int(round(x * se_ratio)) for x in [w_in] + [w] * (d - 1)))
        w_in = w
    # the grouped 3x3 conv holds bottleneck // groups input channels per group
    per_group = [b // (b // g) for b, g in zip(bottlenecks, group_widths)]
    return RegNetSpec(stem_width=stem, depths=tuple(depths), widths=tuple(widths),
                      bottleneck_widths=tuple(bottlenecks), group_widths=tuple(per_group), se_widths=tuple(se))


def regnet_bottom_up(lz, path: str, prov: dict) -> tuple[dict, RegNetSpec]:
    """(``MODEL.RESNETS`` keys, spec) of the RegNet at ``path``: its norm goes in ``RESNETS.NORM``
    (a RegNet spec's ``norm`` is the bottom-up's), the rest in the :class:`RegNetSpec`."""
    return {"NORM": lz.norm(f"{path}.norm", prov, "norm", "BN")}, regnet_spec(lz, path)
