"""Train a small Ultralytics YOLO from scratch on the long-tailed synthetic set (CPU, minutes).

    python bench/train_yolo_synth.py WORK [--synth ../shared/tools/synth_longtail.py]
        [--fixture ../shared/fixtures/d2_synth_trained] [--model yolo11n.yaml]
        [--epochs 12] [--imgsz 256] [--batch 32] [--threads 2]

The 2000 training images of the d2_synth_trained example are drawn again with the dataset's own
generator (synth_longtail.py, seed 0) into WORK/synth; its annotations must equal the fixture's
train_annotations.json (image ids, file names, category ids, boxes), else nothing is trained.
Validation is the fixture's split (val.json + val/, 48 class-balanced images). Both are written
in Ultralytics' layout under WORK/yolo (images/, labels/, data.yaml): class k is the k-th category
id in sorted order (the order of the project's tables), boxes normalised (cx, cy, w, h).

Colour is half of every class (6 shapes x 10 colours), so hue / saturation / value jitter is off.
AdamW at lr0 0.002 with one warm-up epoch, mosaic closed for the last 3 epochs.
Weights go to WORK/best.pt (never into the repository); the script prints the images per split,
the epochs and the wall time. Seeds are fixed (Ultralytics seed 0, deterministic), no download:
the model is built from its yaml, YOLO_OFFLINE=1 and Ultralytics' settings live under WORK.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared"
if not SHARED.is_dir():  # a helper worktree sits one level deeper than the main checkout
    SHARED = Path("/work/shared")


def regenerate(synth: Path, out: Path, fixture_train: Path) -> dict:
    """Draw the training set with the generator and check it against the fixture's annotations."""
    if not (out / "train.json").is_file():
        subprocess.run([sys.executable, str(synth), str(out), "--train", "2000", "--val", "0", "--seed", "0"],
                       check=True)
    mine = json.loads((out / "train.json").read_text())
    ref = json.loads(fixture_train.read_text())
    key_i = lambda d: [(x["id"], x["file_name"], x["height"], x["width"]) for x in d["images"]]
    key_a = lambda d: [(x["id"], x["image_id"], x["category_id"], x["bbox"]) for x in d["annotations"]]
    key_c = lambda d: [(x["id"], x["name"], x["frequency"], x["image_count"]) for x in d["categories"]]
    for what, key in (("images", key_i), ("annotations", key_a), ("categories", key_c)):
        if key(mine) != key(ref):
            raise SystemExit(f"regenerated {what} differ from {fixture_train}: not the fixture's training set")
    return mine


def write_split(coco: dict, img_dir: Path, dest: Path, split: str, cat_ids: list[int]) -> int:
    """Ultralytics layout: dest/images/split/*.png and dest/labels/split/*.txt ("k cx cy w h")."""
    cls = {c: k for k, c in enumerate(cat_ids)}
    (dest / "images" / split).mkdir(parents=True, exist_ok=True)
    (dest / "labels" / split).mkdir(parents=True, exist_ok=True)
    by_img: dict[int, list[dict]] = {}
    for a in coco["annotations"]:
        by_img.setdefault(a["image_id"], []).append(a)
    for im in coco["images"]:
        w, h = im["width"], im["height"]
        src, dst = img_dir / im["file_name"], dest / "images" / split / im["file_name"]
        if not dst.exists():
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
        lines = []
        for a in by_img.get(im["id"], []):
            x, y, bw, bh = a["bbox"]
            if bw <= 0 or bh <= 0:
                continue
            lines.append(f"{cls[a['category_id']]} {(x + bw / 2) / w:.6f} {(y + bh / 2) / h:.6f} "
                         f"{bw / w:.6f} {bh / h:.6f}")
        (dest / "labels" / split / (Path(im["file_name"]).stem + ".txt")).write_text("\n".join(lines) + "\n")
    return len(coco["images"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path, help="work folder outside the repository (data, runs, best.pt)")
    ap.add_argument("--synth", type=Path, default=SHARED / "tools" / "synth_longtail.py")
    ap.add_argument("--fixture", type=Path, default=SHARED / "fixtures" / "d2_synth_trained")
    ap.add_argument("--model", default="yolo11n.yaml", help="Ultralytics model yaml (built from scratch)")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--hours", type=float, default=None,
                    help="train for this wall time instead (Ultralytics' time=: the epoch count is set from "
                         "the first epoch's duration, the schedule follows it); for a shared, busy CPU")
    ap.add_argument("--lr0", type=float, default=0.002,
                    help="AdamW learning rate (Ultralytics' 'auto' would pick 0.01 / (4 + 60) = 1.6e-4, "
                         "a fine-tuning rate, too low for a few epochs from scratch)")
    ap.add_argument("--imgsz", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = ap.parse_args()

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ.setdefault("YOLO_CONFIG_DIR", str(work / "ultralytics_cfg"))

    t0 = time.time()
    train = regenerate(args.synth, work / "synth", args.fixture / "train_annotations.json")
    val = json.loads((args.fixture / "val.json").read_text())
    cat_ids = sorted(c["id"] for c in train["categories"])
    if cat_ids != sorted(c["id"] for c in val["categories"]):
        raise SystemExit("train and val categories differ")
    names = {c["id"]: c["name"] for c in train["categories"]}
    ydir = work / "yolo"
    n_train = write_split(train, work / "synth" / "train", ydir, "train", cat_ids)
    n_val = write_split(val, args.fixture / "val", ydir, "val", cat_ids)
    data_yaml = ydir / "data.yaml"
    data_yaml.write_text(f"path: {ydir}\ntrain: images/train\nval: images/val\nnames:\n"
                         + "".join(f"  {k}: '{names[c]}'\n" for k, c in enumerate(cat_ids)))
    print(f"data: {n_train} training images, {n_val} validation images, {len(cat_ids)} classes "
          f"-> {data_yaml} ({time.time() - t0:.0f} s)", flush=True)

    import torch
    torch.set_num_threads(args.threads)
    from ultralytics import YOLO

    t1 = time.time()
    model = YOLO(args.model)
    model.train(data=str(data_yaml), epochs=args.epochs, imgsz=args.imgsz, batch=args.batch, device="cpu",
                workers=0, seed=0, deterministic=True, pretrained=False, amp=False, plots=False,
                optimizer="AdamW", lr0=args.lr0, warmup_epochs=1,
                hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, close_mosaic=3, cache="ram",
                **({"time": args.hours} if args.hours else {}),
                project=str(work / "runs"), name="train", exist_ok=True, verbose=True)
    wall = time.time() - t1
    run = work / "runs" / "train" / "weights"
    best = work / "best.pt"
    shutil.copyfile(run / "best.pt", best)
    epochs = len((work / "runs" / "train" / "results.csv").read_text().strip().splitlines()) - 1
    print(f"trained {args.model} {epochs} epochs imgsz {args.imgsz} batch {args.batch} "
          f"threads {args.threads}: {wall / 60:.1f} min wall; weights {best}; data {data_yaml}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
