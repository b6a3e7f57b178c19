"""``Backend``: what the registry knows of one runtime backend before anything heavy is imported."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from norcal.core.errors import NorcalError
from norcal.core.runner import BaseRunner, Runner

Dims = tuple[int | None, ...]  # an input's dims, None where any size goes


def _always_available() -> str | None:
    return None


@dataclass
class Backend:
    """One runtime backend: which model files it opens and how.

    name: its label, the prefix of its runners' names ("onnxruntime" -> "onnxruntime-cpu").
    title: how messages name it ("ONNX Runtime"). suffixes: the model files it opens (lower
    case, with the dot). expected: how the unknown-file message names those files.
    providers: the ``provider`` values it takes (None, its default, always);
    gpu_providers: those that need a CUDA GPU; cpu_provider: one that runs without a GPU,
    None when it has none (then every provider needs one). opener(path, provider, threads) -> Runner: loads the model (the
    backend's own libraries are imported only there). file_noun: what its files are called
    in messages ("model", "engine"). parity_precision: the tolerance preset that judges its
    runners when neither their name nor their model's metadata says one (None: fp32).
    unavailable() -> why it cannot run on this machine, or None. name_for(provider): the
    name its runner gets with ``provider``, where known before opening (else None).
    """

    name: str
    title: str
    suffixes: tuple[str, ...]
    expected: str
    providers: tuple[str | None, ...]
    gpu_providers: tuple[str | None, ...]
    cpu_provider: str | None
    opener: Callable[[Path, str | None, int | None], Runner]
    file_noun: str = "model"
    parity_precision: str | None = None
    unavailable: Callable[[], str | None] = _always_available
    name_for: Callable[[str | None], str] | None = None

    def opens(self, path: str | os.PathLike) -> bool:
        """Whether ``path``'s suffix is one of this backend's."""
        return Path(path).suffix.lower() in self.suffixes

    def needs_gpu(self, provider: str | None) -> bool:
        """Whether running with ``provider`` takes a CUDA GPU (always, for a backend without a
        CPU provider)."""
        return self.cpu_provider is None or provider in self.gpu_providers

    def open(self, path: str | os.PathLike, provider: str | None = None, threads: int | None = None) -> Runner:
        """The model at ``path`` loaded by this backend (whatever its suffix); one exported with
        the NMS left to the host (``nms: host``) runs with it (:mod:`norcal.runtime.host_nms`)."""
        from norcal.runtime.host_nms import with_host_nms

        return with_host_nms(self.opener(Path(path), provider, threads))


class BackendRunner(BaseRunner):
    """A backend's runner: before the backend runs a batch, each input is checked against the dims
    the model takes (:meth:`input_bounds`), and one outside them refused in one line
    (:meth:`shape_refusal`) instead of the backend's own error; then :meth:`run` runs it."""

    def infer_impl(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, array in feeds.items():
            bounds = self.input_bounds(name)
            shape = tuple(int(d) for d in np.shape(array))
            if bounds is not None and not fits(shape, *bounds):
                raise NorcalError(self.shape_refusal(name, shape, *bounds))
        return self.run(feeds)

    def input_bounds(self, name: str) -> tuple[Dims, Dims] | None:
        """(lowest, highest) dims input ``name`` takes (equal where the model fixes them), or None
        where it takes any shape. Default: any."""
        return None

    def shape_refusal(self, name: str, shape: tuple[int, ...], lo: Dims, hi: Dims) -> str:
        """The line refusing input ``name`` of ``shape`` outside ``lo`` .. ``hi``."""
        return f"input '{name}' has shape {shape}, outside {lo} .. {hi}"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The backend's run of one batch whose inputs fit :meth:`input_bounds`."""
        raise NotImplementedError


def fits(shape: tuple[int, ...], lo: Dims, hi: Dims) -> bool:
    """Whether ``shape`` has ``lo``'s rank and every dim within ``lo`` .. ``hi`` (None: unbounded)."""
    return len(shape) == len(lo) == len(hi) and all(
        (a is None or a <= s) and (b is None or s <= b) for a, s, b in zip(lo, shape, hi))
