"""The export job end to end: load, export (checkpoints), calibrate, check, write.

    from norcal import CheckpointExport, NorCal, export_checkpoint
    result = export_checkpoint("model_final.pth", "model.norcal.onnx", NorCal(gamma=0.6),
                               CheckpointExport(config="config.yaml"))
    result.output, result.tensorrt.compatible, result.norcal["norcal.gamma"]

Results are data (:class:`ExportResult`); showing them is the caller's (``norcal export``
prints a summary table).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import onnx


from norcal.core.errors import NorcalError
from norcal.core.ranges import MAX_EXPORT_BATCH, MAX_EXPORT_SIDE, MAX_TENSOR_VOLUME, MAX_TOPK, check_range
from norcal.core.files.onnx_io import PROTOBUF_LIMIT, load_onnx, save_onnx
from norcal.core.files.outputs import check_apart, check_output_dir, check_output_file, current_path, output_run
from norcal.core.calibration.spec import Calibration
from norcal.core.calibration.classifier_option import ClassifierActivation
from norcal.core.decoding import Decoding
from norcal.export.graph.calibrate import calibrate_graph
from norcal.export.graph.surgery import has_norcal, norcal_metadata, strip_norcal
from norcal.export.pytorch.onnx_trace import MIN_OPSET, max_opset

if TYPE_CHECKING:
    from norcal.export.families import Classifier, Detector
    from norcal.export.trt_check import Report
    from norcal.workflows.verify import VerifyResult

PathLike = str | os.PathLike


# The calibration to bake in (gamma, table, variant, ...): one type from the CLI to the node,
# resolved once (a ResolvedCalibration) before the surgery; see norcal.core.calibration.spec.
NorCal = Calibration


@dataclass(frozen=True)
class CheckpointExport:
    """How a checkpoint becomes a graph: its config (detectron2 only; None: inferred from the
    weights with detectron2's LVIS test settings), fixed batch / padded height / width (None:
    dynamic; an Ultralytics model takes a square height = width, default its trained imgsz),
    the ONNX opset, K = detections per image (None: the config's TEST.DETECTIONS_PER_IMAGE, or
    the family's default) and, for detectron2, which ROIs the mask head runs on ("valid": the
    detections only; "static": all K slots, no data-dependent shapes, and every proposal pooled
    at every FPN level; None: valid). A model with no ROI pooling it could change (RetinaNet;
    a box-only C4/DC5; another family) refuses it. decoding: how scores become detections
    (:class:`norcal.core.decoding.Decoding`; None: the family's own), refused by a family that
    takes none. classifier: "softmax" or "sigmoid", the box head's activation where the weights
    cannot tell it (a detectron2 R-CNN without its config: refused without it;
    :mod:`norcal.core.calibration.classifier_option`), refused where the config, the weights or the family
    fix it otherwise."""

    config: PathLike | None = None
    batch: int | None = None
    height: int | None = None
    width: int | None = None
    opset: int = MIN_OPSET
    detections_per_image: int | None = None
    mask_head_rois: str | None = None
    decoding: Decoding | None = None
    classifier: ClassifierActivation | None = None


@dataclass
class ExportResult:
    """What an export wrote and found."""

    source: Path
    output: Path
    model: onnx.ModelProto
    seconds: float
    tensorrt: Report  # the static TensorRT ONNX-parser check, default profile
    # checkpoint exports: the loaded detector's (label, value) rows (Detector.describe)
    description: tuple[tuple[str, str], ...] = ()
    verification: VerifyResult | None = None  # checkpoint exports with ``verify`` images
    triton_dir: Path | None = None  # the Triton model folder, when one was written
    calibration_from_config: str = ""  # the config's NorCal settings, when they were used
    ingest: str = ""  # ONNX input from another tool (Ultralytics): what was done to it, one line

    @property
    def norcal(self) -> dict[str, str]:
        """The ``norcal.*`` metadata of the written model ({} when it has no NorCal node)."""
        return norcal_metadata(self.model) if has_norcal(self.model) else {}

    @property
    def placement(self) -> list[str]:
        """The tensor(s) the NorCal node reads, each with its class axis when that is not the
        last, e.g. "logits (class axis 1 of [batch, 80, anchors])"."""
        from norcal.core.contract import CLASS_AXIS, LOGITS, split_names
        from norcal.export.graph.surgery import placement

        meta = self.norcal
        return placement(self.model) if CLASS_AXIS in meta else split_names(meta.get(LOGITS))


def calibrate_onnx(model: onnx.ModelProto | PathLike, calibration: NorCal) -> onnx.ModelProto:
    """A copy of ``model`` (or of the ONNX file it names) with its box classifier replaced by
    the NorCal node (a model that already has one gets the new calibration)."""
    if not isinstance(model, onnx.ModelProto):
        model = load_onnx(model)
    return calibrate_graph(model, calibration)


def _finish(model: onnx.ModelProto, out: Path) -> Report:
    """Check, write, and return the TensorRT-parser report."""
    from norcal.export.trt_check import check_model

    if model.ByteSize() < PROTOBUF_LIMIT:  # larger models are checked by path when loaded again
        try:
            onnx.checker.check_model(model, full_check=True)
        except onnx.checker.ValidationError as e:  # a bug of ours, not the user's: keep the trace
            raise RuntimeError(f"the calibrated model fails the ONNX checker: {e}") from e
    save_onnx(model, out)
    return check_model(model)


def triton_name(output: Path) -> str:
    """The Triton model name for an exported file: its name up to the first dot."""
    return Path(output).name.split(".")[0]


def _check_outputs(out: Path, triton_repo: PathLike | None, force: bool, inputs=()) -> None:
    """Refuse an unwritable output, one that would replace or hold an input, or an existing
    Triton model folder before any work is done."""
    check_apart(inputs, files={"out": out}, folders={"triton_repo": triton_repo})
    check_output_file(out, "output")
    if triton_repo is not None:
        from norcal.runtime.triton import check_target

        check_output_dir(triton_repo, "Triton repository")
        check_target(triton_repo, triton_name(out), force)


def _write_triton(result: ExportResult, triton_repo: PathLike | None, force: bool) -> None:
    if triton_repo is not None:
        from norcal.runtime.triton import write_triton_repo

        result.triton_dir = write_triton_repo(result.output, triton_repo, triton_name(result.output),
                                              force=force)


def export_onnx_file(src: PathLike, out: PathLike, norcal: NorCal | None = None, *,
                     strip: bool = False, triton_repo: PathLike | None = None,
                     force: bool = False, decoding: Decoding | None = None) -> ExportResult:
    """ONNX in, ONNX out: surgery only. ``norcal``: the calibration to bake in; ``strip=True``
    instead removes NorCal. ``triton_repo``: also write a Triton model repository there
    (``force``: replace an existing model folder). ``decoding``: the post-processing a converted
    graph gets (Ultralytics' ONNX exports: as a checkpoint's export takes it); refused for a graph
    kept as it is.

    A graph a detector family claims as its own export (Ultralytics': detect / segment, with or
    without its NMS; RT-DETR) is first converted to our output contract by that family
    (:meth:`norcal.export.families.Family.ingest_graph`) and NorCal goes on its class logits,
    unless ``norcal.logits`` names a tensor: then the node goes there in place and the outputs
    stay the tool's. ``result.ingest`` says which happened."""
    if strip and norcal is not None:
        raise NorcalError("strip=True removes NorCal; it takes no norcal", param="strip=True")
    if not strip and norcal is None:
        raise NorcalError("norcal (the calibration to bake in) is required, or strip=True",
                          param="strip=True")
    if strip and decoding is not None:
        raise NorcalError("strip=True removes NorCal; it takes no decoding", param="decoding")
    src, out = Path(src), Path(out)
    _check_outputs(out, triton_repo, force, [src])
    t0 = time.perf_counter()
    model = load_onnx(src)
    ingest = ""
    if not strip:
        model, ingest = _ingest_foreign(model, src, norcal, decoding)
    model = strip_norcal(model) if strip else calibrate_onnx(model, norcal)
    with output_run():  # the model and the Triton folder land together, or neither
        report = _finish(model, out)
        result = ExportResult(src, out, model, time.perf_counter() - t0, report, ingest=ingest)
        _write_triton(result, triton_repo, force)
    return result


def _ingest_foreign(model: onnx.ModelProto, src: Path, norcal: NorCal,
                    decoding: Decoding | None = None) -> tuple[onnx.ModelProto, str]:
    """The graph as its family makes it ours (an Ultralytics export converted to our contract,
    unless the caller named the logits; another tool's graph unchanged), and a line saying what
    was done ("" for nothing)."""
    from norcal.export.families import graph_family

    return graph_family(model).ingest_graph(model, src, norcal, decoding)


def _calibration_for(calibration: NorCal, detector: Detector) -> tuple[NorCal, str]:
    """``calibration`` with its gamma (and variant) from the settings the checkpoint's config records
    (detectron2's TEST.CALIBRATION keys) when the caller gave none, and a line saying so."""
    if calibration.gamma is not None:
        return calibration, ""
    cal = detector.recorded_calibration()
    if cal is None:
        source = detector.calibration_source
        raise NorcalError(f"gamma is required (0 gives the plain {detector.classifier.activation})"
                          + (f": the config sets no {source}" if source else ""), param="gamma")
    chosen = replace(calibration, gamma=cal.gamma, factor=cal.factor, mechanism=cal.mechanism,
                     renormalize=cal.renormalize)  # the user's table and options stay
    return chosen, (f"gamma {cal.gamma:g}, factor {cal.factor}, mechanism {cal.mechanism}, "
                    f"renormalize {str(cal.renormalize).lower()}")


def _check_classifier_options(calibration: NorCal, classifier: Classifier) -> str:
    """The background slot and scale against the checkpoint's classifier (its family says
    where the background is: detectron2's R-CNN heads put it last, RetinaNet has none).
    Returns the classifier's slot."""
    from norcal.export.graph.calibrate import check_background, check_background_scale

    if calibration.background is not None:
        check_background(calibration.background, classifier.background)
    check_background_scale(calibration.background_scale, classifier.activation, classifier.background)
    return classifier.background


def _check_input_shape(options: CheckpointExport) -> None:
    """A fixed batch / height / width within bounds before the trace allocates an input of that
    shape (10^8 images ended in torch's allocation traceback)."""
    for name, hi in (("batch", MAX_EXPORT_BATCH), ("height", MAX_EXPORT_SIDE), ("width", MAX_EXPORT_SIDE)):
        value = getattr(options, name)
        if value is not None:
            check_range(name, value, 1, hi, integer=True)
    b, h, w = options.batch or 1, options.height or 1, options.width or 1
    if b * 3 * h * w > MAX_TENSOR_VOLUME:
        raise NorcalError(f"a fixed input of {b}x3x{h}x{w} = {b * 3 * h * w} values exceeds TensorRT's "
                          f"{MAX_TENSOR_VOLUME} per tensor", param=("batch", "height", "width"))


def _check_graph_options(options: CheckpointExport) -> None:
    """The opset, a fixed input shape and K on their own, before any file is read."""
    # every family's graph needs MIN_OPSET; torch writes none newer than max_opset
    check_range("opset", options.opset, MIN_OPSET, max_opset(), integer=True,
                why="what the graphs need and torch's exporter writes")
    _check_input_shape(options)
    k = options.detections_per_image
    if k is not None:
        check_range("detections_per_image", k, 1, MAX_TOPK, integer=True, why="TensorRT's TopK limit")


def _claimed_checkpoint(src: Path, cfg: Path | None, options: CheckpointExport):
    """(the resolved checkpoint, None), or (None, the error) for a file no family claims: that
    refusal waits until after the output checks, as any bad input's. The claiming family's
    option checks run now, before the slow load."""
    from norcal.export.families import check_classifier_option, check_decoding, resolve

    try:
        checkpoint, unclaimed = resolve(src, cfg), None
    except NorcalError as e:
        checkpoint, unclaimed = None, e
    if checkpoint is not None:
        checkpoint.family.check_export_options(options)
        if options.decoding is not None:
            check_decoding(checkpoint.family, options.decoding)
        check_classifier_option(checkpoint.family, options.classifier)
    return checkpoint, unclaimed


def _detector_calibration(calibration: NorCal, detector: Detector) -> tuple[NorCal, str]:
    """The calibration to bake into ``detector``'s graph, resolved (its table loaded once and
    refused now if it does not fit), and the line saying what came from the config."""
    slot = _check_classifier_options(calibration, detector.classifier)  # before the slow export, not after it
    calibration, from_config = _calibration_for(replace(calibration, background=slot), detector)
    return calibration.resolve(detector.num_classes), from_config


def _write_checkpoint_export(src: Path, out: Path, graph: onnx.ModelProto, detector: Detector, t0: float,
                             from_config: str, verify: Sequence[PathLike], skip_unreadable: bool,
                             triton_repo: PathLike | None, force: bool, step: Callable[[str], None]) -> ExportResult:
    """Check and write the calibrated graph, verify it, write the Triton folder: all, or nothing
    written."""
    with output_run():
        step("checking and writing")
        report = _finish(graph, out)
        result = ExportResult(src, out, graph, time.perf_counter() - t0, report, description=tuple(detector.describe()),
                              calibration_from_config=from_config)
        if verify:
            from norcal.workflows.verify import verify_detector

            step("verifying")
            result.verification = verify_detector(detector, current_path(out), list(verify), skip_unreadable)
        _write_triton(result, triton_repo, force)
    return result


def export_checkpoint(src: PathLike, out: PathLike, calibration: NorCal,
                      options: CheckpointExport = CheckpointExport(), *,
                      verify: Sequence[PathLike] = (), triton_repo: PathLike | None = None,
                      force: bool = False, progress: Callable[[str], None] | None = None,
                      skip_unreadable: bool = False) -> ExportResult:
    """A checkpoint of a supported detector family (detectron2 .pth/.pkl, Ultralytics .pt;
    :mod:`norcal.export.families`) -> batched ONNX with NorCal.

    What differs between families goes through the family and its Detector: which options it
    takes (:meth:`~norcal.export.families.Family.check_export_options`,
    :meth:`~norcal.export.families.Detector.export_options`), a gamma its config records
    (:meth:`~norcal.export.families.Detector.recorded_calibration`), the classifier, the graph.
    verify: images (files or folders) to run ONNX Runtime against the PyTorch model on; the
    result is ``result.verification``; an unreadable image is an error before the export, or
    with ``skip_unreadable`` left out of the comparison. A table for another class count than
    the checkpoint's is refused right after loading it. progress: called with the name of each
    step as it starts ("loading checkpoint", "exporting to ONNX", "inserting the NorCal node",
    "checking and writing", "verifying").
    """
    step = progress or (lambda _name: None)
    if calibration.logits:
        raise NorcalError("logits applies to ONNX input; a checkpoint export knows its classifier",
                          param="logits")
    src, out = Path(src), Path(out)
    cfg = None if options.config is None else Path(options.config)
    _check_graph_options(options)
    checkpoint, unclaimed = _claimed_checkpoint(src, cfg, options)
    _check_outputs(out, triton_repo, force, [src, options.config, *verify])
    if verify:  # bad images fail now, not after the export
        from norcal.workflows.verify import check_images

        check_images(verify, skip_unreadable)
    t0 = time.perf_counter()
    step("loading checkpoint")
    if unclaimed is not None:
        raise unclaimed
    detector = checkpoint.load(options.decoding, options.classifier,
                               detections_per_image=options.detections_per_image)
    graph_options = detector.export_options(options)
    calibration, from_config = _detector_calibration(calibration, detector)
    step("exporting to ONNX")
    graph = detector.export(graph_options)
    step("inserting the NorCal node")
    graph = calibrate_onnx(graph, calibration)
    return _write_checkpoint_export(src, out, graph, detector, t0, from_config, verify, skip_unreadable,
                                    triton_repo, force, step)
