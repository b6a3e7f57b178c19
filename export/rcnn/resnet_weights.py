"""ResNet weights named as ``torchvision.models.resnet`` names them (``conv1``, ``bn1``,
``layer<N>.<i>.conv<j>`` / ``bn<j>``, ``downsample.0`` / ``.1``) read as our ResNet
(``backbone.bottom_up``): torchvision's detection models hold one under ``backbone.body.``;
mmdetection's ResNet uses the same names under ``backbone.``."""

from __future__ import annotations

import re
from pathlib import Path

from norcal.core.errors import NorcalError

# blocks per stage -> depth (basic blocks below 50, bottlenecks from 50)
DEPTH_OF_BLOCKS = {(2, 2, 2, 2): 18, (3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152}
OURS = "backbone.bottom_up."


def resnet_renames(prefix: str) -> list[tuple[re.Pattern, object]]:
    """(pattern, replacement) pairs from the ResNet's names under ``prefix`` to ours; a
    replacement is a template (``Match.expand``) or a function of the match."""
    p = re.escape(prefix)

    def block(suffix: str):
        return lambda m: f"{OURS}res{int(m[1]) + 1}.{m[2]}.{suffix.format(j=m[3] if m.lastindex >= 3 else '')}"

    return [
        (re.compile(rf"{p}conv1\."), f"{OURS}stem.conv1."),
        (re.compile(rf"{p}bn1\."), f"{OURS}stem.conv1.norm."),
        (re.compile(rf"{p}layer(\d)\.(\d+)\.conv(\d)\."), block("conv{j}.")),
        (re.compile(rf"{p}layer(\d)\.(\d+)\.bn(\d)\."), block("conv{j}.norm.")),
        (re.compile(rf"{p}layer(\d)\.(\d+)\.downsample\.0\."), block("shortcut.")),
        (re.compile(rf"{p}layer(\d)\.(\d+)\.downsample\.1\."), block("shortcut.norm.")),
    ]


def _shape(state: dict, key: str, path: Path, what: str) -> tuple[int, ...]:
    if key not in state:
        raise NorcalError(f"{path}: no weight {key!r}: not {what}")
    return tuple(state[key].shape)


def resnet_fields(state: dict, prefix: str, path: Path, what: str) -> dict:
    """The ResNet's ModelSpec fields (depth, stem and res2 widths, groups, width per group) from
    the shapes under ``prefix``; ``what`` names the model a missing weight says it is not."""
    blocks = []
    for stage in range(1, 5):
        ids = {int(m[1]) for k in state if (m := re.match(rf"{re.escape(prefix)}layer{stage}\.(\d+)\.", k))}
        blocks.append(len(ids))
    depth = DEPTH_OF_BLOCKS.get(tuple(blocks))
    if depth is None:
        raise NorcalError(f"{path}: a ResNet with {blocks} blocks per stage is not one of ResNet-18/50/101/152")
    conv1 = _shape(state, f"{prefix}layer1.0.conv1.weight", path, what)
    bottleneck = depth >= 50
    groups = conv1[0] // _shape(state, f"{prefix}layer1.0.conv2.weight", path, what)[1] if bottleneck else 1
    res2 = _shape(state, f"{prefix}layer1.0.conv3.weight" if bottleneck else f"{prefix}layer1.0.conv2.weight",
                  path, what)[0]
    return dict(depth=depth, stem_out_channels=_shape(state, f"{prefix}conv1.weight", path, what)[0],
                res2_out_channels=res2, num_groups=groups, width_per_group=conv1[0] // groups)
