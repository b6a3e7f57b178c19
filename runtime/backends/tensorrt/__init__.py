"""The TensorRT backend: serialized engines (``runner``: TensorRTRunner; engines are built by
:mod:`norcal.runtime.tensorrt_build`). TensorRT is imported only when an engine is opened."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.core.runner import Runner
from norcal.runtime.backends.base import Backend

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
PROVIDERS = (None, "auto", "tensorrt")


def unavailable() -> str | None:
    """Why TensorRT cannot run here (no Python package, no torch, no CUDA GPU), or None."""
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT's Python package is not installed"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU is visible"


def _open(path: Path, provider: str | None, threads: int | None) -> Runner:
    if provider not in PROVIDERS:
        raise NorcalError(f"{path.name} is a TensorRT engine; provider {provider} applies to .onnx models",
                          param="provider")
    try:
        from norcal.runtime.backends.tensorrt.runner import TensorRTRunner
    except ImportError as e:
        raise NorcalError(f"cannot run {path.name}: the TensorRT runner is unavailable ({e})") from None
    return TensorRTRunner(path)


# fp32 engines are judged as tf32: TensorRT's default on Ampere and later
BACKEND = Backend(
    name="tensorrt", title="TensorRT", suffixes=ENGINE_SUFFIXES,
    expected=f"a TensorRT engine ({', '.join(ENGINE_SUFFIXES)})", providers=PROVIDERS,
    gpu_providers=(), cpu_provider=None, opener=_open, file_noun="engine", parity_precision="tf32",
    unavailable=unavailable)
