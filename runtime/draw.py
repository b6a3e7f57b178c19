"""Pictures of detections: several models' detections on one image, side by side, in one PNG.

Each panel shows, for each object, one model's best detection (score >= a threshold; a
detection overlapping a better one shown already is left out, so each object gets one label:
the class the model ranks first there) as box, filled mask and a label "class score",
coloured by the class's frequency group (rare red, common orange, frequent blue: LVIS's split
of the training counts), so the rare-class detections a calibration recovers stand out.
Pillow draws; text uses matplotlib's DejaVu Sans (Greek letters included) when it is there.
The detections are never modified.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from norcal.core.boxes import box_iou
from norcal.core.errors import NorcalError
from norcal.core.files.fileio import atomic_path
from norcal.runtime.postprocess import ImageDetections, paste_masks

GROUP_COLOURS = {"r": (215, 38, 38), "c": (226, 132, 0), "f": (37, 99, 205)}
GROUP_NAMES = {"r": "rare", "c": "common", "f": "frequent"}
UNKNOWN_COLOUR = (110, 110, 110)
HEADER, FOOTER, GAP = 26, 24, 10  # pixels: title band, legend band, space between panels
TARGET_SIDE = 512  # small images are enlarged (integer factor) until their long side reaches this
MASK_ALPHA = 0.35


@dataclass
class DrawOptions:
    """Which detections a panel shows: score >= ``score_thresh``, best first, none with box
    IoU >= ``overlap`` with one shown already, at most ``max_dets``; ``scale`` None: enlarge
    small images by an integer factor (see TARGET_SIDE)."""

    score_thresh: float = 0.1
    max_dets: int = 10
    overlap: float = 0.3
    scale: int | None = None


def image_scale(image_hw: tuple[int, int], scale: int | None = None) -> int:
    """The integer enlargement of an image of size (h, w): ``scale`` or the automatic one."""
    if scale is not None:
        if int(scale) < 1:
            raise NorcalError(f"picture scale must be >= 1, got {scale}")
        return int(scale)
    return max(1, TARGET_SIDE // max(1, max(image_hw)))


def picture_size(image_hw: tuple[int, int], panels: int, scale: int | None = None) -> tuple[int, int]:
    """(width, height) of the PNG :func:`draw_panels` makes: ``panels`` enlarged copies of the
    image in a row, GAP apart, with a title band above and a legend band below."""
    s = image_scale(image_hw, scale)
    h, w = image_hw
    return panels * w * s + (panels - 1) * GAP, HEADER + h * s + FOOTER


def _font(size: int):
    from PIL import ImageFont

    try:
        import matplotlib

        return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" /
                                      "DejaVuSans.ttf"), size)
    except (ImportError, OSError):  # Pillow's own font: Latin only
        return ImageFont.load_default(size=size)


def _overlap(a, b) -> int:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return max(w, 0) * max(h, 0)


def _place(box, tw: int, th: int, taken: list, width: int, height: int):
    """A label rectangle near ``box`` (above, inside the top, below, inside the bottom), the
    first that overlaps no label already placed, else the one overlapping least."""
    x0, y0, x1, y1 = box
    x = min(max(0, x0), max(0, width - tw))
    cands = [y0 - th, y0, y1, y1 - th]
    rects = [(x, y, x + tw, y + th) for y in (min(max(0, c), height - th) for c in cands)]
    cost = [sum(_overlap(r, t) for t in taken) for r in rects]
    return rects[int(np.argmin(cost))]


def shown_indices(det: ImageDetections, opts: DrawOptions) -> np.ndarray:
    """Indices of the detections a panel shows, best score first: one per object (greedy,
    class-agnostic: the model's top-ranked class where several overlap)."""
    scores = np.asarray(det.scores)
    order = np.argsort(-scores, kind="stable")
    order = order[scores[order] >= opts.score_thresh]
    iou = box_iou(det.boxes[order], det.boxes[order])
    keep: list[int] = []
    for k in range(len(order)):
        if len(keep) == opts.max_dets:
            break
        if not keep or iou[k, keep].max() < opts.overlap:
            keep.append(k)
    return order[keep]


def _panel(image_rgb: np.ndarray, det: ImageDetections, names: Sequence[str],
           groups: Sequence[str] | None, opts: DrawOptions, s: int):
    from PIL import Image, ImageDraw

    h, w = image_rgb.shape[:2]
    keep = shown_indices(det, opts)
    colours = [GROUP_COLOURS.get(groups[c], UNKNOWN_COLOUR) if groups is not None else UNKNOWN_COLOUR
               for c in np.asarray(det.classes)[keep]]
    canvas = np.asarray(Image.fromarray(image_rgb).resize((w * s, h * s), Image.NEAREST),
                        dtype=np.float32)
    if det.mask_probs is not None and len(keep):
        masks = paste_masks(det.mask_probs[keep], det.boxes[keep], (h, w), rule=det.mask_paste, protos=det.mask_protos)
        for m, col in zip(masks[::-1], colours[::-1]):  # best detection painted last, on top
            m = np.kron(m, np.ones((s, s), dtype=bool)) if s > 1 else m
            canvas[m] = (1 - MASK_ALPHA) * canvas[m] + MASK_ALPHA * np.asarray(col, np.float32)
    img = Image.fromarray(canvas.round().astype(np.uint8))
    draw = ImageDraw.Draw(img)
    font = _font(12 if s == 1 else 13)
    boxes = [tuple(int(round(v * s)) for v in det.boxes[i]) for i in keep]
    for b, col in zip(boxes[::-1], colours[::-1]):
        draw.rectangle(b, outline=col, width=2)
    taken: list = []
    for i, b, col in zip(keep, boxes, colours):
        c = int(det.classes[i])
        text = f"{names[c] if c < len(names) else c} {float(det.scores[i]):.2f}"
        x0, y0, x1, y1 = draw.textbbox((0, 0), text, font=font)
        rect = _place(b, x1 - x0 + 6, y1 - y0 + 4, taken, w * s, h * s)
        taken.append(rect)
        draw.rectangle(rect, fill=col)
        draw.text((rect[0] + 3 - x0, rect[1] + 2 - y0), text, fill=(255, 255, 255), font=font)
    return img, len(keep)


def draw_panels(image_rgb: np.ndarray, panels: Sequence[tuple[str, ImageDetections]],
                names: Sequence[str], groups: Sequence[str] | None = None,
                options: DrawOptions | None = None, caption: str = ""):
    """A PIL image: one panel per (title, detections) over ``image_rgb`` (uint8 [H, W, 3],
    the original image the detections' coordinates refer to). names / groups: per class
    index, the class name and frequency group ('r', 'c', 'f'; None: all grey); caption:
    a line for the legend band (cut to fit)."""
    from PIL import Image, ImageDraw

    opts = options or DrawOptions()
    if not panels:
        raise NorcalError("nothing to draw: no panels")
    image_rgb = np.asarray(image_rgb)
    if image_rgb.ndim != 3 or image_rgb.shape[2] != 3 or image_rgb.dtype != np.uint8:
        raise NorcalError(f"expected an RGB uint8 [H, W, 3] image, got {image_rgb.dtype} {image_rgb.shape}")
    hw = image_rgb.shape[:2]
    for title, det in panels:
        if tuple(det.image_size) != tuple(hw):
            raise NorcalError(f"{title}: detections are for a {tuple(det.image_size)} image, "
                              f"the picture is {tuple(hw)}")
    s = image_scale(hw, opts.scale)
    width, height = picture_size(hw, len(panels), s)
    out = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(out)
    title_font, legend_font = _font(14), _font(12)
    for k, (title, det) in enumerate(panels):
        x = k * (hw[1] * s + GAP)
        img, n = _panel(image_rgb, det, names, groups, opts, s)
        out.paste(img, (x, HEADER))
        draw.text((x + 2, 5), f"{title}: {n} shown", fill=(0, 0, 0), font=title_font)
    x, y = 4, HEADER + hw[0] * s + 5
    for g in ("r", "c", "f") if groups is not None else ():
        draw.rectangle((x, y + 2, x + 10, y + 12), fill=GROUP_COLOURS[g])
        draw.text((x + 14, y), GROUP_NAMES[g], fill=(0, 0, 0), font=legend_font)
        x += 24 + int(draw.textlength(GROUP_NAMES[g], font=legend_font))
    text = f"best class per object, score >= {opts.score_thresh:g}" + (f"; {caption}" if caption else "")
    while len(text) > 1 and x + 6 + draw.textlength(text, font=legend_font) > width:
        text = text[:-2] + "…"
    draw.text((x + 6, y), text, fill=(80, 80, 80), font=legend_font)
    return out


def save_panels(path: str | os.PathLike, image_rgb: np.ndarray,
                panels: Sequence[tuple[str, ImageDetections]], names: Sequence[str],
                groups: Sequence[str] | None = None, options: DrawOptions | None = None,
                caption: str = "") -> Path:
    """:func:`draw_panels` written as a PNG (atomically); returns the path."""
    img = draw_panels(image_rgb, panels, names, groups, options, caption)
    path = Path(path)
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")
    return path
