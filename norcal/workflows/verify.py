"""``norcal-export --verify IMAGES``: ONNX Runtime against the PyTorch model it came from.

Both run the same prepared batches (norcal.workflows.parity) with the same NorCal calibration:
the PyTorch box predictor gets the ``norcal.log_prior`` the surgery wrote into the ONNX file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.workflows.parity import ParityRun


@dataclass
class VerifyResult:
    """What :func:`verify_images` found: the parity run (one comparison, fp32 tolerances),
    the calibration both sides ran with, and whether a failed fp32 check still passed fp16."""

    run: ParityRun
    calibration: str  # e.g. "NorCal gamma 0.5 ..." or "plain scores"
    within_fp16_only: bool = False  # outside fp32 tolerances but within fp16 ones

    @property
    def images(self) -> int:
        return self.run.images


def verify_images(torch_model, onnx_path, image_paths, spec) -> VerifyResult:
    """Run ``onnx_path`` (ONNX Runtime, CPU) and ``torch_model`` on ``image_paths`` (files or
    folders) and return the comparison.

    The calibration is read from the written file itself (what was really baked in).
    Judged with fp32 tolerances; a model that fails even the loose fp16 ones (detections that
    do not pair up, scores off by > 2e-2) raises NorcalError with the numbers.
    """
    from norcal.export.torch_runner import TorchRunner, onnx_calibration
    from norcal.runtime.images import expand_inputs, read_images
    from norcal.runtime.onnxruntime_runner import OnnxRuntimeRunner
    from norcal.workflows.parity import PRESETS, compare, fixed_input_shape, run_parity

    paths = expand_inputs([str(p) for p in image_paths])
    if not paths:
        raise NorcalError("verify: no image files found in " + ", ".join(map(str, image_paths)),
                          param="verify")
    try:
        images = read_images(paths, "verify: ")
    except NorcalError as e:
        raise NorcalError(str(e), param="verify") from None
    ort = OnnxRuntimeRunner(Path(onnx_path), "cpu")
    calibration = onnx_calibration(onnx_path)
    reference = TorchRunner(torch_model, calibration=calibration)
    run = run_parity([reference, ort], images, min_size=spec.min_size_test, max_size=spec.max_size_test,
                     input_format="BGR", divisibility=spec.size_divisibility, batch_size=1,
                     score_thresh=spec.score_thresh_test, fixed_shape=fixed_input_shape(ort))
    report = run.reports[0]
    result = VerifyResult(run, calibration.describe() if calibration else "plain scores")
    if not report.passed:
        loose = compare(run.outputs[reference.name], run.outputs[ort.name], PRESETS["fp16"],
                        reference_name=reference.name, candidate_name=ort.name,
                        score_thresh=spec.score_thresh_test)
        if not loose.passed:
            raise NorcalError("verify: ONNX Runtime and PyTorch disagree beyond even fp16 tolerances: "
                              + "; ".join(loose.failures) + f" (fp32 checks: {'; '.join(report.failures)})",
                              param="verify")
        result.within_fp16_only = True
    return result
