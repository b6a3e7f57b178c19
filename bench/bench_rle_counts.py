"""Cost of checking every compressed RLE string of a mask results file, against reading it.

    python bench/bench_rle_counts.py [--records 100000] [--repeats 3]

A results file of ``--records`` instance-segmentation detections on 480 x 640 images (each
mask an ellipse of random size and place, encoded by pycocotools) is written to a temporary
folder; then timed, best of ``--repeats`` (process CPU seconds): the bare ``json.load``, the
check of every string's form and run sum (:func:`norcal.core.datasets.rle_counts.check_rle_counts`, what
loading results runs), and the one-string-at-a-time reader it replaced for large files, on
the first 10,000 records (scaled up to the whole file).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_utils

H, W = 480, 640


def make_results(path: Path, n: int, seed: int = 0) -> None:
    """``n`` results whose masks are drawn from 500 distinct ellipses (encoding each one is the
    slow part; the check's cost is per character, whichever mask the string is)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:H, :W]
    rles = []
    for _ in range(500):
        cy, cx = rng.uniform(0, H), rng.uniform(0, W)
        ry, rx = rng.uniform(5, H / 2), rng.uniform(5, W / 2)
        mask = np.asfortranarray((((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1).astype(np.uint8))
        rle = mask_utils.encode(mask)
        rles.append({"size": [H, W], "counts": rle["counts"].decode()})
    pick = rng.integers(0, len(rles), n)
    results = [{"image_id": int(k // 100) + 1, "category_id": int(k % 7) + 1, "score": 0.5,
                "segmentation": rles[p]} for k, p in enumerate(pick)]
    path.write_text(json.dumps(results))


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    from norcal.core.datasets.rle_counts import check_rle_counts, counts_problem

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "results.json"
        make_results(path, args.records)
        records = json.loads(path.read_text())
        chars = sum(len(r["segmentation"]["counts"]) for r in records)
        load = best(lambda: json.loads(path.read_text()), args.repeats)
        check = best(lambda: check_rle_counts(str(path), "", records), args.repeats)
        head = records[:10_000]
        scalar = best(lambda: [counts_problem(r["segmentation"]["counts"], H, W) for r in head], 1)
        scalar *= len(records) / len(head)
        size = path.stat().st_size
    print(f"{len(records):,} records, {chars / 1e6:.1f} M RLE characters, {size / 1e6:.0f} MB")
    print(f"json.load                      {load:7.2f} s")
    print(f"check every string (numpy)     {check:7.2f} s  ({check / load:.2f}x the JSON read)")
    print(f"one string at a time (Python)  {scalar:7.2f} s  ({scalar / load:.2f}x; estimated from 10,000)")


if __name__ == "__main__":
    main()
