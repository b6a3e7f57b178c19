"""Detections -> COCO/LVIS results JSON (what lvis-api's ``LVISResults`` and pycocotools load).

Each detection becomes ``{image_id, category_id, bbox: [x, y, w, h], score}`` plus, for mask
models, ``segmentation``: compressed RLE with ``counts`` as str, like detectron2's
``instances_to_coco_json``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator, TextIO

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import atomic_path
from norcal.core.datasets.schemas import ANNOTATIONS, ids_of, record_error
from norcal.core.datasets.yolo_ground_truth import read_annotations
from norcal.runtime.postprocess import ImageDetections, paste_mask_regions


def region_rle_counts(region: np.ndarray, y0: int, x0: int, image_hw) -> np.ndarray:
    """Uncompressed RLE counts of an [H,W] mask that is zero outside ``region`` placed at (y0, x0).

    Works on the region only (no full-image mask): runs are over the column-major order,
    starting with zeros, as pycocotools' rleEncode.
    """
    H, W = int(image_hw[0]), int(image_hw[1])
    h, w = region.shape
    if h == 0 or w == 0 or not region.any():
        return np.array([H * W], np.int64)
    # One zero row above and below each column: every run starts inside the padded region,
    # and a start on the bottom pad row (y0 + h) maps to the right global index even when
    # it is the next column's first pixel.
    padded = np.zeros((h + 2, w), np.int8)
    padded[1:-1] = region
    flat = padded.ravel(order="F")
    starts = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    rows, cols = starts % (h + 2), starts // (h + 2)
    where = (x0 + cols).astype(np.int64) * H + (y0 - 1 + rows)
    where = where[where < H * W]  # a 0-run "starting" past the last pixel is no run
    return np.diff(np.concatenate(([0], where, [H * W])))


def _mask_regions(det: ImageDetections, threshold: float, memo: dict | None):
    """(keys, rows, regions): with a ``memo``, a key per detection naming exactly what its region
    is computed from (the mask input and the box), the detections whose key the memo lacks, and
    their regions; without, every detection's region."""
    h, w = det.image_size
    n = len(det)
    if memo is None:
        return None, range(n), paste_mask_regions(det.mask_probs, det.boxes, (h, w), threshold, det.mask_paste,
                                                  det.mask_protos)
    import hashlib

    boxes = np.asarray(det.boxes, np.float32).reshape(-1, 4)
    tail = repr((threshold, h, w)).encode()
    if det.mask_paste == "ultralytics":
        from norcal.runtime.proto_masks import map_regions, proto_maps, read_bytes, region_taps

        # the maps of all detections in one product, as without a memo (a BLAS row may depend on the rows)
        maps = proto_maps(det.mask_probs, det.mask_protos)
        taps = region_taps(maps.shape[1:], boxes, (h, w))
        read = [b"" if t is None else read_bytes(maps[i], t) for i, t in enumerate(taps)]
    else:
        masks = np.asarray(det.mask_probs, np.float32)
        read = [masks[i].tobytes() for i in range(n)]
    keys = [hashlib.blake2b(read[i] + boxes[i].tobytes() + tail, digest_size=16).digest() for i in range(n)]
    rows = [i for i in range(n) if keys[i] not in memo]
    if det.mask_paste == "ultralytics":
        regions = map_regions(maps[rows], boxes[rows], (h, w), threshold, [taps[i] for i in rows])
    else:  # each of these pastes reads its own mask and box only
        regions = paste_mask_regions(masks[rows], boxes[rows], (h, w), threshold, det.mask_paste)
    return keys, rows, regions


def image_mask_rles(det: ImageDetections, threshold: float = 0.5, memo: dict | None = None) -> list[dict]:
    """One image's masks pasted (:func:`paste_mask_regions`) and compressed-RLE encoded
    ({'size': [H, W], 'counts': str}), in detection order. ``memo``: a dict kept across calls
    for the same image (tune's gammas re-select the same detections): a detection whose mask
    input and box were seen reuses that RLE instead of pasting it again."""
    from pycocotools import mask as mask_util

    h, w = det.image_size
    keys, rows, regions = _mask_regions(det, threshold, memo)
    uncompressed = [{"size": [h, w], "counts": region_rle_counts(region, ry, rx, (h, w)).tolist()}
                    for _, (region, ry, rx) in zip(rows, regions)]
    # pycocotools compresses uncompressed RLE in C, all masks of the image in one call
    counts = [r["counts"].decode("ascii") for r in mask_util.frPyObjects(uncompressed, h, w)] if uncompressed else []
    if memo is None:
        return [{"size": [h, w], "counts": c} for c in counts]
    memo.update(zip((keys[i] for i in rows), counts))
    return [{"size": [h, w], "counts": memo[k]} for k in keys]


def detections_to_results(image_id: int | str, det: ImageDetections, category_ids: list[int] | None,
                          with_masks: bool = True, mask_threshold: float = 0.5) -> list[dict]:
    """One image's detections -> result dicts (masks pasted one at a time, then RLE-encoded).

    category_ids: class index -> dataset category id; None keeps detectron2's LVIS default
    (index + 1).
    """
    out = []
    masks = with_masks and det.mask_probs is not None and len(det) > 0
    for i in range(len(det)):
        c = int(det.classes[i])
        if category_ids is None:
            cat = c + 1
        elif 0 <= c < len(category_ids):
            cat = int(category_ids[c])
        else:
            raise NorcalError(f"class index {c} out of range: {len(category_ids)} category ids known")
        x0, y0, x1, y1 = (float(v) for v in det.boxes[i])
        wh = det.boxes[i, 2:] - det.boxes[i, :2]  # float32, as detectron2's BoxMode.convert
        out.append({"image_id": image_id, "category_id": cat,
                    "bbox": [x0, y0, float(wh[0]), float(wh[1])], "score": float(det.scores[i])})
    if masks and out:
        for r, rle in zip(out, image_mask_rles(det, mask_threshold)):
            r["segmentation"] = rle
    return out


def category_ids_from_annotations(path: str | Path | dict, where: str | None = None,
                                  sizes: dict[str, tuple[int, int]] | None = None,
                                  names: list[str | None] | None = None, split: str = "val"
                                  ) -> tuple[list[int], dict[str, int]]:
    """From a COCO/LVIS annotation file (or its loaded dict; ``where`` names it in errors):
    (category ids in id order, image file name -> image id).

    File names are matched by base name (``file_name`` or, for LVIS, ``coco_url``). The
    annotations are checked against :data:`norcal.core.datasets.schemas.ANNOTATIONS` (integer ids).
    sizes: a dict to fill with file name -> (height, width) where an image gives both as
    positive integers. names: a list to fill with the categories' names in id order (None
    where a category has none), to compare with the model's
    (:func:`norcal.core.contract.check_class_names`). A path to an Ultralytics data.yaml is
    read as its ``split``'s annotations (:mod:`norcal.core.datasets.yolo_ground_truth`).
    """
    if isinstance(path, dict):
        p = where or "annotations"
        data = ANNOTATIONS.validate(path, p)
    else:
        p = Path(path)
        data = read_annotations(p, "annotations", ANNOTATIONS, split)
    if "images" not in data:
        raise NorcalError(f"{p}: not a COCO/LVIS annotation file (needs 'images' and 'categories')")
    ids = ids_of(str(p), "categories", data["categories"])
    if names is not None:
        names[:] = [c.get("name") for _, c in sorted(zip(ids.tolist(), data["categories"]), key=lambda t: t[0])]
    image_ids = ids_of(str(p), "images", data["images"])
    by_name: dict[str, int] = {}
    first: dict[str, int] = {}  # base name -> the index of the image that has it
    for k, (im, iid) in enumerate(zip(data["images"], image_ids.tolist())):
        key = "file_name" if im.get("file_name") else "coco_url"
        ref = im.get(key) or ""
        if ref:
            name = Path(str(ref)).name
            if name in first and by_name[name] != iid:
                j = first[name]
                other = data["images"][j].get("file_name") or data["images"][j].get("coco_url")
                raise record_error(str(p), "images", k, im, key,
                                   f"{ref} has the base name of images[{j}] (id {by_name[name]})'s "
                                   f"{other} (files are matched by base name)")
            by_name[name], first[name] = iid, k
            hw = im.get("height"), im.get("width")
            if sizes is not None and all(type(v) is int and v > 0 for v in hw):
                sizes[name] = hw
    return sorted(ids.tolist()), by_name


def results_fragment(image_id: int | str, det: ImageDetections, category_ids: list[int] | None,
                     with_masks: bool = True) -> tuple[str, int]:
    """One image's results as JSON text, the items of the results list separated as
    ``json.dumps`` separates them (empty when none), and how many (for
    :class:`ResultsStream`; workers send text, not objects)."""
    results = detections_to_results(image_id, det, category_ids, with_masks)
    return ", ".join(json.dumps(r) for r in results), len(results)


class ResultsStream:
    """A results JSON list written one image at a time: the same bytes as
    ``json.dumps(all_results) + "\\n"``, without holding the results in memory."""

    def __init__(self, f: TextIO):
        self.f = f
        self.count = 0
        f.write("[")

    def add(self, fragment: str, count: int) -> None:
        """Append one image's :func:`results_fragment`."""
        if not count:
            return
        if self.count:
            self.f.write(", ")
        self.f.write(fragment)
        self.count += count

    def close(self) -> None:
        self.f.write("]\n")


@contextlib.contextmanager
def results_writer(path: str | Path) -> Iterator[ResultsStream]:
    """Stream a results JSON to ``path`` (atomic: :func:`norcal.core.files.fileio.atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        stream = ResultsStream(f)
        yield stream
        stream.close()
