"""Engine building with the static TensorRT check first: the check lives in export, the builder in runtime."""

from __future__ import annotations

import onnx

from norcal.core.errors import NorcalError
from norcal.core.profiles import Profile
from norcal.export.trt_check import check_model
from norcal.runtime.tensorrt_build import BuildOptions
from norcal.runtime.tensorrt_build import prepare as _prepare


def prepare(options: BuildOptions, check: bool = True) -> tuple[onnx.ModelProto, dict[str, Profile], str]:
    """Load the model (and, with ``check``, refuse one that fails the TensorRT parser check)."""
    model, profiles, cmd = _prepare(options)
    if check:
        report = check_model(model, profiles)
        if not report.compatible:
            first = report.errors[0]
            raise NorcalError(f"{options.onnx_path} fails the TensorRT {report.tensorrt_version} check "
                              f"({len(report.errors)} errors; first: {first.node} ({first.op_type}): "
                              f"{first.reason}); run norcal check for all, or pass --skip-check")
    return model, profiles, cmd
