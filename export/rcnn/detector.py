"""What the R-CNN and RetinaNet detectors of every family built on our R-CNN (detectron2,
torchvision) share: the spec and model, how the host prepares images, the export, the PyTorch
runner. The family that reads the checkpoint subclasses them and names itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from norcal.core.errors import NorcalError
from norcal.export.families.base import Detector
from norcal.export.pytorch.onnx_trace import MIN_OPSET

@dataclass(frozen=True)
class GraphOptions:
    """How :meth:`SpecDetector.export` shapes the graph (the options of
    :func:`norcal.export.rcnn.export.export_detector`)."""

    batch: int | None = None
    height: int | None = None
    width: int | None = None
    opset: int = MIN_OPSET
    mask_head_rois: str = "valid"
    padding_masks: bool | None = None
    check: bool = True


class SpecDetector(Detector):
    """A model built from a :class:`norcal.export.rcnn.spec.ModelSpec` as our PyTorch model
    (``norcal.export.rcnn.modeling``); the family's subclass sets ``family`` and, where its
    config can record NorCal settings, ``calibration_source``."""

    host_nms = False  # the graph ends at the candidates, the NMS left to the host (RetinaNet only)

    def __init__(self, spec, model):
        self.spec, self.model = spec, model
        self.num_classes = int(spec.num_classes)

    def with_nms(self, decoding) -> "SpecDetector":
        """This detector with the NMS where ``decoding`` (Decoding or None) puts it; an R-CNN's
        stays in the graph: its RPN's NMS and RoiAlign come before the classifier."""
        if decoding is not None and decoding.host_nms:
            raise NorcalError(f"an R-CNN's NMS (the RPN's, before RoiAlign and the box head) stays in the graph: "
                              "nms='host' applies to RetinaNet and YOLO", param="nms")
        return self

    def describe(self) -> list[tuple[str, str]]:
        """The architecture, the test settings (resize, ViT square padding, score threshold, NMS
        IoU, detections per image), and where the spec's values came from (what a config-less
        export had to assume), one "(key)" row each."""
        from norcal.export.rcnn.spec import architecture_label

        s = self.spec
        square = f", padded to the {s.vit.square_pad} square" if s.vit is not None else ""
        rows = [("architecture", f"{s.meta_architecture} {architecture_label(s)}, {s.num_classes} classes, "
                                 f"{'mask' if s.mask_on else 'box'} head"),
                ("test settings", f"short edge {s.min_size_test}, max {s.max_size_test}{square}, score > "
                                  f"{s.score_thresh_test:g}, NMS {s.nms_thresh_test}, "
                                  f"{s.detections_per_image} detections")]
        return rows + [(f"({key})", value) for key, value in s.provenance.items() if key != "weights"]

    def recorded_calibration(self):
        """The NorCal settings the spec's source recorded (``ModelSpec.calibration``), or None."""
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
        divisibility (:class:`norcal.core.contract.Preprocessing`, read from the runtime metadata
        the export writes)."""
        from norcal.core.contract import input_spec
        from norcal.export.rcnn.export import runtime_metadata

        return input_spec(runtime_metadata(self.spec))

    def export(self, options: GraphOptions | None = None):
        from norcal.export.rcnn.export import export_detector

        return export_detector(self.model, self.spec, host_nms=self.host_nms, **asdict(options or GraphOptions()))

    def torch_runner(self, calibration=None, name: str = "pytorch"):
        from norcal.export.rcnn.export import runtime_metadata
        from norcal.export.pytorch.runner import TorchRunner

        return TorchRunner(self.model, name=name, calibration=calibration, metadata=runtime_metadata(self.spec))


def check_graph_options(options) -> None:
    """Refuse, before anything is loaded, a mask_head_rois value the R-CNN graph does not know
    (the export job's options; what the loaded model can apply is :func:`check_mask_head_rois`'s)."""
    from norcal.core.contract import MASK_HEAD_ROIS_VALUES
    from norcal.core.errors import NorcalError

    rois = getattr(options, "mask_head_rois", None)
    if rois is not None and rois not in MASK_HEAD_ROIS_VALUES:
        raise NorcalError(f"mask_head_rois must be one of {', '.join(MASK_HEAD_ROIS_VALUES)}, got "
                          f"{rois!r}", param="mask_head_rois")


def check_mask_head_rois(choice: str | None, spec) -> None:
    """Refuse a mask_head_rois choice the model has nothing to apply to: no mask head, and no
    multi-level box pooler whose form it also sets."""
    from norcal.core.errors import NorcalError
    from norcal.export.rcnn.spec import FPN_BACKBONE, RETINANET, arch_name

    if choice is None or spec.mask_on:
        return
    if spec.meta_architecture == RETINANET or spec.backbone_name != FPN_BACKBONE:
        raise NorcalError(f"mask_head_rois {choice!r} changes nothing in a {arch_name(spec)} model "
                          "without a mask head (no multi-level ROI pooling either)",
                          param="mask_head_rois")
