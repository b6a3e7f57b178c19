"""Reading and writing ONNX files with clear errors and atomic writes."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from norcal.core.errors import NorcalError
from norcal.core.fileio import atomic_path


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


def graph_io(model: onnx.ModelProto) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) as {name, dtype (ONNX name, e.g. FLOAT), shape (ints, dim names or None)};
    initializers listed as inputs (old exporters) are left out."""
    def specs(values):
        out = []
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
            out.append({"name": v.name, "dtype": onnx.TensorProto.DataType.Name(t.elem_type), "shape": dims})
        return out

    inits = {i.name for i in model.graph.initializer}
    return specs([v for v in model.graph.input if v.name not in inits]), specs(model.graph.output)


def describe_io(model: onnx.ModelProto) -> list[tuple[str, str, str, str]]:
    """(kind, name, dtype, shape) for every graph input and output, for printing."""
    inputs, outputs = graph_io(model)
    return [(kind, s["name"], s["dtype"].lower(), "[" + ", ".join("?" if d is None else str(d) for d in s["shape"]) + "]")
            for kind, specs in (("input", inputs), ("output", outputs)) for s in specs]
