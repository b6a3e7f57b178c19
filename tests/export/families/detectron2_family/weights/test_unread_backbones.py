"""detectron2 models on backbones we do not read (Swin) are refused
for their backbone, named, not as "not a detectron2 GeneralizedRCNN". The names are the real
detectron2's (tests/fixtures/backbone_keys.json.gz, made by make_backbone_keys.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from norcal.core.errors import NorcalError
from norcal.export.families.detectron2.weights.architecture import spec_from_weights

FIXTURES = Path(__file__).parents[4] / "fixtures"
MODELS = json.loads(gzip.decompress((FIXTURES / "backbone_keys.json.gz").read_bytes()))
SHOWN = {"regnetx_4gf_dds_fpn": "RegNet (backbone.bottom_up.stem.conv, backbone.bottom_up.s1.b1.*",
         "vitdet_b": "ViT (backbone.net.patch_embed, pos_embed, blocks.*: ViTDet",
         "mvitv2_t": "MViTv2 (backbone.bottom_up.blocks.*.attn.pool_q",
         "swin_b_cascade": "Swin (backbone.bottom_up.layers.*.blocks.*"}


def _state(keys) -> dict:
    return {k: torch.zeros(1) for k in keys}


# a GeneralizedRCNN on a RegNet (regnet_weights.py), ViTDet's ViT (vit_weights.py) or an MViT
# (mvit_weights.py) is read
READ = {"regnetx_4gf_dds_fpn", "vitdet_b", "mvitv2_t"}


@pytest.mark.parametrize("name", sorted(set(MODELS) - READ))
def test_unread_backbone_is_named(name):
    with pytest.raises(NorcalError) as e:
        spec_from_weights(_state(MODELS[name]["keys"]))
    msg = str(e.value)
    assert msg.startswith(f"a detectron2 GeneralizedRCNN with a {SHOWN[name]}") and "\n" not in msg
    assert "not a detectron2 GeneralizedRCNN" not in msg and "supported: GeneralizedRCNN" in msg


def test_regnet_names_with_bad_shapes_are_one_line():
    """The RegNet's names are read now: weights of the wrong rank are refused naming one, not a traceback."""
    with pytest.raises(NorcalError, match=r"^weight backbone\.bottom_up\.stem\.conv\.weight has shape \[1\]: "
                                          r"a RegNet conv weight is 4-d"):
        spec_from_weights(_state(MODELS["regnetx_4gf_dds_fpn"]["keys"]))


def test_vit_names_with_bad_shapes_are_one_line():
    """ViTDet-B's names are read now: weights of the wrong rank are refused naming one, not a traceback."""
    with pytest.raises(NorcalError, match=r"^weight backbone\.net\.patch_embed\.proj\.weight has shape \[1\]: "
                                          r"a ViT patch embedding is a 4-d"):
        spec_from_weights(_state(MODELS["vitdet_b"]["keys"]))


def test_mvit_names_with_bad_shapes_are_one_line():
    """MViTv2-T's names are read now: weights of the wrong rank are refused naming one, not a traceback."""
    with pytest.raises(NorcalError, match=r"^weight backbone\.bottom_up\.patch_embed\.proj\.weight has shape \[1\]: "
                                          r"expected 4 dimensions$"):
        spec_from_weights(_state(MODELS["mvitv2_t"]["keys"]))


def test_retinanet_on_an_unread_backbone_is_named():
    """detectron2's RetinaNet head names (the tiny RetinaNet fixture's) on RegNet's backbone names."""
    head = torch.load(FIXTURES / "d2_retinanet_tiny" / "model_final.pth", weights_only=True)["model"]
    regnet = [k for k in MODELS["regnetx_4gf_dds_fpn"]["keys"] if k.startswith("backbone.bottom_up.")]
    keys = regnet + [k for k in head if not k.startswith("backbone.bottom_up.")]
    with pytest.raises(NorcalError, match=r"^a detectron2 RetinaNet with a RegNet \(backbone\.bottom_up\.stem\.conv"):
        spec_from_weights(_state(keys))


def test_other_foreign_names_keep_their_message():
    """Names that show no detectron2 backbone still get the general explanation."""
    with pytest.raises(NorcalError, match="not a detectron2 GeneralizedRCNN"):
        spec_from_weights(_state(["proposal_generator.rpn_head.conv.weight", "backbone.foo.weight"]))
