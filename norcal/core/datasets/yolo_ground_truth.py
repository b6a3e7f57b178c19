"""An Ultralytics dataset (a data.yaml and its YOLO label files) as COCO-format ground truth.

The one reader of annotations given as ``--gt`` / ``--image-ids``: a data.yaml is converted in
memory (:func:`dataset_ground_truth`), any other file is read as JSON; both are then validated
against the caller's schema.

The conversion of split ``split``'s images (``val`` unless told):

- images: ``file_name`` the path under the dataset root, ``height`` / ``width`` from the image
  header turned by its EXIF orientation as Ultralytics' ``exif_size`` turns it; image id = the
  file name's stem as an integer when every stem of the split is digits and no two are equal
  (000000397133.jpg -> 397133, as ``norcal infer`` numbers images), else 1..N in path order;
- categories: class index i -> category id i + 1, named by ``names`` (the ids a calibration
  table built from the data.yaml has, and those ``norcal infer --image-ids data.yaml`` writes);
- annotations (``iscrowd`` 0): a box line -> ``bbox`` in pixels, ``area`` w x h; a polygon line
  -> ``segmentation`` (one polygon, in pixels), ``bbox`` the box around it (Ultralytics'), and
  ``area`` the pixels of its mask as pycocotools rasterises it; a 1-point polygon -> a box of
  size 0 (``area`` 0), without ``segmentation``: box AP counts it as a miss, as Ultralytics'
  validator does, and mask AP refuses it (Ultralytics' mask of a point is OpenCV's drawing).

An image must pass Ultralytics' ``check_image`` (PIL's ``verify()``, 10 pixels a side): one it
would drop as corrupt is refused here, naming the file, when the data.yaml is read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import read_json
from norcal.core.datasets.ultralytics_dataset import (WHAT, class_names, dataset_root, is_dataset_description,
                                             label_path, split_images)
from norcal.core.files.yaml_io import read_yaml_mapping
from norcal.core.datasets.yolo_labels import YoloLabel, read_yolo_labels

SPLITS = ("val", "train", "test")
MIN_SIDE = 10  # check_image: Ultralytics drops images under 10 pixels a side as corrupt
# exif_size swaps these formats' sides by the EXIF tag; others (WebP, TIFF) it decodes with OpenCV,
# whose answer varies by version
SWAPPED_BY_TAG = ("JPEG", "MPO", "PNG", "AVIF")


def read_annotations(path: str | os.PathLike, what: str, schema, split: str = "val") -> dict:
    """Annotations from a COCO/LVIS JSON file, or from an Ultralytics data.yaml (its ``split``
    converted by :func:`dataset_ground_truth`), validated against ``schema``
    (:mod:`norcal.core.datasets.schemas`); ``what`` names a JSON file in errors."""
    if is_dataset_description(path):
        return schema.validate(dataset_ground_truth(path, split), str(path))
    return read_json(path, what, schema)


def image_size(path: Path) -> tuple[int, int]:
    """(height, width) of an image as Ultralytics' ``check_image`` / ``exif_size`` give it."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.verify()  # check_image: a file PIL finds damaged is dropped by Ultralytics as corrupt
            w, h = im.size
            fmt = im.format or ""
            try:  # exif_size reads the tag after verify(); where PIL then fails it keeps the size
                exif = im.tag_v2 if fmt == "TIFF" else im.getexif()
                turned = exif.get(274) in (5, 6, 7, 8)  # EXIF orientation: a quarter turn
            except Exception:  # noqa: BLE001 - as exif_size: any failure is "no orientation"
                turned = False
    except Exception as e:  # noqa: BLE001 - PIL raises many types for damaged files
        raise NorcalError(f"{path}: not a readable image: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if turned and fmt not in SWAPPED_BY_TAG:
        raise NorcalError(f"{path}: a {fmt} image with a quarter-turn EXIF orientation: its size in "
                          "Ultralytics depends on the OpenCV version; save it upright (or as JPEG/PNG)")
    if turned:
        w, h = h, w
    if min(w, h) < MIN_SIDE:
        raise NorcalError(f"{path}: {w}x{h} pixels: Ultralytics drops images under {MIN_SIDE} pixels a "
                          "side as corrupt")
    return h, w


def image_ids(images: list[Path]) -> list[int]:
    """The image ids of a split's images (see the module's docstring)."""
    stems = [p.stem for p in images]
    if all(s.isascii() and s.isdigit() for s in stems):
        ids = [int(s) for s in stems]
        if len(set(ids)) == len(ids):
            return ids
    return list(range(1, len(images) + 1))


def _annotation(label: YoloLabel, h: int, w: int) -> dict[str, Any]:
    cx, cy, bw, bh = label.box
    bbox = [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
    if label.polygon is None:
        return {"bbox": bbox, "area": bbox[2] * bbox[3]}
    if len(label.polygon) == 2:  # a 1-point polygon: a box of size 0 and no mask (pycocotools has none)
        return {"bbox": bbox, "area": 0.0}
    from pycocotools import mask as mask_utils

    poly = [v * (w if k % 2 == 0 else h) for k, v in enumerate(label.polygon)]
    area = float(mask_utils.area(mask_utils.merge(mask_utils.frPyObjects([poly], h, w))))
    return {"bbox": bbox, "area": area, "segmentation": [poly]}


def check_split(split: str) -> None:
    """Refuse a split other than val, train and test (parameter ``split``)."""
    if split not in SPLITS:
        raise NorcalError(f"split must be one of {', '.join(SPLITS)}, got {split!r}", param="split")


def _read_split(p: Path, split: str) -> tuple[dict, list[str], list[Path]]:
    check_split(split)
    data = read_yaml_mapping(p, WHAT)
    return data, class_names(data, str(p)), split_images(data, p, split)


def dataset_categories(data_yaml: str | os.PathLike) -> tuple[list[int], list[str]]:
    """The category ids (class index + 1) and names of a data.yaml's classes."""
    p = Path(data_yaml)
    names = class_names(read_yaml_mapping(p, WHAT), str(p))
    return list(range(1, len(names) + 1)), names


def split_image_ids(data_yaml: str | os.PathLike, split: str = "val") -> dict[Path, int]:
    """The images of a data.yaml's ``split`` (real paths, in path order) -> their image ids, as
    :func:`dataset_ground_truth` numbers them: the split is the list of images to run."""
    images = _read_split(Path(data_yaml), split)[2]
    return {image.resolve(): iid for image, iid in zip(images, image_ids(images))}


def split_pairs(data_yaml: str | os.PathLike, split: str = "val",
                folder: str | os.PathLike | None = None) -> list[tuple[int, Path]]:
    """(image id, path) of every image of a data.yaml's ``split``, in path order. ``folder``
    (optional, parameter ``images``) must hold them all, at any depth."""
    pairs = [(iid, p) for p, iid in split_image_ids(data_yaml, split).items()]
    if folder is not None:
        d = Path(folder).absolute()
        if not d.is_dir():
            raise NorcalError(f"images: {d} is not a folder", param="images")
        out = [p for _, p in pairs if not p.is_relative_to(d.resolve())]
        if out:
            raise NorcalError(f"images: {d} does not hold {out[0]} ({len(out)} of the {len(pairs)} of "
                              f"{data_yaml}'s split {split!r} outside it); the split names them: leave "
                              "images out", param="images")
    return pairs


def check_labels_folder(data_yaml: str | os.PathLike, split: str = "val") -> None:
    """Refuse a split none of whose label folders exists: scored, its images would all count
    as images without objects."""
    images = _read_split(Path(data_yaml), split)[2]
    if images and not any(label_path(image).parent.is_dir() for image in images):
        raise NorcalError(f"{data_yaml}: split {split!r} has no labels folder: {label_path(images[0]).parent} "
                          f"(where Ultralytics reads the labels of {images[0].name}) does not exist")


def dataset_ground_truth(data_yaml: str | os.PathLike, split: str = "val") -> dict[str, Any]:
    """COCO-format ground truth (images, annotations, categories) of a data.yaml's ``split``."""
    p = Path(data_yaml)
    data, names, images = _read_split(p, split)
    root = dataset_root(data, p).resolve()
    out_images, annotations = [], []
    for image, iid in zip(images, image_ids(images)):
        h, w = image_size(image)
        name = image.relative_to(root).as_posix() if image.is_relative_to(root) else str(image)
        out_images.append({"id": iid, "file_name": name, "height": h, "width": w})
        labels = label_path(image)
        if labels.exists() and not labels.is_file():
            raise NorcalError(f"{labels}: the label file of {image.name} is not a file")
        for label in read_yolo_labels(labels, len(names)) if labels.is_file() else []:
            annotations.append({"id": len(annotations) + 1, "image_id": iid, "category_id": label.cls + 1,
                                "iscrowd": 0, **_annotation(label, h, w)})
    categories = [{"id": i + 1, "name": n} for i, n in enumerate(names)]
    return {"images": out_images, "annotations": annotations, "categories": categories}
