"""The runtime backends, one package each (``onnxruntime``, ``tensorrt``), and the registry
that picks one for a model file. A new backend is a package with a :class:`Backend`
descriptor and a runner, listed in :data:`BACKENDS`: nothing else names backends."""

from __future__ import annotations

import os

from norcal.core.errors import NorcalError
from norcal.runtime.backends.base import Backend
from norcal.runtime.backends.onnxruntime import BACKEND as ONNXRUNTIME
from norcal.runtime.backends.tensorrt import BACKEND as TENSORRT

BACKENDS: list[Backend] = [ONNXRUNTIME, TENSORRT]


def backend_for(path: str | os.PathLike) -> Backend | None:
    """The backend that opens ``path`` by its suffix, or None."""
    return next((b for b in BACKENDS if b.opens(path)), None)


def backend_named(name: str) -> Backend:
    """The backend called ``name`` ('onnxruntime', 'tensorrt')."""
    for b in BACKENDS:
        if b.name == name:
            return b
    raise NorcalError(f"unknown backend {name!r}; choose one of {', '.join(b.name for b in BACKENDS)}",
                      param="backend")


def expected_files() -> str:
    """The model files the backends open, for messages: '.onnx or a TensorRT engine (...)'."""
    kinds = [b.expected for b in BACKENDS]
    return kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " or " + kinds[-1]


def provider_choices(*backends: Backend) -> tuple[str, ...]:
    """The ``provider`` values ``backends`` take (default: every registered one), each once, in
    registry order; None, a backend's default, left out (the CLI's --provider choices)."""
    found: dict[str, None] = {}
    for b in backends or BACKENDS:
        found.update((p, None) for p in b.providers if p is not None)
    return tuple(found)


def needs_gpu(path: str | os.PathLike, provider: str | None) -> bool:
    """Whether running the model at ``path`` with ``provider`` takes a CUDA GPU (False for a
    file no backend opens: opening it fails first)."""
    backend = backend_for(path)
    return backend is not None and backend.needs_gpu(provider)


__all__ = ["BACKENDS", "Backend", "ONNXRUNTIME", "TENSORRT", "backend_for", "backend_named", "expected_files",
           "needs_gpu", "provider_choices"]
