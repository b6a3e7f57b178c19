"""Inferring the architecture from weights alone, and load_detector_spec (config or weights)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import yaml

from conftest import SYNTH
from norcal.core.errors import NorcalError
from norcal.export.families.detectron2.yacs_config.spec import load_config
from norcal.export.families.detectron2.weights.architecture import spec_from_weights
from norcal.export.families.detectron2.loader import load_detector_spec

FIXTURES = Path(__file__).parents[4] / "fixtures"
FIXTURE_DIRS = [FIXTURES / "d2_lvis_tiny", SYNTH]

# the fields weights determine; inferring them must give what the config says
ARCH_FIELDS = [
    "depth", "norm", "stem_out_channels", "res2_out_channels", "num_groups", "width_per_group",
    "fpn_out_channels", "fpn_norm", "rpn_conv_dims", "anchor_aspect_ratios", "num_classes",
    "cls_agnostic_bbox_reg", "box_head_num_conv", "box_head_num_fc", "box_head_fc_dim", "pooler_resolution",
    "mask_on", "mask_head_num_conv", "mask_head_conv_dim", "mask_head_norm", "cls_agnostic_mask",
    # not readable from weights, but the assumed detectron2 values hold for these fixtures (and
    # use_sigmoid_ce is the classifier the loader is given)
    "stride_in_1x1", "use_sigmoid_ce", "input_format", "pixel_mean", "pixel_std", "bbox_reg_weights",
]


@pytest.fixture(scope="module", params=FIXTURE_DIRS, ids=lambda p: p.name)
def fixture_dir(request):
    return request.param


@pytest.fixture(scope="module")
def lvis_weights():
    return torch.load(FIXTURES / "d2_lvis_tiny" / "model_final.pth", map_location="cpu", weights_only=True)["model"]


def test_weights_give_the_config_architecture(fixture_dir):
    sd = torch.load(fixture_dir / "model_final.pth", map_location="cpu", weights_only=True)["model"]
    inferred = spec_from_weights(sd)
    configured = load_config(fixture_dir / "config.yaml")
    for field in ARCH_FIELDS:
        assert getattr(inferred, field) == getattr(configured, field), field


def test_unreadable_settings_are_lvis_defaults_and_recorded(lvis_weights):
    spec = spec_from_weights(lvis_weights)
    assert (spec.min_size_test, spec.max_size_test) == (800, 1333)
    assert (spec.score_thresh_test, spec.nms_thresh_test, spec.detections_per_image) == (1e-4, 0.5, 300)
    assert spec.anchor_sizes == ((32,), (64,), (128,), (256,), (512,))
    assert "assumed" in spec.provenance["stride_in_1x1"]
    assert "assumed" in spec.provenance["anchor_sizes"]


# ---------------------------------------------------------------- synthetic detectron2 state dicts

def _norm(sd, prefix, channels, norm):
    if norm in ("FrozenBN", "BN"):
        for name in ("weight", "bias", "running_mean", "running_var"):
            sd[f"{prefix}.norm.{name}"] = torch.empty(channels)
        if norm == "BN":
            sd[f"{prefix}.norm.num_batches_tracked"] = torch.tensor(0)
    elif norm == "GN":
        sd[f"{prefix}.norm.weight"] = torch.empty(channels)
        sd[f"{prefix}.norm.bias"] = torch.empty(channels)


def _conv(sd, prefix, out, inp, k, norm=""):
    sd[f"{prefix}.weight"] = torch.empty(out, inp, k, k)
    if norm:
        _norm(sd, prefix, out, norm)
    else:
        sd[f"{prefix}.bias"] = torch.empty(out)


def make_d2_state_dict(*, blocks=(3, 4, 6, 3), bottleneck=True, stem=8, res2_out=32, groups=1, width=8,
                       norm="FrozenBN", fpn=16, fpn_norm="", anchors=3, rpn_convs=(16,), classes=5,
                       agnostic_box=False, box_convs=0, box_conv_dim=16, box_norm="", fcs=2, fc_dim=32, pooler=7,
                       mask=True, agnostic_mask=False, mask_convs=4, mask_dim=16, mask_norm=""):
    """A detectron2 GeneralizedRCNN state dict (names and shapes as detectron2 builds them)."""
    sd = {}
    bu = "backbone.bottom_up"
    _conv(sd, f"{bu}.stem.conv1", stem, 3, 7, norm)
    inp, outs = stem, []
    for i, n in enumerate(blocks):
        out, b = res2_out * 2 ** i, groups * width * 2 ** i
        for j in range(n):
            p = f"{bu}.res{i + 2}.{j}"
            if inp != out:
                _conv(sd, f"{p}.shortcut", out, inp, 1, norm)
            if bottleneck:
                _conv(sd, f"{p}.conv1", b, inp, 1, norm)
                _conv(sd, f"{p}.conv2", b, b // groups, 3, norm)
                _conv(sd, f"{p}.conv3", out, b, 1, norm)
            else:
                _conv(sd, f"{p}.conv1", out, inp, 3, norm)
                _conv(sd, f"{p}.conv2", out, out, 3, norm)
            inp = out
        outs.append(out)
    for lvl, c in zip((2, 3, 4, 5), outs):
        _conv(sd, f"backbone.fpn_lateral{lvl}", fpn, c, 1, fpn_norm)
        _conv(sd, f"backbone.fpn_output{lvl}", fpn, fpn, 3, fpn_norm)
    rpn, ch = "proposal_generator.rpn_head", fpn
    for k, d in enumerate(rpn_convs):
        _conv(sd, f"{rpn}.conv" if len(rpn_convs) == 1 else f"{rpn}.conv.conv{k}", d, ch, 3)
        ch = d
    _conv(sd, f"{rpn}.objectness_logits", anchors, ch, 1)
    _conv(sd, f"{rpn}.anchor_deltas", 4 * anchors, ch, 1)
    ch = fpn
    for k in range(box_convs):
        _conv(sd, f"roi_heads.box_head.conv{k + 1}", box_conv_dim, ch, 3, box_norm)
        ch = box_conv_dim
    flat = ch * pooler * pooler
    for k in range(fcs):
        sd[f"roi_heads.box_head.fc{k + 1}.weight"] = torch.empty(fc_dim, flat)
        sd[f"roi_heads.box_head.fc{k + 1}.bias"] = torch.empty(fc_dim)
        flat = fc_dim
    sd["roi_heads.box_predictor.cls_score.weight"] = torch.empty(classes + 1, flat)
    sd["roi_heads.box_predictor.bbox_pred.weight"] = torch.empty(4 if agnostic_box else 4 * classes, flat)
    if mask:
        ch = fpn
        for k in range(mask_convs):
            _conv(sd, f"roi_heads.mask_head.mask_fcn{k + 1}", mask_dim, ch, 3, mask_norm)
            ch = mask_dim
        sd["roi_heads.mask_head.deconv.weight"] = torch.empty(ch, mask_dim, 2, 2)
        _conv(sd, "roi_heads.mask_head.predictor", 1 if agnostic_mask else classes, mask_dim, 1)
    return sd


VARIANTS = {
    "R18": (dict(blocks=(2, 2, 2, 2), bottleneck=False, res2_out=8), dict(depth=18, res2_out_channels=8)),
    "R34": (dict(blocks=(3, 4, 6, 3), bottleneck=False, res2_out=8), dict(depth=34)),
    "R101_X32x4d": (dict(blocks=(3, 4, 23, 3), groups=32, width=2, res2_out=64),
                    dict(depth=101, num_groups=32, width_per_group=2, res2_out_channels=64)),
    "R152": (dict(blocks=(3, 8, 36, 3)), dict(depth=152, num_groups=1, width_per_group=8)),
    "BN": (dict(norm="BN"), dict(norm="BN")),
    "agnostic": (dict(agnostic_box=True, agnostic_mask=True, classes=7),
                 dict(cls_agnostic_bbox_reg=True, cls_agnostic_mask=True, num_classes=7)),
    "no_mask_pooler14": (dict(mask=False, pooler=14), dict(mask_on=False, pooler_resolution=14)),
    "rpn_two_convs": (dict(rpn_convs=(16, 32)), dict(rpn_conv_dims=(-1, 32))),
    "rpn_wider_conv": (dict(rpn_convs=(24,)), dict(rpn_conv_dims=(24,))),
    "mask_dims": (dict(mask_convs=2, mask_dim=12, fpn=20, rpn_convs=(20,)),
                  dict(mask_head_num_conv=2, mask_head_conv_dim=12, fpn_out_channels=20)),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_synthetic_variants(name):
    build, expected = VARIANTS[name]
    spec = spec_from_weights(make_d2_state_dict(**build))
    for field, value in expected.items():
        assert getattr(spec, field) == value, field


GN_4CONV1FC = dict(norm="GN", fpn_norm="GN", box_convs=4, box_conv_dim=24, box_norm="GN", fcs=1, fc_dim=48,
                   mask_norm="GN")


def test_affine_norms_read_for_a_config():
    """With a config to say GN or LN, affine-only norms read as that family ("GN"), the rest as ever."""
    spec = spec_from_weights(make_d2_state_dict(**GN_4CONV1FC), config_norms=True)
    expected = dict(norm="GN", fpn_norm="GN", box_head_num_conv=4, box_head_conv_dim=24, box_head_norm="GN",
                    box_head_num_fc=1, box_head_fc_dim=48, mask_head_norm="GN")
    assert {field: getattr(spec, field) for field in expected} == expected


# where each kind of layer's affine-only norm is: detectron2's GN or LN, which save the same weights
# (nn.GroupNorm and detectron2's layers/batch_norm.py LayerNorm: a weight and a bias of C, no buffer)
AFFINE_NORMS = {
    "backbone": (dict(norm="GN"), "backbone.bottom_up.stem.conv1.norm.weight"),
    "fpn": (dict(fpn_norm="GN"), "backbone.fpn_lateral2.norm.weight"),
    "box_head": (dict(box_convs=2, box_norm="GN"), "roi_heads.box_head.conv1.norm.weight"),
    "mask_head": (dict(mask_norm="GN"), "roi_heads.mask_head.mask_fcn1.norm.weight"),
}


def _affine_norm(prefix: str, channels: int) -> dict:
    return {f"{prefix}.weight": torch.ones(channels), f"{prefix}.bias": torch.zeros(channels)}


def _cascade_box_norms():
    sd = {k: v for k, v in _fixture_weights("cascade").items() if ".box_head." not in k}
    for k in range(3):  # a conv box head per stage, as detectron2's 4conv1fc cascade configs build
        sd[f"roi_heads.box_head.{k}.conv1.weight"] = torch.empty(16, 16, 3, 3)
        sd.update(_affine_norm(f"roi_heads.box_head.{k}.conv1.norm", 16))
        sd[f"roi_heads.box_head.{k}.fc1.weight"] = torch.empty(32, 16 * 7 * 7)
    return sd


def _regnet_affine_stem():
    sd = {k: v for k, v in _fixture_weights("regnetx").items() if not k.startswith("backbone.bottom_up.stem.bn.")}
    return dict(sd, **_affine_norm("backbone.bottom_up.stem.bn", 8))


def _retinanet_fpn_norm():
    sd = {k: v for k, v in _fixture_weights("retinanet").items() if not k.startswith("backbone.fpn_lateral3.")}
    weight = _fixture_weights("retinanet")["backbone.fpn_lateral3.weight"]
    return dict(sd, **{"backbone.fpn_lateral3.weight": weight}, **_affine_norm("backbone.fpn_lateral3.norm",
                                                                              weight.shape[0]))


FIXTURE_AFFINE_NORMS = {
    "cascade_box_head": (_cascade_box_norms, "roi_heads.box_head.0.conv1.norm.weight"),
    "regnet_stem": (_regnet_affine_stem, "backbone.bottom_up.stem.bn.weight"),
    "retinanet_fpn": (_retinanet_fpn_norm, "backbone.fpn_lateral3.norm.weight"),
}


@pytest.mark.parametrize("name", [*AFFINE_NORMS, *FIXTURE_AFFINE_NORMS])
def test_affine_only_norm_without_config_refused_naming_the_weight(name):
    """GN or LN? Weights alone cannot say: refused, naming the weight and asking for the config."""
    if name in AFFINE_NORMS:
        build, key = AFFINE_NORMS[name]
        sd = make_d2_state_dict(**build)
    else:
        make, key = FIXTURE_AFFINE_NORMS[name]
        sd = make()
    with pytest.raises(NorcalError) as err:
        spec_from_weights(sd)
    msg = str(err.value)
    assert msg.startswith(f"weight {key}: ") and "(GN) or LayerNorm (LN)" in msg and "\n" not in msg
    assert "pass the model's config (its config.yaml, yacs or LazyConfig)" in msg
    assert spec_from_weights(sd, config_norms=True) is not None  # only the norm was in doubt


def test_default_synthetic_model():
    spec = spec_from_weights(make_d2_state_dict())
    assert (spec.depth, spec.stem_out_channels, spec.res2_out_channels) == (50, 8, 32)
    assert (spec.num_groups, spec.width_per_group, spec.norm) == (1, 8, "FrozenBN")
    assert (spec.fpn_out_channels, spec.num_classes, spec.pooler_resolution) == (16, 5, 7)
    assert (spec.box_head_num_fc, spec.box_head_fc_dim, spec.box_head_num_conv) == (2, 32, 0)
    assert (spec.mask_on, spec.mask_head_num_conv, spec.mask_head_conv_dim) == (True, 4, 16)
    assert spec.anchor_aspect_ratios == ((0.5, 1.0, 2.0),) and spec.rpn_conv_dims == (-1,)


def test_pixel_stats_read_from_checkpoint_buffers():
    sd = make_d2_state_dict()
    sd["pixel_mean"] = torch.tensor([1.0, 2.0, 3.0]).reshape(3, 1, 1)
    sd["pixel_std"] = torch.tensor([4.0, 5.0, 6.0]).reshape(3, 1, 1)
    spec = spec_from_weights(sd)
    assert spec.pixel_mean == (1.0, 2.0, 3.0) and spec.pixel_std == (4.0, 5.0, 6.0)


def _torchvision_like():
    return {"backbone.body.conv1.weight": torch.empty(64, 3, 7, 7),
            "backbone.fpn.inner_blocks.0.0.weight": torch.empty(256, 256, 1, 1),
            "rpn.head.conv.0.0.weight": torch.empty(256, 256, 3, 3),
            "roi_heads.box_predictor.cls_score.weight": torch.empty(91, 1024)}


def _edit(**changes):
    def build():
        sd = make_d2_state_dict()
        for k, v in changes.items():
            k = k.replace("__", ".")
            if v is None:
                del sd[k]
            else:
                sd[k] = v
        return sd
    return build


ERRORS = {
    "torchvision": (_torchvision_like, "torchvision"),
    "caffe2": (lambda: {"conv1_w": torch.empty(64, 3, 7, 7), "res2_0_branch2a_w": torch.empty(64, 64, 1, 1)},
               "Caffe2"),
    "nine_anchors": (lambda: make_d2_state_dict(anchors=9), "config.yaml"),
    "rotated": (_edit(proposal_generator__rpn_head__anchor_deltas__weight=torch.empty(15, 16, 1, 1)), "rotated"),
    "bbox_rows": (_edit(roi_heads__box_predictor__bbox_pred__weight=torch.empty(8, 32)), "bbox_pred has 8 rows"),
    "mask_rows": (_edit(roi_heads__mask_head__predictor__weight=torch.empty(3, 16, 1, 1)), "predictor has 3 rows"),
    "deformable": (_edit(backbone__bottom_up__res3__0__conv2_offset__weight=torch.empty(18, 16, 3, 3)),
                   "DEFORM_ON_PER_STAGE"),
    "cascade": (_edit(**{"roi_heads__box_predictor__0__cls_score__weight": torch.empty(6, 32)}), "Cascade"),
    "cascade_stages": (lambda: {k: v for k, v in _fixture_weights("cascade").items()
                                if not k.startswith(("roi_heads.box_head.2.", "roi_heads.box_predictor.2."))},
                       "2 cascade stages; only detectron2's default 3"),
    "keypoint": (_edit(roi_heads__keypoint_head__score_lowres__weight=torch.empty(512, 17, 4, 4)), "KEYPOINT"),
    "odd_blocks": (lambda: make_d2_state_dict(blocks=(3, 4, 5, 3)), "(3, 4, 5, 3)"),
    "no_fpn": (_edit(backbone__fpn_lateral3__weight=None), "backbone.fpn_lateral3.weight"),
    "bad_pooler": (_edit(roi_heads__box_head__fc1__weight=torch.empty(32, 16 * 50)), "pooler resolution"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_unsupported_or_foreign_weights(name):
    build, message = ERRORS[name]
    with pytest.raises(NorcalError) as err:
        spec_from_weights(build())
    assert message in str(err.value)


def test_foreign_names_say_what_was_expected():
    with pytest.raises(NorcalError) as err:
        spec_from_weights(_torchvision_like())
    assert "backbone.bottom_up.stem.conv1.weight" in str(err.value)


# ---------------------------------------------------------------- load_detector_spec

def test_loader_without_config_infers(fixture_dir):
    spec, sd = load_detector_spec(fixture_dir / "model_final.pth", classifier="softmax")
    reference = torch.load(fixture_dir / "model_final.pth", map_location="cpu", weights_only=True)["model"]
    assert sd.keys() == reference.keys()
    configured = load_config(fixture_dir / "config.yaml")
    for field in ARCH_FIELDS:
        assert getattr(spec, field) == getattr(configured, field), field
    assert spec.provenance["source"] == "inferred from weights"
    assert spec.provenance["use_sigmoid_ce"].startswith("softmax classifier: given by the user")


def test_loader_with_config_uses_config(fixture_dir):
    spec, sd = load_detector_spec(fixture_dir / "model_final.pth", fixture_dir / "config.yaml")
    raw = yaml.safe_load((fixture_dir / "config.yaml").read_text())
    assert spec.min_size_test == raw["INPUT"]["MIN_SIZE_TEST"]
    assert spec.num_classes == raw["MODEL"]["ROI_HEADS"]["NUM_CLASSES"]
    assert [list(s) for s in spec.anchor_sizes] == raw["MODEL"]["ANCHOR_GENERATOR"]["SIZES"]
    assert "roi_heads.box_predictor.cls_score.weight" in sd


def _modified_config(tmp_path, edit) -> Path:
    cfg = yaml.safe_load((FIXTURES / "d2_lvis_tiny" / "config.yaml").read_text())
    edit(cfg)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_loader_num_classes_mismatch_names_both_numbers(tmp_path):
    config = _modified_config(tmp_path, lambda c: c["MODEL"]["ROI_HEADS"].update(NUM_CLASSES=80))
    with pytest.raises(NorcalError) as err:
        load_detector_spec(FIXTURES / "d2_lvis_tiny" / "model_final.pth", config)
    msg = str(err.value)
    assert "NUM_CLASSES = 80" in msg and "1204 rows" in msg and "1203 classes" in msg


@pytest.mark.parametrize("key,value,field", [
    ("FPN.OUT_CHANNELS", 256, "fpn_out_channels"),
    ("RESNETS.DEPTH", 101, "depth"),
    ("ROI_MASK_HEAD.CLS_AGNOSTIC_MASK", True, "cls_agnostic_mask"),
    ("MASK_ON", False, "mask_on"),
    ("ROI_BOX_HEAD.POOLER_RESOLUTION", 14, "pooler_resolution"),
])
def test_loader_other_mismatches(tmp_path, key, value, field):
    def edit(cfg):
        node = cfg["MODEL"]
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    with pytest.raises(NorcalError, match=field) as err:
        load_detector_spec(FIXTURES / "d2_lvis_tiny" / "model_final.pth", _modified_config(tmp_path, edit))
    assert f"MODEL.{key}" in str(err.value)


def test_loader_reads_model_zoo_pkl_and_tells_bn(tmp_path, lvis_weights):
    arrays = {k: v.numpy() for k, v in lvis_weights.items()}
    # a BN-trained model: counters next to the running statistics
    arrays["backbone.bottom_up.stem.conv1.norm.num_batches_tracked"] = torch.tensor(10).numpy()
    path = tmp_path / "model_final_123.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": arrays, "__author__": "Detectron2 Model Zoo"}, f)
    spec, sd = load_detector_spec(path, classifier="softmax")
    assert spec.norm == "BN" and spec.num_classes == 1203
    assert sd.keys() == lvis_weights.keys()


def test_loader_config_pixel_stats_win(tmp_path, lvis_weights):
    sd = dict(lvis_weights, pixel_mean=torch.tensor([1.0, 2.0, 3.0]).reshape(3, 1, 1))
    path = tmp_path / "w.pth"
    torch.save({"model": sd}, path)
    spec, state = load_detector_spec(path, FIXTURES / "d2_lvis_tiny" / "config.yaml")
    assert spec.pixel_mean == (103.53, 116.28, 123.675)
    assert "ignored" in spec.provenance["pixel_mean"]
    assert "pixel_mean" in state
    inferred, _ = load_detector_spec(path, classifier="softmax")
    assert inferred.pixel_mean == (1.0, 2.0, 3.0)


def test_config_gives_anchor_layout_the_weights_cannot(tmp_path):
    """5 anchors per location: weights alone cannot say which; the config can."""
    import torch
    import yaml

    from norcal.export.families.detectron2.loader import load_detector_spec

    src = FIXTURES / "d2_lvis_tiny"
    sd = torch.load(src / "model_final.pth", weights_only=True)["model"]
    for name, extra in (("objectness_logits", 2), ("anchor_deltas", 8)):
        for part in ("weight", "bias"):
            key = f"proposal_generator.rpn_head.{name}.{part}"
            sd[key] = torch.cat([sd[key], sd[key][:extra]])
    torch.save({"model": sd}, tmp_path / "m.pth")
    cfg = yaml.safe_load((src / "config.yaml").read_text())
    cfg["MODEL"]["ANCHOR_GENERATOR"]["ASPECT_RATIOS"] = [[0.25, 0.5, 1.0, 2.0, 4.0]]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    spec, _ = load_detector_spec(tmp_path / "m.pth", tmp_path / "c.yaml")
    assert spec.anchor_aspect_ratios == ((0.25, 0.5, 1.0, 2.0, 4.0),)
    with pytest.raises(NorcalError, match="5 anchors per location.*config.yaml"):
        load_detector_spec(tmp_path / "m.pth")
    cfg["MODEL"]["ANCHOR_GENERATOR"]["ASPECT_RATIOS"] = [[0.5, 1.0, 2.0]]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(NorcalError, match="do not fit the RPN's weights, which predict 5"):
        load_detector_spec(tmp_path / "m.pth", tmp_path / "c.yaml")


# ---------------------------------------------------------------- C4, DC5 and the models we name

def _fixture_weights(name: str) -> dict:
    return torch.load(FIXTURES / f"d2_{name}_tiny" / "model_final.pth", map_location="cpu", weights_only=True)["model"]


@pytest.mark.parametrize("name", ["c4", "dc5"])
def test_c4_and_dc5_weights_give_the_config_architecture(name):
    from norcal.export.families.detectron2.weights.architecture import architecture

    inferred = spec_from_weights(_fixture_weights(name))
    configured = load_config(FIXTURES / f"d2_{name}_tiny" / "config.yaml")
    assert architecture(inferred) == architecture(configured)
    for field in ("backbone_name", "backbone_out_feature", "roi_heads_name", "res5_dilation", "depth",
                  "res2_out_channels", "width_per_group", "stem_out_channels", "rpn_conv_dims", "anchor_sizes",
                  "anchor_aspect_ratios", "rpn_pre_nms_topk_test", "pooler_resolution", "mask_on",
                  "mask_pooler_resolution", "mask_head_num_conv", "mask_head_conv_dim", "num_classes"):
        if field.startswith("mask_") and field != "mask_on" and not configured.mask_on:
            continue
        assert getattr(inferred, field) == getattr(configured, field), field


def test_c4_and_dc5_assumptions_are_recorded():
    c4 = spec_from_weights(_fixture_weights("c4"))
    assert c4.provenance["architecture"].startswith("C4")
    assert "assumed" in c4.provenance["pooler_resolution"] and "14" in c4.provenance["pooler_resolution"]
    assert "6000" in c4.provenance["test_thresholds"]
    assert "Res5ROIHeads" in c4.provenance["mask_pooler_resolution"]
    dc5 = spec_from_weights(_fixture_weights("dc5"))
    assert dc5.provenance["architecture"].startswith("DC5")
    assert "assumed" in dc5.provenance["res5_dilation"] and dc5.res5_dilation == 2
    assert "assumed" in dc5.provenance["anchor_sizes"] and "512" in dc5.provenance["anchor_sizes"]


def test_c4_with_other_anchor_counts_needs_the_config():
    sd = dict(_fixture_weights("c4"))
    for name, rows in (("objectness_logits", 9), ("anchor_deltas", 36)):
        for part in ("weight", "bias"):
            key = f"proposal_generator.rpn_head.{name}.{part}"
            sd[key] = sd[key][:rows]
    with pytest.raises(NorcalError, match="9 anchors per location; only 15 .* config.yaml"):
        spec_from_weights(sd)


def test_c4_depth_counts_res5_in_the_heads():
    sd = dict(_fixture_weights("c4"))
    for j in range(6, 23):  # res4 of a ResNet-101: 23 blocks
        for k, v in list(sd.items()):
            if k.startswith("backbone.res4.5."):
                sd[k.replace("res4.5.", f"res4.{j}.")] = v
    assert spec_from_weights(sd).depth == 101


NAMED = {
    "retinanet_head_norm": (lambda: dict(_fixture_weights("retinanet"), **{
        "head.cls_subnet.1.weight": torch.ones(16)}), "normalisation in the RetinaNet head"),
    "rpn_only": (lambda: {k: v for k, v in make_d2_state_dict().items() if not k.startswith("roi_heads.")},
                 "RPN-only model (ProposalNetwork)"),
    "proposal_files": (lambda: {k: v for k, v in make_d2_state_dict().items()
                                if not k.startswith("proposal_generator.")}, "precomputed proposals"),
    "c4_deformable": (lambda: dict(_fixture_weights("c4"), **{
        "backbone.res4.0.conv2_offset.weight": torch.empty(18, 32, 3, 3)}), "deformable"),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_models_we_refuse_are_named_and_supported_ones_listed(name):
    build, message = NAMED[name]
    with pytest.raises(NorcalError) as err:
        spec_from_weights(build())
    msg = str(err.value)
    assert message in msg and "FPN, C4 or DC5" in msg and "\n" not in msg


def test_loader_c4_and_dc5_with_and_without_config():
    for name in ("c4", "dc5"):
        src = FIXTURES / f"d2_{name}_tiny"
        spec, sd = load_detector_spec(src / "model_final.pth", src / "config.yaml")
        assert spec.provenance["source"].startswith("config")
        inferred, _ = load_detector_spec(src / "model_final.pth", classifier="softmax")
        assert inferred.roi_heads_name == spec.roi_heads_name and inferred.backbone_out_feature == \
            spec.backbone_out_feature
    with pytest.raises(NorcalError, match="describes a DC5 model but .*d2_c4_tiny.* holds a C4 model's weights"):
        load_detector_spec(FIXTURES / "d2_c4_tiny" / "model_final.pth", FIXTURES / "d2_dc5_tiny" / "config.yaml")
    with pytest.raises(NorcalError, match="describes a FPN model but .* holds a DC5"):
        load_detector_spec(FIXTURES / "d2_dc5_tiny" / "model_final.pth", FIXTURES / "d2_lvis_tiny" / "config.yaml")


@pytest.mark.parametrize("weights, config, message", [
    ("d2_vitdet_tiny", "d2_vitdet_cascade_tiny", "describes a ViTDet Cascade model but .* holds a ViTDet model's"),
    ("d2_vitdet_cascade_tiny", "d2_vitdet_tiny", "describes a ViTDet model but .* holds a ViTDet Cascade model's"),
    ("d2_vitdet_tiny", "d2_lvis_tiny", "describes a FPN model but .* holds a ViTDet model's"),
    ("d2_lvis_tiny", "d2_vitdet_tiny", "describes a ViTDet model but .* holds a FPN model's"),
])
def test_loader_names_a_vit_layout_the_config_and_weights_disagree_on(weights, config, message):
    # a ViT's SimpleFeaturePyramid is no ResNet FPN: the refusal says which side holds the ViT
    with pytest.raises(NorcalError, match=message):
        load_detector_spec(FIXTURES / weights / "model_final.pth", FIXTURES / config / "config.yaml")


def test_loader_undilated_res5_config_wins_over_the_dc5_assumption(tmp_path):
    cfg = yaml.safe_load((FIXTURES / "d2_dc5_tiny" / "config.yaml").read_text())
    cfg["MODEL"]["RESNETS"]["RES5_DILATION"] = 1
    (tmp_path / "c5.yaml").write_text(yaml.safe_dump(cfg))
    spec, _ = load_detector_spec(FIXTURES / "d2_dc5_tiny" / "model_final.pth", tmp_path / "c5.yaml")
    assert spec.res5_dilation == 1
