"""The TensorRT backend: serialized engines of TensorRT 10/11 or TensorRT for RTX (``runner``:
TensorRTRunner, which loads the library the engine's sidecar names; engines are built by
:mod:`norcal.runtime.tensorrt_build`). The library is imported only when an engine is opened."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.core.runner import Runner
from norcal.runtime.backends.base import Backend

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
PROVIDERS = (None, "auto", "tensorrt")


def unavailable() -> str | None:
    """Why no engine can run here (neither library's Python package, no torch, no CUDA GPU), or
    None. Which library an engine needs, and whether this GPU runs it, the runner says."""
    from norcal.core.tensorrt_targets import LIBRARIES

    if not any(importlib.util.find_spec(lib.module) is not None for lib in LIBRARIES.values()):
        return "neither " + " nor ".join(f"{lib.title}'s" for lib in LIBRARIES.values()) + " Python package is installed"
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
