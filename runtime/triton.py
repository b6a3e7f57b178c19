"""A Triton Inference Server model repository for an exported detector (ONNX or TensorRT plan).

Layout: ``REPO/<name>/config.pbtxt`` and ``REPO/<name>/1/model.onnx`` (``model.plan`` for an
engine). With ``max_batch_size > 0`` Triton owns the leading batch dim, so each tensor's dims
are the ONNX dims without it: images [B,3,H,W] -> [3,-1,-1], boxes [B,K,4] -> [K,4]; a
per-image scalar such as num_detections [B] has no dims left, so it is declared [1] with
``reshape { shape: [] }`` (Triton's way of saying the model sees [B]).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import onnx

from norcal.core.errors import NorcalError
from norcal.core.files.onnx_io import graph_io
from norcal.core.files.fileio import write_text
from norcal.core.files.outputs import current_path, staged_dir
from norcal.runtime.backends.tensorrt import ENGINE_SUFFIXES

DEFAULT_MAX_BATCH = 8

# ONNX element type name -> Triton data type (model_config.proto DataType)
TRITON_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FLOAT16": "TYPE_FP16", "FLOAT": "TYPE_FP32", "DOUBLE": "TYPE_FP64",
    "STRING": "TYPE_STRING", "BFLOAT16": "TYPE_BF16",
}




def _tensor_block(t: dict, max_batch_size: int, where: str) -> str:
    dtype = TRITON_TYPES.get(t["dtype"])
    if dtype is None:
        raise NorcalError(f"{where} '{t['name']}': type {t['dtype']} has no Triton equivalent")
    dims = list(t["shape"])
    if max_batch_size > 0:
        if not dims:
            raise NorcalError(f"{where} '{t['name']}' is a scalar: with max_batch_size > 0 every tensor "
                              f"needs a leading batch dim (use max_batch_size=0)")
        first = dims.pop(0)
        if isinstance(first, int) and first > 0:
            raise NorcalError(f"{where} '{t['name']}' has a fixed batch dim {first}; Triton batching "
                              f"needs it dynamic (export with a dynamic batch, or max_batch_size=0)")
    text = [f'    name: "{t["name"]}"', f"    data_type: {dtype}"]
    if dims:
        text.append("    dims: [ " + ", ".join(str(d) if isinstance(d, int) and d > 0 else "-1" for d in dims) + " ]")
    else:
        # the per-image scalar case: Triton needs one dim, the model sees none (only the batch)
        text += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
    return "  {\n" + "\n".join(text) + "\n  }"


def triton_config(name: str, platform: str, inputs: list[dict], outputs: list[dict],
                  max_batch_size: int) -> str:
    """config.pbtxt text (model_config.proto ModelConfig) for the given I/O and batching."""
    lines = [f'name: "{name}"', f'platform: "{platform}"', f"max_batch_size: {max_batch_size}"]
    lines.append("input [\n" + ",\n".join(_tensor_block(t, max_batch_size, "input") for t in inputs) + "\n]")
    lines.append("output [\n" + ",\n".join(_tensor_block(t, max_batch_size, "output") for t in outputs) + "\n]")
    if max_batch_size > 0:
        lines.append("# requests are batched together only when their padded image sizes are equal")
        lines.append("dynamic_batching { }")
    if platform == "tensorrt_plan":
        lines.append("instance_group [ { kind: KIND_GPU } ]")
    return "\n".join(lines) + "\n"


def _fixed_batch(tensors: list[dict]) -> bool:
    """True when some tensor's leading dim is a fixed number (Triton cannot batch over it)."""
    return any(t["shape"] and isinstance(t["shape"][0], int) and t["shape"][0] > 0 for t in tensors)


def _external_files(model: onnx.ModelProto) -> list[str]:
    files = set()
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            for e in init.external_data:
                if e.key == "location":
                    files.add(e.value)
    return sorted(files)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def check_target(repo_dir, name: str, force: bool = False) -> None:
    """Refuse a model name Triton does not take, and to replace an existing model folder
    ``repo_dir/name`` unless ``force``."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):  # '' would name the repository itself
        raise NorcalError(f"Triton model name {name!r}: use letters, digits, '_', '.', '-' only")
    target = Path(repo_dir) / name
    if target.exists() and not force:
        raise NorcalError(f"{target} exists; pass force=True to replace it", param="force=True")


def write_triton_repo(model_path, repo_dir, name: str, max_batch_size: int | None = None,
                      force: bool = False) -> Path:
    """Write ``repo_dir/name`` (config.pbtxt, 1/model.onnx or 1/model.plan); returns that folder.

    ``max_batch_size``: None means 8 for ONNX and the profile's max batch for an engine, or 0
    when the model fixes its batch dim; 0 turns Triton's batching off (dims keep the batch dim). An engine needs its sidecar
    (``<engine>.json`` from ``norcal build``) for its I/O. Built in a temp folder and renamed
    into place; an existing model folder is replaced only with ``force``.
    """
    src = Path(model_path)
    if not current_path(src).is_file():
        raise NorcalError(f"{src}: no such file")
    repo = Path(repo_dir)
    target = repo / name
    check_target(repo_dir, name, force)

    extra: list[str] = []
    if src.suffix.lower() in ENGINE_SUFFIXES:
        from norcal.runtime.tensorrt_build import read_sidecar, sidecar_path

        side = read_sidecar(src)
        if side is None:
            raise NorcalError(f"{src}: no sidecar {sidecar_path(src).name} to read the engine's inputs and "
                              f"outputs from; norcal build writes it, also for an engine that trtexec "
                              f"builds")
        inputs, outputs = side["inputs"], side["outputs"]
        platform, filename = "tensorrt_plan", "model.plan"
        prof_max = (side.get("profile", {}).get("images") or {}).get("max")
        if max_batch_size is None:
            max_batch_size = (0 if _fixed_batch(inputs + outputs)
                              else int(prof_max[0]) if prof_max else DEFAULT_MAX_BATCH)
        elif prof_max and max_batch_size > prof_max[0]:
            raise NorcalError(f"max_batch_size {max_batch_size} exceeds the engine profile's max batch "
                              f"{prof_max[0]}; rebuild the engine with a larger max batch")
    else:
        try:
            model = onnx.load(str(current_path(src)), load_external_data=False)
        except Exception as e:
            raise NorcalError(f"{src}: not an ONNX model ({type(e).__name__})") from None
        inputs, outputs = graph_io(model)
        platform, filename = "onnxruntime_onnx", "model.onnx"
        extra = _external_files(model)
        if max_batch_size is None:
            max_batch_size = 0 if _fixed_batch(inputs + outputs) else DEFAULT_MAX_BATCH
    if max_batch_size < 0:
        raise NorcalError(f"max_batch_size {max_batch_size}: must be 0 (no batching) or positive")
    config = triton_config(name, platform, inputs, outputs, max_batch_size)

    with staged_dir(target) as tmp:  # replaces target only when the whole run succeeds
        write_text(tmp / "config.pbtxt", config)
        (tmp / "1").mkdir()
        _copy(current_path(src), tmp / "1" / filename)
        for rel in extra:  # external weights sit next to the .onnx under the same relative path
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise NorcalError(f"{src}: external data location {rel!r} must be a relative path inside its folder")
            data = current_path(src.parent / rel)
            if not data.is_file():
                raise NorcalError(f"{src}: external data file {rel} is missing")
            _copy(data, tmp / "1" / rel)
    return target
