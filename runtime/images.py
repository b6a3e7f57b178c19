"""Reading images from disk into RGB uint8 arrays, as detectron2's ``read_image`` does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from norcal.core.errors import NorcalError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def read_rgb(path: str | os.PathLike) -> np.ndarray:
    """An image file as RGB uint8 [H,W,3], EXIF orientation applied (detectron2 does too).

    Raises OSError (or ValueError) when the file is missing or not a readable image.
    """
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as im:
            im = ImageOps.exif_transpose(im)
            if im.mode != "RGB":
                im = im.convert("RGB")
            return np.asarray(im).copy()
    except Image.DecompressionBombError as e:  # not an OSError; callers treat it as unreadable
        raise OSError(str(e)) from None


def iter_images(paths: Iterable[str | os.PathLike], context: str = "") -> Iterator[np.ndarray]:
    """read_rgb for each path, one at a time (a long list is never all in memory); an
    unreadable file is a NorcalError naming it (``context`` prefixes it)."""
    for p in paths:
        try:
            yield read_rgb(p)
        except (OSError, ValueError, SyntaxError) as e:
            raise NorcalError(f"{context}{p}: cannot read the image ({e})") from None


def read_images(paths: list[str | os.PathLike], context: str = "") -> list[np.ndarray]:
    """read_rgb for each path; an unreadable file is a NorcalError naming it (``context`` prefixes it)."""
    return list(iter_images(paths, context))


def expand_inputs(inputs: list[str | os.PathLike]) -> list[Path]:
    """Files as given plus image files (by suffix, sorted) inside given folders."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*")
                              if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES))
        elif p.exists():
            out.append(p)
        else:
            raise NorcalError(f"{p}: no such file or folder")
    return out
