"""Calibration tables from an Ultralytics dataset: a ``data.yaml`` and its YOLO label files.

The description names the class names (``names``: a list, or a mapping class index -> name),
the dataset root (``path``, resolved as Ultralytics resolves it: :func:`dataset_root`) and the split
(``train``: a folder, a ``.txt`` list of images, or a list of either). Each image's labels are
in the file Ultralytics reads for it: the last ``images`` folder of its path replaced by
``labels``, the suffix by ``.txt`` (no file: an image with no objects). A label line is
``class x y w h`` (detection) or ``class x1 y1 x2 y2 ...`` (segmentation polygon), coordinates
normalised to [0, 1]. Every file is checked as it is read; an error names the file, the line
and the field. Identical lines of one file count once, as Ultralytics drops duplicate labels.

The table lists the classes in class-index order with category id = class index + 1 (the
default a model without ``norcal.category_ids`` is read with).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from norcal.core.errors import NorcalError, shown
from norcal.core.files.fileio import readable_file
from norcal.core.files.yaml_io import read_yaml_mapping
from norcal.core.datasets.yolo_labels import read_yolo_labels

WHAT = "Ultralytics dataset description"
# ultralytics.data.utils.IMG_FORMATS (8.4): the suffixes Ultralytics takes as images
IMAGE_SUFFIXES = frozenset({"avif", "bmp", "dng", "heic", "heif", "jp2", "jpeg", "jpg", "mpo", "png",
                            "tif", "tiff", "webp"})
PROGRESS_STAGE = "count labels"

Progress = Callable[[str, int, int], None]  # (stage, images done since last call, stage total)


def is_dataset_description(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an Ultralytics data.yaml (by its suffix) rather than a JSON file."""
    return Path(path).suffix.lower() in (".yaml", ".yml")


def _scalar_name(where: str, field: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise NorcalError(f"{where}: field '{field}' must be a class name (text), got {shown(value)}")
    name = str(value)
    if not name.strip():
        raise NorcalError(f"{where}: field '{field}' is an empty class name")
    return name


def class_names(data: dict, where: str) -> list[str]:
    """The class names of a loaded data.yaml in class-index order, checked."""
    if data.get("names") is None:
        raise NorcalError(f"{where}: field 'names' missing (the class names: a list, or a mapping "
                          "class index -> name)")
    raw = data["names"]
    if isinstance(raw, list):
        names = [_scalar_name(where, f"names[{i}]", v) for i, v in enumerate(raw)]
    elif isinstance(raw, dict):
        # Ultralytics reads keys written as text ('0': cat) as the class index too
        raw = {int(k) if isinstance(k, str) and k.strip().isdigit() else k: v for k, v in raw.items()}
        keys = list(raw)
        bad = [k for k in keys if isinstance(k, bool) or not isinstance(k, int)]
        if bad:
            raise NorcalError(f"{where}: field 'names': key {shown(bad[0])} is not a class index "
                              "(an integer)")
        if sorted(keys) != list(range(len(keys))):
            missing = sorted(set(range(len(keys))) - set(keys))
            raise NorcalError(f"{where}: field 'names': class indices must be 0..{len(keys) - 1}, "
                              f"{missing[0] if missing else min(keys)} is "
                              f"{'missing' if missing else 'out of order'}")
        names = [_scalar_name(where, f"names[{k}]", raw[k]) for k in range(len(keys))]
    else:
        raise NorcalError(f"{where}: field 'names' must be a list or a mapping class index -> name, "
                          f"got {type(raw).__name__}")
    if not names:
        raise NorcalError(f"{where}: field 'names' lists no classes")
    if "nc" in data:
        nc = data["nc"]
        if isinstance(nc, bool) or not isinstance(nc, int) or nc != len(names):
            raise NorcalError(f"{where}: field 'nc' is {shown(nc)} but 'names' lists {len(names)} classes")
    return names


def ultralytics_config_dir() -> Path:
    """Where Ultralytics keeps its settings (``get_user_config_dir``): $YOLO_CONFIG_DIR, else the
    system's user config folder, each with an ``Ultralytics`` folder inside."""
    if os.environ.get("YOLO_CONFIG_DIR"):
        base = Path(os.environ["YOLO_CONFIG_DIR"]).expanduser()
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path.home() / "AppData" / "Roaming"
    else:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "Ultralytics"


def ultralytics_datasets_dir() -> Path | None:
    """Ultralytics' ``datasets_dir`` setting, from its settings file; None where there is no
    such file or setting (Ultralytics would then make one up on its first run)."""
    try:
        value = json.loads((ultralytics_config_dir() / "settings.json").read_text()).get("datasets_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(value) if isinstance(value, str) and value else None


def dataset_root(data: dict, yaml_path: Path) -> Path:
    """The dataset root as Ultralytics' ``check_det_dataset`` finds it: field ``path`` (absent
    or empty: the YAML's folder); a relative one from the current folder where it exists there,
    else under Ultralytics' ``datasets_dir`` setting."""
    raw = data.get("path")
    if not raw:
        return yaml_path.parent.absolute()
    if not isinstance(raw, str):
        raise NorcalError(f"{yaml_path}: field 'path' must be a folder (text), got {shown(raw)}")
    root = Path(raw)
    places = [str(root.absolute())]
    if not (root.exists() or root.is_absolute()):
        datasets = ultralytics_datasets_dir()
        places[0] += " (from the current folder)"
        if datasets is None:
            places.append(f"no datasets_dir in {ultralytics_config_dir() / 'settings.json'}")
        else:
            root = (datasets / root).resolve()
            places.append(f"{root} (under Ultralytics' datasets_dir)")
    if not root.is_dir():
        raise NorcalError(f"{yaml_path}: field 'path': {shown(raw)} is not a folder (looked at "
                          f"{'; '.join(places)}; a relative path is resolved as Ultralytics does)")
    return root.absolute()


def _images_in(folder: Path) -> list[Path]:
    out = []
    for d, dirs, files in os.walk(folder):  # symlinked folders are not followed (no loops)
        dirs[:] = [x for x in dirs if not x.startswith(".")]  # as glob's '**/*.*': no hidden ones
        out += [Path(d) / f for f in files
                if not f.startswith(".") and f.rpartition(".")[-1].lower() in IMAGE_SUFFIXES]
    return out


def _images_listed(txt: Path) -> list[Path]:
    readable_file(txt)
    try:
        lines = txt.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise NorcalError(f"{txt}: not a list of images (not UTF-8 text)") from None
    except OSError as e:
        raise NorcalError(f"{txt}: cannot read: {e.strerror or e}") from None
    out = []
    for n, line in enumerate(lines, 1):
        entry = line.strip()
        if not entry or entry.rpartition(".")[-1].lower() not in IMAGE_SUFFIXES:
            continue  # Ultralytics keeps the lines with an image suffix only
        # Ultralytics: "./" entries are the list's folder's, other relative ones the current folder's
        p = txt.parent / entry[2:] if entry.startswith("./") else Path(entry).absolute()
        if not p.is_file():
            raise NorcalError(f"{txt}: line {n}: image {shown(entry)} not found")
        out.append(p)
    return out


def split_field(data: dict, split: str):
    """The data.yaml field of ``split``: Ultralytics takes a ``validation`` field as ``val``."""
    if split == "val" and "val" not in data:
        return data.get("validation")
    return data.get(split)


def split_entry_path(root: Path, entry: str, listed: bool = False) -> Path:
    """A split's folder or list as Ultralytics' ``check_det_dataset`` resolves it: under the root
    (real path: labels sit by it); a lone entry starting ``../`` that is not found there is
    tried without that prefix."""
    p = (root / entry).resolve()
    if not listed and not p.exists() and entry.startswith("../"):
        p = (root / entry[3:]).resolve()
    return p


def split_images(data: dict, yaml_path: Path, split: str = "train") -> list[Path]:
    """The images of ``split`` (sorted, each once, absolute): its folders searched recursively,
    its ``.txt`` lists read."""
    root = dataset_root(data, yaml_path)
    raw = split_field(data, split)
    if raw is None:
        raise NorcalError(f"{yaml_path}: field '{split}' missing (a folder of images, a .txt list of "
                          "images, or a list of either)")
    entries = raw if isinstance(raw, list) else [raw]
    if not entries:
        raise NorcalError(f"{yaml_path}: field '{split}' is an empty list")
    images: set[Path] = set()
    for i, entry in enumerate(entries):
        field = f"{split}[{i}]" if isinstance(raw, list) else split
        if not isinstance(entry, str) or not entry:
            raise NorcalError(f"{yaml_path}: field '{field}' must be a path (text), got {shown(entry)}")
        p = split_entry_path(root, entry, listed=isinstance(raw, list))
        if p.is_dir():
            images.update(_images_in(p))
        elif p.is_file() and p.suffix.lower() == ".txt":
            images.update(_images_listed(p))
        elif p.exists():
            raise NorcalError(f"{yaml_path}: field '{field}': {p} is neither a folder nor a .txt list "
                              "of images")
        else:
            raise NorcalError(f"{yaml_path}: field '{field}': {p} not found")
    if not images:
        raise NorcalError(f"{yaml_path}: field '{split}' holds no images (suffixes "
                          f"{', '.join(sorted(IMAGE_SUFFIXES))})")
    return sorted(images)


def label_path(image: Path) -> Path:
    """Where Ultralytics reads ``image``'s labels (``img2label_paths``): the last ``images``
    folder of the path replaced by ``labels``, the suffix by ``.txt``."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return Path(sb.join(os.fspath(image).rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt")


def dataset_counts(data_yaml: str | os.PathLike, split: str = "train",
                   progress: Progress | None = None) -> tuple[list[str], list[int], list[int], int]:
    """(class names, image counts, instance counts, images) of a data.yaml's ``split``."""
    p = Path(data_yaml)
    data = read_yaml_mapping(p, WHAT)
    names = class_names(data, str(p))
    images = split_images(data, p, split)
    image_counts = [0] * len(names)
    instance_counts = [0] * len(names)
    step, done = max(1, len(images) // 200), 0  # ~200 progress updates for any size
    for i, image in enumerate(images):
        labels = label_path(image)
        if labels.is_file():
            classes = [label.cls for label in read_yolo_labels(labels, len(names))]
            for c in classes:
                instance_counts[c] += 1
            for c in set(classes):
                image_counts[c] += 1
        elif labels.exists():
            raise NorcalError(f"{labels}: the label file of {image.name} is not a file")
        if progress is not None and ((i + 1) % step == 0 or i + 1 == len(images)):
            progress(PROGRESS_STAGE, i + 1 - done, len(images))
            done = i + 1
    return names, image_counts, instance_counts, len(images)


def dataset_files(data_yaml: str | os.PathLike) -> list[Path]:
    """Every path a data.yaml names, for a check that no output is or replaces one of them: the
    description, its splits' folders and image lists, their images, and the images' label files
    and folders (those that exist). Empty when ``data_yaml`` is no readable dataset description
    (its reader then says why)."""
    p = Path(data_yaml)
    try:
        data = read_yaml_mapping(p, WHAT)
        root = dataset_root(data, p)
    except NorcalError:
        return []
    out = [p]
    for split in ("train", "val", "test", "minival"):
        raw = split_field(data, split)
        for entry in raw if isinstance(raw, list) else [raw]:
            if isinstance(entry, str) and entry:
                out.append(split_entry_path(root, entry, listed=isinstance(raw, list)))
        try:
            images = split_images(data, p, split) if raw is not None else []
        except NorcalError:
            continue  # a split that cannot be read names no files
        for image in images:
            labels = label_path(image)
            out += [image, labels, labels.parent]
    return [f for f in dict.fromkeys(out) if f.exists()]
