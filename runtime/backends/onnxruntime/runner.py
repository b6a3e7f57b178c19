"""ONNX Runtime runner (CPU, CUDA or TensorRT execution provider) behind the Runner interface."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file
from norcal.core.ranges import MAX_THREADS, check_range
from norcal.runtime.backends.base import BackendRunner

PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}

AUTO = "auto"


def choose_provider(requested: str, available: Sequence[str]) -> str:
    """``requested``, with 'auto' resolved: 'cuda' where ONNX Runtime has its CUDA provider
    (an onnxruntime-gpu install), else 'cpu'. The TensorRT provider is never chosen for the
    user: it builds an engine whenever a session starts."""
    if requested != AUTO:
        return requested
    return "cuda" if PROVIDERS["cuda"][0] in available else "cpu"


class OnnxRuntimeRunner(BackendRunner):
    """An ONNX model in an ``onnxruntime.InferenceSession``.

    provider: 'cpu', 'cuda' or 'tensorrt' (ONNX Runtime's execution provider, with the usual
    fallbacks for nodes it cannot take), or 'auto' (:func:`choose_provider`). ``name`` says the
    provider the session runs on. ``metadata`` holds the model's metadata_props.
    """

    def __init__(self, path: str | os.PathLike, provider: str = "cpu", threads: int | None = None):
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            if os.path.lexists(path):
                readable_file(path)  # says what it is: a folder, a FIFO, a device, a link loop
            raise NorcalError(f"{path}: no such model file")
        available = ort.get_available_providers()
        provider = choose_provider(provider, available)
        if provider not in PROVIDERS:
            raise NorcalError(f"unknown provider {provider!r}; choose one of {', '.join([*PROVIDERS, AUTO])}")
        wanted = PROVIDERS[provider][0]
        if wanted not in available:
            usable = [k for k, v in PROVIDERS.items() if v[0] in available]
            raise NorcalError(f"provider {provider!r} ({wanted}) is not available in this onnxruntime "
                              f"build; available: {', '.join(usable)}")
        if threads is not None:
            check_range("threads", threads, 0, MAX_THREADS, integer=True)
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = int(threads)
        try:
            self.session = ort.InferenceSession(str(path), sess_options=opts,
                                                providers=[p for p in PROVIDERS[provider] if p in available])
        except Exception as e:  # onnxruntime raises its own exception types for a bad file
            raise NorcalError(f"{path}: ONNX Runtime cannot load the model ({str(e).splitlines()[0]})") from None
        self.path = path
        # ONNX Runtime falls back to CPU (with a warning) where CUDA cannot start: say what runs
        ran = self.session.get_providers()[0]
        self.name = "onnxruntime-" + next((k for k, v in PROVIDERS.items() if v[0] == ran), provider)
        self.input_names = [i.name for i in self.session.get_inputs()]
        # the dims the graph fixes (an int; a named or unknown dim is None), as TensorRT's profile check
        self.input_dims = {i.name: [d if isinstance(d, int) else None for d in i.shape]
                           for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.metadata: dict[str, str] = dict(self.session.get_modelmeta().custom_metadata_map)

    def missing_inputs(self, missing: list[str]) -> str:
        return f"{self.path.name}: missing inputs {', '.join(missing)}"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """images float32 [B,3,H,W], image_sizes int64 [B,2] -> outputs by name."""
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))

    def input_bounds(self, name: str):
        """The dims the graph fixes (an image resized beyond a graph exported with --height / --width
        is refused before ONNX Runtime's own shape error)."""
        dims = self.input_dims.get(name)
        return None if dims is None else (tuple(dims), tuple(dims))

    def shape_refusal(self, name: str, shape: tuple[int, ...], lo, hi) -> str:
        fixed = "x".join("?" if d is None else str(d) for d in lo)
        return (f"{self.path.name}: input '{name}' has shape {'x'.join(map(str, shape))}, but the "
                f"model fixes it at {fixed}; export it with dims that hold the resized, padded images")
