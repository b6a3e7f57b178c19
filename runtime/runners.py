"""``open_runner``: the right backend for a model file."""

from __future__ import annotations

import os
from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.core.runner import Runner

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


def open_runner(path: str | os.PathLike, provider: str | None = None, threads: int | None = None) -> Runner:
    """.onnx -> OnnxRuntimeRunner(provider or 'cpu', threads); .engine/.plan -> TensorRTRunner
    (provider None, 'auto' or 'tensorrt').

    threads: ONNX Runtime's intra-op threads (None: its default, one per core)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".onnx":
        from norcal.runtime.onnxruntime_runner import OnnxRuntimeRunner

        return OnnxRuntimeRunner(p, provider or "cpu", threads)
    if suffix in ENGINE_SUFFIXES:
        if provider not in (None, "auto", "tensorrt"):
            raise NorcalError(f"{p.name} is a TensorRT engine; provider {provider} applies to .onnx models",
                              param="provider")
        try:
            from norcal.runtime.tensorrt_runner import TensorRTRunner
        except ImportError as e:
            raise NorcalError(f"cannot run {p.name}: the TensorRT runner is unavailable ({e})") from None
        return TensorRTRunner(p)
    from norcal.core.onnx_io import not_onnx_checkpoint

    foreign = not_onnx_checkpoint(p) if p.is_file() else None
    if foreign is not None:
        raise foreign
    raise NorcalError(f"{p}: unknown model type {suffix or '(no suffix)'!r}; "
                      f"expected .onnx or a TensorRT engine ({', '.join(ENGINE_SUFFIXES)})")
