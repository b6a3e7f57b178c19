"""detectron2's ViTDet backbone as its weights show it (``backbone.net.*``, ``backbone.simfp_*``).

Read from names and shapes: embed dim and patch size (patch_embed.proj), depth, heads (the
head width is the relative-position tables' width), MLP width, qkv bias, residual blocks, the
pretraining grid of the absolute positions (with or without a class token), windowed vs global
blocks and the square: a global block's tables hold 2 * tokens - 1 rows, a windowed block's
2 * window - 1. What the weights cannot show is taken from the config or refused: the
LayerNorm eps, and which blocks are windowed when no block has relative positions.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from norcal.core.errors import NorcalError

from norcal.export.families.detectron2.weights.resnet import count, shape
from norcal.export.rcnn.spec import ViTSpec

NET = "backbone.net"
PASS_CONFIG = "pass the model's config.yaml"


def is_vit(sd: Mapping[str, Any]) -> bool:
    """ViTDet: a ViT's patch embedding under the SimpleFeaturePyramid (``backbone.net``)."""
    return f"{NET}.patch_embed.proj.weight" in sd


def _rel_rows(sd: Mapping[str, Any], depth: int) -> list[int]:
    rows = []
    for i in range(depth):
        a = f"{NET}.blocks.{i}.attn"
        rows.append(shape(sd, f"{a}.rel_pos_h")[0] if f"{a}.rel_pos_h" in sd else 0)
        if rows[-1] and shape(sd, f"{a}.rel_pos_w")[0] != rows[-1]:
            raise NorcalError(f"{a}.rel_pos_w and rel_pos_h differ in length: only square windows and grids")
    return rows


def vit_fields(sd: Mapping[str, Any], given: ViTSpec | None) -> dict:
    """The ViT's fields of a ModelSpec (``vit``, the pyramid's ``fpn_out_channels`` / ``fpn_norm``,
    ``size_divisibility``: the square); ``given``: the config's ViT, for what the weights cannot show."""
    proj = shape(sd, f"{NET}.patch_embed.proj.weight")
    if len(proj) != 4 or proj[2] != proj[3]:
        raise NorcalError(f"weight {NET}.patch_embed.proj.weight has shape {list(proj)}: a ViT patch embedding "
                          "is a 4-d square-kernel conv weight")
    dim, chans, patch, _ = proj
    depth = count(sd, f"{NET}.blocks.{{}}.attn.qkv.weight", 0)
    if chans != 3 or depth == 0:
        raise NorcalError(f"{NET}: expected a ViT over 3-channel images with blocks ({NET}.blocks.0.attn.qkv)")
    rows = _rel_rows(sd, depth)
    if given is None:
        raise NorcalError(f"{NET}: the ViT's LayerNorm eps is not in its weights (ViTDet's configs set 1e-6, "
                          f"nn.LayerNorm's default is 1e-5); {PASS_CONFIG}")
    if all(rows):
        lengths = sorted(set(rows))
        every = set(given.window_block_indexes) == set(range(depth))
        if len(lengths) == 2:  # the shorter tables are the windows'
            window, tokens = (lengths[0] + 1) // 2, (lengths[1] + 1) // 2
        elif len(lengths) == 1 and (every or not given.window_block_indexes):  # all windowed, or all global
            window = (lengths[0] + 1) // 2 if every else given.window_size
            tokens = given.square_pad // patch if every else (lengths[0] + 1) // 2
        else:
            raise NorcalError(f"{NET}: relative-position tables of lengths {lengths} do not tell windowed from "
                              f"global blocks as the config's window_block_indexes say")
        windowed = tuple(i for i, r in enumerate(rows) if r == 2 * window - 1 and (len(lengths) == 2 or every))
        head_dim = shape(sd, f"{NET}.blocks.0.attn.rel_pos_h")[1]
        heads, rel = dim // head_dim, True
    elif any(rows):
        raise NorcalError(f"{NET}: some blocks have relative positions and some none; detectron2's ViT gives all or none")
    else:  # no tables: the config says which blocks are windowed, and how many heads
        tokens, window, windowed = given.square_pad // patch, given.window_size, tuple(given.window_block_indexes)
        heads, rel = given.num_heads, False
    hidden = shape(sd, f"{NET}.blocks.0.mlp.fc1.weight")[0]
    pos = shape(sd, f"{NET}.pos_embed") if f"{NET}.pos_embed" in sd else None
    cls_token, pretrain = True, 224
    if pos is not None:
        side = math.isqrt(pos[1] - 1)
        cls_token = side * side == pos[1] - 1
        side = side if cls_token else math.isqrt(pos[1])
        if side * side != pos[1] - int(cls_token):
            raise NorcalError(f"{NET}.pos_embed holds {pos[1]} positions: not a square grid (+ a class token)")
        pretrain = side * patch
    vit = ViTSpec(embed_dim=dim, depth=depth, num_heads=heads, patch_size=patch, mlp_ratio=hidden / dim,
                  qkv_bias=f"{NET}.blocks.0.attn.qkv.bias" in sd, window_size=window, window_block_indexes=windowed,
                  residual_block_indexes=tuple(i for i in range(depth) if f"{NET}.blocks.{i}.residual.conv1.weight" in sd),
                  use_abs_pos=pos is not None, use_rel_pos=rel, pretrain_img_size=pretrain,
                  pretrain_use_cls_token=cls_token, ln_eps=given.ln_eps, square_pad=tokens * patch)
    return {"vit": vit, "fpn_out_channels": shape(sd, "backbone.simfp_4.0.weight")[0],
            "fpn_norm": "LN" if "backbone.simfp_4.0.norm.weight" in sd else "", "size_divisibility": vit.square_pad,
            "min_size_test": vit.square_pad, "max_size_test": vit.square_pad}
