"""Does NorCal help a small YOLO trained on the long-tailed synthetic set? Val AP / APr / APc / APf
at gamma 0 and at the gamma chosen on training images.

    python bench/measure_yolo_synth.py WORK/best.pt [--path ultralytics|product] [--gammas 0:1.5:0.1]
        [--fixture ../shared/fixtures/d2_synth_trained] [--out DIR]

The model is the one bench/train_yolo_synth.py trains. N_c is the image count per class of the
fixture's train_annotations.json (the table `norcal table` / `--table` builds from it, classes
in category id order). gamma is chosen on the 120 training images of train_subset.json (the
paper's protocol) by LVIS box AP, then both gamma 0 and that gamma are evaluated on the 48
validation images (val.json: LVIS federated rules, the frequency groups of the training counts).

--path product (the final form): the product's own commands, run as a user would:
    norcal tune best.pt --gt train_subset.json --images train_subset/ --table train_annotations.json
    norcal-export best.pt --gamma G --table train_annotations.json -o best.gG.onnx   (G = 0 and best)
    norcal infer best.gG.onnx val/ --image-ids val.json -o val.gG.json
    norcal eval --gt val.json --results val.gG.json --json val.gG.metrics.json
--path ultralytics (independent of the product's export / runtime): Ultralytics' own predictor
(--conf 0.001 by default, class-wise NMS IoU 0.7, one class per box, 300 per image, imgsz 256) with NorCal put
into the head by hand: the class logits' conv bias is lowered by gamma * log N_c, so each score
is sigmoid(logit - gamma * log N_c); the detections go through norcal.evaluation (LVIS AP).

A sigmoid head has no background logit to renormalise against: NorCal lowers every class's
scores (N_c >= 1), rare classes least. A per-class monotone change leaves each class's ranking,
hence its AP, as it is, except through the cuts: the score threshold (--conf), the one class kept
per box (argmax) before NMS, and the 300 detections per image.
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

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared"
if not SHARED.is_dir():  # a helper worktree sits one level deeper than the main checkout
    SHARED = Path("/work/shared")
KEYS = ("AP", "APr", "APc", "APf", "AP50")


def gamma_grid(spec: str) -> list[float]:
    if ":" in spec:
        a, b, s = (float(v) for v in spec.split(":"))
        return [round(a + i * s, 10) for i in range(int(round((b - a) / s)) + 1)]
    return [float(v) for v in spec.split(",")]


def fmt(stats: dict) -> str:
    return "  ".join(f"{k} {100 * stats[k]:5.1f}" for k in KEYS)


class HandNorcal:
    """Ultralytics' predictor on a trained checkpoint, with sigmoid(logit - gamma log N_c)."""

    def __init__(self, weights: Path, log_n: np.ndarray, imgsz: int, conf: float = 0.001):
        from ultralytics import YOLO

        self.yolo = YOLO(str(weights))
        self.imgsz = imgsz
        self.conf = conf
        self.log_n = log_n
        self.heads = None

    def _set_gamma(self, gamma: float) -> None:
        import torch
        from ultralytics.nn.modules.head import Detect

        if self.heads is None:  # the predictor's (fused) model: the module that really runs
            net = self.yolo.predictor.model.model  # AutoBackend -> its PyTorch DetectionModel
            heads = [m for m in net.modules() if isinstance(m, Detect)]
            if len(heads) != 1 or heads[0].end2end or heads[0].nc != len(self.log_n):
                raise SystemExit(f"expected one non-end2end Detect head with {len(self.log_n)} classes")
            self.convs = [seq[-1] for seq in heads[0].cv3]  # the last 1x1 conv gives the class logits
            self.bias0 = [c.bias.detach().clone() for c in self.convs]
            self.heads = heads
        shift = torch.as_tensor(gamma * self.log_n, dtype=self.bias0[0].dtype)
        with torch.no_grad():
            for c, b in zip(self.convs, self.bias0):
                c.bias.copy_(b - shift)

    def detect(self, files: list[Path], gamma: float) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        kw = dict(imgsz=self.imgsz, conf=self.conf, iou=0.7, max_det=300, device="cpu", verbose=False)
        if self.yolo.predictor is None:
            self.yolo.predict(str(files[0]), **kw)  # builds the predictor
        self._set_gamma(gamma)
        out = []
        for f in files:
            r = self.yolo.predict(str(f), **kw)[0].boxes
            out.append((r.xyxy.numpy().astype(np.float64), r.conf.numpy().astype(np.float64),
                        r.cls.numpy().astype(np.int64)))
        return out


def results_json(gt: dict, dets, cat_ids: list[int]) -> list[dict]:
    res = []
    for im, (xyxy, conf, cls) in zip(gt["images"], dets):
        for b, s, c in zip(xyxy, conf, cls):
            res.append({"image_id": im["id"], "category_id": int(cat_ids[c]), "score": float(s),
                        "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]})
    return res


def run_ultralytics(args, counts: np.ndarray, cat_ids: list[int]) -> dict:
    from norcal.evaluation import evaluate, prepare_gt

    fx = args.fixture
    sets = {"train_subset": (fx / "train_subset.json", fx / "train_subset"), "val": (fx / "val.json", fx / "val")}
    model = HandNorcal(args.weights, np.log(counts), args.imgsz, args.conf)
    sweep: dict[str, list] = {"train_subset": [], "val": []}
    for split, (gt_path, img_dir) in sets.items():
        gt = json.loads(gt_path.read_text())
        pgt = prepare_gt(gt)
        files = [img_dir / im["file_name"] for im in gt["images"]]
        for g in args.gamma_list:
            t = time.time()
            res = results_json(gt, model.detect(files, g), cat_ids)
            # no detection above the predictor's conf: AP 0 (the evaluation refuses an empty list)
            stats = evaluate(pgt, res, iou_type="bbox", max_dets=300).stats if res else dict.fromkeys(KEYS, 0.0)
            sweep[split].append({"gamma": g, "num_detections": len(res), "stats": stats})
            print(f"{split:12s} gamma {g:4.2f}  {fmt(stats)}  ({len(res)} dets, {time.time() - t:.1f} s)", flush=True)
    return sweep


def sh(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def run_product(args, out: Path) -> dict:
    fx, bindir = args.fixture, Path(sys.executable).parent
    table = str(fx / "train_annotations.json")
    tune_json = out / "tune.json"
    sh([str(bindir / "norcal"), "tune", str(args.weights), "--gt", str(fx / "train_subset.json"),
        "--images", str(fx / "train_subset"), "--table", table, "--gammas", args.gammas, "--json", str(tune_json)])
    tune = json.loads(tune_json.read_text())
    best = float(tune["best"]["gamma"])
    sweep = {"train_subset": [{"gamma": r["gamma"], "num_detections": r["num_detections"], "stats": r["stats"]}
                              for r in tune["sweep"]], "val": []}
    for g in sorted({0.0, best}):
        onnx = out / f"best.g{g:g}.onnx"
        res, met = out / f"val.g{g:g}.json", out / f"val.g{g:g}.metrics.json"
        sh([str(bindir / "norcal-export"), str(args.weights), "--gamma", f"{g:g}", "--table", table, "-o", str(onnx)])
        sh([str(bindir / "norcal"), "infer", str(onnx), str(fx / "val"), "--image-ids", str(fx / "val.json"),
            "-o", str(res)])
        sh([str(bindir / "norcal"), "eval", "--gt", str(fx / "val.json"), "--results", str(res), "--no-fixed",
            "--json", str(met)])
        sweep["val"].append({"gamma": g, "stats": json.loads(met.read_text())["stats"]})
    return sweep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights", type=Path, help="best.pt of bench/train_yolo_synth.py")
    ap.add_argument("--path", choices=("ultralytics", "product"), default="product")
    ap.add_argument("--gammas", default="0:1.5:0.1", help="start:stop:step or a comma list (default 0:1.5:0.1)")
    ap.add_argument("--fixture", type=Path, default=SHARED / "fixtures" / "d2_synth_trained")
    ap.add_argument("--imgsz", type=int, default=256, help="--path ultralytics: predictor image size")
    ap.add_argument("--conf", type=float, default=0.001,
                    help="--path ultralytics: the predictor's score threshold (default 0.001, Ultralytics' "
                         "validation value; 0 keeps every anchor's best class, so only the top 300 cut)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="folder for the results (default: next to the weights)")
    args = ap.parse_args()
    args.gamma_list = gamma_grid(args.gammas)
    name = f"measure_{args.path}" + (f"_conf{args.conf:g}" if args.path == "ultralytics" else "")
    out = (args.out or args.weights.resolve().parent / name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ.setdefault("YOLO_CONFIG_DIR", str(out / "ultralytics_cfg"))

    import torch

    from norcal.core.calibration.tables import build_table

    torch.set_num_threads(args.threads)
    table = build_table(args.fixture / "train_annotations.json")  # N_c = training images per class
    counts, cat_ids = table.counts(), table.category_ids
    t = time.time()
    sweep = run_ultralytics(args, counts, cat_ids) if args.path == "ultralytics" else run_product(args, out)

    tuned = max(sweep["train_subset"], key=lambda r: r["stats"]["AP"])  # first best: the smallest gamma
    g_best = tuned["gamma"]
    val = {r["gamma"]: r["stats"] for r in sweep["val"]}
    summary = {"path": args.path, "conf": args.conf if args.path == "ultralytics" else None, "weights": str(args.weights), "gammas": args.gammas, "best_gamma": g_best,
               "val_gamma0": val[0.0], "val_best": val[g_best], "sweep": sweep, "seconds": time.time() - t}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\ngamma chosen on train_subset (120 images): {g_best:g} "
          f"(train AP {100 * tuned['stats']['AP']:.1f} vs {100 * sweep['train_subset'][0]['stats']['AP']:.1f} at 0)")
    print("| setting | AP | APr | APc | APf | AP50 |\n|---|---|---|---|---|---|")
    for name, s in ((f"gamma 0", val[0.0]), (f"gamma {g_best:g} (tuned)", val[g_best])):
        print(f"| {name} | " + " | ".join(f"{100 * s[k]:.1f}" for k in KEYS) + " |")
    print(f"results: {out / 'summary.json'}  ({time.time() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
