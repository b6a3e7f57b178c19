"""LVIS ground truth, loaded once and indexed into arrays for repeated evaluation.

Prepare it once with :func:`prepare_gt` and pass the result to ``evaluate`` as often as
needed (a gamma sweep evaluates the same GT many times): nothing here is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.datasets.rle_counts import check_rle_counts
from norcal.core.datasets.schemas import GROUND_TRUTH, boxes_of, check_refs, column, ids_of, record_error
from norcal.core.datasets.ultralytics_dataset import is_dataset_description
from norcal.core.datasets.yolo_ground_truth import check_labels_folder, read_annotations

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
    _bands: list | None = field(default=None, repr=False)
    source: str = "GT"  # the file it came from, for errors
    ann_crowd: np.ndarray | None = None  # [G] iscrowd (COCO rules); None: no annotation has one
    federated_fields: tuple[str, ...] = ()  # the LVIS image-level lists some image carries

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
                    raise record_error(self.source, "annotations", i, a, "segmentation",
                                       "missing (segm evaluation needs every GT mask)")
                h, w = (int(v) for v in self.img_hw[self.ann_img[i]])
                if isinstance(seg, list):
                    out.append(mask_utils.merge(_polygons(seg, h, w, self.source, i, a)))
                    continue
                problem = rle_problem(seg, h, w, int(self.img_ids[self.ann_img[i]]))
                if problem:
                    raise record_error(self.source, "annotations", i, a, "segmentation", problem)
                out.append(mask_utils.frPyObjects(seg, h, w) if isinstance(seg["counts"], list) else seg)
            self._rles = out
        return self._rles

    def boundary_rles(self) -> list:
        """The boundary band of each GT mask (:mod:`norcal.evaluation.boundary`), cached."""
        if self._bands is None:
            from norcal.evaluation.boundary import boundary_rles

            self._bands = boundary_rles(self.rles())
        return self._bands


def _polygons(seg: list, h: int, w: int, where: str, i: int, ann: dict) -> list:
    """A GT's polygons as RLEs, one each. pycocotools' frPyObjects reads a list whose first
    polygon has 4 numbers as boxes and fails (and indexes an empty list): its polygon
    rasteriser is called directly, which is what frPyObjects does for every other list."""
    from pycocotools import _mask  # frPyObjects' polygon branch, without its box dispatch

    if not seg:
        raise record_error(where, "annotations", i, ann, "segmentation", "no polygons")
    for k, poly in enumerate(seg):
        if len(poly) % 2:
            raise record_error(where, "annotations", i, ann, f"segmentation[{k}]",
                               f"{len(poly)} numbers: a polygon is x, y pairs")
        if len(poly) < 4:
            raise record_error(where, "annotations", i, ann, f"segmentation[{k}]",
                               f"{len(poly)} numbers: a polygon needs at least 2 points")
    return _mask.frPoly(seg, h, w)


def rle_problem(rle: dict, h: int, w: int, image_id: int) -> str | None:
    """Why an RLE mask cannot be one of image ``image_id`` (``h`` x ``w``), or None: another
    size (pycocotools then scores IoU -1, never a match, without a word), or run lengths that
    do not cover the image (checked for uncompressed counts; decoding them overruns)."""
    size = [int(v) for v in rle["size"]]
    if size != [h, w]:
        return f"RLE size {size} is not image {image_id}'s [{h}, {w}]"
    counts = rle["counts"]
    if isinstance(counts, list) and sum(counts) != h * w:
        return f"RLE counts sum to {sum(counts)}, not {h} x {w} = {h * w}"
    return None


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


def prepare_gt(gt: str | Path | dict | LvisGT, table=None, where: str | None = None,
               split: str = "val") -> LvisGT:
    """Load, validate and index an LVIS-format GT (a path, a loaded dict, or an LvisGT as it is).

    The file is checked against :data:`norcal.core.datasets.schemas.GROUND_TRUTH` (images need height
    and width, annotations a bbox and an area), then for repeated ids and annotations that
    point to no image or category; an error names the file, the record and the field.
    Frequency groups come from the categories' ``frequency`` field; where it is missing they
    come from ``table`` (a :class:`norcal.core.calibration.tables.CalibrationTable`, matched by category id).
    Images need ``neg_category_ids`` and ``not_exhaustive_category_ids`` (LVIS federated
    fields); a missing field is taken as empty. ``where`` names a loaded dict in errors
    (default "GT"). A path to an Ultralytics data.yaml is read as its ``split``'s ground truth
    (:mod:`norcal.core.datasets.yolo_ground_truth`; no federated fields: every category is exhaustive).
    """
    if isinstance(gt, LvisGT):
        return gt
    data, where = _load_gt(gt, where, split)
    # categories, then images, then annotations: the order the checks report in
    cat_ids, cats, frequency, image_count = _categories(where, data["categories"], table)
    img_ids = ids_of(where, "images", data["images"])
    img_order = np.argsort(img_ids, kind="stable")
    imgs = [data["images"][i] for i in img_order]
    img_ids = np.sort(img_ids)
    img_hw = np.array([[im["height"], im["width"]] for im in imgs], dtype=np.int64)
    k = len(cat_ids)
    anns = _annotations(where, data["annotations"], img_ids, cat_ids)
    neg, nel = _federated_pairs(where, imgs, img_order, cat_ids)
    n = len(anns["ann_id"])
    pos_keys = np.unique(anns["ann_img"] * k + anns["ann_cat"]) if n else np.zeros(0, dtype=np.int64)
    ann_crowd = np.fromiter((bool(a.get("iscrowd", 0)) for a in data["annotations"]), bool, n)
    federated = tuple(f for f in ("neg_category_ids", "not_exhaustive_category_ids")
                      if any(f in im for im in imgs))
    return LvisGT(
        dataset=data, img_ids=img_ids, cat_ids=cat_ids,
        cat_names=[str(c.get("name", c["id"])) for c in cats], frequency=frequency,
        image_count=np.array(image_count), img_hw=img_hw, **anns,
        pos_keys=pos_keys, neg_keys=_keys(neg, k), nel_keys=_keys(nel, k), source=where,
        ann_crowd=ann_crowd, federated_fields=federated,
    )


def _load_gt(gt: str | Path | dict, where: str | None, split: str) -> tuple[dict, str]:
    """The validated GT dict of a path or a loaded dict, and the name its errors use."""
    if isinstance(gt, (str, Path)):
        where = str(gt)
        if is_dataset_description(gt):
            check_labels_folder(gt, split)
        data = read_annotations(gt, "GT", GROUND_TRUTH, split)
    elif isinstance(gt, dict):
        where = where or "GT"
        data = GROUND_TRUTH.validate(gt, where)
    else:
        raise NorcalError(f"GT must be a path or an LVIS dict, got {type(gt).__name__}")
    return data, where


def _categories(where: str, categories: list, table) -> tuple[np.ndarray, list, list, list]:
    """The categories sorted by id: their ids, records, frequency groups and N_c (nan where
    unknown), each taken from the GT's own field first and from ``table`` where it lacks one."""
    cat_ids = ids_of(where, "categories", categories)
    cats = [categories[i] for i in np.argsort(cat_ids, kind="stable")]
    cat_ids = np.sort(cat_ids)
    by_table = {}
    if table is not None:
        by_table = {int(c["id"]): c for c in table.categories}
    frequency, image_count = [], []
    for c in cats:
        t = by_table.get(int(c["id"]), {})
        f = c.get("frequency") or t.get("frequency")
        if f is not None and f not in FREQUENCIES:
            raise NorcalError(f"table {table.name!r}: category {c['id']} has frequency {f!r}; "
                              "expected r, c or f")
        frequency.append(f)
        n = c.get("image_count", t.get("image_count"))
        image_count.append(float(n) if n is not None else np.nan)
    return cat_ids, cats, frequency, image_count


def _annotations(where: str, anns: list, img_ids: np.ndarray, cat_ids: np.ndarray) -> dict:
    """The annotations' LvisGT fields (``ann_id`` ... ``ann_bbox``), in file order, checked."""
    n = len(anns)
    ann_id = ids_of(where, "annotations", anns)
    ann_id = np.where(np.fromiter(("id" in a for a in anns), bool, n), ann_id, np.arange(1, n + 1))
    ann_img = check_refs(where, "annotations", anns, "image_id", img_ids, "images")
    ann_cat = check_refs(where, "annotations", anns, "category_id", cat_ids, "categories")
    ann_area = column(anns, "area", np.float64)
    ann_ignore = np.fromiter((bool(a.get("ignore", 0)) for a in anns), bool, n)
    ann_bbox = boxes_of(where, "annotations", anns)
    check_rle_counts(where, "annotations", anns)
    return dict(ann_img=ann_img, ann_cat=ann_cat, ann_area=ann_area, ann_ignore=ann_ignore,
                ann_bbox=ann_bbox, ann_id=ann_id)


def _federated_pairs(where: str, imgs: list, img_order: np.ndarray,
                     cat_ids: np.ndarray) -> tuple[list, list]:
    """(image index, category index) pairs of the images' ``neg_category_ids`` and
    ``not_exhaustive_category_ids``; ``img_order`` maps back to file positions for errors."""
    cat_pos = {int(c): i for i, c in enumerate(cat_ids)}
    neg, nel = [], []
    for ii, im in enumerate(imgs):
        for name, keys in (("neg_category_ids", neg), ("not_exhaustive_category_ids", nel)):
            for c in im.get(name, []) or []:
                if c not in cat_pos:  # as an annotation's unknown category_id is
                    raise record_error(where, "images", int(img_order[ii]), im, name,
                                       f"{c} is not the id of any entry in categories")
                keys.append((ii, cat_pos[c]))
    return neg, nel


def check_table_matches(table, gt: LvisGT) -> None:
    """Refuse a calibration table whose classes are not the GT's categories: the same ids, and
    the same name for each id (a table for another dataset or version gives wrong N_c)."""
    t_ids = np.array(sorted(table.category_ids), dtype=np.int64)
    only_t = np.setdiff1d(t_ids, gt.cat_ids)
    only_g = np.setdiff1d(gt.cat_ids, t_ids)
    if only_t.size or only_g.size:
        parts = [f"{a.size} only in the {who} (e.g. {a[:5].tolist()})"
                 for a, who in ((only_t, "table"), (only_g, "GT")) if a.size]
        raise NorcalError(f"table {table.name!r} does not match {gt.source}: category ids differ, "
                          + "; ".join(parts))
    gt_names = dict(zip(gt.cat_ids.tolist(), gt.cat_names))
    for c in table.categories:
        if str(c["name"]) != gt_names[int(c["id"])]:
            raise NorcalError(f"table {table.name!r} does not match {gt.source}: category "
                              f"{c['id']} is {c['name']!r} in the table but "
                              f"{gt_names[int(c['id'])]!r} in the GT")
