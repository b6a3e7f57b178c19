"""Batched inference over images: read, prepare, run, map back. Shared by the CLI and tools."""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.runner import Runner
from norcal.core.contract import MASK_PASTE, Preprocessing, drop_empty_masks, input_spec, mask_paste
from norcal.runtime.images import UNREADABLE, read_for_model, reason, unreadable_error
from norcal.runtime.postprocess import ImageDetections, split_outputs
from norcal.runtime.preprocess import Batch, prepare_batch


def runner_metadata(runner: Runner) -> dict[str, str]:
    return dict(getattr(runner, "metadata", None) or {})


def prepare(images_rgb: list[np.ndarray], spec: Preprocessing) -> Batch:
    """One model input batch of these images, prepared per ``spec``."""
    return prepare_batch(images_rgb, spec)


def prepared_batches(images_rgb: Iterable[np.ndarray], spec: Preprocessing,
                     batch_size: int = 1) -> Iterator[Batch]:
    """RGB uint8 [H,W,3] images -> model input batches of ``batch_size`` (the last may be
    shorter), each resized, channel-ordered and padded per ``spec``. Images are taken from the
    iterable as they are needed, so a lazy reader (:func:`norcal.runtime.images.iter_images`)
    keeps one batch in memory. A bad ``batch_size`` is refused before any image is read.
    """
    if batch_size < 1:
        raise NorcalError(f"batch size must be >= 1, got {batch_size}")

    def batches():
        it = iter(images_rgb)
        while chunk := list(islice(it, batch_size)):
            yield prepare(chunk, spec)

    return batches()


def detect(runner: Runner, batch: Batch) -> list[ImageDetections]:
    """Run one prepared batch and split its outputs per image, in original coordinates; masks
    go as the model's metadata says (:data:`norcal.core.contract.MASK_PASTE`), else as the
    batch's resize rule's."""
    meta = runner_metadata(runner)
    paste = mask_paste(meta) if MASK_PASTE in meta else batch.mask_paste
    return split_outputs(runner.infer(batch.feeds()), batch.image_sizes, batch.original_sizes,
                         batch.keep_empty_boxes, paste, batch.clip_boxes, drop_empty_masks(meta))


def run_images(runner: Runner, paths: list[str | os.PathLike], batch_size: int = 1,
               spec: Preprocessing | None = None, failed: list[tuple[Path, str]] | None = None,
               on_done: Callable[[int], None] | None = None, skip_unreadable: bool = True,
               on_image: Callable[[Path, np.ndarray], None] | None = None) -> Iterator[tuple[Path, ImageDetections]]:
    """Yield (path, detections) per readable image, in input order, ``batch_size`` at a time.

    Unreadable files are skipped and appended to ``failed`` as (path, reason), or, with
    ``skip_unreadable=False``, the first is a NorcalError that counts the unreadable rest;
    ``on_done(n)`` is called as n more input files are finished, unreadable ones included
    (progress bars); ``on_image(path, rgb)`` with each image as it was decoded, so a caller
    that needs the pixels again (pictures) keeps them instead of decoding the file twice.
    """
    spec = spec or input_spec(runner_metadata(runner))
    if batch_size < 1:
        raise NorcalError(f"batch size must be >= 1, got {batch_size}")
    pending: list[tuple[Path, np.ndarray]] = []

    def flush():
        dets = detect(runner, prepare([a for _, a in pending], spec))
        done = [(p, d) for (p, _), d in zip(pending, dets)]
        pending.clear()
        if on_done:
            on_done(len(done))
        return done

    paths = list(paths)
    for i, raw in enumerate(paths):
        path = Path(raw)
        try:
            image = read_for_model(path, (spec.min_size, spec.max_size))
        except UNREADABLE as e:
            if not skip_unreadable:
                raise unreadable_error(path, reason(e), paths[i + 1:]) from None
            if failed is not None:
                failed.append((path, reason(e)))
            if on_done:
                on_done(1)
            continue
        if on_image:
            on_image(path, image)
        pending.append((path, image))
        if len(pending) == batch_size:
            yield from flush()
    if pending:
        yield from flush()
