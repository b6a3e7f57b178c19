"""The reference's own float noise, measured in the run, and the fp32 tolerances widened to it.

Two correct float32 runs of one model differ by rounding, and how much depends on the model:
a deep network with a box decode through a softmax over distance bins (YOLO's DFL) or six
transformer layers (RT-DETR) amplifies one-ulp differences to 1e-3 in scores and to pixels in
boxes, past the fp32 preset's 1e-4 / 1e-2, though every graph op is right. So where a candidate
fails at the fp32 preset alone, parity runs the reference a second time more precisely (the
family's noise runner: by default its PyTorch model in float64) on the same batches and measures
how far the reference's float32 outputs sit from that: the floor (a candidate within the preset
needs none, and the floor only widens tolerances, so it is not measured then). A float32 candidate's own rounding is of the same order, so it sits within
floor + its own error <= ``FLOOR_FACTOR`` x floor
(:mod:`~norcal.workflows.parity.tolerances`) of the reference (the triangle inequality,
the factor allows for other kernels' rounding: the measurements are in that module); a graph error larger
than that, e.g. a NorCal constant off, still fails.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from norcal.workflows.parity.compare import compare
from norcal.workflows.parity.tolerances import Tolerances


@dataclass(frozen=True)
class NoiseFloor:
    """How far the reference's float32 outputs lie from its precise rerun's (``runner``), over
    the detections the two pair up: the largest score and box-coordinate differences (input
    pixels), and how many pairs they are over."""

    runner: str
    scores: float
    boxes: float
    pairs: int

    def line(self) -> str:
        return (f"reference noise floor ({self.runner}, {self.pairs} paired detections): scores "
                f"{self.scores:.2g}, boxes {self.boxes:.2g} px")


def measure_floor(reference: dict[str, np.ndarray], precise: dict[str, np.ndarray], runner: str,
                  score_thresh: float = 0.0) -> NoiseFloor:
    """The floor between the reference's outputs and its precise rerun's on the same batches,
    paired as parity pairs detections (the fp32 preset's IoU; other outputs are not measured)."""
    precise = {k: np.asarray(v) for k, v in precise.items() if k in reference}
    dets = compare(reference, precise, "fp32", score_thresh=score_thresh).detections
    if dets is None:
        return NoiseFloor(runner, 0.0, 0.0, 0)
    return NoiseFloor(runner, dets.max_score_diff, dets.max_box_diff, dets.matched)


def widened(tol: Tolerances, floor: NoiseFloor | None) -> Tolerances:
    """``tol`` with its score and box tolerances raised to ``tol.floor_factor`` x the floor where
    that is larger (a preset without a floor factor, or no floor: ``tol`` as it is)."""
    if floor is None or not tol.floor_factor:
        return tol
    k = tol.floor_factor
    atol = dict(tol.atol)
    atol["scores"] = max(atol.get("scores", tol.default_atol), k * floor.scores)
    atol["boxes"] = max(atol.get("boxes", tol.default_atol), k * floor.boxes)
    return replace(tol, atol=atol, score_atol=max(tol.score_atol, k * floor.scores))
