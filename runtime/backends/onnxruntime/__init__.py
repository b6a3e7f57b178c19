"""The ONNX Runtime backend: .onnx models on its CPU, CUDA or TensorRT execution provider
(``runner``: OnnxRuntimeRunner)."""

from __future__ import annotations

from pathlib import Path

from norcal.core.runner import Runner
from norcal.runtime.backends.base import Backend


def _open(path: Path, provider: str | None, threads: int | None) -> Runner:
    from norcal.runtime.backends.onnxruntime.runner import OnnxRuntimeRunner

    return OnnxRuntimeRunner(path, provider or "cpu", threads)


BACKEND = Backend(
    name="onnxruntime", title="ONNX Runtime", suffixes=(".onnx",), expected=".onnx",
    providers=(None, "auto", "cpu", "cuda", "tensorrt"), gpu_providers=("cuda", "tensorrt"),
    cpu_provider="cpu", opener=_open, name_for=lambda provider: f"onnxruntime-{provider or 'cpu'}")
