"""Our export-friendly Mask R-CNN against the real detectron2's golden outputs (d2_lvis_tiny).

All four fixture images run as ONE zero-padded batch with per-image sizes, so these tests
also prove the batched graph equals detectron2's one-image-at-a-time inference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision

import golden as G
from norcal.core.calibration.formula import log_prior
from norcal.core.errors import NorcalError
from norcal.export.rcnn.modeling.box_coder import BoxCoder, clip_boxes
from norcal.export.rcnn.modeling.build import model_from_state, create_model, random_state_dict
from norcal.export.pytorch.ops import non_max_suppression
from norcal.export.rcnn.modeling.poolers import assign_boxes_to_levels
from norcal.export.rcnn.spec import ModelSpec

pytestmark = pytest.mark.slow  # the detectron2-compatible model on every golden setting

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def model():
    return model_from_state(G.tiny_spec(), G.tiny_state_dict())


@pytest.fixture(scope="module")
def fixture_batch():
    images, sizes = G.batch(range(4))
    return torch.from_numpy(images), torch.from_numpy(sizes)


_cache: dict[str, dict] = {}
_fronts: dict = {}  # the backbone and proposals, shared by the settings


def run_setting(model, fixture_batch, setting: str) -> dict:
    """Eager outputs (numpy) for the whole batch at one NorCal setting, computed once."""
    if setting not in _cache:
        factor, gamma = G.GAMMAS[setting]
        prior = None if gamma == 0 else log_prior(G.lvis_counts(), gamma, factor)
        _cache[setting] = G.eager_at_prior(model, *fixture_batch, prior, setting == "baseline", _fronts)
    return _cache[setting]


def test_golden_resize_matches_detectron2_shapes():
    for k in range(4):
        g = G.golden(k)
        assert G.load_bgr_resized(k).shape[:2] == tuple(g["resized_chw"][1:])


def test_proposals_match_golden(model, fixture_batch):
    out = run_setting(model, fixture_batch, "baseline")
    for k in range(4):
        g = G.golden(k)
        ours = out["proposals"][k][out["proposal_valid"][k]]
        assert len(ours) == len(g["proposal_boxes"])
        assert G.match_boxes(g["proposal_boxes"], ours, 0.999) >= 0.99, f"img{k}"


def test_box_predictor_outputs_match_golden_img0(model, fixture_batch):
    out = run_setting(model, fixture_batch, "baseline")
    g = G.golden(0)
    # pair proposals by box (their order can differ where objectness logits tie)
    j = G.box_iou(g["proposal_boxes"], out["proposals"][0]).argmax(1)
    assert np.abs(out["cls_logits"][0][j] - g["cls_logits"]).max() <= 1e-3
    assert np.abs(out["box_deltas"][0][j] - g["box_deltas"]).max() <= 1e-3


def check_detections(out: dict, setting: str) -> None:
    """>= 99% of golden detections matched (class, IoU >= 0.99, |score diff| <= 1e-4); mask
    probabilities within MASK_TOL_GOLDEN everywhere, beyond the goldens' float16 rounding; zero
    padding past num_detections."""
    for k in range(4):
        g = G.golden(k)
        n = int(out["num_detections"][k])
        assert n == len(g[f"{setting}/scores"]), f"img{k}: {n} detections"
        frac, pairs = G.match_detections(
            g[f"{setting}/boxes"], g[f"{setting}/scores"], g[f"{setting}/classes"],
            out["boxes"][k, :n], out["scores"][k, :n], out["classes"][k, :n])
        assert frac >= 0.99, f"img{k} {setting}: only {frac:.3f} matched"
        gi, oi = zip(*pairs)
        ours, gm = out["masks"][k][list(oi)], g[f"{setting}/mask_probs"][list(gi)]
        diff = G.mask_error_beyond_storage(ours, gm)
        assert diff <= G.MASK_TOL_GOLDEN, (f"img{k} {setting}", diff)
        for name in ("boxes", "scores", "classes", "masks"):
            assert not out[name][k, n:].any(), f"{name} not zero-padded"


@pytest.mark.parametrize("setting", G.SETTINGS)
def test_detections_match_golden(model, fixture_batch, setting):
    check_detections(run_setting(model, fixture_batch, setting), setting)


def test_norcal_moves_detections_to_rarer_classes(model, fixture_batch):
    counts = G.lvis_counts()
    base = run_setting(model, fixture_batch, "baseline")
    cal = run_setting(model, fixture_batch, "cdt_g1.0")
    # mean log training count of the top-100 detections per image drops
    n_base = np.log(counts[base["classes"][:, :100]]).mean()
    n_cal = np.log(counts[cal["classes"][:, :100]]).mean()
    assert n_cal < n_base - 0.1


def test_state_dict_names_are_detectron2s():
    # the fixture was saved by detectron2 itself: same key set, same shapes
    ref = G.tiny_state_dict()
    ours = random_state_dict(G.tiny_spec(), seed=0)
    assert set(ours) == set(ref)
    assert all(tuple(ours[k].shape) == tuple(ref[k].shape) for k in ref)


def test_strict_loading_names_the_offending_keys():
    sd = dict(G.tiny_state_dict())
    sd.pop("roi_heads.mask_head.deconv.weight")
    sd["roi_heads.extra.weight"] = torch.zeros(1)
    with pytest.raises(NorcalError, match="mask_head.deconv.weight.*extra.weight"):
        model_from_state(G.tiny_spec(), sd)
    sd = dict(G.tiny_state_dict())
    sd["backbone.fpn_lateral2.weight"] = torch.zeros(3, 3, 1, 1)
    with pytest.raises(NorcalError, match=r"fpn_lateral2.weight \(3, 3, 1, 1\)"):
        model_from_state(G.tiny_spec(), sd)


def test_numpy_state_dict_loads_like_a_model_zoo_pkl(model):
    sd = {k: v.numpy() for k, v in G.tiny_state_dict().items()}
    m = model_from_state(G.tiny_spec(), sd)
    w = m.roi_heads.box_predictor.cls_score.weight
    assert torch.equal(w, model.roi_heads.box_predictor.cls_score.weight)


def test_d2_config_spec_builds_the_fixture():
    from norcal.export.families.detectron2.yacs_config import spec as d2_config

    spec = d2_config.load_config(G.FIXTURE / "config.yaml")
    model_from_state(spec, G.tiny_state_dict())  # strict: any architecture mismatch raises


@pytest.mark.parametrize("depth,norm,groups,width", [(18, "BN", 1, 64), (34, "FrozenBN", 1, 64),
                                                     (101, "GN", 32, 8), (152, "FrozenBN", 1, 64)])
def test_backbone_variants_have_detectron2_shapes(depth, norm, groups, width):
    """Block counts and widths of detectron2's ResNets: res4 blocks and res5 output channels."""
    spec = ModelSpec(depth=depth, norm=norm, num_groups=groups, width_per_group=width,
                     res2_out_channels=64 if depth < 50 else 256, num_classes=3)
    sd = random_state_dict(spec, seed=1)
    res4 = {int(k.split(".")[3]) for k in sd if ".res4." in k}
    assert len(res4) == {18: 2, 34: 6, 101: 23, 152: 36}[depth]
    c5 = sd["backbone.fpn_lateral5.weight"].shape[1]
    assert c5 == (512 if depth < 50 else 2048)
    if depth >= 50:  # ResNeXt 32x8d: bottleneck width 32*8 = 256 at res2
        assert sd["backbone.bottom_up.res2.0.conv2.weight"].shape == (groups * width, width, 3, 3)
    if norm == "BN":
        assert "backbone.bottom_up.stem.conv1.norm.num_batches_tracked" in sd
    if norm == "GN":
        assert not any("running_mean" in k for k in sd)


def test_box_coder_matches_hand_computed_values():
    coder = BoxCoder((10.0, 10.0, 5.0, 5.0))
    box = torch.tensor([[10.0, 20.0, 30.0, 60.0]])  # w 20, h 40, centre (20, 40)
    d = torch.tensor([[1.0, -2.0, 5.0 * math.log(2.0), 0.0]])
    out = coder.decode(d, box)[0, 0]
    # ctr (20 + 0.1*20, 40 - 0.2*40) = (22, 32); w 40, h 40
    assert torch.allclose(out, torch.tensor([2.0, 12.0, 42.0, 52.0]))
    # dw capped at log(1000/16): the width grows 62.5x, not e^100
    big = coder.decode(torch.tensor([[0.0, 0.0, 500.0, 0.0]]), box)[0, 0]
    assert torch.isclose(big[2] - big[0], torch.tensor(20.0 * 62.5))
    clipped = clip_boxes(torch.tensor([[[-5.0, 3.0, 50.0, 90.0]]]), torch.tensor([[80, 40]]))
    assert clipped.tolist() == [[[0.0, 3.0, 40.0, 80.0]]]


def test_fpn_levels_follow_the_fpn_paper():
    def box(side):
        return [0.0, 0.0, side, side]
    boxes = torch.tensor([box(224), box(112), box(448), box(223.9), box(10), box(2000), box(0)])
    lv = assign_boxes_to_levels(boxes, 2, 5).tolist()
    assert lv == [2, 1, 3, 1, 0, 3, 0]  # P4, P3, P5, P3, P2 (clamped), P5 (clamped), P2


def test_nms_op_equals_torchvision_batched_nms():
    gen = torch.Generator().manual_seed(0)
    n, c, r = 2, 5, 200
    xy = torch.rand((n, r, 2), generator=gen) * 100
    wh = torch.rand((n, r, 2), generator=gen) * 40 + 1
    boxes = torch.cat([xy, xy + wh], -1)
    scores = torch.rand((n, c, r), generator=gen)
    sel = non_max_suppression(boxes, scores, 1000, 0.5, 0.3)
    for b in range(n):
        ci, ri = torch.nonzero(scores[b] > 0.3, as_tuple=True)
        keep = torchvision.ops.batched_nms(boxes[b, ri], scores[b, ci, ri], ci, 0.5)
        want = {(int(ci[i]), int(ri[i])) for i in keep}
        got = {(int(x[1]), int(x[2])) for x in sel if int(x[0]) == b}
        assert got == want
    capped = non_max_suppression(boxes, scores, 3, 0.5, 0.3)
    per = torch.bincount(capped[:, 0] * c + capped[:, 1])
    assert int(per.max()) == 3


@pytest.mark.parametrize("limit", [1, 7, 40])
def test_nms_op_cap_keeps_torchvisions_first_kept_boxes(limit):
    # thousands of candidates per class, few kept (the cap): the op stops early, and must keep
    # exactly the first ``limit`` of torchvision's full NMS, tied scores (quantized) included
    gen = torch.Generator().manual_seed(1)
    n, c, r = 2, 3, 3000
    xy = torch.rand((n, r, 2), generator=gen) * 300
    wh = torch.rand((n, r, 2), generator=gen) * 120 + 1
    boxes = torch.cat([xy, xy + wh], -1)
    scores = torch.round(torch.rand((n, c, r), generator=gen) * 40) / 40
    sel = non_max_suppression(boxes, scores, limit, 0.45, 0.1)
    for b in range(n):
        for k in range(c):
            cand = torch.nonzero(scores[b, k] > 0.1, as_tuple=True)[0]
            want = cand[torchvision.ops.nms(boxes[b, cand], scores[b, k, cand], 0.45)[:limit]]
            got = sel[(sel[:, 0] == b) & (sel[:, 1] == k), 2]
            assert sorted(got.tolist()) == sorted(want.tolist())


def test_bad_spec_is_a_clear_error():
    with pytest.raises(NorcalError, match="depth 42"):
        create_model(ModelSpec(depth=42))
    with pytest.raises(NorcalError, match="norm 'XN'"):
        create_model(ModelSpec(norm="XN"))
    with pytest.raises(NorcalError, match=r"log prior has shape \(5,\)"):
        create_model(G.tiny_spec()).roi_heads.box_predictor.set_log_prior(np.zeros(5))


def agnostic_model():
    """The fixture with class-agnostic box regression and masks (class 0's weights)."""
    spec = G.tiny_spec()
    spec.cls_agnostic_bbox_reg = True
    spec.cls_agnostic_mask = True
    sd = dict(G.tiny_state_dict())
    for k in ("roi_heads.box_predictor.bbox_pred.weight", "roi_heads.box_predictor.bbox_pred.bias"):
        sd[k] = sd[k][:4]
    for k in ("roi_heads.mask_head.predictor.weight", "roi_heads.mask_head.predictor.bias"):
        sd[k] = sd[k][:1]
    return spec, model_from_state(spec, sd)


@pytest.mark.parametrize("agnostic", [False, True], ids=["class-specific", "agnostic"])
def test_batched_postprocess_equals_detectron2_per_image_algorithm(model, fixture_batch, agnostic):
    """Our fixed-size batched inference vs detectron2's list-based per-image algorithm run on
    the same box-head outputs."""
    if agnostic:
        images, sizes = G.batch([0, 3])
        with torch.no_grad():
            out = agnostic_model()[1].inference(torch.from_numpy(images), torch.from_numpy(sizes),
                                                intermediates=True)
        out = {k: v.numpy() for k, v in out.items()}
        which = [0, 1]
    else:
        out = run_setting(model, fixture_batch, "baseline")
        sizes = fixture_batch[1].numpy()
        which = [0, 3]
    for b in which:
        v = out["proposal_valid"][b]
        ref = G.reference_fast_rcnn_inference(
            *(torch.from_numpy(out[k][b][v]) for k in ("cls_logits", "box_deltas", "proposals")),
            sizes[b])
        n = int(out["num_detections"][b])
        assert n == len(ref[1])
        frac, _ = G.match_detections(*ref, out["boxes"][b, :n], out["scores"][b, :n],
                                     out["classes"][b, :n], min_iou=0.9999, max_score_diff=1e-6)
        assert frac >= 0.995


@pytest.mark.parametrize("select_rois", [True, False], ids=["own-level-boxes", "every-box-every-level"])
def test_roi_pooler_equals_torchvision_per_box(select_rois):
    """Both pooling forms (each level pools its own boxes; every level pools every box, the
    others emptied) equal torchvision's roi_align of each box on the level detectron2 assigns
    it, in box order, with one level (stride 32) left without boxes."""
    from norcal.export.rcnn.modeling.poolers import ROIPooler

    gen = torch.Generator().manual_seed(0)
    strides = [4, 8, 16, 32]
    feats = [torch.randn(2, 8, 512 // s, 640 // s, generator=gen) for s in strides]
    sizes = [20, 40, 150, 300, 35, 170, 280, 25]  # levels 0-2 only
    boxes = torch.tensor([[5.0 + i, 7.0 + 2 * i, 5.0 + i + w, 7.0 + 2 * i + 0.8 * w]
                          for i, w in enumerate(sizes)])
    batch_idx = torch.tensor([0, 1, 0, 1, 1, 0, 0, 1])
    pooler = ROIPooler(7, strides, sampling_ratio=0, pooler_type="ROIAlignV2")
    pooler.select_rois = select_rois
    levels = assign_boxes_to_levels(boxes, 2, 5)
    assert sorted(set(levels.tolist())) == [0, 1, 2]
    got = pooler.pool(feats, boxes, batch_idx)
    for j in range(len(boxes)):
        lv = int(levels[j])
        ref = torchvision.ops.roi_align(feats[lv], torch.cat([batch_idx[j:j + 1, None].float(), boxes[j:j + 1]], 1),
                                        7, 1.0 / strides[lv], 0, aligned=True)
        torch.testing.assert_close(got[j:j + 1], ref, rtol=1e-5, atol=1e-5)
