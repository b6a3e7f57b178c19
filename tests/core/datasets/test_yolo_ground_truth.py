"""An Ultralytics data.yaml as ground truth, checked against Ultralytics itself: its label check
(verify_image_label: what it accepts, its classes, boxes and polygons, its image sizes with EXIF
orientation), its dataset root (check_det_dataset), and AP through `norcal eval` equal to that of
a COCO json written by hand from Ultralytics' own reading of the same files."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from norcal.cli import main
from norcal.core.errors import NorcalError
from norcal.core.datasets.ultralytics_dataset import dataset_root, split_entry_path, ultralytics_datasets_dir
from norcal.core.files.yaml_io import read_yaml_mapping
from norcal.core.datasets.yolo_ground_truth import dataset_ground_truth
from norcal.core.datasets.yolo_labels import read_yolo_labels
from norcal.export.families.ultralytics.checkpoint import import_ultralytics

import_ultralytics()  # as the library imports it: PIL's Image.open stays PIL's for the other tests

NAMES = ["cat", "dog", "bird"]

LABELS = [  # (label file text, what it tests)
    ("0 0.5 0.5 0.2 0.2\n1 0.1 0.2 0.05 0.3\n", "boxes"),
    ("1.0 0.5 0.5 0.2 0.2\n", "a class written as a float"),
    ("0 1.005 0.5 0.01 0.2\n0 -0.005 0.5 0.01 0.2\n", "within the 1% tolerance"),
    ("0 1.02 0.5 0.1 0.1\n", "beyond the tolerance"),
    ("0 -0.02 0.5 0.1 0.1\n", "below the tolerance"),
    ("0 0.5 0.5 -0.005 0.1\n", "a negative size"),
    ("0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n0 0.50000001 0.5 0.2 0.2\n", "duplicates as float32"),
    ("3 0.5 0.5 0.2 0.2\n", "class out of range"),
    ("-1 0.5 0.5 0.2 0.2\n", "negative class"),
    ("0.5 0.5 0.5 0.2 0.2\n", "fractional class"),
    ("0 nan 0.5 0.2 0.2\n", "not finite"),
    ("0 0.5 0.5 0.2\n", "4 fields"),
    ("0 0.5 0.5 0.2 0.2 0.1\n", "6 fields"),
    ("2 0.1 0.1 0.4 0.1 0.4 0.5 0.1 0.5\n0 0.6 0.6 0.9 0.6 0.8 0.9\n", "polygons"),
    ("2 0.1 0.1 0.4 0.1 0.4 0.5\n2 0.1 0.1 0.4 0.1 0.4 0.5\n", "duplicate polygons"),
    ("2 0.1 0.1 0.4 0.1 0.4 0.5\n0 0.5 0.5 0.2 0.2\n", "polygons mixed with a box"),
    ("2 0.2 0.1 1.83 0.1 1 0.3\n", "a polygon whose box is out"),
    ("2 0.5 0.1 1.02 0.1 0.9 0.3\n", "a polygon whose box is in, a point beyond 1.01"),
    ("2 0.1 0.1 0.4 0.1 0.4\n", "an odd polygon"),
    ("2 0.1 0.1 0.4 0.1 0.4 0.5\n1 0.3 0.7\n", "a 1-point polygon among polygons"),
    ("2 0.1 0.1 0.4 0.1 0.4 0.5\n1 1.3 0.7\n", "a 1-point polygon out of bounds"),
    ("2 0.1 0.1 0.4 0.1 0.4 0.5\n1 0.3 0.7 0.4 0.8\n", "a 2-point polygon among polygons"),
    ("1 0.3 0.7\n", "a lone 1-point polygon"),
]


def _image(path: Path, size=(40, 30), orientation=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.new("RGB", size, (90, 120, 150))
    if orientation is None:
        im.save(path)
    else:
        exif = Image.Exif()
        exif[274] = orientation
        im.save(path, exif=exif)
    return path


def _ultralytics(image: Path, label: Path, nc: int = len(NAMES)):
    from ultralytics.data.utils import verify_image_label

    return verify_image_label((str(image), str(label), "", False, nc, 0, 0, False))


@pytest.mark.parametrize("text,what", LABELS, ids=[w for _, w in LABELS])
def test_labels_read_as_ultralytics_reads_them(tmp_path, text, what):
    image = _image(tmp_path / "images/a.png")
    label = tmp_path / "labels/a.txt"
    label.parent.mkdir()
    label.write_text(text)
    _, lb, shape, segments, _, _, _, _, corrupt, _ = _ultralytics(image, label)
    if corrupt:
        with pytest.raises(NorcalError) as e:
            read_yolo_labels(label, len(NAMES))
        assert str(e.value).startswith(f"{label}: line ") and "\n" not in str(e.value)
        return
    ours = read_yolo_labels(label, len(NAMES))
    # Ultralytics sorts the rows when it drops duplicates: compare as sorted rows
    theirs = sorted(map(tuple, lb.tolist()))
    assert sorted((float(x.cls), *x.box) for x in ours) == theirs
    assert sorted(x.polygon for x in ours if x.polygon) == sorted(tuple(s.reshape(-1).tolist()) for s in segments)


@pytest.mark.parametrize("suffix", ["jpg", "png"])
@pytest.mark.parametrize("orientation", [None, 1, 6, 8, 3])
def test_image_size_follows_exif_as_ultralytics(tmp_path, orientation, suffix):
    d = tmp_path / "ds"
    _image(d / f"images/val/1.{suffix}", (40, 30), orientation)
    (d / "data.yaml").write_text("train: images/val\nval: images/val\nnames: [cat, dog, bird]\n")
    im = dataset_ground_truth(d / "data.yaml")["images"][0]
    shape = _ultralytics(d / f"images/val/1.{suffix}", d / "labels/val/1.txt")[2]
    assert (im["height"], im["width"]) == tuple(shape)


def _check_det_root(yaml: Path) -> Path:
    from ultralytics.data.utils import check_det_dataset

    return Path(check_det_dataset(str(yaml))["val"])


def test_root_resolved_as_check_det_dataset(tmp_path, monkeypatch):
    import ultralytics.data.utils as uu
    from ultralytics.utils import SETTINGS

    # the settings file Ultralytics read at its import (YOLO_CONFIG_DIR may have moved since, in a session)
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(Path(SETTINGS.file).parent.parent))
    assert ultralytics_datasets_dir() == Path(SETTINGS["datasets_dir"])  # the same settings file
    datasets = tmp_path / "datasets"
    _image(datasets / "under/images/val/1.png")
    _image(tmp_path / "work/here/images/val/1.png")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "Ultralytics").mkdir()
    (cfg / "Ultralytics/settings.json").write_text(json.dumps({"datasets_dir": str(datasets)}))
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(cfg))
    monkeypatch.setattr(uu, "DATASETS_DIR", datasets)
    monkeypatch.chdir(tmp_path / "work")
    ymls = tmp_path / "yamls"
    ymls.mkdir()
    for name, path in (("cwd", "here"), ("datasets", "under"), ("absolute", str(tmp_path / "work/here")),
                       ("none", None)):
        y = ymls / f"{name}.yaml"
        y.write_text((f"path: {path}\n" if path else "") + "train: images/val\nval: images/val\nnames: [a]\n")
        if path is None:
            _image(ymls / "images/val/1.png")
        data = read_yaml_mapping(y, "d")
        assert split_entry_path(dataset_root(data, y), "images/val") == _check_det_root(y), name
    # where Ultralytics finds nothing, one line says where it looked
    y = ymls / "nowhere.yaml"
    y.write_text("path: nowhere\ntrain: images/val\nval: images/val\nnames: [a]\n")
    with pytest.raises(FileNotFoundError):
        _check_det_root(y)
    with pytest.raises(NorcalError) as e:
        dataset_ground_truth(y)
    msg = str(e.value)
    assert f"{tmp_path / 'work/nowhere'} (from the current folder)" in msg
    assert f"{datasets / 'nowhere'} (under Ultralytics' datasets_dir)" in msg and "\n" not in msg


def _dataset(root: Path, polygons: bool) -> Path:
    """Four images (one turned by EXIF, one without labels, one with a duplicate line)."""
    rng = np.random.default_rng(0)
    for k, (size, orientation) in enumerate([((64, 48), None), ((50, 70), 6), ((80, 60), None),
                                             ((40, 40), None)]):
        _image(root / f"images/val/{k + 1}.jpg", size, orientation)
        if k == 3:
            continue
        lines = []
        for _ in range(4):
            c = int(rng.integers(0, len(NAMES)))
            x, y = rng.uniform(0.1, 0.5, 2)
            w, h = rng.uniform(0.1, 0.4, 2)
            lines.append(f"{c} {x:.4f} {y:.4f} {x + w:.4f} {y:.4f} {x + w:.4f} {y + h:.4f} {x:.4f} {y + h * 0.6:.4f}"
                         if polygons else f"{c} {x + w / 2:.4f} {y + h / 2:.4f} {w:.4f} {h:.4f}")
        lines.append(lines[0])
        (root / "labels/val").mkdir(parents=True, exist_ok=True)
        (root / f"labels/val/{k + 1}.txt").write_text("\n".join(lines) + "\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    return root / "data.yaml"


def _coco_by_hand(yaml: Path) -> dict:
    """COCO json from Ultralytics' own reading of every image and label file."""
    from pycocotools import mask as mask_utils

    images, anns = [], []
    for im in sorted((yaml.parent / "images/val").iterdir()):
        _, lb, (h, w), segments, *_ = _ultralytics(im, yaml.parent / "labels/val" / f"{im.stem}.txt")
        iid = int(im.stem)
        images.append({"id": iid, "file_name": im.name, "height": h, "width": w})
        for r, (c, cx, cy, bw, bh) in enumerate(lb.tolist()):
            a = {"id": len(anns) + 1, "image_id": iid, "category_id": int(c) + 1, "iscrowd": 0,
                 "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], "area": bw * w * bh * h}
            if segments:
                poly = (segments[r] * np.array([w, h])).reshape(-1).tolist()
                a["segmentation"] = [poly]
                a["area"] = float(mask_utils.area(mask_utils.frPyObjects([poly], h, w))[0])
            anns.append(a)
    return {"images": images, "annotations": anns,
            "categories": [{"id": i + 1, "name": n} for i, n in enumerate(NAMES)]}


def _results(gt: dict, masks: bool) -> list:
    """Detections near the GT objects (some moved, some of another class) plus false positives."""
    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(1)
    sizes = {im["id"]: (im["height"], im["width"]) for im in gt["images"]}
    out = []
    for a in gt["annotations"]:
        x, y, w, h = a["bbox"]
        dx, dy = rng.normal(0, 0.15 * w), rng.normal(0, 0.15 * h)
        cat = a["category_id"] if rng.uniform() < 0.8 else 1 + (a["category_id"] % len(NAMES))
        out.append({"image_id": a["image_id"], "category_id": cat, "score": float(rng.uniform(0.2, 1)),
                    "bbox": [x + dx, y + dy, w, h]})
        if masks:
            hh, ww = sizes[a["image_id"]]
            poly = [v + (dx if k % 2 == 0 else dy) for k, v in enumerate(a["segmentation"][0])]
            rle = mask_utils.merge(mask_utils.frPyObjects([poly], hh, ww))
            out[-1]["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
    return out


@pytest.mark.parametrize("polygons,iou_type", [(False, "bbox"), (True, "segm")])
def test_eval_of_data_yaml_equals_eval_of_coco_json(tmp_path, capsys, polygons, iou_type):
    yaml = _dataset(tmp_path / "ds", polygons)
    coco = _coco_by_hand(yaml)
    (tmp_path / "gt.json").write_text(json.dumps(coco))
    (tmp_path / "r.json").write_text(json.dumps(_results(coco, polygons)))
    stats = []
    for gt in (tmp_path / "gt.json", yaml):
        out = tmp_path / f"{gt.stem}.eval.json"
        assert main(["eval", "--gt", str(gt), "--results", str(tmp_path / "r.json"), "--iou-type", iou_type,
                     "--no-fixed", "--json", str(out)]) == 0, capsys.readouterr()
        stats.append(json.loads(out.read_text())["stats"])
    assert 0.1 < stats[0]["AP"] < 0.95
    for key in ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR"):
        assert stats[1][key] == pytest.approx(stats[0][key], abs=1e-9), key
    ours = dataset_ground_truth(yaml)
    assert [(im["id"], im["height"], im["width"]) for im in ours["images"]] == \
        [(im["id"], im["height"], im["width"]) for im in coco["images"]]
    assert len(ours["annotations"]) == len(coco["annotations"]) == 12  # duplicates dropped


def test_image_ids_and_categories_for_infer(tmp_path):
    """`norcal infer --image-ids data.yaml` numbers images and classes as the GT does."""
    from norcal.runtime.results import category_ids_from_annotations

    d = tmp_path / "ds"
    _image(d / "images/val/b.png")
    _image(d / "images/val/sub/a.png")
    _image(d / "images/train/7.png")
    (d / "data.yaml").write_text("train: images/train\nval: images/val\nnames: {0: cat, 1: dog}\n")
    sizes: dict = {}
    cats, by_name = category_ids_from_annotations(d / "data.yaml", sizes=sizes)
    assert cats == [1, 2] and by_name == {"b.png": 1, "a.png": 2} and sizes["a.png"] == (30, 40)
    gt = dataset_ground_truth(d / "data.yaml")
    assert [im["file_name"] for im in gt["images"]] == ["images/val/b.png", "images/val/sub/a.png"]
    assert category_ids_from_annotations(d / "data.yaml", split="train")[1] == {"7.png": 7}
    with pytest.raises(NorcalError, match="field 'test' missing"):
        dataset_ground_truth(d / "data.yaml", "test")


def test_eval_cli_names_a_bad_label_line(tmp_path, capsys):
    yaml = _dataset(tmp_path / "ds", False)
    bad = yaml.parent / "labels/val/2.txt"
    bad.write_text("0 0.5 0.5 0.2 0.2\n5 0.5 0.5 0.2 0.2\n")
    (tmp_path / "r.json").write_text("[]")
    assert main(["eval", "--gt", str(yaml), "--results", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{bad}: line 2, field 1 (class): class id 5 is outside names (0..2)" in err


def _damaged_png(path: Path, how: str) -> Path:
    """A PNG whose header reads but whose body does not: an IDAT checksum broken, or cut short."""
    data = bytearray(_image(path).read_bytes())
    if how == "crc":
        k = data.index(b"IDAT") + 4 + int.from_bytes(data[data.index(b"IDAT") - 4:data.index(b"IDAT")], "big")
        data[k] ^= 0xFF  # the chunk's CRC
    else:
        data = data[: data.index(b"IDAT") + 10]
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("how", ["crc", "truncated"])
def test_a_damaged_image_is_refused_when_the_data_yaml_is_read(tmp_path, capsys, how):
    """Ultralytics' check_image (PIL's verify) drops the image as corrupt; we refuse the GT at
    load, naming the file, before any result is read."""
    yaml = _dataset(tmp_path / "ds", False)
    bad = _damaged_png(yaml.parent / "images/val/5.png", how)
    Image.open(bad).close()  # the header alone reads
    assert _ultralytics(bad, yaml.parent / "labels/val/5.txt")[8] == 1  # corrupt for Ultralytics
    with pytest.raises(NorcalError, match=f"^{bad}: not a readable image: "):
        dataset_ground_truth(yaml)
    assert main(["eval", "--gt", str(yaml), "--results", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {bad}: not a readable image: ")


def test_a_one_point_polygon_is_a_box_no_detection_matches(tmp_path):
    """Ultralytics reads `class x y` in a file of polygons as a zero-size box (segments2boxes);
    its validator's IoU with any box is 0, as COCO's is with ours: a target always missed."""
    from pycocotools import mask as mask_utils
    from ultralytics.utils.metrics import box_iou
    import torch

    d = tmp_path / "ds"
    image = _image(d / "images/val/1.png", (40, 30))
    label = d / "labels/val/1.txt"
    label.parent.mkdir(parents=True)
    label.write_text("2 0.1 0.1 0.4 0.1 0.4 0.5\n1 0.25 0.5\n")
    (d / "data.yaml").write_text("val: images/val\nnames: [cat, dog, bird]\n")
    _, lb, (h, w), segments, *_ = _ultralytics(image, label)
    (cls, cx, cy, bw, bh), = [r for r in lb.tolist() if r[0] == 1]
    ann = next(a for a in dataset_ground_truth(d / "data.yaml")["annotations"] if a["category_id"] == cls + 1)
    assert ann["bbox"] == pytest.approx([cx * w, cy * h, 0, 0]) and (bw, bh) == (0, 0)
    assert ann["area"] == 0 and "segmentation" not in ann
    det = [ann["bbox"][0] - 5, ann["bbox"][1] - 5, 10, 10]  # a box around the point
    theirs = box_iou(torch.tensor([[cx * w, cy * h, cx * w, cy * h]]),
                     torch.tensor([[det[0], det[1], det[0] + 10, det[1] + 10]]))
    ours = mask_utils.iou([det], [ann["bbox"]], [0])
    assert float(theirs[0, 0]) == 0 and float(ours[0, 0]) == 0
