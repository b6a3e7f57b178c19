"""What detectron2's R-CNN and RetinaNet detectors share: the spec and model, how the host
prepares images, the export, the PyTorch runner, and the re-scoring's plumbing."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from norcal.export.families.base import Detector

FAMILY = "detectron2"


@dataclass(frozen=True)
class GraphOptions:
    """How :meth:`Detectron2Detector.export` shapes the graph (the options of
    :func:`norcal.export.detector.export_detector`)."""

    batch: int | None = None
    height: int | None = None
    width: int | None = None
    opset: int = 17
    mask_head_rois: str = "valid"
    padding_masks: bool | None = None
    check: bool = True


class Detectron2Detector(Detector):
    """A detectron2 checkpoint as our PyTorch model (``norcal.export.modeling``), with its
    :class:`norcal.export.spec.ModelSpec`."""

    family: ClassVar[str] = FAMILY

    def __init__(self, spec, model):
        self.spec, self.model = spec, model
        self.num_classes = int(spec.num_classes)

    @property
    def preprocessing(self):
        """ResizeShortestEdge to the spec's min/max test size, BGR, zero padding to the size
        divisibility (:class:`norcal.core.contract.InputSpec`, read from the runtime metadata
        the export writes)."""
        from norcal.core.contract import input_spec
        from norcal.export.detector import runtime_metadata

        return input_spec(runtime_metadata(self.spec))

    def export(self, options: GraphOptions | None = None):
        from norcal.export.detector import export_detector

        return export_detector(self.model, self.spec, **asdict(options or GraphOptions()))

    def torch_runner(self, calibration=None, name: str = "pytorch"):
        from norcal.export.detector import runtime_metadata
        from norcal.export.torch_runner import TorchRunner

        return TorchRunner(self.model, name=name, calibration=calibration, metadata=runtime_metadata(self.spec))


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op threads set to ``threads`` within the block (None: left as is). The
    re-scoring is many small ops and a per-class NMS loop: measured on the fixture, 1 thread
    is ~3x faster than 2."""
    import torch

    saved = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(int(threads))
        yield
    finally:
        torch.set_num_threads(saved)


def join_outputs(parts: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Batches of the contract's outputs (numpy or torch) as one, in order."""
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}
