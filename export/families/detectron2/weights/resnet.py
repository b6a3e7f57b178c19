"""The detectron2 ResNet backbone as its weights show it: what R-CNN and RetinaNet specs share.

Read from parameter names and shapes only (depth from the blocks per stage, widths, groups,
norms, the checkpoint's pixel statistics); :mod:`norcal.export.families.detectron2.weights.architecture` and
:mod:`norcal.export.families.detectron2.weights.retinanet` build their specs on it.
"""

from __future__ import annotations

from typing import Any, Mapping

from norcal.core.errors import NorcalError

from norcal.export.rcnn.spec import FPN_BACKBONE, RES5_ROI_HEADS

STEM = "backbone.bottom_up.stem.conv1"
BOTTOM_UP = "backbone.bottom_up"
PLAIN_STEM = "backbone.stem.conv1"  # build_resnet_backbone: the ResNet is the backbone (C4, DC5)

# blocks in res2..res5 -> depth (detectron2's build_resnet_backbone table)
BOTTLENECK_DEPTHS = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152}
BASIC_DEPTHS = {(2, 2, 2, 2): 18, (3, 4, 6, 3): 34}


def shape(sd: Mapping[str, Any], key: str) -> tuple[int, ...]:
    return tuple(int(d) for d in sd[key].shape)


def count(sd: Mapping[str, Any], fmt: str, start: int) -> int:
    """How many consecutive indices k >= start have ``fmt.format(k)`` in ``sd``."""
    k = start
    while fmt.format(k) in sd:
        k += 1
    return k - start


def norm_of(sd: Mapping[str, Any], prefix: str, config_norms: bool = False) -> str:
    """The norm layer at ``prefix`` (e.g. ``...conv1.norm``): FrozenBN, BN, GN or "" (none).

    FrozenBN and BN both carry running statistics; only BN has ``num_batches_tracked``
    (absent once :func:`~norcal.export.families.checkpoints.clean_state_dict` ran: then FrozenBN is
    reported, which computes the same thing at inference). GroupNorm and detectron2's channel
    LayerNorm (LN) both save a per-channel weight and bias and nothing else (the group count and
    eps are not saved): weights alone cannot tell them apart, so such a norm is refused unless
    ``config_norms`` (a config says which; the "GN" reported then stands for either, compared by
    :func:`norm_family`).
    """
    if f"{prefix}.running_mean" in sd:
        return "BN" if f"{prefix}.num_batches_tracked" in sd else "FrozenBN"
    if f"{prefix}.weight" not in sd:
        return ""
    if not config_norms:
        raise NorcalError(f"weight {prefix}.weight: a norm with affine parameters and no running statistics is "
                          "GroupNorm (GN) or LayerNorm (LN), which save the same weights; pass the model's config "
                          "(its config.yaml, yacs or LazyConfig) to say which")
    return "GN"


def norm_family(norm: str) -> str:
    """What weights can tell of a norm: BN flavours compute the same thing at inference; GN and
    LN save the same weights (:func:`norm_of`)."""
    return "BN" if norm in ("BN", "FrozenBN", "SyncBN") else "GN" if norm == "LN" else norm


def backbone_fields(sd: Mapping[str, Any], layout: dict, config_norms: bool = False) -> dict:
    """The ResNet's fields of a ModelSpec (depth, stem and res2 widths, norm, groups) for a
    ``layout`` (backbone and ROI heads names: where the stages' weights are); ``config_norms``
    as in :func:`norm_of`."""
    fpn = layout["backbone_name"] == FPN_BACKBONE
    prefix = BOTTOM_UP if fpn else "backbone"
    stage_prefix = {s: prefix for s in (2, 3, 4, 5)}
    if layout["roi_heads_name"] == RES5_ROI_HEADS:
        stage_prefix[5] = "roi_heads"  # detectron2 builds res5 in the heads, always 3 bottlenecks
    blocks = tuple(count(sd, f"{stage_prefix[s]}.res{s}.{{}}.conv1.weight", 0) for s in (2, 3, 4, 5))
    bottleneck = f"{prefix}.res2.0.conv3.weight" in sd
    table = BOTTLENECK_DEPTHS if bottleneck else BASIC_DEPTHS
    if layout["roi_heads_name"] == RES5_ROI_HEADS:
        table = {k[:3] + (3,): v for k, v in table.items()}
    if blocks not in table:
        kind = "bottleneck" if bottleneck else "basic"
        raise NorcalError(f"backbone has {blocks} {kind} blocks in res2..res5; expected one of "
                          f"{sorted(table)} (ResNet-{'/'.join(str(d) for d in table.values())})")
    stem = f"{prefix}.stem.conv1"
    out = {"depth": table[blocks], "stem_out_channels": shape(sd, f"{stem}.weight")[0],
           "norm": norm_of(sd, f"{stem}.norm", config_norms)}
    if bottleneck:
        width, per_group = shape(sd, f"{prefix}.res2.0.conv2.weight")[:2]
        groups = width // per_group
        out.update(res2_out_channels=shape(sd, f"{prefix}.res2.0.conv3.weight")[0],
                   num_groups=groups, width_per_group=width // groups)
    else:
        out.update(res2_out_channels=shape(sd, f"{prefix}.res2.0.conv2.weight")[0], num_groups=1)
    if not fpn:
        feature = layout["backbone_out_feature"]
        last = "conv3" if bottleneck else "conv2"
        out["feature_channels"] = shape(sd, f"backbone.{feature}.0.{last}.weight")[0]
    return out


def pixel_stats(sd: Mapping[str, Any]) -> dict:
    """pixel_mean / pixel_std as the checkpoint's buffers give them (absent: {})."""
    out = {}
    for key in ("pixel_mean", "pixel_std"):
        if key in sd:
            values = [float(v) for v in sd[key].reshape(-1).tolist()]
            if len(values) != 3:
                raise NorcalError(f"weight {key} has {len(values)} values; expected 3 (one per channel)")
            out[key] = tuple(values)
    return out
