"""Detections as arrays, LVIS result files, and the two detection caps.

The LVIS protocol keeps the top ``max_dets`` (300) detections per image; AP^Fixed (Dave et
al. 2021) drops that cap and keeps the top ``per_class`` (10,000) per class over the set.
Ties in score keep the input order, as Python's stable sort does in lvis-api.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import read_json
from norcal.core.datasets.rle_counts import check_rle_counts
from norcal.core.datasets.schemas import RESULTS, boxes_of, column, record_error


@dataclass
class Detections:
    """N detections: ``image_ids`` [N], ``category_ids`` [N], ``scores`` [N],
    ``boxes`` [N, 4] (x, y, w, h; may be None for mask-only results), ``rles`` (list of
    compressed RLE dicts or None) and ``areas`` [N] (None: box w*h, as lvis-api does when
    results carry boxes)."""

    image_ids: np.ndarray
    category_ids: np.ndarray
    scores: np.ndarray
    boxes: np.ndarray | None = None
    rles: list | None = None
    areas: np.ndarray | None = None
    source: str | None = None  # the results file they were read from (errors name it)

    def __len__(self) -> int:
        return len(self.scores)

    def subset(self, idx: np.ndarray) -> "Detections":
        return Detections(
            self.image_ids[idx], self.category_ids[idx], self.scores[idx],
            None if self.boxes is None else self.boxes[idx],
            None if self.rles is None else [self.rles[i] for i in idx],
            None if self.areas is None else self.areas[idx],
        )

    def area(self) -> np.ndarray:
        """The area lvis-api uses for area ranges: box w*h when boxes exist, else mask area."""
        if self.areas is not None:
            return self.areas
        if self.boxes is not None:
            return self.boxes[:, 2] * self.boxes[:, 3]
        import pycocotools.mask as mask_utils

        # pycocotools 2.0.11's area() fails on lists of 256 or more RLEs: go in chunks
        parts = [np.asarray(mask_utils.area(self.rles[i:i + 255]), dtype=np.float64).reshape(-1)
                 for i in range(0, len(self.rles), 255)]
        self.areas = np.concatenate(parts) if parts else np.zeros(0)
        return self.areas


def from_results(results: Any) -> Detections:
    """Detections from an LVIS/COCO result list (or the path of its JSON file), or as given.

    The list is checked against :data:`norcal.core.datasets.schemas.RESULTS` (integer ids, a finite
    score, a box of 4 finite numbers with no negative size, RLE masks); every detection needs
    the bbox/segmentation keys of the first. An error names the file, the detection and the field.
    """
    if isinstance(results, Detections):
        return results
    where = "results"
    if isinstance(results, (str, Path)):
        where = str(results)
        results = read_json(results, "results", RESULTS)
    else:
        results = RESULTS.validate(results, where)
    if not results:
        raise NorcalError(f"{where}: no detections (empty results)")
    keys = [k for k in ("bbox", "segmentation") if k in results[0]]
    if not keys:
        raise record_error(where, "", 0, None, "bbox", "missing, and no 'segmentation' either")
    for key in keys:
        bad = next((i for i, d in enumerate(results) if key not in d), None)
        if bad is not None:
            raise record_error(where, "", bad, None, key,
                               "missing (the first detection has one: all need the same keys)")
    image_ids = column(results, "image_id")
    category_ids = column(results, "category_id")
    scores = column(results, "score", np.float64)
    boxes = boxes_of(where, "", results) if "bbox" in keys else None
    if "segmentation" in keys:
        check_rle_counts(where, "", results)
    rles = [d["segmentation"] for d in results] if "segmentation" in keys else None
    return Detections(image_ids, category_ids, scores, boxes, rles,
                      source=where if where != "results" else None)


def check_rle(seg: Any, where: str, i: int) -> dict:
    """A result's segmentation, which must be RLE (a dict with counts and size), as pycocotools
    and lvis-api take results; polygons are GT-only."""
    if not (isinstance(seg, dict) and "counts" in seg and isinstance(seg.get("size"), (list, tuple))
            and len(seg["size"]) == 2):
        kind = "a polygon list" if isinstance(seg, list) else type(seg).__name__
        raise NorcalError(f"{where}: detection {i}'s segmentation is {kind}; results must be RLE "
                          "({'size': [h, w], 'counts': ...})")
    return seg


def _top_per_group(group: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Indices (in input order) of the top-k scores within each group; ties keep input order."""
    n = len(scores)
    order = np.lexsort((np.arange(n), -scores, group))
    g = group[order]
    start = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    rank = np.arange(n) - np.repeat(start, np.diff(np.r_[start, n]))
    return np.sort(order[rank < k])


def cap_per_image(dets: Detections, max_dets: int, img_index: np.ndarray | None = None) -> Detections:
    """Keep the top ``max_dets`` detections of each image (max_dets < 0: keep all).

    img_index: optional [N] non-negative image indices, to skip the sort when no image is over.
    """
    if max_dets < 0 or len(dets) == 0:
        return dets
    if img_index is not None and np.bincount(img_index).max() <= max_dets:
        return dets
    keep = _top_per_group(dets.image_ids, dets.scores, max_dets)
    return dets if len(keep) == len(dets) else dets.subset(keep)


def cap_per_class(dets: Detections, per_class: int) -> Detections:
    """AP^Fixed's cut: keep the top ``per_class`` detections of each class over the whole set."""
    if per_class < 0 or len(dets) == 0:
        return dets
    keep = _top_per_group(dets.category_ids, dets.scores, per_class)
    return dets if len(keep) == len(dets) else dets.subset(keep)
