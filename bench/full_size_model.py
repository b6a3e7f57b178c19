"""A full-size LVIS v1 R-50-FPN Mask R-CNN with weights conditioned like a trained model.

The topology is detectron2's (the config of tests/fixtures/d2_lvis_tiny with detectron2's full
widths: 64-channel stem, 256 res2 / FPN / mask head, 1024 fc, 1203 classes), built with our
modeling code. Random weights make a poor stand-in for speed: every class scores ~1/(C+1) and
the RPN's outputs are near zero. So the heads are conditioned on one image, measured through
our PyTorch model:

- RPN: objectness logits scaled to std 1 (O(1), like a trained RPN's), anchor deltas to std
  0.05 (proposals near their anchors), biases 0: the top anchors of a level are scattered,
  NMS keeps them, and the RPN gives its full 1000 proposals;
- classifier: foreground logits scaled to std ``sigma`` (peaked: a few classes per proposal
  stand out) with one foreground bias chosen so that about ``candidates`` (box, class) pairs
  score above the score threshold (the many-detections regime: 300 detections); the
  background bias is 0 there and, for the few-detections regime, the smallest value that
  leaves at most ``few`` pairs above the threshold (so at most that many detections);
- box regressor: deltas std 0.1.

``python bench/full_size_model.py DIR`` writes DIR/many and DIR/few (model_final.pth,
config.yaml) for detectron2's own export of the same weights.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image

from norcal.export.families.detectron2.loader import load_detector_spec
from norcal.export.rcnn.modeling.build import model_from_state, random_state_dict
from norcal.export.rcnn.modeling.layers import PaddingMasks

from fixture_files import fixture_dir  # noqa: E402

FIXTURE = fixture_dir("d2_lvis_tiny")
H, W = 800, 1216
# detectron2's LVIS R-50-FPN widths and test sizes where the fixture is reduced
FULL_SIZE = {("INPUT", "MIN_SIZE_TEST"): 800, ("INPUT", "MAX_SIZE_TEST"): 1333,
             ("MODEL", "RESNETS", "STEM_OUT_CHANNELS"): 64, ("MODEL", "RESNETS", "RES2_OUT_CHANNELS"): 256,
             ("MODEL", "RESNETS", "WIDTH_PER_GROUP"): 64, ("MODEL", "FPN", "OUT_CHANNELS"): 256,
             ("MODEL", "ROI_BOX_HEAD", "FC_DIM"): 1024, ("MODEL", "ROI_MASK_HEAD", "CONV_DIM"): 256}


def image_800x1216() -> np.ndarray:
    """img0 of the fixture as BGR float32 [3, 800, 1216] (a plain resize)."""
    rgb = Image.open(FIXTURE / "images" / "img0.png").convert("RGB").resize((W, H), Image.BILINEAR)
    return np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1].transpose(2, 0, 1), dtype=np.float32)


def full_size_config() -> dict:
    cfg = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    for keys, value in FULL_SIZE.items():
        node = cfg
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return cfg


def full_size_spec():
    spec = load_detector_spec(FIXTURE / "model_final.pth", FIXTURE / "config.yaml")[0]
    return dataclasses.replace(spec, stem_out_channels=64, res2_out_channels=256, width_per_group=64,
                               fpn_out_channels=256, box_head_fc_dim=1024, mask_head_conv_dim=256,
                               min_size_test=800, max_size_test=1333)


def _candidates(fg: np.ndarray, bg: float, thresh: float) -> int:
    """(box, class) pairs scoring above ``thresh``: softmax over fg logits [P, C] + background."""
    full = np.concatenate([fg, np.full((fg.shape[0], 1), bg)], axis=1)
    full = full - full.max(axis=1, keepdims=True)
    p = np.exp(full)
    p /= p.sum(axis=1, keepdims=True)
    return int((p[:, :-1] > thresh).sum())


def _bisect(f, lo: float, hi: float, steps: int = 40) -> float:
    """The smallest x in [lo, hi] with f(x) true (f monotone: false then true)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if f(mid) else (mid, hi)
    return hi


@dataclasses.dataclass
class Conditioned:
    many: dict  # state dict, background bias 0
    few: dict  # the same with the background bias raised
    proposals: int  # the RPN's proposals on the image (PyTorch)
    candidates_many: int
    candidates_few: int
    background_bias: float


@torch.no_grad()
def trained_like(spec, image: np.ndarray, *, seed: int = 0, sigma: float = 2.5,
                 candidates: int = 3000, few: int = 4,
                 background_bias: float | None = None) -> Conditioned:
    """Weights for ``spec`` conditioned on ``image`` (BGR [3, H, W]) as the module says;
    ``background_bias`` overrides the few regime's searched value."""
    state = random_state_dict(spec, seed=seed)
    model = model_from_state(spec, state).eval()
    x = torch.from_numpy(image)[None]
    sizes = torch.tensor([list(image.shape[1:])], dtype=torch.int64)
    masks = PaddingMasks(sizes, spec.size_divisibility, enabled=False)
    x = (x - model.pixel_mean) / model.pixel_std
    feats = model.backbone(x, masks)
    head = model.proposal_generator.rpn_head
    outs = [head(f) for f in feats]
    std_logits = torch.cat([o[0].reshape(-1) for o in outs]).std()
    std_deltas = torch.cat([o[1].reshape(-1) for o in outs]).std()
    pre = "proposal_generator.rpn_head."
    state[pre + "objectness_logits.weight"] = state[pre + "objectness_logits.weight"] / std_logits
    state[pre + "anchor_deltas.weight"] = state[pre + "anchor_deltas.weight"] * (0.05 / std_deltas)
    model = model_from_state(spec, state).eval()
    props, _, valid = model.proposal_generator(feats, sizes, masks)
    heads = model.roi_heads
    roi_feats = heads.box_features(feats[:heads.num_levels], props, None)[valid.reshape(-1)]
    gen = torch.Generator().manual_seed(seed + 1)
    c = spec.num_classes
    w = torch.randn((c + 1, roi_feats.shape[1]), generator=gen)
    fg = (roi_feats @ w[:c].T).double().numpy()
    scale = sigma / fg.std()
    fg = fg * scale
    t = spec.score_thresh_test
    # the foreground bias that gives about `candidates` pairs above the threshold
    beta = _bisect(lambda b: _candidates(fg + b, 0.0, t) >= candidates, -60.0, 60.0)
    fg = fg + beta
    n_many = _candidates(fg, 0.0, t)
    bg = background_bias
    if bg is None:
        bg = _bisect(lambda b: _candidates(fg, b, t) <= few, 0.0, 80.0)
    n_few = _candidates(fg, bg, t)
    pred = "roi_heads.box_predictor."
    state[pred + "cls_score.weight"] = (w * scale).to(torch.float32)
    state[pred + "cls_score.weight"][c] = 0.0
    bias = torch.full((c + 1,), float(beta), dtype=torch.float32)
    bias[c] = 0.0
    state[pred + "cls_score.bias"] = bias
    deltas = heads.box_predictor.bbox_pred(roi_feats)
    state[pred + "bbox_pred.weight"] = state[pred + "bbox_pred.weight"] * (0.1 / deltas.std())
    few_state = dict(state)
    few_bias = bias.clone()
    few_bias[c] = float(bg)
    few_state[pred + "cls_score.bias"] = few_bias
    return Conditioned(state, few_state, int(valid.sum()), n_many, n_few, float(bg))


def write_checkpoint(folder: Path, state: dict) -> tuple[Path, Path]:
    """(model_final.pth, config.yaml) in ``folder``, as detectron2 reads them."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(full_size_config()))
    weights = folder / "model_final.pth"
    torch.save({"model": state}, weights)
    return weights, config


def main(argv=None) -> int:
    folder = Path((argv or sys.argv[1:])[0])
    cond = trained_like(full_size_spec(), image_800x1216())
    for regime in ("many", "few"):
        write_checkpoint(folder / regime, getattr(cond, regime))
    print(f"wrote {folder}/many and {folder}/few; proposals {cond.proposals}, candidates "
          f"{cond.candidates_many} / {cond.candidates_few}, background bias {cond.background_bias:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
