"""``norcal-export --verify IMAGES``: ONNX Runtime against the PyTorch model it came from.

Both run the same prepared batches (norcal.workflows.parity) with the same NorCal calibration:
the PyTorch box predictor gets the ``norcal.log_prior`` the surgery wrote into the ONNX file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.workflows.parity import ParityRun


@dataclass
class VerifyResult:
    """What :func:`verify_detector` found: the parity run (one comparison, fp32 tolerances),
    the calibration both sides ran with, and whether a failed fp32 check still passed fp16."""

    run: ParityRun
    calibration: str  # e.g. "NorCal gamma 0.5 ..." or "plain scores"
    within_fp16_only: bool = False  # outside fp32 tolerances but within fp16 ones
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # unreadable files left out

    @property
    def images(self) -> int:
        return self.run.images


def check_images(image_paths, skip_unreadable: bool = False) -> tuple[list, list]:
    """The readable images among ``image_paths`` (files or folders), read; an unreadable one is
    a NorcalError unless ``skip_unreadable`` (then see the returned skipped list), and so is
    finding none. Returns (images, skipped: [(path, reason)])."""
    from norcal.runtime.image_files import expand_inputs
    from norcal.runtime.images import read_images

    paths = expand_inputs([str(p) for p in image_paths])
    if not paths:
        raise NorcalError("verify: no image files found in " + ", ".join(map(str, image_paths)),
                          param="verify")
    skipped: list = []
    try:
        images = read_images(paths, "verify: ", skipped if skip_unreadable else None)
    except NorcalError as e:
        raise NorcalError(str(e), param=("verify", *e.params)) from None
    if not images:
        raise NorcalError(f"verify: none of the {len(paths)} image files could be read, e.g. "
                          f"{skipped[0][0]}: {skipped[0][1]}", param="verify")
    return images, skipped


def verify_detector(detector, onnx_path, image_paths, skip_unreadable: bool = False) -> VerifyResult:
    """Run ``onnx_path`` (ONNX Runtime, CPU) and a loaded detector of any family
    (:class:`norcal.export.families.Detector`: its PyTorch runner) on ``image_paths`` (files or
    folders), images prepared per the detector's preprocessing, score threshold as the file
    records it, and return the comparison. An unreadable image is an error, or with
    ``skip_unreadable`` left out (``result.skipped``); no readable image at all is an error.

    The calibration is read from the written file itself (what was really baked in).
    Judged with fp32 tolerances; a model that fails even the loose fp16 ones (detections that
    do not pair up, scores off by > 2e-2) raises NorcalError with the numbers."""
    from norcal.runtime.backends import ONNXRUNTIME
    from norcal.workflows.parity import model_score_thresh

    thresh = model_score_thresh(ONNXRUNTIME.open(onnx_path, "cpu").metadata)
    return _verify(lambda cal: detector.torch_runner(cal), onnx_path, image_paths, detector.preprocessing, thresh,
                   skip_unreadable)


def _verify(make_reference, onnx_path, image_paths, spec, score_thresh: float,
            skip_unreadable: bool) -> VerifyResult:
    from norcal.export.pytorch.runner import onnx_calibration
    from norcal.runtime.backends import ONNXRUNTIME
    from norcal.workflows.parity import PRESETS, compare, fixed_input_shape, run_parity

    images, skipped = check_images(image_paths, skip_unreadable)
    ort = ONNXRUNTIME.open(onnx_path, "cpu")
    calibration = onnx_calibration(onnx_path)
    reference = make_reference(calibration)
    run = run_parity([reference, ort], images, spec=spec, batch_size=1, score_thresh=score_thresh,
                     fixed_shape=fixed_input_shape(ort))
    report = run.reports[0]
    result = VerifyResult(run, calibration.describe() if calibration else "plain scores",
                          skipped=skipped)
    if not report.passed:
        loose = compare(run.outputs[reference.name], run.outputs[ort.name], PRESETS["fp16"],
                        reference_name=reference.name, candidate_name=ort.name,
                        score_thresh=score_thresh)
        if not loose.passed:
            raise NorcalError("verify: ONNX Runtime and PyTorch disagree beyond even fp16 tolerances: "
                              + "; ".join(loose.failures) + f" (fp32 checks: {'; '.join(report.failures)})",
                              param="verify")
        result.within_fp16_only = True
    return result
