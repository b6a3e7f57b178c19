"""RegNetX / RegNetY FPN Mask R-CNNs (detectron2's ``configs/new_baselines/mask_rcnn_regnet{x,y}_4gf_dds_FPN_100ep_LSJ.py``)
from their checkpoints alone, against the real detectron2's goldens (tests/fixtures/d2_regnet{x,y}_tiny):
the exported graph in ONNX Runtime, all three fixture images in one zero-padded batch, at gamma 0 and 0.5.

The checkpoint does not hold the config's test settings, so the tests give them as the
fixtures' config.yaml does; nor its pixel_std (detectron2 keeps pixel_mean/std out of the state
dict), which a RegNet's weights imply: every detectron2 RegNet config sets the same. With the
fixtures' config.yaml (detectron2's LazyConfig.save, read as data) the RegNet's stages are
computed from its design-space parameters and checked against the weights.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import golden as G
from conftest import FIXTURES, assert_tensorrt_compatible
from norcal.core.errors import NorcalError
from norcal.export.families.checkpoints import read_checkpoint
from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.rcnn.modeling.build import model_from_state, random_state_dict
from norcal.export.rcnn.modeling.layers import PaddingMasks
from norcal.export.rcnn.onnx_export import export_onnx
from norcal.export.rcnn.spec import RegNetSpec, arch_name, architecture_label
from test_c4_dc5 import Arch, check_detections
from test_onnx_export import run, session

FIXTURE = {"x": FIXTURES / "d2_regnetx_tiny", "y": FIXTURES / "d2_regnety_tiny"}
IMAGES = range(3)
SETTINGS = ("baseline", "cdt_g0.5")  # gamma 0 and 0.5
# the fixtures' config.yaml (test_topk_per_image), which the checkpoint cannot tell; nor its softmax box
# classifier (USE_SIGMOID_CE false), which the loader is given
CLASSIFIER = "softmax"
FROM_CONFIG = dict(detections_per_image=100)
# detectron2's RegNet(depth=5, w_0=8, w_a=12, w_m=2, stem_width=16): generate_regnet_parameters
# and adjust_block_compatibility give widths 8/16/32/64 and depths 1/1/2/1; group widths are
# min(group_width, width); RegNetY's SE width is round(0.25 * the block's input width)
EXPECTED = {
    "x": RegNetSpec(stem_width=16, depths=(1, 1, 2, 1), widths=(8, 16, 32, 64), bottleneck_widths=(8, 16, 32, 64),
                    group_widths=(8, 8, 8, 8), se_widths=((0,), (0,), (0, 0), (0,))),
    "y": RegNetSpec(stem_width=16, depths=(1, 1, 2, 1), widths=(8, 16, 32, 64), bottleneck_widths=(8, 16, 32, 64),
                    group_widths=(8, 16, 16, 16), se_widths=((4,), (2,), (4, 8), (8,))),
}


class Case(Arch):
    """test_c4_dc5's Arch (model, exported graph, cached outputs) from the checkpoint alone, with
    what the config gives and the checkpoint cannot (FROM_CONFIG)."""

    def __init__(self, fixture: Path):
        self.fixture = fixture
        spec, state = load_detector_spec(fixture / "model_final.pth", classifier=CLASSIFIER)
        self.spec = dataclasses.replace(spec, **FROM_CONFIG)
        self.model = model_from_state(self.spec, state)
        self.images, self.sizes = G.batch(IMAGES, fixture=fixture)
        self.eager, self.ort, self._onnx = {}, {}, None


_CASES: dict[str, Case] = {}


def _case(kind: str) -> Case:
    """Each fixture's Case, built once for the module's tests."""
    if kind not in _CASES:
        _CASES[kind] = Case(FIXTURE[kind])
    return _CASES[kind]


@pytest.fixture(scope="module", params=list(FIXTURE))
def case(request) -> Case:
    return _case(request.param)


@pytest.mark.parametrize("kind", list(FIXTURE))
def test_weights_give_detectron2s_regnet(kind):
    spec, state = load_detector_spec(FIXTURE[kind] / "model_final.pth", classifier=CLASSIFIER)
    assert spec.regnet == EXPECTED[kind]
    assert (arch_name(spec), spec.norm, spec.fpn_norm, spec.box_head_norm, spec.mask_head_norm) == \
        ("FPN", "BN", "BN", "BN", "BN")  # SyncBN / NaiveSyncBatchNorm: BN at inference
    assert architecture_label(spec) == f"RegNet{kind.upper()}-FPN"  # the export summary's, not "R50-FPN"
    assert (spec.rpn_conv_dims, spec.box_head_num_conv, spec.box_head_num_fc, spec.num_classes) == ((-1, -1), 4, 1, 8)
    config = (FIXTURE[kind] / "config.yaml").read_text()  # detectron2's LazyConfig.save
    std = re.search(r"^  pixel_std: \[(.*)\]$", config, re.M)[1]
    assert spec.pixel_std == tuple(float(v) for v in std.split(","))
    assert "assumed" in spec.provenance["pixel_mean/std"] and "RegNet" in spec.provenance["pixel_mean/std"]
    raw = read_checkpoint(FIXTURE[kind] / "model_final.pth")  # with BN's counters
    ours = random_state_dict(spec, seed=0)  # our module names and shapes are detectron2's
    assert set(ours) == set(raw) and all(tuple(ours[k].shape) == tuple(raw[k].shape) for k in raw)


@pytest.mark.parametrize("setting", SETTINGS)
def test_onnxruntime_batch_matches_golden(case, setting):
    check_detections(case.ort_outputs(setting), setting, case.fixture)


def test_image_alone_equals_image_in_a_larger_batch(case):
    """img0 (320x427) alone, padded to 320x448, vs in the batch padded to 427x480 by larger ones."""
    images, sizes = G.batch([0], fixture=case.fixture)
    assert images.shape[-2:] != case.images.shape[-2:]
    G.assert_same_first_image(run(session(case.onnx), images, sizes), case.ort_outputs("baseline"), masks=True)


def test_tensorrt_parser_check(case):
    assert_tensorrt_compatible(case.onnx)
    assert_tensorrt_compatible(case.calibrated("cdt_g0.5"))
    ops = {n.op_type for n in case.onnx.graph.node}
    assert not ops & {"Loop", "If", "Scan"}


def test_squeeze_excitation_averages_each_image_alone():
    """RegNetY's SE averages each image's own map: img0 in a batch padded by larger images gives
    the bottom-up features it gives alone. Averaged over the batch's padded map instead, they move."""
    from norcal.export.rcnn.modeling import regnet

    c = _case("y")
    bottom_up = c.model.backbone.bottom_up

    def features(idx):
        images, sizes = G.batch(idx, fixture=c.fixture)
        masks = PaddingMasks(torch.from_numpy(sizes), 32)
        x = masks.apply_image((torch.from_numpy(images) - c.model.pixel_mean) / c.model.pixel_std)
        with torch.no_grad():
            out = bottom_up(x, masks)["s4"]
        return out[0, :, :10, :14]  # img0's own extent at stride 32 (320x448)

    alone = features([0])
    scale = float(alone.abs().max())
    assert float((features([0, 1, 2]) - alone).abs().max()) <= 1e-5 * scale
    forward = regnet.SE.forward
    try:
        regnet.SE.forward = lambda self, x, mask: forward(self, x, None)
        assert float((features([0, 1, 2]) - alone).abs().max()) > 1e-2 * scale
    finally:
        regnet.SE.forward = forward


def _with(state: dict, **changes) -> dict:
    out = dict(state)
    for k, v in changes.items():
        if v is None:
            out.pop(k)
        else:
            out[k] = v
    return out


def test_unsupported_regnets_are_refused():
    from norcal.export.families.detectron2.weights.architecture import spec_from_weights

    _, sd = load_detector_spec(FIXTURE["y"] / "model_final.pth", classifier=CLASSIFIER)
    stem = "backbone.bottom_up.stem.conv.weight"
    with pytest.raises(NorcalError, match="7x7 kernel: only RegNet's SimpleStem"):
        spec_from_weights(_with(sd, **{stem: torch.zeros(16, 3, 7, 7)}))
    s4 = [k for k in sd if k.startswith("backbone.bottom_up.s4.")]
    with pytest.raises(NorcalError, match=r"has 3 stages \(s1..s3\); the FPN reads exactly 4"):
        spec_from_weights(_with(sd, **{k: None for k in s4}))
    with pytest.raises(NorcalError, match="only RegNet's ResBottleneckBlock"):
        spec_from_weights(_with(sd, **{"backbone.bottom_up.s2.b1.f.c.weight": None}))
    with pytest.raises(NorcalError, match="differs in width from backbone.bottom_up.s3.b1"):
        spec_from_weights(_with(sd, **{"backbone.bottom_up.s3.b2.f.c.weight": torch.zeros(16, 32, 1, 1)}))


def test_unmasked_graph_matches_golden():
    """Where no image has padding beyond its own multiple of 32 the graph runs without masks, so
    RegNetY's SE averages the whole map: a batch-1 export at img0's padded size (320x448). (A
    padding-switch export holds this backbone and the masked one, each tested here.)"""
    c = _case("y")
    fixed = export_onnx(c.model, c.spec, batch=1, height=320, width=448)
    assert_tensorrt_compatible(fixed)
    images, sizes = G.batch([0], fixture=c.fixture)
    check_detections(run(session(fixed), images, sizes), "baseline", c.fixture, images=[0])


@pytest.mark.parametrize("kind", list(FIXTURE))
def test_with_its_config_yaml_matches_golden(kind):
    """The checkpoint with its config.yaml: the RegNet computed from depth / w_a / w_0 / w_m /
    group_width / se_ratio is the weights', the test settings come from the file, and the export
    gives detectron2's detections (img0, gamma 0)."""
    fixture = FIXTURE[kind]
    spec, state = load_detector_spec(fixture / "model_final.pth", fixture / "config.yaml")
    assert spec.regnet == EXPECTED[kind] and spec.provenance["source"].startswith("LazyConfig")
    assert (spec.detections_per_image, spec.use_sigmoid_ce, spec.score_thresh_test) == (100, False, 1e-4)
    assert (spec.min_size_test, spec.max_size_test, spec.norm) == (320, 512, "SyncBN")
    graph = export_onnx(model_from_state(spec, state), spec)
    images, sizes = G.batch([0], fixture=fixture)
    check_detections(run(session(graph), images, sizes), "baseline", fixture, images=[0])


def test_config_disagreeing_with_weights_is_refused():
    """RegNetX's config (group width 8 throughout) with RegNetY's weights (group width 16 from s2)."""
    config, weights = FIXTURE["x"] / "config.yaml", FIXTURE["y"] / "model_final.pth"
    with pytest.raises(NorcalError) as e:
        load_detector_spec(weights, config)
    assert str(e.value) == (f"{config} and {weights} disagree on regnet.group_widths (model.backbone.bottom_up "
                            "(RegNet)): config (8, 8, 8, 8), weights (8, 16, 16, 16)")
