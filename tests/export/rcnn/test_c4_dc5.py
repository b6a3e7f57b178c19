"""C4 (Mask R-CNN, Res5ROIHeads) and DC5 (Faster R-CNN, dilated res5) against the real
detectron2's goldens (tests/fixtures/d2_c4_tiny, d2_dc5_tiny): eager PyTorch and ONNX Runtime,
all three fixture images in one zero-padded batch, at every NorCal setting of the fixtures.

detectron2 runs these models on each image unpadded (the backbone's size divisibility is 0),
so the batch also tests that the graph masks each image back to its own extent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import golden as G
from golden import manifest_table
from conftest import FIXTURES, assert_tensorrt_compatible
from norcal.core.calibration.formula import log_prior
from norcal.export.graph.calibrate import calibrate_graph
from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.rcnn.modeling.build import model_from_state
from norcal.export.rcnn.onnx_export import export_onnx
from norcal.export.rcnn.spec import RES5_ROI_HEADS, RESNET_BACKBONE, STANDARD_ROI_HEADS, arch_name
from norcal.export.trt_check.support import TOPK_K_LIMIT
from test_onnx_export import run, session

pytestmark = pytest.mark.slow  # exports and golden parity of two more architectures

torch.set_num_threads(2)

ARCHS = {"c4": FIXTURES / "d2_c4_tiny", "dc5": FIXTURES / "d2_dc5_tiny"}
IMAGES = range(3)
# spec fields that only the host reads (resize), or that record where values came from
HOST_ONLY = {"min_size_test", "max_size_test", "provenance"}


def _paths(arch: str) -> tuple[Path, Path]:
    return ARCHS[arch] / "model_final.pth", ARCHS[arch] / "config.yaml"


class Arch:
    """One fixture's model, exported graph and cached outputs (each computed once)."""

    def __init__(self, fixture: Path):
        self.fixture = fixture
        self.spec, state = load_detector_spec(fixture / "model_final.pth", fixture / "config.yaml")
        self.model = model_from_state(self.spec, state)
        self.images, self.sizes = G.batch(IMAGES, fixture=self.fixture)
        self.eager: dict[str, dict] = {}
        self._fronts: dict = {}  # the backbone and proposals, shared by the settings
        self.ort: dict[str, dict] = {}
        self._onnx = None

    @property
    def onnx(self) -> onnx.ModelProto:
        if self._onnx is None:
            self._onnx = export_onnx(self.model, self.spec)
        return self._onnx

    def eager_outputs(self, setting: str) -> dict:
        if setting not in self.eager:
            factor, gamma = G.GAMMAS[setting]
            prior = None if gamma == 0 else log_prior(manifest_table(self.fixture).counts(), gamma, factor)
            self.eager[setting] = G.eager_at_prior(self.model, self.images, self.sizes, prior,
                                                   setting == "baseline", self._fronts)
        return self.eager[setting]

    def calibrated(self, setting: str) -> onnx.ModelProto:
        factor, gamma = G.GAMMAS[setting]
        if gamma == 0:
            return self.onnx
        return calibrate_graph(self.onnx, gamma, manifest_table(self.fixture), factor=factor)

    def ort_outputs(self, setting: str) -> dict:
        if setting not in self.ort:
            self.ort[setting] = run(session(self.calibrated(setting)), self.images, self.sizes)
        return self.ort[setting]


_ARCHS: dict[str, Arch] = {}


@pytest.fixture(scope="module", params=list(ARCHS))
def arch(request) -> Arch:
    if request.param not in _ARCHS:
        _ARCHS[request.param] = Arch(ARCHS[request.param])
    return _ARCHS[request.param]


def check_detections(out: dict, setting: str, fixture: Path, images=IMAGES) -> None:
    """>= 99% of golden detections matched (class, IoU >= 0.99, |score diff| <= 1e-4), mask
    probabilities within MASK_TOL_GOLDEN everywhere, beyond the goldens' float16 rounding, where
    the model has masks, zero padding past the count."""
    for b, k in enumerate(images):
        g = G.golden(k, fixture)
        n = int(out["num_detections"][b])
        assert n == len(g[f"{setting}/scores"]), f"img{k}: {n} detections"
        frac, pairs = G.match_detections(
            g[f"{setting}/boxes"], g[f"{setting}/scores"], g[f"{setting}/classes"],
            out["boxes"][b, :n], out["scores"][b, :n], out["classes"][b, :n])
        assert frac >= 0.99, f"img{k} {setting}: only {frac:.3f} matched"
        names = ["boxes", "scores", "classes"]
        if f"{setting}/mask_probs" in g:
            gi, oi = zip(*pairs)
            ours, gm = out["masks"][b][list(oi)], g[f"{setting}/mask_probs"][list(gi)]
            diff = G.mask_error_beyond_storage(ours, gm)
            assert diff <= G.MASK_TOL_GOLDEN, (f"img{k} {setting}", diff)
            names.append("masks")
        else:
            assert "masks" not in out
        for name in names:
            assert not out[name][b, n:].any(), f"{name} not zero-padded"


# ---------------------------------------------------------------- what the configs say

def test_configs_give_c4_and_dc5_specs():
    c4, _ = load_detector_spec(*_paths("c4"))
    assert (arch_name(c4), c4.backbone_name, c4.backbone_out_feature) == ("C4", RESNET_BACKBONE, "res4")
    assert (c4.roi_heads_name, c4.pooler_resolution, c4.mask_pooler_resolution) == (RES5_ROI_HEADS, 14, 14)
    assert (c4.rpn_pre_nms_topk_test, c4.anchor_sizes) == (6000, ((32, 64, 128, 256, 512),))
    dc5, _ = load_detector_spec(*_paths("dc5"))
    assert (arch_name(dc5), dc5.backbone_out_feature, dc5.res5_dilation) == ("DC5", "res5", 2)
    assert (dc5.roi_heads_name, dc5.pooler_resolution, dc5.mask_on) == (STANDARD_ROI_HEADS, 7, False)


@pytest.mark.parametrize("name", list(ARCHS))
def test_weights_alone_give_the_config_model(name):
    """Without a config the inferred spec builds the same model: every field the model reads
    equals the config's, the assumptions are recorded, and the fixture's weights load strictly."""
    weights, config = _paths(name)
    inferred, state = load_detector_spec(weights, classifier="softmax")  # the weights cannot tell
    configured, _ = load_detector_spec(weights, config)
    unused = {f for f in configured.__dataclass_fields__ if f.startswith("fpn_")}  # no FPN
    if name == "c4":  # no box head
        unused |= {f for f in configured.__dataclass_fields__ if f.startswith("box_head_")}
    if not configured.mask_on:
        unused |= {f for f in configured.__dataclass_fields__ if f.startswith("mask_")}
    for field in configured.__dataclass_fields__:
        if field not in HOST_ONLY | unused:
            assert getattr(inferred, field) == getattr(configured, field), field
    assert inferred.provenance["source"] == "inferred from weights"
    assert "assumed" in inferred.provenance["anchor_sizes"]
    key = "pooler_resolution" if name == "c4" else "res5_dilation"
    assert "assumed" in inferred.provenance[key]
    model_from_state(inferred, state)


@pytest.mark.parametrize("fixture", ["d2_c4_tiny", "d2_dc5_tiny", "d2_cascade_tiny", "d2_retinanet_tiny"])
def test_state_dict_names_are_detectron2s(fixture):
    """Our model's parameter names and shapes are those of detectron2's checkpoint, for every
    architecture beyond the FPN R-CNN."""
    from norcal.export.rcnn.modeling.build import random_state_dict

    spec, ref = load_detector_spec(FIXTURES / fixture / "model_final.pth", FIXTURES / fixture / "config.yaml")
    ours = random_state_dict(spec, seed=0)
    assert set(ours) == set(ref)
    assert all(tuple(ours[k].shape) == tuple(ref[k].shape) for k in ref)


# ---------------------------------------------------------------- eager PyTorch

def test_proposals_match_golden(arch):
    out = arch.eager_outputs("baseline")
    for b, k in enumerate(IMAGES):
        g = G.golden(k, arch.fixture)
        ours = out["proposals"][b][out["proposal_valid"][b]]
        assert len(ours) == len(g["proposal_boxes"])
        assert G.match_boxes(g["proposal_boxes"], ours, 0.999) >= 0.99, f"img{k}"


def test_box_predictor_logits_match_golden_img0(arch):
    out = arch.eager_outputs("baseline")
    g = G.golden(0, arch.fixture)
    j = G.box_iou(g["proposal_boxes"], out["proposals"][0]).argmax(1)
    assert np.abs(out["cls_logits"][0][j] - g["cls_logits"]).max() <= 1e-3


@pytest.mark.parametrize("setting", G.SETTINGS)
def test_eager_detections_match_golden(arch, setting):
    check_detections(arch.eager_outputs(setting), setting, arch.fixture)


# ---------------------------------------------------------------- ONNX

def test_graph_contract_and_tensorrt_check(arch):
    g = arch.onnx.graph
    assert [i.name for i in g.input] == ["images", "image_sizes"]
    outputs = ["num_detections", "boxes", "scores", "classes"] + (["masks"] if arch.spec.mask_on else [])
    assert [o.name for o in g.output] == outputs
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in g.output}
    assert dims["boxes"] == ["batch", 300, 4]
    if arch.spec.mask_on:  # C4's res5 halves the 14x14 pool, the deconv doubles it back
        assert dims["masks"] == ["batch", 300, 14, 14]
    nodes = list(arch.onnx.graph.node)
    assert not {n.op_type for n in nodes} & {"Loop", "If", "Scan"}
    # 6000 anchors before NMS are taken by TopKs TensorRT accepts (K < 3840)
    assert len([n for n in nodes if n.op_type == "TopK"]) >= 3
    assert_tensorrt_compatible(arch.onnx)
    assert_tensorrt_compatible(arch.calibrated("cdt_g0.5"))
    assert len([n for n in nodes if n.op_type == "RoiAlign"]) == (2 if arch.spec.mask_on else 1)


def test_pre_nms_topk_stays_below_tensorrt_limit(arch):
    from norcal.export.trt_check import check_model
    report = check_model(arch.onnx)
    assert not [f for f in report.findings if f.op_type == "TopK"]
    assert arch.spec.rpn_pre_nms_topk_test >= TOPK_K_LIMIT  # so the steps are needed


@pytest.mark.parametrize("setting", G.SETTINGS)
def test_onnxruntime_batch_matches_golden(arch, setting):
    check_detections(arch.ort_outputs(setting), setting, arch.fixture)


def test_image_alone_equals_image_in_a_larger_batch(arch):
    """img0 (320x427) alone, padded to 320x448, vs in the batch padded to 427x480 by larger ones."""
    batched = arch.ort_outputs("baseline")
    images, sizes = G.batch([0], fixture=arch.fixture)
    assert images.shape[-2:] != arch.images.shape[-2:]
    G.assert_same_first_image(run(session(arch.onnx), images, sizes), batched, arch.spec.mask_on)


def test_weights_only_export_matches_golden_img0(arch):
    """The config-less path, exported and run: img0 at the baseline setting."""
    spec, state = load_detector_spec(arch.fixture / "model_final.pth", classifier="softmax")
    proto = export_onnx(model_from_state(spec, state), spec, batch=1, height=320, width=448)
    assert_tensorrt_compatible(proto)
    images, sizes = G.batch([0], fixture=arch.fixture)
    check_detections(run(session(proto), images, sizes), "baseline", arch.fixture, images=[0])


def test_batch_of_one_at_a_dynamic_size_matches_golden_img0(arch):
    """A batch-1 export at a dynamic size: the host pads img0 (320x427) to 320x448, padding
    detectron2 never adds for these backbones (size divisibility 0), so the graph must mask it
    back as a batch's. It was exported without masks: ~57% of img0's detections moved."""
    proto = export_onnx(arch.model, arch.spec, batch=1)
    images, sizes = G.batch([0], fixture=arch.fixture)
    assert images.shape[-1] == 448 and sizes[0, 1] == 427
    check_detections(run(session(proto), images, sizes), "baseline", arch.fixture, images=[0])


def test_topk_in_steps_equals_one_topk():
    from norcal.export.rcnn.modeling.rpn import topk_in_steps

    gen = torch.Generator().manual_seed(0)
    x = torch.randn((2, 9000), generator=gen)
    x[1, 5000:] = float("-inf")  # fewer real candidates than k, as on a small image
    want_v, want_i = x.topk(6000, dim=1)
    got_v, got_i = topk_in_steps(x, 6000, step=2500)  # three TopKs: 2500, 2500, 1000
    assert torch.equal(got_v, want_v)
    assert torch.equal(got_i[0], want_i[0]) and torch.equal(got_i[1, :5000], want_i[1, :5000])
    assert len(set(got_i[0].tolist())) == 6000  # no index taken twice among real values
