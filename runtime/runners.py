"""``open_runner``: the right backend for a model file (the registry in :mod:`norcal.runtime.backends`)."""

from __future__ import annotations

import os
from pathlib import Path

from norcal.core.errors import NorcalError
from norcal.core.runner import Runner
from norcal.runtime import backends
from norcal.runtime.backends.base import Backend


def open_runner(path: str | os.PathLike, provider: str | None = None, threads: int | None = None) -> Runner:
    """The model at ``path`` opened by the backend its suffix names: .onnx -> ONNX Runtime
    (provider 'cpu' by default, 'cuda', 'tensorrt' or 'auto'); .engine/.plan/.trt -> TensorRT
    (provider None, 'auto' or 'tensorrt').

    threads: ONNX Runtime's intra-op threads (None: its default, one per core)."""
    return backend_of(path).open(path, provider, threads)


def backend_of(path: str | os.PathLike) -> Backend:
    """The backend that opens ``path`` (by its suffix); a file none opens is refused, a
    training checkpoint by what it is."""
    p = Path(path)
    backend = backends.backend_for(p)
    if backend is not None:
        return backend
    from norcal.core.files.onnx_io import not_onnx_checkpoint

    foreign = not_onnx_checkpoint(p) if p.is_file() else None
    if foreign is not None:
        raise foreign
    suffix = p.suffix.lower()
    raise NorcalError(f"{p}: unknown model type {suffix or '(no suffix)'!r}; expected {backends.expected_files()}")
