"""Reading and writing ONNX files with clear errors and atomic writes."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import onnx
from onnx import external_data_helper
from google.protobuf.message import DecodeError

from norcal.core.errors import NorcalError
from norcal.core.files.fileio import readable_file
from norcal.core.files.fileio import CHECKPOINT_SUFFIXES, atomic_path


# protobuf cannot serialize a message of 2 GiB or more: larger models keep their weights in a
# separate file next to the .onnx ("external data"), as onnx.save does on request
PROTOBUF_LIMIT = 2**31 - 2**20


def _graph_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _graph_tensors(g)


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in _graph_tensors(model.graph) if external_data_helper.uses_external_data(t)]


def _check_external_data(model: onnx.ModelProto, p: Path) -> None:
    """Every external-data file exists inside the model's folder and holds the bytes it should."""
    base = p.parent.resolve()
    for t in _external_tensors(model):
        info = external_data_helper.ExternalDataInfo(t)
        loc = info.location or ""
        target = (base / loc).resolve()
        if not loc or Path(loc).is_absolute() or base not in target.parents:
            raise NorcalError(f"{p}: tensor {t.name!r} points its external data at {loc!r}, outside the "
                              f"model's folder; refused (external data must sit next to the model)")
        if not target.is_file():
            raise NorcalError(f"{p}: its weights are in the external data file {loc!r}, which is missing "
                              f"(copy {loc} into {p.parent} with the model)")
        size = target.stat().st_size
        need = (info.offset or 0) + (info.length or 0)
        if need > size:
            raise NorcalError(f"{p}: external data file {loc!r} is truncated (tensor {t.name!r} needs "
                              f"{need} bytes, the file has {size})")



def checkpoint_format(path: str | Path) -> str | None:
    """"torch.save zip" or "pickle" when the file's first bytes say it is a checkpoint in that
    format (whatever its suffix), else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head == b"PK\x03\x04":  # torch.save writes a zip archive
        return "torch.save zip"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:  # pickle protocol 2..5 header
        return "pickle"
    return None


def not_onnx_checkpoint(p: Path) -> NorcalError | None:
    """The error for a checkpoint given where an ONNX model is read, or None if it is none."""
    kind = checkpoint_format(p)
    if kind is None:
        return None
    if p.suffix.lower() in CHECKPOINT_SUFFIXES:
        return NorcalError(f"{p}: a PyTorch checkpoint ({kind}), not an ONNX model; export it to ONNX "
                           "first (norcal export)")
    want = ".pth" if kind == "torch.save zip" else ".pkl"
    return NorcalError(f"{p}: a PyTorch checkpoint ({kind}) without a checkpoint suffix, not an ONNX "
                       f"model; rename it to {p.name}{want} and export it to ONNX first (norcal export)")


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Load and structurally check an ONNX model (with its external data, if any).

    A missing, foreign or truncated file, or missing or escaping external data, is a NorcalError.
    """
    p = readable_file(path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        foreign = not_onnx_checkpoint(p)
        if foreign is not None:
            raise foreign from None
        raise NorcalError(f"{p}: not an ONNX model or truncated ({type(e).__name__}: {e})") from None
    if not model.graph.node:
        raise NorcalError(f"{p}: not an ONNX model or truncated (the graph has no nodes)")
    external = bool(_external_tensors(model))
    if external:
        _check_external_data(model, p)
    try:
        # by path when the weights are external: the checker then also reads models over 2 GiB
        onnx.checker.check_model(str(p) if external else model)
    except (onnx.checker.ValidationError, ValueError) as e:
        first = str(e).strip().splitlines()[0]
        if "topologically sorted" in first:  # e.g. Ultralytics' half=True export: valid bytes, nodes out of order
            raise NorcalError(f"{p}: its nodes are not in topological order (the ONNX checker refuses the graph, "
                              "ONNX Runtime may still run it); export the model in fp32 and make an fp16 one "
                              "with norcal quantize") from None
        raise NorcalError(f"{p}: invalid or truncated ONNX model ({first})") from None
    if external:
        try:
            external_data_helper.load_external_data_for_model(model, str(p.parent))
        except (OSError, ValueError) as e:
            raise NorcalError(f"{p}: cannot read its external data ({e})") from None
    return model


def save_onnx(model: onnx.ModelProto, path: str | Path, external_data: bool | None = None) -> None:
    """Write a model atomically; with its weights in ``<name>.data`` beside it when
    ``external_data`` (default: only when the model is too large for one protobuf file)."""
    path = Path(path)
    if external_data is None:
        external_data = model.ByteSize() >= PROTOBUF_LIMIT
    if not external_data:
        with atomic_path(path) as tmp:
            onnx.save(model, str(tmp))
        return
    data_name = path.name + ".data"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save moves the weights out of the proto it is given
    with atomic_path(path) as tmp_model, atomic_path(path.with_name(data_name)) as tmp_data:
        work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=tmp_model.parent))
        try:
            onnx.save(copy, str(work / path.name), save_as_external_data=True,
                      all_tensors_to_one_file=True, location=data_name, size_threshold=1024)
            os.replace(work / path.name, tmp_model)
            if (work / data_name).exists():
                os.replace(work / data_name, tmp_data)
        finally:
            shutil.rmtree(work, ignore_errors=True)


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
