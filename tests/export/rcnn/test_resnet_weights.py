"""ResNet weights in torchvision.models.resnet's names (torchvision's detection models,
mmdetection's ResNet) map onto our ResNet: every name and shape, against torchvision's own."""

import re
from pathlib import Path

import pytest
import torchvision

from norcal.core.errors import NorcalError
from norcal.export.rcnn.modeling.backbone import ResNet
from norcal.export.rcnn.resnet_weights import resnet_fields, resnet_renames


def _renamed(state: dict, prefix: str) -> dict:
    out = {}
    for key, value in state.items():
        for pattern, repl in resnet_renames(prefix):
            if m := pattern.match(key):
                out[(repl(m) if callable(repl) else m.expand(repl)) + key[m.end():]] = value
                break
        else:
            raise AssertionError(f"no rename for {key}")
    return out


@pytest.mark.parametrize("prefix", ["backbone.body.", "backbone."])  # torchvision's, mmdetection's
@pytest.mark.parametrize("build, fields", [
    (torchvision.models.resnet18, dict(depth=18, stem_out_channels=64, res2_out_channels=64, num_groups=1,
                                       width_per_group=64)),
    (torchvision.models.resnet50, dict(depth=50, stem_out_channels=64, res2_out_channels=256, num_groups=1,
                                       width_per_group=64)),
    (torchvision.models.resnext50_32x4d, dict(depth=50, stem_out_channels=64, res2_out_channels=256,
                                              num_groups=32, width_per_group=4)),
])
def test_every_weight_lands_on_ours_with_its_shape(build, fields, prefix):
    theirs = {prefix + k: v for k, v in build().state_dict().items()
              if not k.startswith("fc.") and not k.endswith("num_batches_tracked")}
    assert resnet_fields(theirs, prefix, Path("m.pth"), "a ResNet") == fields
    ours = {"backbone.bottom_up." + k: v.shape for k, v in ResNet(**fields, stride_in_1x1=False).state_dict().items()}
    got = {k: v.shape for k, v in _renamed(theirs, prefix).items()}
    assert got == ours


def test_a_resnet_of_other_depth_is_refused_by_its_blocks():
    state = {f"backbone.layer{s}.{i}.conv1.weight": None for s, n in zip(range(1, 5), (3, 4, 5, 3)) for i in range(n)}
    with pytest.raises(NorcalError, match=re.escape("m.pth: a ResNet with [3, 4, 5, 3] blocks per stage is not one")):
        resnet_fields(state, "backbone.", Path("m.pth"), "a ResNet")
