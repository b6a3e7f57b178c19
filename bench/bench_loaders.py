"""Load time of the JSON inputs at LVIS size: GT, results, training annotations, a table.

    python bench/bench_loaders.py [--dir DIR] [--repeats 3]

Files of LVIS v1 val's size are generated once into DIR (a temporary folder by default):
1203 categories, 20,000 images, 100,000 annotations (box, area, one polygon) and 300,000
box results. Each loader is timed from the file path (parse + validate + index); the best
of ``--repeats`` runs is printed, next to the bare ``json.load`` of the same file. Times are
process CPU seconds, so that other work on a shared machine does not count.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

NUM_CATS, NUM_IMAGES, NUM_ANNS, NUM_RESULTS = 1203, 20_000, 100_000, 300_000


def make_files(d: Path, seed: int = 0) -> dict[str, Path]:
    """Write gt.json, train.json (same shape, other ids), results.json into ``d``."""
    rng = np.random.default_rng(seed)
    cats = [{"id": c, "name": f"class_{c}", "synset": f"class_{c}.n.01", "frequency": "rcf"[c % 3],
             "image_count": int(rng.integers(1, 5000)), "instance_count": int(rng.integers(1, 9000))}
            for c in range(1, NUM_CATS + 1)]
    images = [{"id": i, "file_name": f"{i:012d}.jpg", "height": 480, "width": 640,
               "neg_category_ids": sorted(rng.choice(NUM_CATS, 5, replace=False).tolist()),
               "not_exhaustive_category_ids": []} for i in range(1, NUM_IMAGES + 1)]
    xy = rng.uniform(0, 400, (NUM_ANNS, 2))
    wh = rng.uniform(1, 200, (NUM_ANNS, 2))
    img = rng.integers(1, NUM_IMAGES + 1, NUM_ANNS)
    cat = rng.integers(1, NUM_CATS + 1, NUM_ANNS)
    anns = [{"id": k + 1, "image_id": int(img[k]), "category_id": int(cat[k]),
             "bbox": [*xy[k].tolist(), *wh[k].tolist()], "area": float(wh[k, 0] * wh[k, 1]),
             "segmentation": [[xy[k, 0], xy[k, 1], xy[k, 0] + wh[k, 0], xy[k, 1],
                               xy[k, 0] + wh[k, 0], xy[k, 1] + wh[k, 1], xy[k, 0], xy[k, 1] + wh[k, 1]]],
             "iscrowd": 0}
            for k in range(NUM_ANNS)]
    gt = {"images": images, "annotations": anns, "categories": cats, "info": {}, "licenses": []}
    rxy = rng.uniform(0, 400, (NUM_RESULTS, 2))
    rwh = rng.uniform(1, 200, (NUM_RESULTS, 2))
    results = [{"image_id": int(i), "category_id": int(c), "bbox": [*p.tolist(), *s.tolist()],
                "score": float(sc)}
               for i, c, p, s, sc in zip(rng.integers(1, NUM_IMAGES + 1, NUM_RESULTS),
                                         rng.integers(1, NUM_CATS + 1, NUM_RESULTS), rxy, rwh,
                                         rng.random(NUM_RESULTS))]
    paths = {"gt": d / "gt.json", "train": d / "train.json", "results": d / "results.json"}
    paths["gt"].write_text(json.dumps(gt))
    paths["train"].write_text(json.dumps(gt))
    paths["results"].write_text(json.dumps(results))
    return paths


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="folder for the generated files (kept; reused when present)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from norcal.core.calibration.tables import build_table, load_table
    from norcal.evaluation import from_results, prepare_gt

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(args.dir or tmp)
        d.mkdir(parents=True, exist_ok=True)
        names = ("gt.json", "train.json", "results.json")
        if all((d / n).is_file() for n in names):
            paths = {n[:-5]: d / n for n in names}
        else:
            paths = make_files(d)

        def parse(p):
            with open(p) as f:
                return json.load(f)

        rows = [
            ("GT (prepare_gt)", paths["gt"], lambda: prepare_gt(paths["gt"])),
            ("results (from_results)", paths["results"], lambda: from_results(paths["results"])),
            ("training annotations (build_table)", paths["train"], lambda: build_table(paths["train"])),
            ("table (load_table lvis_v1)", None, lambda: load_table("lvis_v1")),
        ]
        print(f"{'loader':<36} {'json.load':>10} {'loader':>10} {'ratio':>7}")
        for label, path, fn in rows:
            t_parse = best_of(lambda: parse(path), args.repeats) if path else float("nan")
            t_load = best_of(fn, args.repeats)
            print(f"{label:<36} {t_parse:>9.3f}s {t_load:>9.3f}s {t_load / t_parse:>6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
