"""Example data shipped with the package: ``d2_synth_trained/`` (see its README.md), the
long-tailed Mask R-CNN, training subset and validation images that ``norcal demo`` runs on.

The package ships the checkpoint, config and ground truth; the images and the training
annotations are drawn again from the dataset's seed (:mod:`norcal.examples.synth`, about 20 s,
once) into the package folder, or into ``$NORCAL_CACHE`` (default ``~/.cache/norcal``) when the
package folder is read-only. Every drawn file is checked against the sha256 in
``d2_synth_trained/generated.json`` before it is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent
NAME = "d2_synth_trained"
SHIPPED = ("README.md", "config.yaml", "model_final.pth", "val.json", "train_subset.json", "golden")
DRAWN = ("val", "train_subset", "train_annotations.json")
STAMP = ".drawn"


class ExampleError(Exception):
    """The example's data cannot be put in place (one line: what and why)."""


def _complete(d: Path, expected: dict) -> bool:
    stamp = d / STAMP
    return (stamp.is_file() and stamp.read_text() == expected["version"]
            and all((d / n).is_file() for n in expected["images"])
            and (d / "train_annotations.json").is_file())


def _cache_root() -> Path:
    return Path(os.environ.get("NORCAL_CACHE") or Path.home() / ".cache" / "norcal")


def example_places() -> list[Path]:
    """Where the example's folder is or will be (the package folder, the cache), without drawing."""
    return [ROOT / NAME, _cache_root() / NAME]


def example_dir(progress: Callable[[int, int], None] | None = None) -> Path:
    """The example's folder with every file the demo reads, drawing the missing ones first
    (``progress(n, total)``: images of the random stream drawn so far)."""
    from norcal.examples import synth

    shipped = ROOT / NAME
    try:
        expected = json.loads((shipped / "generated.json").read_text())
    except (OSError, ValueError) as e:
        raise ExampleError(f"the bundled example is incomplete ({shipped / 'generated.json'}: {e})") from None
    for d in (shipped, _cache_root() / NAME):
        if _complete(d, expected):
            return d
    for d in (shipped, _cache_root() / NAME):
        try:
            d.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".drawing-", dir=d))
        except OSError:
            continue  # a read-only install: the cache
        try:
            for n in DRAWN[:2]:
                (staging / n).mkdir()
            try:
                synth.generate(staging, expected, progress)
            except synth.Mismatch as e:
                raise ExampleError(
                    f"the example's {e} drawn here differs from the one the model was made with "
                    "(another numpy or Pillow draws differently); pass the data folder instead") from None
            if d != shipped:
                for n in SHIPPED:
                    src, dst = shipped / n, d / n
                    if src.is_dir():
                        shutil.copytree(src, dst, dirs_exist_ok=True)
                    elif src.exists():
                        shutil.copyfile(src, dst)
            for n in DRAWN:
                if (d / n).is_dir():
                    shutil.rmtree(d / n)
                os.replace(staging / n, d / n)
            (d / STAMP).write_text(expected["version"])
            return d
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    raise ExampleError(f"cannot write the example's images: neither {shipped} nor {_cache_root() / NAME} is writable "
                       "(set NORCAL_CACHE to a writable folder)")
