"""One case per detector family for the conformance suite (tests/export/families/test_conformance.py):
its tiny checkpoint, the images it runs on, and its upstream reference with NorCal by hand.

A reference is the family's own code, never ours: detectron2's goldens (made by the real
detectron2: plain softmax and its NorCal at gamma 0.5), Ultralytics' model and its
``non_max_suppression``, torchvision's model and its ``roi_heads``; NorCal is applied by hand to
their class logits. The Ultralytics and torchvision references are the ones their family tests
use (tests/export/families/*_family/).

The foreign family (any ONNX graph of no known family) is tried on torchvision's own ONNX export
of a Faster R-CNN (``torch.onnx.export`` of the torchvision model, not our exporter), against that
torchvision model with NorCal by hand. detectron2's own export of d2_lvis_tiny is no use here: it
is traced at a fixed 800x1216 input (its padding and image size are constants) while detectron2's
goldens are at the config's 320 / 512 resize.

Adding a family: one :class:`FamilyCase` in :data:`CASES`, keyed by the family's ``name``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

TESTS = Path(__file__).parent
D2_TINY = TESTS / "fixtures" / "d2_lvis_tiny"


@dataclass
class Checkpoint:
    """A family's tiny checkpoint as the export job takes it, and what its reference needs.

    path / config: the files; table: the calibration table (built-in name or JSON); images:
    PNGs of different sizes; upstream: the family's own model or counts, for its reference."""

    path: Path
    table: str | Path
    images: list[Path]
    config: Path | None = None
    upstream: Any = None


@dataclass(frozen=True)
class Reference:
    """One image's upstream detections in the graph's coordinates (the resized image)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray


@dataclass(frozen=True)
class GraphIO:
    """A graph's own inputs and outputs, where they are another tool's, not our contract's.

    feeds(image): its feeds for one image (RGB uint8 HWC); detections(outputs by name): that
    image's (boxes, scores, classes 0-based) in its reference's coordinates; profiles: the
    ``norcal check --profile`` entries its dynamic inputs need."""

    feeds: Callable[[np.ndarray], dict[str, np.ndarray]]
    detections: Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray, np.ndarray]]
    profiles: tuple[str, ...] = ()


@dataclass(frozen=True)
class FamilyCase:
    """make(folder) -> its :class:`Checkpoint` (an ONNX file for a family that reads no
    checkpoints); reference(checkpoint, gammas) -> per gamma, one :class:`Reference` per image of
    ``checkpoint.images`` (all gammas at once: a network's shared part runs once); min_detections: the fewest each image must have, so that no
    comparison is vacuous; host_sizes: the (min, max) resize the host runs the graph at
    (``norcal infer --min-size/--max-size``), None: the one the export records; graph_io: the
    graph's own I/O (None: our contract); norcal: further NorCal options the export takes
    (e.g. the background slot, which no graph search can tell); not_applicable: check name
    (tests/export/families/test_conformance.py ``CHECKS``) -> one line saying why it does not
    apply to this case."""

    family: str
    make: Callable[[Path], Checkpoint]
    reference: Callable[[Checkpoint, tuple[float, ...]], dict[float, list[Reference]]]
    min_detections: int = 5
    host_sizes: tuple[int, int] | None = None
    graph_io: GraphIO | None = None
    norcal: dict[str, Any] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)


def read_images(paths) -> list[np.ndarray]:
    from norcal.runtime.images import read_rgb

    return [read_rgb(p) for p in paths]


# --- detectron2: the fixture's goldens ------------------------------------------------------

D2_SETTINGS = {0.0: "baseline", 0.5: "cdt_g0.5"}  # detectron2 computed these two gammas


def _d2_make(folder: Path) -> Checkpoint:
    return Checkpoint(D2_TINY / "model_final.pth", "lvis_v1", sorted((D2_TINY / "images").glob("img*.png")),
                      config=D2_TINY / "config.yaml")


def _d2_reference(ckpt: Checkpoint, gammas: tuple[float, ...]) -> dict[float, list[Reference]]:
    """detectron2's own detections (tests/golden.py): plain softmax at gamma 0; at 0.5 its
    NorCal (a_c = N_c^0.5 of LVIS v1's image counts, background untouched, renormalised)."""
    from golden import golden

    out: dict[float, list[Reference]] = {g: [] for g in gammas}
    for p in ckpt.images:
        g = golden(int(p.stem[3:]))
        for gamma in gammas:
            setting = D2_SETTINGS[gamma]
            out[gamma].append(Reference(g[f"{setting}/boxes"], g[f"{setting}/scores"], g[f"{setting}/classes"]))
    return out


# --- Ultralytics: YOLO11 with NorCal by hand on its raw logits -------------------------------

def yolo_reference(ckpt: Path, images, gamma: float, counts, seg: bool = False, max_det: int = 300,
                   size: int | None = None, nc: int | None = None, multi_label: bool = True,
                   conf: float = 0.001, agnostic: bool = False):
    """Ultralytics' own pipeline with NorCal applied by hand to its raw logits (an end-to-end
    head's: its one-to-one branch's, before its top-k of ``max_det``): its LetterBox to the
    ``size`` square, its forward, sigmoid(logit - gamma log N_c), its ``non_max_suppression``
    (multi-label by default, else its predictor's one best class per box, at ``conf``, class-wise
    or ``agnostic``) and ``process_mask``. Returns (detections [n, 6 (+nm)] per image in letterboxed
    coordinates, each image's letterbox offsets (x, y, x, y), masks or None, prototypes
    [nm, S/4, S/4] per image or None)."""
    import torch
    from ultralytics.data.augment import LetterBox
    from ultralytics.utils import ops
    from ultralytics.utils.nms import non_max_suppression

    from yolo_models import IMGSZ, NUM_CLASSES

    s, nc = size or IMGSZ, nc or NUM_CLASSES
    model = torch.load(ckpt, weights_only=False)["model"].float().eval()  # our test file
    head = model.model[-1]
    lb = [LetterBox((s, s), auto=False)(image=im.copy()) for im in images]
    x = torch.from_numpy(np.stack(lb).transpose(0, 3, 1, 2).astype(np.float32) / 255.0)
    with torch.no_grad():
        out = model(x)
    (y, proto), raw = out if seg else ((out[0], None), out[1])
    e2e = head.end2end
    raw = raw["one2one"] if e2e else raw.get("one2many", raw)  # YOLO26 with nms None: one-to-many
    logits = raw["scores"].double().numpy()  # [B, C, A], before the head's sigmoid
    probs = 1.0 / (1.0 + np.exp(-(logits - gamma * np.log(counts)[None, :, None])))
    with torch.no_grad():  # an end-to-end head's y is already its top-k: decode all anchors again
        boxes = head._get_decode_boxes(raw) if e2e else y[:, :4]  # corners when end-to-end
    pred = torch.cat([boxes, torch.from_numpy(probs.astype(np.float32))]
                     + ([raw["mask_coefficient"]] if seg else []), 1)
    if e2e:
        head.max_det = max_det  # as the predictor sets it
        with torch.no_grad():
            pred = head.postprocess(pred.permute(0, 2, 1))  # [B, k, 6 (+nm)]: get_topk_index
    dets = non_max_suppression(pred, conf_thres=conf, iou_thres=0.7, multi_label=multi_label, max_det=max_det,
                               nc=nc, end2end=e2e, agnostic=agnostic)
    pads = []
    for im in images:
        p = LetterBox((s, s), auto=False).get_params({"img": im})
        pads.append(np.array([p["left"], p["top"]] * 2, np.float32))
    masks = [ops.process_mask(proto[b], d[:, 6:], d[:, :4], (s, s), upsample=True).numpy().astype(bool)
             for b, d in enumerate(dets)] if seg else None
    protos = [p.double().numpy() for p in proto] if seg else None
    return [d.numpy() for d in dets], pads, masks, protos


def _yolo_make(folder: Path) -> Checkpoint:
    from yolo_models import IMAGES, IMGSZ, make_checkpoint, write_table

    table, counts = write_table(folder / "yolo_table.json")
    path = make_checkpoint(folder / "yolo11n_tiny.pt", "yolo11n.yaml", imgsz=IMGSZ)
    return Checkpoint(path, table, list(IMAGES), upstream=counts)


def _yolo_reference(ckpt: Checkpoint, gammas: tuple[float, ...]) -> dict[float, list[Reference]]:
    out = {}
    for gamma in gammas:
        dets, pads, _, _ = yolo_reference(ckpt.path, read_images(ckpt.images), gamma, ckpt.upstream)
        # the letterbox graph removes the centring offset itself: its boxes are in resized coordinates
        out[gamma] = [Reference(d[:, :4] - pad, d[:, 4], d[:, 5].astype(np.int64)) for d, pad in zip(dets, pads)]
    return out


# --- torchvision: Faster R-CNN with NorCal by hand before its own postprocess ----------------

def torchvision_prior(gamma: float, counts=None):
    """NorCal's log prior in torchvision's layout: background (first) untouched, then
    gamma * log N_c (``counts``: the table's, default tests/torchvision_models.COUNTS)."""
    import torch

    from torchvision_models import COUNTS

    return torch.tensor([0.0] + [gamma * math.log(c) for c in (COUNTS if counts is None else counts)])


def torchvision_reference(model, img: np.ndarray, gammas=(0.5,), to_original: bool = False) -> list[dict]:
    """torchvision's own pipeline (GeneralizedRCNN.forward before the boxes go back to the
    original image; ``to_original``: the whole forward, boxes mapped back by its transform's
    postprocess) with the class logits shifted by NorCal's prior before its softmax, one result
    per gamma (the network up to the ROI heads run once)."""
    import torch

    with torch.no_grad():
        images, _ = model.transform([torch.from_numpy(img).permute(2, 0, 1).float() / 255])
        features = model.backbone(images.tensors)
        proposals, _ = model.rpn(images, features)
    out = []
    for gamma in gammas:
        lp = torchvision_prior(gamma)
        hook = model.roi_heads.box_predictor.register_forward_hook(lambda m, a, o: (o[0] - lp, o[1]))
        try:
            with torch.no_grad():
                dets, _ = model.roi_heads(features, proposals, images.image_sizes)
        finally:
            hook.remove()
        if to_original:
            dets = model.transform.postprocess(dets, images.image_sizes, [tuple(img.shape[:2])])
        d = {k: v.numpy() for k, v in dets[0].items()}
        d["labels"] = d["labels"] - 1  # torchvision's labels count the background as 0
        d["size"] = tuple(images.image_sizes[0])
        out.append(d)
    return out


TV_SIZES = (224, 352)  # a 224 side pads to 7 stride-32 cells: torchvision's P6 stride 56, not 64
# the box head's width (torchvision's 1024 is half the model's weights and most of its work over
# 1000 proposals): what a family reads from the state dict, so any width tests the same path
TV_BOX_WIDTH = 256


def _tv_make(folder: Path) -> Checkpoint:
    import torch

    from torchvision_models import table_file, tiny_rcnn

    # the export records torchvision's default resize (800 / 1333); the graph takes any size, and
    # the host runs it at TV_SIZES (a tenth of the pixels), as the model is built for here
    model = tiny_rcnn(min_size=TV_SIZES[0], max_size=TV_SIZES[1], box_width=TV_BOX_WIDTH)
    path = folder / "faster_rcnn_tiny.pth"
    torch.save(model.state_dict(), path)
    return Checkpoint(path, table_file(folder / "tv_table.json"), sorted((D2_TINY / "images").glob("img*.png")),
                      upstream=model)


def _tv_reference(ckpt: Checkpoint, gammas: tuple[float, ...], to_original: bool = False
                  ) -> dict[float, list[Reference]]:
    refs = [torchvision_reference(ckpt.upstream, img, gammas, to_original) for img in read_images(ckpt.images)]
    return {g: [Reference(r[i]["boxes"], r[i]["scores"], r[i]["labels"]) for r in refs] for i, g in enumerate(gammas)}


# --- foreign: torchvision's own ONNX export of the torchvision Faster R-CNN ------------------

def _tv_graph_make(folder: Path) -> Checkpoint:
    """The torchvision case's model exported by torch.onnx as torchvision supports it: a list of
    one image [3, H, W] (0-1 RGB; resize and normalisation inside), H and W dynamic; boxes in the
    image's coordinates, labels counting the background as 0. Its ROI heads take the RPN's top
    200 proposals (a constructor argument the export traces with the model, so the graph and its
    reference agree): a fifth of the box head's work at torchvision's 1000."""
    import warnings

    import torch

    from torchvision_models import table_file, tiny_rcnn

    model = tiny_rcnn(min_size=TV_SIZES[0], max_size=TV_SIZES[1], box_width=TV_BOX_WIDTH,
                      rpn_post_nms_top_n_test=200)
    path = folder / "faster_rcnn_tiny.onnx"
    with warnings.catch_warnings():  # the tracer's warnings about torchvision's shape arithmetic
        warnings.simplefilter("ignore")
        torch.onnx.export(model, ([torch.rand(3, 240, 320)],), str(path), opset_version=17, dynamo=False,
                          input_names=["image"], output_names=["boxes", "labels", "scores"],
                          dynamic_axes={"image": [1, 2]})
    return Checkpoint(path, table_file(folder / "tv_table.json"), sorted((D2_TINY / "images").glob("img*.png")),
                      upstream=model)


def _tv_image(img: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32) / 255


def _tv_graph_reference(ckpt: Checkpoint, gammas: tuple[float, ...]) -> dict[float, list[Reference]]:
    """torchvision's whole forward (boxes mapped back to the image, as its graph does) with the
    class logits shifted by NorCal's prior before its softmax; 0-based classes."""
    return _tv_reference(ckpt, gammas, to_original=True)


TV_GRAPH_IO = GraphIO(
    feeds=lambda img: {"image": _tv_image(img)},
    detections=lambda out: (out["boxes"], out["scores"], out["labels"] - 1),
    profiles=("image:3x200x200:3x480x640:3x1333x1333",))


# --- the table: one entry per registered family ------------------------------------------------

CHECKPOINT_EXPORT = "a checkpoint export: its classifier is its Detector's (the detector check)"

CASES: dict[str, FamilyCase] = {c.family: c for c in (
    FamilyCase("ultralytics", _yolo_make, _yolo_reference, not_applicable={"search": CHECKPOINT_EXPORT}),
    FamilyCase("torchvision", _tv_make, _tv_reference, host_sizes=TV_SIZES,
               not_applicable={"search": CHECKPOINT_EXPORT}),
    FamilyCase("detectron2", _d2_make, _d2_reference, not_applicable={"search": CHECKPOINT_EXPORT}),
    FamilyCase("foreign", _tv_graph_make, _tv_graph_reference, graph_io=TV_GRAPH_IO,
               norcal={"background": "first"},  # torchvision's: no graph search can tell
               not_applicable={
                   "batch": "torchvision's export takes one image [3, H, W]: no batch axis",
                   "infer": "its inputs and outputs are torchvision's (image; boxes, labels, scores), not ours",
                   "detector": "no checkpoint, so no Detector: the search check compares with the graph",
               }),
)}
