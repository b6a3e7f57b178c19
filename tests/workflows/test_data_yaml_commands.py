"""`norcal tune`, `infer` and `parity` with an Ultralytics data.yaml: its split is the list of
images (no folder to give), and each gives what it gives with a COCO json written from
Ultralytics' own reading of the same files and the folder of those images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from norcal.cli import export_main, main
from norcal.core.errors import NorcalError

from yolo_models import NUM_CLASSES  # sets YOLO_OFFLINE / YOLO_CONFIG_DIR

SIZES = {"images/val/1.png": (60, 80), "images/val/sub/2.png": (96, 64), "images/val/3.png": (70, 100),
         "images/train/7.png": (50, 50)}  # (h, w)
LABELS = {"1": "0 0.5 0.5 0.6 0.5\n3 0.2 0.3 0.2 0.2\n", "2": "1 0.4 0.6 0.5 0.5\n",
          "3": "2 0.5 0.5 0.8 0.8\n0 0.7 0.2 0.3 0.3\n", "7": "4 0.5 0.5 0.5 0.5\n"}


def _coco(root: Path, split: str) -> dict:
    """COCO json of ``split`` from Ultralytics' verify_image_label (file names: base names)."""
    from ultralytics.data.utils import verify_image_label

    images, anns = [], []
    for name in sorted(n for n in SIZES if n.startswith(f"images/{split}/")):
        im = root / name
        label = root / name.replace("images/", "labels/", 1).replace(".png", ".txt")
        _, lb, (h, w), *_ = verify_image_label((str(im), str(label), "", False, NUM_CLASSES, 0, 0, False))
        images.append({"id": int(im.stem), "file_name": im.name, "height": h, "width": w})
        for c, cx, cy, bw, bh in lb.tolist():
            anns.append({"id": len(anns) + 1, "image_id": int(im.stem), "category_id": int(c) + 1, "iscrowd": 0,
                         "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], "area": bw * w * bh * h})
    return {"images": images, "annotations": anns,
            "categories": [{"id": c + 1, "name": f"class{c}"} for c in range(NUM_CLASSES)]}


@pytest.fixture(scope="module")
def ds(yolo_work, tmp_path_factory):
    """A 3-image val split (one in a subfolder) and a 1-image train split, the COCO jsons of
    both, and the test YOLO's checkpoint and its NorCal export."""
    d = tmp_path_factory.mktemp("dataset")
    rng = np.random.default_rng(0)
    for name, (h, w) in SIZES.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(d / name)
        label = d / name.replace("images/", "labels/", 1).replace(".png", ".txt")
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text(LABELS[Path(name).stem])
    names = [f"class{c}" for c in range(NUM_CLASSES)]
    (d / "data.yaml").write_text(f"path: {d}\ntrain: images/train\nval: images/val\nnames: {names}\n")
    for split in ("val", "train"):
        (d / f"{split}.json").write_text(json.dumps(_coco(d, split)))
    flat = d / "flat"  # the val images side by side, for the json's matching by file name
    flat.mkdir()
    for name in SIZES:
        if name.startswith("images/val/"):
            (flat / Path(name).name).write_bytes((d / name).read_bytes())
    (d / "best.pt").write_bytes(yolo_work.det.read_bytes())
    assert export_main([str(d / "best.pt"), "--gamma", "0.5", "--table", str(yolo_work.table),
                        "-o", str(d / "m.onnx")]) == 0
    return d


def test_tune_takes_the_split_as_its_images(ds, yolo_work, tmp_path, capsys):
    common = ["--gammas", "0.5", "--table", str(yolo_work.table), "--batch", "2"]
    assert main(["tune", str(ds / "best.pt"), "--gt", str(ds / "data.yaml"), *common,
                 "--json", str(tmp_path / "a.json")]) == 0, capsys.readouterr()
    assert main(["tune", str(ds / "best.pt"), "--gt", str(ds / "val.json"), "--images", str(ds / "flat"),
                 *common, "--json", str(tmp_path / "b.json")]) == 0, capsys.readouterr()
    a, b = (json.loads((tmp_path / f"{k}.json").read_text()) for k in "ab")
    assert a["num_images"] == 3 and [p["stats"] for p in a["sweep"]] == [p["stats"] for p in b["sweep"]]
    capsys.readouterr()
    # a folder that does not hold the split's images disagrees with it; a json needs its folder
    assert main(["tune", str(ds / "best.pt"), "--gt", str(ds / "data.yaml"), "--images", str(ds / "flat"),
                 *common]) == 2
    err = capsys.readouterr().err
    assert f"--images: {ds / 'flat'} does not hold {ds / 'images/val/1.png'} (3 of the 3 of" in err
    assert main(["tune", str(ds / "best.pt"), "--gt", str(ds / "val.json"), *common]) == 2
    assert "--images: the folder of the GT's pictures is needed" in capsys.readouterr().err


def test_infer_runs_the_split_by_default(ds, tmp_path, capsys):
    assert main(["infer", str(ds / "m.onnx"), "--image-ids", str(ds / "data.yaml"), "--provider", "cpu",
                 "-o", str(tmp_path / "a.json")]) == 0, capsys.readouterr()
    assert main(["infer", str(ds / "m.onnx"), str(ds / "flat"), "--image-ids", str(ds / "val.json"),
                 "--provider", "cpu", "-o", str(tmp_path / "b.json")]) == 0, capsys.readouterr()
    a = json.loads((tmp_path / "a.json").read_text())
    assert a and {r["image_id"] for r in a} <= {1, 2, 3}
    key = lambda r: (r["image_id"], -r["score"], r["category_id"], r["bbox"])  # noqa: E731
    assert sorted(a, key=key) == sorted(json.loads((tmp_path / "b.json").read_text()), key=key)
    # given inputs are matched to the split by path: the train image and the copies are left out
    assert main(["infer", str(ds / "m.onnx"), str(ds / "images/train/7.png"), str(ds / "images/val/3.png"),
                 str(ds / "flat/1.png"), "--image-ids", str(ds / "data.yaml"), "--provider", "cpu",
                 "-o", str(tmp_path / "c.json")]) == 0
    assert {r["image_id"] for r in json.loads((tmp_path / "c.json").read_text())} == {3}
    assert main(["infer", str(ds / "m.onnx"), "--image-ids", str(ds / "data.yaml"), "--split", "train",
                 "--provider", "cpu", "-o", str(tmp_path / "d.json")]) == 0
    assert {r["image_id"] for r in json.loads((tmp_path / "d.json").read_text())} == {7}
    capsys.readouterr()
    assert main(["infer", str(ds / "m.onnx"), "--image-ids", str(ds / "val.json"), "-o",
                 str(tmp_path / "e.json")]) == 2
    assert "IMAGES_OR_DIRS: no image files or folders given" in capsys.readouterr().err
    assert not (tmp_path / "e.json").exists()


def test_parity_takes_the_split_and_its_ground_truth(ds, tmp_path, capsys):
    ckpt = ["--checkpoint", str(ds / "best.pt")]
    assert main(["parity", str(ds / "m.onnx"), "--gt", str(ds / "data.yaml"), *ckpt,
                 "--json", str(tmp_path / "a.json")]) == 0, capsys.readouterr()
    assert main(["parity", str(ds / "m.onnx"), str(ds / "flat"), "--gt", str(ds / "val.json"), *ckpt,
                 "--json", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / f"{k}.json").read_text()) for k in "ab")
    assert a["images"] == 3 and a["ap"]["onnxruntime-cpu"]["AP"] > 0
    for name, stats in b["ap"].items():  # the images in another order: sums differ in the last bit
        assert a["ap"][name] == pytest.approx(stats, abs=1e-12), name
    capsys.readouterr()
    assert main(["parity", str(ds / "m.onnx"), str(ds / "flat"), "--gt", str(ds / "data.yaml"), *ckpt]) == 2
    assert f"3 image(s) are not in {ds / 'data.yaml'}'s split 'val' (by path)" in capsys.readouterr().err


def test_parity_library_reads_the_split_it_is_given(ds):
    from norcal.runtime.images import read_rgb
    from norcal.workflows.parity import ParityRequest, build_runners, run_parity

    built = build_runners(ParityRequest(ds / "m.onnx", checkpoint=ds / "best.pt"))
    images = [read_rgb(ds / "images/train/7.png")]
    cats = list(range(1, NUM_CLASSES + 1))
    run = lambda gt, **kw: run_parity(built.runners, images, spec=built.spec, gt=gt, image_ids=[7],  # noqa: E731
                                      category_ids=cats, **kw)
    ap = run(ds / "data.yaml", split="train").ap
    assert ap and ap == run(ds / "train.json").ap
    with pytest.raises(NorcalError, match="split must be one of val, train, test, got 'dev'"):
        run(ds / "data.yaml", split="dev")
