"""An image alone equals the same image in a padded batch, for every norm detectron2 uses.

"Alone" is detectron2's inference on that one image: padded to its own multiple of 32, with
stock ``nn.GroupNorm`` / batch norm over that whole map (so a GN's statistics include the
image's own <= 31 px of padding, and nothing beyond). The reference below is our model with
every GN swapped for stock ``nn.GroupNorm``, run on the image alone; the rest of the model is
held to detectron2's goldens in test_modeling_parity. Batched with larger images (PyTorch and
ONNX Runtime with dynamic shapes), or padded to a larger fixed export size, the detections
must be the same: class, IoU >= 0.99, |score diff| <= 1e-4, >= 99% matched.

Models are detectron2's norm configurations at small width with random, well-conditioned
weights: Base-RCNN-FPN (FrozenBN backbone, no FPN or head norms),
mask_rcnn_R_50_FPN_3x_syncbn and mask_rcnn_R_50_FPN_3x_gn (norm everywhere, "4conv1fc" box
head; GN with STRIDE_IN_1X1 False).
"""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import golden as G
from conftest import assert_tensorrt_compatible
from norcal.export.rcnn.modeling.build import model_from_state, random_state_dict
from norcal.export.rcnn.modeling.layers import GroupNorm, PaddingMasks, get_norm, masked_group_norm
from norcal.export.rcnn.onnx_export import export_onnx
from norcal.export.rcnn.spec import ModelSpec

pytestmark = pytest.mark.slow  # three norm types, each exported and run batched

NORMS = ("FrozenBN", "SyncBN", "GN")
# GN on ResNet-18's basic blocks as well (another masking path), in PyTorch
MODELS = NORMS + ("GN-R18",)
# img0 alone is 150 x 200 (padded to 160 x 224); the batch pads it to 288 x 320
SIZES = ((0, 150, 256), (2, 200, 300), (1, 200, 300))  # (fixture image, short side, max size)
BATCH_HW = (288, 320)
# alone vs batched or padded masks of one model (float32), largest difference: measured
# 3.3e-7 (ONNX Runtime, GN; 1.2e-7 in PyTorch). Bound 3e-6: 9x, for other CPUs' kernels
MASK_TOL = 3e-6


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # two cores shared by several jobs: more threads only contend
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def norm_spec(name: str) -> ModelSpec:
    """detectron2's config for norm ``name`` at small width (GN needs channels in groups of
    32); a ``-R18`` suffix puts it on ResNet-18."""
    norm, _, r18 = name.partition("-")
    everywhere = norm != "FrozenBN"
    head_norm = norm if everywhere else ""
    return ModelSpec(depth=18 if r18 else 50, norm=norm, stride_in_1x1=norm != "GN",
                     stem_out_channels=64 if r18 else 32, res2_out_channels=64,
                     width_per_group=32, fpn_out_channels=64,
                     fpn_norm=head_norm, box_head_num_conv=4 if everywhere else 0,
                     box_head_conv_dim=32, box_head_num_fc=1 if everywhere else 2,
                     box_head_fc_dim=64, box_head_norm=head_norm, mask_head_conv_dim=32,
                     mask_head_norm=head_norm, num_classes=8, rpn_pre_nms_topk_test=200,
                     rpn_post_nms_topk_test=100, detections_per_image=50)


def norm_weights(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """random_state_dict with non-trivial norms (affine, batch-norm statistics) and a
    classifier strong enough to rank detections, so a changed feature changes the outcome."""
    sd = random_state_dict(spec, seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def uniform(t, lo, hi):
        return lo + (hi - lo) * torch.rand(t.shape, generator=gen)

    for k, t in sd.items():
        if k.endswith("norm.weight"):
            # a small last norm in each bottleneck keeps residual sums O(1), as in training
            sd[k] = uniform(t, 0.5, 1.0) * (0.3 if ".conv3." in k else 1.0)
        elif k.endswith("norm.bias") or k.endswith("running_mean"):
            sd[k] = 0.1 * torch.randn(t.shape, generator=gen)
        elif k.endswith("running_var"):
            sd[k] = uniform(t, 0.5, 1.5)
        elif k.endswith(("cls_score.weight", "bbox_pred.weight")):
            sd[k] = t * 30.0
    return sd


def with_stock_group_norm(model: nn.Module) -> nn.Module:
    """A copy whose GNs are stock ``nn.GroupNorm`` (detectron2's): statistics over the whole
    map it is given, padding included."""
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, GroupNorm):
                stock = nn.GroupNorm(child.num_groups, child.num_channels, child.eps)
                stock.load_state_dict(child.state_dict())
                setattr(module, name, stock)
    return model


def padded(images, hw=None):
    """Images HWC uint8 -> float32 [B,3,H,W] zero-padded to hw (default: the largest, up to a
    multiple of 32), sizes int64 [B,2]."""
    h = max(i.shape[0] for i in images)
    w = max(i.shape[1] for i in images)
    h, w = hw or (-(-h // 32) * 32, -(-w // 32) * 32)
    out = np.zeros((len(images), 3, h, w), np.float32)
    for n, im in enumerate(images):
        out[n, :, :im.shape[0], :im.shape[1]] = im.transpose(2, 0, 1)
    return out, np.array([i.shape[:2] for i in images], np.int64)


@pytest.fixture(scope="module")
def images():
    return [G.load_bgr_resized(k, short, top) for k, short, top in SIZES]


_models: dict[str, tuple] = {}


def setup(norm: str, images) -> tuple:
    """(spec, our model, detectron2's detections per image alone), built once per norm."""
    if norm not in _models:
        spec = norm_spec(norm)
        model = model_from_state(spec, norm_weights(spec))
        reference = with_stock_group_norm(model)
        with torch.no_grad():
            alone = [numpy(reference.inference(*map(torch.from_numpy, padded([im]))), 0)
                     for im in images]
        _models[norm] = spec, model, alone
    return _models[norm]


def numpy(out: dict, b: int) -> dict:
    """Image b's detections from batched outputs (torch or numpy), cut to num_detections."""
    n = int(out["num_detections"][b])
    return {k: np.asarray(out[k][b][:n]) for k in ("boxes", "scores", "classes", "masks")}


def assert_same_detections(want: dict, got: dict, what: str) -> None:
    assert len(got["scores"]) == len(want["scores"]), f"{what}: detection count"
    frac, pairs = G.match_detections(want["boxes"], want["scores"], want["classes"],
                                     got["boxes"], got["scores"], got["classes"])
    assert frac >= 0.99, f"{what}: only {frac:.3f} matched"
    wi, gi = zip(*pairs)
    diff = np.abs(want["masks"][list(wi)] - got["masks"][list(gi)]).max()
    assert diff <= MASK_TOL, (what, diff)


def session(proto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_run(sess, images: np.ndarray, sizes: np.ndarray) -> dict:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"images": images, "image_sizes": sizes})))


# --- the layer -----------------------------------------------------------------------------

def test_alone_means_padded_to_its_own_multiple_of_32():
    m = PaddingMasks(torch.tensor([[150, 200], [267, 200]]), 32)
    assert m.extent(1).tolist() == [[160, 224], [288, 224]]
    assert m.extent(4).tolist() == [[40, 56], [72, 56]]
    assert m.extent(32).tolist() == [[5, 7], [9, 7]]


def test_masked_group_norm_takes_each_images_statistics_from_its_own_map():
    """Hand-computed (float64) group statistics over image 0's own stride-4 map; stock
    GroupNorm over the padded batch tensor, the old behaviour, is far off."""
    gen = torch.Generator().manual_seed(0)
    c, groups = 64, 32
    sizes = torch.tensor([[150, 200], [267, 200]])
    x = torch.randn((2, c, 72, 80), generator=gen) * 2.0 + 0.5
    # batch padding holds whatever the layers before wrote there, not zeros
    x[0, :, 40:, :] = 3.0 + torch.rand((c, 32, 80), generator=gen)
    x[0, :, :, 56:] = 3.0 + torch.rand((c, 72, 24), generator=gen)
    weight = torch.rand(c, generator=gen) + 0.5
    bias = torch.randn(c, generator=gen)
    norm = get_norm("GN", c)
    assert isinstance(norm, GroupNorm) and norm.num_groups == groups and norm.eps == 1e-5
    norm.weight.data, norm.bias.data = weight, bias
    mask = PaddingMasks(sizes, 32).mask(4, x)
    with torch.no_grad():
        ours = norm(x, mask)
        old = norm(x)  # no mask: statistics over the padded tensor
    for b, (h, w) in enumerate([(40, 56), (72, 56)]):
        crop = x[b, :, :h, :w].double().numpy().reshape(groups, -1)
        mean = crop.mean(1, keepdims=True)
        var = ((crop - mean) ** 2).mean(1, keepdims=True)
        want = ((crop - mean) / np.sqrt(var + 1e-5)).reshape(c, h, w)
        want = want * weight.double().numpy()[:, None, None] + bias.double().numpy()[:, None, None]
        assert np.abs(ours[b, :, :h, :w].double().numpy() - want).max() <= 1e-5
        # detectron2 on this image alone: nn.GroupNorm over exactly its own map
        stock = nn.functional.group_norm(x[b:b + 1, :, :h, :w], groups, weight, bias, 1e-5)
        assert torch.allclose(ours[b:b + 1, :, :h, :w], stock, atol=1e-5)
    assert (old[0, :, :40, :56] - ours[0, :, :40, :56]).abs().max() > 0.1
    # without a mask (ROI features) it is stock GroupNorm
    assert torch.allclose(old, nn.functional.group_norm(x, groups, weight, bias, 1e-5))
    # an image exactly filling its map (alone, padded to its own size): stock GroupNorm
    full = masked_group_norm(x, torch.ones_like(mask), groups, weight, bias, 1e-5)
    assert torch.allclose(full, old, atol=1e-5)


def test_bn_and_syncbn_build_the_same_inference_module():
    assert type(get_norm("BN", 32)) is type(get_norm("SyncBN", 32)) is nn.BatchNorm2d


# --- the model -----------------------------------------------------------------------------

@pytest.mark.parametrize("norm", MODELS)
def test_pytorch_batched_equals_alone(norm, images):
    spec, model, alone = setup(norm, images)
    with torch.no_grad():
        batched = model.inference(*map(torch.from_numpy, padded(images)))
        first = model.inference(*map(torch.from_numpy, padded(images[:1])))
    assert tuple(batched["boxes"].shape[:1]) == (len(images),)
    assert_same_detections(alone[0], numpy(first, 0), f"{norm} alone")
    for b in range(len(images)):
        assert_same_detections(alone[b], numpy(batched, b), f"{norm} batched img{b}")


def test_statistics_over_the_padded_tensor_fail(images):
    """The old GN (stock statistics over the whole tensor) misses the tests here: in a batch,
    and alone but padded to a larger fixed size."""
    spec, model, alone = setup("GN", images)
    old = with_stock_group_norm(model)
    with torch.no_grad():
        batched = old.inference(*map(torch.from_numpy, padded(images)))
        fixed = old.inference(*map(torch.from_numpy, padded(images[:1], BATCH_HW)))
    for got in (numpy(batched, 0), numpy(fixed, 0)):
        frac, _ = G.match_detections(alone[0]["boxes"], alone[0]["scores"], alone[0]["classes"],
                                     got["boxes"], got["scores"], got["classes"])
        assert frac < 0.5


@pytest.mark.parametrize("norm", NORMS)
def test_onnxruntime_batched_and_fixed_size_equal_alone(norm, images):
    """Dynamic export: each image alone and the padded batch. Fixed export at the batch's
    size, batch 1: each image padded to that size."""
    spec, model, alone = setup(norm, images)
    dynamic = export_onnx(model, spec)
    assert_tensorrt_compatible(dynamic)
    sess = session(dynamic)
    batched = ort_run(sess, *padded(images))
    for b, im in enumerate(images):
        assert_same_detections(alone[b], numpy(ort_run(sess, *padded([im])), 0),
                               f"{norm} onnx alone img{b}")
        assert_same_detections(alone[b], numpy(batched, b), f"{norm} onnx batched img{b}")
    fixed = export_onnx(model, spec, batch=1, height=BATCH_HW[0], width=BATCH_HW[1])
    assert_tensorrt_compatible(fixed)
    sess = session(fixed)
    for b, im in enumerate(images):
        assert_same_detections(alone[b], numpy(ort_run(sess, *padded([im], BATCH_HW)), 0),
                               f"{norm} onnx fixed {BATCH_HW} img{b}")
