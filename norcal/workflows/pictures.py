"""Pictures of what NorCal changes: baseline and NorCal detections side by side, one PNG per image.

``norcal demo`` draws the validation images where NorCal finds the most rare-class objects
the baseline misses; ``norcal infer --draw`` draws the first images it ran, beside the same
model with its NorCal node stripped (the baseline, recovered exactly from the graph).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from norcal.core.boxes import box_iou
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import CalibrationTable, frequency_group
from norcal.runtime.draw import DrawOptions, save_panels, shown_indices
from norcal.runtime.postprocess import ImageDetections

IOU_HIT = 0.5


def class_groups(table: CalibrationTable) -> list[str]:
    """Frequency group ('r', 'c', 'f') per class, from the table's training image counts."""
    return [frequency_group(n) for n in table.counts("image")]


def rare_hits(det: ImageDetections, gt_boxes: np.ndarray, gt_classes: np.ndarray,
              groups: Sequence[str], options: DrawOptions) -> int:
    """How many rare-class GT objects (boxes [G, 4] x0, y0, x1, y1; class indices [G]) a
    detection the picture shows finds: same class, IoU >= 0.5."""
    keep = shown_indices(det, options)
    rare = np.array([groups[c] == "r" for c in gt_classes], dtype=bool)
    if not len(keep) or not rare.any():
        return 0
    iou = box_iou(np.asarray(gt_boxes)[rare], np.asarray(det.boxes)[keep])
    same = np.asarray(gt_classes)[rare][:, None] == np.asarray(det.classes)[keep][None, :]
    return int(((iou >= IOU_HIT) & same).any(axis=1).sum())


def gt_objects(gt: dict, table: CalibrationTable) -> dict:
    """{image_id: float64 [G, 5] (x0, y0, x1, y1, class index)} from a LVIS/COCO dict."""
    cls = {cid: k for k, cid in enumerate(table.category_ids)}
    rows: dict = {im["id"]: [] for im in gt.get("images", [])}
    for a in gt.get("annotations", []):
        if a["category_id"] in cls:
            x, y, w, h = a["bbox"]
            rows.setdefault(a["image_id"], []).append((x, y, x + w, y + h, cls[a["category_id"]]))
    return {i: np.asarray(r, np.float64).reshape(-1, 5) for i, r in rows.items()}


def gt_caption(objects: np.ndarray, table: CalibrationTable) -> str:
    """'ground truth: 3_star (r), 8_square (f)' for one image's GT objects."""
    groups = class_groups(table)
    names = [f"{table.names[c]} ({groups[c]})" for c in objects[:, 4].astype(np.int64)]
    return "ground truth: " + (", ".join(names) if names else "none")


def pick_images(objects: dict, table: CalibrationTable, baseline: dict, norcal: dict, count: int,
                options: DrawOptions) -> list:
    """The ``count`` image ids where NorCal's shown detections find the most rare GT objects
    the baseline's do not (then the most found, then id order). objects: :func:`gt_objects`;
    baseline / norcal: {image_id: ImageDetections}."""
    groups = class_groups(table)
    ranked = []
    for i in norcal:
        g = objects.get(i, np.zeros((0, 5)))
        hits = [rare_hits(d[i], g[:, :4], g[:, 4].astype(np.int64), groups, options)
                for d in (baseline, norcal)]
        ranked.append((-(hits[1] - hits[0]), -hits[1], i))
    return [i for *_, i in sorted(ranked)[:count]]


def write_pictures(folder: str | os.PathLike, images: Sequence[tuple[str, np.ndarray]],
                   panels: Sequence[Sequence[tuple[str, ImageDetections]]], table: CalibrationTable,
                   options: DrawOptions | None = None, captions: Sequence[str] | None = None) -> list[Path]:
    """One PNG per image, ``folder/<name>.png``: images [(name, RGB uint8 [H, W, 3])],
    panels[k]: the (title, detections) pairs drawn side by side over image k, captions[k]
    its legend line."""
    folder = Path(folder)
    groups = class_groups(table)
    captions = captions or [""] * len(images)
    return [save_panels(folder / f"{name}.png", rgb, p, table.names, groups, options, c)
            for (name, rgb), p, c in zip(images, panels, captions)]


def draw_model_pictures(model: str | os.PathLike, drawn: Sequence[tuple[Path, np.ndarray, ImageDetections]],
                        folder: str | os.PathLike, table: CalibrationTable, provider: str | None = None,
                        options: DrawOptions | None = None) -> list[Path]:
    """Pictures of a model's detections (``drawn``: (image path, its decoded RGB pixels,
    detections)); an ONNX model with a NorCal node is drawn beside its baseline (the node
    stripped, run here on the same pixels, one image a batch as the pictures' run was), any
    other model alone."""
    import onnx

    from norcal.core import contract
    from norcal.core.files.onnx_io import load_onnx
    from norcal.export.graph.surgery import has_norcal, norcal_metadata, strip_norcal
    from norcal.runtime.inference import detect, input_spec, prepare, runner_metadata
    from norcal.runtime.runners import open_runner

    if not drawn:
        raise NorcalError("no images to draw")
    model = Path(model)
    name = model.stem
    base = None
    if model.suffix.lower() == ".onnx":
        graph = load_onnx(model)
        if has_norcal(graph):
            gamma = norcal_metadata(graph).get(contract.GAMMA, "?")
            name = f"NorCal γ={gamma}"
            with tempfile.TemporaryDirectory(prefix="norcal-draw-") as tmp:
                plain = Path(tmp) / "baseline.onnx"
                onnx.save(strip_norcal(graph), str(plain))  # scratch, not an output: written directly
                runner = open_runner(plain, provider)
                spec = input_spec(runner_metadata(runner))
                base = [detect(runner, prepare([image], spec))[0] for _, image, _ in drawn]
                del runner  # release the session before its file goes
    images, panels = [], []
    for k, (path, image, det) in enumerate(drawn):
        images.append((Path(path).stem, image))
        panels.append([("baseline (NorCal stripped)", base[k]), (name, det)] if base else [(name, det)])
    return write_pictures(folder, images, panels, table, options)
