"""detectron2's MViT (MViTv2) bottom-up, from its weights alone, against the real detectron2's
features (tests/fixtures/d2_mvit_tiny, made by make_mvit_tiny.py from the ViTDet
cascade_mask_rcnn_mvitv2_b_in21k_100ep config's bottom_up, reduced): every window padded, the
global blocks' rel-pos tables resampled, as at the config's 1024 square. Eager and exported."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import sys

import numpy as np
import onnx
import pytest
import torch

from conftest import FIXTURES, assert_tensorrt_compatible
from norcal.core.errors import NorcalError
from norcal.core.files.yaml_io import read_yaml_mapping
from norcal.export.families.checkpoints import read_checkpoint
from norcal.export.families.detectron2.weights.mvit import mvit_fields, mvit_from_lazy
from norcal.export.rcnn.modeling.build import create_model, model_from_state, random_state_dict
from norcal.export.rcnn.modeling.mvit import MViT
from norcal.export.rcnn.spec import ModelSpec, MViTSpec
from test_onnx_export import session

sys.path.insert(0, str(FIXTURES))
from make_mvit_tiny import image  # noqa: E402  (the fixture's input, as the golden was made)

FIXTURE = FIXTURES / "d2_mvit_tiny"
UP = "backbone.bottom_up."
BOUND = 1e-4  # measured: 5.0e-6 eager, 2.6e-5 ONNX Runtime; a 1% rel-pos change moves scale3 by 2.3e-3
# make_mvit_tiny.TINY over detectron2's MViT defaults and the config's eps
EXPECTED = MViTSpec(embed_dim=4, depth=8, num_heads=1, last_block_indexes=(1, 4, 6, 7), mlp_ratio=2.0,
                    norm_eps=1e-6)
SQUARED = dataclasses.replace(EXPECTED, square_pad=256)  # in a model: padded to the FPN's square


def _config() -> dict:
    return read_yaml_mapping(FIXTURE / "config.yaml", "detectron2 config", inert_python=True)


@pytest.fixture(scope="module")
def weights() -> dict:
    return read_checkpoint(FIXTURE / "model_final.pkl")


@pytest.fixture(scope="module")
def golden() -> dict:
    with np.load(FIXTURE / "features.npz") as f:
        return dict(f)


@pytest.fixture(scope="module")
def pixels() -> torch.Tensor:
    model = _config()["model"]
    return torch.from_numpy(image(model["pixel_mean"], model["pixel_std"]))


def _mvit(sd: dict) -> MViT:
    model = MViT(mvit_fields(sd, EXPECTED)["mvit"]).eval()
    model.load_state_dict({k[len(UP):]: v.float() for k, v in sd.items()})
    return model


def _max_diff(out: dict, golden: dict) -> dict:
    assert list(out) == ["scale2", "scale3", "scale4", "scale5"] and set(golden) == set(out)
    return {k: float(np.abs(np.asarray(out[k]) - golden[k]).max()) for k in out}


def test_weights_give_the_configs_mvit(weights):
    """The spec read from the weights is the one the config.yaml detectron2 saved gives."""
    spec = mvit_fields(weights, EXPECTED)["mvit"]
    assert spec == EXPECTED == mvit_from_lazy(_config()["model"]["backbone"]["bottom_up"])
    names = {k[len(UP):]: tuple(v.shape) for k, v in weights.items()}
    assert {k: tuple(v.shape) for k, v in MViT(spec).state_dict().items()} == names
    # as an FPN's bottom-up: detectron2's FPN names its levels by stride, P2..P5 from scale2..5
    fpn = create_model(ModelSpec(mvit=SQUARED, fpn_out_channels=8, mask_on=False)).backbone
    assert (fpn.in_features, fpn.in_strides) == (["scale2", "scale3", "scale4", "scale5"], [4, 8, 16, 32])


def test_real_configs_mvit_from_its_shapes():
    """The LVIS MViTv2-B config at full size: its weights' shapes (as detectron2 built them) and its
    config.yaml give the same spec, and our MViT has exactly detectron2's weights."""
    shapes = json.loads(gzip.decompress((FIXTURE / "mvitv2_b_lvis_shapes.json.gz").read_bytes()))
    sd = {k: torch.empty(v, device="meta") for k, v in shapes.items() if k.startswith(UP)}
    config = read_yaml_mapping(FIXTURE / "mvitv2_b_lvis_config.yaml", "detectron2 config", inert_python=True)
    spec = mvit_fields(sd, EXPECTED)["mvit"]
    assert spec == mvit_from_lazy(config["model"]["backbone"]["bottom_up"]) == MViTSpec(
        embed_dim=96, depth=24, num_heads=1, last_block_indexes=(1, 4, 20, 23), norm_eps=1e-6)
    with torch.device("meta"):
        ours = {UP + k: list(v.shape) for k, v in MViT(spec).state_dict().items()}
    assert ours == {k: v for k, v in shapes.items() if k.startswith(UP)}


def test_rgb_patch_embedding_reads_the_bgr_graph_input():
    """An RGB-trained MViT (the config's input_format) in a BGR graph: its patch embedding's input
    channels are reversed, as a ResNet's stem's are."""
    spec = ModelSpec(mvit=SQUARED, fpn_out_channels=8, mask_on=False, input_format="RGB")
    state = random_state_dict(spec, seed=1)
    key = UP + "patch_embed.proj.weight"
    model = model_from_state(spec, state)
    assert torch.equal(model.state_dict()[key], state[key].flip(1))


def test_features_match_detectron2(weights, golden, pixels):
    with torch.no_grad():
        out = {k: v.numpy() for k, v in _mvit(weights)(pixels).items()}
    diffs = _max_diff(out, golden)
    assert max(diffs.values()) < BOUND, diffs


def test_perturbed_rel_pos_moves_past_the_bound(weights, golden, pixels):
    """A global block's resampled rel-pos table off by 1% moves the features far past the bound."""
    sd = dict(weights)
    key = f"{UP}blocks.4.attn.rel_pos_w"
    sd[key] = sd[key].float() * 1.01
    with torch.no_grad():
        out = {k: v.numpy() for k, v in _mvit(sd)(pixels).items()}
    diffs = _max_diff(out, golden)
    # scale2 comes before block 4: within the bound as unperturbed (bitwise equal only where
    # the float kernels run the same way; 1.26e-5 was seen on a loaded machine)
    assert diffs["scale2"] < BOUND and diffs["scale3"] > 10 * BOUND, diffs


@pytest.mark.parametrize("key, dims, shown", [
    ("blocks.2.attn.pool_k.weight", (2, 1, 3, 3), "weight backbone.bottom_up.blocks.2.attn.pool_k.weight has shape "
     "[2, 1, 3, 3]; detectron2's MViT with the widths of backbone.bottom_up.blocks.0 gives [4, 1, 3, 3]"),
    ("blocks.3.attn.rel_pos_h", (27, 4), "weight backbone.bottom_up.blocks.3.attn.rel_pos_h has shape [27, 4]; "
     "detectron2's MViT defaults (img_size 224, patch stride 4, kv stride 4) give [55, 4]"),
    ("scale4_norm.weight", (32,),
     "weight backbone.bottom_up.scale4_norm.weight has shape [32]; the stage's width is 16"),
    ("blocks.0.attn.pool_q.weight", (3, 1, 3, 3), "pools 3 channels a head, which does not divide the embedding's 4"),
    ("patch_embed.proj.weight", (4, 3, 16, 16), "detectron2's MViT embeds 3 channels with a 7x7 kernel"),
])
def test_wrong_shapes_refused_naming_the_weight(weights, key, dims, shown):
    sd = dict(weights, **{UP + key: torch.zeros(dims)})
    with pytest.raises(NorcalError) as e:
        mvit_fields(sd, EXPECTED)
    assert shown in str(e.value) and "\n" not in str(e.value)


def test_what_the_weights_cannot_confirm_is_refused(weights):
    no_tables = {k: v for k, v in weights.items() if "rel_pos" not in k}
    with pytest.raises(NorcalError, match="blocks.0.attn.rel_pos_h is missing: without rel-pos tables"):
        mvit_fields(no_tables, EXPECTED)
    with pytest.raises(NorcalError, match="pos_embed: an MViT with absolute positions"):
        mvit_fields(dict(weights, **{UP + "pos_embed": torch.zeros(1, 3137, 4)}), EXPECTED)


@pytest.mark.parametrize("edit, shown", [
    ({"norm_layer": {"_python_name_": "torch.nn.modules.batchnorm.BatchNorm2d"}},
     "model.backbone.bottom_up.norm_layer: only partial(nn.LayerNorm, eps=...)"),
    ({"act_layer": {"_python_name_": "torch.nn.modules.activation.ReLU"}}, "act_layer: only nn.GELU"),
    ({"use_abs_pos": True}, "use_abs_pos: only False"),
    ({"window_size": 14}, "window_size: not an MViT argument"),
    ({"depth": "8"}, "depth: '8' is not a valid value"),
])
def test_lazy_config_departures_refused_by_path(edit, shown):
    node = dict(_config()["model"]["backbone"]["bottom_up"], **edit)
    with pytest.raises(NorcalError, match=shown.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        mvit_from_lazy(node)


def test_exported_graph_matches_detectron2(weights, golden, pixels):
    """The graph traced at the fixture's square size: ONNX Runtime gives detectron2's features, and
    TensorRT's parser takes every node (MatMuls, not einsum or Resize, for the rel-pos terms)."""
    class Outputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mvit = _mvit(weights)

        def forward(self, x):
            return tuple(self.mvit(x).values())

    buf = io.BytesIO()
    torch.onnx.export(Outputs().eval(), (pixels,), buf, opset_version=17, dynamo=False, do_constant_folding=True,
                      input_names=["images"], output_names=["scale2", "scale3", "scale4", "scale5"])
    proto = onnx.load_from_string(buf.getvalue())
    out = dict(zip(["scale2", "scale3", "scale4", "scale5"], session(proto).run(None, {"images": pixels.numpy()})))
    diffs = _max_diff(out, golden)
    assert max(diffs.values()) < BOUND, diffs
    assert_tensorrt_compatible(proto)
    ops = {n.op_type for n in proto.graph.node}
    assert not ops & {"Loop", "If", "Scan", "Einsum", "Resize"}, ops


def test_partial_tags_are_read_as_data(tmp_path):
    """config.yaml's functools.partial (how LazyConfig.save writes norm_layer) is data: what it names
    is neither imported nor called; other calls stay refused."""
    path = tmp_path / "config.yaml"
    path.write_text("f: !!python/object/apply:functools.partial\n"
                    "  args: [&id001 !!python/name:antigravity.geohash '']\n"
                    "  state: !!python/tuple [*id001, !!python/tuple [1], {eps: 2}, null]\n")
    data = read_yaml_mapping(path, "detectron2 config", inert_python=True)
    assert "antigravity" not in sys.modules
    assert data == {"f": {"_python_apply_": "functools.partial", "args": [{"_python_name_": "antigravity.geohash"}],
                          "state": [{"_python_name_": "antigravity.geohash"}, [1], {"eps": 2}, None]}}
    path.write_text("f: !!python/object/apply:antigravity.geohash [1, 2, 3]\n")
    with pytest.raises(NorcalError, match="not valid YAML: could not determine a constructor"):
        read_yaml_mapping(path, "detectron2 config", inert_python=True)
