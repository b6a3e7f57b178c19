"""Reading images from disk into RGB uint8 arrays, as detectron2's ``read_image`` does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from norcal.core.errors import NorcalError

def read_rgb(path: str | os.PathLike) -> np.ndarray:
    """An image file as RGB uint8 [H,W,3], EXIF orientation applied (detectron2 does too).

    16-bit greyscale keeps its high byte, as OpenCV's imread (Ultralytics' reader) and Pillow's
    own 16-bit RGB decoding do; Pillow's convert("RGB"), which detectron2 calls, clips it at
    255 instead (a white image). 32-bit integer or float pixels, whose range is unknown,
    are refused. Raises OSError (or ValueError) when the file is missing or not a readable
    image.
    """
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as im:
            problem = pixel_problem(im.mode)
            if problem:
                raise ValueError(problem)
            im = ImageOps.exif_transpose(im)
            if im.mode.startswith("I;16"):
                grey = (np.asarray(im) >> 8).astype(np.uint8)
                return np.repeat(grey[..., None], 3, axis=2)
            if im.mode != "RGB":
                im = im.convert("RGB")
            return np.asarray(im).copy()
    except Image.DecompressionBombError as e:  # not an OSError; callers treat it as unreadable
        raise OSError(str(e)) from None


def oriented_size(path: str | os.PathLike) -> tuple[int, int]:
    """(height, width) of the image :func:`read_rgb` gives, from the file's header and EXIF
    orientation, without decoding the pixels."""
    from PIL import Image

    with Image.open(path) as im:
        w, h = im.size
        # a PNG's getexif() decodes the whole image unless its eXIf chunk came before the pixels
        exif = im.getexif() if im.format != "PNG" or "exif" in im.info else {}
        return (w, h) if exif.get(0x0112) in (5, 6, 7, 8) else (h, w)  # turned a quarter


def check_annotated_sizes(paths: Iterable[Path], ids: dict[str, int], sizes: dict[str, tuple[int, int]],
                          annotations: str | os.PathLike) -> None:
    """Refuse an image whose size (after EXIF orientation) is not the (height, width) that
    ``sizes`` (by base name, from the file ``annotations``) gives: its boxes, in the file's
    pixels, would be evaluated against other pixels (detectron2's check_image_size refuses it
    too). ``ids``: base name -> image id, for the message. Unreadable files are left to the
    reader's errors."""
    for p in paths:
        want = sizes.get(Path(p).name)
        if want is None:
            continue
        try:
            have = oriented_size(p)
        except UNREADABLE:
            continue
        if have != want:
            raise NorcalError(f"{p}: the image is {have[1]}x{have[0]} pixels (w x h) but {annotations} gives "
                              f"image {ids[Path(p).name]} as {want[1]}x{want[0]}; its boxes would be in "
                              "other pixels than the annotations' (a resized or rotated copy?)")


def pixel_problem(mode: str) -> str | None:
    """Why pixels of a Pillow ``mode`` cannot be read as 8-bit RGB, or None."""
    if mode in ("I", "F"):
        kind = "32-bit integer" if mode == "I" else "floating-point"
        return f"{kind} pixels (mode {mode}) of unknown range: convert the image to 8 bits"
    return None


UNREADABLE = (OSError, ValueError, SyntaxError)  # what PIL raises for a file that is no image


def reason(e: BaseException) -> str:
    """An image reader's exception as one short line."""
    text = str(e).splitlines()[0] if str(e) else ""
    return text or type(e).__name__


def unreadable_error(path: str | os.PathLike, why: str, rest: Iterable[str | os.PathLike] = (),
                     context: str = "", skippable: bool = True) -> NorcalError:
    """The error for an unreadable image: names it and counts the unreadable ones among ``rest``
    (the files not read yet, by :func:`quick_check`), so one run tells how many files are bad.
    ``skippable``: the caller takes ``skip_unreadable=True`` (the message says so)."""
    rest = list(rest)
    return _error(path, why, sum(quick_check(p) is not None for p in rest), len(rest), context,
                  skippable)


def _error(path, why: str, more: int, rest: int, context: str, skippable: bool) -> NorcalError:
    also = f"; {more} more of the {rest} files after it cannot be read either" if more else ""
    hint = " (skip_unreadable=True skips unreadable files)" if skippable else ""
    return NorcalError(f"{context}{path}: cannot read the image ({why}){also}{hint}",
                       param="skip_unreadable=True")


def quick_check(path: str | os.PathLike, sizes: tuple[int, int] | None = None) -> str | None:
    """Why ``path`` is not a readable image, from its header (and, for PNG, the checksums of
    its chunks) without decoding it; None when it looks readable. For checking a whole input
    list before any work: decoding can still fail later on a damaged JPEG body. ``sizes``:
    see :func:`read_for_model` (the header's size is checked)."""
    from PIL import Image

    from norcal.runtime.preprocess import resize_problem

    try:
        with Image.open(path) as im:
            w, h = im.size
            mode = im.mode
            im.verify()
    except Exception as e:  # noqa: BLE001 - PIL raises many types for damaged files
        return reason(e)
    if pixel_problem(mode):
        return pixel_problem(mode)
    return resize_problem(h, w, *sizes) if sizes else None


def unreadable_files(paths: Iterable[str | os.PathLike], skip: bool = False, context: str = "",
                     skippable: bool = True, sizes: tuple[int, int] | None = None) -> list[tuple[Path, str]]:
    """Quick-check every path (:func:`quick_check`) before any work. An unreadable one is a
    NorcalError naming the first and counting the others; with ``skip`` they are returned as
    (path, reason) for the caller to leave out. ``skippable``: see :func:`unreadable_error`."""
    paths = [Path(p) for p in paths]
    bad = [(p, why) for p in paths if (why := quick_check(p, sizes)) is not None]
    if bad and not skip:
        first, why = bad[0]
        rest = len(paths) - paths.index(first) - 1
        raise _error(first, why, len(bad) - 1, rest, context, skippable)
    return bad


def read_for_model(path: str | os.PathLike, sizes: tuple[int, int] | None = None) -> np.ndarray:
    """read_rgb, and with ``sizes`` (min_size, max_size) a ValueError for an image that would
    resize to under 1 pixel on a side: it cannot be run, as a file that is no image cannot."""
    from norcal.runtime.preprocess import resize_problem

    image = read_rgb(path)
    problem = sizes and resize_problem(image.shape[0], image.shape[1], *sizes)
    if problem:
        raise ValueError(problem)
    return image


def iter_images(paths: Iterable[str | os.PathLike], context: str = "",
                skipped: list[tuple[Path, str]] | None = None,
                skippable: bool = True, sizes: tuple[int, int] | None = None) -> Iterator[np.ndarray]:
    """read_rgb for each path, one at a time (a long list is never all in memory); an
    unreadable file is a NorcalError naming it (``context`` prefixes it) and counting the
    unreadable ones after it, or, when ``skipped`` is a list, appended to it as (path, reason)
    and left out. ``skippable``: see :func:`unreadable_error`; ``sizes``: see
    :func:`read_for_model`."""
    paths = list(paths)
    for i, p in enumerate(paths):
        try:
            yield read_for_model(p, sizes)
        except UNREADABLE as e:
            if skipped is None:
                raise unreadable_error(p, reason(e), paths[i + 1:], context, skippable) from None
            skipped.append((Path(p), reason(e)))


def read_images(paths: list[str | os.PathLike], context: str = "",
                skipped: list[tuple[Path, str]] | None = None,
                skippable: bool = True, sizes: tuple[int, int] | None = None) -> list[np.ndarray]:
    """read_rgb for each path; unreadable files as in :func:`iter_images`."""
    return list(iter_images(paths, context, skipped, skippable, sizes))
