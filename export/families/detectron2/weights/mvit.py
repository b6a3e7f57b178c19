"""detectron2's MViT (MViTv2) bottom-up as its weights show it (``backbone.bottom_up.patch_embed.proj``,
``blocks.{i}.attn.pool_q`` ...), and as a LazyConfig's ``model.backbone.bottom_up`` gives it.

From names and shapes: embed dim, depth, first-stage heads (the width over the pooling convs'
head width), where stages end (the blocks after them project to a doubled width), MLP ratio,
qkv bias, the pooling and patch kernels. What the weights cannot show is detectron2's: patch
stride 4 / padding 3, kv stride 4 adapted per stage, window 56 halved per stage, rel-pos tables
made for a 224 input; taken only where every rel-pos table has the size those give. The LayerNorm
eps, residual pooling (no weights of its own) and the FPN's square are taken from the config, or
refused, as for ViTDet.
"""

from __future__ import annotations

from typing import Any, Mapping

from norcal.core.errors import NorcalError
from norcal.core.files.yaml_io import PYTHON_NAME

from norcal.export.families.detectron2.weights.resnet import BOTTOM_UP, count, shape
from norcal.export.families.detectron2.lazy_config.vit import LAYER_NORM, is_number, is_whole, layer_norm_eps
from norcal.export.families.detectron2.weights.vit import PASS_CONFIG
from norcal.export.rcnn.spec import MViTSpec

MVIT_PATCH = f"{BOTTOM_UP}.patch_embed.proj"
MVIT_TARGET = "detectron2.modeling.MViT"
GELU = "torch.nn.modules.activation.GELU"
# the MViT's arguments no weight shows: the config's (``given``) or none
FROM_CONFIG = ("norm_eps", "residual_pooling", "square_pad")
# the LazyConfig arguments read into the spec; others (drop_path_rate, use_act_checkpoint,
# pretrain_*) change training only, or must keep detectron2's default
_LAZY_FIELDS = ("embed_dim", "depth", "num_heads", "last_block_indexes", "mlp_ratio", "qkv_bias",
                "qkv_pool_kernel", "patch_kernel", "patch_stride", "patch_padding", "adaptive_kv_stride",
                "adaptive_window_size", "residual_pooling", "use_rel_pos", "img_size")
_BOOLS = ("qkv_bias", "residual_pooling", "use_rel_pos")
_TUPLES = ("last_block_indexes", "qkv_pool_kernel", "patch_kernel", "patch_stride", "patch_padding")
_LAZY_IGNORED = ("drop_path_rate", "use_act_checkpoint", "rel_pos_zero_init", "pretrain_img_size",
                 "pretrain_use_cls_token", "in_chans", "_target_", "norm_layer", "out_features", "use_abs_pos",
                 "act_layer")


def is_mvit(sd: Mapping[str, Any]) -> bool:
    """An MViT bottom-up: a patch embedding and pooling attention (``blocks.0.attn.pool_q``)."""
    return f"{MVIT_PATCH}.weight" in sd and f"{BOTTOM_UP}.blocks.0.attn.pool_q.weight" in sd


def _dims(sd: Mapping[str, Any], key: str, ndim: int) -> tuple[int, ...]:
    if key not in sd:
        raise NorcalError(f"MViT weight {key} is missing")
    dims = shape(sd, key)
    if len(dims) != ndim:
        raise NorcalError(f"weight {key} has shape {list(dims)}: expected {ndim} dimensions")
    return dims


def _stage_ends(sd: Mapping[str, Any], depth: int) -> tuple[int, ...]:
    """The blocks ending scale2..scale4 (a block after each widens with ``proj``), then the last."""
    firsts = [i for i in range(depth) if f"{BOTTOM_UP}.blocks.{i}.proj.weight" in sd]
    ends = tuple(i - 1 for i in firsts) + (depth - 1,)
    if len(ends) != 4 or ends[0] < 0:
        raise NorcalError(f"the MViT widens at blocks {firsts} ({BOTTOM_UP}.blocks.*.proj); detectron2's "
                          "MViT feeding an FPN has 4 stages, widened at the first block of the last 3")
    return ends


def _expected_rows(spec: MViTSpec) -> list[int]:
    """Each block's rel-pos table length as detectron2 sizes it for ``spec``."""
    rows, size, kv, ends = [], spec.img_size // spec.patch_stride[0], spec.adaptive_kv_stride, spec.last_block_indexes
    for i in range(spec.depth):
        q = 2 if i - 1 in ends else 1
        kv_i = kv * 2 if i in ends[1:3] else kv
        rows.append(2 * max(size // q, size // kv_i) - 1)
        if i in ends:
            kv = max(kv // 2, 1)
        if i - 1 in ends:
            size //= 2
    return rows


def _check_tables(sd: Mapping[str, Any], spec: MViTSpec, head_dim: int) -> None:
    for i, rows in enumerate(_expected_rows(spec)):
        for axis in ("h", "w"):
            key = f"{BOTTOM_UP}.blocks.{i}.attn.rel_pos_{axis}"
            if key not in sd:
                raise NorcalError(f"MViT weight {key} is missing: without rel-pos tables the pooling strides and "
                                  "input size cannot be confirmed from the weights")
            if _dims(sd, key, 2) != (rows, head_dim):
                raise NorcalError(f"weight {key} has shape {list(shape(sd, key))}; detectron2's MViT defaults "
                                  f"(img_size 224, patch stride 4, kv stride 4) give [{rows}, {head_dim}]")


def mvit_fields(sd: Mapping[str, Any], given: MViTSpec | None) -> dict:
    """The MViT's fields of a ModelSpec: ``mvit`` (a :class:`MViTSpec`) and ``size_divisibility``
    (its square); ``given``: the config's MViT, for what the weights cannot show (None: refused).
    Raises NorcalError naming the weight that departs from detectron2's MViT."""
    if f"{BOTTOM_UP}.pos_embed" in sd:
        raise NorcalError(f"weight {BOTTOM_UP}.pos_embed: an MViT with absolute positions (use_abs_pos) is not "
                          "supported")
    embed, chans, *kernel = _dims(sd, f"{MVIT_PATCH}.weight", 4)
    if chans != 3 or tuple(kernel) != (7, 7):
        raise NorcalError(f"weight {MVIT_PATCH}.weight has shape {[embed, chans, *kernel]}: detectron2's MViT "
                          "embeds 3 channels with a 7x7 kernel (stride 4, padding 3)")
    if given is None:
        raise NorcalError(f"{BOTTOM_UP}: the MViT's LayerNorm eps, residual pooling and its FPN's square_pad are not "
                          "in its weights (detectron2's MViTv2 configs set 1e-6, True, 1024; MViT's defaults "
                          f"differ); {PASS_CONFIG}")
    depth = count(sd, f"{BOTTOM_UP}.blocks.{{}}.norm1.weight", 0)
    ends = _stage_ends(sd, depth)
    head_dim, one, *pool = _dims(sd, f"{BOTTOM_UP}.blocks.0.attn.pool_q.weight", 4)
    if one != 1 or any(k % 2 == 0 for k in pool):
        raise NorcalError(f"weight {BOTTOM_UP}.blocks.0.attn.pool_q.weight has shape {[head_dim, one, *pool]}: "
                          "expected a depthwise conv with an odd kernel")
    if embed % head_dim:
        raise NorcalError(f"weight {BOTTOM_UP}.blocks.0.attn.pool_q.weight pools {head_dim} channels a head, which "
                          f"does not divide the embedding's {embed}")
    hidden = _dims(sd, f"{BOTTOM_UP}.blocks.0.mlp.fc1.weight", 2)[0]
    spec = MViTSpec(embed_dim=embed, depth=depth, num_heads=embed // head_dim, last_block_indexes=ends,
                    mlp_ratio=hidden / embed, qkv_bias=f"{BOTTOM_UP}.blocks.0.attn.qkv.bias" in sd,
                    qkv_pool_kernel=tuple(pool), **{k: getattr(given, k) for k in FROM_CONFIG})
    dim_in = dim = embed
    for i in range(depth):
        b = f"{BOTTOM_UP}.blocks.{i}"
        want = {f"{b}.norm1.weight": (dim_in,), f"{b}.attn.qkv.weight": (3 * dim, dim_in),
                f"{b}.attn.proj.weight": (dim, dim), f"{b}.mlp.fc1.weight": (int(dim * spec.mlp_ratio), dim),
                f"{b}.attn.pool_q.weight": (head_dim, 1, *pool), f"{b}.attn.pool_k.weight": (head_dim, 1, *pool)}
        for key, dims in want.items():
            if _dims(sd, key, len(dims)) != dims:
                raise NorcalError(f"weight {key} has shape {list(shape(sd, key))}; detectron2's MViT with the "
                                  f"widths of {BOTTOM_UP}.blocks.0 gives {list(dims)} here")
        if (f"{b}.attn.qkv.bias" in sd) != spec.qkv_bias:
            raise NorcalError(f"{b}.attn.qkv has a bias where {BOTTOM_UP}.blocks.0 has none, or none where it has one")
        dim_in = dim
        if i in ends:
            norm = f"{BOTTOM_UP}.scale{ends.index(i) + 2}_norm.weight"
            if _dims(sd, norm, 1) != (dim,):
                raise NorcalError(f"weight {norm} has shape {list(shape(sd, norm))}; the stage's width is {dim}")
            dim *= 2
    if spec.use_rel_pos:
        _check_tables(sd, spec, head_dim)
    return {"mvit": spec, "size_divisibility": spec.square_pad}


def _partial_eps(node: Any, where: str) -> float:
    """The eps of ``partial(nn.LayerNorm, eps=...)`` as LazyConfig.save writes it (inert data)."""
    try:
        if node is None:
            raise TypeError(node)
        return layer_norm_eps(node)
    except TypeError:
        raise NorcalError(f"{where}.norm_layer: only partial(nn.LayerNorm, eps=...) (or nn.LayerNorm) "
                          "is supported") from None
    except ValueError as e:
        raise NorcalError(f"{where}.norm_layer: eps {e.args[0]!r} must be a positive number") from None


def mvit_from_lazy(node: Mapping[str, Any], where: str = "model.backbone.bottom_up") -> MViTSpec:
    """The :class:`MViTSpec` of a LazyConfig's ``detectron2.modeling.MViT`` node (config.yaml read
    inertly: ``norm_layer`` a functools.partial or a class name); unsupported arguments refused by path."""
    if node.get("_target_") != MVIT_TARGET:
        raise NorcalError(f"{where}._target_ {node.get('_target_')!r} is not {MVIT_TARGET}")
    unknown = sorted(set(node) - set(_LAZY_FIELDS) - set(_LAZY_IGNORED))
    if unknown:
        raise NorcalError(f"{where}.{unknown[0]}: not an MViT argument this export reads")
    for key, ok in (("use_abs_pos", False), ("in_chans", 3)):
        if node.get(key, ok) != ok:
            raise NorcalError(f"{where}.{key}: only {ok} is supported")
    if node.get("act_layer", {PYTHON_NAME: GELU}) != {PYTHON_NAME: GELU}:
        raise NorcalError(f"{where}.act_layer: only nn.GELU is supported")
    outs = node.get("out_features", ["scale2", "scale3", "scale4", "scale5"])
    if not isinstance(outs, (list, tuple)) or list(outs) != ["scale2", "scale3", "scale4", "scale5"]:
        raise NorcalError(f"{where}.out_features {outs!r}: an FPN over scale2..scale5 is supported")
    eps = _partial_eps(node.get("norm_layer", {PYTHON_NAME: LAYER_NORM}), where)
    args = {k: node[k] for k in _LAZY_FIELDS if k in node}
    for k, v in args.items():
        if k in _BOOLS:
            ok = isinstance(v, bool)
        elif k in _TUPLES:
            ok = isinstance(v, list) and all(is_whole(x) and x >= 0 for x in v)
            args[k] = tuple(v) if ok else v
        else:
            ok = (is_number(v) if k == "mlp_ratio" else is_whole(v)) and v > 0
        if not ok:
            raise NorcalError(f"{where}.{k}: {v!r} is not a valid value for detectron2's MViT")
    defaults = dict(embed_dim=96, depth=16, num_heads=1, last_block_indexes=(0, 2, 11, 15))  # MViT's own
    return MViTSpec(**{**defaults, **args, "norm_eps": eps})
