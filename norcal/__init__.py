"""norcal-deploy: NorCal long-tail calibration baked into deployed detectors.

The Python API (names resolve on first use, so ``import norcal`` stays cheap and imports
neither torch nor onnx):

    from norcal import CheckpointExport, NorCal, export_checkpoint
    result = export_checkpoint("model_final.pth", "model.norcal.onnx", NorCal(gamma=0.6),
                               CheckpointExport(config="config.yaml"))

Errors a user can fix raise :class:`NorcalError` (one line; ``param`` names the parameter).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it
_API = {
    # export: checkpoints and ONNX detectors -> ONNX with the NorCal node
    "NorCal": "norcal.workflows.export_job",
    "CheckpointExport": "norcal.workflows.export_job",
    "ExportResult": "norcal.workflows.export_job",
    "export_checkpoint": "norcal.workflows.export_job",
    "export_onnx_file": "norcal.workflows.export_job",
    "calibrate_onnx": "norcal.workflows.export_job",
    # choosing gamma
    "tune": "norcal.workflows.tune",
    "TuneResult": "norcal.workflows.tune_sweep",
    "SweepPoint": "norcal.workflows.tune_sweep",
    "tune_ray": "norcal.workflows.ray_tune",
    # calibration tables
    "CalibrationTable": "norcal.core.calibration.tables",
    "load_table": "norcal.core.calibration.tables",
    # running exported models
    "open_runner": "norcal.runtime.runners",
    "run_images": "norcal.runtime.inference",
    "ImageDetections": "norcal.runtime.postprocess",
    "detections_to_results": "norcal.runtime.results",
    "category_ids_from_annotations": "norcal.runtime.results",
    # on a Ray cluster (the `ray` extra; Ray itself is imported only when these run)
    "RayOptions": "norcal.runtime.ray_inference",
    "run_images_ray": "norcal.runtime.ray_inference",
    # TensorRT and Triton
    "BuildOptions": "norcal.runtime.tensorrt_build",
    "build_engine": "norcal.workflows.build",
    "write_triton_repo": "norcal.runtime.triton",
    # int8 (Q/DQ) and fp16 variants
    "QuantizeOptions": "norcal.workflows.quantize",
    "QuantizeResult": "norcal.workflows.quantize",
    "quantize_model": "norcal.workflows.quantize",
    # LVIS evaluation
    "evaluate": "norcal.evaluation",
    "evaluate_fixed": "norcal.evaluation",
    "prepare_gt": "norcal.evaluation",
    "from_results": "norcal.evaluation",
    "EvalResult": "norcal.evaluation",
    # errors
    "NorcalError": "norcal.core.errors",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'norcal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


if TYPE_CHECKING:  # what type checkers and IDEs see; nothing is imported at run time
    from norcal.core.errors import NorcalError
    from norcal.core.calibration.tables import CalibrationTable, load_table
    from norcal.evaluation import EvalResult, evaluate, evaluate_fixed, from_results, prepare_gt
    from norcal.runtime.inference import run_images
    from norcal.runtime.postprocess import ImageDetections
    from norcal.runtime.ray_inference import RayOptions, run_images_ray
    from norcal.runtime.results import category_ids_from_annotations, detections_to_results
    from norcal.runtime.runners import open_runner
    from norcal.runtime.tensorrt_build import BuildOptions
    from norcal.runtime.triton import write_triton_repo
    from norcal.workflows.build import build_engine
    from norcal.workflows.export_job import (CheckpointExport, ExportResult, NorCal, calibrate_onnx,
                                             export_checkpoint, export_onnx_file)
    from norcal.workflows.quantize import QuantizeOptions, QuantizeResult, quantize_model
    from norcal.workflows.ray_tune import tune_ray
    from norcal.workflows.tune import tune
    from norcal.workflows.tune_sweep import SweepPoint, TuneResult
