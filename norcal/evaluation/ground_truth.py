"""LVIS ground truth, loaded once and indexed into arrays for repeated evaluation.

Prepare it once with :func:`prepare_gt` and pass the result to ``evaluate`` as often as
needed (a gamma sweep evaluates the same GT many times): nothing here is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.fileio import read_json

FREQUENCIES = ("r", "c", "f")


@dataclass
class LvisGT:
    """An LVIS-format ground truth as arrays.

    Images and categories are sorted by id (``img_ids`` [I], ``cat_ids`` [K]); annotations
    keep file order: ``ann_img`` / ``ann_cat`` (indices into those), ``ann_area``,
    ``ann_ignore``, ``ann_bbox`` [G, 4] (x, y, w, h), ``ann_id``. Federated sets are sorted
    int64 keys ``img_index * K + cat_index``: ``pos_keys`` (has GT), ``neg_keys``
    (verified absent), ``nel_keys`` (not exhaustively annotated).
    """

    dataset: dict
    img_ids: np.ndarray
    cat_ids: np.ndarray
    cat_names: list[str]
    frequency: list[str | None]
    image_count: np.ndarray  # N_c per category when known (GT field or table), else nan
    img_hw: np.ndarray  # [I, 2] height, width
    ann_img: np.ndarray
    ann_cat: np.ndarray
    ann_area: np.ndarray
    ann_ignore: np.ndarray
    ann_bbox: np.ndarray
    ann_id: np.ndarray
    pos_keys: np.ndarray
    neg_keys: np.ndarray
    nel_keys: np.ndarray
    _rles: list | None = field(default=None, repr=False)

    @property
    def num_cats(self) -> int:
        return len(self.cat_ids)

    @property
    def has_frequency(self) -> bool:
        return all(f in FREQUENCIES for f in self.frequency)

    def img_index(self, image_ids: np.ndarray) -> np.ndarray:
        """Indices into ``img_ids``; -1 where an id is unknown."""
        return _lookup(self.img_ids, image_ids)

    def cat_index(self, category_ids: np.ndarray) -> np.ndarray:
        """Indices into ``cat_ids``; -1 where an id is unknown."""
        return _lookup(self.cat_ids, category_ids)

    def rles(self) -> list:
        """GT masks as compressed RLEs (polygons rasterised at the image size), cached."""
        if self._rles is None:
            import pycocotools.mask as mask_utils

            out = []
            anns = self.dataset["annotations"]
            for i, a in enumerate(anns):
                seg = a.get("segmentation")
                if seg is None:
                    raise NorcalError(f"GT annotation {a.get('id')} has no segmentation (needed for segm)")
                h, w = (int(v) for v in self.img_hw[self.ann_img[i]])
                if isinstance(seg, list):
                    out.append(mask_utils.merge(mask_utils.frPyObjects(seg, h, w)))
                elif isinstance(seg.get("counts"), list):
                    out.append(mask_utils.frPyObjects(seg, h, w))
                else:
                    out.append(seg)
            self._rles = out
        return self._rles


def _lookup(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    pos = np.searchsorted(sorted_ids, ids)
    pos = np.minimum(pos, len(sorted_ids) - 1)
    return np.where(sorted_ids[pos] == ids, pos, -1)


def _keys(pairs: list[tuple[int, int]], k: int) -> np.ndarray:
    if not pairs:
        return np.zeros(0, dtype=np.int64)
    a = np.asarray(pairs, dtype=np.int64)
    return np.unique(a[:, 0] * k + a[:, 1])


def prepare_gt(gt: str | Path | dict | LvisGT, table=None) -> LvisGT:
    """Load and index an LVIS-format GT (a path, a loaded dict, or an LvisGT as it is).

    Frequency groups come from the categories' ``frequency`` field; where it is missing they
    come from ``table`` (a :class:`norcal.core.tables.CalibrationTable`, matched by category id).
    Images need ``neg_category_ids`` and ``not_exhaustive_category_ids`` (LVIS federated
    fields); a missing field is taken as empty.
    """
    if isinstance(gt, LvisGT):
        return gt
    if isinstance(gt, (str, Path)):
        data = read_json(gt, "GT")
        where = str(gt)
    elif isinstance(gt, dict):
        data, where = gt, "GT"
    else:
        raise NorcalError(f"GT must be a path or an LVIS dict, got {type(gt).__name__}")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key) if isinstance(data, dict) else None, list):
            raise NorcalError(f"{where}: not an LVIS annotation file (no {key!r} list)")
    if not data["images"]:
        raise NorcalError(f"{where}: has no images")
    if not data["categories"]:
        raise NorcalError(f"{where}: has no categories")

    for i, c in enumerate(data["categories"]):
        if not isinstance(c, dict) or "id" not in c:
            raise NorcalError(f"{where}: category {i} has no 'id' ({str(c)[:80]})")
    for i, im in enumerate(data["images"]):
        if not isinstance(im, dict) or "id" not in im:
            raise NorcalError(f"{where}: image {i} has no 'id' ({str(im)[:80]})")
    cats = sorted(data["categories"], key=lambda c: c["id"])
    cat_ids = np.array([c["id"] for c in cats], dtype=np.int64)
    by_table = {}
    if table is not None:
        by_table = {int(c["id"]): c for c in table.categories}
    frequency, image_count = [], []
    for c in cats:
        t = by_table.get(int(c["id"]), {})
        f = c.get("frequency") or t.get("frequency")
        if f is not None and f not in FREQUENCIES:
            raise NorcalError(f"{where}: category {c['id']} has frequency {f!r}; expected r, c or f")
        frequency.append(f)
        n = c.get("image_count", t.get("image_count"))
        image_count.append(float(n) if n is not None else np.nan)

    imgs = sorted(data["images"], key=lambda im: im["id"])
    img_ids = np.array([im["id"] for im in imgs], dtype=np.int64)
    if len(np.unique(img_ids)) != len(img_ids):
        raise NorcalError(f"{where}: duplicate image ids")
    img_hw = np.array([[im.get("height", 0), im.get("width", 0)] for im in imgs], dtype=np.int64)
    k = len(cat_ids)

    anns = data["annotations"]
    n = len(anns)
    ann_img = np.empty(n, dtype=np.int64)
    ann_cat = np.empty(n, dtype=np.int64)
    ann_area = np.empty(n, dtype=np.float64)
    ann_ignore = np.zeros(n, dtype=bool)
    ann_bbox = np.zeros((n, 4), dtype=np.float64)
    ann_id = np.empty(n, dtype=np.int64)
    for i, a in enumerate(anns):
        if not isinstance(a, dict) or "image_id" not in a or "category_id" not in a:
            name = f"annotation {a.get('id', i)}" if isinstance(a, dict) else f"annotation {i}"
            raise NorcalError(f"{where}: {name} needs 'image_id' and 'category_id' ({str(a)[:80]})")
        ann_img[i] = a["image_id"]
        ann_cat[i] = a["category_id"]
        ann_area[i] = a.get("area", 0.0)
        ann_ignore[i] = bool(a.get("ignore", 0))
        if "bbox" in a:
            ann_bbox[i] = a["bbox"]
        ann_id[i] = a.get("id", i + 1)
    img_raw, cat_raw = ann_img.copy(), ann_cat.copy()
    ann_img = _lookup(img_ids, ann_img) if n else ann_img
    ann_cat = _lookup(cat_ids, ann_cat) if n else ann_cat
    if n and (ann_img < 0).any():
        i = int(np.flatnonzero(ann_img < 0)[0])
        raise NorcalError(f"{where}: annotation {ann_id[i]} has unknown image_id {img_raw[i]}")
    if n and (ann_cat < 0).any():
        i = int(np.flatnonzero(ann_cat < 0)[0])
        raise NorcalError(f"{where}: annotation {ann_id[i]} has unknown category_id {cat_raw[i]}")

    cat_pos = {int(c): i for i, c in enumerate(cat_ids)}
    neg, nel = [], []
    for ii, im in enumerate(imgs):
        for c in im.get("neg_category_ids", []) or []:
            if c in cat_pos:
                neg.append((ii, cat_pos[c]))
        for c in im.get("not_exhaustive_category_ids", []) or []:
            if c in cat_pos:
                nel.append((ii, cat_pos[c]))
    pos_keys = np.unique(ann_img * k + ann_cat) if n else np.zeros(0, dtype=np.int64)
    return LvisGT(
        dataset=data, img_ids=img_ids, cat_ids=cat_ids,
        cat_names=[str(c.get("name", c["id"])) for c in cats], frequency=frequency,
        image_count=np.array(image_count), img_hw=img_hw, ann_img=ann_img, ann_cat=ann_cat,
        ann_area=ann_area, ann_ignore=ann_ignore, ann_bbox=ann_bbox, ann_id=ann_id,
        pos_keys=pos_keys, neg_keys=_keys(neg, k), nel_keys=_keys(nel, k),
    )
