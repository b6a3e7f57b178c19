"""The one interface every backend runner implements, so parity code never knows which it has."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from norcal.core.errors import NorcalError


class Runner(Protocol):
    """A loaded model that maps named input arrays to named output arrays."""

    name: str  # backend label shown in reports, e.g. "onnxruntime-cpu", "tensorrt-fp16"
    input_names: list[str]
    output_names: list[str]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch: images float32 [B,3,H,W], image_sizes int64 [B,2] -> outputs by name."""
        ...


class BaseRunner:
    """What every runner does before its backend runs: ``infer`` refuses feeds that lack one
    of the model's inputs, then hands the model's inputs (only those) to ``infer_impl``."""

    name: str
    input_names: list[str]
    output_names: list[str]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch: images float32 [B,3,H,W], image_sizes int64 [B,2] -> outputs by name."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise NorcalError(self.missing_inputs(missing))
        return self.infer_impl({n: feeds[n] for n in self.input_names})

    def missing_inputs(self, missing: list[str]) -> str:
        """The message refusing a batch without ``missing``."""
        return f"missing inputs {', '.join(missing)}"

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The backend's run of one batch; feeds hold exactly ``input_names``."""
        raise NotImplementedError
