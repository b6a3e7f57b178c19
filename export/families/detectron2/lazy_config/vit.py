"""ViTDet's backbone in a LazyConfig's ``config.yaml`` (``configs/common/models/mask_rcnn_vitdet.py``):
a ``SimpleFeaturePyramid`` over a ``ViT``, read as data (nothing imported or called), as the
yaml-era keys ``MODEL.BACKBONE.NAME`` (SimpleFeaturePyramid), ``MODEL.FPN.OUT_CHANNELS`` /
``NORM`` (the pyramid's) and ``MODEL.VIT`` (:class:`~norcal.export.rcnn.spec.ViTSpec`'s fields).

``norm_layer=partial(nn.LayerNorm, eps=1e-6)`` is saved as a ``functools.partial`` tag; its
class and eps are read from the tag's data (an absent norm_layer is ViT's default, nn.LayerNorm's eps 1e-5).
"""

from __future__ import annotations

from typing import Any

from norcal.core.errors import shown
from norcal.core.files.yaml_io import PYTHON_APPLY, PYTHON_NAME

from norcal.export.rcnn.spec import VIT_BACKBONE, ViTSpec

LAYER_NORM = "torch.nn.modules.normalization.LayerNorm"
GELU = "torch.nn.modules.activation.GELU"
# ViT's arguments with detectron2's defaults (vit.py); the pyramid's scale factors are fixed below
VIT_DEFAULTS = {"img_size": 1024, "patch_size": 16, "in_chans": 3, "embed_dim": 768, "depth": 12, "num_heads": 12,
                "mlp_ratio": 4.0, "qkv_bias": True, "use_abs_pos": True, "use_rel_pos": False, "window_size": 0,
                "window_block_indexes": [], "residual_block_indexes": [], "pretrain_img_size": 224,
                "pretrain_use_cls_token": True}
TRAINING_ONLY = {"drop_path_rate", "rel_pos_zero_init", "use_act_checkpoint", "out_feature"}
SCALE_FACTORS = [4.0, 2.0, 1.0, 0.5]


def layer_norm_eps(value: Any) -> float:
    """The eps of a LazyConfig ``norm_layer`` read inertly (None: absent): nn.LayerNorm or a
    functools.partial of it with ``eps``. Raises TypeError for another layer, ValueError(eps) for
    an eps that is not a positive number."""
    if value is None or (isinstance(value, dict) and value.get(PYTHON_NAME) == LAYER_NORM):
        return 1e-5  # nn.LayerNorm's own
    state = value.get("state") if isinstance(value, dict) else None
    if not (isinstance(value, dict) and value.get(PYTHON_APPLY) == "functools.partial" and isinstance(state, list)
            and len(state) == 4 and isinstance(state[0], dict) and state[0].get(PYTHON_NAME) == LAYER_NORM
            and not state[1] and isinstance(state[2], dict) and set(state[2]) <= {"eps"}):
        raise TypeError(value)
    eps = state[2].get("eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(eps)
    return float(eps)


def _layer_norm_eps(lz, path: str) -> float:
    value = lz.get(path, None)
    try:
        return layer_norm_eps(value)
    except TypeError:
        raise lz.bad(path, f"{_short(value)}: only nn.LayerNorm or functools.partial(nn.LayerNorm, eps=...) "
                           "is read") from None
    except ValueError as e:
        raise lz.bad(path, f"eps {shown(e.args[0])} is not a positive number") from None


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get(PYTHON_APPLY) or value.get(PYTHON_NAME) or shown(value))
    return shown(value)


def is_whole(x: Any) -> bool:
    """An int read from YAML, true / false excluded (Python's bool is an int)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """An int or float read from YAML, true / false excluded."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_vit_values(lz, net: str, v: dict) -> None:
    """Each ViT argument of the type its default has (a whole number > 0, window_size >= 0, a
    ratio > 0, a boolean, block indexes within the depth), named by its key when not."""
    for k, value in v.items():
        default, why = VIT_DEFAULTS[k], None
        if isinstance(default, bool):
            why = None if isinstance(value, bool) else "not true or false"
        elif isinstance(default, list):
            ok = isinstance(value, list) and all(is_whole(i) for i in value)
            depth = v["depth"] if is_whole(v["depth"]) else 0
            why = None if ok and all(0 <= i < depth for i in value) else \
                f"not a list of block indexes (0 .. depth - 1 = {depth - 1})"
        elif isinstance(default, float):
            ok = is_number(value) and value > 0
            why = None if ok else "not a number > 0"
        else:
            least = 0 if k == "window_size" else 1
            why = None if is_whole(value) and value >= least else f"not a whole number >= {least}"
        if why:
            raise lz.bad(f"{net}.{k}", f"{shown(value)}: {why}")


def vit_backbone(lz, cfg: dict) -> None:
    """Set ``cfg``'s backbone keys from ``model.backbone`` (a SimpleFeaturePyramid over a ViT)."""
    p, net = "model.backbone", "model.backbone.net"
    lz.only(p, {"net", "in_feature", "out_channels", "scale_factors", "top_block", "norm", "square_pad"})
    lz.expect(net, ("ViT",), "a ViT under the SimpleFeaturePyramid")
    lz.expect(f"{p}.top_block", ("LastLevelMaxPool",), "P6 by max pooling")
    lz.only(net, set(VIT_DEFAULTS) | TRAINING_ONLY | {"norm_layer", "act_layer"})
    factors = lz.get(f"{p}.scale_factors")
    if not isinstance(factors, list) or not all(map(is_number, factors)) or \
            [float(f) for f in factors] != SCALE_FACTORS:
        raise lz.bad(f"{p}.scale_factors", f"{shown(factors)}: only ViTDet's {SCALE_FACTORS}")
    if lz.get(f"{p}.in_feature") != lz.get(f"{net}.out_feature", "last_feat"):
        raise lz.bad(f"{p}.in_feature", "must be the ViT's out_feature")
    act = lz.get(f"{net}.act_layer", {PYTHON_NAME: GELU})
    if not (isinstance(act, dict) and act.get(PYTHON_NAME) == GELU):
        raise lz.bad(f"{net}.act_layer", f"{_short(act)}: only nn.GELU")
    v = {k: lz.get(f"{net}.{k}", d) for k, d in VIT_DEFAULTS.items()}
    _check_vit_values(lz, net, v)
    if v.pop("in_chans") != 3:
        raise lz.bad(f"{net}.in_chans", "images have 3 channels")
    square = lz.get(f"{p}.square_pad", 0)
    if isinstance(square, bool) or not isinstance(square, int) or square <= 0:
        raise lz.bad(f"{p}.square_pad", f"{shown(square)}: only a padding square (> 0) is supported, which fixes "
                                        "the ViT's token grid")
    if v["img_size"] != square:
        raise lz.bad(f"{net}.img_size", f"{v['img_size']} differs from square_pad {square} (relative positions "
                                        "resized to another grid are not supported)")
    del v["img_size"]
    cfg["MODEL"].update(BACKBONE={"NAME": VIT_BACKBONE},
                        VIT={**v, "ln_eps": _layer_norm_eps(lz, f"{net}.norm_layer"), "square_pad": square},
                        FPN={"OUT_CHANNELS": lz.get(f"{p}.out_channels"), "NORM": lz.get(f"{p}.norm", "LN")})


def vit_spec(c) -> ViTSpec | None:
    """The :class:`ViTSpec` of a merged config (:class:`ConfigValues`) whose backbone is ViTDet's
    (None for another backbone); its test resize must fit the square, as detectron2 pads to it."""
    if c.str("MODEL.BACKBONE.NAME") != VIT_BACKBONE:
        return None
    given = c.get("MODEL.VIT")
    if not isinstance(given, dict) or set(given) - set(ViTSpec.__dataclass_fields__):
        raise c.bad("MODEL.VIT", "expected the ViT's fields (from a LazyConfig's model.backbone)")
    spec = ViTSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
    c.require("MODEL.RPN.IN_FEATURES", (["p2", "p3", "p4", "p5", "p6"],), "ViTDet's RPN reads p2-p6")
    c.require("MODEL.ROI_HEADS.IN_FEATURES", (["p2", "p3", "p4", "p5"],), "ViTDet's ROI heads read p2-p5")
    c.require("MODEL.ROI_HEADS.NAME", ("StandardROIHeads", "CascadeROIHeads"),
              "a ViT backbone is supported with StandardROIHeads or CascadeROIHeads")
    if max(c.int("INPUT.MIN_SIZE_TEST"), c.int("INPUT.MAX_SIZE_TEST")) > spec.square_pad:
        raise c.bad("INPUT.MAX_SIZE_TEST", f"a resized image must fit the {spec.square_pad} square (square_pad)")
    return spec
