"""Tiny Ultralytics checkpoints for the tests, built from the packaged yaml (no download) and
saved by Ultralytics' own ``YOLO.save``; their class biases are raised so that a random-init
head gives detections above the export's score threshold."""

from __future__ import annotations

import json
import os
import tempfile

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="yolo_cfg_"))

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from norcal.export.families.ultralytics.checkpoint import import_ultralytics  # noqa: E402

import_ultralytics()  # as the library imports it: PIL's Image.open stays PIL's for the other tests

IMAGES = sorted((Path(__file__).parent / "fixtures" / "d2_lvis_tiny" / "images").glob("*.png"))
NUM_CLASSES = 6
IMGSZ = 96  # the size the test checkpoints record as trained at: their exports' input, tiny and quick
# a deployment-like score threshold (the best-class decoding's conf) these random-init models still pass on
# every image
BEST_CLASS_CONF = 0.05
# per-class biases of the final class convs: spread so classes score apart (sigmoid -2.2 = 0.1)
BIASES = (-2.2, -3.5, -4.5, -5.5, -3.0, -6.0)


def _spread(model, nc: int) -> None:
    """A random-init network's activations vanish layer by layer (unit BatchNorm statistics):
    set every BatchNorm's statistics from a pass over random images, then rescale the head's last
    convs so their outputs vary across anchors (class logits std ~2 around BIASES, box and mask
    outputs std ~1); all weights stay in float16 range (``model.save`` halves them)."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: one pass sets the statistics
    model.train()
    with torch.no_grad():
        model(torch.rand((4, 3, 160, 160), generator=g) * torch.rand((4, 1, 1, 1), generator=g))
    model.eval()
    head = model.model[-1]
    # DFL-free heads (YOLO26, reg_max 1) regress distances directly around their bias 2 (Ultralytics'
    # bias_init): a narrow spread keeps them positive, as a trained model's, so no box is inverted
    box_std = 1.0 if head.reg_max > 1 else 0.4
    convs = [(seq[-1], 2.0, True) for seq in head.cv3] + [(seq[-1], box_std, False) for seq in head.cv2]
    convs += [(seq[-1], 1.0, False) for seq in getattr(head, "cv4", [])]
    # YOLO26's one-to-one branch (an end-to-end head predicts with it), spread alike, drawn last
    for name, std, is_cls in (("one2one_cv3", 2.0, True), ("one2one_cv2", box_std, False), ("one2one_cv4", 1.0, False)):
        convs += [(seq[-1], std, is_cls) for seq in (getattr(head, name, None) or [])]
    seen = {}
    hooks = [c.register_forward_hook(lambda m, i, o: seen.update({m: i[0].std().item()})) for c, _, _ in convs]
    with torch.no_grad():
        model(torch.rand((1, 3, 160, 160), generator=g))
        for h in hooks:
            h.remove()
        for conv, std, is_cls in convs:
            fan_in = conv.weight[0].numel()
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * std / (seen[conv] * fan_in ** 0.5 + 1e-12))
            if is_cls:
                conv.bias.copy_(torch.tensor([BIASES[c % len(BIASES)] for c in range(nc)]))
    proto = getattr(head, "proto", None)
    if proto is not None:  # segment: the prototypes' last BatchNorm set from the photos' own statistics
        _unit_protos(model, proto.cv3.bn)


def _unit_protos(model, bn) -> None:
    """Left as the pass over random images sets them, a random-init model's prototypes reach ~500
    on photographs and its mask logits (coefficients . prototypes, std ~850) change by ~3500 per
    prototype pixel, where a trained model's change by tens: a box 3e-4 px apart between two
    fp32 kernels then moved a mask probability by 0.02. Set the prototypes' last BatchNorm from
    the test photographs so the prototypes are SiLU of unit-variance values there (mask logits
    std ~9, slopes ~35 per prototype pixel)."""
    from PIL import Image

    seen = {}
    hook = bn.register_forward_hook(lambda m, i, o: seen.update(x=i[0].detach()))
    photos = [np.asarray(Image.open(p).convert("RGB").resize((160, 160)), np.float32) / 255.0 for p in IMAGES]
    with torch.no_grad():
        model(torch.from_numpy(np.stack(photos).transpose(0, 3, 1, 2)))
        hook.remove()
        x = seen["x"]
        bn.running_mean.copy_(x.mean(dim=(0, 2, 3)))
        bn.running_var.copy_(x.var(dim=(0, 2, 3)))
        bn.weight.fill_(1.0)
        bn.bias.zero_()


def make_checkpoint(path: Path, yaml: str = "yolo11n.yaml", nc: int = NUM_CLASSES, seed: int = 0,
                    imgsz: int | None = None, end2end: bool = False) -> Path:
    """A ``model.save()`` checkpoint of a random-init ``yaml`` model with ``nc`` classes
    (``imgsz``: the size it records as trained at, in its ``args``, as a trainer's model holds it;
    ``end2end``: a YOLO26 saved with its one-to-one head selected, as ``head.end2end = True``
    leaves it)."""
    from ultralytics import YOLO
    from ultralytics.nn.tasks import DetectionModel, SegmentationModel

    torch.manual_seed(seed)
    kind = SegmentationModel if "-seg" in yaml else DetectionModel
    model = kind(yaml, nc=nc, verbose=False)
    model.names = {i: f"class{i}" for i in range(nc)}
    if imgsz is not None:
        model.args = {"imgsz": int(imgsz)}
    _spread(model.eval(), nc)
    if end2end:
        model.model[-1].end2end = True
    yolo = YOLO(yaml)
    yolo.model = model
    yolo.save(str(path))
    return path


def write_table(path: Path, nc: int = NUM_CLASSES) -> tuple[Path, np.ndarray]:
    """A calibration table JSON with ``nc`` classes; returns it and the image counts N_c."""
    counts = np.array([5 * 3 ** (c % 7) for c in range(nc)], dtype=np.float64)
    cats = [{"id": c + 1, "name": f"class{c}", "image_count": int(n), "instance_count": int(n) + 1,
             "frequency": "f"} for c, n in enumerate(counts)]
    path.write_text(json.dumps({"name": "yolo_test", "source": "tests", "count_type": "image", "categories": cats}))
    return path, counts


# --- RT-DETR: a tiny rtdetr-l (the same layer kinds: HGStem, HGBlock, AIFI, RepC3, RTDETRDecoder
# with 300 queries), 2 decoder layers of width 32, quick on a CPU at RTDETR_IMGSZ
RTDETR_IMGSZ = 128
WH_BIAS = 0.6  # added to the inverse-sigmoid w, h by each box head: boxes of ~20-60% of the input
RTDETR_YAML = """
nc: {nc}
backbone:
  - [-1, 1, HGStem, [16, 16]]
  - [-1, 1, HGBlock, [16, 32, 3]]
  - [-1, 1, DWConv, [32, 3, 2, 1, False]]  # 2-P3/8
  - [-1, 1, HGBlock, [16, 32, 3]]
  - [-1, 1, DWConv, [32, 3, 2, 1, False]]  # 4-P4/16
  - [-1, 1, HGBlock, [16, 32, 3, True, False]]
  - [-1, 1, DWConv, [32, 3, 2, 1, False]]  # 6-P5/32
  - [-1, 1, HGBlock, [16, 64, 3, True, False]]
head:
  - [-1, 1, Conv, [32, 1, 1, None, 1, 1, False]]
  - [-1, 1, AIFI, [64, 4]]
  - [-1, 1, Conv, [32, 1, 1]]  # 10
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [5, 1, Conv, [32, 1, 1, None, 1, 1, False]]
  - [[-2, -1], 1, Concat, [1]]
  - [-1, 1, RepC3, [32]]
  - [-1, 1, Conv, [32, 1, 1]]  # 15
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [3, 1, Conv, [32, 1, 1, None, 1, 1, False]]
  - [[-2, -1], 1, Concat, [1]]
  - [-1, 1, RepC3, [32]]  # 19
  - [-1, 1, Conv, [32, 3, 2]]
  - [[-1, 15], 1, Concat, [1]]
  - [-1, 1, RepC3, [32]]  # 22
  - [-1, 1, Conv, [32, 3, 2]]
  - [[-1, 10], 1, Concat, [1]]
  - [-1, 1, RepC3, [32]]  # 25
  - [[19, 22, 25], 1, RTDETRDecoder, [nc, 32, 300, 4, 4, 2, 64]]
"""


def redraw_rtdetr(model, seed: int = 1, biases: bool = False) -> None:
    """Redraw an RT-DETR's linear and conv weights (seeded) with a larger scale so that scores
    spread (at Ultralytics' initialisation every query scores almost the same and ties would
    decide the order) and boxes vary (its box heads start at zero: every box would be its
    query's anchor); the box heads gently (boxes of a few to tens of pixels, not slivers). With
    ``biases`` the class heads' biases are set per class (:data:`BIASES` cycled), so that
    classes score apart and NorCal's reordering shows, and the box heads' w, h biases raised
    (boxes the size of objects in the test images, so that AP is not zero)."""
    head = model.model[-1]
    box_heads = {id(p) for m in (*head.dec_bbox_head, head.enc_bbox_head) for p in m.parameters()}
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                scale = 0.6 if id(m.weight) in box_heads else 1.5
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (scale / m.weight[0].numel() ** 0.5))
        if biases:
            for m in (*head.dec_score_head, head.enc_score_head):
                m.bias.copy_(torch.tensor([BIASES[c % len(BIASES)] for c in range(len(m.bias))]))
            for mlp in (*head.dec_bbox_head, head.enc_bbox_head):
                mlp.layers[-1].bias[2:] = WH_BIAS


def make_rtdetr_checkpoint(path: Path, nc: int = NUM_CLASSES, imgsz: int = RTDETR_IMGSZ, seed: int = 0) -> Path:
    """A ``model.save()`` checkpoint of the tiny RT-DETR above with ``nc`` classes, weights
    redrawn (:func:`redraw_rtdetr`), recording ``imgsz`` as its trained size."""
    from ultralytics import RTDETR

    yaml = path.with_name(path.stem + "-tiny.yaml")
    yaml.write_text(RTDETR_YAML.format(nc=nc))
    torch.manual_seed(seed)
    rt = RTDETR(str(yaml))
    model = rt.model.eval()
    model.names = {i: f"class{i}" for i in range(nc)}
    model.args = {"imgsz": int(imgsz)}
    redraw_rtdetr(model, biases=True)
    rt.save(str(path))
    return path
