"""Which files are the images a run reads: the inputs as given, folders searched for image files
(decoding them is :mod:`norcal.runtime.images`)."""

from __future__ import annotations

import os
from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def expand_inputs(inputs: list[str | os.PathLike]) -> list[Path]:
    """Files as given plus image files (by suffix, sorted) inside given folders, hidden files
    and folders below them left out (as the shell's ``*``: macOS's ``._name.jpg`` files)."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*")
                              # a broken link is listed: its reader then stops or skips it, counted
                              if (f.is_file() or (f.is_symlink() and not f.exists()))
                              and f.suffix.lower() in IMAGE_SUFFIXES
                              and not any(part.startswith(".") for part in f.relative_to(p).parts)))
        elif os.path.lexists(p):
            out.append(readable_file(p))  # a FIFO or device would block or never end
        else:
            raise NorcalError(f"{p}: no such file or folder")
    return out
