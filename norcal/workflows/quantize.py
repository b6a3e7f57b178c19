"""int8 (Q/DQ, calibrated on images) or fp16 variants of an exported detector.

The quantizer lives in export (:mod:`norcal.export.graph.quantize`), the image reading and
preprocessing in runtime: the calibration images are read and prepared exactly as the runners
prepare them (ResizeShortestEdge and padding from the model's metadata), so the activation
ranges are the ones the deployed graph sees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from norcal.core import contract
from norcal.core.errors import NorcalError

PRECISIONS = ("int8", "fp16")


@dataclass
class QuantizeOptions:
    """One quantization: the fp32 model, where to write, which precision; for int8 the folder
    of calibration images (all of them, or the first ``num_images`` in name order), the batch
    they are run in, the range method, whether unreadable files are left out, the Q/DQ form
    (``tensorrt`` for norcal build, ``ort`` for ONNX Runtime's CPU int8 kernels) and whether
    the mask head's layers are quantized too (masks only; boxes and scores are unaffected)."""

    model: Path
    output: Path
    precision: Literal["int8", "fp16"] = "int8"
    images: Path | None = None
    num_images: int | None = None
    batch_size: int = 1
    method: str = "minmax"
    skip_unreadable: bool = False
    form: str = "tensorrt"
    mask_head: bool = False


@dataclass
class QuantizeResult:
    """What was written: the model, its precision, how many images calibrated it (0 for fp16),
    the calibration files left out as unreadable (path, reason), its Q/DQ node count, time."""

    output: Path
    precision: str
    calibration_images: int  # 0 for fp16
    skipped: list[tuple[Path, str]]
    qdq_nodes: int
    seconds: float
    form: str | None = None  # int8: tensorrt or ort


def default_output(model: Path, precision: str, form: str = "tensorrt") -> Path:
    """``model.norcal.onnx`` -> ``model.norcal.int8.onnx`` (``model.norcal.int8-ort.onnx`` in
    ONNX Runtime's form)."""
    name = model.name[:-len(".onnx")] if model.name.endswith(".onnx") else model.name
    suffix = f"{precision}-ort" if precision == "int8" and form == "ort" else precision
    return model.with_name(f"{name}.{suffix}.onnx")


def calibration_paths(images: Path | None, num_images: int | None) -> list[Path]:
    """The calibration images: the image files in the folder ``images`` (and below), in name
    order, the first ``num_images`` of them; a NorcalError when there are none."""
    from norcal.runtime.image_files import IMAGE_SUFFIXES, expand_inputs

    if images is None:
        raise NorcalError("int8 needs calibration images: give a folder of images like the ones the "
                          "model will see (e.g. training images)", param="images")
    images = Path(images)
    if not images.is_dir():
        raise NorcalError(f"images {images}: {'is not a folder' if images.exists() else 'no such folder'}",
                          param="images")
    paths = expand_inputs([images])
    if not paths:
        raise NorcalError(f"images {images}: no image files in it (looked for {', '.join(IMAGE_SUFFIXES)})",
                          param="images")
    return paths[:num_images] if num_images else paths


def _check_metadata(model, where: str) -> None:
    """The runtime keys the calibration preprocessing reads and the classifier the fp32 region
    starts from must be there: a graph without them was not exported by norcal."""
    meta = {p.key: p.value for p in model.metadata_props}
    missing = [k for k in (contract.MIN_SIZE_TEST, contract.MAX_SIZE_TEST) if not meta.get(k)]
    if not contract.classifier_tensors(meta):
        missing.append(contract.CLASSIFIER_LOGITS)
    if missing:
        raise NorcalError(f"{where}: no {', '.join(missing)} metadata: quantize takes a model exported by "
                          f"norcal export (its metadata says how to prepare images and where the "
                          f"classifier is)", param="model")


def _check_options(options: QuantizeOptions) -> None:
    """The options on their own (no file is read)."""
    if options.precision not in PRECISIONS:
        raise NorcalError(f"precision {options.precision!r}: choose int8 or fp16", param="precision")
    if options.num_images is not None and options.num_images < 1:
        raise NorcalError(f"num_images must be >= 1, got {options.num_images}", param="num_images")
    if options.batch_size < 1:
        raise NorcalError(f"batch_size must be >= 1, got {options.batch_size}", param="batch_size")
    if options.form not in contract.INT8_FORMS:
        raise NorcalError(f"form {options.form!r}: choose one of {', '.join(contract.INT8_FORMS)}", param="form")
    if options.precision != "int8" and (options.form != "tensorrt" or options.mask_head):
        raise NorcalError(f"form and mask_head choose how int8 is written; {options.precision} takes neither",
                          param=("form", "mask_head=True"))


def _load_checked(src: Path, options: QuantizeOptions):
    """The fp32 model norcal exported, checked: its metadata, its float graph, and a mask
    output where ``mask_head`` is asked for."""
    from norcal.core.files.onnx_io import load_onnx
    from norcal.export.graph.quantize import check_fp32_model

    where = str(src)
    model = load_onnx(src)
    _check_metadata(model, where)
    check_fp32_model(model, where)
    mask_output = contract.OUTPUT_NAMES[-1]
    if options.mask_head and mask_output not in {o.name for o in model.graph.output}:
        # the option would change nothing: say so rather than let the user believe the masks are int8
        raise NorcalError(f"{where} has no {mask_output!r} output (no mask head): mask_head=True applies to "
                          f"mask models", param="mask_head=True")
    return model


def _quantize_int8(model, options: QuantizeOptions, where: str,
                   progress: Callable[[str, int, int], None] | None):
    """The int8 model calibrated on ``options.images`` (prepared as the runners prepare them),
    the images it used, and the files left out as unreadable (path, reason)."""
    from norcal.export.graph.quantize import quantize_int8
    from norcal.runtime.images import iter_images, unreadable_files
    from norcal.runtime.inference import prepared_batches

    paths = calibration_paths(options.images, options.num_images)
    spec = contract.input_spec({p.key: p.value for p in model.metadata_props})
    skipped = unreadable_files(paths, skip=options.skip_unreadable, context="calibration image ",
                               sizes=(spec.min_size, spec.max_size))
    bad = {p for p, _ in skipped}
    paths = [p for p in paths if p not in bad]
    if not paths:
        raise NorcalError(f"images {options.images}: none of its {len(bad)} image files can be read",
                          param="images")
    batches = prepared_batches(iter_images(paths, context="calibration image ", skipped=skipped
                                           if options.skip_unreadable else None,
                                           sizes=(spec.min_size, spec.max_size)),
                               spec, options.batch_size)
    step = (lambda n: progress("calibrate", n, len(paths))) if progress is not None else None
    out, n_images = quantize_int8(model, (b.feeds() for b in batches), options.method, where, step,
                                  form=options.form, mask_head=options.mask_head)
    return out, n_images, skipped


def quantize_model(options: QuantizeOptions,
                   progress: Callable[[str, int, int], None] | None = None) -> QuantizeResult:
    """Write the int8 or fp16 variant of ``options.model`` to ``options.output`` (atomically;
    the output location is checked before any work). progress(stage, n, total): n more
    calibration images done."""
    from norcal.core.files.fileio import same_file
    from norcal.core.files.onnx_io import save_onnx
    from norcal.core.files.outputs import check_output_file
    from norcal.export.graph.quantize import convert_fp16

    t0 = time.perf_counter()
    _check_options(options)
    src, dest = Path(options.model), Path(options.output)
    if src.exists() and same_file(src, dest):
        raise NorcalError(f"output {dest} is the input model; choose another (inputs are never modified)",
                          param="output")
    check_output_file(dest, "output")
    where = str(src)
    model = _load_checked(src, options)
    skipped: list[tuple[Path, str]] = []
    if options.precision == "fp16":
        out, n_images = convert_fp16(model, where), 0
    else:
        out, n_images, skipped = _quantize_int8(model, options, where, progress)
    save_onnx(out, dest)
    return QuantizeResult(
        output=dest, precision=options.precision, calibration_images=n_images, skipped=skipped,
        qdq_nodes=sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in out.graph.node),
        seconds=time.perf_counter() - t0, form=options.form if options.precision == "int8" else None)
