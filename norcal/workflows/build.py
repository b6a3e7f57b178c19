"""Engine building with the static TensorRT check first: the check lives in export, the builder in runtime."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from norcal.core.errors import NorcalError
from norcal.core.profiles import Profile
from norcal.export.trt_check import check_model
from norcal.runtime.tensorrt_build import BuildOptions
from norcal.runtime.tensorrt_build import build_engine as _build_engine
from norcal.runtime.tensorrt_build import prepare as _prepare


def prepare(options: BuildOptions, check: bool = True) -> tuple[onnx.ModelProto, dict[str, Profile], str]:
    """Load the model (and, with ``check``, refuse one that fails the TensorRT parser check)."""
    model, profiles, cmd = _prepare(options)
    if check:
        report = check_model(model, profiles, nvidia=False)  # the build parses it itself
        if not report.compatible:
            first = report.errors[0]
            raise NorcalError(f"{options.onnx_path} fails the TensorRT {report.tensorrt_version} check "
                              f"({len(report.errors)} errors; first: {first.node} ({first.op_type}): "
                              f"{first.reason}); run norcal check for all, or pass check=False",
                              param="check=False")
    return model, profiles, cmd


def build_engine(options: BuildOptions, *, check: bool = True, verbose: bool = False,
                 on_message: Callable[[str], None] | None = None) -> dict:
    """Check (unless ``check=False``), build and write the engine and its sidecar; returns the
    sidecar content. Needs TensorRT 10 and a GPU; without them,
    :func:`norcal.runtime.tensorrt_build.trtexec_command` gives the equivalent trtexec line.
    on_message: receives TensorRT's warnings and errors (all messages with ``verbose``)."""
    model, profiles, cmd = prepare(options, check)
    return _build_engine(options, model, profiles, cmd, verbose=verbose, on_message=on_message)
