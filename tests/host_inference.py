"""Tests' shortcut through the product's host path: images already in memory, run batched."""

from __future__ import annotations

import numpy as np

from norcal.core.contract import input_spec
from norcal.runtime.inference import detect, prepared_batches, runner_metadata


def run_arrays(runner, images_rgb: list[np.ndarray], batch_size: int = 1, spec=None) -> list:
    """RGB uint8 [H,W,3] images -> one ImageDetections each (original coordinates), prepared and
    run as ``norcal infer`` runs files (:func:`norcal.runtime.inference.run_images`)."""
    spec = spec or input_spec(runner_metadata(runner))
    return [d for batch in prepared_batches(images_rgb, spec, batch_size) for d in detect(runner, batch)]
