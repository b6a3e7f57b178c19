"""YOLO label files read as Ultralytics' ``verify_image_label`` reads them, every line checked.

A line is ``class x y w h`` (a box: centre and size) or ``class x1 y1 x2 y2 ...`` (a polygon of
at least 3 points), numbers normalised by the image size and held as float32, as Ultralytics
holds them. A file with any polygon line (more than 6 fields) is a file of polygons: a box line
in it is refused, as Ultralytics refuses files that mix them. What Ultralytics accepts is
accepted, what it drops as corrupt is refused here, naming the file, the line and the field:

- the class: an integer value (``1`` or ``1.0``) in 0..nc-1;
- a box: x and y in [-0.01, 1.01], w and h in [0, 1.01] (Ultralytics' 1% tolerance);
- a polygon: the box around it (Ultralytics' ``segments2boxes``) within the same bounds; the
  field named is the polygon's point that puts it out;
- every number finite.

In a file of polygons Ultralytics also reads a 1-point "polygon" (``class x y``): its box
(``segments2boxes``) has zero width and height, a target its validator never matches (IoU 0);
it is read so here too (``polygon`` holds the one point). A 2-point one has the 5 fields of a
box line, so Ultralytics takes it as a box, and in a file of polygons refuses the file (a mix):
so does this reader. Repeated lines (the same class and numbers as
float32) count once, as Ultralytics removes duplicate labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from norcal.core.errors import NorcalError, shown

BOX_FIELDS = ("class", "x", "y", "w", "h")
TOLERANCE = 0.01  # verify_image_label: "Coordinate points check with 1% tolerance"
HIGH = 1.0 + TOLERANCE


@dataclass(frozen=True)
class YoloLabel:
    """One label: its class, its box (cx, cy, w, h; a polygon's: the box around it) and, for a
    polygon, its points (x1, y1, x2, y2, ...), all normalised, float32 values."""

    cls: int
    box: tuple[float, float, float, float]
    polygon: tuple[float, ...] | None = None


def _field_name(k: int, polygon: bool) -> str:
    if not polygon:
        return BOX_FIELDS[k]
    return "class" if k == 0 else f"{'xy'[(k - 1) % 2]}{(k + 1) // 2}"


def _out_of_range(path: Path, n: int, k: int, name: str, token: str, why: str = "") -> NorcalError:
    return NorcalError(f"{path}: line {n}, field {k + 1} ({name}): {shown(token, 30)} is outside [0, 1] "
                       f"{why or 'beyond Ultralytics tolerance of 0.01'} (coordinates are normalised by the "
                       "image size)")


def _numbers(path: Path, n: int, tokens: list[str], polygon: bool) -> list[np.float32]:
    values = []
    for k, token in enumerate(tokens):
        try:
            v = float(token)
        except ValueError:
            what = "an integer class id" if k == 0 else "a number"
            raise NorcalError(f"{path}: line {n}, field {k + 1} ({_field_name(k, polygon)}): "
                              f"{shown(token, 30)} is not {what}") from None
        if not math.isfinite(v):
            if k == 0:
                raise NorcalError(f"{path}: line {n}, field 1 (class): {shown(token, 30)} is not an "
                                  "integer class id")
            raise _out_of_range(path, n, k, _field_name(k, polygon), token, "(not a finite number)")
        values.append(np.float32(v))
    return values


def _check_class(path: Path, n: int, token: str, value: np.float32, num_classes: int) -> int:
    if value % 1 != 0:
        raise NorcalError(f"{path}: line {n}, field 1 (class): {shown(token, 30)} is not an integer class id")
    cls = int(value)
    if not 0 <= cls < num_classes:
        raise NorcalError(f"{path}: line {n}, field 1 (class): class id {cls} is outside names "
                          f"(0..{num_classes - 1})")
    return cls


def _box_of_polygon(path: Path, n: int, tokens: list[str], xy: list[np.float32]) -> tuple:
    """segments2boxes' box of a polygon, checked as verify_image_label checks it."""
    box = []
    for axis in (0, 1):  # x, then y
        coords = xy[axis::2]
        lo, hi = int(np.argmin(coords)), int(np.argmax(coords))
        centre, size = (coords[lo] + coords[hi]) / np.float32(2), coords[hi] - coords[lo]
        if not centre >= -TOLERANCE:
            k = 1 + axis + 2 * lo
            raise _out_of_range(path, n, k, _field_name(k, True), tokens[k])
        if not (centre <= HIGH and size <= HIGH):
            k = 1 + axis + 2 * hi
            raise _out_of_range(path, n, k, _field_name(k, True), tokens[k])
        box.append((centre, size))
    return float(box[0][0]), float(box[1][0]), float(box[0][1]), float(box[1][1])


def _check_box(path: Path, n: int, tokens: list[str], xywh: list[np.float32]) -> tuple:
    for k, v in enumerate(xywh, 1):
        low = -TOLERANCE if k <= 2 else 0.0  # a centre may sit just outside, a size is never negative
        if not (low <= v <= HIGH):
            raise _out_of_range(path, n, k, BOX_FIELDS[k], tokens[k])
    return tuple(float(v) for v in xywh)


def read_yolo_labels(path: Path, num_classes: int) -> list[YoloLabel]:
    """The distinct labels of a YOLO label file in file order, every field checked."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise NorcalError(f"{path}: not a YOLO label file (not UTF-8 text)") from None
    except OSError as e:
        raise NorcalError(f"{path}: cannot read labels: {e.strerror or e}") from None
    lines = [(n, line.split()) for n, line in enumerate(text.splitlines(), 1) if line.split()]
    polygons = any(len(t) > 6 for _, t in lines)
    seen: set[tuple] = set()
    labels = []
    for n, tokens in lines:
        m = len(tokens)
        if polygons and m == len(BOX_FIELDS):
            first = next(k for k, t in lines if len(t) > 6)
            raise NorcalError(f"{path}: line {n}: a box ('class x y w h') in a file of polygons (line "
                              f"{first}); Ultralytics refuses files that mix them")
        one_point = polygons and m == 3  # segments2boxes: a zero-size box at the point
        if m != len(BOX_FIELDS) and (m < 7 or m % 2 == 0) and not one_point:
            raise NorcalError(f"{path}: line {n}: {m} fields; a label is 'class x y w h' or a "
                              "class and at least 3 'x y' polygon points")
        values = _numbers(path, n, tokens, polygons)
        cls = _check_class(path, n, tokens[0], values[0], num_classes)
        if polygons:
            label = YoloLabel(cls, _box_of_polygon(path, n, tokens, values[1:]),
                              tuple(float(v) for v in values[1:]))
        else:
            label = YoloLabel(cls, _check_box(path, n, tokens, values[1:]))
        key = (cls, label.polygon or label.box)
        if key not in seen:
            seen.add(key)
            labels.append(label)
    return labels
