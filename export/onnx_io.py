"""Reading and writing ONNX files with clear errors and atomic writes."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from norcal.errors import NorcalError
from norcal.fileio import atomic_path


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Load and structurally check an ONNX model; a missing, foreign or truncated file is a NorcalError."""
    p = Path(path)
    if not p.is_file():
        raise NorcalError(f"{p}: no such file")
    try:
        model = onnx.load(str(p))
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise NorcalError(f"{p}: not an ONNX model or truncated ({type(e).__name__}: {e})") from None
    if not model.graph.node:
        raise NorcalError(f"{p}: not an ONNX model or truncated (the graph has no nodes)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        raise NorcalError(f"{p}: invalid or truncated ONNX model ({first})") from None
    return model


def save_onnx(model: onnx.ModelProto, path: str | Path) -> None:
    """Write a model atomically (temp file in the same folder, then rename)."""
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))


def describe_io(model: onnx.ModelProto) -> list[tuple[str, str, str, str]]:
    """(kind, name, dtype, shape) for every graph input and output; symbolic dims by name."""
    rows = []
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
                    for d in t.shape.dim]
            rows.append((kind, v.name, onnx.TensorProto.DataType.Name(t.elem_type).lower(),
                         "[" + ", ".join(dims) + "]"))
    return rows
