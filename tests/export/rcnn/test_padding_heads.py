"""Every head depth detectron2 lets a config set behaves per image in a padded batch.

A 3x3 conv at an image's last valid row/column reads one step into the batch padding. In
detectron2 each image runs alone, padded to its own multiple of 32, where that step is the
conv's zero padding; in a batch padded to the largest image it holds whatever the layer
before wrote there (ReLU(bias + ...) after any conv). So every conv of a head that runs on
a whole feature map (RPN convs, RetinaNet towers, FPN outputs, P6/P7) must read a masked
input, and a GroupNorm's statistics must skip the padding. The box and mask heads' convs run
on pooled RoIs, which hold no batch padding (their grid is the RoI's own).

For each configuration (FPN, C4, DC5, RetinaNet at small widths; weights with a trained
model's spread: non-trivial norms, a decisive RPN and classifier), three images of different
sizes, each padded in the batch beyond its own extent (its multiple of 32; C4/DC5: itself),
are run batched and each alone, by ONNX Runtime (one dynamic export, float32) and by our
PyTorch model (float64, so that convs on maps of another size round alike): each image's
detections must be the same, one to one: class equal, boxes within 1e-3 px, scores within
1e-4, mask probabilities within MASK_TOL everywhere; in PyTorch the RPN's proposals as well. The
alone runs are tied to detectron2's per-image computation by test_padding_invariance (stock
GroupNorm) and test_modeling_parity (goldens).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import golden as G
from norcal.export.rcnn.modeling.build import model_from_state, random_state_dict
from norcal.export.rcnn.onnx_export import export_onnx
from norcal.export.rcnn.spec import (RES5_ROI_HEADS, RESNET_BACKBONE, RETINANET, STANDARD_ROI_HEADS,
                                 ModelSpec)

# img0 150x200, img1 267x200, img2 200x300: the batch is 288x320, and each image is padded
# in it beyond its own multiple of 32 (img0 both ways, img1 in width, img2 in height)
SIZES = ((0, 150, 256), (1, 200, 300), (2, 200, 300))
MIN_DETECTIONS = 5  # per image: a head whose outputs are all alike would detect nothing
# alone vs batched masks, largest difference by the masks' dtype: measured 1.5e-6 in ONNX
# Runtime (float32, GN heads; 0 for the others) and 4e-15 in PyTorch (float64). Bounds: 1e-5
# (6x) for other CPUs' float32 kernels; 1e-12 in float64, where only rounding differs
MASK_TOL = {"float32": 1e-5, "float64": 1e-12}
# random_state_dict's head init times these: outputs spread as a trained model's, while the
# regressors stay moderate (float32 rounding in the deltas moves boxes by their size times it)
SCALES = {"objectness_logits.weight": 20.0, "anchor_deltas.weight": 5.0,
          "roi_heads.box_predictor.cls_score.weight": 300.0, "bbox_pred.weight": 10.0,
          "predictor.weight": 30.0, "head.cls_score.weight": 60.0}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # two cores shared by several jobs: more threads only contend
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rcnn_spec(norm: str = "FrozenBN", rpn_convs: int = 1, box_convs: int = 0,
              mask_convs: int = 4, head_norm: str = "") -> ModelSpec:
    """Mask R-CNN R-18-FPN at small width; ``norm`` for the ResNet, ``head_norm`` for the FPN,
    box and mask heads (as detectron2's GN and SyncBN configs set them)."""
    return ModelSpec(depth=18, norm=norm, stem_out_channels=64, res2_out_channels=64,
                     fpn_out_channels=64, fpn_norm=head_norm, rpn_conv_dims=(-1,) * rpn_convs,
                     box_head_num_conv=box_convs, box_head_conv_dim=32,
                     box_head_num_fc=1 if box_convs else 2, box_head_fc_dim=64,
                     box_head_norm=head_norm, mask_head_num_conv=mask_convs,
                     mask_head_conv_dim=32, mask_head_norm=head_norm, num_classes=8,
                     rpn_pre_nms_topk_test=1000, rpn_post_nms_topk_test=500,
                     score_thresh_test=0.3, detections_per_image=100)


def retina_spec(norm: str = "FrozenBN", num_convs: int = 4, fpn_norm: str = "") -> ModelSpec:
    """RetinaNet R-18 at small width (detectron2 has no norm in the RetinaNet head itself)."""
    return ModelSpec(meta_architecture=RETINANET, depth=18, norm=norm, stem_out_channels=64,
                     res2_out_channels=64, fpn_out_channels=64, fpn_norm=fpn_norm,
                     anchor_sizes=tuple((s, s * 2 ** (1 / 3), s * 2 ** (2 / 3))
                                        for s in (32, 64, 128, 256, 512)),
                     anchor_aspect_ratios=((0.5, 1.0, 2.0),), bbox_reg_weights=(1.0, 1.0, 1.0, 1.0),
                     num_classes=8, mask_on=False, retinanet_num_convs=num_convs,
                     retinanet_topk_candidates=200, score_thresh_test=0.05, nms_thresh_test=0.5,
                     detections_per_image=100)


def single_map_spec(arch: str, norm: str = "FrozenBN", rpn_convs: int = 2) -> ModelSpec:
    """C4 (res4, res5 on each pooled box) or DC5 (dilated res5) R-50 at small width: detectron2
    pads these images to no multiple, so every map's extent is the image's own (ceil)."""
    c4 = arch == "C4"
    return ModelSpec(backbone_name=RESNET_BACKBONE, backbone_out_feature="res4" if c4 else "res5",
                     res5_dilation=1 if c4 else 2,
                     roi_heads_name=RES5_ROI_HEADS if c4 else STANDARD_ROI_HEADS, depth=50,
                     norm=norm, stride_in_1x1=norm != "GN", stem_out_channels=32,
                     res2_out_channels=64, width_per_group=32,
                     anchor_sizes=((32, 64, 128, 256, 512),), rpn_conv_dims=(-1,) * rpn_convs,
                     pooler_resolution=14 if c4 else 7, box_head_fc_dim=64,
                     mask_head_num_conv=0 if c4 else 4, mask_head_conv_dim=32, num_classes=8,
                     # C4 runs res5 on every proposal (its cost): 100 are enough to fill the padding
                     rpn_pre_nms_topk_test=1000, rpn_post_nms_topk_test=100 if c4 else 200,
                     score_thresh_test=0.3, detections_per_image=100)


# name -> spec: RPN depths 1-3, box head convs with and without a norm, mask head depths,
# C4 and DC5, RetinaNet tower depths, over FrozenBN, SyncBN (BN at inference) and GN
CONFIGS = {
    "rpn1-FrozenBN": lambda: rcnn_spec(rpn_convs=1),
    # detectron2's mask_rcnn_R_50_FPN_3x with MODEL.RPN.CONV_DIMS [-1, -1]
    "rpn2-FrozenBN": lambda: rcnn_spec(rpn_convs=2),
    # the new_baselines LSJ layout: SyncBN everywhere, 2 RPN convs, a 4conv1fc box head
    "rpn2-SyncBN-box4conv": lambda: rcnn_spec("SyncBN", rpn_convs=2, box_convs=4,
                                              head_norm="SyncBN"),
    "rpn3-GN-box2conv-mask2": lambda: rcnn_spec("GN", rpn_convs=3, box_convs=2, mask_convs=2,
                                                head_norm="GN"),
    "rpn1-box2conv-mask1": lambda: rcnn_spec(box_convs=2, mask_convs=1),
    "C4-rpn2-FrozenBN": lambda: single_map_spec("C4"),
    "DC5-rpn2-SyncBN": lambda: single_map_spec("DC5", "SyncBN"),
    "retina0-FrozenBN": lambda: retina_spec(num_convs=0),
    "retina2-SyncBN": lambda: retina_spec("SyncBN", num_convs=2, fpn_norm="SyncBN"),
    "retina4-GN": lambda: retina_spec("GN", num_convs=4, fpn_norm="GN"),
}
# the quick loop (-m "not slow") keeps FPN with RPN depths 1 and 2, and one RetinaNet
SLOW = {"rpn2-SyncBN-box4conv", "rpn3-GN-box2conv-mask2", "rpn1-box2conv-mask1",
        "C4-rpn2-FrozenBN", "DC5-rpn2-SyncBN", "retina2-SyncBN", "retina4-GN"}
PARAMS = [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in CONFIGS]


def trained_like(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """random_state_dict with a trained model's spread: affine norms and batch statistics
    away from identity, an RPN whose objectness separates anchors, a decisive classifier
    (RetinaNet's with detectron2's prior bias), so that a changed feature at an image's edge
    changes which detections come out."""
    sd = random_state_dict(spec, seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def uniform(t, lo, hi):
        return lo + (hi - lo) * torch.rand(t.shape, generator=gen)

    for k, t in sd.items():
        if k.endswith("norm.weight"):
            # a small norm after blocks' conv2 keeps the residual sums O(1), as in training
            sd[k] = uniform(t, 0.5, 1.0) * (0.3 if ".conv2." in k and ".res" in k else 1.0)
        elif k.endswith(("norm.bias", "running_mean")):
            sd[k] = 0.1 * torch.randn(t.shape, generator=gen)
        elif k.endswith("running_var"):
            sd[k] = uniform(t, 0.5, 1.5)
        elif k.endswith(tuple(SCALES)):
            sd[k] = t * next(v for suffix, v in SCALES.items() if k.endswith(suffix))
        elif k == "head.cls_score.bias":
            sd[k] = torch.full_like(t, -float(np.log((1 - 0.01) / 0.01)))
    return sd


def padded(images):
    """Images HWC uint8 -> float32 [B,3,H,W] zero-padded to the largest, up to a multiple of
    32, sizes int64 [B,2]."""
    h = -(-max(i.shape[0] for i in images) // 32) * 32
    w = -(-max(i.shape[1] for i in images) // 32) * 32
    out = np.zeros((len(images), 3, h, w), np.float32)
    for n, im in enumerate(images):
        out[n, :, :im.shape[0], :im.shape[1]] = im.transpose(2, 0, 1)
    return out, np.array([i.shape[:2] for i in images], np.int64)


def per_image(out: dict, b: int) -> dict:
    """Image b's detections from batched outputs (torch or numpy), cut to num_detections."""
    n = int(out["num_detections"][b])
    return {k: np.asarray(out[k][b][:n]) for k in ("boxes", "scores", "classes", "masks")
            if k in out}


def assert_same_detections(want: dict, got: dict, what: str) -> None:
    """One to one: class equal, boxes within 1e-3, scores within 1e-4; masks within MASK_TOL."""
    assert len(got["scores"]) == len(want["scores"]), \
        f"{what}: {len(got['scores'])} detections, alone {len(want['scores'])}"
    free = np.ones(len(got["scores"]), bool)
    for i in range(len(want["scores"])):
        box_diff = np.abs(got["boxes"] - want["boxes"][i]).max(axis=1)
        ok = free & (got["classes"] == want["classes"][i]) & (box_diff <= 1e-3) \
            & (np.abs(got["scores"] - want["scores"][i]) <= 1e-4)
        assert ok.any(), (f"{what}: alone's detection {i} (class {want['classes'][i]}, score "
                          f"{want['scores'][i]:.5f}, box {want['boxes'][i]}) has no match")
        j = int(np.flatnonzero(ok)[np.argmin(box_diff[ok])])
        free[j] = False
        if "masks" in want:
            diff = np.abs(got["masks"][j] - want["masks"][i]).max()
            tol = MASK_TOL[got["masks"].dtype.name]
            assert diff <= tol, f"{what}: mask of detection {i} off by {diff:.2e}"


def assert_non_trivial(dets: dict, what: str) -> None:
    """Enough detections, with spread scores."""
    n = len(dets["scores"])
    print(f"{what}: {n} detections, {len(set(dets['classes'].tolist()))} classes, "
          f"scores {dets['scores'].min():.3f}-{dets['scores'].max():.3f}")
    assert n >= MIN_DETECTIONS, f"{what}: only {n} detections"
    assert dets["scores"].max() - dets["scores"].min() >= 0.02, f"{what}: scores all alike"


def ort_session(proto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def images():
    return [G.load_bgr_resized(k, short, top) for k, short, top in SIZES]


def check_alone_equals_batched(run, images, name: str, masks: bool) -> tuple[dict, list[dict]]:
    """``run(images, sizes)`` -> outputs by name; every image of the batch vs itself alone.
    Returns the outputs: batched, and alone per image."""
    batched = run(*padded(images))
    outputs = [run(*padded([im])) for im in images]
    classes = set()
    for b, out in enumerate(outputs):
        alone = per_image(out, 0)
        assert_non_trivial(alone, f"{name} img{b} alone")
        classes |= set(alone["classes"].tolist())
        assert masks == ("masks" in alone)
        assert_same_detections(alone, per_image(batched, b), f"{name} img{b} batched")
    assert len(classes) >= 2, f"{name}: one class only"
    return batched, outputs


@pytest.mark.parametrize("name", PARAMS)
def test_each_image_batched_equals_it_alone(name, images):
    """ONNX Runtime (one dynamic export) and PyTorch, every image of a 3-image batch."""
    spec = CONFIGS[name]()
    model = model_from_state(spec, trained_like(spec))
    masks = spec.meta_architecture != RETINANET and spec.mask_on

    sess = ort_session(export_onnx(model, spec))
    names = [o.name for o in sess.get_outputs()]

    def onnx_run(x, sizes):
        return dict(zip(names, sess.run(None, {"images": x, "image_sizes": sizes})))

    check_alone_equals_batched(onnx_run, images, f"{name} onnx", masks)
    # float64: the float32 rounding of convs on maps of another size stays out of the picture
    model = model.double()

    def torch_run(x, sizes):
        with torch.no_grad():
            out = model.inference(torch.from_numpy(x).double(), torch.from_numpy(sizes),
                                  intermediates=True)
        return {k: v.numpy() for k, v in out.items()}

    batched, outputs = check_alone_equals_batched(torch_run, images, f"{name} torch", masks)
    if spec.meta_architecture != RETINANET:
        check_same_proposals(batched, outputs, name)


def check_same_proposals(batched: dict, outputs: list[dict], name: str) -> None:
    """The RPN's own output, each image batched vs alone: the same proposals and objectness."""
    for b, alone in enumerate(outputs):
        want, got = alone["proposal_valid"][0], batched["proposal_valid"][b]
        assert want.sum() == got.sum() > 0, f"{name} img{b}: proposal count"
        for key, atol in (("proposals", 1e-6), ("proposal_logits", 1e-9)):
            diff = np.abs(alone[key][0][want] - batched[key][b][got]).max()
            assert diff <= atol, f"{name} img{b}: {key} differ by {diff:.3g}"
