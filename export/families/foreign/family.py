"""The foreign family: an ONNX detector exported by a tool we do not know. Its graph is taken as it
is (the surgery finds its classifier, or the calibration's ``logits`` names it); no checkpoint
file is its."""

from __future__ import annotations

from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.export.families.base import Detector, Family


class ForeignFamily(Family):
    """Claims every ONNX graph (it is tried last) and no checkpoint."""

    name = "foreign"
    reads = ("any other ONNX detector: its box classifier (a Softmax over the last axis, or a Sigmoid fed by "
             "a Gemm/MatMul) is found and replaced by the NorCal node")
    reads_checkpoints = False

    def claims(self, path: Path, config: Path | None) -> bool:
        return False

    def claims_graph(self, model) -> bool:
        return True

    def load(self, path: Path, config: Path | None = None, **options) -> Detector:
        raise NorcalError(f"{path}: a foreign detector is read as an ONNX graph, not a checkpoint")
