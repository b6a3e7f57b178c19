"""The synthetic long-tailed dataset the bundled example was trained on, drawn again from its seed.

60 classes (6 shapes x 10 colours) on noisy backgrounds; training frequency follows a geometric
law (LVIS's rare / common / frequent groups), validation is class-balanced. One random stream
(numpy's PCG64, seed 0) draws the 2000 training images, then the validation images, so any image
is reproduced by replaying the stream up to it. ``d2_synth_trained/generated.json`` holds the
sha256 of every file the example needs from here (the pixels of each image, the bytes of
``train_annotations.json``); :func:`generate` refuses to write anything that differs.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

SHAPES = ("square", "triangle", "diamond", "hexagon", "disc", "star")
COLORS = ((230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
          (145, 30, 180), (70, 240, 240), (240, 50, 230), (128, 128, 0), (250, 190, 212))
NUM_CLASSES = len(SHAPES) * len(COLORS)
SIZE = 256
NUM_TRAIN = 2000
VAL_START = 100001
# vertex count and angular offset of each shape's polygon
_POLYGONS = {"square": (4, math.pi / 4), "triangle": (3, -math.pi / 2), "diamond": (4, 0.0),
             "hexagon": (6, 0.0), "disc": (32, 0.0), "star": (10, -math.pi / 2)}


def _polygon(shape: str, cx: float, cy: float, r: float, rot: float) -> list[tuple[float, float]]:
    k, off = _POLYGONS[shape]
    pts = []
    for i in range(k):
        a = off + rot + 2 * math.pi * i / k
        rr = r * (0.45 if shape == "star" and i % 2 else 1.0)
        pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return pts


def _draw(rng: np.random.Generator, class_p: np.ndarray, must: list[int], image_id: int,
          render: bool, first_ann: int):
    """One image: (pixels or None, annotations). Consumes the stream as the original drawing did,
    whether or not the image is rendered."""
    from PIL import Image, ImageDraw

    bg = rng.integers(40, 200, size=3)
    noise = rng.normal(0, 12, (SIZE, SIZE, 3))
    im = draw = None
    if render:
        im = Image.fromarray(np.clip(bg + noise, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(im)
    anns = []
    for j in range(int(rng.integers(1, 5))):
        c = must.pop() if (must and j == 0) else int(rng.choice(len(class_p), p=class_p))
        shape, color = SHAPES[c // len(COLORS)], COLORS[c % len(COLORS)]
        r = float(rng.uniform(14, 48))
        cx, cy = rng.uniform(r, SIZE - r, 2)
        pts = _polygon(shape, cx, cy, r, float(rng.uniform(0, 0.4)))
        fill = tuple(int(v) for v in np.clip(np.array(color) + rng.normal(0, 8, 3), 0, 255))
        if render:
            draw.polygon(pts, fill=fill)
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        x0, y0 = max(0, min(xs)), max(0, min(ys))
        x1, y1 = min(SIZE, max(xs)), min(SIZE, max(ys))
        flat = [float(v) for p in pts for v in (min(max(p[0], 0), SIZE), min(max(p[1], 0), SIZE))]
        anns.append({"id": first_ann + len(anns), "image_id": image_id, "category_id": c + 1,
                     "bbox": [x0, y0, x1 - x0, y1 - y0],  # as drawn: an int 0 or 256 at a border
                     "area": float((x1 - x0) * (y1 - y0)), "segmentation": [flat], "iscrowd": 0})
    return (np.asarray(im) if render else None), anns


def draw_dataset(render: set[int], num_val: int) -> Iterator[tuple[int, np.ndarray | None, list[dict]]]:
    """(image id, pixels if the id is in ``render``, annotations) for every training image, then
    the first ``num_val`` validation images, in the order of the random stream."""
    rng = np.random.default_rng(0)
    order = rng.permutation(NUM_CLASSES)  # which classes are frequent is random, not by shape
    w = np.empty(NUM_CLASSES)
    w[order] = (1.0 / 300.0) ** (np.arange(NUM_CLASSES) / (NUM_CLASSES - 1))
    ann_id = 1
    for start, n, p in ((1, NUM_TRAIN, w / w.sum()), (VAL_START, num_val, np.full(NUM_CLASSES, 1.0 / NUM_CLASSES))):
        must = list(range(NUM_CLASSES))  # every class appears at least once per split
        for k in range(n):
            iid = start + k
            pixels, anns = _draw(rng, p, must, iid, iid in render, ann_id)
            ann_id += len(anns)
            yield iid, pixels, anns


def train_annotations(anns: list[dict]) -> dict:
    """The training set's COCO-format annotations, with per-class image and instance counts."""
    img_count = [len({a["image_id"] for a in anns if a["category_id"] == c + 1}) for c in range(NUM_CLASSES)]
    inst_count = [sum(1 for a in anns if a["category_id"] == c + 1) for c in range(NUM_CLASSES)]
    cats = [{"id": c + 1, "name": f"{c % len(COLORS)}_{SHAPES[c // len(COLORS)]}",
             "synset": f"{SHAPES[c // len(COLORS)]}.c{c % len(COLORS)}",
             "frequency": "r" if n <= 10 else "c" if n <= 100 else "f",
             "image_count": n, "instance_count": inst_count[c]} for c, n in enumerate(img_count)]
    images = [{"id": i, "file_name": f"{i:06d}.png", "height": SIZE, "width": SIZE}
              for i in range(1, NUM_TRAIN + 1)]
    return {"images": images, "annotations": anns, "categories": cats, "info": {}, "licenses": []}


def pixel_sha256(pixels: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(pixels, np.uint8).tobytes()).hexdigest()


class Mismatch(Exception):
    """A drawn file differs from the one the example was made with."""


def generate(dest: Path, expected: dict, progress: Callable[[int, int], None] | None = None) -> None:
    """Write the example's drawn files into ``dest`` (``val/``, ``train_subset/`` and
    ``train_annotations.json``, as listed in ``expected``: generated.json), each checked against
    its sha256 before it is written; raises :class:`Mismatch` at the first difference."""
    from PIL import Image

    wanted = {int(Path(name).stem): name for name in expected["images"]}
    num_val = max((i - VAL_START + 1 for i in wanted if i >= VAL_START), default=0)
    total = NUM_TRAIN + num_val
    anns: list[dict] = []
    for n, (iid, pixels, image_anns) in enumerate(draw_dataset(set(wanted), num_val), 1):
        if iid < VAL_START:
            anns += image_anns
        if pixels is not None:
            name = wanted[iid]
            if pixel_sha256(pixels) != expected["images"][name]:
                raise Mismatch(name)
            path = dest / name
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(path)
        if progress is not None and (n % 100 == 0 or n == total):
            progress(n, total)
    data = json.dumps(train_annotations(anns)).encode()
    if hashlib.sha256(data).hexdigest() != expected["train_annotations.json"]:
        raise Mismatch("train_annotations.json")
    (dest / "train_annotations.json").write_bytes(data)
