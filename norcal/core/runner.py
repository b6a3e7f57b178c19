"""The one interface every backend runner implements, so parity code never knows which it has."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Runner(Protocol):
    """A loaded model that maps named input arrays to named output arrays."""

    name: str  # backend label shown in reports, e.g. "onnxruntime-cpu", "tensorrt-fp16"
    input_names: list[str]
    output_names: list[str]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch: images float32 [B,3,H,W], image_sizes int64 [B,2] -> outputs by name."""
        ...
