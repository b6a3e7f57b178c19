"""An FPN with affine-only norms: GN or LN only its config can say (nn.GroupNorm and detectron2's
layers/batch_norm.py LayerNorm save the same weight and bias, nothing else).

The d2_lvis_tiny checkpoint with a normed FPN, as detectron2's FPN builds one with MODEL.FPN.NORM
set (convs without bias, a norm after each): refused alone; with a config saying GN, and one saying
LN, it loads into two models whose norms are torch's group_norm (32 groups, eps 1e-5) and layer_norm
over the channels (eps 1e-6), and whose FPN features differ on the same image.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from norcal.core.errors import NorcalError
from norcal.export.families.detectron2.loader import load_model
from norcal.export.rcnn.modeling.layers import PaddingMasks

SOURCE = Path(__file__).parents[4] / "fixtures" / "d2_lvis_tiny"
LEVELS = (2, 3, 4, 5)


@pytest.fixture(scope="module")
def normed_fpn(tmp_path_factory) -> Path:
    """The fixture's weights and config with a normed FPN; the config's FPN.NORM left '' to set."""
    folder = tmp_path_factory.mktemp("normed_fpn")
    sd = torch.load(SOURCE / "model_final.pth", map_location="cpu", weights_only=True)["model"]
    gen = torch.Generator().manual_seed(3)
    for level in LEVELS:
        for kind in ("lateral", "output"):
            prefix = f"backbone.fpn_{kind}{level}"
            channels = sd.pop(f"{prefix}.bias").shape[0]
            sd[f"{prefix}.norm.weight"] = 1 + 0.2 * torch.randn(channels, generator=gen)
            sd[f"{prefix}.norm.bias"] = 0.1 * torch.randn(channels, generator=gen)
    torch.save({"model": sd}, folder / "model_final.pth")
    return folder


def _config(folder: Path, norm: str) -> Path:
    cfg = yaml.safe_load((SOURCE / "config.yaml").read_text())
    cfg["MODEL"]["FPN"]["NORM"] = norm
    path = folder / f"config_{norm or 'none'}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_alone_refused_naming_the_first_norm(normed_fpn):
    with pytest.raises(NorcalError) as err:
        load_model(normed_fpn / "model_final.pth")
    msg = str(err.value)
    assert msg.startswith("weight backbone.fpn_lateral2.norm.weight: ") and "\n" not in msg
    assert "GroupNorm (GN) or LayerNorm (LN)" in msg and "config" in msg


def test_a_config_saying_gn_or_ln_builds_that_norm(normed_fpn):
    weights = normed_fpn / "model_final.pth"
    models = {norm: load_model(weights, _config(normed_fpn, norm))[1] for norm in ("GN", "LN")}
    x = torch.randn(2, 64, 5, 7, generator=torch.Generator().manual_seed(0))
    for norm, model in models.items():
        layer = model.backbone.fpn_lateral2.norm
        w, b = layer.weight.detach(), layer.bias.detach()
        if norm == "GN":  # detectron2's get_norm: nn.GroupNorm(32, C)
            want = F.group_norm(x, 32, w, b, eps=1e-5)
        else:  # detectron2's LayerNorm: over the channels of each position, eps 1e-6
            want = F.layer_norm(x.permute(0, 2, 3, 1), (64,), w, b, eps=1e-6).permute(0, 3, 1, 2)
        torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)
    image = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(1)) * 255
    sizes = torch.tensor([[64, 96]])
    with torch.no_grad():
        features = {norm: model.backbone((image - model.pixel_mean) / model.pixel_std, PaddingMasks(sizes, 32))
                    for norm, model in models.items()}
    for level, (gn, ln) in enumerate(zip(features["GN"], features["LN"])):  # P2..P6
        assert (gn - ln).abs().max() > 1e-2, level



def test_a_config_without_fpn_norm_disagrees_with_the_weights(normed_fpn):
    with pytest.raises(NorcalError, match="fpn_norm.*MODEL.FPN.NORM.*config '', weights 'GN'"):
        load_model(normed_fpn / "model_final.pth", _config(normed_fpn, ""))
