"""Which runners a parity check compares, and how each one is judged.

A :class:`ParityRequest` names the model (run with ONNX Runtime) and, optionally, the
checkpoint it was exported from (any detector family: detectron2 .pth/.pkl, Ultralytics .pt;
its family's PyTorch runner with the ONNX's NorCal prior: the reference when given) and model
files built from it (a TensorRT engine, or any file a runtime backend opens), each opened by
its backend. :func:`build_runners` opens them, reference first, with each candidate's
tolerance preset, the model's input spec and score threshold, and the batch the model allows.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

from norcal.core import contract
from norcal.core.calibration.classifier_option import ClassifierActivation, check_classifier
from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file
from norcal.core.runner import Runner
from norcal.runtime.backends.base import Backend
from norcal.workflows.parity.tolerances import PRESETS, Tolerances, runner_precision


@dataclass(frozen=True)
class Candidate:
    """A model file compared with the reference, opened by the runtime backend its suffix
    names (or the one called ``backend``); precision: its tolerance preset (default: from
    the runner, :func:`~norcal.workflows.parity.runner_precision`)."""

    path: str | os.PathLike
    precision: str | None = None
    backend: str | None = None


@dataclass(frozen=True)
class ParityRequest:
    """model: the ONNX model. checkpoint / config: the checkpoint it was exported from (a
    supported family's; config: detectron2's yaml, default inferred) that adds PyTorch as the
    reference. engine: a TensorRT engine built from the model; engine_precision: its tolerance
    preset (default from the engine). candidates: more model files to compare, each run by its
    backend. provider: ONNX Runtime's execution provider. batch_size: images per batch, every
    backend. classifier: the checkpoint's box head activation where its weights cannot tell it
    (:func:`norcal.export.families.load_detector`'s)."""

    model: str | os.PathLike
    checkpoint: str | os.PathLike | None = None
    config: str | os.PathLike | None = None
    engine: str | os.PathLike | None = None
    engine_precision: str | None = None
    provider: str = "cpu"
    batch_size: int = 1
    candidates: tuple[Candidate, ...] = ()
    classifier: ClassifierActivation | None = None

    def compared(self) -> list[Candidate]:
        """The model files compared with the ONNX model: the engine, then ``candidates``."""
        engine = [Candidate(self.engine, self.engine_precision, "tensorrt")] if self.engine else []
        return engine + list(self.candidates)

    def check(self) -> None:
        """The request on its own: the model exists, and there is something to compare it with."""
        readable_file(self.model)  # missing, or a folder, a FIFO, a device: said as such
        if self.batch_size < 1:
            raise NorcalError(f"batch_size must be >= 1, got {self.batch_size}", param="batch_size")
        if self.config and not self.checkpoint:
            raise NorcalError("config goes with checkpoint", param=("config", "checkpoint"))
        if check_classifier(self.classifier) and not self.checkpoint:
            raise NorcalError("classifier goes with checkpoint", param=("classifier", "checkpoint"))
        if self.engine_precision and not self.engine:
            raise NorcalError("engine_precision sets the tolerances for engine; no engine given",
                              param=("engine_precision", "engine"))
        if self.engine_precision is not None and self.engine_precision not in PRESETS:
            raise NorcalError(f"engine_precision must be one of {', '.join(PRESETS)}, got "
                              f"{self.engine_precision!r}", param="engine_precision")
        for c in self.candidates:
            if c.precision is not None and c.precision not in PRESETS:
                raise NorcalError(f"candidates: precision must be one of {', '.join(PRESETS)}, got "
                                  f"{c.precision!r} for {c.path}", param="candidates")
        if not self.checkpoint and not self.engine and not self.candidates:
            raise NorcalError("nothing to compare ONNX Runtime with: give checkpoint (PyTorch) and/or engine",
                              param=("checkpoint", "engine"))


@dataclass
class ParityRunners:
    """The runners, reference first, and what :func:`norcal.workflows.parity.run_parity`
    needs besides: each runner's tolerances (by name), the model's input spec, score
    threshold and fixed input shape (if any), and the batch size (the model's fixed batch
    wins over the requested one). ``calibration``: the NorCal prior the PyTorch side was
    given (None for a plain model or without a checkpoint). ``notes``: what was left out or
    differs, one line each (a backend unavailable, an engine built at another gamma). ``noise``:
    makes the reference's family's noise runner (the PyTorch model in float64), which measures
    the reference's own float noise where a candidate fails the fp32 preset alone (made only
    then); None without a checkpoint."""

    runners: list[Runner]
    onnx: Runner
    tolerances: dict[str, Tolerances]
    spec: Any  # norcal.core.contract.Preprocessing
    score_thresh: float
    fixed_shape: Any
    batch_size: int
    calibration: Any = None  # norcal.export.pytorch.runner.OnnxCalibration
    notes: list[str] = field(default_factory=list)
    noise: Callable[[], Runner | None] | None = None  # makes the reference run more precisely, or None

    @property
    def reference(self) -> Runner:
        return self.runners[0]

    def check_images(self, images, paths=None) -> None:
        """Refuse an image the model's resize cannot take (named by its path when given)."""
        from norcal.runtime.preprocess import resize_problem

        for i, image in enumerate(images):
            if problem := resize_problem(image.shape[0], image.shape[1], self.spec.min_size, self.spec.max_size,
                                         self.spec.resize):
                where = paths[i] if paths is not None else f"image {i}"
                raise NorcalError(f"{where}: cannot run this image: {problem}")


def _candidate_runner(candidate: Candidate) -> tuple[Runner | None, Backend, str | None]:
    """The candidate's runner and backend, or (None, backend, a note) when its backend cannot
    run here (TensorRT without its package or a GPU)."""
    from norcal.runtime.backends import backend_named
    from norcal.runtime.runners import backend_of

    path = Path(candidate.path)
    backend = backend_named(candidate.backend) if candidate.backend else backend_of(path)
    if not path.is_file():
        raise NorcalError(f"{path}: no such {backend.file_noun} file")
    why = backend.unavailable()
    if why:
        return None, backend, f"{backend.title} not compared ({why}); {path.name} was not run"
    runner = backend.open(path)
    if candidate.precision:
        runner.precision = candidate.precision
    return runner, backend, None


def build_runners(request: ParityRequest,
                  stage: Callable[[str], ContextManager] | None = None) -> ParityRunners:
    """Open the runners the request names: PyTorch (with ``checkpoint``; the reference), ONNX
    Runtime, then each compared file by its backend (TensorRT for ``engine``), when that
    backend can run here (else a note).
    stage(description): a context manager around slow steps (loading the PyTorch model), for
    a front end's spinner."""
    from norcal.core.contract import check_detector, input_spec
    from norcal.core.decoding import recorded_decoding
    from norcal.export.families import resolve
    from norcal.export.pytorch.runner import onnx_calibration
    from norcal.runtime.backends import ONNXRUNTIME
    from norcal.workflows.parity.run import fixed_input_shape, model_score_thresh

    request.check()
    stage = stage or (lambda _description: contextlib.nullcontext())
    ort = ONNXRUNTIME.open(request.model, request.provider)
    check_detector(Path(request.model).name, ort.input_names, ort.output_names, ort.metadata)
    calibration = onnx_calibration(request.model)
    runners: list[Runner] = []
    notes: list[str] = []
    noise = None
    if request.checkpoint:
        with stage("loading the PyTorch model"):
            # the decoding the ONNX records (best-class, conf), where the checkpoint's family takes one
            checkpoint = resolve(request.checkpoint, request.config)
            decoding = recorded_decoding(ort.metadata) if checkpoint.family.decodings else None
            detector = checkpoint.load(decoding, request.classifier)
            torch_runner = detector.torch_runner(calibration)
            noise = functools.partial(detector.noise_runner, calibration)
        ours, theirs = (r.metadata.get(contract.NUM_CLASSES) for r in (torch_runner, ort))
        if ours and theirs and ours != theirs:  # else the NorCal prior's length is what fails
            raise NorcalError(f"checkpoint {request.checkpoint} has {ours} classes but "
                              f"{Path(request.model).name} has {theirs}: compare a model with the "
                              "checkpoint it was exported from", param="checkpoint")
        runners.append(torch_runner)
    runners.append(ort)
    missing: list[str] = []
    for candidate in request.compared():
        runner, backend, note = _candidate_runner(candidate)
        if note:
            notes.append(note)
            missing.append(backend.title)
        if runner is not None:
            mine, theirs = ort.metadata.get(contract.GAMMA), runner.metadata.get(contract.GAMMA)
            if runner.metadata and mine != theirs:
                notes.append(f"the {backend.file_noun} was built with NorCal gamma {theirs}, the ONNX has {mine}")
            runners.append(runner)
    if len(runners) < 2:
        raise NorcalError(f"nothing left to compare: {', '.join(dict.fromkeys(missing))} is unavailable and "
                          "no checkpoint was given", param="checkpoint")
    fixed = fixed_input_shape(ort)
    batch = fixed[0] if fixed and fixed[0] and fixed[0] != request.batch_size else request.batch_size
    return ParityRunners(runners, ort, {r.name: PRESETS[runner_precision(r)] for r in runners},
                         input_spec(ort.metadata), model_score_thresh(ort.metadata), fixed, batch,
                         calibration if request.checkpoint else None, notes, noise)
