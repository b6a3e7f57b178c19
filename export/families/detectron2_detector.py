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
    calibration_source: ClassVar[str | None] = "TEST.CALIBRATION"

    def __init__(self, spec, model):
        self.spec, self.model = spec, model
        self.num_classes = int(spec.num_classes)

    def recorded_calibration(self):
        """The config's TEST.CALIBRATION settings (the NorCal authors' keys), or None."""
        return self.spec.calibration

    def export_options(self, options) -> GraphOptions:
        """GraphOptions from the export job's options; mask_head_rois only where the model has
        something it changes (a mask head, or multi-level box pooling)."""
        from norcal.core.contract import MASK_HEAD_ROIS_VALUES

        check_mask_head_rois(options.mask_head_rois, self.spec)
        return GraphOptions(batch=options.batch, height=options.height, width=options.width, opset=options.opset,
                            mask_head_rois=options.mask_head_rois or MASK_HEAD_ROIS_VALUES[0],
                            check=False)  # the export job checks the calibrated graph

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


def check_mask_head_rois(choice: str | None, spec) -> None:
    """Refuse a mask_head_rois choice the model has nothing to apply to: no mask head, and no
    multi-level box pooler whose form it also sets."""
    from norcal.core.errors import NorcalError
    from norcal.export.spec import FPN_BACKBONE, RETINANET, arch_name

    if choice is None or spec.mask_on:
        return
    if spec.meta_architecture == RETINANET or spec.backbone_name != FPN_BACKBONE:
        raise NorcalError(f"mask_head_rois {choice!r} changes nothing in a {arch_name(spec)} model "
                          "without a mask head (no multi-level ROI pooling either)",
                          param="mask_head_rois")


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
