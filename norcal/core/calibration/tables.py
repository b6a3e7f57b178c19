"""Calibration tables: per-class training counts (N_c) in a model's class order.

A table is JSON: ``name``, ``source``, ``count_type`` ('image' or 'instance') and
``categories``: [{id, name, image_count, instance_count, frequency}] in the model's class
order (category id order for COCO/LVIS). Built-ins ship in ``norcal.calibration_tables``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from norcal.core.calibration.formula import check_counts, clamp_counts
from norcal.core.errors import NorcalError
from norcal.core.files.fileio import read_json, readable_file, write_json
from norcal.core.datasets.schemas import ANNOTATIONS, TABLE, boxes_of, check_refs, ids_of, record_error
from norcal.core.datasets.ultralytics_dataset import WHAT as DATASET, Progress, dataset_counts, is_dataset_description
from norcal.core.files.yaml_io import read_yaml_mapping

COUNT_TYPES = ("image", "instance")
GROUPS = {"r": "rare", "c": "common", "f": "frequent"}


def frequency_group(image_count: float) -> str:
    """LVIS's split: rare <= 10 training images, common 11-100, frequent > 100."""
    if image_count <= 10:
        return "r"
    return "c" if image_count <= 100 else "f"


@dataclass
class CalibrationTable:
    name: str
    source: str
    count_type: str
    categories: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_classes(self) -> int:
        return len(self.categories)

    @property
    def names(self) -> list[str]:
        return [c["name"] for c in self.categories]

    @property
    def category_ids(self) -> list[int]:
        return [int(c["id"]) for c in self.categories]

    @property
    def frequencies(self) -> list[str]:
        return [c["frequency"] for c in self.categories]

    def counts(self, count_type: str | None = None, min_count: float | None = None) -> np.ndarray:
        """N_c as float64 [C], validated (an error names a class with a bad count); with
        ``min_count`` K, counts below K are raised to K (see :meth:`clamped_counts`)."""
        return self.clamped_counts(count_type, min_count)[0]

    def clamped_counts(self, count_type: str | None = None,
                       min_count: float | None = None) -> tuple[np.ndarray, int]:
        """(N_c float64 [C], how many classes were raised to ``min_count``).

        Without ``min_count`` a zero count is an error naming the class (0 were raised).
        """
        kind = count_type or self.count_type
        if kind not in COUNT_TYPES:
            raise NorcalError(f"count type must be one of {', '.join(COUNT_TYPES)}, got {kind!r}")
        key = f"{kind}_count"
        if self.categories and all(c.get(key) is None for c in self.categories):
            other = next(k for k in COUNT_TYPES if k != kind)
            raise NorcalError(f"table {self.name!r} has no {kind} counts (no category has {key}): "
                              f"use count {other}", param="count")
        raw = []
        for c in self.categories:
            v = c.get(key)
            raw.append(float("nan") if v is None else v)
        try:
            if min_count is None:
                return check_counts(raw, self.names), 0
            return clamp_counts(raw, min_count, self.names)
        except NorcalError as e:
            raise NorcalError(f"table {self.name!r}: {e}", e.params) from None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "count_type": self.count_type,
                "categories": self.categories}

    @property
    def sha256(self) -> str:
        """Digest of the table's canonical JSON (independent of file formatting)."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_json(), indent=1)

    def group_counts(self) -> dict[str, int]:
        out = {"r": 0, "c": 0, "f": 0}
        for f in self.frequencies:
            out[f] = out.get(f, 0) + 1
        return out


def builtin_names() -> list[str]:
    files = resources.files("norcal.calibration_tables")
    return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".json"))


def _from_json(data: Any, where: str) -> CalibrationTable:
    data = TABLE.validate(data, where)
    ids_of(where, "categories", data["categories"])
    for c in data["categories"]:
        c.setdefault("frequency", frequency_group(c.get("image_count") or 0))
    return CalibrationTable(
        name=str(data.get("name", Path(where).stem)),
        source=str(data.get("source", where)),
        count_type=str(data.get("count_type", "image")),
        categories=data["categories"],
    )


def load_table(name_or_path: str | Path) -> CalibrationTable:
    """A built-in table by name (``lvis_v1``, ``lvis_v0_5``), a table JSON file, a COCO/LVIS
    training annotation file or an Ultralytics data.yaml (counted as :func:`build_table` does,
    N_c = images)."""
    s = str(name_or_path)
    if s in builtin_names():
        text = resources.files("norcal.calibration_tables").joinpath(f"{s}.json").read_text()
        return _from_json(json.loads(text), s)
    p = Path(s)
    if os.path.lexists(p):
        readable_file(p, "table")
    else:
        raise NorcalError(
            f"no calibration table {s!r}: not a built-in ({', '.join(builtin_names())}) nor a file"
        )
    if is_dataset_description(p):
        _check_dataset_table(p)
        return table_from_dataset(p)
    data = read_json(p)
    if isinstance(data, dict) and "annotations" in data:
        return table_from_annotations(data, p)
    return _from_json(data, str(p))


def table_sources() -> str:
    """What :func:`load_table` accepts, in one phrase (help texts and errors say it alike)."""
    return (f"a built-in name ({', '.join(builtin_names())}), a JSON of class counts, COCO/LVIS training "
            "annotations, or an Ultralytics data.yaml")


def _check_dataset_table(p: Path) -> None:
    """A YAML given as the table must be an Ultralytics data.yaml: say what it is when it is not
    (a detectron2 config is the YAML most at hand)."""
    data = read_yaml_mapping(p, DATASET)
    if data.get("names") is not None:
        return
    takes = f"table takes {table_sources()}"
    if "MODEL" in data or "_BASE_" in data:
        raise NorcalError(f"{p}: a detectron2 config, not class counts: {takes}", param="table")
    raise NorcalError(f"{p}: field 'names' missing (not an Ultralytics data.yaml): {takes}", param="table")


def build_table(annotations: str | Path, count_type: str = "image",
                name: str | None = None, progress: Progress | None = None) -> CalibrationTable:
    """Count N_c from a COCO- or LVIS-format annotation file, classes in category id order, or
    from an Ultralytics data.yaml (``.yaml``/``.yml``: :func:`table_from_dataset`).

    image_count: images containing the class; instance_count: its annotations. A file with
    no ``annotations`` but categories that carry image_count/instance_count (LVIS's category
    lists) is taken as it stands. ``progress(stage, done, total)`` hears of the images counted
    (data.yaml only).
    """
    p = Path(annotations)
    if is_dataset_description(p):
        return table_from_dataset(p, count_type, name, progress=progress)
    return table_from_annotations(read_json(p), p, count_type, name)


def table_from_dataset(data_yaml: str | Path, count_type: str = "image", name: str | None = None,
                       split: str = "train", progress: Progress | None = None) -> CalibrationTable:
    """Count N_c over the ``split`` images of an Ultralytics dataset (its data.yaml and YOLO
    label files, see :mod:`norcal.core.datasets.ultralytics_dataset`), classes in class-index order with
    category id = class index + 1."""
    if count_type not in COUNT_TYPES:
        raise NorcalError(f"count must be one of {', '.join(COUNT_TYPES)}, got {count_type!r}", param="count")
    p = Path(data_yaml)
    names, images, instances, num_images = dataset_counts(p, split, progress)
    categories = [{"id": i + 1, "name": n, "image_count": images[i], "instance_count": instances[i],
                   "frequency": frequency_group(images[i])} for i, n in enumerate(names)]
    return CalibrationTable(name=name or p.stem, source=f"{p.name} ({split}: {num_images} images)",
                            count_type=count_type, categories=categories)


def table_from_annotations(data: Any, path: str | Path, count_type: str = "image",
                           name: str | None = None) -> CalibrationTable:
    """:func:`build_table` on an annotation file already loaded (``path`` names it in errors)."""
    if count_type not in COUNT_TYPES:
        raise NorcalError(f"count must be one of {', '.join(COUNT_TYPES)}, got {count_type!r}", param="count")
    p = Path(path)
    data = _check_annotations(data, str(p))
    cats = sorted(data["categories"], key=lambda c: c["id"])
    anns = data.get("annotations")
    if anns is None:
        images = {c["id"]: c["image_count"] for c in cats}
        instances = {c["id"]: c["instance_count"] for c in cats}
    else:
        per_cat_images: dict[int, set] = {c["id"]: set() for c in cats}
        instances = {c["id"]: 0 for c in cats}
        for a in anns:
            cid = a["category_id"]
            per_cat_images[cid].add(a["image_id"])
            instances[cid] += 1
        images = {k: len(v) for k, v in per_cat_images.items()}
    categories = [
        {"id": c["id"], "name": c.get("name", str(c["id"])),
         "image_count": int(images[c["id"]]), "instance_count": int(instances[c["id"]]),
         "frequency": frequency_group(images[c["id"]])}
        for c in cats
    ]
    source = data.get("source") or f"{p.name}"
    return CalibrationTable(name=name or p.stem, source=str(source), count_type=count_type,
                            categories=categories)


def _check_annotations(data: Any, where: str) -> dict:
    """Training annotations validated (:data:`norcal.core.datasets.schemas.ANNOTATIONS`): unique ids,
    annotations that point to a listed category (and a listed image, where images are given),
    no negative box size."""
    data = ANNOTATIONS.validate(data, where)
    cat_ids = np.sort(ids_of(where, "categories", data["categories"]))
    anns = data.get("annotations") or []
    ids_of(where, "annotations", anns)
    check_refs(where, "annotations", anns, "category_id", cat_ids, "categories")
    if "images" in data:
        img_ids = np.sort(ids_of(where, "images", data["images"]))
        check_refs(where, "annotations", anns, "image_id", img_ids, "images")
    if "annotations" not in data:  # an LVIS category list: the counts are given
        for i, c in enumerate(data["categories"]):
            for key in ("image_count", "instance_count"):
                if c.get(key) is None:
                    raise record_error(where, "categories", i, c, key,
                                       "missing (the file has no annotations to count)")
    boxes_of(where, "annotations", anns, rows=[i for i, a in enumerate(anns) if "bbox" in a])
    return data
