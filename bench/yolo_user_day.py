"""An Ultralytics user's day, with the product only: does NorCal help the YOLO they deploy?

    python bench/yolo_user_day.py WORK [--gammas 0:1.5:0.1] [--conf 0.25] [--tune-split train]

WORK is bench/train_yolo_synth.py's folder: WORK/best.pt, a YOLO trained on the long-tailed
synthetic set, and WORK/yolo/data.yaml, its dataset in Ultralytics' layout. Everything below
is the product's own commands, run as a user would, on the data.yaml (no conversion by hand):

    norcal table build data.yaml -o table.json                    # N_c: training images per class
    norcal tune best.pt --gt data.yaml --split train --table table.json --gammas G [--decoding D]
    norcal-export best.pt --gamma g --table table.json [--decoding D] -o best.D.gG.onnx   (g = 0, tuned)
    norcal infer best.D.gG.onnx --image-ids data.yaml --split val -o val.D.gG.json
    norcal eval --gt data.yaml --split val --results val.D.gG.json --table table.json \\
        --score-thresh CONF --json val.D.gG.metrics.json

for both decodings: multi-label (Ultralytics' validator: every (anchor, class) pair above 0.001)
and best-class (Ultralytics' predictor: one class per box, class-wise NMS). The data.yaml has
no LVIS federated lists, so eval and tune apply COCO rules (their first line says so); the
frequency groups come from the table's counts. CONF is the deployment confidence (Ultralytics'
predictor default 0.25): eval reports precision / recall per group at it.

Then each results file is scored again by pycocotools' COCOeval against a COCO json this
script writes from the label files itself (numpy + PIL, not the product's reader): the AP /
AP50 / AP75 / APs / APm / APl must equal eval's (printed: the largest difference).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

def sh(cmd: list[str], log: Path) -> str:
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    log.write_text(p.stdout + p.stderr)
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    first = (p.stdout.strip().splitlines() or [""])[0]
    print("  ", first, flush=True)
    return p.stdout


def coco_gt_from_labels(root: Path, split_dir: str, out: Path) -> None:
    """A COCO json of one split from its YOLO label files: ids as the file names' integers,
    category id = class index + 1, boxes denormalised with the image's size."""
    from PIL import Image

    images, anns = [], []
    for img in sorted((root / split_dir).iterdir()):
        w, h = Image.open(img).size
        iid = int(img.stem)
        images.append({"id": iid, "file_name": img.name, "width": w, "height": h})
        lab = root / split_dir.replace("images", "labels", 1) / f"{img.stem}.txt"
        rows = np.loadtxt(lab, ndmin=2) if lab.exists() and lab.stat().st_size else np.zeros((0, 5))
        for c, cx, cy, bw, bh in rows:
            x, y, ww, hh = (cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h
            anns.append({"id": len(anns) + 1, "image_id": iid, "category_id": int(c) + 1,
                         "bbox": [x, y, ww, hh], "area": ww * hh, "iscrowd": 0})
    n = 1 + max(a["category_id"] for a in anns)
    out.write_text(json.dumps({"images": images, "annotations": anns,
                               "categories": [{"id": i, "name": str(i)} for i in range(1, n + 60)]}))


def pycocotools_stats(gt: Path, results: Path) -> dict:
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        g = COCO(str(gt))
        d = g.loadRes(str(results))
        e = COCOeval(g, d, "bbox")
        e.evaluate()
        e.accumulate()
        e.summarize()
    return dict(zip(("AP", "AP50", "AP75", "APs", "APm", "APl"), e.stats[:6]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path, help="bench/train_yolo_synth.py's folder (best.pt, yolo/data.yaml)")
    ap.add_argument("--gammas", default="0:1.5:0.1")
    ap.add_argument("--conf", type=float, default=0.25, help="deployment confidence (Ultralytics' predictor default)")
    ap.add_argument("--tune-split", default="train", help="the data.yaml split tune runs on (default train)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = args.work.resolve()
    weights, data = work / "best.pt", work / "yolo" / "data.yaml"
    out = (args.out or work / "user_day").resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ.setdefault("YOLO_CONFIG_DIR", str(work / "ultralytics_cfg"))
    bindir = Path(sys.executable).parent
    norcal, export = str(bindir / "norcal"), str(bindir / "norcal-export")
    t0 = time.time()

    table = out / "table.json"
    sh([norcal, "table", "build", str(data), "-o", str(table)], out / "table.log")
    coco_gt = out / "val.coco.json"
    coco_gt_from_labels(work / "yolo", "images/val", coco_gt)

    rows, worst = [], 0.0
    for decoding in ("multi-label", "best-class"):
        flags = ["--decoding", decoding]
        tune_json = out / f"tune.{decoding}.json"
        t = time.time()
        sh([norcal, "tune", str(weights), "--gt", str(data), "--split", args.tune_split, "--table", str(table),
            "--gammas", args.gammas, "--json", str(tune_json), *flags], out / f"tune.{decoding}.log")
        tune = json.loads(tune_json.read_text())
        best = float(tune["best"]["gamma"])
        print(f"   tune ({decoding}): gamma {best:g}, {tune['num_images']} images, {time.time() - t:.0f} s")
        for g in sorted({0.0, best}):
            stem = f"{decoding}.g{g:g}"
            onnx, res, met = out / f"best.{stem}.onnx", out / f"val.{stem}.json", out / f"val.{stem}.metrics.json"
            sh([export, str(weights), "--gamma", f"{g:g}", "--table", str(table), "-o", str(onnx), *flags],
               out / f"export.{stem}.log")
            sh([norcal, "infer", str(onnx), "--image-ids", str(data), "--split", "val", "-o", str(res)],
               out / f"infer.{stem}.log")
            sh([norcal, "eval", "--gt", str(data), "--split", "val", "--results", str(res), "--table", str(table),
                "--score-thresh", f"{args.conf:g}", "--no-fixed", "--json", str(met)], out / f"eval.{stem}.log")
            m = json.loads(met.read_text())
            ref = pycocotools_stats(coco_gt, res)
            diff = max(abs(m["stats"][k] - ref[k]) for k in ref)
            worst = max(worst, diff)
            rows.append((decoding, g, g == best, m, diff))

    print(f"\nrules: {rows[0][3].get('rules')} ({rows[0][3].get('rules_reason')})")
    print(f"deployment confidence {args.conf:g}; gamma tuned on the {args.tune_split} split, reported on val")
    print("| decoding | gamma | AP | APr | APc | APf | AP50 | precision r / c / f | recall r / c / f |")
    print("|---|---|---|---|---|---|---|---|---|")
    for decoding, g, tuned, m, _ in rows:
        s, dep = m["stats"], m["deployment"]
        by = dep["groups"]  # all, r, c, f: {tp, fp, num_gt, precision, recall} (-1: undefined)
        pct = lambda k, key: f"{100 * by[k][key]:.1f}" if k in by and by[k][key] >= 0 else "-"  # noqa: E731
        pr = " / ".join(pct(k, "precision") for k in "rcf")
        rc = " / ".join(pct(k, "recall") for k in "rcf")
        name = f"{g:g}" + (" (tuned)" if tuned and g else "")
        print(f"| {decoding} | {name} | " + " | ".join(f"{100 * s[k]:.1f}" for k in ("AP", "APr", "APc", "APf", "AP50"))
              + f" | {pr} | {rc} |")
    print(f"\neval vs pycocotools on the same results files: largest difference {worst:.1e} "
          f"(AP, AP50, AP75, APs, APm, APl; {len(rows)} files)")
    (out / "summary.json").write_text(json.dumps([{"decoding": d, "gamma": g, "tuned": t, "metrics": m,
                                                   "pycocotools_max_diff": x} for d, g, t, m, x in rows], indent=1))
    print(f"{time.time() - t0:.0f} s; {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
